"""Total recovery and verify: the parts around the Spark snapshot diff (docs/RECOVERY.md).

Total recovery of a joiner whose coordinator is stopped:
1. the donor exports a snapshot in a REPEATABLE READ transaction and reports its GID
   (``chorus.snapshot_gid()``: commits happen in GID order, so the snapshot holds exactly the
   GIDs up to it); the transaction stays open until the diff has read what it needs;
2. the joiner's schema, roles and extensions are made the donor's (``chorus.total.schema``:
   ``pg_dump --schema-only --snapshot`` with owners and privileges, compared with the joiner's);
3. the Spark job (``chorus_spark.job``) diffs every replicated table and COPYs the delta into
   unlogged staging tables on the joiner;
4. each table is merged in one transaction (deletes, then inserts), sequences are moved past
   the donor's, and ``chorus.adopt_gid`` makes the snapshot GID the joiner's durable GID;
5. the coordinator starts, joins and catches up from the snapshot GID by partial recovery.

Verify holds commits above one GID on every node (``chorus.hold_commits``), waits until each has
committed everything certified up to it, exports a snapshot on each (all at the same GID), lets
commits go on, and runs the job in ``verify`` mode against the first node.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from collections import deque
from pathlib import Path
from typing import Any, Callable, Optional

import psycopg
from psycopg import sql

from chorus.total import schema as total_schema
from chorus.total.conn import Endpoint, make_private_dir, redact, write_private
from chorus_spark import merkle

__all__ = ["Endpoint", "TotalRecoveryError", "total_recover", "verify"]

STAGE_SCHEMA = "chorus_recovery"
OFF = "-c chorus.capture=off -c chorus.replicate_ddl=off"

Say = Callable[[str], None]


class TotalRecoveryError(Exception):
    pass


def _one_line_errors(f: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """A donor or joiner that fails mid-way (its server gone, a COPY stream cut, its schema not
    restorable) ends the command with a TotalRecoveryError that names it, not a traceback."""
    @functools.wraps(f)
    def run(*args: Any, **kw: Any) -> dict[str, Any]:
        try:
            return f(*args, **kw)
        except (merkle.DiffError, total_schema.SchemaSyncError) as e:
            raise TotalRecoveryError(str(e)) from e
        except psycopg.Error as e:
            raise TotalRecoveryError(f"a database failed mid-way: {str(e).strip()}") from e
    return run


# The extension's tables that are data of the site (docs/LINKS.md, sections 5 and 9): written by the
# apply of link writesets, the same on every node at every GID, and what a node's next link
# decisions read. A rebuilt node must hold the donor's, or it would decide conflicts differently.
SITE_TABLES = ("chorus.link_position", "chorus.link_stamp", "chorus.link_exceptions")

_TABLES = """
SELECT n.nspname, c.relname, c.oid
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p')
   AND (chorus.replicable(c.oid)
        OR c.oid IN (SELECT to_regclass(t)::oid FROM unnest(%s::text[]) t))
   AND EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) = %s
 ORDER BY 1, 2
"""

_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attgenerated <> ''
  FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
"""

_KEY = """
SELECT a.attname FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
 WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord
"""



def describe_tables(conn: psycopg.Connection[Any], keyed: bool = True) -> dict[str, dict[str, Any]]:
    """Replicated tables with a primary key (``keyed``) or without one (nothing to diff by: they
    are copied whole), and the extension's site tables (SITE_TABLES, where this version of the
    extension has them): ``schema.name`` -> schema, name, columns, key."""
    out: dict[str, dict[str, Any]] = {}
    for nsp, rel, oid in conn.execute(_TABLES, (list(SITE_TABLES), keyed)).fetchall():
        cols = [{"name": n, "type": t, "generated": g} for n, t, g in conn.execute(_COLUMNS, (oid,)).fetchall()]
        key = [r[0] for r in conn.execute(_KEY, (oid,)).fetchall()] if keyed else []
        out[f"{nsp}.{rel}"] = {"schema": nsp, "name": rel, "oid": oid, "columns": cols, "key": key}
    return out


def _stored(t: dict[str, Any]) -> sql.Composed:
    """The table's columns that hold data (generated ones are computed), as a column list."""
    return sql.SQL(", ").join(sql.Identifier(c["name"]) for c in t["columns"] if not c["generated"])


