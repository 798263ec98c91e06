"""The partial-recovery stream's wire format, version 2 (docs/RECOVERY.md; the server and the
client are recovery.py). Version 2 added PART frames, so that a record of any size travels in
frames of at most PART_BYTES; a joiner that speaks version 1 gets whole RECORD frames.

Commit times: a joiner that says ``"commit_times": true`` in its hello gets, in a record whose
frame flags have 0x02, its origin's commit time (u64, µs since the Unix epoch) after its origin,
so that a node that catches up logs and stamps what the others did (docs/LINKS.md section 5.1). A
partner of a release before ignores the field and sends none; a joiner of one does not ask.

Inside TLS, first a hello exchange of JSON lines (at most MAX_HELLO bytes each):

- joiner: ``{"protocol": 2, "cluster", "node", "nonce"}``;
- partner: ``{"nonce", "proof"}`` or ``{"error"}``;
- joiner: ``{"proof", "after", "upto"}``, the range ``(after, upto]`` it asks for.

A proof is HMAC-SHA256 with the cluster secret over the role, the cluster and both nonces.
Then frames ``u8 kind, u32 length, body`` (at most MAX_FRAME bytes), kinds in
:class:`FrameKind`: records, then one END or one ERROR.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import json
import struct
from typing import Any, Iterator, Optional

from chorus.spool import SPOOL_AT, Spool, SpoolWriter
from chorus.wslog import LogRecord, PiecedPayload

PROTOCOL = 2
PROTOCOLS = (1, 2)  # what a partner serves
FLAG_COMMIT_TIME = 0x02  # in a frame's flags (to a joiner that asked): a u64 commit time follows the origin
MAX_HELLO = 4096
MAX_FRAME = 512 << 20
PART_BYTES = 8 << 20  # a larger record goes in PART frames of this many payload bytes (version 2)
MAX_RECORD = 1 << 40  # the largest record a joiner takes in parts
HANDSHAKE_TIMEOUT_S = 10.0
RANGE_UNAVAILABLE = "range-unavailable:"  # an ERROR's text: the log no longer holds the range's start


class RecoveryError(Exception):
    """The stream failed (network, authentication, protocol); another partner may do."""


class RangeUnavailable(RecoveryError):
    """The partner's log no longer holds the start of the range."""


class FrameKind(bytes, enum.Enum):
    """A stream frame's kind byte. (Bus messages and backend frames have their own.)"""
    RECORD = b"R"  # a log record: u64 gid, u8 flags, u16 origin length, origin, [u64 commit time], payload
    PART = b"P"  # a part of a large log record: as RECORD, then u64 total payload length, u64 offset, bytes
    END = b"E"  # the end of this answer: u64 safe stop (the last GID the partner could serve)
    ERROR = b"X"  # UTF-8 text


_HEAD = struct.Struct(">cI")
_RECORD = struct.Struct(">QBH")
_END = struct.Struct(">Q")
_PART = struct.Struct(">QQ")


def proof(secret: bytes, role: bytes, *fields: str, protocol: bytes = b"chorus-recovery") -> str:
    """HMAC-SHA256 with ``secret`` over the protocol's name, the role proving and ``fields``
    (recovery's: the cluster and both nonces), joined by ``|``: fields must not contain one."""
    msg = b"|".join([protocol, role, *(f.encode() for f in fields)])
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


async def read_hello(reader: asyncio.StreamReader) -> dict[str, object]:
    """One JSON line of the hello exchange."""
    try:
        line = await asyncio.wait_for(reader.readline(), HANDSHAKE_TIMEOUT_S)
    except ValueError as e:  # a line longer than the stream's limit
        raise RecoveryError("handshake: message too long") from e
    if not line or len(line) > MAX_HELLO:
        raise RecoveryError("handshake: connection closed or message too long")
    try:
        obj = json.loads(line)
    except ValueError as e:  # not JSON, or not UTF-8
        raise RecoveryError(f"handshake: not JSON: {e}") from e
    if not isinstance(obj, dict):
        raise RecoveryError("handshake: not a JSON object")
    return obj


