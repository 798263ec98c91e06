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
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from chorus_spark.sqlgen import ident

JDBC_JAR = "/usr/share/java/postgresql.jar"
PGBIN = Path("/usr/lib/postgresql/15/bin")
STAGE_SCHEMA = "chorus_recovery"
OFF = "-c chorus.capture=off -c chorus.replicate_ddl=off"

Say = Callable[[str], None]


class TotalRecoveryError(Exception):
    pass


@dataclass(frozen=True)
class Endpoint:
    """A node's database as the diff reaches it."""

    name: str
    host: str
    port: int
    dbname: str = "postgres"
    user: str = "postgres"

    @property
    def dsn(self) -> str:
        return f"host={self.host} port={self.port} dbname={self.dbname} user={self.user}"

    @property
    def jdbc(self) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.dbname}"

    @classmethod
    def from_dsn(cls, name: str, dsn: str) -> "Endpoint":
        """An endpoint from a libpq connection string. The diff reads over JDBC, which needs TCP:
        a Unix-socket host (a directory) becomes 127.0.0.1 on the same port."""
        try:
            d = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as e:
            raise TotalRecoveryError(f"cannot parse the connection string {dsn!r}: {e}") from e
        host = str(d.get("host") or "")
        if not host or host.startswith("/") or "," in host:
            host = "127.0.0.1"
        try:
            port = int(d.get("port") or 5432)
        except ValueError as e:
            raise TotalRecoveryError(f"the connection string {dsn!r} has a bad port") from e
        return cls(name, host, port, str(d.get("dbname") or "postgres"), str(d.get("user") or "postgres"))

    def source(self, snap: Optional["Snapshot"] = None) -> dict[str, Any]:
        return {"name": self.name, "url": self.jdbc, "user": self.user,
                "snapshot": snap.name if snap else None, "gid": snap.gid if snap else None,
                "snapshot_text": snap.text if snap else None}


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
    plan_path.write_text(json.dumps(plan))
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
    this code (``--py-files``) and the JDBC driver (``--jars``); they run ``PYSPARK_PYTHON``
    (default: this Python, which has psycopg). The driver runs here (client mode): on
    ``local[*]`` or a master on this machine's loopback it binds and advertises 127.0.0.1; for a
    remote master set ``spark.driver.host`` (spark-defaults.conf) if this host's name does not
    reach it. Anything else (executor memory, cores) comes from Spark's own configuration."""
    from chorus_spark import launch

    master = str(plan.get("master", "local[*]"))
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    cmd = [spark_submit, "--master", master, "--deploy-mode", "client", "--name", "chorus-snapshot-diff",
           "--jars", plan["jdbc_jar"], "--py-files", launch.package(workdir),
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


def _pg_env() -> dict[str, str]:
    return dict(os.environ, PGOPTIONS=OFF)


def sync_schema(donor: Endpoint, snap: Snapshot, joiner: Endpoint, conn: psycopg.Connection[Any],
                dtables: dict[str, dict[str, Any]], dkeyless: dict[str, dict[str, Any]]) -> list[str]:
    """Give the joiner the donor's replicated tables: create the missing ones, recreate those
    whose columns differ, drop those the donor does not have. Returns what it did."""
    jtables = describe_tables(conn)
    done: list[str] = []
    for label, t in jtables.items():
        if label not in dtables:
            conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(_qualified(t)))
            done.append(f"dropped {label} (the donor does not have it)")
    recreate = [label for label, t in dtables.items() if label in jtables and not _same_shape(t, jtables[label])]
    for label in recreate:
        conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(_qualified(jtables[label])))
        done.append(f"recreated {label} (its columns differ from the donor's)")
    jkeyless = describe_tables(conn, keyed=False)
    missing = [label for label in dtables if label not in jtables or label in recreate]
    missing += [label for label in dkeyless if label not in jkeyless and label not in jtables]
    if not missing:
        return done
    whole = not jtables and not jkeyless  # an empty node takes the donor's whole schema (types, functions, views ...)
    cmd = [str(PGBIN / "pg_dump"), "--schema-only", "--no-owner", "--no-privileges", f"--snapshot={snap.name}",
           "-h", donor.host, "-p", str(donor.port), "-U", donor.user, "-d", donor.dbname]
    if not whole:
        for label in missing:
            schema, _, name = label.partition(".")
            cmd += ["-t", f"{ident(schema)}.{ident(name)}"]
    dump = subprocess.run(cmd, capture_output=True, text=True)
    if dump.returncode != 0:
        raise TotalRecoveryError(f"pg_dump of the donor's schema failed: {dump.stderr.strip()}")
    script = "\n".join(line for line in dump.stdout.splitlines() if not _extension_line(line))
    # The dump carries the capture triggers and sequences as the donor has them: let it create
    # them as they are (the sequences are moved to this node's class afterwards).
    conn.execute("ALTER EVENT TRIGGER chorus_on_ddl_end DISABLE")
    conn.commit()
    try:
        res = subprocess.run([str(PGBIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", joiner.host,
                              "-p", str(joiner.port), "-U", joiner.user, "-d", joiner.dbname],
                             input=script, capture_output=True, text=True, env=_pg_env())
    finally:
        conn.execute("ALTER EVENT TRIGGER chorus_on_ddl_end ENABLE ALWAYS")
        conn.commit()
    if res.returncode != 0:
        raise TotalRecoveryError(f"creating the donor's schema on {joiner.name} failed: {res.stderr.strip()}")
    done.append(f"created {'the donor schema' if whole else ', '.join(missing)} from the donor's schema")
    return done


def _extension_line(line: str) -> bool:
    return line.startswith(("CREATE EXTENSION", "COMMENT ON EXTENSION", "CREATE SCHEMA chorus;"))


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
    workdir = Path(tempfile.mkdtemp(prefix="chorus-total-"))
    snap = donor_snapshot(donor)
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
                    "sources": [donor.source(snap), joiner.source()],
                    "target_dsn": joiner.dsn + f" options='{OFF}'", "stages": stages,
                    "tables": [{k: v for k, v in t.items() if k != "oid"} for t in tables]}
            say(f"diffing {len(tables)} tables with Spark ({master})")
            result = run_job(plan, workdir, say, spark_submit)
            jkeyless = describe_tables(conn, keyed=False)
            for label, t in dkeyless.items():
                if label in jkeyless:
                    copy_whole(snap, conn, t)
                    say(f"copied {label} whole (it has no primary key to diff by)")
            moved_seq = move_sequences(snap, conn)
            snap.close()
            for i, t in enumerate(tables, start=1):
                n = merge(conn, t, i)
                say(f"merged {t['schema']}.{t['name']}: {n} rows written")
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
    workdir = Path(tempfile.mkdtemp(prefix="chorus-verify-"))
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
                "sources": [s.endpoint.source(s) for s in snaps],
                "tables": [{k: v for k, v in t.items() if k != "oid"} for t in tables]}
        result = run_job(plan, workdir, say, spark_submit)
    finally:
        for s in snaps:
            s.close()
        shutil.rmtree(workdir, ignore_errors=True)
    differing = [r for r in result["tables"] if r["rows_differing"]]
    return {"gid": snaps[0].gid, "reference": nodes[0][0].name, "tables": result["tables"],
            "schema_differences": schema_diffs, "identical": not differing and not schema_diffs}