def _qualified(t: dict[str, Any]) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(t["schema"]), sql.Identifier(t["name"]))


class Snapshot:
    """A snapshot exported by a node, held (its transaction open) until closed. It is at one
    GID: it sees every certified GID up to it and none after (with several commit lanes a
    snapshot taken while a commit above the watermark is visible is refused, SQLSTATE 40001;
    :func:`donor_snapshot` waits for a moment when it is not)."""

    def __init__(self, ep: Endpoint) -> None:
        self.endpoint = ep
        self.conn = psycopg.connect(ep.dsn, autocommit=True)
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            row = self.conn.execute("SELECT pg_export_snapshot(), chorus.snapshot_gid(), "
                                    "pg_current_snapshot()::text").fetchone()
        except psycopg.Error:
            self.conn.close()
            raise
        assert row is not None
        self.name: str = row[0]
        self.gid: int = int(row[1])
        self.text: str = row[2]

    def close(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
        finally:
            self.conn.close()


def donor_snapshot(ep: Endpoint, timeout_s: float = 30.0) -> Snapshot:
    """A snapshot of the donor at one GID. With several commit lanes, commits above the
    watermark may be visible: then the commits above the highest GID committed so far are held
    until the watermark reaches it, and the snapshot is taken at that point."""
    try:
        return Snapshot(ep)
    except psycopg.errors.SerializationFailure:
        pass
    except psycopg.OperationalError as e:
        raise TotalRecoveryError(f"cannot connect to the donor {ep.name} ({redact(ep.dsn)}): "
                                 f"{str(e).strip()}") from e
    with psycopg.connect(ep.dsn, autocommit=True) as c:
        deadline = time.monotonic() + timeout_s
        row = c.execute("SELECT max_done FROM chorus.lane_state()").fetchone()
        assert row is not None
        top = int(row[0])
        c.execute("SELECT chorus.hold_commits(%s, %s)", (top, int(timeout_s * 1000)))
        try:
            while True:
                row = c.execute("SELECT chorus.committed_gid()").fetchone()
                if row is not None and int(row[0]) >= top:
                    return Snapshot(ep)
                if time.monotonic() > deadline:
                    raise TotalRecoveryError(f"{ep.name}: its commits did not reach GID {top} in {timeout_s:.0f} s")
                time.sleep(0.01)
        finally:
            c.execute("SELECT chorus.release_commits()")


def run_job(plan: dict[str, Any], workdir: Path, say: Say, spark_submit: Optional[str] = None) -> dict[str, Any]:
    """The Spark job: in this process (Spark's driver here, on ``plan['master']``: ``local[*]`` or
    a cluster's master) or through spark-submit (client deploy mode, on that master)."""
    plan_path = workdir / "plan.json"
    plan["result"] = str(workdir / "result.json")
    write_private(plan_path, json.dumps(plan))  # it holds the connection strings, passwords included
    if spark_submit is None:
        from chorus_spark.job import JobError, run

        try:
            out: dict[str, Any] = run(plan, say=say)
            return out
        except JobError as e:
            raise TotalRecoveryError(str(e)) from e
    cmd, env = submit_command(plan, plan_path, workdir, spark_submit)
    tail: deque[str] = deque(maxlen=JOB_TAIL_LINES)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", env=env)
    except OSError as e:
        raise TotalRecoveryError(f"cannot run {spark_submit}: {e}") from e
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the job's progress, as it comes (its stdout too: ours may carry --json)
            line = line.rstrip("\n")
            tail.append(line)
            if not _spark_noise(line):
                say(line)
        code = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: the job goes too
            proc.kill()
            proc.wait(timeout=30)
    if code != 0:
        raise TotalRecoveryError(f"the Spark job failed: {spark_submit} exited with status {code}; its last lines:\n"
                                 + "\n".join(tail))
    try:
        result: dict[str, Any] = json.loads(Path(plan["result"]).read_text())
    except (OSError, ValueError) as e:
        raise TotalRecoveryError(f"the Spark job ended without a result ({e}); its last lines:\n"
                                 + "\n".join(tail)) from e
    return result


JOB_TAIL_LINES = 40
# Spark's chatter, Java stack frames (the failure message keeps them) and a harmless exception a
# standalone master's client may print as the job's context stops
_NOISE = re.compile(r"^(\d\d/\d\d/\d\d )?\d\d:\d\d:\d\d (INFO|DEBUG|TRACE) |^(Setting default log level|"
                    r"To adjust logging level|Using Spark's default log4j profile)|^\s+(at |\.\.\. \d+ more)|"
                    r"^java\.util\.concurrent\.RejectedExecutionException: .* rejected from .*Shutting down")


def _spark_noise(line: str) -> bool:
    return not line.strip() or bool(_NOISE.match(line))


def submit_command(plan: dict[str, Any], plan_path: Path, workdir: Path,
                   spark_submit: str) -> tuple[list[str], dict[str, str]]:
    """spark-submit's command and environment. The executors get ``chorus_spark`` as a zip of
    this code (``--py-files``); they run ``PYSPARK_PYTHON``
    (default: this Python, which has psycopg). The driver runs here (client mode): on
    ``local[*]`` or a master on this machine's loopback it binds and advertises 127.0.0.1; for a
    remote master set ``spark.driver.host`` (spark-defaults.conf) if this host's name does not
    reach it. Anything else (executor memory, cores) comes from Spark's own configuration."""
    from chorus_spark import launch

    master = str(plan.get("master", "local[*]"))
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    cmd = [spark_submit, "--master", master, "--deploy-mode", "client", "--name", "chorus-snapshot-diff",
           "--py-files", launch.package(workdir),
           "--driver-java-options", launch.log_java_options(),
           "--conf", "spark.executor.extraJavaOptions=-Duser.timezone=UTC"]
    if launch.is_local(master) or launch.is_loopback(master):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if launch.is_loopback(master):
        cmd += ["--conf", "spark.driver.host=127.0.0.1"]
    return [*cmd, launch.entry(workdir), str(plan_path)], env


def _same_shape(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return ([(c["name"], c["type"], c["generated"]) for c in a["columns"]] ==
            [(c["name"], c["type"], c["generated"]) for c in b["columns"]] and a["key"] == b["key"])


def make_stages(conn: psycopg.Connection[Any], tables: list[dict[str, Any]]) -> dict[str, str]:
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(STAGE_SCHEMA)))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(STAGE_SCHEMA)))
    stages: dict[str, str] = {}
    for i, t in enumerate(tables, start=1):
        stage = sql.Identifier(STAGE_SCHEMA, f"stage_{i}")
        conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
            stage, _stored(t), _qualified(t)))
        conn.execute(sql.SQL('ALTER TABLE {} ADD COLUMN _chorus_op "char"').format(stage))
        stages[f"{t['schema']}.{t['name']}"] = f'"{STAGE_SCHEMA}"."stage_{i}"'
    conn.commit()
    return stages


