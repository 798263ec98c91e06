"""The lab's network: an Ethernet switch in user space between TAP devices.

Each lab host is a network namespace whose only interface is a TAP device; the other end of
every TAP device is a file descriptor held by this process, which forwards frames between them
like a learning switch. Doing the switching here rather than on a kernel bridge gives the lab
what the machine's kernel lacks (it is built without ``sch_netem``): per-frame delay, jitter,
loss and duplication, and partitions, all changed at run time through a control socket.

Port 0 is the machine itself (the test driver); ports 1..N are the hosts. Partitions and the
impairments apply between hosts only: a client keeps reaching its node, as it would in a real
partition, and the driver stays in control.

Control socket (``DIR/switch.sock``, mode 0600): one JSON object per line, one answer per line.

```
{"cmd": "partition", "groups": [[1, 2], [3]]}   hosts in different groups cannot talk
{"cmd": "heal"}                                   every host can talk to every other again
{"cmd": "netem", "delay_ms": 5, "jitter_ms": 1, "loss": 1.0, "duplicate": 0.0}
{"cmd": "stats"}                                  frames forwarded, dropped, delayed
```
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import logging
import os
import random
import signal
import struct
import sys
from dataclasses import asdict, dataclass
from typing import Any, Optional

log = logging.getLogger("chorus.testkit.lab.switch")

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
FRAME_MAX = 65536


@dataclass
class Netem:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0        # percent
    duplicate: float = 0.0   # percent

    def validate(self) -> None:
        for name, value, top in (("delay_ms", self.delay_ms, 10_000), ("jitter_ms", self.jitter_ms, 10_000),
                                 ("loss", self.loss, 100), ("duplicate", self.duplicate, 100)):
            if not 0 <= value <= top:
                raise ValueError(f"{name} must be between 0 and {top}, not {value}")


def parse_netem(spec: str) -> Netem:
    """``tc netem``'s words: ``delay 5ms [1ms]``, ``loss 1%``, ``duplicate 1%``; ``''`` clears."""
    words = spec.split()
    out = Netem()

    def number(word: str, unit: str) -> float:
        if not word.endswith(unit):
            raise ValueError(f"expected a value in {unit!r}, got {word!r}")
        return float(word[: -len(unit)])

    i = 0
    while i < len(words):
        w = words[i]
        if w == "delay" and i + 1 < len(words):
            out.delay_ms = number(words[i + 1], "ms")
            i += 2
            if i < len(words) and words[i].endswith("ms"):
                out.jitter_ms = number(words[i], "ms")
                i += 1
        elif w in ("loss", "duplicate") and i + 1 < len(words):
            setattr(out, w, number(words[i + 1], "%"))
            i += 2
        else:
            raise ValueError(f"cannot parse netem spec at {w!r} (use e.g. 'delay 5ms 1ms loss 1% duplicate 1%')")
    out.validate()
    return out


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class Switch:
    def __init__(self, fds: list[int], seed: Optional[int] = None) -> None:
        self.fds = fds
        self.macs: dict[bytes, int] = {}
        self.group_of: dict[int, int] = {}   # host port -> group; empty = healed
        self.netem = Netem()
        self.rng = random.Random(seed)
        self.stats = {"forwarded": 0, "dropped_partition": 0, "dropped_loss": 0, "duplicated": 0, "delayed": 0}
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        for port, fd in enumerate(self.fds):
            self.loop.add_reader(fd, self._readable, port)

    def _readable(self, port: int) -> None:
        fd = self.fds[port]
        for _ in range(64):
            try:
                frame = os.read(fd, FRAME_MAX)
            except BlockingIOError:
                return
            except OSError as e:  # the interface went away (namespace deleted)
                log.warning("port %d: %s", port, e)
                assert self.loop is not None
                self.loop.remove_reader(fd)
                return
            if len(frame) >= 14:
                self._switch(port, frame)

    def _switch(self, src: int, frame: bytes) -> None:
        dst_mac, src_mac = frame[0:6], frame[6:12]
        if not src_mac[0] & 1:
            self.macs[src_mac] = src
        dst = None if dst_mac[0] & 1 else self.macs.get(dst_mac)
        targets = [dst] if dst is not None else [p for p in range(len(self.fds)) if p != src]
        for port in targets:
            if port != src:
                self._send(src, port, frame)

    def _send(self, src: int, dst: int, frame: bytes) -> None:
        between_hosts = src != 0 and dst != 0
        if between_hosts and self.group_of and self.group_of.get(src) != self.group_of.get(dst):
            self.stats["dropped_partition"] += 1
            return
        n = self.netem if between_hosts else Netem()
        if n.loss and self.rng.random() * 100 < n.loss:
            self.stats["dropped_loss"] += 1
            return
        copies = 2 if n.duplicate and self.rng.random() * 100 < n.duplicate else 1
        self.stats["duplicated"] += copies - 1
        for _ in range(copies):
            delay = n.delay_ms + (self.rng.uniform(-n.jitter_ms, n.jitter_ms) if n.jitter_ms else 0.0)
            if delay > 0:
                self.stats["delayed"] += 1
                assert self.loop is not None
                self.loop.call_later(delay / 1000.0, self._write, dst, frame)
            else:
                self._write(dst, frame)

    def _write(self, dst: int, frame: bytes) -> None:
        try:
            os.write(self.fds[dst], frame)
            self.stats["forwarded"] += 1
        except OSError:  # interface down or its queue full: a lost frame, as on a wire
            self.stats["dropped_loss"] += 1

    # ---- control ------------------------------------------------------------------------

    def command(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "partition":
            groups = req.get("groups")
            if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
                raise ValueError("groups must be a list of lists of host numbers")
            group_of: dict[int, int] = {}
            for i, g in enumerate(groups):
                for h in g:
                    if not isinstance(h, int) or not 1 <= h < len(self.fds):
                        raise ValueError(f"no host {h!r} (hosts are 1..{len(self.fds) - 1})")
                    if h in group_of:
                        raise ValueError(f"host {h} is in two groups")
                    group_of[h] = i
            # a host named in no group is alone
            for h in range(1, len(self.fds)):
                group_of.setdefault(h, len(groups) + h)
            self.group_of = group_of
        elif cmd == "heal":
            self.group_of = {}
        elif cmd == "netem":
            n = Netem(float(req.get("delay_ms", 0)), float(req.get("jitter_ms", 0)),
                      float(req.get("loss", 0)), float(req.get("duplicate", 0)))
            n.validate()
            self.netem = n
        elif cmd != "stats":
            raise ValueError(f"unknown command {cmd!r}")
        return {"ok": True, "stats": dict(self.stats), "netem": asdict(self.netem),
                "groups": _groups(self.group_of)}

    async def serve_control(self, path: str) -> asyncio.AbstractServer:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while line := await reader.readline():
                    try:
                        answer = self.command(json.loads(line))
                    except (ValueError, TypeError) as e:
                        answer = {"ok": False, "error": str(e)}
                    writer.write(json.dumps(answer).encode() + b"\n")
                    await writer.drain()
            finally:
                writer.close()

        if os.path.exists(path):
            os.unlink(path)
        old = os.umask(0o177)
        try:
            return await asyncio.start_unix_server(handle, path)
        finally:
            os.umask(old)


def _groups(group_of: dict[int, int]) -> list[list[int]]:
    by: dict[int, list[int]] = {}
    for h, g in sorted(group_of.items()):
        by.setdefault(g, []).append(h)
    return list(by.values())


def control(path: str, req: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """Send one command to a running switch and return its answer (the same JSON-lines exchange
    as a coordinator's admin socket)."""
    from chorus.admin import admin_request  # not needed by the switch process itself

    args = {k: v for k, v in req.items() if k != "cmd"}
    answer = admin_request(path, str(req["cmd"]), timeout, **args)
    if not answer.get("ok"):
        raise ValueError(answer.get("error", "the switch refused the command"))
    return answer


async def _main(taps: list[str], control_path: str, ready_path: str) -> None:
    fds = [open_tap(name) for name in taps]
    sw = Switch(fds)
    sw.start()
    server = await sw.serve_control(control_path)
    with open(ready_path, "w") as f:
        f.write(str(os.getpid()))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    for fd in fds:
        os.close(fd)  # the TAP devices disappear with their last descriptor


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description="the chorus lab's user-space switch")
    ap.add_argument("--control", required=True)
    ap.add_argument("--ready", required=True)
    ap.add_argument("taps", nargs="+")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    asyncio.run(_main(args.taps, args.control, args.ready))


if __name__ == "__main__":
    main()
