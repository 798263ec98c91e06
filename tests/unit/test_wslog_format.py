"""The writeset log's format (wslog/format.py): versions of the segment header."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest

from chorus.wslog import LogCorrupt, LogRecord, inspect_segment, verify_directory

from wslog_helpers import SEG, fill, make, patch, payload, read_all, segment_files


def test_unknown_format_version_is_refused(tmp_path: Path) -> None:
    wl = make(tmp_path)
    fill(wl, [1])
    wl.close()
    path = segment_files(tmp_path)[0]
    raw = bytearray(path.read_bytes()[:64])
    raw[8:10] = struct.pack("<H", 4)
    raw[56:60] = struct.pack("<I", crc32c.crc32c(bytes(raw[:56])))
    patch(path, 0, bytes(raw))
    with pytest.raises(LogCorrupt, match="version 4"):
        make(tmp_path)
    res = inspect_segment(str(path))
    assert res["state"] == "bad header" and "version 4" in res["header_problem"]


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
