"""The writeset log's writer (wslog/writer.py, seed 9.1, 9.5): appends, the ring, open and close,
reset, limits, records in pieces (format version 2)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from chorus.wslog import (DATA_START, LogCorrupt, LogError, LogRangeUnavailable, LogRecord, WritesetLog, inspect_segment,
                          verify_directory)

from wslog_helpers import SEG, append_records, big, fill, make, patch, read_all, record, segment_files, set_version


def test_round_trip(tmp_path: Path) -> None:
    wl = make(tmp_path)
    written = fill(wl, range(1, 61))
    assert (wl.low_gid, wl.high_gid) == (1, 60)
    assert read_all(wl, 0) == written
    assert wl.stats()["records"] == 60 and wl.stats()["segments"] > 1
    wl.close()


def test_append_many_writes_the_same_log_as_appends_one_by_one(tmp_path: Path) -> None:
    """Several records in one call (the coordinator logs one bus read at once), across segment
    boundaries: the files and what readers get are those of single appends."""
    one, many = make(tmp_path / "one"), make(tmp_path / "many")
    written = fill(one, range(1, 120))
    for start in range(1, 120, 17):  # batches that straddle segments
        many.append_many([(r.gid, r.origin, r.payload, r.flags) for r in written if start <= r.gid < start + 17])
    assert read_all(many, 0) == read_all(one, 0) == written
    one.close()
    many.close()
    for a, b in zip(segment_files(tmp_path / "one"), segment_files(tmp_path / "many"), strict=True):
        assert a.read_bytes() == b.read_bytes()
    assert verify_directory(str(tmp_path / "many"))["ok"]


def test_append_many_stops_at_a_bad_record_with_the_ones_before_logged(tmp_path: Path) -> None:
    wl = make(tmp_path)
    with pytest.raises(ValueError, match="raise log.total_mb"):
        wl.append_many([(1, "a", b"x", 0), (2, "a", b"y", 0), (3, "a", bytes(16 * SEG), 0), (4, "a", b"z", 0)])
    assert [r.gid for r in read_all(wl, 0)] == [1, 2]
    wl.append(4, "a", b"z")
    assert [r.gid for r in read_all(wl, 0)] == [1, 2, 4]
    wl.close()


def test_gaps_are_normal(tmp_path: Path) -> None:
    """GIDs that failed certification are absent; the log still holds everything after base_gid."""
    wl = make(tmp_path)
    written = fill(wl, [3, 4, 9, 100, 101, 250])
    assert [r.gid for r in read_all(wl, 0)] == [3, 4, 9, 100, 101, 250]
    assert [r.gid for r in read_all(wl, 5)] == [9, 100, 101, 250]
    assert [r.gid for r in read_all(wl, 9)] == [100, 101, 250]
    assert read_all(wl, 250) == []
    assert read_all(wl, 4000) == []
    assert read_all(wl, 2) == written
    wl.close()


def test_wrap_reuses_the_oldest_segment(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=3)
    written = fill(wl, range(1, 201))
    files = segment_files(tmp_path)
    assert len(files) == 3
    assert all(f.stat().st_size == SEG for f in files)
    seqs = [inspect_segment(str(f))["header"]["seq"] for f in files]
    assert [f.name for f in files] == [f"{s:08d}.wsl" for s in seqs]  # names follow the header
    assert wl.low_gid > 1 and wl.high_gid == 200
    assert wl.base_gid == wl.low_gid - 1
    assert read_all(wl, wl.base_gid) == [r for r in written if r.gid > wl.base_gid]
    with pytest.raises(LogRangeUnavailable):
        wl.reader(wl.base_gid - 1)
    with pytest.raises(LogRangeUnavailable):
        wl.reader(0)
    wl.close()


def test_smaller_ring_after_reopen(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=6)
    fill(wl, range(1, 201))
    wl.close()
    assert len(segment_files(tmp_path)) == 6
    wl = make(tmp_path, segments=3)
    assert wl.high_gid == 200
    fill(wl, range(201, 260))
    assert len(segment_files(tmp_path)) == 3
    assert read_all(wl, wl.base_gid)[-1].gid == 259
    wl.close()
    assert verify_directory(str(tmp_path))["ok"]


def test_reopen_after_clean_close_keeps_everything(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=4)
    written = fill(wl, range(1, 150))
    before = (wl.low_gid, wl.high_gid, wl.base_gid)
    wl.sync()
    wl.close()
    wl = make(tmp_path, segments=4)
    assert (wl.low_gid, wl.high_gid, wl.base_gid) == before
    assert read_all(wl, wl.base_gid) == [r for r in written if r.gid > wl.base_gid]
    fill(wl, [150])
    assert read_all(wl, 148)[-1] == record(150)
    wl.close()


def test_files_are_private(tmp_path: Path) -> None:
    d = tmp_path / "log"
    wl = make(d)
    fill(wl, [1])
    wl.close()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in segment_files(d))


def test_one_writer_per_directory(tmp_path: Path) -> None:
    wl = make(tmp_path)
    with pytest.raises(LogError, match="in use"):
        make(tmp_path)
    wl.close()
    make(tmp_path).close()


def test_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(LogCorrupt):
        make(tmp_path / "file")
    with pytest.raises(LogCorrupt):
        verify_directory(str(tmp_path / "file"))


def test_reset_forgets_everything(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=4)
    fill(wl, range(1, 80))
    rd = wl.reader(wl.base_gid)
    wl.reset(500)
    assert (wl.low_gid, wl.high_gid, wl.base_gid, wl.end_gid) == (0, 0, 500, 500)
    with pytest.raises(LogRangeUnavailable):
        rd.read(1000)
    with pytest.raises(LogRangeUnavailable):
        wl.reader(499)
    assert read_all(wl, 500) == []
    with pytest.raises(ValueError):
        fill(wl, [500])
    fill(wl, [501, 502])
    assert [r.gid for r in read_all(wl, 500)] == [501, 502]
    wl.close()
    free = [inspect_segment(str(f)) for f in segment_files(tmp_path)]
    assert sum(s["state"] == "segment" for s in free) == 1  # the others' headers were cleared
    wl = make(tmp_path, segments=4)
    assert (wl.low_gid, wl.high_gid, wl.base_gid) == (501, 502, 500)
    wl.close()
    assert verify_directory(str(tmp_path))["ok"]


def test_reset_interrupted_by_a_crash(tmp_path: Path) -> None:
    """The new epoch's header decides: old segments whose headers were not yet cleared are dropped."""
    wl = make(tmp_path, segments=4)
    fill(wl, range(1, 100))
    old_headers = {f.name: f.read_bytes()[:64] for f in segment_files(tmp_path)}
    wl.reset(200)
    fill(wl, [201])
    wl.close()
    for f in segment_files(tmp_path):
        if inspect_segment(str(f))["state"] == "free" and f.name in old_headers:
            patch(f, 0, old_headers[f.name])
    assert verify_directory(str(tmp_path))["ok"]
    wl = make(tmp_path, segments=4)
    assert (wl.low_gid, wl.high_gid, wl.base_gid) == (201, 201, 200)
    assert read_all(wl, 200) == [record(201)]
    wl.close()


