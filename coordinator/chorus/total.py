"""Total recovery and verify: the parts around the Spark snapshot diff (docs/RECOVERY.md).

Total recovery of a joiner whose coordinator is stopped:
1. the donor exports a snapshot in a REPEATABLE READ transaction and reports its GID
   (``chorus.snapshot_gid()``: commits happen in GID order, so the snapshot holds exactly the
   GIDs up to it); the transaction stays open until the diff has read what it needs;
2. the joiner's schema is brought to the donor's (``pg_dump --schema-only --snapshot``) for
   tables it lacks or whose columns differ; tables the donor does not have are dropped;
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

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import psycopg
from psycopg import sql

from chorus import totalschema
from chorus.totalconn import Endpoint, make_private_dir, redact, write_private

__all__ = ["Endpoint", "TotalRecoveryError", "total_recover", "verify"]

JDBC_JAR = "/usr/share/java/postgresql.jar"
PGBIN = Path("/usr/lib/postgresql/15/bin")
STAGE_SCHEMA = "chorus_recovery"
OFF = "-c chorus.capture=off -c chorus.replicate_ddl=off"

Say = Callable[[str], None]


class TotalRecoveryError(Exception):
    pass


_TABLES = """
SELECT n.nspname, c.relname, c.oid
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p') AND chorus.replicable(c.oid)
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



def copy_whole(snap: "Snapshot", conn: psycopg.Connection[Any], t: dict[str, Any]) -> None:
    """Replace a keyless table's rows on the joiner with the donor's, at the snapshot."""
    cols = _stored(t)
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(sql.SQL("TRUNCATE {}").format(_qualified(t)))
        with snap.conn.cursor().copy(sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT").format(cols, _qualified(t))) as src:
            with conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(_qualified(t), cols)) as dst:
                for data in src:
                    dst.write(data)


def describe_tables(conn: psycopg.Connection[Any], keyed: bool = True) -> dict[str, dict[str, Any]]:
    """Replicated tables with a primary key (``keyed``) or without one (nothing to diff by: they
    are copied whole): ``schema.name`` -> schema, name, columns, key."""
    out: dict[str, dict[str, Any]] = {}
    for nsp, rel, oid in conn.execute(_TABLES, (keyed,)).fetchall():
        cols = [{"name": n, "type": t, "generated": g} for n, t, g in conn.execute(_COLUMNS, (oid,)).fetchall()]
        key = [r[0] for r in conn.execute(_KEY, (oid,)).fetchall()] if keyed else []
        out[f"{nsp}.{rel}"] = {"schema": nsp, "name": rel, "oid": oid, "columns": cols, "key": key}
    return out


def _stored(t: dict[str, Any]) -> sql.Composed:
    """The table's columns that hold data (generated ones are computed), as a column list."""
    return sql.SQL(", ").join(sql.Identifier(c["name"]) for c in t["columns"] if not c["generated"])


def _qualified(t: dict[str, Any]) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(t["schema"]), sql.Identifier(t["name"]))


def range_bounds(conn: psycopg.Connection[Any], t: dict[str, Any], range_rows: int) -> list[str]:
    """Split the first key column into ranges of about ``range_rows`` rows (text forms)."""
    rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(_qualified(t))).fetchone()
    n = int(rows[0]) if rows else 0
    parts = math.ceil(n / max(1, range_rows))
    if parts <= 1:
        return []
    fractions = [i / parts for i in range(1, parts)]
    q = sql.SQL("SELECT percentile_disc(%s::float8[]) WITHIN GROUP (ORDER BY {})::text[] FROM {}").format(
        sql.Identifier(t["key"][0]), _qualified(t))
    row = conn.execute(q, (fractions,)).fetchone()
    bounds: list[str] = []
    for b in (row[0] if row and row[0] else []):
        if b is not None and (not bounds or bounds[-1] != b):
            bounds.append(b)
    return bounds


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
    """The Spark job: in this process (local[*]) or through spark-submit."""
    plan_path = workdir / "plan.json"
    plan["result"] = str(workdir / "result.json")
    write_private(plan_path, json.dumps(plan))  # it holds the connection passwords
    if spark_submit is None:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from chorus_spark.job import JobError, run

        try:
            out: dict[str, Any] = run(plan, say=say)
            return out
        except JobError as e:
            raise TotalRecoveryError(str(e)) from e
    entry = Path(__file__).resolve().parent.parent.parent / "spark" / "submit_job.py"
    cmd = [spark_submit, "--master", plan.get("master", "local[*]"), "--jars", plan["jdbc_jar"],
           str(entry), str(plan_path)]
    proc = subprocess.run(cmd, text=True, stderr=subprocess.PIPE)
    for line in proc.stderr.splitlines():
        if not line.startswith(("WARN", "INFO", "Setting default log level", "To adjust logging")):
            say(line)
    if proc.returncode != 0:
        raise TotalRecoveryError(f"spark-submit failed (exit {proc.returncode})")
    result: dict[str, Any] = json.loads(Path(plan["result"]).read_text())
    return result


