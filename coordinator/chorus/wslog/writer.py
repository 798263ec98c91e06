"""The writer of a node's writeset log, and the feeder that gives it every certified writeset
in GID order (docs/WSLOG.md: format, durability, reuse)."""

from __future__ import annotations

import bisect
import errno
import fcntl
import json
import logging
import mmap
import os
from collections import deque
from typing import Any, Optional, Sequence, Union

from chorus.wslog.format import (DATA_START, END_MARK, FLAG_DDL_SKIPPED, TIME, TIMED_VERSION, origin_field, FREE_HEADER, KNOWN_FLAGS, MAX_ORIGIN_BYTES,
                                 MAX_PAYLOAD_BYTES, MAX_RECORD_BYTES, MIN_SEGMENT_BYTES, PIECE, RECORD_HEADER_SIZE,
                                 SEGMENT_HEADER_SIZE, SEGMENT_SUFFIX, Buffer, LogCorrupt, LogError, LogRangeUnavailable,
                                 LogVersionError, SegmentHeader, encode_piece_header, encode_record_header,
                                 segment_name)
from chorus.wslog.reader import LogReader, Segment, SegmentFile
from chorus.wslog.scan import Analysis, FoundSegment, analyze, dirty_extent, open_found, segment_paths, tip_gid_of

log = logging.getLogger("chorus.wslog")