def hello(obj: dict[str, object]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _frame(kind: FrameKind, body: bytes) -> bytes:
    return _HEAD.pack(kind.value, len(body)) + body


def _record_head(r: LogRecord, times: bool) -> bytes:
    """A record frame's head: GID, flags, origin and, to a joiner that takes them, the commit time."""
    o = r.origin.encode("utf-8")
    if times and r.commit_time:
        return _RECORD.pack(r.gid, r.flags | FLAG_COMMIT_TIME, len(o)) + o + _END.pack(r.commit_time)
    return _RECORD.pack(r.gid, r.flags, len(o)) + o


def encode_record(r: LogRecord, times: bool = False) -> bytes:
    return _frame(FrameKind.RECORD, _record_head(r, times) + bytes(r.payload))


def encode_record_frames(r: LogRecord, protocol: int = PROTOCOL, times: bool = False) -> Iterator[bytes]:
    """The frames carrying ``r``: one RECORD frame, or PART frames for a record larger than
    PART_BYTES (to a joiner of protocol version 2). A payload read in pieces from the log
    (wslog.PiecedPayload) is read a part at a time as the frames are taken, so serving a record
    of any size holds one part in memory (a joiner of version 1 gets it whole)."""
    if protocol < 2 or len(r.payload) <= PART_BYTES:
        yield encode_record(r, times)
        return
    head = _record_head(r, times)
    total = len(r.payload)
    off = 0
    for chunk in _chunks(r.payload):
        yield _frame(FrameKind.PART, head + _PART.pack(total, off) + chunk)
        off += len(chunk)
    if off != total:
        raise RecoveryError(f"GID {r.gid}: {off} of its {total} bytes were read")


def _chunks(payload: Any) -> Iterator[Any]:
    """``payload`` in chunks of PART_BYTES (the last one shorter)."""
    if isinstance(payload, PiecedPayload):  # the log's pieces end anywhere: parts are filled across them
        held = bytearray()
        for chunk in payload.chunks(PART_BYTES):
            if not held and len(chunk) == PART_BYTES:
                yield chunk
                continue
            take = PART_BYTES - len(held)
            held += chunk[:take]
            if len(held) == PART_BYTES:
                yield bytes(held)
                held = bytearray(chunk[take:])
        if held:
            yield bytes(held)
        return
    with memoryview(payload) as mv:
        for off in range(0, len(mv), PART_BYTES):
            yield mv[off:off + PART_BYTES]


class PartAssembler:
    """Joins the PART frames of one record; one record at a time, in order. With a ``spool``, a
    record larger than spool.SPOOL_AT is gathered in a spool file, and its payload is a
    :class:`~chorus.spool.SpooledBuffer` (mapped, not in memory)."""

    def __init__(self, spool: Optional[Spool] = None) -> None:
        self._head: Optional[tuple[int, int, str, int]] = None  # gid, flags, origin, commit time of the open record
        self._parts: list[bytes] = []
        self._spooled: Optional[SpoolWriter] = None
        self._have = 0
        self._total = 0
        self.spool = spool

    def discard(self) -> None:
        """Forget the record being received (the stream ended inside it)."""
        if self._spooled is not None:
            self._spooled.discard()
        self._head, self._parts, self._spooled = None, [], None

    @property
    def open(self) -> bool:
        return self._head is not None

    def add(self, body: bytes) -> Optional[LogRecord]:
        """Take one PART frame's body; the whole record once its last part is in, else None."""
        r = decode_record(body)
        if len(r.payload) < _PART.size:
            raise RecoveryError("part frame too short")
        total, off = _PART.unpack_from(r.payload)
        data = r.payload[_PART.size:]
        if off == 0 and self._head is None:
            if total > MAX_RECORD:
                raise RecoveryError(f"a record of {total} bytes is larger than a joiner takes ({MAX_RECORD})")
            self._head, self._parts, self._have, self._total = (r.gid, r.flags, r.origin, r.commit_time), [], 0, total
            if self.spool is not None and total > SPOOL_AT:
                self._spooled = self.spool.writer()
        elif self._head != (r.gid, r.flags, r.origin, r.commit_time) or off != self._have or total != self._total:
            raise RecoveryError(f"part of GID {r.gid} at byte {off} does not continue the record being received")
        if not data or self._have + len(data) > total:
            raise RecoveryError(f"part of GID {r.gid} at byte {off} runs past the record's {total} bytes")
        if self._spooled is not None:
            self._spooled.write(data)
        else:
            self._parts.append(data)
        self._have += len(data)
        if self._have < total:
            return None
        gid, flags, origin, commit_time = self._head
        if self._spooled is not None:
            payload: Any = self._spooled.finish()
        else:
            payload = b"".join(self._parts)
        self._head, self._parts, self._spooled = None, [], None
        return LogRecord(gid, origin, flags, payload, commit_time)


def decode_record(body: bytes) -> LogRecord:
    if len(body) < _RECORD.size:
        raise RecoveryError("record frame too short")
    gid, flags, olen = _RECORD.unpack_from(body)
    start = _RECORD.size
    if start + olen > len(body):
        raise RecoveryError("record frame truncated")
    try:
        origin = body[start:start + olen].decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecoveryError("record origin is not UTF-8") from e
    start += olen
    commit_time = 0
    if flags & FLAG_COMMIT_TIME:
        if start + _END.size > len(body):
            raise RecoveryError("record frame truncated")
        (commit_time,) = _END.unpack_from(body, start)
        start += _END.size
        flags &= ~FLAG_COMMIT_TIME
    return LogRecord(gid, origin, flags, body[start:], int(commit_time))


def encode_end(stop: int) -> bytes:
    return _frame(FrameKind.END, _END.pack(stop))


def decode_end(body: bytes) -> int:
    if len(body) != _END.size:
        raise RecoveryError(f"end frame of {len(body)} bytes, expected {_END.size}")
    return int(_END.unpack(body)[0])


def encode_error(text: str) -> bytes:
    return _frame(FrameKind.ERROR, text.encode())


def decode_error(body: bytes) -> RecoveryError:
    """The exception an ERROR frame stands for."""
    text = body.decode("utf-8", "replace")
    if text.startswith(RANGE_UNAVAILABLE):
        return RangeUnavailable(text[len(RANGE_UNAVAILABLE):].strip())
    return RecoveryError(f"partner error: {text}")


async def read_frame(reader: asyncio.StreamReader) -> tuple[FrameKind, bytes]:
    """The next frame; an unknown kind or an oversized frame is refused."""
    kind, n = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if n > MAX_FRAME:
        raise RecoveryError(f"frame of {n} bytes is too large")
    try:
        known = FrameKind(kind)
    except ValueError:
        raise RecoveryError(f"unknown frame type {kind!r}") from None
    return known, await reader.readexactly(n)
