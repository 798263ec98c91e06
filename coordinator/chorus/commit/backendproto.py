"""Frames on the backend <-> coordinator socket (docs/PROTOCOL.md section 1).

Every frame is a u32 length (of the type byte and the body), a type byte and a body. From the
backend: W (its writeset, at COMMIT), C and A (it committed or aborted a certified GID), R (the
schema change it ran, as every node applies it), S (a causal-read request). From the
coordinator: V (a verdict). The extension's side is extension/chorus_wire.h.

The frame parser and the verdict frame have a compiled implementation beside these pure-Python
references (``chorus/_cproto.pyx``): :class:`FrameParser` and :func:`verdict_frame` are the ones
``CHORUS_IMPL`` chose (:data:`IMPL`), as in wire.py; tests/unit/test_impl_proto.py holds them alike.
"""

from __future__ import annotations

import enum
import struct
import sys
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from chorus import impl

MAX_FRAME = 0xFFFFFFFF  # the length is a u32; a writeset's limit is chorus.max_writeset_size (at most 4095 MB)

VERDICT_COMMIT = 0
VERDICT_CONFLICT = 1
VERDICT_REFUSED = 2
VERDICT_UNKNOWN = 3  # the node left the primary component before the outcome was settled
VERDICT_TOO_LARGE = 4  # larger than this node's writeset log can hold: refused before it is ordered
VERDICT_UNDONE = 5  # a schema change another node failed to apply: undone everywhere (message: SQLSTATE, then why)


class FrameType(bytes, enum.Enum):
    """A frame's type byte. (Bus messages have type bytes of their own: bus/proto.py.)"""
    WRITESET = b"W"  # backend: its writeset, for certification
    COMMITTED = b"C"  # backend: it committed certified GID gid (u64 gid, u32 xid)
    ABORTED = b"A"  # backend: it ended without committing certified GID gid (u64 gid, u32 xid)
    DDL_RAN = b"R"  # backend: the schema change gid ran here (u64 gid, u32 xid, its content)
    SYNC = b"S"  # backend: a causal-read request (no body)
    INFO = b"I"  # backend: a request for one of the extension's views (UTF-8 text: nodestatus.info)
    VERDICT = b"V"  # coordinator: the answer to W or S


class FrameError(ValueError):
    """A malformed frame: the connection is closed."""


@dataclass(frozen=True)
class Frame:
    type: bytes
    payload: bytes


_LEN = struct.Struct(">I")
_FIXED = {FrameType.COMMITTED.value: 13, FrameType.ABORTED.value: 13, FrameType.SYNC.value: 1}  # fixed lengths
_RAN_HEAD = 12  # DDL_RAN: u64 gid, u32 xid, then the schema change's content (a writeset)


class FrameSplitter(Protocol):
    """A frame parser (either implementation)."""

    def feed(self, data: bytes) -> list[Frame]: ...

    def take_large(self, threshold: int) -> Optional[tuple[int, bytes]]: ...


class PyFrameParser:
    """Splits the bytes a backend sends into frames, as they arrive (the coordinator reads its
    sockets with callbacks, not one coroutine per frame). Raises :class:`FrameError` on the
    first malformed frame; the connection must then be closed."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        out: list[Frame] = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (length,) = _LEN.unpack_from(buf, pos)
            if length < 1 or length > MAX_FRAME:
                raise FrameError(f"frame length {length} out of range")
            if n - pos < 5:
                break  # the type byte has not arrived yet
            ftype = bytes(buf[pos + 4:pos + 5])
            if ftype not in _TYPES:
                raise FrameError(f"unknown frame type {ftype!r}")
            fixed = _FIXED.get(ftype)
            if fixed is not None and length != fixed:
                raise FrameError(f"frame {ftype!r} has {length - 1} payload bytes, expected {fixed - 1}")
            if ftype == FrameType.DDL_RAN and length - 1 < _RAN_HEAD:
                raise FrameError(f"frame b'R' has {length - 1} payload bytes, expected at least {_RAN_HEAD}")
            if n - pos - 4 < length:
                break
            out.append(Frame(ftype, bytes(buf[pos + 5:pos + 4 + length])))
            pos += 4 + length
        if pos:
            del buf[:pos]
        return out

    def take_large(self, threshold: int) -> Optional[tuple[int, bytes]]:
        """When the frame being received is a writeset of more than ``threshold`` bytes: its
        length and what has arrived of it (from its length prefix on), which the parser then
        forgets: the caller gathers the rest in a spool file (backends.py)."""
        buf = self._buf
        if len(buf) < 5 or buf[4] != FrameType.WRITESET.value[0]:
            return None
        (length,) = _LEN.unpack_from(buf, 0)
        if length - 1 <= threshold:
            return None
        data = bytes(buf)
        buf.clear()
        return length, data


_TYPES = frozenset(t.value for t in FrameType if t is not FrameType.VERDICT)  # what a backend sends


def parse_done(payload: bytes) -> tuple[int, int]:
    """(gid, xid) of a C or A frame."""
    gid, xid = struct.unpack(">QI", payload)
    return int(gid), int(xid)


def parse_ran(payload: bytes) -> tuple[int, int, bytes]:
    """(gid, xid, content) of an R frame: the schema change GID ran here; content is the
    writeset every node applies for it."""
    gid, xid = struct.unpack_from(">QI", payload)
    return int(gid), int(xid), payload[_RAN_HEAD:]


_VERDICT = struct.Struct(">IcBQQQH")


def py_verdict_frame(verdict: int, gid: int, wait_for: int, message: str, prev: Optional[int] = None) -> bytes:
    """The answer to a backend: the verdict, the GID, what its commit waits for and the previous
    certified GID (the same as wait_for with one commit lane), and a message."""
    msg = message.encode("utf-8")[:65535]
    return _VERDICT.pack(_VERDICT.size - 4 + len(msg), FrameType.VERDICT.value, verdict, gid, wait_for,
                         wait_for if prev is None else prev, len(msg)) + msg


def writeset_frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload) + 1) + FrameType.WRITESET.value + payload


def done_frame(kind: bytes, gid: int, xid: int) -> bytes:
    return struct.pack(">I", 13) + kind + struct.pack(">QI", gid, xid)


def ran_frame(gid: int, xid: int, content: bytes) -> bytes:
    return struct.pack(">I", 13 + len(content)) + FrameType.DDL_RAN.value + struct.pack(">QI", gid, xid) + content


_cproto = impl.compiled("_cproto")
if _cproto is not None:
    _cproto.bind_backend(sys.modules[__name__])
IMPL = impl.chosen(_cproto)
FrameParser: Callable[[], FrameSplitter] = PyFrameParser
verdict_frame: Callable[..., bytes] = py_verdict_frame
if IMPL == "c" and _cproto is not None:
    FrameParser, verdict_frame = _cproto.FrameParser, _cproto.verdict_frame