def test_reset_to_a_lower_point_and_a_fresh_log(tmp_path: Path) -> None:
    wl = make(tmp_path)
    assert (wl.base_gid, wl.end_gid) == (0, 0)
    assert read_all(wl, 0) == []
    fill(wl, range(1, 10))
    wl.reset(3)
    fill(wl, [4])
    assert read_all(wl, 3) == [record(4)]
    wl.close()


def test_invalid_appends_are_refused(tmp_path: Path) -> None:
    wl = make(tmp_path)
    fill(wl, [5])
    with pytest.raises(ValueError):
        wl.append(5, "a", b"")
    with pytest.raises(ValueError):
        wl.append(4, "a", b"")
    with pytest.raises(ValueError, match="raise log.total_mb"):
        wl.append(6, "a", bytes(wl.max_payload("a") + 1))
    with pytest.raises(ValueError):
        wl.append(6, "x" * 256, b"")
    with pytest.raises(ValueError):
        wl.append(6, "a", b"", flags=0x80)
    largest = SEG - DATA_START - 28 - 1
    wl.append(6, "a", bytes(largest))  # exactly fills a segment
    wl.append(7, "b", b"after")
    assert [(r.gid, len(r.payload)) for r in read_all(wl, 5)] == [(6, largest), (7, 5)]
    wl.close()
    assert verify_directory(str(tmp_path))["ok"]


