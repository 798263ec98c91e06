"""Parallel apply on real nodes (issue: parallel apply, in-order commit, the watermark)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import pytest

from conftest import Cluster

pytestmark = pytest.mark.integration

PGBENCH = shutil.which("pgbench") or "/usr/lib/postgresql/15/bin/pgbench"


def test_replicas_apply_in_parallel_and_end_identical_under_pgbench(cluster: Cluster) -> None:
    subprocess.run([PGBENCH, "-i", "-q", "-s", "1", cluster.dsn(0)], check=True,
                   capture_output=True, timeout=120)
    cluster.quiesce()
    before = [cluster.status(i)["overlapped_applies"] for i in (1, 2)]
    # load on one node only: the others apply everything it commits
    p = subprocess.run([PGBENCH, "-N", "-c", "4", "-j", "2", "-T", "6", "-n", "--max-tries", "100",
                        cluster.dsn(0)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    cluster.assert_identical()
    for i, b in zip((1, 2), before):
        st = cluster.status(i)
        assert st["workers"] == 4
        # independent writesets from four clients were applied at the same time
        assert st["overlapped_applies"] > b, st
    with cluster.connect(2) as c:
        tb = c.execute("SELECT count(*) FROM pgbench_history").fetchone()
    with cluster.connect(0) as c:
        assert c.execute("SELECT count(*) FROM pgbench_history").fetchone() == tb


def test_killing_apply_sessions_mid_writeset_loses_nothing(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE pa_rows (id integer PRIMARY KEY, batch integer, pad text)")
    cluster.quiesce()
    batches, per_batch = 12, 4000
    done = threading.Event()
    killed: list[int] = []

    def killer() -> None:
        # terminate node 1's apply sessions while they run a writeset (state 'active')
        with cluster.connect(1) as c:
            while not done.is_set():
                rows = c.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'chorus apply %%'"
                    " AND state = 'active' AND query LIKE '%%apply_writeset%%'").fetchall()
                for (pid,) in rows:
                    if c.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,):
                        killed.append(pid)
                time.sleep(0.005)

    t = threading.Thread(target=killer)
    t.start()
    try:
        with cluster.connect(0) as c:
            for b in range(batches):
                c.execute("INSERT INTO pa_rows SELECT g, %s, repeat('x', 100)"
                          " FROM generate_series(%s::int, %s::int) g", (b, b * per_batch, (b + 1) * per_batch - 1))
                c.execute("UPDATE pa_rows SET pad = 'updated' WHERE batch = %s AND id %% 2 = 0", (b,))
    finally:
        done.set()
        t.join(timeout=30)
    print(f"terminated {len(killed)} apply sessions mid-writeset")
    assert killed, "no apply session was caught mid-writeset"
    cluster.assert_identical()
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT count(*), count(*) FILTER (WHERE pad = 'updated') FROM pa_rows"
                             ).fetchone() == (batches * per_batch, batches * per_batch // 2)
    st = cluster.status(1)
    assert st["state"] == "online" and st["apply_retries"] >= 1, st


def test_status_reports_lag_in_gids_and_milliseconds(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE pa_lag (id integer PRIMARY KEY)")
    cluster.quiesce()
    st = cluster.status(2)
    assert st["lag_gids"] == 0 and st["lag_ms"] == 0.0, st
    # hold node 3's applier up: a local SHARE lock, idle in transaction (closed after the grace)
    blocker = cluster.connect(2, autocommit=False)
    blocker.execute("LOCK TABLE pa_lag IN SHARE MODE")
    try:
        with cluster.connect(0) as c:
            c.execute("INSERT INTO pa_lag VALUES (1)")
        time.sleep(0.4)
        st = cluster.status(2)
    finally:
        blocker.close()
    assert st["lag_gids"] >= 1 and st["lag_ms"] >= 300, st
    assert st["workers_busy"] >= 1 and "flow_control" in st, st
    cluster.assert_identical()
