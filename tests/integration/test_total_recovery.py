"""Total recovery with the Spark snapshot diff, and ``chorus verify`` (issue: total recovery).

A node whose tables are gone (an empty node) is rebuilt from a donor's snapshot while the donor
keeps committing, then catches up by partial recovery; verify finds a row changed behind Chorus's
back on one node and names it. The stale-node case (its gap purged from every log) is in
test_recovery.py, after the node has refused to serve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Optional

import psycopg
import pytest

from conftest import Cluster, chorus

pytest.importorskip("pyspark")

TYPES_TABLE = """CREATE TABLE tr_types (
    id bigint PRIMARY KEY, amount numeric(30, 10), at timestamptz, doc jsonb, bin bytea, tags text[],
    note text, f double precision, day date, span interval, gen bigint GENERATED ALWAYS AS (id * 2) STORED)"""

FILL = """INSERT INTO tr_types (id, amount, at, doc, bin, tags, note, f, day, span)
SELECT g, g * 1.0000000001, '2026-11-23 12:00:00.123456+01'::timestamptz + g * interval '1 second',
       jsonb_build_object('g', g, 'nested', jsonb_build_array(g, null, 'x')), decode(lpad(to_hex(g), 8, '0'), 'hex'),
       ARRAY['a', NULL, g::text], CASE WHEN g %% 7 = 0 THEN NULL ELSE E'odd \\t ''chars'' "' || g || E'" \\\\N é' END,
       g / 3.0, DATE '2026-01-01' + (g %% 300)::int, make_interval(secs => g)
  FROM generate_series(%s::bigint, %s::bigint) g"""


def _writer(dsn: str, stop: threading.Event, errors: list[str]) -> None:
    i = 10_000_000
    with psycopg.connect(dsn, autocommit=True) as c:
        while not stop.is_set():
            i += 1
            try:
                c.execute("INSERT INTO tr_types (id, note) VALUES (%s, 'during recovery')", (i,))
            except psycopg.Error as e:
                if e.sqlstate != "40001":
                    errors.append(str(e))


def test_empty_node_rebuilt_while_the_donor_keeps_writing(cluster: Cluster) -> None:
    cluster.sql_all("DROP TABLE IF EXISTS tr_types")
    cluster.sql_all("DROP TABLE IF EXISTS tr_log")
    with cluster.connect(0) as c:
        c.execute(TYPES_TABLE)
        c.execute(FILL, (1, 5000))
        c.execute("CREATE TABLE tr_log (msg text)")  # no primary key: copied whole
        c.execute("INSERT INTO tr_log SELECT 'line ' || g FROM generate_series(1, 300) g")
    cluster.quiesce()
    name = cluster.nodes[2].name
    # the node loses every table (behind Chorus's back): it is an empty node now
    with psycopg.connect(cluster.dsn(2), autocommit=True,
                         options="-c chorus.capture=off -c chorus.replicate_ddl=off") as c:
        tables = c.execute("SELECT format('%I.%I', schemaname, tablename) FROM pg_tables "
                           "WHERE schemaname = 'public'").fetchall()
        for (t,) in tables:
            c.execute(f"DROP TABLE {t} CASCADE")
    stop, errors = threading.Event(), []
    writer = threading.Thread(target=_writer, args=(cluster.dsn(0), stop, errors))
    writer.start()
    try:
        r = chorus("node", "join", "--total", "--dir", cluster.dir, name, "--range-rows", "500", "--json",
                   timeout=600)
    finally:
        stop.set()
        writer.join(timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "snapshot" in r.stderr and "caught up" in r.stderr, r.stderr[-2000:]
    assert not errors, errors[:3]
    result = json.loads(r.stdout)
    assert result["state"] == "online"
    rebuilt = {t["table"]: t for t in result["total_recovery"]["tables"]}
    assert rebuilt["public.tr_types"]["mode"] == "copy" and rebuilt["public.tr_log"]["mode"] == "copy", rebuilt
    assert [e["phase"] for e in result["total_recovery"]["events"]][:2] == ["snapshot", "schema"]
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT count(*) FROM tr_types WHERE id <= 5000").fetchone() == (5000,)
        assert c.execute("SELECT gen FROM tr_types WHERE id = 21").fetchone() == (42,)
        assert c.execute("SELECT count(*) FROM tr_log").fetchone() == (300,)
        c.execute("INSERT INTO tr_types (id, note) VALUES (-1, 'written on the rebuilt node')")
    cluster.quiesce()
    with cluster.connect(0) as c:
        assert c.execute("SELECT note FROM tr_types WHERE id = -1").fetchone() == ("written on the rebuilt node",)


def test_verify_names_a_row_changed_behind_chorus(cluster: Cluster) -> None:
    _ensure_types_table(cluster)
    r = chorus("verify", "--dir", cluster.dir, "--json", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out: dict[str, Any] = json.loads(r.stdout)
    assert out["identical"] and any(t["table"] == "public.tr_types" for t in out["tables"]), out
    off = "-c chorus.capture=off -c chorus.replicate_ddl=off"
    with psycopg.connect(cluster.dsn(1), autocommit=True, options=off) as c:
        before = c.execute("SELECT note FROM tr_types WHERE id = 1234").fetchone()
        c.execute("UPDATE tr_types SET note = 'changed behind chorus' WHERE id = 1234")
    try:
        r = chorus("verify", "--dir", cluster.dir, timeout=600)
        assert r.returncode == 1, r.stdout + r.stderr[-2000:]
        assert f"public.tr_types on {cluster.nodes[1].name}: row (id=1234) differs" in r.stdout, r.stdout
    finally:
        with psycopg.connect(cluster.dsn(1), autocommit=True, options=off) as c:
            c.execute("UPDATE tr_types SET note = %s WHERE id = 1234", (before[0] if before else None,))


OFF = "-c chorus.capture=off -c chorus.replicate_ddl=off"

LINK_ROWS = [
    "INSERT INTO chorus.link_position VALUES ('to-b', 'b', 4321, 4400, 77, '2026-11-28 12:00:00+00')",
    "INSERT INTO chorus.link_stamp SELECT decode(lpad(to_hex(g), 32, '0'), 'hex'), 'b', g, "
    "'2026-11-28 12:00:00+00'::timestamptz + g * interval '1 ms' FROM generate_series(1, 3000) g",
    "INSERT INTO chorus.link_exceptions VALUES (900, 1, 'to-b', 'public.acct', '(id)=(7)', 'a', 80, "
    "'2026-11-28 11:59:00+00', '{\"id\": \"7\", \"n\": \"1\"}', 'b', 90, '2026-11-28 11:59:01+00', "
    "'{\"id\": \"7\", \"n\": \"2\"}', 70, 'row', 'latest-commit-wins', 'took-remote', "
    "'{\"id\": \"7\", \"n\": \"2\"}')",
]


def _link_tables(dsn: str) -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return [c.execute(f"SELECT * FROM chorus.{t} ORDER BY 1, 2").fetchall()
                for t in ("link_position", "link_stamp", "link_exceptions")]


def test_link_tables_are_verified_and_rebuilt(cluster: Cluster) -> None:
    """The link tables are data of the site (what its next link decisions read): verify compares
    them, and a node rebuilt by total recovery holds the donor's."""
    for i in range(len(cluster.nodes)):
        with psycopg.connect(cluster.dsn(i), autocommit=True, options=OFF) as c:
            for t in ("link_position", "link_stamp", "link_exceptions"):
                c.execute(f"DELETE FROM chorus.{t}")
            for stmt in LINK_ROWS:
                c.execute(stmt)
    try:
        r = chorus("verify", "--dir", cluster.dir, "--json", timeout=600)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        compared = {t["table"] for t in json.loads(r.stdout)["tables"]}
        assert {"chorus.link_position", "chorus.link_stamp", "chorus.link_exceptions"} <= compared, compared
        with psycopg.connect(cluster.dsn(1), autocommit=True, options=OFF) as c:
            c.execute("UPDATE chorus.link_stamp SET clock = 1 WHERE clock = 1234")
        r = chorus("verify", "--dir", cluster.dir, timeout=600)
        assert r.returncode == 1, r.stdout + r.stderr[-2000:]
        assert f"chorus.link_stamp on {cluster.nodes[1].name}: row (key=" in r.stdout, r.stdout
        with psycopg.connect(cluster.dsn(1), autocommit=True, options=OFF) as c:
            c.execute("UPDATE chorus.link_stamp SET clock = 1234 WHERE key = decode(lpad(to_hex(1234), 32, '0'), 'hex')")
        # the third node lost its link tables' rows and some of its stamps are other values
        with psycopg.connect(cluster.dsn(2), autocommit=True, options=OFF) as c:
            c.execute("DELETE FROM chorus.link_position")
            c.execute("DELETE FROM chorus.link_exceptions")
            c.execute("DELETE FROM chorus.link_stamp WHERE clock > 2000")
            c.execute("UPDATE chorus.link_stamp SET site = 'a' WHERE clock < 10")
        assert _link_tables(cluster.dsn(2)) != _link_tables(cluster.dsn(0))
        r = chorus("node", "join", "--total", "--dir", cluster.dir, cluster.nodes[2].name, "--json", timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        rebuilt = {t["table"] for t in json.loads(r.stdout)["total_recovery"]["tables"]}
        assert "chorus.link_stamp" in rebuilt, rebuilt
        assert _link_tables(cluster.dsn(2)) == _link_tables(cluster.dsn(0))
    finally:
        for i in range(len(cluster.nodes)):
            with psycopg.connect(cluster.dsn(i), autocommit=True, options=OFF) as c:
                for t in ("link_position", "link_stamp", "link_exceptions"):
                    c.execute(f"DELETE FROM chorus.{t}")


def _ensure_types_table(cluster: Cluster) -> None:
    """tr_types with 2000 rows on every node (created if an earlier test left none)."""
    with cluster.connect(0) as c:
        exists = c.execute("SELECT to_regclass('public.tr_types') IS NOT NULL").fetchone() == (True,)
    if not exists:
        cluster.sql_all("DROP TABLE IF EXISTS tr_types")
        with cluster.connect(0) as c:
            c.execute(TYPES_TABLE)
            c.execute(FILL, (1, 2000))
    cluster.quiesce()


def test_node_rebuilt_from_its_config_file(cluster: Cluster) -> None:
    """Any deployment, not only a local cluster: `chorus node join --total --config FILE
    --donor-dsn DSN` refuses while the node's coordinator runs; with it stopped, it rebuilds the
    drifted database from the donor, and once the coordinator is started again (by the operator:
    here `chorus local start`) the node catches up and is online."""
    _ensure_types_table(cluster)
    node = cluster.info["nodes"][1]
    args = ["node", "join", "--total", "--config", node["config"], "--donor-dsn", cluster.dsn(0),
            "--range-rows", "500", "--json", "--spark-master", "local[2]", "--copy-under-mb", "0"]
    r = chorus(*args, timeout=60)
    assert r.returncode != 0 and "coordinator is running" in r.stderr, r.stderr[-2000:]

    assert chorus("local", "kill", "--dir", cluster.dir, node["name"], "--what", "coordinator").returncode == 0
    off = "-c chorus.capture=off -c chorus.replicate_ddl=off"
    with psycopg.connect(cluster.dsn(1), autocommit=True, options=off) as c:  # drift behind Chorus's back
        c.execute("DELETE FROM tr_types WHERE id BETWEEN 100 AND 109")
        c.execute("UPDATE tr_types SET note = 'drifted' WHERE id BETWEEN 200 AND 204")
        c.execute("INSERT INTO tr_types (id, note) VALUES (-2, 'only here')")
    with cluster.connect(0) as c:
        c.execute("INSERT INTO tr_types (id, note) VALUES (-3, 'while the node was down')")
    # its postgres.dsn is the Unix socket (peer): its TCP side's password from the environment, as
    # an operator gives it (docs/RECOVERY.md, "Authentication and TLS")
    out, log = join_config_node(cluster.dir, node["name"], [sys.executable, "-m", "chorus", *args],
                                env=dict(os.environ, PGPASSFILE=cluster.passfile))
    result = json.loads(out)
    assert result["state"] == "online"
    # diffed (not copied: --copy-under-mb 0), its rows level on Spark executors
    rebuilt = {t["table"]: t for t in result["total_recovery"]["tables"]}
    assert rebuilt["public.tr_types"]["mode"] == "diff", rebuilt
    assert (rebuilt["public.tr_types"]["deletes"], rebuilt["public.tr_types"]["updates"]) == (1, 5), rebuilt
    assert rebuilt["public.tr_types"]["inserts"] >= 11, rebuilt  # 10 deleted here, 1 written meanwhile
    assert "in Spark (local[2])" in log and "Spark: " in log, log[-2000:]
    cluster.assert_identical()
    with cluster.connect(1) as c:
        assert c.execute("SELECT note FROM tr_types WHERE id = -3").fetchone() == ("while the node was down",)
        assert c.execute("SELECT count(*) FROM tr_types WHERE id = -2").fetchone() == (0,)


def join_config_node(cluster_dir: str, name: str, cmd: list[str],
                     env: Optional[dict[str, str]] = None) -> tuple[str, str]:
    """Run `chorus node join --total --config ...` (``cmd``) as the operator would: once it says
    "start its coordinator now", start the coordinator (here `chorus local start`), and let the
    command follow the node to online. Returns its stdout and stderr; fails if it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        err = os.path.join(tmp, "join.err")
        with open(err, "a") as f:  # append mode: the test reads it while the command writes
            join = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=f, text=True, env=env)
        try:
            deadline = time.monotonic() + 600
            while "start its coordinator now" not in _read(err):
                assert join.poll() is None, _read(err)[-3000:]
                assert time.monotonic() < deadline, _read(err)[-3000:]
                time.sleep(0.5)
            assert chorus("local", "start", "--dir", cluster_dir, name).returncode == 0
            out, _ = join.communicate(timeout=300)
        finally:
            if join.poll() is None:
                join.kill()
        log = _read(err)
    assert join.returncode == 0, log[-3000:]
    return out, log


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()