def test_records_are_written_when_append_returns(tmp_path: Path) -> None:
    """Another process sees an append at once (the file, not a buffer, holds it)."""
    wl = make(tmp_path)
    fill(wl, [1, 2])
    res = inspect_segment(str(segment_files(tmp_path)[0]))
    assert [r["gid"] for r in res["records"]] == [1, 2]
    wl.close()
    assert os.path.exists(tmp_path)


@pytest.mark.parametrize("upto", [0, 1, 9, 10, 17, 30, 40, 45])
def test_open_up_to_a_gid_cuts_the_records_after_it(tmp_path: Path, upto: int) -> None:
    """A restarting node ends its log at its database's committed GID: the records after it were
    certified in a view it did not commit them in, and the cluster may give those GIDs to other
    writesets. Cut wherever the GID falls (inside a segment, at a segment's end, before the first
    record), the log goes on with the cluster's records."""
    wl = make(tmp_path / "log", segments=16)
    written = fill(wl, range(1, 41))  # three segments
    assert len({s.seq for s in wl._live}) == 3
    wl.close()
    wl = WritesetLog(str(tmp_path / "log"), segment_bytes=SEG, total_bytes=16 * SEG)
    wl.open(upto=upto)
    assert wl.end_gid == min(upto, 40)
    assert read_all(wl, 0) == [r for r in written if r.gid <= upto]
    other = [LogRecord(g, "other", 0, b"the cluster's GID %d" % g) for g in range(min(upto, 40) + 1, min(upto, 40) + 4)]
    for r in other:
        wl.append(r.gid, r.origin, r.payload, r.flags)
    wl.close()
    wl = WritesetLog(str(tmp_path / "log"), segment_bytes=SEG, total_bytes=16 * SEG)
    wl.open()
    assert read_all(wl, 0) == [r for r in written if r.gid <= upto] + other
    assert verify_directory(str(tmp_path / "log"))["ok"]
    wl.close()


def test_records_in_pieces_round_trip(tmp_path: Path) -> None:
    wl = make(tmp_path)
    written = fill(wl, range(1, 8))
    pieces = [big(8, 3.5), big(9, 0.99), big(10, 1.0), big(11, 2.0)]
    append_records(wl, pieces)
    written += pieces + fill(wl, [12, 13])
    assert read_all(wl, 0) == written
    for after in range(0, 14):
        assert read_all(wl, after) == [r for r in written if r.gid > after]
    assert [r.gid for r in read_all(wl, 0, max_gid=9)] == list(range(1, 10))
    rd = wl.reader(0)  # a large record is returned whole, alone past max_bytes
    assert [r.gid for r in rd.read(100, max_bytes=1000)] == [1, 2, 3, 4]
    assert [r.gid for r in rd.read(100, max_bytes=1000)] == [5, 6, 7]
    assert [r.gid for r in rd.read(100, max_bytes=1000)] == [8]
    stats = wl.stats()
    assert (stats["records"], stats["low_gid"], stats["high_gid"]) == (13, 1, 13)
    wl.close()
    res = verify_directory(str(tmp_path))
    assert res["ok"] and res["records"] == 13 and res["high_gid"] == 13
    wl = make(tmp_path)
    assert read_all(wl, 0) == written
    fill(wl, [14])
    wl.close()
    listed = [r for p in segment_files(tmp_path) for r in inspect_segment(str(p))["records"] if r["gid"] == 8]
    assert [r["piece"]["offset"] for r in listed] == sorted(r["piece"]["offset"] for r in listed)
    assert len(listed) >= 4 and sum(r["piece"]["length"] for r in listed) == len(pieces[0].payload)


