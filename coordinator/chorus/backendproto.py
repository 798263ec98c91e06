"""Frames on the backend <-> coordinator socket (docs/PROTOCOL.md section 1)."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

MAX_FRAME = 1 << 30

VERDICT_COMMIT = 0
VERDICT_CONFLICT = 1
VERDICT_REFUSED = 2
VERDICT_UNKNOWN = 3  # the node left the primary component before the outcome was settled
VERDICT_TOO_LARGE = 4  # larger than this node's writeset log can hold: refused before it is ordered


class FrameError(ValueError):
    """A malformed frame: the connection is closed."""


@dataclass(frozen=True)
class Frame:
    type: bytes
    payload: bytes


async def read_frame(reader: asyncio.StreamReader) -> Frame:
    """Read one frame; raises asyncio.IncompleteReadError at EOF, FrameError if malformed."""
    head = await reader.readexactly(4)
    (length,) = struct.unpack(">I", head)
    if length < 1 or length > MAX_FRAME:
        raise FrameError(f"frame length {length} out of range")
    body = await reader.readexactly(length)
    ftype = body[:1]
    if ftype not in (b"W", b"C", b"A", b"R", b"S"):
        raise FrameError(f"unknown frame type {ftype!r}")
    if ftype == b"S" and len(body) != 1:
        raise FrameError("frame b'S' (causal read) carries no payload")
    if ftype in (b"C", b"A", b"R") and len(body) != 13:
        raise FrameError(f"frame {ftype!r} has {len(body) - 1} payload bytes, expected 12")
    return Frame(ftype, body[1:])


def parse_done(payload: bytes) -> tuple[int, int]:
    """(gid, xid) of a C, A or R frame."""
    gid, xid = struct.unpack(">QI", payload)
    return int(gid), int(xid)


def verdict_frame(verdict: int, gid: int, wait_for: int, message: str) -> bytes:
    msg = message.encode("utf-8")[:65535]
    body = b"V" + struct.pack(">BQQH", verdict, gid, wait_for, len(msg)) + msg
    return struct.pack(">I", len(body)) + body


def writeset_frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload) + 1) + b"W" + payload


def done_frame(kind: bytes, gid: int, xid: int) -> bytes:
    return struct.pack(">I", 13) + kind + struct.pack(">QI", gid, xid)
