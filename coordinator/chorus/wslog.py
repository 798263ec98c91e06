"""The writeset log: an on-disk ring of fixed-size segment files (seed sections 9.1 and 9.5).

Every node appends each certified writeset here, in GID order, so that it can serve the partial
recovery (seed 9.1) of a node that was away. GIDs strictly increase; gaps are normal (a GID that
failed certification is simply absent). Recovery sessions of the same process read ranges while
the writer appends; ``chorus log inspect/verify`` may read the files from another process.

On-disk format, version 1
-------------------------
A log is a directory (0700) of segment files (0600), each preallocated to exactly
``segment_bytes`` and named after its sequence number: ``00000007.wsl``. The header decides,
not the name (a crash can leave a reused file under its old name; ``open()`` renames it).

Segment header, 64 bytes, little-endian::

    magic "CHORUSWL" | version u16 | header size u16 (64) | flags u32 (0) | seq u64 | epoch u64 |
    segment bytes u64 | prev GID u64 | first GID u64 | CRC32C of the 56 bytes before u32 | 4 zero bytes

``seq`` grows by one (or more) each time a file starts a new use. ``prev GID`` is the last GID the
log held when the segment was started (or the point given to ``reset()``), so the log holds every
certified GID after the oldest segment's prev GID. ``first GID`` is the GID of its first record
(0 while it has none). ``epoch`` changes on ``reset()``. An all-zero header marks a free file.

Records follow the header back to back; a record never spans segments::

    CRC32C u32 | magic "WR" | flags u8 | origin length u8 | payload length u32 | GID u64 | seq u64 |
    origin (utf-8) | payload

The CRC covers everything after itself. ``seq`` repeats the segment's sequence number, so a record
left over from an earlier use of the file is never taken for a current one. The records end at
eight zero bytes (every append writes them after its record; a fresh file is zero) or at the end
of the file.

Which segments form the log: among the files with a valid header, those of the newest epoch
(the epoch of the highest seq), in seq order, each one's prev GID equal to the last GID of the one
before. Walking them from the oldest, the first thing wrong (a torn or corrupt record, a GID not
increasing, a missing segment) ends the log: ``open()`` cuts there, logs what it dropped, zeroes
the rest of that segment and frees every later one.

What ``reader(after_gid)`` needs
--------------------------------
The log holds every certified GID in ``(base_gid, end_gid]``: ``base_gid`` is the oldest
segment's prev GID, ``end_gid`` is the last GID appended (or the ``reset()`` point when nothing
was appended since). A reader after ``after_gid`` can be served exactly when
``base_gid <= after_gid``. That includes a gap before ``low_gid`` made of GIDs that failed
certification, and ``after_gid >= end_gid`` (nothing is missing yet; the reader waits for
appends). The log cannot know about GIDs certified while it was not running: the owner must
``reset(committed_gid)`` when ``end_gid`` is behind the database (a fresh directory, a lost tail).

Durability (seed 9.5.1), reuse (9.5.4) and concurrency (9.5.3)
--------------------------------------------------------------
Appends are written with one ``pwritev`` on an O_RDWR descriptor and are not flushed: the
database's commit record is the durable truth, and a lost or torn tail is cut at the next
``open()``. The only flushes are a new segment's header (before any of its records, so after a
crash a reused file never shows new records under its old header; once per segment), ``reset()``,
what ``open()`` changes when it cuts, and ``sync()`` (clean shutdown).

When the ring is full the oldest segment is reused: its in-memory generation ends and its header
gets the new seq first, then records follow. In-process readers check the generation before and
after each read; out-of-process readers see the new seq in the header and in the records.

One writer per directory (an exclusive ``flock`` on the directory); readers take no lock.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import logging
import mmap
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import crc32c as _crc32c

log = logging.getLogger("chorus.wslog")

FORMAT_VERSION = 1
SEGMENT_MAGIC = b"CHORUSWL"
RECORD_MAGIC = b"WR"
SEGMENT_SUFFIX = ".wsl"

FLAG_DDL_SKIPPED = 0x01  # a schema change whose origin failed: commit the GID, skip the change
KNOWN_FLAGS = FLAG_DDL_SKIPPED

MAX_ORIGIN_BYTES = 255
MAX_PAYLOAD_BYTES = 0xFFFFFFFF
MIN_SEGMENT_BYTES = 4096

_SEGMENT_HEAD = struct.Struct("<8sHHIQQQQQ")  # everything before the header CRC
_U32 = struct.Struct("<I")
SEGMENT_HEADER_SIZE = 64
DATA_START = SEGMENT_HEADER_SIZE

_RECORD = struct.Struct("<I2sBBIQQ")  # crc, magic, flags, origin length, payload length, gid, seq
_RECORD_REST = struct.Struct("<2sBBIQQ")  # the same without the CRC: what the CRC starts with
RECORD_HEADER_SIZE = _RECORD.size
_END = bytes(8)  # what follows the last record
_MAX_IOV = 900  # buffers in one pwritev (the system allows 1024)
_FREE_HEADER = bytes(SEGMENT_HEADER_SIZE)

INDEX_EVERY_RECORDS = 64
INDEX_EVERY_BYTES = 64 << 10

# verify_directory() and inspect_segment() read files a writer may be changing: they read again
# while what they find keeps changing.
_READ_ATTEMPTS = 5
_READ_PAUSE = 0.05

Buffer = Union[bytes, bytearray, memoryview]


class LogError(Exception):
    """Base of the writeset log's errors."""


