"""Traces: one node's core input and output, in the order the core processed them
(docs/NATIVE.md 4.1), written and read in a versioned binary format.

::

    "CHTRACE1" | u32 header length | header (JSON object: "version", "node", and what else the
                                              recorder knows: source, seed, member, impls)
    records:     u32 length | u8 code | u8 depth | u64 seq | f64 mono | f64 wall | body

All integers are big-endian; ``length`` counts from ``code`` to the end of the body. The record
codes and bodies are ``events.py``'s. The reader refuses, with one exception
(:class:`TraceError`), anything but a whole trace of a version it reads: a wrong magic, a header
that is not such a JSON object, a length outside the bounds, an unknown code, a body that does
not fill its record exactly, a depth or a time that cannot be.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Optional

from chorus.dataplane import events as ev
from chorus.dataplane.events import Record, TraceError

MAGIC = b"CHTRACE1"
VERSION = 1  # what this code writes and reads
MAX_HEADER = 1 << 20
MAX_RECORD = ev.MAX_BLOB + (1 << 20)
MAX_DEPTH = 64
_HEAD = struct.Struct(">8sI")
_REC = struct.Struct(">IBBQdd")  # length, code, depth, seq, mono, wall
_REC_FIXED = _REC.size - 4  # what ``length`` counts besides the body

__all__ = ["MAGIC", "VERSION", "Trace", "TraceError", "TraceWriter", "encode_record", "read_trace", "iter_records"]


def encode_record(rec: Record) -> bytes:
    body = ev.encode_body(rec)
    if not 0 <= rec.depth <= MAX_DEPTH:
        raise TraceError(f"depth {rec.depth}: at most {MAX_DEPTH}")
    return _REC.pack(_REC_FIXED + len(body), rec.CODE, rec.depth, rec.seq, rec.mono, rec.wall) + body


def encode_header(header: dict[str, Any]) -> bytes:
    if not isinstance(header.get("node"), str):
        raise TraceError("a trace header names its node")
    raw = json.dumps({**header, "version": VERSION}, sort_keys=True).encode()
    if len(raw) > MAX_HEADER:
        raise TraceError(f"header of {len(raw)} bytes: at most {MAX_HEADER}")
    return _HEAD.pack(MAGIC, len(raw)) + raw


class TraceWriter:
    """Appends records to ``out`` (a binary file) after the header, or to memory (``out`` None:
    :meth:`getvalue`)."""

    def __init__(self, header: dict[str, Any], out: Optional[BinaryIO] = None) -> None:
        self._out = out
        self._buf = bytearray()
        self.header = dict(header)
        self.records = 0
        self._write(encode_header(self.header))

    def _write(self, b: bytes) -> None:
        if self._out is None:
            self._buf += b
        else:
            self._out.write(b)

    def __call__(self, rec: Record) -> None:
        self._write(encode_record(rec))
        self.records += 1

    def getvalue(self) -> bytes:
        if self._out is not None:
            raise ValueError("the trace was written to a file")
        return bytes(self._buf)


@dataclass(frozen=True)
class Trace:
    header: dict[str, Any]
    records: tuple[Record, ...]

    @property
    def node(self) -> str:
        return str(self.header["node"])

    def events(self) -> Iterator[Record]:
        return (r for r in self.records if r.is_event)

    def actions(self) -> Iterator[Record]:
        return (r for r in self.records if not r.is_event)


def _header(data: bytes) -> tuple[dict[str, Any], int]:
    if len(data) < _HEAD.size:
        raise TraceError(f"not a trace: {len(data)} bytes, shorter than the header")
    magic, n = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise TraceError(f"not a trace: magic {magic!r}, expected {MAGIC!r}")
    if n > MAX_HEADER or _HEAD.size + n > len(data):
        raise TraceError(f"trace header of {n} bytes does not fit (at most {MAX_HEADER}, {len(data) - _HEAD.size} left)")
    try:
        header = json.loads(data[_HEAD.size:_HEAD.size + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise TraceError(f"trace header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise TraceError("trace header is not a JSON object")
    version = header.get("version")
    if type(version) is not int:
        raise TraceError(f"trace header has no integer version: {version!r}")
    if version != VERSION:
        raise TraceError(f"trace version {version}: this reader reads version {VERSION} only")
    if not isinstance(header.get("node"), str):
        raise TraceError("trace header names no node")
    return header, _HEAD.size + n


def iter_records(data: bytes, pos: int) -> Iterator[Record]:
    """The records of ``data`` from ``pos`` (the end of the header) to its end."""
    end = len(data)
    while pos < end:
        if end - pos < _REC.size:
            raise TraceError(f"record at byte {pos} truncated: {end - pos} bytes left")
        length, code, depth, seq, mono, wall = _REC.unpack_from(data, pos)
        if length < _REC_FIXED or length > MAX_RECORD:
            raise TraceError(f"record at byte {pos}: length {length} outside [{_REC_FIXED}, {MAX_RECORD}]")
        stop = pos + 4 + length
        if stop > end:
            raise TraceError(f"record at byte {pos} truncated: {length} bytes announced, {end - pos - 4} left")
        if depth > MAX_DEPTH:
            raise TraceError(f"record at byte {pos}: depth {depth} above {MAX_DEPTH}")
        if not (math.isfinite(mono) and math.isfinite(wall)):
            raise TraceError(f"record at byte {pos}: time {mono}, {wall} is not finite")
        yield ev.decode_body(code, data, pos + _REC.size, stop, depth, seq, mono, wall)
        pos = stop


def read_trace(data: bytes) -> Trace:
    """A whole trace, or :class:`TraceError`."""
    data = bytes(data)
    header, pos = _header(data)
    return Trace(header, tuple(iter_records(data, pos)))


def load(path: str) -> Trace:
    with open(path, "rb") as f:
        return read_trace(f.read())