def merge(conn: psycopg.Connection[Any], t: dict[str, Any], stage: int) -> int:
    """Apply one table's staged delta in one transaction: deletes and updated rows out, then
    inserts and updated rows in. Triggers, foreign-key checks and CHECK constraints do not fire
    (the delta comes from a consistent snapshot of rows that passed them)."""
    st = sql.Identifier(STAGE_SCHEMA, f"stage_{stage}")
    match = sql.SQL(" AND ").join(sql.SQL("t.{0} = s.{0}").format(sql.Identifier(k)) for k in t["key"])
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        again = merkle.checks_off(conn, _qualified(t))  # the donor's rows passed them already
        d = conn.execute(sql.SQL("DELETE FROM {} t USING {} s WHERE s._chorus_op IN ('D', 'U') AND {}").format(
            _qualified(t), st, match)).rowcount
        i = conn.execute(sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {} "
                                 "WHERE _chorus_op IN ('I', 'U')").format(
            _qualified(t), _stored(t), _stored(t), st)).rowcount
        for stmt in again:
            conn.execute(stmt)
    return d + i


_SEQUENCES = """
SELECT s.seqrelid::regclass::text, n.nspname, c.relname, s.seqstart, s.seqincrement,
       (SELECT last_value FROM pg_sequences q WHERE q.schemaname = n.nspname AND q.sequencename = c.relname)
  FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'chorus')
"""


