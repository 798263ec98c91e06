"""The segments of an open log as the writer holds them, and the reader that follows them:
in-process readers (recovery sessions) read ranges while the writer appends (docs/WSLOG.md)."""

from __future__ import annotations

import mmap
import os
from typing import Callable, Iterator, Optional

import crc32c as _crc32c

from chorus.wslog.format import (DATA_START, FLAG_COMMIT_TIME, FLAG_PIECE, FORMAT_VERSION, PIECE, RECORD, RECORD_HEADER_SIZE,
                                 RECORD_MAGIC, LogCorrupt,
                                 LogError, LogRangeUnavailable, LogRecord, split_origin)
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
                 "sealed", "next", "version")

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
        self.version = FORMAT_VERSION  # of its header: pieces go only into version 2 segments

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
            gid, flags, origin_len, size, total, first = self._header(seg, off)
            if gid <= pos:  # before the start (or a piece of a record before it): skipped
                off += size
                continue
            if not first:
                raise LogCorrupt(f"writeset log segment {seg.file.path}: a piece continuing GID {gid} at offset {off} "
                                 "follows no start of that record")
            need = RECORD_HEADER_SIZE + origin_len + total
            if gid > max_gid or (out and used + need > max_bytes):
                break
            start = off + RECORD_HEADER_SIZE
            origin, commit_time = split_origin(mm, start, origin_len, flags)
            payload: "bytes | PiecedPayload"
            if flags & FLAG_PIECE:
                payload, seg, off = self._pieces(seg, off, gid, total)
            else:
                self._check(seg, off, size, gid)
                payload = mm[start + origin_len:off + size]
                off += size
            out.append(LogRecord(gid, origin, flags & ~(FLAG_PIECE | FLAG_COMMIT_TIME), payload, commit_time))
            used += need
            pos = gid
            if used >= max_bytes:
                break
        if not seg.valid:  # cannot happen in one thread, but never hand out bytes of a reused file
            raise LogRangeUnavailable(f"the writeset log segment {seg.seq} was reused while being read")
        self._seg, self._off, self._pos = seg, off, pos
        return out

    @staticmethod
    def _header(seg: Segment, off: int) -> tuple[int, int, int, int, int, bool]:
        """(gid, flags, origin length, size on disk, the record's whole payload length, whether this
        is where the record starts) of the record or piece at ``off``, unchecked but in bounds."""
        crc, magic, flags, origin_len, payload_len, gid, rec_seq = RECORD.unpack_from(seg.file.mm, off)
        size = RECORD_HEADER_SIZE + origin_len + payload_len
        total, first = payload_len, True
        if flags & FLAG_PIECE:
            size += PIECE.size
            total, piece_off = PIECE.unpack_from(seg.file.mm, off + RECORD_HEADER_SIZE + origin_len)
            first = piece_off == 0
        if magic != RECORD_MAGIC or rec_seq != seg.seq or off + size > seg.end:
            raise LogCorrupt(f"writeset log segment {seg.file.path}: no valid record at offset {off}")
        return gid, flags, origin_len, size, total, first

    @staticmethod
    def _check(seg: Segment, off: int, size: int, gid: int) -> None:
        (crc,) = RECORD.unpack_from(seg.file.mm, off)[:1]
        with memoryview(seg.file.mm) as mv:
            ok = _crc32c.crc32c(mv[off + 4:off + size]) == crc
        if not ok:
            raise LogCorrupt(f"writeset log segment {seg.file.path}: CRC32C mismatch in the record at offset {off} "
                             f"(GID {gid})")

    def _pieces(self, seg: Segment, off: int, gid: int, total: int) -> tuple["PiecedPayload", Segment, int]:
        """The pieces of the record of ``gid`` that starts with the piece at ``off`` of ``seg`` and
        continues at the start of the segments after it (their headers checked: each continues
        the one before), and where the record ends. The bytes stay where they are."""
        pieces: list[tuple[Segment, int, int, int]] = []
        have = 0
        while True:
            if not seg.valid:
                raise LogRangeUnavailable(f"the writeset log segment {seg.seq} was reused while GID {gid} was read")
            pgid, flags, origin_len, size, ptotal, _ = self._header(seg, off)
            where = off + RECORD_HEADER_SIZE + origin_len
            _, piece_off = PIECE.unpack_from(seg.file.mm, where)
            if pgid != gid or not flags & FLAG_PIECE or ptotal != total or piece_off != have:
                raise LogCorrupt(f"writeset log segment {seg.file.path}: the piece at offset {off} does not continue "
                                 f"GID {gid} at byte {have}")
            pieces.append((seg, off, size, where + PIECE.size))
            have += off + size - where - PIECE.size
            off += size
            if have == total:
                return PiecedPayload(gid, total, pieces), seg, off
            if not seg.sealed or seg.next is None:
                raise LogCorrupt(f"writeset log: GID {gid} ends after {have} of its {total} bytes")
            seg, off = seg.next, DATA_START


class PiecedPayload:
    """The payload of a record logged in pieces, read where it lies: chunks() yields its bytes a
    few MB at a time, checking each piece's CRC first and, before every chunk, that its segment
    was not reused meanwhile; so a record of any size is served with bounded memory. ``bytes()``
    joins it (for a reader that needs it whole)."""

    __slots__ = ("gid", "total", "_pieces")

    def __init__(self, gid: int, total: int, pieces: list[tuple[Segment, int, int, int]]) -> None:
        self.gid, self.total, self._pieces = gid, total, pieces

    def __len__(self) -> int:
        return self.total

    def __bytes__(self) -> bytes:
        return b"".join(self.chunks())

    def chunks(self, size: int = 8 << 20) -> Iterator[bytes]:
        """The payload in order, in chunks of at most ``size`` bytes (each a copy)."""
        for seg, off, piece_size, start in self._pieces:
            if not seg.valid:
                raise LogRangeUnavailable(f"the writeset log segment {seg.seq} was reused while GID {self.gid} "
                                          "was served")
            LogReader._check(seg, off, piece_size, self.gid)
            end = off + piece_size
            for at in range(start, end, size):
                if not seg.valid:  # the caller may have waited between two chunks
                    raise LogRangeUnavailable(f"the writeset log segment {seg.seq} was reused while GID "
                                              f"{self.gid} was served")
                yield seg.file.mm[at:min(at + size, end)]
