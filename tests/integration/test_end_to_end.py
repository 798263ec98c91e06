"""End to end on real PostgreSQL and Corosync, 3 nodes (issue: capture → order → certify → apply)."""

from __future__ import annotations

import os
import random
import shutil
import socket
import struct
import subprocess
import threading
import time
from typing import Any

import psycopg
import pytest

from chorus import wire
from conftest import Cluster, chorus, commit_all

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def schema(cluster: Cluster) -> None:
    cluster.sql_all("CREATE TABLE IF NOT EXISTS kv (k integer PRIMARY KEY, v text, u text UNIQUE)")
    cluster.sql_all("CREATE TABLE IF NOT EXISTS nopk (a integer, b text)")
    cluster.sql_all("CREATE TABLE IF NOT EXISTS big (id integer PRIMARY KEY, n integer)")


def test_row_written_on_any_node_appears_on_the_others(cluster: Cluster) -> None:
    for i in range(3):
        with cluster.connect(i) as c:
            c.execute("INSERT INTO kv (k, v) VALUES (%s, %s)", (100 + i, f"from node {i}"))
    cluster.quiesce()
    for i in range(3):
        with cluster.connect(i) as c:
            rows = c.execute("SELECT k, v FROM kv WHERE k BETWEEN 100 AND 102 ORDER BY k").fetchall()
            assert rows == [(100, "from node 0"), (101, "from node 1"), (102, "from node 2")]
    with cluster.connect(2) as c:
        c.execute("UPDATE kv SET v = 'changed' WHERE k = 100")
        c.execute("DELETE FROM kv WHERE k = 101")
    cluster.assert_identical()
    with cluster.connect(0) as c:
        assert c.execute("SELECT v FROM kv WHERE k = 100").fetchone() == ("changed",)
        assert c.execute("SELECT count(*) FROM kv WHERE k = 101").fetchone() == (0,)