def move_sequences(snap: Snapshot, conn: psycopg.Connection[Any]) -> int:
    """Every sequence of the joiner continues in its own node's class (chorus.spread_sequence),
    past the value the donor's sequence had reached."""
    donor = {(r[1], r[2]): r for r in snap.conn.execute(_SEQUENCES).fetchall()}
    kd = int(snap.conn.execute("SELECT current_setting('chorus.node_number')").fetchone()[0])  # type: ignore[index]
    kj = int(conn.execute("SELECT current_setting('chorus.node_number')").fetchone()[0])  # type: ignore[index]
    m = int(conn.execute("SELECT current_setting('chorus.max_nodes')").fetchone()[0])  # type: ignore[index]
    moved = 0
    for key, (name, _, _, dstart, dinc, dlast) in donor.items():
        row = conn.execute("SELECT s.seqstart, s.seqincrement, (SELECT last_value FROM pg_sequences q WHERE "
                           "q.schemaname = %s AND q.sequencename = %s) FROM pg_sequence s "
                           "WHERE s.seqrelid = to_regclass(%s)", (key[0], key[1], name)).fetchone()
        if row is None:
            continue
        jstart, jinc, jlast = row
        if m > 1 and kd != kj and jstart == dstart and dinc > 0:
            jstart = dstart + (kj - kd) * (dinc // m)  # a copy of the donor's: into this node's class
        above = max(v for v in (dlast, jlast, jstart - 1) if v is not None)
        nxt = jstart + max(0, math.ceil((above + 1 - jstart) / jinc)) * jinc if jinc > 0 else jstart
        conn.execute(sql.SQL("ALTER SEQUENCE {} START WITH {} RESTART WITH {}").format(
            sql.SQL(name), sql.Literal(jstart), sql.Literal(nxt)))
        moved += 1
    conn.commit()
    return moved


SMALL_BYTES = 16 << 20  # tables smaller than this are copied, not diffed
SPARK_ROWS = 5_000_000  # with --spark-master auto: rows to compare above which Spark runs the rows level


class Progress:
    """Progress of a total recovery, phase by phase: a line for people (``say``) and an event
    kept for programs (the result's ``events``: phase, seconds since the start, the figures)."""

    def __init__(self, say: Say) -> None:
        self.say = say
        self.events: list[dict[str, Any]] = []
        self.started = time.monotonic()

    def __call__(self, phase: str, message: str, **fields: Any) -> None:
        self.events.append({"phase": phase, "t": round(time.monotonic() - self.started, 2), "message": message,
                            **fields})
        self.say(message)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def analyse_table(donor: Endpoint, snap: "Snapshot", joiner: Endpoint, t: dict[str, Any],
                  progress: Progress, range_rows: int, small_bytes: int) -> dict[str, Any]:
    """Copy or diff (merkle.analyse), reported."""
    spec = {k: v for k, v in t.items() if k not in ("oid", "bytes", "rows")}
    out = merkle.analyse(donor.dsn, snap.name, joiner.dsn, spec, t["rows"], t["bytes"], small_bytes,
                         range_rows=range_rows)
    if "leaves" in out:
        progress("compare", f"{out['table']}: {out['ranges_differing']} of {out['ranges']} ranges differ, "
                 f"{out['leaves_differing']} of {out['leaves']} leaves ({_mb(out['bytes_donor'])} of hashes "
                 "read from the donor)", **{k: v for k, v in out.items() if k != "tasks"})
    return out


def table_sizes(conn: psycopg.Connection[Any], tables: dict[str, dict[str, Any]]) -> None:
    """Each table's size on disk and rows (the planner's estimate, counted when never analysed)."""
    for t in tables.values():
        row = conn.execute("SELECT pg_relation_size(%s), reltuples FROM pg_class WHERE oid = %s",
                           (t["oid"], t["oid"])).fetchone()
        assert row is not None
        t["bytes"], rows = int(row[0]), float(row[1])
        if rows < 0 or t["bytes"] < SMALL_BYTES:  # (small: counting is cheap and the estimate may be off)
            rows = float(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_qualified(t))).fetchone()[0])  # type: ignore[index]
        t["rows"] = int(rows)