@pytest.mark.parametrize("upto", [5, 6, 7])
def test_open_up_to_a_gid_cuts_a_record_in_pieces_whole(tmp_path: Path, upto: int) -> None:
    wl = make(tmp_path)
    written = fill(wl, range(1, 6))
    append_records(wl, [big(6, 2.5)])
    wl.close()
    wl = WritesetLog(str(tmp_path), segment_bytes=SEG, total_bytes=16 * SEG)
    wl.open(upto=upto)
    assert wl.end_gid == min(upto, 6)
    assert [r.gid for r in read_all(wl, 0)] == [g for g in range(1, 7) if g <= upto]
    assert read_all(wl, 0)[:5] == written
    wl.close()
    assert verify_directory(str(tmp_path))["ok"]


def test_records_keep_their_commit_times(tmp_path: Path) -> None:
    """Format version 3: a record may carry its origin's commit time (the bus message's, docs/LINKS.md
    section 5.1), in its origin field; readers, a reopened log, records in pieces and `chorus log
    inspect` return it, and a record without one reads 0."""
    import dataclasses

    wl = make(tmp_path)
    timed = [dataclasses.replace(r, commit_time=1_790_000_000_000_000 + r.gid) for r in fill_none(range(1, 30))]
    for r in timed:
        wl.append(r.gid, r.origin, r.payload, r.flags, r.commit_time)
    plain = fill(wl, [30])
    large = dataclasses.replace(big(31, 2.5), commit_time=1_790_000_000_999_999)
    wl.append(large.gid, large.origin, large.payload, large.flags, large.commit_time)
    written = timed + plain + [large]
    assert read_all(wl, 0) == written and read_all(wl, 0)[29].commit_time == 0
    wl.close()
    assert verify_directory(str(tmp_path))["ok"]
    listed = {r["gid"]: r for p in segment_files(tmp_path) for r in inspect_segment(str(p))["records"]}
    assert listed[5]["commit_time"] == 1_790_000_000_000_005 and "commit_time" not in listed[30]
    assert listed[5]["origin"] == timed[4].origin
    wl = make(tmp_path)
    assert read_all(wl, 0) == written
    wl.close()


def fill_none(gids: range) -> list[LogRecord]:
    return [record(g) for g in gids]


def test_a_commit_time_starts_a_new_segment_after_one_of_an_older_format(tmp_path: Path) -> None:
    """A log written by the release before has version 2 segments, which cannot hold a commit time
    (that release's reader refuses the flag): the first record with one starts a version 3
    segment; a version 2 segment holding the flag is cut there, like any record it cannot read."""
    wl = make(tmp_path)
    fill(wl, [1, 2])
    wl.close()
    set_version(segment_files(tmp_path)[0], 2)
    wl = make(tmp_path)
    wl.append(3, "n1", b"three", 0, 1_790_000_000_000_003)
    assert [(r.gid, r.commit_time) for r in read_all(wl, 0)] == [(1, 0), (2, 0), (3, 1_790_000_000_000_003)]
    assert wl.stats()["segments"] == 2
    wl.close()
    versions = sorted(inspect_segment(str(p))["header"]["version"] for p in segment_files(tmp_path)
                      if inspect_segment(str(p))["records"])
    assert versions == [2, 3]
    # the same record in the version 2 segment: not read there (the log ends before it)
    set_version([p for p in segment_files(tmp_path) if inspect_segment(str(p))["header"]["version"] == 3][0], 2)
    wl = make(tmp_path)
    assert [r.gid for r in read_all(wl, 0)] == [1, 2]
    wl.close()