class LogCorrupt(LogError):
    """The files are not a valid log: a damaged header, a bad directory, a record that fails its check."""


class LogVersionError(LogCorrupt):
    """A segment written in a format version this code does not read."""


class LogRangeUnavailable(LogError):
    """The log does not (or no longer) hold the records asked for."""


@dataclass(frozen=True)
class LogRecord:
    gid: int
    origin: str  # the node that originated the writeset (utf-8, at most 255 bytes)
    flags: int  # u8, FLAG_DDL_SKIPPED
    payload: bytes  # the encoded writeset, opaque to the log


def segment_name(seq: int) -> str:
    return f"{seq:08d}{SEGMENT_SUFFIX}"


# ---------------------------------------------------------------------------------------------
# The format: pure functions over bytes.


@dataclass(frozen=True)
class SegmentHeader:
    seq: int
    epoch: int
    segment_bytes: int
    prev_gid: int
    first_gid: int

    def encode(self) -> bytes:
        head = _SEGMENT_HEAD.pack(SEGMENT_MAGIC, FORMAT_VERSION, SEGMENT_HEADER_SIZE, 0, self.seq,
                                  self.epoch, self.segment_bytes, self.prev_gid, self.first_gid)
        return head + _U32.pack(_crc32c.crc32c(head)) + bytes(SEGMENT_HEADER_SIZE - _SEGMENT_HEAD.size - 4)


def decode_segment_header(raw: bytes) -> Optional[SegmentHeader]:
    """The header at the start of ``raw``; None for a free segment (an all-zero header).

    Raises :class:`LogVersionError` for a format version other than 1 and :class:`LogCorrupt`
    for anything else wrong.
    """
    if len(raw) < SEGMENT_HEADER_SIZE:
        raise LogCorrupt(f"{len(raw)} bytes, too short for a segment header ({SEGMENT_HEADER_SIZE} bytes)")
    raw = raw[:SEGMENT_HEADER_SIZE]
    if raw == _FREE_HEADER:
        return None
    magic, version, header_size, flags, seq, epoch, segment_bytes, prev_gid, first_gid = _SEGMENT_HEAD.unpack_from(raw)
    if magic != SEGMENT_MAGIC:
        raise LogCorrupt(f"not a writeset log segment header (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise LogVersionError(f"segment format version {version}; this Chorus reads version {FORMAT_VERSION} only "
                              "(written by a newer Chorus?)")
    (crc,) = _U32.unpack_from(raw, _SEGMENT_HEAD.size)
    if crc != _crc32c.crc32c(raw[:_SEGMENT_HEAD.size]):
        raise LogCorrupt("segment header checksum mismatch")
    if header_size != SEGMENT_HEADER_SIZE or flags != 0 or seq == 0:
        raise LogCorrupt(f"segment header has header size {header_size}, flags {flags:#x}, seq {seq}: not valid in version 1")
    return SegmentHeader(seq, epoch, segment_bytes, prev_gid, first_gid)


def encode_record_header(gid: int, origin: bytes, payload: Buffer, flags: int, seq: int) -> bytes:
    """The header of a record; the origin and the payload follow it."""
    rest = _RECORD_REST.pack(RECORD_MAGIC, flags, len(origin), len(payload), gid, seq)
    crc = _crc32c.crc32c(payload, _crc32c.crc32c(origin, _crc32c.crc32c(rest)))
    return _U32.pack(crc) + rest