def run_tasks(tasks: list[dict[str, Any]], master: str, spark_submit: Optional[str], parallelism: int,
              workdir: Path, progress: Progress) -> list[dict[str, Any]]:
    """The rows level: every task, in this process's threads or on Spark executors (``master``:
    ``auto`` picks Spark when there are more than SPARK_ROWS rows to compare, ``none`` never)."""
    if not tasks:
        return []
    rows = sum(task["nleaves"] * task["cut"]["leaf_rows"] for task in tasks)
    spark = master not in ("auto", "none") or spark_submit is not None or (master == "auto" and rows > SPARK_ROWS)
    where = f"Spark ({'local[*]' if master in ('auto', 'none') else master})" if spark else \
        f"{parallelism} threads of this process"
    progress("rows", f"comparing the rows of {sum(t['nleaves'] for t in tasks)} leaves (about {rows} rows, "
             f"{len(tasks)} tasks) in {where}", tasks=len(tasks), rows=rows)
    if not spark:
        with ThreadPoolExecutor(parallelism) as pool:
            return list(pool.map(merkle.run_task, tasks))
    plan = {"mode": "tasks", "master": "local[*]" if master in ("auto", "none") else master,
            "parallelism": parallelism, "tasks": tasks}
    out: list[dict[str, Any]] = run_job(plan, workdir, progress.say, spark_submit)["results"]
    return out


@_one_line_errors
def total_recover(donor: Endpoint, joiner: Endpoint, say: Say, range_rows: int = 1000, small_bytes: int = SMALL_BYTES,
                  master: str = "auto", spark_submit: Optional[str] = None,
                  parallelism: Optional[int] = None) -> dict[str, Any]:
    """Steps 1-4 (the joiner's coordinator must be stopped). Returns the snapshot GID and what
    was done per table. A range of the diff holds about ``range_rows`` rows."""
    progress = Progress(say)
    parallelism = parallelism or max(2, os.cpu_count() or 2)
    workdir = make_private_dir("chorus-total-")
    try:
        snap = donor_snapshot(donor)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    progress("snapshot", f"donor {donor.name}: snapshot {snap.name} at GID {snap.gid}", gid=snap.gid)
    try:
        with psycopg.connect(joiner.dsn, options=OFF, autocommit=True) as conn:
            dtables = describe_tables(snap.conn)
            dkeyless = describe_tables(snap.conn, keyed=False)
            for line in total_schema.sync_schema(donor, snap.name, joiner, conn):
                progress("schema", line)
            for line in total_schema.sync_capture(snap.conn, conn):
                progress("schema", line)
            table_sizes(snap.conn, dtables)
            table_sizes(snap.conn, dkeyless)
            progress("plan", f"{len(dtables)} tables with a primary key ({_mb(sum(t['bytes'] for t in dtables.values()))}), "
                     f"{len(dkeyless)} without", tables=len(dtables) + len(dkeyless))
            with ThreadPoolExecutor(parallelism) as pool:
                plans = list(pool.map(lambda t: analyse_table(donor, snap, joiner, t, progress, range_rows, small_bytes),
                                      dtables.values()))
            for p in plans:
                progress("plan", f"{p['table']}: {p['mode']}" + (f" ({p['why']})" if p.get("why") else ""),
                         **{k: v for k, v in p.items() if k != "tasks"})
            diffed = [dtables[p["table"]] for p in plans if p["mode"] == "diff"]
            stages = make_stages(conn, diffed)
            base = {"donor_dsn": donor.dsn, "snapshot": snap.name, "joiner_dsn": joiner.dsn}
            tasks = [{**task, **base, "stage": stages[p["table"]]} for p in plans if p["mode"] == "diff"
                     for task in p["tasks"]]
            copies = [{**base, "bytes": t["bytes"], "table": {k: v for k, v in t.items() if k not in ("oid", "bytes", "rows")}}
                      for t in [dtables[p["table"]] for p in plans if p["mode"] == "copy"] + list(dkeyless.values())]
            with ThreadPoolExecutor(parallelism) as pool:
                copying = [pool.submit(merkle.copy_table, c) for c in copies]
                results = run_tasks(tasks, master, spark_submit, parallelism, workdir, progress)
                copied = []
                for f in copying:
                    c = f.result()
                    copied.append(c)
                    progress("copy", f"{c['table']}: copied {c['copied']} rows ({_mb(c['bytes_donor'])} read)", **c)
            moved_seq = move_sequences(snap, conn)
            mviews = total_schema.populated_matviews(snap.conn)
            snap.close()
            per_table: dict[str, dict[str, Any]] = {}
            for r in results:
                acc = per_table.setdefault(r["table"], {"inserts": 0, "updates": 0, "deletes": 0,
                                                        "bytes_donor": 0, "bytes_joiner": 0})
                for k in acc:
                    acc[k] += r[k]
            for i, t in enumerate(diffed, start=1):
                label = f"{t['schema']}.{t['name']}"
                n = merge(conn, t, i)
                progress("merge", f"merged {label}: {n} rows written", table=label, rows=n)
            for line in total_schema.refresh_matviews(conn, mviews):
                progress("merge", line)
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(STAGE_SCHEMA)))
            conn.execute("SELECT chorus.adopt_gid(%s)", (snap.gid,))
            conn.commit()
    finally:
        if not snap.conn.closed:
            snap.close()
        shutil.rmtree(workdir, ignore_errors=True)
    tables = []
    for p in plans:
        row = {k: v for k, v in p.items() if k != "tasks"}
        row.update(per_table.get(p["table"], {}))
        for c in copied:
            if c["table"] == p["table"]:
                row.update(copied=c["copied"], bytes_donor=row.get("bytes_donor", 0) + c["bytes_donor"])
        tables.append(row)
    tables += [{"table": c["table"], "mode": "copy", "why": "no primary key", **c} for c in copied
               if c["table"] in dkeyless]
    total_bytes = sum(t.get("bytes_donor", 0) for t in tables)
    size = sum(t["bytes"] for t in dtables.values()) + sum(t["bytes"] for t in dkeyless.values())
    rows = {k: sum(t.get(k, 0) for t in tables) for k in ("inserts", "updates", "deletes", "copied")}
    elapsed = round(time.monotonic() - progress.started, 2)
    progress("done", f"{joiner.name} now holds the donor's snapshot at GID {snap.gid}: {rows['copied']} rows copied, "
             f"{rows['inserts']} inserts, {rows['updates']} updates, {rows['deletes']} deletes, {moved_seq} "
             f"sequences moved; {_mb(total_bytes)} read from the donor, whose tables hold {_mb(size)} "
             f"({elapsed:.1f} s)", gid=snap.gid, bytes_donor=total_bytes, table_bytes=size, **rows)
    return {"gid": snap.gid, "donor": donor.name, "tables": tables, "sequences": moved_seq,
            "bytes_donor": total_bytes, "table_bytes": size, "elapsed_s": elapsed, "events": progress.events}


