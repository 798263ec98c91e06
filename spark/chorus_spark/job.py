"""The snapshot-diff job: ``recover`` turns a joiner into a donor's snapshot, ``verify`` compares
nodes at one snapshot GID.

Run by ``chorus`` (Spark in ``local[*]``) or by spark-submit against any master:

    spark-submit --jars /usr/share/java/postgresql.jar spark/submit_job.py PLAN.json

The plan (JSON, written by ``chorus.total``) names the sources (JDBC URL, user, exported
snapshot and its GID; the first is the reference), the tables (columns, key, range bounds) and,
for ``recover``, the target's DSN and staging tables. Per table the job compares range summaries,
then per-row hashes within the ranges that differ, then reads the reference's full rows only for
the keys that differ. ``recover`` copies them into the target's staging table (COPY, from the
executors); ``chorus`` merges them. ``verify`` reports the differing keys. The result is written
to the plan's ``result`` path; progress goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Iterable, Optional

from pyspark.sql import DataFrame, SparkSession

from chorus_spark import diff
from chorus_spark.sqlgen import SESSION_SETTINGS, Table, chunks, intervals, literal

MAX_RANGES_PER_READ = 64  # consecutive differing ranges read as one interval
KEYS_PER_FETCH = 500  # keys per IN list when reading the reference's rows
SAMPLE_ROWS = 20  # differing keys listed per table and node by verify


class JobError(Exception):
    pass


LOG4J = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "log4j2.properties")


def session(master: str, jdbc_jar: str, parallelism: int) -> SparkSession:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    java = f"-Duser.timezone=UTC -Dlog4j.configurationFile=file:{LOG4J}"
    return (SparkSession.builder.appName("chorus-snapshot-diff").master(master)
            .config("spark.jars", jdbc_jar)
            .config("spark.sql.shuffle.partitions", str(max(2, parallelism)))
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.extraJavaOptions", java)
            .config("spark.executor.extraJavaOptions", java)
            .getOrCreate())


class Source:
    """One side of the diff: a database read over JDBC, at an exported snapshot if it has one."""

    def __init__(self, spark: SparkSession, d: dict[str, Any]) -> None:
        self.spark = spark
        self.name: str = d["name"]
        self.url: str = d["url"]
        self.snapshot: Optional[str] = d.get("snapshot")
        self.gid: Optional[int] = d.get("gid")
        self.snapshot_text: Optional[str] = d.get("snapshot_text")  # pg_current_snapshot() at export
        init = SESSION_SETTINGS
        if self.snapshot:
            # the reads run in one transaction at the snapshot (fetchsize > 0: no autocommit)
            init = ("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; "
                    f"SET TRANSACTION SNAPSHOT {literal(self.snapshot)}; " + init)
        # every connection property the plan gives (user, password, ssl, sslmode, sslrootcert,
        # sslcert, sslkey ...: chorus.totalconn maps the libpq connection string to them)
        self.props = {**{k: str(v) for k, v in (d.get("properties") or {}).items()},
                      "driver": "org.postgresql.Driver", "fetchsize": "10000", "sessionInitStatement": init}
        self.props.setdefault("user", d["user"])
        if d.get("password"):
            self.props.setdefault("password", d["password"])

    def read(self, query: str, predicates: Optional[list[str]] = None) -> DataFrame:
        if predicates:
            return self.spark.read.jdbc(self.url, query, predicates=predicates, properties=self.props)
        return self.spark.read.jdbc(self.url, query, properties=self.props)


def _summaries(src: Source, t: Table, parallelism: int) -> DataFrame:
    nranges = len(t.bounds) + 1
    step = max(1, -(-nranges // max(1, parallelism)))
    parts = [src.read(t.summary_query(lo, min(lo + step, nranges) if lo + step < nranges else None,
                                      check_snapshot=src.snapshot is not None))
             for lo in range(0, nranges, step)]
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def _check_snapshot(src: Source, summaries: list[Any]) -> None:
    if src.snapshot is None:
        return
    seen = {r["snap"] for r in summaries}
    if seen and seen != {src.snapshot_text}:
        raise JobError(f"{src.name}: the reads ran in snapshot {sorted(seen)}, not the exported one "
                       f"({src.snapshot_text}, GID {src.gid}): the JDBC sessions did not import it")


def _differing_keys(ref: Source, other: Source, t: Table, ids: list[int], parallelism: int) -> DataFrame:
    preds = [t.range_of(lo, hi if hi <= len(t.bounds) else None)
             for lo, hi in intervals(ids, MAX_RANGES_PER_READ)]
    groups = [" OR ".join(f"({p})" for p in g) for g in chunks(preds, max(1, -(-len(preds) // (parallelism * 2))))]
    return diff.classify(ref.read(t.hash_query(), groups), other.read(t.hash_query(), groups), t.key_aliases)


def compare_table(ref: Source, other: Source, t: Table, parallelism: int,
                  say: Callable[[str], None]) -> tuple[DataFrame, list[Any], int, int]:
    """Levels 1 and 2: (changes frame, their rows collected, ranges, ranges that differ)."""
    rs = _summaries(ref, t, parallelism).collect()
    os_ = _summaries(other, t, parallelism).collect()
    _check_snapshot(ref, rs)
    _check_snapshot(other, os_)
    spark = ref.spark
    schema = "rng long, n long, h string"
    ids = [r["rng"] for r in diff.differing_ranges(
        spark.createDataFrame([(r["rng"], r["n"], r["h"]) for r in rs], schema),
        spark.createDataFrame([(r["rng"], r["n"], r["h"]) for r in os_], schema)).collect()]
    nranges = len(t.bounds) + 1
    if not ids:
        return spark.createDataFrame([], ", ".join(f"{k} string" for k in t.key_aliases)
                                     + f", {diff.OP} string"), [], nranges, 0
    say(f"{t.label}: {len(ids)} of {nranges} key ranges differ on {other.name}; comparing their rows")
    changes = _differing_keys(ref, other, t, ids, parallelism).cache()
    return changes, changes.collect(), nranges, len(ids)


def _copy_partition(dsn: str, stage: str, columns: list[str], key_cols: list[int], rows: Iterable[Any]) -> None:
    """Executor side: COPY one partition of the delta into the target's staging table."""
    import psycopg

    cols = ", ".join('"' + c.replace('"', '""') + '"' for c in columns)
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.cursor() as cur:
            with cur.copy(f"COPY {stage} ({cols}, _chorus_op) FROM STDIN") as cp:
                for r in rows:
                    op = r[diff.OP]
                    vals = [r[f"_v{i}"] for i in range(len(columns))]
                    if op == diff.DELETE:
                        for j, ci in enumerate(key_cols):
                            vals[ci] = r[f"_k{j}"]
                    cp.write_row([*vals, op])