class _BadRecord(Exception):
    """What ends the records of a segment when it is not a clean end."""

    def __init__(self, kind: str, message: str, gid: Optional[int] = None, flags: Optional[int] = None,
                 origin: Optional[str] = None, size: Optional[int] = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.gid, self.flags, self.origin, self.size = gid, flags, origin, size


def _origin(buf: Union[memoryview, mmap.mmap], start: int, length: int) -> str:
    return bytes(buf[start:start + length]).decode("utf-8")


def _parse_record(mv: memoryview, off: int, limit: int, seq: int, after_gid: int) -> Optional[tuple[int, int, int, int]]:
    """Check the record at ``off``; return (gid, flags, origin length, size), or None at the end.

    ``limit`` is the end of the segment, ``seq`` its sequence number, ``after_gid`` the GID the
    record must follow. Raises :class:`_BadRecord` for anything but a valid record or the end.
    """
    room = limit - off
    if room <= 0:
        return None
    if room < RECORD_HEADER_SIZE:
        if mv[off:limit] == bytes(room):
            return None
        raise _BadRecord("torn", f"{room} bytes at the end of the segment are neither zero nor a record")
    if mv[off:off + 8] == _END:
        return None
    crc, magic, flags, origin_len, payload_len, gid, rec_seq = _RECORD.unpack_from(mv, off)
    if magic != RECORD_MAGIC:
        raise _BadRecord("garbage", "no record here (bad record magic)")
    size = RECORD_HEADER_SIZE + origin_len + payload_len
    if size > room:
        raise _BadRecord("torn", f"a record of {size} bytes runs past the end of the segment", gid, flags, None, size)
    if rec_seq != seq:
        raise _BadRecord("stale", f"the record carries segment seq {rec_seq}, not {seq} "
                         "(left over from an earlier use of the file)", gid, flags, None, size)
    if _crc32c.crc32c(mv[off + 4:off + size]) != crc:
        raise _BadRecord("checksum", "CRC32C mismatch", gid, flags, None, size)
    try:
        origin = _origin(mv, off + RECORD_HEADER_SIZE, origin_len)
    except UnicodeDecodeError:
        raise _BadRecord("origin", "the origin is not utf-8", gid, flags, None, size) from None
    if flags & ~KNOWN_FLAGS:
        raise _BadRecord("flags", f"unknown record flags {flags:#x}", gid, flags, origin, size)
    if gid <= after_gid:
        raise _BadRecord("order", f"GID {gid} does not follow GID {after_gid}", gid, flags, origin, size)
    return gid, flags, origin_len, size


class _SparseIndex:
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
class _Scan:
    """The records of one segment, checked."""

    end: int  # where the valid records end
    records: int = 0
    first_gid: int = 0
    last_gid: int = 0
    index: _SparseIndex = field(default_factory=_SparseIndex)
    problem: Optional[_BadRecord] = None  # what ended the records, when not a clean end
    listing: Optional[list[dict[str, Any]]] = None


def _scan_records(mm: mmap.mmap, header: SegmentHeader, listing: bool = False) -> _Scan:
    limit = min(len(mm), header.segment_bytes)
    scan = _Scan(end=DATA_START, listing=[] if listing else None)
    off, last = DATA_START, header.prev_gid
    with memoryview(mm) as mv:
        while True:
            try:
                rec = _parse_record(mv, off, limit, header.seq, last)
                if rec is not None and scan.records == 0 and header.first_gid and rec[0] != header.first_gid:
                    raise _BadRecord("first gid", f"the first record has GID {rec[0]}, the header says {header.first_gid}",
                                     rec[0], rec[1], None, rec[3])
            except _BadRecord as bad:
                scan.problem = bad
                if scan.listing is not None and bad.size is not None:
                    scan.listing.append({"gid": bad.gid, "origin": bad.origin, "flags": bad.flags, "size": bad.size,
                                         "offset": off, "crc_ok": False})
                break
            if rec is None:
                break
            gid, flags, origin_len, size = rec
            if scan.listing is not None:
                scan.listing.append({"gid": gid, "origin": _origin(mv, off + RECORD_HEADER_SIZE, origin_len),
                                     "flags": flags, "size": size, "offset": off, "crc_ok": True})
            if not scan.records:
                scan.first_gid = gid
            scan.index.note(gid, off)
            scan.records += 1
            scan.last_gid = last = gid
            off += size
    scan.end = off
    return scan


# ---------------------------------------------------------------------------------------------
# Reading a directory: shared by open(), verify_directory() and inspect_segment().


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
class _Found:
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
    scan: Optional[_Scan] = None

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

    def hand_over(self) -> _File:
        """The descriptor and map as a writer's file; this object no longer owns them."""
        if self.mm is None:
            self.mm = mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ)
        file = _File(self.path, self.fd, self.mm)
        self.fd, self.mm = -1, None
        return file


def _open_found(path: str, writable: bool) -> Optional[_Found]:
    try:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    except FileNotFoundError:
        return None  # a writer renamed it meanwhile
    size = os.fstat(fd).st_size
    raw = os.pread(fd, SEGMENT_HEADER_SIZE, 0)
    f = _Found(path, fd, size, raw, None)
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


def _segment_paths(directory: str) -> list[str]:
    try:
        names = [n for n in os.listdir(directory) if n.endswith(SEGMENT_SUFFIX)]
    except NotADirectoryError as e:
        raise LogCorrupt(f"{directory} is not a directory") from e
    except FileNotFoundError as e:
        raise LogCorrupt(f"{directory} does not exist") from e
    return [os.path.join(directory, n) for n in sorted(names)]


@dataclass
class _Analysis:
    """Which segment files form the log, and what is wrong with the others."""

    found: list[_Found]  # the live segments in seq order first, then the rest
    live: list[_Found]
    problems: list[Problem]
    cut: Optional[tuple[_Found, int]] = None  # the live segment whose records end early, and where
    end_reason: Optional[str] = None  # why the log ends early (a bad record, a missing segment)
    dropped: list[_Found] = field(default_factory=list)  # segments of the log's epoch after the end


