"""Reading a log directory as it is on disk: each segment's records checked, and which
segments form the log (docs/WSLOG.md). Shared by the writer's open() and by inspect/verify;
reads, never writes."""

from __future__ import annotations

import bisect
import mmap
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from chorus.wslog.format import (DATA_START, RECORD_HEADER_SIZE, SEGMENT_HEADER_SIZE, SEGMENT_SUFFIX, BadRecord,
                                 LogCorrupt, LogVersionError, Piece, SegmentHeader, decode_segment_header,
                                 parse_record)

INDEX_EVERY_RECORDS = 64
INDEX_EVERY_BYTES = 64 << 10

class SparseIndex:
    """GID -> offset for every 64th record or 64 KiB of a segment, to position readers quickly."""

    __slots__ = ("gids", "offsets", "_since")

    def __init__(self) -> None:
        self.gids: list[int] = []
        self.offsets: list[int] = []
        self._since = 0

    def note(self, gid: int, off: int) -> None:
        if (not self.offsets or self._since >= INDEX_EVERY_RECORDS
                or off - self.offsets[-1] >= INDEX_EVERY_BYTES):
            self.gids.append(gid)
            self.offsets.append(off)
            self._since = 0
        self._since += 1

    def start(self, after_gid: int) -> int:
        """An offset at or before the first record with a GID greater than ``after_gid``."""
        i = bisect.bisect_right(self.gids, after_gid) - 1
        return self.offsets[i] if i >= 0 else DATA_START


@dataclass
class Scan:
    """The records of one segment, checked."""

    end: int  # where the valid records end
    records: int = 0  # records that start here (held whole, or a record's first piece)
    first_gid: int = 0  # of the first record that starts here
    last_gid: int = 0  # of the last record or piece here
    index: SparseIndex = field(default_factory=SparseIndex)
    problem: Optional[BadRecord] = None  # what ended the records, when not a clean end
    listing: Optional[list[dict[str, Any]]] = None
    beyond: bool = False  # records after the GID the scan was limited to follow ``end``
    lead: Optional[tuple[int, Piece]] = None  # the piece that continues a record from the segment before
    tail: Optional[tuple[int, Piece, int]] = None  # the piece (and its offset) that a later segment continues


def scan_records(mm: mmap.mmap, header: SegmentHeader, listing: bool = False, upto: Optional[int] = None,
                 end_at: Optional[int] = None) -> Scan:
    """Check the records of one segment. With ``upto``, the records end before the first one
    whose GID is above it (``beyond`` then says that there were more); with ``end_at``, they end
    at that offset (a record boundary).

    A piece that continues a record may only be the segment's first record, and only of GID
    ``prev_gid``; a piece that a later segment continues may only be its last. Whether the pieces
    of adjacent segments fit together is for :func:`analyze`."""
    limit = min(len(mm), header.segment_bytes)
    scan = Scan(end=DATA_START, listing=[] if listing else None)
    off, last = DATA_START, header.prev_gid
    with memoryview(mm) as mv:
        while end_at is None or off < end_at:
            try:
                rec = parse_record(mv, off, limit, header.seq, last, header.version)
                if rec is not None:
                    _check_place(rec.gid, rec.piece, scan, off, header)
            except BadRecord as bad:
                scan.problem = bad
                if scan.listing is not None and bad.size is not None:
                    scan.listing.append({"gid": bad.gid, "origin": bad.origin, "flags": bad.flags, "size": bad.size,
                                         "offset": off, "crc_ok": False})
                break
            if rec is None:
                break
            gid, piece = rec.gid, rec.piece
            if upto is not None and gid > upto:
                scan.beyond = True
                break
            if scan.listing is not None:
                entry = {"gid": gid, "origin": rec.origin, "flags": rec.flags, "size": rec.size, "offset": off,
                         "crc_ok": True}
                if rec.commit_time:
                    entry["commit_time"] = rec.commit_time
                if piece is not None:
                    entry["piece"] = {"total": piece.total, "offset": piece.offset, "length": piece.length}
                scan.listing.append(entry)
            if piece is not None and not piece.first:
                scan.lead = (gid, piece)
            else:
                if not scan.records:
                    scan.first_gid = gid
                scan.index.note(gid, off)
                scan.records += 1
            if piece is not None and not piece.last:
                scan.tail = (gid, piece, off)
            scan.last_gid = last = gid
            off += rec.size
    scan.end = off
    return scan


