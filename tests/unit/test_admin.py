"""The admin API's line protocol (chorus/admin.py), over a real Unix socket."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
from typing import Any

from chorus.admin import admin_request, serve


async def _answer(cmd: str, req: dict[str, Any]) -> dict[str, Any]:
    if cmd == "status":
        return {"ok": True, "status": {"state": "online", "asked": req}}
    return {"ok": False, "error": f"unknown admin command {cmd!r}"}


def _raw(path: str, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(data)
        return s.recv(65536)


def test_requests_and_bad_requests_get_answers() -> None:
    async def main(path: str) -> None:
        server = await asyncio.start_unix_server(lambda r, w: serve(r, w, _answer), path)
        async with server:
            loop = asyncio.get_running_loop()
            ok = await loop.run_in_executor(None, lambda: admin_request(path, "status", extra=1))
            assert ok == {"ok": True, "status": {"state": "online", "asked": {"cmd": "status", "extra": 1}}}
            unknown = await loop.run_in_executor(None, lambda: admin_request(path, "explode"))
            assert unknown == {"ok": False, "error": "unknown admin command 'explode'"}
            for junk in (b"not json\n", b"[1, 2]\n", b'{"cmd": 7}\n'):
                answer = await loop.run_in_executor(None, _raw, path, junk)
                assert b'"ok": false' in answer, (junk, answer)

    with tempfile.TemporaryDirectory() as d:
        asyncio.run(main(os.path.join(d, "admin.sock")))
