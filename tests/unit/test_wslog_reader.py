"""The writeset log's readers (wslog/reader.py, seed 9.1): anchored anywhere, bounded reads,
following the writer, wrapped away, records in pieces read where they lie."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.wslog import LogError, LogRangeUnavailable, LogRecord, PiecedPayload, verify_directory

from wslog_helpers import SEG, append_records, big, fill, make, read_all, record


def test_reader_anchored_anywhere(tmp_path: Path) -> None:
    wl = make(tmp_path)
    gids = list(range(2, 600, 3))
    written = fill(wl, gids, size=40)
    for after in range(0, 602):
        assert read_all(wl, after) == [r for r in written if r.gid > after], after
    wl.close()


def test_read_respects_max_gid_and_max_bytes(tmp_path: Path) -> None:
    wl = make(tmp_path)
    fill(wl, range(1, 41))
    rd = wl.reader(0)
    assert [r.gid for r in rd.read(5)] == [1, 2, 3, 4, 5]
    assert rd.read(5) == [] and rd.position_gid == 5
    one = rd.read(40, max_bytes=0)
    assert [r.gid for r in one] == [6]  # always at least one record
    batch = rd.read(40, max_bytes=1000)
    assert 1 <= len(batch) <= 5 and batch[0].gid == 7
    rest = rd.read(40, max_bytes=1 << 20)
    assert [r.gid for r in batch + rest] == list(range(7, 41))
    assert rd.position_gid == 40
    rd.close()
    with pytest.raises(LogError):
        rd.read(40)
    wl.close()


def test_reader_at_the_end_sees_later_appends(tmp_path: Path) -> None:
    wl = make(tmp_path)
    fill(wl, range(1, 11))
    rd = wl.reader(10)
    assert rd.read(100) == []
    fill(wl, [12, 13])
    assert [r.gid for r in rd.read(100)] == [12, 13]
    wl.close()


def test_concurrent_reader_and_writer(tmp_path: Path) -> None:
    """A catch-up stream: reads between appends see each record exactly once, in order."""
    wl = make(tmp_path, segments=64)
    rd = wl.reader(0)
    seen: list[int] = []
    gid = 0
    for step in range(200):
        fill(wl, range(gid + 1, gid + 1 + step % 7), size=50 + step)
        gid += step % 7
        while batch := rd.read(wl.high_gid, max_bytes=300):
            seen.extend(r.gid for r in batch)
    assert seen == list(range(1, gid + 1))
    assert wl.stats()["segments"] > 5
    wl.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=120), st.data())
def test_reader_serves_exactly_what_follows_base(steps: list[int], data: st.DataObject) -> None:
    """Whatever wrapped away: reader(after) for after >= base_gid returns every GID after it; below, it refuses."""
    with tempfile.TemporaryDirectory() as d:
        wl = make(Path(d), segments=3)
        gids = []
        g = 0
        for s in steps:
            g += s
            gids.append(g)
        fill(wl, gids, size=100)
        after = data.draw(st.integers(0, g + 2))
        if after >= wl.base_gid:
            assert [r.gid for r in read_all(wl, after)] == [x for x in gids if x > after]
        else:
            with pytest.raises(LogRangeUnavailable):
                wl.reader(after)
        wl.close()


def test_reader_on_a_reused_segment_fails_never_returns_wrong_data(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=3)
    fill(wl, range(1, 11))
    rd = wl.reader(0)
    got = rd.read(100, max_bytes=1)
    fill(wl, range(11, 200))  # wraps over the segment the reader is in
    with pytest.raises(LogRangeUnavailable):
        while batch := rd.read(1000, max_bytes=1):
            got.extend(batch)
    assert got == [record(g) for g in range(1, len(got) + 1)]
    wl.close()


def test_reader_waiting_at_the_end_follows_into_new_segments(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=3)
    fill(wl, range(1, 5))
    rd = wl.reader(4)
    got = []
    for g in range(5, 100):
        fill(wl, [g])
        got.extend(rd.read(g))
    assert got == [record(g) for g in range(5, 100)]
    wl.close()


def test_a_record_in_pieces_is_read_where_it_lies_a_chunk_at_a_time(tmp_path: Path) -> None:
    """The reader does not join a record logged in pieces: its payload is read (each piece's CRC
    checked) in chunks of the size asked for, and a segment reused while it is being read stops
    it (LogRangeUnavailable), never handing out bytes of another record."""
    wl = make(tmp_path, segments=8)
    fill(wl, [1])
    rec = big(2, 3.5)
    append_records(wl, [rec])
    (got,) = wl.reader(1).read(2)
    assert isinstance(got.payload, PiecedPayload) and len(got.payload) == len(rec.payload)
    chunks = list(got.payload.chunks(1000))
    assert b"".join(chunks) == rec.payload and max(map(len, chunks)) == 1000
    assert bytes(got.payload) == rec.payload
    reading = got.payload.chunks(1000)
    assert next(reading) == rec.payload[:1000]
    fill(wl, range(3, 300), size=1000)  # the ring turns over: the record's segments are reused
    with pytest.raises(LogRangeUnavailable):
        list(reading)
    with pytest.raises(LogRangeUnavailable):
        bytes(got.payload)
    wl.close()


def test_a_segment_ending_a_few_bytes_short_of_a_record_header_reads_and_verifies(tmp_path: Path) -> None:
    """Found by the property test below: the last record of a reused segment file ended 10 bytes
    before the segment's end; the writer ended it with END_MARK (8 zero bytes) and the file's
    old bytes followed. The reader took those 10 bytes for a torn record, so the directory did
    not verify (and a restart would have found the tail damaged)."""
    wl = make(tmp_path, segments=4)
    for gid, size in enumerate([0, 0, 0, 0, 1500, SEG, SEG, 2 * SEG + 7, 2 * SEG + 7, 1500], start=1):
        wl.append(gid, "n", os.urandom(size))
    wl.close()
    report = verify_directory(str(tmp_path))
    assert report["ok"], report["problems"]
    wl = make(tmp_path, segments=4)
    assert [r.gid for r in read_all(wl, wl.base_gid)] == [9, 10]
    wl.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.sampled_from([0, 50, 1500, SEG - 100, SEG, 2 * SEG + 7, 5 * SEG])),
                min_size=1, max_size=40), st.integers(3, 8), st.data())
def test_any_mix_of_sizes_wraps_and_reopens(steps: list[tuple[int, int]], segments: int, data: st.DataObject) -> None:
    """Records of any size in a ring of any size: what reader(after) returns is exactly the
    records after ``after`` (for after >= base_gid), before and after reopening; the files verify."""
    with tempfile.TemporaryDirectory() as d:
        wl = make(Path(d), segments=segments)
        written: list[LogRecord] = []
        g = 0
        for step, size in steps:
            g += step
            r = LogRecord(g, "n", 0, os.urandom(size))
            if size > wl.max_payload("n"):
                with pytest.raises(ValueError, match="log.total_mb"):
                    wl.append(r.gid, r.origin, r.payload)
                continue
            wl.append(r.gid, r.origin, r.payload)
            written.append(r)
        for reopen in (False, True):
            if reopen:
                wl.close()
                assert verify_directory(d)["ok"]
                wl = make(Path(d), segments=segments)
            after = data.draw(st.integers(0, g + 1))
            if after >= wl.base_gid:
                assert read_all(wl, after) == [r for r in written if r.gid > after]
            else:
                with pytest.raises(LogRangeUnavailable):
                    wl.reader(after)
        wl.close()
