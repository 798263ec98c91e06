"""The writeset log as found on disk (wslog/scan.py, seed 9.5): torn tails, damage, missing
segments and lost pieces are cut at open, and what is left stays readable."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.wslog import LogRangeUnavailable, inspect_segment, verify_directory

from wslog_helpers import append_records, big, fill, make, patch, read_all, record, record_at, segment_files


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