def _same_shape(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return ([(c["name"], c["type"], c["generated"]) for c in a["columns"]] ==
            [(c["name"], c["type"], c["generated"]) for c in b["columns"]] and a["key"] == b["key"])


def sync_schema(donor: Endpoint, snap: Snapshot, joiner: Endpoint, conn: psycopg.Connection[Any],
                dtables: dict[str, dict[str, Any]], dkeyless: dict[str, dict[str, Any]]) -> list[str]:
    """Give the joiner the donor's schema, roles and extensions (chorus.totalschema). Returns what
    it did."""
    try:
        return totalschema.sync_schema(donor, snap.name, joiner, conn)
    except totalschema.SchemaSyncError as e:
        raise TotalRecoveryError(str(e)) from e


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
    inserts and updated rows in. Triggers and foreign-key checks do not fire (the delta comes
    from a consistent snapshot)."""
    st = sql.Identifier(STAGE_SCHEMA, f"stage_{stage}")
    match = sql.SQL(" AND ").join(sql.SQL("t.{0} = s.{0}").format(sql.Identifier(k)) for k in t["key"])
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        d = conn.execute(sql.SQL("DELETE FROM {} t USING {} s WHERE s._chorus_op IN ('D', 'U') AND {}").format(
            _qualified(t), st, match)).rowcount
        i = conn.execute(sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {} "
                                 "WHERE _chorus_op IN ('I', 'U')").format(
            _qualified(t), _stored(t), _stored(t), st)).rowcount
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


def total_recover(donor: Endpoint, joiner: Endpoint, say: Say, range_rows: int = 1000,
                  master: str = "local[*]", spark_submit: Optional[str] = None,
                  parallelism: Optional[int] = None) -> dict[str, Any]:
    """Steps 1-4 (the joiner's coordinator must be stopped). Returns the snapshot GID and what
    was done per table."""
    started = time.monotonic()
    parallelism = parallelism or max(2, os.cpu_count() or 2)
    workdir = make_private_dir("chorus-total-")
    try:
        snap = donor_snapshot(donor)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    say(f"donor {donor.name}: snapshot {snap.name} at GID {snap.gid}")
    try:
        with psycopg.connect(joiner.dsn, options=OFF, autocommit=True) as conn:
            dtables = describe_tables(snap.conn)
            dkeyless = describe_tables(snap.conn, keyed=False)
            for line in sync_schema(donor, snap, joiner, conn, dtables, dkeyless):
                say(line)
            tables = list(dtables.values())
            for t in tables:
                t["bounds"] = range_bounds(snap.conn, t, range_rows)
            stages = make_stages(conn, tables)
            plan = {"mode": "recover", "master": master, "jdbc_jar": JDBC_JAR, "parallelism": parallelism,
                    "sources": [donor.source(workdir, snap), joiner.source(workdir)],
                    "target_dsn": joiner.copy_dsn(OFF), "stages": stages,
                    "tables": [{k: v for k, v in t.items() if k != "oid"} for t in tables]}
            say(f"diffing {len(tables)} tables with Spark ({master})")
            result = run_job(plan, workdir, say, spark_submit)
            jkeyless = describe_tables(conn, keyed=False)
            for label, t in dkeyless.items():
                if label in jkeyless:
                    copy_whole(snap, conn, t)
                    say(f"copied {label} whole (it has no primary key to diff by)")
            moved_seq = move_sequences(snap, conn)
            mviews = totalschema.populated_matviews(snap.conn)
            snap.close()
            for i, t in enumerate(tables, start=1):
                n = merge(conn, t, i)
                say(f"merged {t['schema']}.{t['name']}: {n} rows written")
            for line in totalschema.refresh_matviews(conn, mviews):
                say(line)
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(STAGE_SCHEMA)))
            conn.execute("SELECT chorus.adopt_gid(%s)", (snap.gid,))
            conn.commit()
    finally:
        if not snap.conn.closed:
            snap.close()
        shutil.rmtree(workdir, ignore_errors=True)
    rows = {k: sum(t[k] for t in result["tables"]) for k in ("inserts", "updates", "deletes")}
    say(f"{joiner.name} now holds the donor's snapshot at GID {snap.gid}: {rows['inserts']} inserts, "
        f"{rows['updates']} updates, {rows['deletes']} deletes, {moved_seq} sequences moved "
        f"({time.monotonic() - started:.1f} s)")
    return {"gid": snap.gid, "donor": donor.name, "tables": result["tables"], "sequences": moved_seq,
            "elapsed_s": round(time.monotonic() - started, 2)}


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


def verify(nodes: list[tuple[Endpoint, str]], say: Say, range_rows: int = 1000, master: str = "local[*]",
           spark_submit: Optional[str] = None) -> dict[str, Any]:
    """Compare every node with the first at one snapshot GID. Differences per table and node."""
    snaps = common_snapshots(nodes, say)
    workdir = make_private_dir("chorus-verify-")
    try:
        ref = describe_tables(snaps[0].conn)
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
        bad = {d["table"] for d in schema_diffs}
        tables = [t for label, t in ref.items() if label not in bad]
        for t in tables:
            t["bounds"] = range_bounds(snaps[0].conn, t, range_rows)
        plan = {"mode": "verify", "master": master, "jdbc_jar": JDBC_JAR,
                "parallelism": max(2, os.cpu_count() or 2),
                "sources": [s.endpoint.source(workdir, s) for s in snaps],
                "tables": [{k: v for k, v in t.items() if k != "oid"} for t in tables]}
        result = run_job(plan, workdir, say, spark_submit)
    finally:
        for s in snaps:
            s.close()
        shutil.rmtree(workdir, ignore_errors=True)
    differing = [r for r in result["tables"] if r["rows_differing"]]
    return {"gid": snaps[0].gid, "reference": nodes[0][0].name, "tables": result["tables"],
            "schema_differences": schema_diffs, "identical": not differing and not schema_diffs}