def _analyze(found: list[_Found]) -> _Analysis:
    """Decide the log from the files' headers and records (reads the maps, writes nothing)."""
    an = _Analysis([], [], [])
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
        f.scan = scan = _scan_records(f.mm, f.header)
        if scan.problem is not None:
            an.problems.append(Problem(f.name, scan.end, scan.problem.kind, _describe(scan.problem)))
        if an.end_reason is not None:
            f.state = "cut"
            an.dropped.append(f)
            continue
        if an.live and f.header.prev_gid > _tip(an.live[-1]):
            before = an.live[-1]  # a writer may have appended to it since it was read, then moved on
            assert before.mm is not None and before.header is not None
            before.scan = _scan_records(before.mm, before.header)
        if an.live and f.header.prev_gid != _tip(an.live[-1]):
            before = an.live[-1]
            an.problems.append(Problem(f.name, 0, "chain", f"the segment follows GID {f.header.prev_gid} but "
                                       f"{before.name} ends at GID {_tip(before)}: a segment is missing or damaged"))
            an.end_reason = f"{f.name} does not follow {before.name}"
            f.state = "cut"
            an.dropped.append(f)
            continue
        f.state = "live"
        an.live.append(f)
        if scan.problem is not None:
            an.cut = (f, scan.end)
            an.end_reason = f"{f.name} offset {scan.end}: {scan.problem.kind}: {_describe(scan.problem)}"
    an.found = an.live + [f for f in found if f.state != "live"]
    return an


def _tip(f: _Found) -> int:
    """The last GID of a scanned segment, or the GID it follows when it has no record."""
    assert f.header is not None and f.scan is not None
    return f.scan.last_gid if f.scan.records else f.header.prev_gid


def _describe(bad: _BadRecord) -> str:
    return bad.message if bad.gid is None or bad.kind == "order" else f"{bad.message} (record GID {bad.gid})"


def _dirty_extent(mm: mmap.mmap, start: int, end: int) -> int:
    """The offset just past the last non-zero byte in [start, end), or ``start``."""
    pos = end
    while pos > start:
        lo = max(start, pos - (1 << 20))
        chunk = mm[lo:pos].rstrip(b"\0")
        if chunk:
            return lo + len(chunk)
        pos = lo
    return start


# ---------------------------------------------------------------------------------------------
# The writer.


class _File:
    """A segment file, open for the life of the log: its descriptor and a read-only map."""

    __slots__ = ("path", "fd", "mm", "dirty")

    def __init__(self, path: str, fd: int, mm: mmap.mmap) -> None:
        self.path, self.fd, self.mm, self.dirty = path, fd, mm, False

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class _Segment:
    """One use of a segment file; ``valid`` ends when the file is reused, reset() or the log closes."""

    __slots__ = ("file", "seq", "prev_gid", "first_gid", "last_gid", "records", "end", "index", "valid",
                 "sealed", "next")

    def __init__(self, file: _File, seq: int, prev_gid: int, first_gid: int) -> None:
        self.file = file
        self.seq = seq
        self.prev_gid = prev_gid
        self.first_gid = first_gid
        self.last_gid = 0
        self.records = 0
        self.end = DATA_START
        self.index = _SparseIndex()
        self.valid = True
        self.sealed = False  # the writer has moved on to the next segment
        self.next: Optional[_Segment] = None

    @property
    def tip_gid(self) -> int:
        return self.last_gid if self.records else self.prev_gid


def _pwrite_all(fd: int, bufs: list[Buffer], off: int) -> None:
    total = sum(len(b) for b in bufs)
    done = os.pwritev(fd, bufs, off)
    if done != total:  # short write: write the rest plainly
        rest = b"".join(bytes(b) for b in bufs)[done:]
        while rest:
            n = os.pwrite(fd, rest, off + done)
            done += n
            rest = rest[n:]


def _write_zeros(fd: int, start: int, end: int) -> None:
    chunk = bytes(min(end - start, 1 << 20))
    while start < end:
        n = min(len(chunk), end - start)
        _pwrite_all(fd, [chunk[:n]], start)
        start += n


