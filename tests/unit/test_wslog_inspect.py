"""Inspecting and verifying the writeset log (wslog/inspect.py): in process, from another process
and through ``chorus log``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from chorus.cli.main import cli
from chorus.wslog import DATA_START, LogCorrupt, inspect_segment, verify_directory

from wslog_helpers import append_records, big, fill, make, patch, record_at, segment_files


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
