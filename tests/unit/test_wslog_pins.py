"""The writeset log's pins (wslog/writer.py, docs/WSLOG.md "Pins", docs/LINKS.md section 2): a
link keeps what its peer has not applied, up to its bytes, and is broken past them."""

from __future__ import annotations

from pathlib import Path

import pytest

from chorus.wslog import LogRangeUnavailable

from wslog_helpers import SEG, fill, make, read_all


def test_a_pin_keeps_its_segment_and_the_ring_grows_within_its_bytes(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=4)
    fill(wl, range(1, 11))
    wl.pin("link:a", 5, 12 * SEG)
    fill(wl, range(11, 150))  # far more than four segments
    assert wl.base_gid <= 5
    assert [r.gid for r in read_all(wl, 5)] == list(range(6, 150))
    assert wl.stats()["segments"] > 4
    assert wl.broken("link:a") is None
    wl.close()


def test_without_a_pin_the_ring_reuses_its_oldest_segment(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=4)
    fill(wl, range(1, 150))
    assert wl.base_gid > 5 and wl.stats()["segments"] == 4
    wl.close()


def test_a_pin_moved_on_releases_the_segments_and_the_ring_shrinks_back(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=4)
    fill(wl, range(1, 11))
    wl.pin("link:a", 5, 12 * SEG)
    fill(wl, range(11, 100))
    grown = wl.stats()["segments"]
    assert grown > 4
    wl.pin("link:a", 99, 12 * SEG)
    fill(wl, range(100, 120))  # the next segment started gives the ones before GID 99 back
    assert wl.stats()["segments"] == 4 and wl.base_gid > 5
    assert [r.gid for r in read_all(wl, 99)] == list(range(100, 120))
    wl.unpin("link:a")
    assert wl.pins() == {}
    wl.close()


def test_a_pin_past_its_bytes_is_broken_with_the_gids_lost(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=4)
    fill(wl, range(1, 11))
    wl.pin("link:a", 5, 6 * SEG)
    fill(wl, range(11, 300))
    assert wl.stats()["segments"] <= 6
    lost = wl.broken("link:a")
    assert lost is not None and lost[0] == 6 and lost[1] > 6
    assert lost[1] <= wl.base_gid and "link:a" not in wl.pins()
    with pytest.raises(LogRangeUnavailable, match="broken"):  # never resumed later on
        wl.pin("link:a", wl.end_gid, 6 * SEG)
    wl.unpin("link:a")  # instantiated again
    wl.pin("link:a", wl.end_gid, 6 * SEG)
    wl.close()


def test_a_pin_before_the_log_is_refused_and_broken(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=4)
    fill(wl, range(1, 150))
    with pytest.raises(LogRangeUnavailable):
        wl.pin("link:a", 2, 100 * SEG)
    assert wl.broken("link:a") == (3, wl.base_gid)
    wl.close()


def test_pins_and_broken_pins_outlive_a_restart(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=4)
    fill(wl, range(1, 11))
    wl.pin("link:a", 5, 12 * SEG)
    wl.pin("link:b", 6, 1)
    fill(wl, range(11, 100))
    lost_b = wl.broken("link:b")
    assert lost_b is not None
    wl.close()
    wl = make(tmp_path, segments=4)
    assert wl.pins() == {"link:a": 5} and wl.broken("link:b") == lost_b
    fill(wl, range(100, 160))
    assert [r.gid for r in read_all(wl, 5)] == list(range(6, 160))
    wl.close()


def test_a_reset_past_a_pin_breaks_it(tmp_path: Path) -> None:
    wl = make(tmp_path, segments=4)
    fill(wl, range(1, 11))
    wl.pin("link:a", 5, 12 * SEG)
    wl.pin("link:b", 30, 12 * SEG)
    wl.reset(20)
    assert wl.broken("link:a") == (6, 20) and wl.broken("link:b") is None
    wl.close()
