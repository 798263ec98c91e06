"""The segments of an open log as the writer holds them, and the reader that follows them:
in-process readers (recovery sessions) read ranges while the writer appends (docs/WSLOG.md)."""

from __future__ import annotations

import mmap
import os
from typing import Callable, Optional

import crc32c as _crc32c

from chorus.wslog.format import (DATA_START, RECORD, RECORD_HEADER_SIZE, RECORD_MAGIC, LogCorrupt, LogError,
                                 LogRangeUnavailable, LogRecord, origin_text)
from chorus.wslog.scan import SparseIndex

class SegmentFile:
    """A segment file, open for the life of the log: its descriptor and a read-only map."""

    __slots__ = ("path", "fd", "mm", "dirty")

    def __init__(self, path: str, fd: int, mm: mmap.mmap) -> None:
        self.path, self.fd, self.mm, self.dirty = path, fd, mm, False

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class Segment:
    """One use of a segment file; ``valid`` ends when the file is reused, reset() or the log closes."""

    __slots__ = ("file", "seq", "prev_gid", "first_gid", "last_gid", "records", "end", "index", "valid",
                 "sealed", "next")

    def __init__(self, file: SegmentFile, seq: int, prev_gid: int, first_gid: int) -> None:
        self.file = file
        self.seq = seq
        self.prev_gid = prev_gid
        self.first_gid = first_gid
        self.last_gid = 0
        self.records = 0
        self.end = DATA_START
        self.index = SparseIndex()
        self.valid = True
        self.sealed = False  # the writer has moved on to the next segment
        self.next: Optional[Segment] = None

    @property
    def tip_gid(self) -> int:
        return self.last_gid if self.records else self.prev_gid



class LogReader:
    """Reads the records after a GID, continuing where it left off (also across later appends)."""

    def __init__(self, require_open: Callable[[], object], seg: Segment, off: int, after_gid: int) -> None:
        self._require_open = require_open  # raises once the log is closed
        self._seg: Optional[Segment] = seg
        self._off = off
        self._pos = after_gid

    @property
    def position_gid(self) -> int:
        """The last GID returned (the starting GID before the first)."""
        return self._pos

    def close(self) -> None:
        self._seg = None

    def read(self, max_gid: int, max_bytes: int = 1 << 20) -> list[LogRecord]:
        """The next records with a GID up to ``max_gid``, about ``max_bytes`` of them (at least one
        if one is there); [] when caught up with ``max_gid`` or with what is written so far.

        Raises :class:`LogRangeUnavailable` when the segment being read was reused or reset meanwhile.
        """
        seg = self._seg
        if seg is None:
            raise LogError("the writeset log reader is closed")
        self._require_open()
        off, pos = self._off, self._pos
        out: list[LogRecord] = []
        used = 0
        while True:
            if not seg.valid:
                raise LogRangeUnavailable(f"the writeset log segment {seg.seq} was reused before the reader got past "
                                          f"GID {pos}")
            if off >= seg.end:
                if not seg.sealed or seg.next is None:
                    break
                seg, off = seg.next, DATA_START
                continue
            mm = seg.file.mm
            crc, magic, flags, origin_len, payload_len, gid, rec_seq = RECORD.unpack_from(mm, off)
            size = RECORD_HEADER_SIZE + origin_len + payload_len
            if magic != RECORD_MAGIC or rec_seq != seg.seq or off + size > seg.end:
                raise LogCorrupt(f"writeset log segment {seg.file.path}: no valid record at offset {off}")
            if gid <= pos:  # before the start: skipped
                off += size
                continue
            if gid > max_gid or (out and used + size > max_bytes):
                break
            with memoryview(mm) as mv:
                ok = _crc32c.crc32c(mv[off + 4:off + size]) == crc
            if not ok:
                raise LogCorrupt(f"writeset log segment {seg.file.path}: CRC32C mismatch in the record at offset {off} "
                                 f"(GID {gid})")
            start = off + RECORD_HEADER_SIZE
            out.append(LogRecord(gid, origin_text(mm, start, origin_len), flags, mm[start + origin_len:off + size]))
            used += size
            pos = gid
            off += size
            if used >= max_bytes:
                break
        if not seg.valid:  # cannot happen in one thread, but never hand out bytes of a reused file
            raise LogRangeUnavailable(f"the writeset log segment {seg.seq} was reused while being read")
        self._seg, self._off, self._pos = seg, off, pos
        return out
