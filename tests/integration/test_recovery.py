"""The writeset log, crash safety and partial recovery on real nodes (issue: writeset log)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import threading
import time
from typing import Any, Iterator

import psycopg
import pytest

from chorus.testkit import workload as wl
from conftest import Cluster, chorus, extra_cluster

pytestmark = pytest.mark.integration

PGBENCH = shutil.which("pgbench") or "/usr/lib/postgresql/15/bin/pgbench"


def _pgbench_tables(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        if c.execute("SELECT to_regclass('pgbench_accounts')").fetchone() == (None,):
            subprocess.run([PGBENCH, "-i", "-q", "-s", "1", cluster.dsn(0)], check=True,
                           capture_output=True, timeout=120)
    cluster.quiesce()


def test_stopped_node_catches_up_from_a_partner_log(cluster: Cluster) -> None:
    _pgbench_tables(cluster)
    name = cluster.nodes[2].name
    r = chorus("node", "leave", "--dir", cluster.dir, name)
    assert r.returncode == 0, r.stderr
    procs = [subprocess.Popen([PGBENCH, "-N", "-n", "-c", "2", "-T", "5", "--max-tries", "100", cluster.dsn(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    for p in procs:
        out = p.communicate(timeout=120)[0]
        assert p.returncode == 0, out
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE rec_after (id integer PRIMARY KEY)")  # a schema change in the gap too
        c.execute("INSERT INTO rec_after SELECT generate_series(1, 100)")
    r = chorus("node", "join", "--dir", cluster.dir, name, "--json")
    assert r.returncode == 0, r.stderr + r.stdout
    st = json.loads(r.stdout)
    rec = st["recovery"]
    assert rec is not None and rec["state"] == "done", st
    assert rec["records"] > 100 and rec["partner"] in (cluster.nodes[0].name, cluster.nodes[1].name), rec
    assert "caught up:" in r.stderr, r.stderr  # progress was shown
    print(r.stderr)
    cluster.assert_identical()


def _transfer_loop(dsn: str, accounts: int, stop: threading.Event, seed: int, errors: list[str]) -> None:
    """Bank transfers, reconnecting whenever the node goes away; outcomes do not matter (each
    transfer is atomic), only that the total never changes."""
    rnd = random.Random(seed)
    op = wl.bank_op(accounts)
    conn = None
    while not stop.is_set():
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(dsn, autocommit=True, connect_timeout=3)
            with conn.transaction():
                op(conn, rnd, "")
        except psycopg.Error as e:
            if e.sqlstate not in (None, "40001", "40P01", "25006", "08006", "57P01", "57P03", "CH001"):
                errors.append(f"{e.sqlstate}: {str(e).strip()[:200]}")
            if conn is not None and not conn.closed and conn.info.transaction_status != 0:
                try:
                    conn.rollback()
                except psycopg.Error:
                    conn.close()
            time.sleep(0.05)
    if conn is not None:
        conn.close()


ACCOUNTS, BALANCE = 40, 1000


@contextlib.contextmanager
def _bank_under_load(cluster: Cluster) -> Iterator[None]:
    """Bank transfers from six clients on every node while the body runs; then every node must be
    identical with the total intact."""
    with cluster.connect(0) as c:
        c.execute(wl.BANK_SCHEMA)
    cluster.quiesce()
    wl.bank_setup(cluster.dsn(0), ACCOUNTS, BALANCE)
    cluster.quiesce()
    stop = threading.Event()
    errors: list[str] = []
    threads = [threading.Thread(target=_transfer_loop, args=(cluster.dsn(i % 3), ACCOUNTS, stop, i, errors))
               for i in range(6)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors[:5]
    cluster.assert_identical()
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT sum(balance), count(*) FROM bank_accounts").fetchone() == (ACCOUNTS * BALANCE,
                                                                                               ACCOUNTS)


def test_kill_nine_under_bank_load_loses_nothing(cluster: Cluster) -> None:
    with _bank_under_load(cluster):
        for rnd, (node, what) in enumerate([(2, "coordinator"), (1, "postgres"), (2, "all"), (1, "coordinator")]):
            time.sleep(2)
            name = cluster.nodes[node].name
            r = chorus("local", "kill", "--dir", cluster.dir, name, "--what", what)
            assert r.returncode == 0, r.stderr
            time.sleep(1)
            r = chorus("local", "start", "--dir", cluster.dir, name)
            assert r.returncode == 0, f"round {rnd}: restarting {name} after killing its {what}: {r.stderr}"
            cluster.wait_online(node)
        time.sleep(2)


def test_postgres_killed_again_and_again_under_load_then_a_peer_catches_up_from_it(cluster: Cluster) -> None:
    """One node's PostgreSQL SIGKILLed five times under load, at random moments (applies in
    flight when it dies, some just after it came back); then another node is stopped and
    started, so that it catches up from the logs of the others, that node included (a nemesis
    run once left a node stuck behind the others after its PostgreSQL came back, and a peer
    catching up from it waited forever). Every node must end online and identical."""
    rnd = random.Random(7)
    victim, peer = cluster.nodes[1].name, cluster.nodes[0].name
    with _bank_under_load(cluster):
        for _ in range(5):
            time.sleep(rnd.uniform(0.2, 1.5))
            assert chorus("local", "kill", "--dir", cluster.dir, victim, "--what", "postgres").returncode == 0
            time.sleep(rnd.uniform(0.1, 1.0))
            r = chorus("local", "start", "--dir", cluster.dir, victim)
            assert r.returncode == 0, r.stderr
        assert chorus("local", "stop", "--dir", cluster.dir, peer).returncode == 0
        time.sleep(1)
        assert chorus("local", "start", "--dir", cluster.dir, peer).returncode == 0
        cluster.wait_online(0)
        cluster.wait_online(1)
        time.sleep(1)


@pytest.fixture(scope="module")
def small_log_cluster() -> Iterator[Cluster]:
    """A second cluster whose writeset logs hold only 2 MiB each, so they wrap quickly; shared by
    the two tests below, each on a table of its own (the first leaves it as it found it: the node
    it keeps out comes back by total recovery, and the cluster is verified identical)."""
    with extra_cluster("chorus-small-", 10, "--log-segment-mb", "1", "--log-total-mb", "2") as c:
        yield c


def test_node_whose_gap_left_every_log_stays_out_until_total_recovery(small_log_cluster: Cluster) -> None:
    c3 = small_log_cluster
    c3.sql_all("CREATE TABLE filler (id integer PRIMARY KEY, pad text)")
    name = c3.nodes[2].name
    r = chorus("node", "leave", "--dir", c3.dir, name)
    assert r.returncode == 0, r.stderr
    with c3.connect(0) as c:
        for i in range(300):  # ~6 MB of writesets: both logs wrap past the gap's start
            c.execute("INSERT INTO filler VALUES (%s, repeat('x', 20000))", (i,))
    assert c3.status(0)["writeset_log"]["low_gid"] > 5
    r = chorus("node", "join", "--dir", c3.dir, name, "--timeout", "120")
    assert r.returncode != 0
    assert "total recovery" in r.stderr, r.stderr
    st = c3.status(2)
    assert st["state"] == "needs-recovery" and not st["accepts_writes"], st
    with psycopg.connect(c3.dsn(2), autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM filler").fetchone() == (0,)  # reads still work
        with pytest.raises(psycopg.Error) as e:
            c.execute("INSERT INTO filler VALUES (-1, 'stale node')")
        assert e.value.sqlstate == "25006", e.value
    # Total recovery, automatic: join finds that no log can catch the node up and rebuilds it
    # from a donor's snapshot (rows inserted, updated and deleted while it was away); then it
    # catches up and serves again.
    with c3.connect(0) as c:
        c.execute("UPDATE filler SET pad = 'updated' WHERE id % 3 = 0")
        c.execute("DELETE FROM filler WHERE id % 5 = 0")
    r = chorus("node", "join", "--auto-total", "--dir", c3.dir, name, "--range-rows", "20", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rebuilding it by total recovery" in r.stderr and "inserts" in r.stderr, r.stderr[-2000:]
    c3.assert_identical()
    r = chorus("verify", "--dir", c3.dir, timeout=600)
    assert r.returncode == 0 and "identical" in r.stdout, r.stdout + r.stderr[-2000:]


def test_writeset_log_verifies_clean(cluster: Cluster) -> None:
    for n in cluster.info["nodes"]:
        logdir = os.path.join(os.path.dirname(n["config"]), "wslog")
        r = chorus("log", "verify", logdir, "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        out: dict[str, Any] = json.loads(r.stdout)
        assert out["records"] > 0, out


def test_writeset_larger_than_the_log_is_refused_before_it_is_ordered(small_log_cluster: Cluster) -> None:
    """Every certified writeset must fit in the writeset log (partial recovery serves it from
    there): with a 2 MB ring, a 2 MB transaction fails with 54000, naming the setting, and
    changes nothing."""
    c3 = small_log_cluster
    c3.sql_all("CREATE TABLE IF NOT EXISTS big (id integer PRIMARY KEY, pad text)")
    before = c3.status(0)["certified_gid"]
    with c3.connect(0) as c:
        with pytest.raises(psycopg.Error) as e:
            c.execute("INSERT INTO big SELECT g, repeat(md5(g::text), 700) FROM generate_series(1, 100) g")
        assert e.value.sqlstate == "54000", e.value
        assert "writeset log" in str(e.value) and "log.total_mb" in str(e.value)
        assert c.execute("SELECT count(*) FROM big").fetchone() == (0,)
        c.execute("INSERT INTO big VALUES (1, 'small')")  # the node goes on
    assert c3.status(0)["certified_gid"] == before + 1
    c3.assert_identical()
