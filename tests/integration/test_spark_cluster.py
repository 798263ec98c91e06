"""The snapshot diff on a Spark cluster, not only in ``local[*]``: a standalone master and worker
started from the pyspark distribution (spark_standalone.py); total recovery and ``chorus verify``
run the job there with spark-submit (client mode), and verify also with Spark's driver in the
``chorus`` process. The worker must really have run the executors: the master lists the finished
application and the worker's work directory holds its executor's log."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from conftest import Cluster, chorus
from spark_standalone import StandaloneSpark, spark_bin, standalone_spark
from test_total_recovery import FILL, TYPES_TABLE

pytest.importorskip("pyspark")
if spark_bin() is None:
    pytest.skip("pyspark's spark-class/spark-submit or java is missing", allow_module_level=True)

OFF = "-c chorus.capture=off -c chorus.replicate_ddl=off"


@pytest.fixture(scope="module")
def spark() -> Iterator[StandaloneSpark]:
    with tempfile.TemporaryDirectory(prefix="chorus-spark-cluster-") as d:
        with standalone_spark(Path(d)) as s:
            yield s


def _ran_on_the_worker(spark: StandaloneSpark, apps_before: int, out: str) -> None:
    """A new application finished on the master, and an executor of it ran on the worker."""
    apps = spark.completed_apps()
    assert len(apps) > apps_before, (apps, out[-2000:])
    newest = max(apps, key=lambda a: a["starttime"])
    assert newest["name"] == "chorus-snapshot-diff", newest
    logs = [p for p in spark.executor_logs() if p.parent.parent.name == newest["id"]]
    assert logs and any(p.stat().st_size > 0 for p in logs), (newest, spark.executor_logs())
    # the executor took this code (chorus_spark) from the driver
    fetched = {f.name for p in logs for f in p.parent.iterdir()}
    assert "chorus_spark.zip" in fetched, fetched


def _progress_shown(err: str) -> None:
    """The job's own progress line reached the user, and Spark's chatter did not."""
    assert any(line.startswith("Spark: ") and " tasks on spark://" in line for line in err.splitlines()), err[-3000:]
    assert " INFO " not in err and "\tat " not in err, err[-3000:]


@pytest.fixture(scope="module")
def sc_types(cluster: Cluster) -> Iterator[str]:
    """sc_types (tr_types' columns) with 1500 rows on every node, for this module's tests."""
    cluster.sql_all("DROP TABLE IF EXISTS sc_types")
    with cluster.connect(0) as c:
        c.execute(TYPES_TABLE.replace("tr_types", "sc_types"))
        c.execute(FILL.replace("tr_types", "sc_types"), (1, 1500))
    cluster.quiesce()
    yield "sc_types"
    cluster.sql_all("DROP TABLE IF EXISTS sc_types")


def test_total_recovery_with_spark_submit_on_a_standalone_cluster(cluster: Cluster, spark: StandaloneSpark,
                                                                   sc_types: str) -> None:
    with psycopg.connect(cluster.dsn(2), autocommit=True, options=OFF) as c:  # drift behind Chorus's back
        c.execute("DELETE FROM sc_types WHERE id BETWEEN 10 AND 29")
        c.execute("UPDATE sc_types SET note = 'drifted' WHERE id BETWEEN 700 AND 709")
        c.execute("INSERT INTO sc_types (id, note) VALUES (-5, 'only here')")
    before = len(spark.completed_apps())
    r = chorus("node", "join", "--total", "--dir", cluster.dir, cluster.nodes[2].name, "--range-rows", "500",
               "--copy-under-mb", "0", "--spark-master", spark.url, "--spark-submit", spark.spark_submit, "--json",
               timeout=240)
    assert r.returncode == 0, r.stderr[-3000:] + "\n" + spark.log_tail()
    out = json.loads(r.stdout)
    assert out["state"] == "online"
    t = next(t for t in out["total_recovery"]["tables"] if t["table"] == "public.sc_types")
    assert t["mode"] == "diff" and (t["inserts"], t["updates"], t["deletes"]) == (20, 10, 1), t
    _progress_shown(r.stderr)
    _ran_on_the_worker(spark, before, r.stderr)
    cluster.assert_identical()


@pytest.mark.parametrize("how", ["spark-submit", "in-process"])
def test_verify_on_a_standalone_cluster(cluster: Cluster, spark: StandaloneSpark, sc_types: str, how: str) -> None:
    cluster.quiesce()
    args = ["verify", "--dir", cluster.dir, "--spark-master", spark.url]
    if how == "spark-submit":
        args += ["--spark-submit", spark.spark_submit]
    with psycopg.connect(cluster.dsn(1), autocommit=True, options=OFF) as c:
        c.execute("UPDATE sc_types SET note = 'changed behind chorus' WHERE id = 1234")
    try:
        before = len(spark.completed_apps())
        r = chorus(*args, "--json", timeout=240)
        assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:] + "\n" + spark.log_tail()
        out: dict[str, Any] = json.loads(r.stdout)
        t = next(t for t in out["tables"] if t["table"] == "public.sc_types" and t["node"] == cluster.nodes[1].name)
        assert t["rows_differing"] == 1 and t["differs"] == 1 and t["sample"][0]["kind"] == "differs", t
        _ran_on_the_worker(spark, before, r.stderr)
        if how == "spark-submit":
            _progress_shown(r.stderr)
    finally:
        with cluster.connect(0) as c:
            note = c.execute("SELECT note FROM sc_types WHERE id = 1234").fetchone()
        with psycopg.connect(cluster.dsn(1), autocommit=True, options=OFF) as c:
            c.execute("UPDATE sc_types SET note = %s WHERE id = 1234", (note[0] if note else None,))