_MAX_IOV = 900  # buffers in one pwritev (the system allows 1024)
PINS_FILE = "pins.json"  # the pins (WritesetLog.pin), beside the segments

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
        self._live: list[Segment] = []  # oldest first; the last one takes the appends
        self._free: list[SegmentFile] = []
        self._epoch = 0
        self._next_seq = 1
        # pins (docs/WSLOG.md "Pins"): name -> (the GID after which it needs every record, the
        # most bytes of log it may hold); a pin that needed more is broken: name -> (first, last
        # GID lost). Both kept in PINS_FILE, so a restart keeps them.
        self._pins: dict[str, tuple[int, int]] = {}
        self._broken: dict[str, tuple[int, int]] = {}

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

    def open(self, upto: Optional[int] = None) -> None:
        """Create the directory if missing, take the writer's lock, check the segments, cut a bad tail.
        With ``upto``, the records after GID ``upto`` are cut too."""
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
            self._load(upto)
        except BaseException:
            self.close()
            raise

    def _load(self, upto: Optional[int]) -> None:
        for name in os.listdir(self.directory):
            if name.endswith(SEGMENT_SUFFIX + ".tmp"):
                os.unlink(os.path.join(self.directory, name))  # a creation a crash interrupted
        self._load_pins()
        found: list[FoundSegment] = []
        try:
            for path in segment_paths(self.directory):
                f = open_found(path, writable=True)
                if f is not None:
                    found.append(f)
            for f in found:
                if f.version_problem:
                    raise LogVersionError(f"{f.path}: {f.header_problem}")
            an = analyze(found, upto)
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

    def _cut(self, an: Analysis) -> None:
        """Make the disk match the analysis: zero the bad tail, free the segments after it."""
        if an.end_reason is not None:
            lost = [d.scan for d in an.dropped if d.scan is not None]
            torn = 0
            if an.cut is not None:
                f, off = an.cut
                assert f.mm is not None and f.header is not None
                torn = dirty_extent(f.mm, off, f.size) - off
                _write_zeros(f.fd, off, off + torn)
                if off == DATA_START and f.header.first_gid:
                    f.header = SegmentHeader(f.header.seq, f.header.epoch, f.header.segment_bytes, f.header.prev_gid, 0)
                    _pwrite_all(f.fd, [f.header.encode()], 0)
                os.fdatasync(f.fd)
            log.warning("writeset log %s: the log ends early (%s): dropped %d bytes after the last good record and "
                        "%d later segments holding %d records (%d bytes); it now ends at GID %d",
                        self.directory, an.end_reason, torn, len(an.dropped), sum(s.records for s in lost),
                        sum(s.end - DATA_START for s in lost), tip_gid_of(an.live[-1]))
        for f in an.found:
            if f.state == "bad header":
                log.warning("writeset log %s: %s has a damaged header (%s); its contents are dropped",
                            self.directory, f.name, f.header_problem)
            elif f.state == "old epoch":
                log.info("writeset log %s: %s is from before a reset; freed", self.directory, f.name)
            if f.state != "live" and f.raw_header != FREE_HEADER and f.size >= SEGMENT_HEADER_SIZE:
                _pwrite_all(f.fd, [FREE_HEADER], 0)
                os.fdatasync(f.fd)

    def _adopt(self, an: Analysis) -> None:
        """Take over the files: the live ones as segments, the others as free files (or delete them)."""
        for f in an.found:
            if f.state != "live":
                if f.size != self._segment_bytes or len(self._free) + len(an.live) >= self._capacity:
                    f.close()
                    os.unlink(f.path)
                    continue
                self._free.append(SegmentFile(f.path, *f.release()))
                continue
            assert f.header is not None and f.scan is not None and f.mm is not None
            want = os.path.join(self.directory, segment_name(f.header.seq))
            if f.path != want and not os.path.exists(want):
                os.rename(f.path, want)
                f.path = want
            seg = Segment(SegmentFile(f.path, *f.release()), f.header.seq, f.header.prev_gid, f.header.first_gid)
            seg.first_gid = f.scan.first_gid if f.scan.records else f.header.first_gid
            seg.last_gid, seg.records, seg.end, seg.index = f.scan.last_gid, f.scan.records, f.scan.end, f.scan.index
            seg.version = f.header.version
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
        """The largest writeset one record of ``origin`` can hold: a record may span segments, but
        never more than the ring holds besides the segment it starts in (so that writing it never
        reuses the segment holding its start)."""
        per_segment = self._piece_room(len(origin.encode("utf-8")) + TIME.size)  # (with a commit time)
        return min((self._capacity - 1) * per_segment, MAX_RECORD_BYTES)

    def _piece_room(self, origin_len: int) -> int:
        """The payload bytes one piece fills a fresh segment with."""
        return min(self._segment_bytes - DATA_START - RECORD_HEADER_SIZE - origin_len - PIECE.size, MAX_PAYLOAD_BYTES)

    def append(self, gid: int, origin: str, payload: Buffer, flags: int = 0, commit_time: int = 0) -> None:
        """Append one certified writeset; ``gid`` must exceed ``end_gid``."""
        self.append_many([(gid, origin, payload, flags, commit_time)])

    def append_many(self, records: Sequence[Union[tuple[int, str, Buffer, int], tuple[int, str, Buffer, int, int]]]) -> None:
        """Append certified writesets ``(gid, origin, payload, flags[, commit time])`` in GID
        order, each GID above the one before; the records that land in one segment are written
        with one system call, and a record larger than a segment in pieces, one per segment. A
        record that cannot be logged raises ValueError; the ones before it are logged. A commit
        time goes only into a segment of version 3: a record that has one starts a new segment
        when the current one is older (a log written by a release before)."""
        self._require_open()
        out: list[Buffer] = []  # records not yet written, all in segment `seg` from offset `start`
        seg = self._live[-1]
        start = seg.end
        for record in records:
            gid, origin, payload, flags = record[:4]
            commit_time = record[4] if len(record) > 4 else 0
            problem = self._refusal(gid, origin.encode("utf-8"), payload, flags)
            if problem is None and not 0 <= commit_time < 1 << 64:
                problem = f"commit time {commit_time} of GID {gid} is not a u64"
            if problem is not None:
                self._write_records(seg, start, out)
                raise ValueError(problem)
            origin_b, timed = origin_field(origin, commit_time)
            flags |= timed
            if timed and seg.version < TIMED_VERSION:
                self._write_records(seg, start, out)
                out = []
                seg = self._start_segment(prev_gid=seg.tip_gid, first_gid=gid)
                start = seg.end
            size = RECORD_HEADER_SIZE + len(origin_b) + len(payload)
            if size > self._segment_bytes - DATA_START or len(payload) > MAX_PAYLOAD_BYTES:
                self._write_records(seg, start, out)
                out = []
                seg = self._append_pieces(seg, gid, origin_b, payload, flags)
                start = seg.end
                continue
            if seg.end + size > self._segment_bytes or len(out) > _MAX_IOV:
                self._write_records(seg, start, out)
                out = []
                if seg.end + size > self._segment_bytes:
                    seg = self._start_segment(prev_gid=seg.tip_gid, first_gid=gid)
                start = seg.end
            off = seg.end
            self._note_start(seg, gid, off)
            out += [encode_record_header(gid, origin_b, payload, flags, seg.seq), origin_b, payload]
            seg.end = off + size
        self._write_records(seg, start, out)

    def _refusal(self, gid: int, origin_b: bytes, payload: Buffer, flags: int) -> Optional[str]:
        """Why this record cannot be appended, or None."""
        if gid <= self.end_gid:
            return f"GID {gid} does not follow GID {self.end_gid}, the last one in the writeset log"
        if not 0 <= flags <= 0xFF or flags & ~KNOWN_FLAGS:
            return f"unknown writeset log record flags {flags:#x}"
        if len(origin_b) > MAX_ORIGIN_BYTES - TIME.size:  # (its field holds a commit time too)
            return f"origin {origin_b.decode('utf-8')!r} is longer than {MAX_ORIGIN_BYTES - TIME.size} bytes"
        limit = self.max_payload(origin_b.decode("utf-8"))
        if len(payload) > limit:
            return (f"a writeset of {len(payload)} bytes (GID {gid}) is larger than the writeset log can hold "
                    f"({limit} bytes in a ring of {self._capacity} segments): raise log.total_mb")
        return None

    def _note_start(self, seg: Segment, gid: int, off: int) -> None:
        """A record (or a record's first piece) starts at ``off`` of ``seg``."""
        if not seg.records and seg.first_gid != gid:
            seg.first_gid = gid
            self._write_header(seg)
        seg.first_gid = seg.first_gid or gid
        seg.index.note(gid, off)
        seg.records += 1
        seg.last_gid = gid

    def _append_pieces(self, seg: Segment, gid: int, origin_b: bytes, payload: Buffer, flags: int) -> Segment:
        """Write a record in pieces: the first fills the rest of ``seg`` (or of a fresh segment
        when little is left), each next one starts a segment; returns the segment of the last."""
        overhead = RECORD_HEADER_SIZE + len(origin_b) + PIECE.size
        # a version 1 segment (written before pieces existed) takes no piece; nor does a nearly full one
        if seg.version < 2 or self._segment_bytes - seg.end - overhead < self._segment_bytes // 16:
            seg = self._start_segment(prev_gid=seg.tip_gid, first_gid=gid)
        total, done = len(payload), 0
        with memoryview(payload) as mv:
            while True:
                n = min(self._segment_bytes - seg.end - overhead, MAX_PAYLOAD_BYTES, total - done)
                piece = mv[done:done + n]
                head, where = encode_piece_header(gid, origin_b, piece, flags, seg.seq, total, done)
                off = seg.end
                if done == 0:
                    self._note_start(seg, gid, off)
                seg.last_gid = gid
                seg.end = off + overhead + n
                self._write_records(seg, off, [head, origin_b, where, piece])
                done += n
                if done == total:
                    return seg
                seg = self._start_segment(prev_gid=gid, first_gid=0)
    def _write_records(self, seg: Segment, start: int, bufs: list[Buffer]) -> None:
        """Write encoded records at ``start`` of ``seg`` and the end marker after them."""
        if not bufs:
            return
        room_after = self._segment_bytes - seg.end
        if room_after > 0:
            bufs.append(END_MARK[:room_after])
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
        for name, (gid, _) in list(self._pins.items()):
            if gid < after_gid:  # it needed records that go now
                self._break_pin(name, gid, after_gid)
        for s in self._live:
            s.valid = False
        self._free.extend(s.file for s in self._live)
        self._live = []
        self._epoch += 1
        self._start_segment(prev_gid=after_gid, first_gid=0)
        for f in self._free:  # for out-of-process readers; the epoch already excludes them
            _pwrite_all(f.fd, [FREE_HEADER], 0)

    def _start_segment(self, prev_gid: int, first_gid: int) -> Segment:
        seq = self._next_seq
        self._next_seq += 1
        f = self._take_file(seq)
        seg = Segment(f, seq, prev_gid, first_gid)
        self._write_header(seg, extra=[END_MARK])  # and end the records of the file's previous use
        os.fdatasync(f.fd)  # the new seq is on disk before any record under it
        want = os.path.join(self.directory, segment_name(seq))
        os.rename(f.path, want)
        f.path = want
        if self._live:
            self._live[-1].sealed = True
            self._live[-1].next = seg
        self._live.append(seg)
        return seg

    def _take_file(self, seq: int) -> SegmentFile:
        if self._free:
            return self._free.pop()
        while len(self._live) >= self._capacity and self._may_drop_oldest():  # full: reuse the oldest segment
            oldest = self._live.pop(0)
            oldest.valid = False
            if len(self._live) < self._capacity:
                return oldest.file
            oldest.file.close()  # the ring was made smaller, or a pin that held it moved
            os.unlink(oldest.file.path)
        return self._create_file(os.path.join(self.directory, segment_name(seq) + ".tmp"))

    def _may_drop_oldest(self) -> bool:
        """Whether no pin holds the oldest segment: a pin whose position is before the next
        segment's start holds it while the log from there, with one more segment, stays within
        the pin's bytes; a pin that would need more is broken (its lost GIDs kept)."""
        if len(self._live) < 2:
            return False
        after_drop = self._live[1].prev_gid
        held = False
        for name, (gid, max_bytes) in list(self._pins.items()):
            if gid >= after_drop:
                continue
            if (len(self._live) + 1) * self._segment_bytes <= max_bytes:
                held = True
                continue
            self._break_pin(name, gid, after_drop)
        return not held

    def _break_pin(self, name: str, gid: int, new_base: int) -> None:
        max_bytes = self._pins.pop(name)[1]
        self._broken[name] = (gid + 1, new_base)
        log.error("writeset log %s: pin %s broken: it needed the writesets after GID %d, and keeping them would take "
                  "more than its %d bytes; GIDs %d..%d are gone", self.directory, name, gid, max_bytes, gid + 1,
                  new_base)
        self._save_pins()

    # -- pins -----------------------------------------------------------------------------------

    def pin(self, name: str, after_gid: int, max_bytes: int) -> None:
        """Keep every record after ``after_gid`` (set or move pin ``name``): the segment holding
        it is not reused, and the ring grows past its size instead, as long as the log from that
        segment on takes at most ``max_bytes``; past that the pin is broken (:meth:`broken`).
        Raises :class:`LogRangeUnavailable` if the log no longer holds them (the pin is then
        broken too)."""
        self._require_open()
        if name in self._broken:
            first, last = self._broken[name]
            raise LogRangeUnavailable(f"pin {name} is broken: GIDs {first}..{last} are gone from the writeset log")
        if after_gid < self.base_gid:
            self._pins[name] = (after_gid, max_bytes)
            self._break_pin(name, after_gid, self.base_gid)
            raise LogRangeUnavailable(f"pin {name}: the writeset log holds the writesets after GID {self.base_gid}, "
                                      f"not all of those after GID {after_gid}")
        if self._pins.get(name) != (after_gid, max_bytes):
            self._pins[name] = (after_gid, max_bytes)
            self._save_pins()

    def unpin(self, name: str) -> None:
        """Drop pin ``name``, and forget that it was broken (a link removed, or instantiated again)."""
        if self._pins.pop(name, None) is not None or self._broken.pop(name, None) is not None:
            self._save_pins()

    def pins(self) -> dict[str, int]:
        """Each pin's position (the GID after which it needs every record)."""
        return {name: gid for name, (gid, _) in self._pins.items()}

    def broken_pins(self) -> dict[str, tuple[int, int]]:
        """Each broken pin's first and last GID lost."""
        return dict(self._broken)

    def broken(self, name: str) -> Optional[tuple[int, int]]:
        """The first and last GID pin ``name`` lost when it broke, or None."""
        return self._broken.get(name)

    def _save_pins(self) -> None:
        """Write the pins beside the segments (replaced whole; not flushed: after a host crash
        the log loses its unsynced tail too, and the peer's resume position is checked again)."""
        if self._dir_fd is None:
            return
        path = os.path.join(self.directory, PINS_FILE)
        data = json.dumps({"pins": {n: list(p) for n, p in sorted(self._pins.items())},
                           "broken": {n: list(b) for n, b in sorted(self._broken.items())}}).encode()
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.rename(path + ".tmp", path)

    def _load_pins(self) -> None:
        path = os.path.join(self.directory, PINS_FILE)
        try:
            with open(path, "rb") as f:
                raw = json.loads(f.read())
            pins = {str(n): (int(g), int(m)) for n, (g, m) in raw["pins"].items()}
            broken = {str(n): (int(a), int(b)) for n, (a, b) in raw["broken"].items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise LogCorrupt(f"writeset log {self.directory}: {PINS_FILE} is unreadable ({e}): remove it "
                             "(the links' pins are then forgotten; a link whose resume position is gone is "
                             "reported broken when its peer connects)") from e
        self._pins, self._broken = pins, broken

    def _create_file(self, path: str) -> SegmentFile:
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
        return SegmentFile(path, fd, mm)

    def _write_header(self, seg: Segment, extra: Optional[list[Buffer]] = None) -> None:
        header = SegmentHeader(seg.seq, self._epoch, self._segment_bytes, seg.prev_gid, seg.first_gid, seg.version)
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
        return LogReader(self._require_open, seg, off, after_gid)

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
            "pins": self.pins(),
            "broken_pins": self.broken_pins(),
        }