def test_concurrent_updates_of_one_row_exactly_one_commits(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("INSERT INTO kv (k, v) VALUES (200, 'start')")
    cluster.quiesce()
    conns = [cluster.connect(i, autocommit=False) for i in (0, 1)]
    for i, c in enumerate(conns):
        c.execute("UPDATE kv SET v = %s WHERE k = 200", (f"writer {i}",))
    outcomes: list[Any] = [None, None]

    def commit(i: int) -> None:
        try:
            conns[i].commit()
            outcomes[i] = "ok"
        except psycopg.Error as e:
            outcomes[i] = e

    threads = [threading.Thread(target=commit, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for c in conns:
        c.close()
    assert sorted(o == "ok" for o in outcomes) == [False, True], outcomes
    loser = next(o for o in outcomes if o != "ok")
    assert loser.sqlstate == "40001"
    assert "kv" in str(loser) and "200" in str(loser)
    winner = outcomes.index("ok")
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT v FROM kv WHERE k = 200").fetchone() == (f"writer {winner}",)


def test_running_local_statement_loses_to_certified_remote_writeset(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("INSERT INTO kv (k, v) VALUES (210, 'start')")
    cluster.quiesce()
    local = cluster.connect(1, autocommit=False)
    local.execute("UPDATE kv SET v = 'local, uncertified' WHERE k = 210")
    errors: list[Any] = []

    def busy() -> None:  # a long statement in the transaction that holds the row lock
        try:
            local.execute("SELECT pg_sleep(20)")
        except psycopg.Error as e:
            errors.append(e)

    t = threading.Thread(target=busy)
    t.start()
    time.sleep(0.3)
    with cluster.connect(0) as c:  # certified first: must win on node 1 as well
        c.execute("UPDATE kv SET v = 'remote' WHERE k = 210")
    t.join(15)
    assert not t.is_alive(), "the applier waited for the local transaction"
    local.close()
    assert len(errors) == 1 and errors[0].sqlstate == "40001", errors
    assert "aborted by the certified remote transaction" in str(errors[0])
    cluster.assert_identical()
    with cluster.connect(1) as c:
        assert c.execute("SELECT v FROM kv WHERE k = 210").fetchone() == ("remote",)
    assert cluster.status(1)["local_aborts_for_appliers"] >= 1


def test_idle_in_transaction_local_session_is_ended_after_grace(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("INSERT INTO kv (k, v) VALUES (211, 'start')")
    cluster.quiesce()
    local = cluster.connect(2, autocommit=False)
    local.execute("UPDATE kv SET v = 'local, idle' WHERE k = 211")  # then idle in transaction
    with cluster.connect(0) as c:
        c.execute("UPDATE kv SET v = 'remote' WHERE k = 211")
    cluster.quiesce(timeout=30)  # the applier on node 2 got through: the idle session was ended
    with pytest.raises(psycopg.Error) as exc:
        local.execute("SELECT 1")
        local.commit()
    assert exc.value.sqlstate in ("40001", None), exc.value  # None: libpq saw only the closed socket
    local.close()
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT v FROM kv WHERE k = 211").fetchone() == ("remote",)


def test_unique_value_collision_from_two_nodes(cluster: Cluster) -> None:
    conns = [cluster.connect(i, autocommit=False) for i in (0, 1)]
    for i, c in enumerate(conns):
        c.execute("INSERT INTO kv (k, v, u) VALUES (%s, 'x', 'same-unique')", (300 + i,))
    results = commit_all(conns)
    assert sorted(results) == ["40001", "ok"]
    cluster.assert_identical()


def test_read_only_transaction_sends_nothing(cluster: Cluster) -> None:
    cluster.quiesce()
    before = [cluster.status(i)["delivered_gid"] for i in range(3)]
    with cluster.connect(1, autocommit=False) as c:
        c.execute("SELECT count(*) FROM kv").fetchone()
        c.execute("SELECT * FROM kv WHERE k = 100").fetchall()
        c.commit()
    time.sleep(0.5)
    assert [cluster.status(i)["delivered_gid"] for i in range(3)] == before


def test_prepare_transaction_of_replicated_writes_is_refused_and_nothing_commits(cluster: Cluster) -> None:
    """PREPARE TRANSACTION would commit on one node alone (COMMIT PREPARED is never certified):
    a transaction that wrote a replicated row, a schema change or a setval() is refused before
    it is prepared (0A000), rolls back, and the session goes on replicating."""
    with cluster.connect(1) as c:
        c.execute("CREATE SEQUENCE IF NOT EXISTS prepared_s")
    cluster.quiesce()
    before = [cluster.status(i)["delivered_gid"] for i in range(3)]
    writes = ["INSERT INTO kv (k, v) VALUES (900, 'prepared')",
              "CREATE TABLE prepared_t (id integer PRIMARY KEY)",
              "SELECT setval('prepared_s', 42)"]
    with cluster.connect(1) as c:
        for w in writes:
            c.execute("BEGIN")
            c.execute(w)
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="PREPARE TRANSACTION is not supported"):
                c.execute("PREPARE TRANSACTION 'chorus_test'")
            c.execute("ROLLBACK")  # (the failed PREPARE has already rolled it back)
        assert c.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)
        assert c.execute("SELECT to_regclass('prepared_t')").fetchone() == (None,)
        c.execute("INSERT INTO kv (k, v) VALUES (901, 'after')")
    cluster.quiesce()
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT k FROM kv WHERE k IN (900, 901)").fetchall() == [(901,)]
    assert all(cluster.status(i)["delivered_gid"] == before[i] + 1 for i in range(3))


def test_table_without_primary_key(cluster: Cluster) -> None:
    """UPDATE and DELETE on a table without a primary key replicate by the whole old row, as
    REPLICA IDENTITY FULL does: one of two identical rows changes on every node, and a row that
    only equals another under = (1.0 and 1.00) is told apart."""
    with cluster.connect(0) as c:
        c.execute("INSERT INTO nopk VALUES (1, 'a'), (1, 'a'), (2, 'b')")
        c.execute("UPDATE nopk SET b = 'z' WHERE a = 2")
        c.execute("DELETE FROM nopk WHERE ctid = (SELECT ctid FROM nopk WHERE a = 1 LIMIT 1)")
        c.execute("CREATE TABLE nopk_num (x numeric)")
        c.execute("INSERT INTO nopk_num VALUES (1.0), (1.00)")
        c.execute("DELETE FROM nopk_num WHERE x::text = '1.00'")
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT a, b FROM nopk ORDER BY a").fetchall() == [(1, "a"), (2, "z")]
        assert c.execute("SELECT x::text FROM nopk_num").fetchall() == [("1.0",)]


def test_truncate_replicates(cluster: Cluster) -> None:
    with cluster.connect(1) as c:
        c.execute("INSERT INTO nopk VALUES (9, 'x')")
        c.execute("TRUNCATE nopk")
    cluster.assert_identical()
    with cluster.connect(0) as c:
        assert c.execute("SELECT count(*) FROM nopk").fetchone() == (0,)


def test_100k_row_update_commits_and_replicates(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("INSERT INTO big SELECT g, 0 FROM generate_series(1, 100000) g")
    cluster.quiesce(120)
    with cluster.connect(1) as c:
        c.execute("UPDATE big SET n = n + 1")
    cluster.quiesce(180)
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT count(*), sum(n) FROM big").fetchone() == (100000, 100000)
    cluster.assert_identical()


def test_malformed_frame_closes_only_that_connection(cluster: Cluster) -> None:
    sock_path = os.path.join(cluster.dir, "nodes", cluster.nodes[0].name, "run", "chorus.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(sock_path)
        s.sendall(struct.pack(">I", 5) + b"Wjunk")
        s.settimeout(5)
        assert s.recv(100) == b""  # closed by the coordinator
    with cluster.connect(0) as c:
        c.execute("INSERT INTO kv (k, v) VALUES (400, 'after garbage')")
    assert cluster.status(0)["malformed_frames"] >= 1
    cluster.assert_identical()


def test_pgbench_on_all_nodes_then_identical(cluster: Cluster) -> None:
    pgbench = shutil.which("pgbench") or "/usr/lib/postgresql/15/bin/pgbench"
    # run once, on one node: the schema changes and the data replicate (issue: DDL)
    subprocess.run([pgbench, "-i", "-q", "-s", "1", cluster.dsn(0)], check=True,
                   capture_output=True, timeout=120)
    cluster.assert_identical()
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT count(*) FROM pgbench_accounts").fetchone() == (100000,)
    procs = [subprocess.Popen([pgbench, "-c", "4", "-j", "2", "-T", "8", "--max-tries", "100", "-n",
                               cluster.dsn(i)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(3)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
        assert "number of transactions actually processed" in out, out
    cluster.assert_identical()
    with cluster.connect(0) as c:
        tb = c.execute("SELECT sum(bbalance) FROM pgbench_branches").fetchone()
        ta = c.execute("SELECT sum(abalance) FROM pgbench_accounts").fetchone()
        th = c.execute("SELECT sum(delta) FROM pgbench_history").fetchone()
        assert tb == ta == th


def test_coordinator_down_refuses_writes_but_serves_reads(cluster: Cluster) -> None:
    cluster.quiesce()
    name = cluster.nodes[2].name
    r = chorus("local", "kill", "--dir", cluster.dir, name, "--what", "coordinator")
    assert r.returncode == 0, r.stderr
    time.sleep(0.5)
    with cluster.connect(2) as c:
        assert c.execute("SELECT count(*) FROM kv WHERE k = 100").fetchone() == (1,)
        with pytest.raises(psycopg.Error) as e:
            c.execute("INSERT INTO kv (k, v) VALUES (500, 'no coordinator')")
        assert "coordinator" in str(e.value)
    r = chorus("local", "start", "--dir", cluster.dir, name)
    assert r.returncode == 0, r.stderr
    cluster.wait_online(2)
    with cluster.connect(2) as c:
        c.execute("INSERT INTO kv (k, v) VALUES (501, 'coordinator back')")
    cluster.assert_identical()


def test_fuzzed_frames_on_the_backend_socket_are_refused_and_the_node_goes_on(cluster: Cluster) -> None:
    """The backend socket crosses a trust boundary (it is the postgres user's): random frames,
    cut and damaged writesets are refused (the connection closed, or answered with a refusal),
    and the coordinator goes on serving the real backends. A damaged writeset that would still
    read as valid is not sent: it would be certified and applied like a real one."""
    sock_path = os.path.join(cluster.dir, "nodes", cluster.nodes[0].name, "run", "chorus.sock")
    rnd = random.Random(17)
    t = wire.Table("public", "kv", (wire.Column("k", "integer", 0), wire.Column("v", "text", 0)), (0,))
    good = wire.encode(wire.Writeset(1, 1, 0, (t,), (wire.Row("I", 0, (), (wire.Binary(b"\0\0\0\1"), b"x")),),
                                     (wire.Key(wire.KeyMode.UPDATE, (b"public", b"kv", b"k", b"1")),)))
    before = cluster.status(0)["malformed_frames"]
    sent = 0
    for i in range(150):
        if i % 2:
            body = bytearray(good)
            for _ in range(rnd.randint(1, 4)):
                body[rnd.randrange(len(body))] = rnd.randrange(256)
            body = body[:rnd.randrange(len(body) + 1)] if i % 3 == 0 else body
            try:
                wire.scan(bytes(body))
                continue  # still a valid writeset: not a malformed frame
            except wire.WireError:
                pass
            frame = struct.pack(">I", len(body) + 1) + b"W" + bytes(body)
        else:
            junk = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 40)))
            frame = struct.pack(">I", rnd.choice([0, 1, 5, 13, len(junk) + 1, 1 << 31])) + \
                rnd.choice([b"W", b"C", b"A", b"R", b"S", b"Z", b"\0"]) + junk
            if frame[4:5] in (b"C", b"A", b"R"):
                continue  # well-formed reports of GIDs would be believed: the socket is the backends'
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(sock_path)
            s.sendall(frame)
            s.shutdown(socket.SHUT_WR)
            while s.recv(4096):  # a refusal, then the close; or the close
                pass
        sent += 1
    assert sent > 50
    with cluster.connect(0) as c:
        c.execute("INSERT INTO kv (k, v) VALUES (401, 'after fuzzing')")
    assert cluster.status(0)["malformed_frames"] > before
    assert cluster.status(0)["state"] == "online"
    cluster.assert_identical()
