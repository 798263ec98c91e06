"""What the writeset log's tests share (tests/unit/test_wslog_*.py): records, a small ring, reading
it all back, finding and patching a record in the files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from chorus.wslog import FLAG_DDL_SKIPPED, LogRecord, WritesetLog, inspect_segment

SEG = 4096


def payload(gid: int, size: int = 200) -> bytes:
    return (f"writeset {gid};".encode() * (size // 10 + 1))[:size]


def record(gid: int, size: int = 200) -> LogRecord:
    return LogRecord(gid, f"node{gid % 3}", FLAG_DDL_SKIPPED if gid % 7 == 0 else 0, payload(gid, size))


def make(directory: Path, segments: int = 16, seg: int = SEG) -> WritesetLog:
    wl = WritesetLog(str(directory), segment_bytes=seg, total_bytes=segments * seg)
    wl.open()
    return wl


def fill(wl: WritesetLog, gids: Iterator[int] | list[int] | range, size: int = 200) -> list[LogRecord]:
    out = []
    for g in gids:
        r = record(g, size)
        wl.append(r.gid, r.origin, r.payload, r.flags)
        out.append(r)
    return out


def read_all(wl: WritesetLog, after_gid: int, max_gid: int = 2**63, max_bytes: int = 1 << 20) -> list[LogRecord]:
    rd = wl.reader(after_gid)
    out: list[LogRecord] = []
    while batch := rd.read(max_gid, max_bytes):
        # a record logged in pieces is read where it lies; bytes() reads (and checks) its pieces
        out.extend(LogRecord(r.gid, r.origin, r.flags, bytes(r.payload), r.commit_time) for r in batch)
    rd.close()
    return out


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.wsl"))


def record_at(directory: Path, gid: int) -> tuple[Path, int, int]:
    """The file, offset and size of the record with this GID (found with inspect_segment)."""
    for path in segment_files(directory):
        for r in inspect_segment(str(path))["records"]:
            if r["gid"] == gid:
                return path, r["offset"], r["size"]
    raise AssertionError(f"no record {gid}")


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def big(gid: int, segments: float) -> LogRecord:
    """A record whose payload is ``segments`` segments long (random bytes, so a shifted piece shows)."""
    return LogRecord(gid, f"node{gid % 3}", FLAG_DDL_SKIPPED if gid % 7 == 0 else 0,
                     os.urandom(int(segments * SEG)))


def append_records(wl: WritesetLog, records: list[LogRecord]) -> None:
    wl.append_many([(r.gid, r.origin, r.payload, r.flags) for r in records])


def set_version(path: Path, version: int) -> None:
    """Rewrite a segment's header to say format ``version`` (its CRC made again)."""
    import struct

    import crc32c

    raw = bytearray(path.read_bytes()[:64])
    raw[8:10] = struct.pack("<H", version)
    raw[56:60] = struct.pack("<I", crc32c.crc32c(bytes(raw[:56])))
    patch(path, 0, bytes(raw))
