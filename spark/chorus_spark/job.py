"""The Spark job of total recovery and verify: the rows level of the Merkle diff
(``chorus_spark.merkle.run_task``), one Spark task per group of leaf intervals.

Run by ``chorus`` (a Spark session in its process, ``--spark-master URL``) or by spark-submit
against any master:

    spark-submit spark/submit_job.py PLAN.json

The plan (JSON, written by ``chorus.total.recover`` into a directory only its user can read: it holds
the connection strings) lists the tasks: the table, its cut into leaves, the leaf intervals,
both sides' connection strings and snapshots, and for recovery the joiner's staging table. Each
task opens its own libpq sessions from the executor (the donor's importing the exported
snapshot), so the executors need the ``pgchorus`` Python environment (psycopg). The result, the
tasks' counts and bytes read, is written to the plan's ``result`` path.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any, Callable, Optional

from pyspark.sql import SparkSession

from chorus_spark import launch, merkle


class JobError(Exception):
    pass


def session(master: str, parallelism: int) -> SparkSession:
    """The job's session. On ``local[*]`` or a ``spark://`` master on this machine the driver binds
    and advertises 127.0.0.1; elsewhere Spark's own choice (``SPARK_LOCAL_IP``,
    ``spark.driver.host`` in spark-defaults.conf) stands. The executors run ``PYSPARK_PYTHON``
    (default: this Python), which needs psycopg: each task opens its own libpq sessions."""
    loopback = launch.is_loopback(master)
    if launch.is_local(master) or loopback:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = (SparkSession.builder.appName("chorus-snapshot-diff").master(master)
         .config("spark.default.parallelism", str(max(2, parallelism)))
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.extraJavaOptions", launch.log_java_options())
         .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC"))
    if loopback:
        b = b.config("spark.driver.host", "127.0.0.1")
    return b.getOrCreate()


def ship_package(spark: SparkSession, directory: str) -> None:
    """Executors outside the driver's JVM import ``chorus_spark`` from a zip of this code, unless
    spark-submit already ships one (``--py-files``)."""
    if launch.is_local(spark.sparkContext.master or "local"):
        return
    if "chorus_spark" in spark.sparkContext.getConf().get("spark.submit.pyFiles", ""):
        return
    spark.sparkContext.addPyFile(launch.package(directory))


def run(plan: dict[str, Any], spark: Optional[SparkSession] = None,
        say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict[str, Any]:
    if plan.get("mode") != "tasks":
        raise JobError(f"unknown job mode {plan.get('mode')!r} (this job runs 'tasks')")
    tasks = plan["tasks"]
    own = spark is None
    spark = spark or session(plan.get("master", "local[*]"), int(plan.get("parallelism", 2)))
    spark.sparkContext.setLogLevel("ERROR")
    shipped = tempfile.TemporaryDirectory(prefix="chorus-spark-")
    try:
        ship_package(spark, shipped.name)
        say(f"Spark: {len(tasks)} tasks on {spark.sparkContext.master}")
        try:
            results = spark.sparkContext.parallelize(tasks, max(1, len(tasks))).map(merkle.run_task).collect()
        except Exception as e:  # a task's error comes back wrapped in Py4J's
            raise JobError(f"a task failed: {str(e).strip().splitlines()[-1] if str(e).strip() else e!r}") from e
        return {"mode": "tasks", "results": results}
    finally:
        if own:
            spark.stop()
        shipped.cleanup()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: submit_job.py PLAN.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        plan = json.load(f)
    try:
        result = run(plan)
    except JobError as e:
        print(f"chorus diff job: {e}", file=sys.stderr)
        return 1
    with open(plan["result"], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
