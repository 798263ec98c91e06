"""The admin API of a coordinator: one JSON request per line on its admin socket (``node.admin_socket``,
readable by its owner only), one JSON answer per line.

Requests: ``{"cmd": "status"}`` (the node's status, what ``chorus status --json`` prints),
``{"cmd": "settled", "upto": GID}`` (has the node committed everything it certified up to GID),
``{"cmd": "stop"}`` / ``{"cmd": "leave"}``, ``{"cmd": "recover"}`` (rejoin after a stop),
``{"cmd": "links"}``, ``{"cmd": "link-reinstantiate", "link": NAME, "force": bool}`` (start it; with
``"poll": true`` how far it got, docs/LINKS.md section 10). Answers
carry ``"ok"`` and, on error, ``"error"``.

The client (:func:`admin_request`) is plain blocking sockets, importable without the daemon; the
server side (:func:`serve`) reads one request and writes the answer the coordinator gives.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any, Awaitable, Callable

REQUEST_TIMEOUT_S = 10.0


def admin_request(path: str, cmd: str = "status", timeout: float = 5.0, **args: Any) -> dict[str, Any]:
    """Send one request to the admin socket at ``path`` and return the answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    out: dict[str, Any] = json.loads(buf)
    return out


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                answer: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]) -> None:
    """Serve one connection: read a request, write ``answer(cmd, request)``. A request that is not
    a JSON object gets an error answer."""
    try:
        try:
            line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT_S)
            req = json.loads(line or b"{}")
            cmd = req.get("cmd", "status")
        except (ValueError, AttributeError):  # not JSON, not UTF-8, not an object, a line too long
            req, cmd = {}, None
        if not isinstance(cmd, str):
            resp: dict[str, Any] = {"ok": False, "error": f"unknown admin command {cmd!r}"}
        else:
            resp = await answer(cmd, req)
        writer.write(json.dumps(resp).encode() + b"\n")
        await writer.drain()
    except (asyncio.TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