def recover_table(ref: Source, other: Source, t: Table, stage: str, target_dsn: str, parallelism: int,
                  say: Callable[[str], None]) -> dict[str, Any]:
    started = time.monotonic()
    changes, rows, nranges, ndiff = compare_table(ref, other, t, parallelism, say)
    counts = {diff.INSERT: 0, diff.UPDATE: 0, diff.DELETE: 0}
    for r in rows:
        counts[r[diff.OP]] += 1
    wanted = [[r[k] for k in t.key_aliases] for r in rows if r[diff.OP] != diff.DELETE]
    if rows:
        keys = t.key_aliases
        if wanted:
            preds = [t.keys_in(c) for c in chunks(wanted, KEYS_PER_FETCH)]
            full = ref.read(t.rows_query(), preds).drop(*[f"_t{i}" for i in range(len(t.key))])
        else:
            full = ref.spark.createDataFrame([], ", ".join(
                [f"{k} string" for k in keys] + [f"_v{i} string" for i in range(len(t.stored))]))
        delta = diff.delta_rows(changes, full, keys)
        stored = [c.name for c in t.stored]
        key_cols = [stored.index(k) for k in t.key]
        delta.foreachPartition(lambda part: _copy_partition(target_dsn, stage, stored, key_cols, part))
    changes.unpersist()
    say(f"{t.label}: {nranges} ranges, {ndiff} differ; staged {counts['I']} inserts, {counts['U']} updates, "
        f"{counts['D']} deletes ({time.monotonic() - started:.1f} s)")
    return {"table": t.label, "ranges": nranges, "ranges_differing": ndiff, "inserts": counts["I"],
            "updates": counts["U"], "deletes": counts["D"]}


def verify_table(ref: Source, other: Source, t: Table, parallelism: int,
                 say: Callable[[str], None]) -> dict[str, Any]:
    changes, rows, nranges, ndiff = compare_table(ref, other, t, parallelism, say)
    changes.unpersist()
    kinds = {diff.INSERT: "missing", diff.DELETE: "extra", diff.UPDATE: "differs"}
    sample = [{"key": dict(zip(t.key, (r[k] for k in t.key_aliases))), "kind": kinds[r[diff.OP]]}
              for r in sorted(rows, key=lambda r: [r[k] for k in t.key_aliases])[:SAMPLE_ROWS]]
    return {"table": t.label, "node": other.name, "reference": ref.name, "ranges": nranges,
            "ranges_differing": ndiff, "rows_differing": len(rows),
            "missing": sum(r[diff.OP] == diff.INSERT for r in rows),
            "extra": sum(r[diff.OP] == diff.DELETE for r in rows),
            "differs": sum(r[diff.OP] == diff.UPDATE for r in rows), "sample": sample}


def run(plan: dict[str, Any], spark: Optional[SparkSession] = None,
        say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict[str, Any]:
    parallelism = int(plan.get("parallelism", 4))
    own = spark is None
    spark = spark or session(plan.get("master", "local[*]"), plan["jdbc_jar"], parallelism)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        sources = [Source(spark, s) for s in plan["sources"]]
        tables = [Table.from_dict(d) for d in plan["tables"]]
        out: list[dict[str, Any]] = []
        for n, t in enumerate(tables, start=1):
            say(f"[{n}/{len(tables)}] {t.label}")
            if plan["mode"] == "recover":
                out.append(recover_table(sources[0], sources[1], t, plan["stages"][t.label], plan["target_dsn"],
                                         parallelism, say))
            else:
                for other in sources[1:]:
                    out.append(verify_table(sources[0], other, t, parallelism, say))
        return {"mode": plan["mode"], "tables": out}
    finally:
        if own:
            spark.stop()


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
