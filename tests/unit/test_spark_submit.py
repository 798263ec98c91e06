"""How ``chorus`` runs the diff job with spark-submit (chorus.total.recover.run_job): the command and
environment a cluster needs, the job's progress passed on as it comes, and a failing job's exit
status and last lines in the error. A stand-in spark-submit records what it was given; the real
thing, on a standalone master and worker, is tests/integration/test_spark_cluster.py."""

from __future__ import annotations

import os
import stat
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from chorus.total.recover import TotalRecoveryError, run_job, submit_command
from chorus_spark import launch

FAKE = """#!/bin/sh
printf '%s\\n' "$@" > "$(dirname "$0")/args"
env > "$(dirname "$0")/env"
echo "24/11/25 10:00:00 INFO SparkContext: Running Spark version 3.5"
echo "Setting default log level to \\"WARN\\"."
echo "Spark: 1 tasks on spark://127.0.0.1:7077" >&2
echo "	at org.apache.spark.Something(Something.scala:1)"
if [ -n "$FAIL" ]; then echo "chorus diff job: it broke" >&2; exit 3; fi
plan=$(eval echo \\${$#})
python3 -c "import json,sys; p=json.load(open(sys.argv[1])); json.dump({'mode': p['mode'], 'results': []}, open(p['result'], 'w'))" "$plan"
"""


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    p = tmp_path / "bin" / "spark-submit"
    p.parent.mkdir()
    p.write_text(FAKE)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def _plan(master: str) -> dict[str, Any]:
    return {"mode": "tasks", "master": master, "tasks": []}


def test_progress_passed_on_and_the_result_read(fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    said: list[str] = []
    out = run_job(_plan("spark://127.0.0.1:7077"), work, said.append, str(fake))
    assert out == {"mode": "tasks", "results": []}
    assert said == ["Spark: 1 tasks on spark://127.0.0.1:7077"]  # Spark's chatter left out
    args = (fake.parent / "args").read_text().splitlines()
    assert args[:2] == ["--master", "spark://127.0.0.1:7077"]
    assert args[args.index("--deploy-mode") + 1] == "client"
    assert "spark.driver.host=127.0.0.1" in args
    with zipfile.ZipFile(args[args.index("--py-files") + 1]) as z:
        assert {"chorus_spark/job.py", "chorus_spark/merkle.py", "chorus_spark/sqlgen.py"} <= set(z.namelist())
    assert args[-1] == str(work / "plan.json") and Path(args[-2]).read_text() == launch.ENTRY
    env = dict(line.split("=", 1) for line in (fake.parent / "env").read_text().splitlines() if "=" in line)
    assert env["PYSPARK_PYTHON"] == sys.executable and env["SPARK_LOCAL_IP"] == "127.0.0.1"


def test_a_remote_master_is_left_to_sparks_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/py/bin/python3")
    cmd, env = submit_command(_plan("spark://spark-master.example:7077"), tmp_path / "plan.json", tmp_path,
                              "spark-submit")
    assert not any(a.startswith("spark.driver.host") for a in cmd) and "SPARK_LOCAL_IP" not in env
    assert env["PYSPARK_PYTHON"] == "/opt/py/bin/python3"  # the operator's choice stands


def test_a_failing_job_says_its_status_and_last_lines(fake: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIL", "1")
    said: list[str] = []
    with pytest.raises(TotalRecoveryError) as e:
        run_job(_plan("local[*]"), tmp_path, said.append, str(fake))
    msg = str(e.value)
    assert "exited with status 3" in msg and msg.rstrip().endswith("chorus diff job: it broke"), msg
    assert "at org.apache.spark.Something" in msg  # the tail keeps what the progress left out
    assert said[-1] == "chorus diff job: it broke"


def test_a_missing_spark_submit(tmp_path: Path) -> None:
    with pytest.raises(TotalRecoveryError, match="cannot run"):
        run_job(_plan("local[*]"), tmp_path, lambda s: None, str(tmp_path / "nowhere" / "spark-submit"))


@pytest.mark.parametrize("master,local,loopback", [
    ("local[*]", True, False), ("local", True, False), ("local[2,3]", True, False),
    ("spark://127.0.0.1:7077", False, True), ("spark://localhost:7077", False, True),
    ("spark://127.0.0.1:7077,127.0.0.1:7078", False, True), ("spark://10.0.0.5:7077", False, False),
    ("spark://127.0.0.1:7077,10.0.0.5:7077", False, False), ("yarn", False, False),
    ("k8s://https://127.0.0.1:6443", False, False)])
def test_masters(master: str, local: bool, loopback: bool) -> None:
    assert launch.is_local(master) is local and launch.is_loopback(master) is loopback


def test_the_package_zip_holds_this_code(tmp_path: Path) -> None:
    with zipfile.ZipFile(launch.package(tmp_path)) as z:
        assert z.read("chorus_spark/job.py") == (launch.PACKAGE_DIR / "job.py").read_bytes()
    assert os.path.basename(launch.entry(tmp_path)) == "chorus_diff_job.py"