# ---- verify ------------------------------------------------------------------------------------

HOLD_MS = 60000


def common_snapshots(nodes: list[tuple[Endpoint, str]], say: Say, timeout: float = 60) -> list[Snapshot]:
    """Snapshots of every node at one GID. ``nodes``: (endpoint, admin socket)."""
    from chorus.admin import admin_request

    margin = 20
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        top = max(int(admin_request(a)["status"]["delivered_gid"]) for _, a in nodes)
        hold = top + margin
        conns = [psycopg.connect(ep.dsn, autocommit=True) for ep, _ in nodes]
        try:
            past = [int(c.execute("SELECT chorus.hold_commits(%s, %s)", (hold, HOLD_MS)).fetchone()[0])  # type: ignore[index]
                    for c in conns]
            if max(past) > hold:
                margin *= 4
                continue
            while time.monotonic() < deadline:
                # every node has committed what it certified up to the hold; snapshots agree once
                # each has also delivered the same writesets below it (else: again, still held)
                if all(admin_request(a, "settled", upto=hold)["settled"] for _, a in nodes):
                    snaps = [Snapshot(ep) for ep, _ in nodes]
                    if len({s.gid for s in snaps}) == 1:
                        say(f"snapshots of {', '.join(ep.name for ep, _ in nodes)} at GID {snaps[0].gid}")
                        return snaps
                    for s in snaps:
                        s.close()
                time.sleep(0.05)
        finally:
            for c in conns:
                try:
                    c.execute("SELECT chorus.release_commits()")
                finally:
                    c.close()
    raise TotalRecoveryError("could not take snapshots of every node at one GID in time")