def _check_place(gid: int, piece: Optional[Piece], scan: Scan, off: int, header: SegmentHeader) -> None:
    """Raise BadRecord when a record stands where the format does not allow it."""
    if scan.tail is not None:
        raise BadRecord("piece", f"a record follows a piece of GID {scan.tail[0]} that the next segment should "
                        "continue", gid)
    if piece is not None and not piece.first and (off != DATA_START or gid != header.prev_gid):
        raise BadRecord("piece", f"a piece continuing GID {gid} is not the first record of a segment following it",
                        gid)
    starts = piece is None or piece.first
    if starts and not scan.records and header.first_gid and gid != header.first_gid:
        raise BadRecord("first gid", f"the first record has GID {gid}, the header says {header.first_gid}", gid)


@dataclass(frozen=True)
class Problem:
    """Something wrong found in a log directory."""

    file: str
    offset: Optional[int]
    kind: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "offset": self.offset, "kind": self.kind, "message": self.message}


@dataclass(eq=False)
class FoundSegment:
    """One segment file as found on disk."""

    path: str
    fd: int
    size: int
    raw_header: bytes
    header: Optional[SegmentHeader]
    header_problem: Optional[str] = None
    version_problem: bool = False
    mm: Optional[mmap.mmap] = None
    state: str = "free"  # free, bad header, old epoch, live, cut
    scan: Optional[Scan] = None

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def release(self) -> tuple[int, mmap.mmap]:
        """The descriptor and a read-only map of the file; this object no longer owns them."""
        if self.mm is None:
            self.mm = mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ)
        fd, mm = self.fd, self.mm
        self.fd, self.mm = -1, None
        return fd, mm


def open_found(path: str, writable: bool) -> Optional[FoundSegment]:
    try:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    except FileNotFoundError:
        return None  # a writer renamed it meanwhile
    size = os.fstat(fd).st_size
    raw = os.pread(fd, SEGMENT_HEADER_SIZE, 0)
    f = FoundSegment(path, fd, size, raw, None)
    try:
        f.header = decode_segment_header(raw)
    except LogVersionError as e:
        f.header_problem, f.version_problem = str(e), True
    except LogCorrupt as e:
        f.header_problem = str(e)
    if f.header is not None and f.header.segment_bytes != size:
        f.header_problem = f"the file is {size} bytes, its header says {f.header.segment_bytes}"
        f.header = None
    if f.header is not None:
        f.mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    return f


def segment_paths(directory: str) -> list[str]:
    try:
        names = [n for n in os.listdir(directory) if n.endswith(SEGMENT_SUFFIX)]
    except NotADirectoryError as e:
        raise LogCorrupt(f"{directory} is not a directory") from e
    except FileNotFoundError as e:
        raise LogCorrupt(f"{directory} does not exist") from e
    return [os.path.join(directory, n) for n in sorted(names)]


@dataclass
class Analysis:
    """Which segment files form the log, and what is wrong with the others."""

    found: list[FoundSegment]  # the live segments in seq order first, then the rest
    live: list[FoundSegment]
    problems: list[Problem]
    cut: Optional[tuple[FoundSegment, int]] = None  # the live segment whose records end early, and where
    end_reason: Optional[str] = None  # why the log ends early (a bad record, a missing segment)
    dropped: list[FoundSegment] = field(default_factory=list)  # segments of the log's epoch after the end