class WritesetLog:
    """The writeset log of one node: one writer (this object), any number of readers."""

    def __init__(self, directory: str, segment_bytes: int = 64 << 20, total_bytes: int = 4 << 30) -> None:
        if segment_bytes < MIN_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be at least {MIN_SEGMENT_BYTES}")
        self.directory = directory
        self._segment_bytes = segment_bytes
        self._capacity = max(2, total_bytes // segment_bytes)
        self._dir_fd: Optional[int] = None
        self._live: list[_Segment] = []  # oldest first; the last one takes the appends
        self._free: list[_File] = []
        self._epoch = 0
        self._next_seq = 1

    # -- properties ---------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._dir_fd is not None

    @property
    def low_gid(self) -> int:
        """The first GID held (0 if empty)."""
        for s in self._live:
            if s.records:
                return s.first_gid
        return 0

    @property
    def high_gid(self) -> int:
        """The last GID held (0 if empty)."""
        for s in reversed(self._live):
            if s.records:
                return s.last_gid
        return 0

    @property
    def base_gid(self) -> int:
        """The log holds every certified GID after this one (up to ``end_gid``)."""
        return self._live[0].prev_gid if self._live else 0

    @property
    def end_gid(self) -> int:
        """The last GID appended, or the reset() point if none since; appends must exceed it."""
        return self._live[-1].tip_gid if self._live else 0

    # -- open, close ----------------------------------------------------------------------------

    def open(self) -> None:
        """Create the directory if missing, take the writer's lock, check the segments, cut a bad tail."""
        if self.is_open:
            raise LogError(f"writeset log {self.directory} is already open")
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except (FileExistsError, NotADirectoryError) as e:
            raise LogCorrupt(f"writeset log {self.directory} is not a directory") from e
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(dir_fd)
            raise LogError(f"writeset log {self.directory} is in use by another process") from None
        self._dir_fd = dir_fd
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> None:
        for name in os.listdir(self.directory):
            if name.endswith(SEGMENT_SUFFIX + ".tmp"):
                os.unlink(os.path.join(self.directory, name))  # a creation a crash interrupted
        found: list[_Found] = []
        try:
            for path in _segment_paths(self.directory):
                f = _open_found(path, writable=True)
                if f is not None:
                    found.append(f)
            for f in found:
                if f.version_problem:
                    raise LogVersionError(f"{f.path}: {f.header_problem}")
            an = _analyze(found)
            for f in an.live:
                assert f.header is not None
                if f.header.segment_bytes != self._segment_bytes:
                    raise LogError(f"writeset log {self.directory} has segments of {f.header.segment_bytes} bytes, "
                                   f"not the configured {self._segment_bytes}: configure that size, or remove the "
                                   "segment files (the log then starts empty)")
            seqs = [f.header.seq for f in found if f.header] + [_name_seq(f.path) for f in found]
            self._next_seq = max(seqs, default=0) + 1
            self._epoch = max((f.header.epoch for f in found if f.header), default=0)
            self._cut(an)
            self._adopt(an)
        finally:
            for f in found:
                f.close()  # those not adopted
        if not self._live:
            if found:
                log.warning("writeset log %s: no valid segment; starting empty", self.directory)
            self._epoch += 1
            self._start_segment(prev_gid=0, first_gid=0)
        os.fsync(self._require_open())

    def _cut(self, an: _Analysis) -> None:
        """Make the disk match the analysis: zero the bad tail, free the segments after it."""
        if an.end_reason is not None:
            lost = [d.scan for d in an.dropped if d.scan is not None]
            torn = 0
            if an.cut is not None:
                f, off = an.cut
                assert f.mm is not None and f.header is not None
                torn = _dirty_extent(f.mm, off, f.size) - off
                _write_zeros(f.fd, off, off + torn)
                if off == DATA_START and f.header.first_gid:
                    f.header = SegmentHeader(f.header.seq, f.header.epoch, f.header.segment_bytes, f.header.prev_gid, 0)
                    _pwrite_all(f.fd, [f.header.encode()], 0)
                os.fdatasync(f.fd)
            log.warning("writeset log %s: the log ends early (%s): dropped %d bytes after the last good record and "
                        "%d later segments holding %d records (%d bytes); it now ends at GID %d",
                        self.directory, an.end_reason, torn, len(an.dropped), sum(s.records for s in lost),
                        sum(s.end - DATA_START for s in lost), _tip(an.live[-1]))
        for f in an.found:
            if f.state == "bad header":
                log.warning("writeset log %s: %s has a damaged header (%s); its contents are dropped",
                            self.directory, f.name, f.header_problem)
            elif f.state == "old epoch":
                log.info("writeset log %s: %s is from before a reset; freed", self.directory, f.name)
            if f.state != "live" and f.raw_header != _FREE_HEADER and f.size >= SEGMENT_HEADER_SIZE:
                _pwrite_all(f.fd, [_FREE_HEADER], 0)
                os.fdatasync(f.fd)

    def _adopt(self, an: _Analysis) -> None:
        """Take over the files: the live ones as segments, the others as free files (or delete them)."""
        for f in an.found:
            if f.state != "live":
                if f.size != self._segment_bytes or len(self._free) + len(an.live) >= self._capacity:
                    f.close()
                    os.unlink(f.path)
                    continue
                self._free.append(f.hand_over())
                continue
            assert f.header is not None and f.scan is not None and f.mm is not None
            want = os.path.join(self.directory, segment_name(f.header.seq))
            if f.path != want and not os.path.exists(want):
                os.rename(f.path, want)
                f.path = want
            seg = _Segment(f.hand_over(), f.header.seq, f.header.prev_gid, f.header.first_gid)
            seg.first_gid = f.scan.first_gid if f.scan.records else f.header.first_gid
            seg.last_gid, seg.records, seg.end, seg.index = f.scan.last_gid, f.scan.records, f.scan.end, f.scan.index
            if self._live:
                self._live[-1].sealed = True
                self._live[-1].next = seg
            self._live.append(seg)

    def close(self) -> None:
        """Close the files (without flushing them: call sync() first on a clean shutdown)."""
        for s in self._live:
            s.valid = False
        files = [s.file for s in self._live] + self._free
        self._live, self._free = [], []
        for f in files:
            f.close()
        if self._dir_fd is not None:
            os.close(self._dir_fd)  # releases the lock
            self._dir_fd = None

    def sync(self) -> None:
        """Flush every write so far to disk."""
        dir_fd = self._require_open()
        for s in self._live:
            if s.file.dirty:
                os.fdatasync(s.file.fd)
                s.file.dirty = False
        os.fsync(dir_fd)

    def _require_open(self) -> int:
        if self._dir_fd is None:
            raise LogError(f"writeset log {self.directory} is not open")
        return self._dir_fd

    # -- writing ------------------------------------------------------------------------------

    def max_payload(self, origin: str) -> int:
        """The largest writeset one record of ``origin`` can hold (a record never spans segments)."""
        return min(self._segment_bytes - DATA_START - RECORD_HEADER_SIZE - len(origin.encode("utf-8")),
                   MAX_PAYLOAD_BYTES)

    def append(self, gid: int, origin: str, payload: Buffer, flags: int = 0) -> None:
        """Append one certified writeset; ``gid`` must exceed ``end_gid``."""
        self.append_many([(gid, origin, payload, flags)])

    def append_many(self, records: list[tuple[int, str, Buffer, int]]) -> None:
        """Append certified writesets ``(gid, origin, payload, flags)`` in GID order, each GID
        above the one before; the records that land in one segment are written with one system
        call. A record that cannot be logged raises ValueError; the ones before it are logged."""
        self._require_open()
        out: list[Buffer] = []  # records not yet written, all in segment `seg` from offset `start`
        seg = self._live[-1]
        start = seg.end
        for gid, origin, payload, flags in records:
            if gid <= self.end_gid:
                self._write_records(seg, start, out)
                raise ValueError(f"GID {gid} does not follow GID {self.end_gid}, the last one in the writeset log")
            if not 0 <= flags <= 0xFF or flags & ~KNOWN_FLAGS:
                self._write_records(seg, start, out)
                raise ValueError(f"unknown writeset log record flags {flags:#x}")
            origin_b = origin.encode("utf-8")
            size = RECORD_HEADER_SIZE + len(origin_b) + len(payload)
            usable = self._segment_bytes - DATA_START
            if len(origin_b) > MAX_ORIGIN_BYTES or size > usable or len(payload) > MAX_PAYLOAD_BYTES:
                self._write_records(seg, start, out)
                if len(origin_b) > MAX_ORIGIN_BYTES:
                    raise ValueError(f"origin {origin!r} is longer than {MAX_ORIGIN_BYTES} bytes")
                raise ValueError(f"a writeset log record of {size} bytes (GID {gid}) does not fit in a segment "
                                 f"({usable} usable bytes): raise the segment size")
            if seg.end + size > self._segment_bytes or len(out) > _MAX_IOV:
                self._write_records(seg, start, out)
                out = []
                if seg.end + size > self._segment_bytes:
                    seg = self._start_segment(prev_gid=seg.tip_gid, first_gid=gid)
                start = seg.end
            if not seg.records and seg.first_gid != gid:
                seg.first_gid = gid
                self._write_header(seg)
            off = seg.end
            out += [encode_record_header(gid, origin_b, payload, flags, seg.seq), origin_b, payload]
            if not seg.records:
                seg.first_gid = gid
            seg.index.note(gid, off)
            seg.records += 1
            seg.last_gid = gid
            seg.end = off + size
        self._write_records(seg, start, out)

    def _write_records(self, seg: _Segment, start: int, bufs: list[Buffer]) -> None:
        """Write encoded records at ``start`` of ``seg`` and the end marker after them."""
        if not bufs:
            return
        room_after = self._segment_bytes - seg.end
        if room_after > 0:
            bufs.append(_END[:room_after])
        _pwrite_all(seg.file.fd, bufs, start)
        seg.file.dirty = True

    def reset(self, after_gid: int) -> None:
        """Forget every record: the log holds nothing, and the next append must exceed ``after_gid``.

        For when the log no longer matches the database (it lost its unsynced tail in a host crash,
        or it is behind the committed GID). Every reader fails from now on. Flushed before it
        returns: the new epoch's header is the commit point.
        """
        self._require_open()
        if after_gid < 0:
            raise ValueError(f"reset point {after_gid} is negative")
        for s in self._live:
            s.valid = False
        self._free.extend(s.file for s in self._live)
        self._live = []
        self._epoch += 1
        self._start_segment(prev_gid=after_gid, first_gid=0)
        for f in self._free:  # for out-of-process readers; the epoch already excludes them
            _pwrite_all(f.fd, [_FREE_HEADER], 0)

    def _start_segment(self, prev_gid: int, first_gid: int) -> _Segment:
        seq = self._next_seq
        self._next_seq += 1
        f = self._take_file(seq)
        seg = _Segment(f, seq, prev_gid, first_gid)
        self._write_header(seg, extra=[_END])  # and end the records of the file's previous use
        os.fdatasync(f.fd)  # the new seq is on disk before any record under it
        want = os.path.join(self.directory, segment_name(seq))
        os.rename(f.path, want)
        f.path = want
        if self._live:
            self._live[-1].sealed = True
            self._live[-1].next = seg
        self._live.append(seg)
        return seg

    def _take_file(self, seq: int) -> _File:
        if self._free:
            return self._free.pop()
        if len(self._live) < self._capacity:
            return self._create_file(os.path.join(self.directory, segment_name(seq) + ".tmp"))
        while True:  # the ring is full: reuse the oldest segment
            oldest = self._live.pop(0)
            oldest.valid = False
            if len(self._live) < self._capacity:
                return oldest.file
            oldest.file.close()  # the ring was made smaller
            os.unlink(oldest.file.path)

    def _create_file(self, path: str) -> _File:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, self._segment_bytes)
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(fd, self._segment_bytes)
            mm = mmap.mmap(fd, self._segment_bytes, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        return _File(path, fd, mm)

    def _write_header(self, seg: _Segment, extra: Optional[list[Buffer]] = None) -> None:
        header = SegmentHeader(seg.seq, self._epoch, self._segment_bytes, seg.prev_gid, seg.first_gid)
        _pwrite_all(seg.file.fd, [header.encode()] + (extra or []), 0)
        seg.file.dirty = True

    # -- reading ------------------------------------------------------------------------------

    def reader(self, after_gid: int) -> "LogReader":
        """A reader of the records after ``after_gid``, in order.

        Raises :class:`LogRangeUnavailable` unless ``base_gid <= after_gid``, i.e. unless the log
        holds every certified GID after ``after_gid`` (see the module docstring).
        """
        self._require_open()
        if after_gid < self.base_gid:
            raise LogRangeUnavailable(
                f"the writeset log holds the writesets after GID {self.base_gid} (up to GID {self.end_gid}), "
                f"not all of those after GID {after_gid}")
        i = bisect.bisect_right(self._live, after_gid, key=lambda s: s.prev_gid) - 1
        seg = self._live[i]
        off = seg.end if after_gid >= seg.tip_gid else seg.index.start(after_gid)
        return LogReader(self, seg, off, after_gid)

    def stats(self) -> dict[str, Any]:
        self._require_open()
        return {
            "directory": self.directory,
            "segment_bytes": self._segment_bytes,
            "capacity_segments": self._capacity,
            "segments": len(self._live),
            "free_segments": len(self._free),
            "records": sum(s.records for s in self._live),
            "bytes_used": sum(s.end - DATA_START for s in self._live),
            "low_gid": self.low_gid,
            "high_gid": self.high_gid,
            "base_gid": self.base_gid,
            "end_gid": self.end_gid,
            "epoch": self._epoch,
            "oldest_seq": self._live[0].seq,
            "newest_seq": self._live[-1].seq,
        }


def _name_seq(path: str) -> int:
    stem = os.path.basename(path)[:-len(SEGMENT_SUFFIX)]
    return int(stem) if stem.isdigit() else 0


class LogReader:
    """Reads the records after a GID, continuing where it left off (also across later appends)."""

    def __init__(self, wslog: WritesetLog, seg: _Segment, off: int, after_gid: int) -> None:
        self._log = wslog
        self._seg: Optional[_Segment] = seg
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
        self._log._require_open()
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
            crc, magic, flags, origin_len, payload_len, gid, rec_seq = _RECORD.unpack_from(mm, off)
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
            out.append(LogRecord(gid, _origin(mm, start, origin_len), flags, mm[start + origin_len:off + size]))
            used += size
            pos = gid
            off += size
            if used >= max_bytes:
                break
        if not seg.valid:  # cannot happen in one thread, but never hand out bytes of a reused file
            raise LogRangeUnavailable(f"the writeset log segment {seg.seq} was reused while being read")
        self._seg, self._off, self._pos = seg, off, pos
        return out


# ---------------------------------------------------------------------------------------------
# Out-of-process inspection: read-only, tolerant of a writer appending or reusing meanwhile.


def inspect_segment(path: str) -> dict[str, Any]:
    """Everything about one segment file: header fields, records, where the valid data ends.

    Keys: ``file``, ``file_bytes``, ``header`` (the raw fields, or None for a free or short file),
    ``state`` (``segment``, ``free`` or ``bad header``), ``header_problem``, ``records`` (gid,
    origin, flags, size, offset, crc_ok; a record that fails its check is listed last with
    ``crc_ok`` false when its length could be read), ``record_count``, ``first_gid``,
    ``last_gid``, ``valid_end``, ``first_bad_offset`` and ``problem`` (None when clean), and
    ``unsettled`` (a writer kept changing the file while it was read).
    """
    result: dict[str, Any] = {}
    for attempt in range(_READ_ATTEMPTS):
        if attempt:
            time.sleep(_READ_PAUSE)
        previous, result = result, _inspect_once(path)
        if result["problem"] is None and not result["unsettled"]:
            break
        if previous and previous["problem"] == result["problem"] and not result["unsettled"]:
            break
    return result


def _inspect_once(path: str) -> dict[str, Any]:
    f = _open_found(path, writable=False)
    if f is None:
        raise LogCorrupt(f"{path} does not exist")
    try:
        result: dict[str, Any] = {
            "file": path, "file_bytes": f.size, "header": _raw_header_fields(f.raw_header),
            "state": "free" if f.raw_header == _FREE_HEADER else "bad header" if f.header is None else "segment",
            "header_problem": f.header_problem, "records": [], "record_count": 0, "first_gid": 0, "last_gid": 0,
            "valid_end": None, "first_bad_offset": None, "problem": None, "unsettled": False,
        }
        if f.header_problem is not None:
            result["first_bad_offset"] = 0
            result["problem"] = {"offset": 0, "kind": "header", "message": f.header_problem}
        if f.header is not None and f.mm is not None:
            scan = _scan_records(f.mm, f.header, listing=True)
            result.update(records=scan.listing, record_count=scan.records, first_gid=scan.first_gid,
                          last_gid=scan.last_gid, valid_end=scan.end)
            if scan.problem is not None:
                result["first_bad_offset"] = scan.end
                result["problem"] = {"offset": scan.end, "kind": scan.problem.kind, "message": _describe(scan.problem)}
        result["unsettled"] = os.pread(f.fd, SEGMENT_HEADER_SIZE, 0) != f.raw_header
        return result
    finally:
        f.close()


def _raw_header_fields(raw: bytes) -> Optional[dict[str, Any]]:
    if len(raw) < SEGMENT_HEADER_SIZE or raw == _FREE_HEADER:
        return None
    magic, version, header_size, flags, seq, epoch, segment_bytes, prev_gid, first_gid = _SEGMENT_HEAD.unpack_from(raw)
    (crc,) = _U32.unpack_from(raw, _SEGMENT_HEAD.size)
    return {"magic_ok": magic == SEGMENT_MAGIC, "version": version, "header_size": header_size, "flags": flags,
            "seq": seq, "epoch": epoch, "segment_bytes": segment_bytes, "prev_gid": prev_gid, "first_gid": first_gid,
            "crc_ok": crc == _crc32c.crc32c(raw[:_SEGMENT_HEAD.size])}


def verify_directory(directory: str) -> dict[str, Any]:
    """Check every segment of a log directory without the writer.

    Keys: ``directory``, ``ok`` (no problem found), ``segments`` (one dict per file: the live ones
    in log order, then the others), ``problems`` (file, offset, kind, message), the totals
    ``segment_count``, ``live_segments``, ``records``, ``bytes``, ``low_gid``, ``high_gid``,
    ``base_gid``, and ``unsettled`` (a writer kept changing the files while they were read).
    Raises :class:`LogCorrupt` when ``directory`` is not a directory.
    """
    if not os.path.isdir(directory):
        raise LogCorrupt(f"{directory} is not a directory")
    result: dict[str, Any] = {}
    for attempt in range(_READ_ATTEMPTS):
        if attempt:
            time.sleep(_READ_PAUSE)
        previous, result = result, _verify_once(directory)
        if not result["problems"] and not result["unsettled"]:
            break
        if previous and previous["problems"] == result["problems"] and not result["unsettled"]:
            break
    return result


def _verify_once(directory: str) -> dict[str, Any]:
    found = [f for f in (_open_found(p, writable=False) for p in _segment_paths(directory)) if f is not None]
    changed: list[_Found] = []
    try:
        for _ in range(3):
            for f in found:
                f.state, f.scan = "free", None
            an = _analyze([f for f in found if f not in changed])
            # A file whose header changed while it was read was reused (or reset) by the writer:
            # what was read of it is no finding. Decide again without it.
            now = [f for f in found if f not in changed and os.pread(f.fd, SEGMENT_HEADER_SIZE, 0) != f.raw_header]
            if not now:
                break
            changed.extend(now)
    finally:
        for f in found:
            f.close()
    unsettled = bool(changed)
    segments = []
    for f in an.found:
        h, s = f.header, f.scan
        segments.append({
            "file": f.name, "state": f.state, "seq": h.seq if h else None, "epoch": h.epoch if h else None,
            "prev_gid": h.prev_gid if h else None, "first_gid": s.first_gid if s else 0,
            "last_gid": s.last_gid if s else 0, "records": s.records if s else 0,
            "bytes": s.end - DATA_START if s else 0, "valid_end": s.end if s else None,
        })
    segments.extend({"file": f.name, "state": "changed while read", "seq": None, "epoch": None, "prev_gid": None,
                     "first_gid": 0, "last_gid": 0, "records": 0, "bytes": 0, "valid_end": None} for f in changed)
    live = [f for f in an.live if f.scan is not None]
    with_records = [f for f in live if f.scan and f.scan.records]
    return {
        "directory": directory,
        "ok": not an.problems,
        "segments": segments,
        "problems": [p.as_dict() for p in an.problems],
        "segment_count": len(found),
        "live_segments": len(live),
        "records": sum(f.scan.records for f in live if f.scan),
        "bytes": sum(f.scan.end - DATA_START for f in live if f.scan),
        "low_gid": with_records[0].scan.first_gid if with_records and with_records[0].scan else 0,
        "high_gid": with_records[-1].scan.last_gid if with_records and with_records[-1].scan else 0,
        "base_gid": live[0].header.prev_gid if live and live[0].header else 0,
        "unsettled": unsettled,
    }