@_one_line_errors
def verify(nodes: list[tuple[Endpoint, str]], say: Say, range_rows: int = 1000, master: str = "auto",
           spark_submit: Optional[str] = None) -> dict[str, Any]:
    """Compare every node with the first at one snapshot GID with the Merkle diff (never copying).
    Differences per table and node, with up to merkle.SAMPLE_KEYS keys of each kind."""
    progress = Progress(say)
    parallelism = max(2, os.cpu_count() or 2)
    snaps = common_snapshots(nodes, say)
    workdir = make_private_dir("chorus-verify-")
    try:
        ref = describe_tables(snaps[0].conn)
        table_sizes(snaps[0].conn, ref)
        schema_diffs = []
        for s in snaps[1:]:
            other = describe_tables(s.conn)
            for label in sorted(set(ref) | set(other)):
                if label not in other:
                    schema_diffs.append({"table": label, "node": s.endpoint.name, "problem": "missing"})
                elif label not in ref:
                    schema_diffs.append({"table": label, "node": s.endpoint.name, "problem": "extra table"})
                elif not _same_shape(ref[label], other[label]):
                    schema_diffs.append({"table": label, "node": s.endpoint.name, "problem": "columns differ"})
        bad = {(d["table"], d["node"]) for d in schema_diffs}
        pairs = [(s, t) for s in snaps[1:] for label, t in ref.items() if (label, s.endpoint.name) not in bad]

        def analyse(pair: tuple[Snapshot, dict[str, Any]]) -> dict[str, Any]:
            s, t = pair
            spec = {k: v for k, v in t.items() if k not in ("oid", "bytes", "rows")}
            out = merkle.analyse(snaps[0].endpoint.dsn, snaps[0].name, s.endpoint.dsn, spec, t["rows"], t["bytes"],
                                 0, joiner_snapshot=s.name, may_copy=False, range_rows=range_rows)
            progress("compare", f"{out['table']} on {s.endpoint.name}: {out['ranges_differing']} of {out['ranges']} "
                     f"ranges differ, {out['leaves_differing']} of {out['leaves']} leaves", node=s.endpoint.name,
                     **{k: v for k, v in out.items() if k != "tasks"})
            return {**out, "node": s.endpoint.name, "tasks": [
                {**task, "donor_dsn": snaps[0].endpoint.dsn, "snapshot": snaps[0].name,
                 "joiner_dsn": s.endpoint.dsn, "joiner_snapshot": s.name, "node": s.endpoint.name}
                for task in out["tasks"]]}

        with ThreadPoolExecutor(parallelism) as pool:
            plans = list(pool.map(analyse, pairs))
        results = run_tasks([task for p in plans for task in p["tasks"]], master, spark_submit, parallelism,
                            workdir, progress)
    finally:
        for s in snaps:
            s.close()
        shutil.rmtree(workdir, ignore_errors=True)
    tables = []
    for p in plans:
        mine = [r for r in results if r["table"] == p["table"] and r["node"] == p["node"]]
        key = next(t["key"] for t in ref.values() if f"{t['schema']}.{t['name']}" == p["table"])
        found = sorted((list(k), kind) for r in mine for kind, keys in r["sample"].items() for k in keys)
        sample = [{"key": dict(zip(key, k)), "kind": kind} for k, kind in found[:merkle.SAMPLE_KEYS]]
        missing, extra, differs = (sum(r[k] for r in mine) for k in ("inserts", "deletes", "updates"))
        tables.append({"table": p["table"], "node": p["node"], "reference": nodes[0][0].name, "ranges": p["ranges"],
                       "ranges_differing": p["ranges_differing"], "leaves": p["leaves"],
                       "leaves_differing": p["leaves_differing"], "rows_differing": missing + extra + differs,
                       "missing": missing, "extra": extra, "differs": differs, "sample": sample,
                       "bytes_read": p["bytes_donor"] + p["bytes_joiner"] + sum(r["bytes_donor"] + r["bytes_joiner"]
                                                                                 for r in mine)})
    differing = [t for t in tables if t["rows_differing"]]
    return {"gid": snaps[0].gid, "reference": nodes[0][0].name, "tables": tables,
            "schema_differences": schema_diffs, "identical": not differing and not schema_diffs}