def analyze(found: list[FoundSegment], upto: Optional[int] = None) -> Analysis:
    """Decide the log from the files' headers and records (reads the maps, writes nothing). With
    ``upto``, the log ends at GID ``upto``: the records after it are cut like a bad tail."""
    an = Analysis([], [], [])
    for f in found:
        if f.header_problem is not None:
            f.state = "bad header"
            an.problems.append(Problem(f.name, 0, "header", f.header_problem))
    valid = sorted((f for f in found if f.header is not None), key=lambda f: f.header.seq if f.header else 0)
    epoch = valid[-1].header.epoch if valid and valid[-1].header else 0
    for f in valid:
        assert f.header is not None and f.mm is not None
        if f.header.epoch != epoch:
            f.state = "old epoch"
            continue
        f.scan = scan = scan_records(f.mm, f.header, upto=upto)
        if scan.problem is not None:
            an.problems.append(Problem(f.name, scan.end, scan.problem.kind, describe(scan.problem)))
        if an.end_reason is not None:
            f.state = "cut"
            an.dropped.append(f)
            continue
        if an.live and f.header.prev_gid > tip_gid_of(an.live[-1]):
            before = an.live[-1]  # a writer may have appended to it since it was read, then moved on
            assert before.mm is not None and before.header is not None
            before.scan = scan_records(before.mm, before.header, upto=upto)
        if an.live and f.header.prev_gid != tip_gid_of(an.live[-1]):
            before = an.live[-1]
            an.problems.append(Problem(f.name, 0, "chain", f"the segment follows GID {f.header.prev_gid} but "
                                       f"{before.name} ends at GID {tip_gid_of(before)}: a segment is missing or damaged"))
            an.end_reason = f"{f.name} does not follow {before.name}"
            f.state = "cut"
            an.dropped.append(f)
            continue
        f.state = "live"
        an.live.append(f)
        if scan.problem is not None:
            an.cut = (f, scan.end)
            an.end_reason = f"{f.name} offset {scan.end}: {scan.problem.kind}: {describe(scan.problem)}"
        elif scan.beyond:
            an.cut = (f, scan.end)
            an.end_reason = f"it held records after GID {upto}, where it was asked to end"
    _join_pieces(an, upto)
    an.found = an.live + [f for f in found if f.state != "live"]
    return an


def _join_pieces(an: Analysis, upto: Optional[int]) -> None:
    """Check that the pieces of every record that spans segments follow each other; the log ends
    before the first record whose pieces do not (a torn or missing continuation, most often the
    last record's, written when the process died)."""
    # the record whose pieces continue in the next segment: gid, next offset, total, where it starts
    open_rec: Optional[tuple[int, int, int, Optional[FoundSegment], int]] = None
    for i, f in enumerate(an.live):
        s = f.scan
        assert s is not None
        if s.lead is not None:
            gid, piece = s.lead
            if open_rec is None and i > 0:
                _end_at(an, f, DATA_START, upto, f"{f.name} starts with a piece of GID {gid} that no record "
                        "before it begins")
                return
            if open_rec is not None and open_rec[:3] != (gid, piece.offset, piece.total):
                _end_at(an, open_rec[3] or f, open_rec[4], upto,
                        f"{f.name} does not continue GID {open_rec[0]} where the segment before left it")
                return
            # (the oldest segment may continue a record whose start was reused: it is skipped)
            head = (open_rec[3], open_rec[4]) if open_rec is not None else (None, DATA_START)
            open_rec = None if piece.last else (gid, piece.offset + piece.length, piece.total, *head)
        elif open_rec is not None:
            _end_at(an, open_rec[3] or f, open_rec[4], upto,
                    f"the record of GID {open_rec[0]} is not complete ({f.name} does not continue it)")
            return
        if s.tail is not None and (s.lead is None or s.tail[1] is not s.lead[1]):
            gid, piece, off = s.tail
            open_rec = (gid, piece.offset + piece.length, piece.total, f, off)
    if open_rec is not None:
        _end_at(an, open_rec[3] or an.live[0], open_rec[4], upto,
                f"the record of GID {open_rec[0]} is not complete (the log ends inside it)")


def _end_at(an: Analysis, f: FoundSegment, off: int, upto: Optional[int], reason: str) -> None:
    """End the log at offset ``off`` of live segment ``f``: the later live segments are dropped."""
    assert f.mm is not None and f.header is not None
    i = an.live.index(f)
    for later in an.live[i + 1:]:
        later.state = "cut"
        an.dropped.append(later)
    del an.live[i + 1:]
    f.scan = scan_records(f.mm, f.header, upto=upto, end_at=off)
    an.problems.append(Problem(f.name, off, "piece", reason))
    an.cut = (f, off)
    an.end_reason = f"{f.name} offset {off}: {reason}"


def tip_gid_of(f: FoundSegment) -> int:
    """The last GID of a scanned segment, or the GID it follows when it has no record."""
    assert f.header is not None and f.scan is not None
    return f.scan.last_gid if f.scan.records else f.header.prev_gid


def describe(bad: BadRecord) -> str:
    return bad.message if bad.gid is None or bad.kind == "order" else f"{bad.message} (record GID {bad.gid})"


def dirty_extent(mm: mmap.mmap, start: int, end: int) -> int:
    """The offset just past the last non-zero byte in [start, end), or ``start``."""
    pos = end
    while pos > start:
        lo = max(start, pos - (1 << 20))
        chunk = mm[lo:pos].rstrip(b"\0")
        if chunk:
            return lo + len(chunk)
        pos = lo
    return start