def _name_seq(path: str) -> int:
    stem = os.path.basename(path)[:-len(SEGMENT_SUFFIX)]
    return int(stem) if stem.isdigit() else 0


def starts_again(base_gid: int, end_gid: int, committed: int) -> bool:
    """At start, after the records past the database's committed GID are cut: whether the log
    must start again after that GID, because it does not reach it (its unsynced tail was lost in
    a host crash) or starts after it. It then serves only ranges it really holds."""
    return end_gid < committed or base_gid > committed


class LogFeeder:
    """Appends certified writesets to the log in GID order, each with its final flags: the
    record of a schema change run in total order waits for the change's outcome, and is then
    logged as its content (what every node applies), or, if it failed, as its ordering request
    flagged skipped; the records after it wait with it, so a reader never meets a schema change
    whose outcome is unknown.

    Records are written when :meth:`flush` is called (the coordinator does after each read of
    the bus), several with one system call; :meth:`certified` flushes by itself when many wait.
    """

    FLUSH_AT = 256  # records waiting that make certified() flush

    def __init__(self, wslog: WritesetLog) -> None:
        self.log = wslog
        # (gid, origin, payload, is a schema change, commit time)
        self._unwritten: deque[tuple[int, str, bytes, bool, int]] = deque()
        self._outcomes: dict[int, tuple[bool, bytes]] = {}  # gid -> (ran, its content)

    def certified(self, gid: int, origin: str, payload: bytes, ddl: bool, commit_time: int = 0) -> None:
        if gid <= self.log.end_gid:
            return  # already logged (a catch-up record this node held before it restarted)
        self._unwritten.append((gid, origin, payload, ddl, commit_time))
        if len(self._unwritten) >= self.FLUSH_AT:
            self.flush()

    def outcome(self, gid: int, ok: bool, content: bytes = b"") -> None:
        """The outcome of schema change ``gid``: it ran (``content``: what every node applies)
        or not."""
        self._outcomes[gid] = (ok, content)
        self.flush()

    @property
    def waiting(self) -> int:
        """Records held back by a schema change whose outcome is not known yet."""
        return len(self._unwritten) if any(u[3] for u in self._unwritten) else 0

    def flush(self) -> None:
        """Write every record that can be written now."""
        records: list[tuple[int, str, Buffer, int, int]] = []
        last = self.log.end_gid
        while self._unwritten:
            gid, origin, payload, ddl, commit_time = self._unwritten[0]
            flags = 0
            if ddl:
                outcome = self._outcomes.pop(gid, None)
                if outcome is None:
                    break
                ok, content = outcome
                flags = 0 if ok else FLAG_DDL_SKIPPED
                if ok and content:
                    payload = content
            self._unwritten.popleft()
            if gid <= last:
                continue
            if len(payload) > self.log.max_payload(origin):
                # larger than this node's ring (configured smaller than the origin's): the log
                # cannot hold it, so it restarts after it (a node that misses this GID needs total
                # recovery, or a partner with a larger ring)
                self.log.append_many(records)
                records = []
                log.warning("GID %d (%d bytes) is not in the writeset log: larger than its ring holds (log.total_mb); "
                            "the log now starts after it", gid, len(payload))
                self.log.reset(gid)
            else:
                records.append((gid, origin, payload, flags, commit_time))
            last = gid
        self.log.append_many(records)
