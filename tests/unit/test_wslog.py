"""The writeset log (seed 9.1, 9.5): ring of segments, readers, torn tails, reuse, reset, the CLI."""

from __future__ import annotations

import json
import logging
import os
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import crc32c
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.cli.main import cli
from chorus.wslog import (DATA_START, FLAG_DDL_SKIPPED, LogCorrupt, LogError, LogRangeUnavailable, LogRecord,
                          PiecedPayload, WritesetLog, inspect_segment, verify_directory)

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
        out.extend(LogRecord(r.gid, r.origin, r.flags, bytes(r.payload)) for r in batch)
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


# -- appending and reading --------------------------------------------------------------------


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


# -- the ring ---------------------------------------------------------------------------------


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


# -- open, close, damage ----------------------------------------------------------------------


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


def test_torn_last_record_is_cut_and_appends_continue(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wl = make(tmp_path)
    fill(wl, range(1, 31))
    wl.close()
    path, off, size = record_at(tmp_path, 30)
    patch(path, off + size // 2, bytes(size - size // 2))  # the second half never reached the disk
    with caplog.at_level(logging.WARNING, logger="chorus.wslog"):
        wl = make(tmp_path)
    assert "dropped" in caplog.text and "GID 29" in caplog.text
    assert wl.high_gid == 29
    with pytest.raises(ValueError):
        fill(wl, [29])
    fill(wl, range(30, 40), size=120)  # different sizes: the old bytes must not come back
    assert read_all(wl, 0) == [record(g) for g in range(1, 30)] + [record(g, 120) for g in range(30, 40)]
    wl.close()
    assert verify_directory(str(tmp_path))["ok"]
    wl = make(tmp_path)
    assert wl.high_gid == 39
    wl.close()


def test_garbage_after_the_last_record_is_cut(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wl = make(tmp_path)
    fill(wl, range(1, 6))
    wl.close()
    path, off, size = record_at(tmp_path, 5)
    patch(path, off + size, b"\x5a" * 100)
    assert not verify_directory(str(tmp_path))["ok"]
    with caplog.at_level(logging.WARNING, logger="chorus.wslog"):
        wl = make(tmp_path)
    assert "dropped 100 bytes" in caplog.text
    assert read_all(wl, 0) == [record(g) for g in range(1, 6)]
    fill(wl, [6])
    assert read_all(wl, 5) == [record(6)]
    wl.close()
    assert verify_directory(str(tmp_path))["ok"]


def test_damage_in_an_early_segment_cuts_every_later_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wl = make(tmp_path)
    fill(wl, range(1, 101))
    wl.close()
    path, off, _ = record_at(tmp_path, 20)
    patch(path, off + 40, b"\xff")
    res = verify_directory(str(tmp_path))
    assert not res["ok"]
    assert res["problems"][0]["file"] == path.name and res["problems"][0]["offset"] == off
    assert res["problems"][0]["kind"] == "checksum"
    with caplog.at_level(logging.WARNING, logger="chorus.wslog"):
        wl = make(tmp_path)
    assert "later segments holding" in caplog.text
    assert wl.high_gid == 19
    assert read_all(wl, 0) == [record(g) for g in range(1, 20)]
    fill(wl, range(20, 120))
    assert [r.gid for r in read_all(wl, 0)] == list(range(1, 120))
    wl.close()
    assert verify_directory(str(tmp_path))["ok"]


def test_missing_segment_ends_the_log(tmp_path: Path) -> None:
    wl = make(tmp_path)
    fill(wl, range(1, 101))
    wl.close()
    files = segment_files(tmp_path)
    last_of_first = inspect_segment(str(files[0]))["last_gid"]
    files[1].unlink()
    res = verify_directory(str(tmp_path))
    assert [p["kind"] for p in res["problems"]] == ["chain"]
    wl = make(tmp_path)
    assert wl.high_gid == last_of_first
    wl.close()


def test_damaged_segment_header(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wl = make(tmp_path)
    fill(wl, range(1, 61))
    wl.close()
    files = segment_files(tmp_path)
    seq_byte = files[-1].read_bytes()[16]
    patch(files[-1], 16, bytes([seq_byte ^ 0x04]))  # a bit of the newest segment's seq
    res = verify_directory(str(tmp_path))
    assert [(p["file"], p["kind"]) for p in res["problems"]] == [(files[-1].name, "header")]
    with caplog.at_level(logging.WARNING, logger="chorus.wslog"):
        wl = make(tmp_path)
    assert "damaged header" in caplog.text
    assert wl.high_gid == inspect_segment(str(files[-2]))["last_gid"]
    wl.close()


@settings(max_examples=60, deadline=None)
@given(st.integers(5, 60), st.data())
def test_any_single_bit_flip_in_a_record_is_detected(count: int, data: st.DataObject) -> None:
    """Flip one bit anywhere in one record: that record and everything after it is cut, the rest survives."""
    with tempfile.TemporaryDirectory() as d:
        directory = Path(d)
        wl = make(directory)
        written = fill(wl, range(1, count + 1), size=150)
        wl.close()
        victim = data.draw(st.integers(1, count))
        path, off, size = record_at(directory, victim)
        bit = data.draw(st.integers(0, size * 8 - 1))
        with open(path, "r+b") as f:
            f.seek(off + bit // 8)
            byte = f.read(1)[0]
            f.seek(off + bit // 8)
            f.write(bytes([byte ^ (1 << (bit % 8))]))
        res = verify_directory(str(directory))
        assert not res["ok"] and res["problems"][0]["offset"] == off
        wl = make(directory)
        assert wl.high_gid == victim - 1
        assert read_all(wl, 0) == written[:victim - 1]
        fill(wl, [victim + 1000])
        wl.close()
        assert verify_directory(str(directory))["ok"]


def test_unknown_format_version_is_refused(tmp_path: Path) -> None:
    wl = make(tmp_path)
    fill(wl, [1])
    wl.close()
    path = segment_files(tmp_path)[0]
    raw = bytearray(path.read_bytes()[:64])
    raw[8:10] = struct.pack("<H", 3)
    raw[56:60] = struct.pack("<I", crc32c.crc32c(bytes(raw[:56])))
    patch(path, 0, bytes(raw))
    with pytest.raises(LogCorrupt, match="version 3"):
        make(tmp_path)
    res = inspect_segment(str(path))
    assert res["state"] == "bad header" and "version 3" in res["header_problem"]


def test_a_version_1_log_is_read_and_appended_to(tmp_path: Path) -> None:
    """A log written before records could span segments (version 1) opens, reads, and takes
    appends, large ones in pieces."""
    wl = make(tmp_path)
    written = fill(wl, range(1, 30))
    wl.close()
    for path in segment_files(tmp_path):
        raw = bytearray(path.read_bytes()[:64])
        if raw == bytes(64):
            continue
        raw[8:10] = struct.pack("<H", 1)
        raw[56:60] = struct.pack("<I", crc32c.crc32c(bytes(raw[:56])))
        patch(path, 0, bytes(raw))
    assert {inspect_segment(str(p))["header"]["version"] for p in segment_files(tmp_path)} == {1}
    wl = make(tmp_path)
    assert read_all(wl, 0) == written
    big = LogRecord(30, "n", 0, payload(30, 3 * SEG))
    wl.append(big.gid, big.origin, big.payload)
    assert read_all(wl, 0) == written + [big]
    wl.close()
    assert verify_directory(str(tmp_path))["ok"]


def test_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(LogCorrupt):
        make(tmp_path / "file")
    with pytest.raises(LogCorrupt):
        verify_directory(str(tmp_path / "file"))


# -- reset, limits ----------------------------------------------------------------------------


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


# -- inspect and verify -----------------------------------------------------------------------


def test_inspect_segment(tmp_path: Path) -> None:
    wl = make(tmp_path)
    fill(wl, range(1, 4))
    wl.close()
    path = segment_files(tmp_path)[0]
    res = inspect_segment(str(path))
    assert res["state"] == "segment" and res["problem"] is None and res["first_bad_offset"] is None
    assert res["header"]["seq"] == 1 and res["header"]["crc_ok"] and res["header"]["first_gid"] == 1
    assert [(r["gid"], r["origin"], r["crc_ok"]) for r in res["records"]] == [(1, "node1", True), (2, "node2", True),
                                                                              (3, "node0", True)]
    assert res["records"][0]["offset"] == DATA_START
    assert res["valid_end"] == res["records"][-1]["offset"] + res["records"][-1]["size"]
    patch(path, res["records"][1]["offset"] + 100, b"!")
    bad = inspect_segment(str(path))
    assert bad["first_bad_offset"] == res["records"][1]["offset"]
    assert bad["problem"]["kind"] == "checksum"
    assert [(r["gid"], r["crc_ok"]) for r in bad["records"]] == [(1, True), (2, False)]


def test_verify_directory_on_a_good_log(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=3)
    fill(wl, range(1, 120))
    stats = wl.stats()
    wl.close()
    res = verify_directory(str(tmp_path))
    assert res["ok"] and res["problems"] == []
    assert (res["low_gid"], res["high_gid"], res["base_gid"]) == (stats["low_gid"], stats["high_gid"], stats["base_gid"])
    assert res["records"] == stats["records"] and res["live_segments"] == 3


def test_verify_while_the_writer_appends(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=3)
    fill(wl, range(1, 50))
    assert verify_directory(str(tmp_path))["ok"]  # no flush needed: the files show every append
    fill(wl, range(50, 400))
    res = verify_directory(str(tmp_path))
    assert res["ok"] and res["high_gid"] == 399
    wl.close()


WRITER = """
import sys, time
from chorus.wslog import WritesetLog
wl = WritesetLog(sys.argv[1], segment_bytes=16384, total_bytes=4 * 16384)
wl.open()
print("open", flush=True)
gid = 0
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    for _ in range(20):
        gid += 1
        wl.append(gid, "writer", (b"%d;" % gid) * 40)
    time.sleep(0.0005)
wl.close()
print(gid, flush=True)
"""


def test_out_of_process_readers_while_the_writer_wraps(tmp_path: Path) -> None:
    """verify/inspect from another process: a record being written or a segment being reused is no finding."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "2.0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
        rounds = 0
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            res = verify_directory(str(tmp_path))
            assert res["ok"], res["problems"]
            assert res["high_gid"] - res["base_gid"] == res["records"] or res["unsettled"]
            for path in segment_files(tmp_path):
                try:
                    seg = inspect_segment(str(path))
                except LogCorrupt:
                    continue  # renamed by a reuse meanwhile
                assert seg["problem"] is None or seg["unsettled"], seg["problem"]
                gids = [r["gid"] for r in seg["records"]]
                assert all(r["origin"] == "writer" for r in seg["records"])
                assert gids == sorted(set(gids))
            rounds += 1
        last = int(proc.stdout.readline())
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    assert rounds > 10 and last > 5000
    res = verify_directory(str(tmp_path))
    assert res["ok"] and res["high_gid"] == last


# -- the CLI ----------------------------------------------------------------------------------


def test_cli_inspect(tmp_path: Path) -> None:
    wl = make(tmp_path)
    fill(wl, range(1, 4))
    wl.close()
    path = str(segment_files(tmp_path)[0])
    runner = CliRunner()
    res = runner.invoke(cli, ["log", "inspect", path, "--json"])
    assert res.exit_code == 0, res.output
    assert [r["gid"] for r in json.loads(res.output)["records"]] == [1, 2, 3]
    res = runner.invoke(cli, ["log", "inspect", path])
    assert res.exit_code == 0, res.output
    assert "clean end" in res.output and "node1" in res.output
    patch(Path(path), DATA_START + 50, b"?")
    res = runner.invoke(cli, ["log", "inspect", path])
    assert res.exit_code == 1 and f"first bad offset {DATA_START}" in res.output


def test_cli_verify(tmp_path: Path) -> None:
    wl = make(tmp_path)
    fill(wl, range(1, 60))
    wl.close()
    runner = CliRunner()
    res = runner.invoke(cli, ["log", "verify", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "no problems" in res.output and "records: 59" in res.output
    res = runner.invoke(cli, ["log", "verify", str(tmp_path), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["high_gid"] == 59
    path, off, _ = record_at(tmp_path, 40)
    patch(path, off + 30, b"\x00\x01")
    res = runner.invoke(cli, ["log", "verify", str(tmp_path)])
    assert res.exit_code == 1
    assert f"{path.name} offset {off}" in res.output
    res = runner.invoke(cli, ["log", "verify", str(tmp_path), "--json"])
    assert res.exit_code == 1 and json.loads(res.output)["problems"][0]["offset"] == off
    res = runner.invoke(cli, ["log", "verify", str(tmp_path / "missing")])
    assert res.exit_code != 0


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


# -- records larger than a segment (format version 2: pieces) ---------------------------------


def big(gid: int, segments: float) -> LogRecord:
    """A record whose payload is ``segments`` segments long (random bytes, so a shifted piece shows)."""
    return LogRecord(gid, f"node{gid % 3}", FLAG_DDL_SKIPPED if gid % 7 == 0 else 0,
                     os.urandom(int(segments * SEG)))


def append_records(wl: WritesetLog, records: list[LogRecord]) -> None:
    wl.append_many([(r.gid, r.origin, r.payload, r.flags) for r in records])


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


def test_the_start_of_a_record_reused_leaves_its_rest_skipped(tmp_path: Path) -> None:
    """When the ring reuses the segment a record starts in, the segments holding its other pieces
    begin the log: the log then holds what follows that record."""
    wl = make(tmp_path, segments=4)
    first = big(1, 2.5)
    append_records(wl, [first])
    rest = fill(wl, range(2, 40))
    assert wl.base_gid >= 1
    assert read_all(wl, wl.base_gid) == [r for r in rest if r.gid > wl.base_gid]
    wl.close()
    assert verify_directory(str(tmp_path))["ok"]
    wl = make(tmp_path, segments=4)
    assert read_all(wl, wl.base_gid) == [r for r in rest if r.gid > wl.base_gid]
    wl.close()


def test_an_orphan_continuation_at_the_start_of_the_log_is_skipped(tmp_path: Path) -> None:
    """The segments up to the one a record starts in are reused (here: freed by hand); the
    oldest one left continues that record: the log holds what follows it."""
    wl = make(tmp_path, segments=8)
    append_records(wl, [big(1, 1.0), big(2, 3.2)])
    tail = fill(wl, range(3, 6))
    wl.close()
    files = segment_files(tmp_path)
    head2 = next(i for i, p in enumerate(files) if any(r["gid"] == 2 and r.get("piece", {}).get("offset") == 0
                                                      for r in inspect_segment(str(p))["records"]))
    for p in files[:head2 + 1]:
        patch(p, 0, bytes(64))
    res = verify_directory(str(tmp_path))
    assert res["ok"] and res["base_gid"] == 2 and res["segments"][0]["continues"] == 2
    wl = make(tmp_path, segments=8)
    assert (wl.base_gid, wl.low_gid, wl.high_gid) == (2, 3, 5)
    assert read_all(wl, 2) == tail
    with pytest.raises(LogRangeUnavailable):
        wl.reader(1)
    wl.close()


@pytest.mark.parametrize("cut_piece", [1, 2, 3])
def test_a_record_whose_last_pieces_are_lost_is_cut_whole(tmp_path: Path, cut_piece: int,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A process that dies while writing a record in pieces leaves its first pieces: open() cuts
    the whole record (it was never acknowledged: the log is written before the commit), and the
    log goes on after the record before it."""
    wl = make(tmp_path)
    before = fill(wl, range(1, 6))
    append_records(wl, [big(6, 3.5)])
    wl.close()
    pieces = sorted(((p, r) for p in segment_files(tmp_path) for r in inspect_segment(str(p))["records"]
                     if r["gid"] == 6), key=lambda x: x[1]["piece"]["offset"])
    assert len(pieces) == 4
    path, r = pieces[cut_piece]
    patch(path, r["offset"], bytes(r["size"]))  # never written
    res = verify_directory(str(tmp_path))
    assert not res["ok"] and any(p["kind"] == "piece" for p in res["problems"])
    with caplog.at_level(logging.WARNING, logger="chorus.wslog"):
        wl = make(tmp_path)
    assert "not complete" in caplog.text
    assert wl.end_gid == 5 and read_all(wl, 0) == before
    after = [big(6, 1.5)]
    append_records(wl, after)
    after += fill(wl, [7])
    wl.close()
    assert verify_directory(str(tmp_path))["ok"]
    wl = make(tmp_path)
    assert read_all(wl, 0) == before + after
    wl.close()


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_single_bit_flip_in_a_piece_is_detected(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as d:
        directory = Path(d)
        wl = make(directory)
        written = fill(wl, range(1, 4)) + [big(4, 2.3)]
        append_records(wl, written[-1:])
        written += fill(wl, [5, 6])
        wl.close()
        pieces = [(p, r) for p in segment_files(directory) for r in inspect_segment(str(p))["records"] if r["gid"] == 4]
        path, r = data.draw(st.sampled_from(pieces))
        bit = data.draw(st.integers(0, r["size"] * 8 - 1))
        with open(path, "r+b") as f:
            f.seek(r["offset"] + bit // 8)
            byte = f.read(1)[0]
            f.seek(r["offset"] + bit // 8)
            f.write(bytes([byte ^ (1 << (bit % 8))]))
        assert not verify_directory(str(directory))["ok"]
        wl = make(directory)
        assert wl.end_gid == 3 and read_all(wl, 0) == written[:3]
        wl.close()


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


def test_cli_shows_pieces(tmp_path: Path) -> None:
    wl = make(tmp_path)
    fill(wl, [1])
    append_records(wl, [big(2, 2.5)])
    fill(wl, [3])
    wl.close()
    out = CliRunner().invoke(cli, ["log", "verify", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "…2" in out.output and "2…" in out.output
    out = CliRunner().invoke(cli, ["log", "inspect", str(segment_files(tmp_path)[0])])
    assert out.exit_code == 0 and " of " in out.output, out.output
