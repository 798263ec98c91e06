"""Operating a cluster: each coordinator's Prometheus endpoint scraped and parsed with
prometheus_client's parser, the extension's views (chorus.node, chorus.members, chorus.conflicts)
read with SQL, and the health checks asked with a real HTTP client of a node that is online,
without its database, outside the primary component, starting and catching up, and whose
coordinator is stopping (docs/OPERATIONS.md)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chorus.testkit.localcluster import LocalCluster
from conftest import Cluster, chorus, extra_cluster

pytestmark = pytest.mark.integration


def http_port(c: Cluster, i: int) -> int:
    return int(c.info["nodes"][i]["http"].rsplit(":", 1)[1])


def get(port: int, path: str, timeout: float = 5) -> tuple[int, dict[str, Any] | str]:
    """(status, the JSON answer or the text); (0, why) when nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            body = r.read().decode()
            return r.status, json.loads(body) if r.headers.get_content_type() == "application/json" else body
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
        return 0, str(e)


def checks(port: int) -> tuple[int, int, int]:
    return get(port, "/health")[0], get(port, "/writable")[0], get(port, "/ready")[0]


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, text = get(port, "/metrics")
    assert code == 200 and isinstance(text, str)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def conflict_on(c: Cluster, table: str, key: int) -> tuple[int, str]:
    """Two transactions on n1 and n2 write row ``key``: n1's commits first, n2's loses (40001).
    The loser's xid and node."""
    a, b = c.connect(0, autocommit=False), c.connect(1, autocommit=False)
    try:
        a.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", (key,))
        b.execute(f"UPDATE {table} SET v = v + 10 WHERE id = %s", (key,))
        xid = b.execute("SELECT txid_current()").fetchone()
        assert xid is not None
        a.commit()
        with pytest.raises(psycopg.errors.SerializationFailure):
            b.commit()
        return int(xid[0]) & 0xFFFFFFFF, c.nodes[1].name
    finally:
        a.close()
        b.close()


def test_metrics_and_views_show_the_cluster_and_its_conflicts(cluster: Cluster) -> None:
    with cluster.connect(0) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS ops_hot (id integer PRIMARY KEY, v integer)")
        conn.execute("INSERT INTO ops_hot SELECT g, 0 FROM generate_series(1, 10) g ON CONFLICT DO NOTHING")
        conn.execute("DROP ROLE IF EXISTS ops_watcher")
        conn.execute("CREATE ROLE ops_watcher LOGIN PASSWORD 'ops-watcher-pw'")
    cluster.quiesce()
    before = [metrics(http_port(cluster, i)) for i in range(3)]
    loser_xid, loser_node = conflict_on(cluster, "ops_hot", 7)
    st = cluster.quiesce()
    committed = max(s["committed_gid"] for s in st.values())

    for i in range(3):
        m = metrics(http_port(cluster, i))
        assert m[("chorus_phase", (("chorus_phase", "online"),))] == 1
        assert m[("chorus_accepts_writes", ())] == 1 and m[("chorus_quorate", ())] == 1
        assert m[("chorus_gid", (("kind", "committed"),))] == committed
        assert m[("chorus_members_online", ())] == 3
        failures = ("chorus_certification_failures_total", (("table", "public.ops_hot"),))
        # every node certifies alike: each counts the conflict
        assert m[failures] == before[i].get(failures, 0) + 1
        assert m[("chorus_bus_bytes_received_total", ())] > before[i][("chorus_bus_bytes_received_total", ())]
        assert m[("chorus_wslog_gid", (("end", "high"),))] == committed
        assert m[("chorus_apply_lag_gids", ())] == 0
    assert metrics(http_port(cluster, 1))[("chorus_local_certification_failures_total", ())] == \
        before[1][("chorus_local_certification_failures_total", ())] + 1

    seen = []
    for i in range(3):
        with cluster.connect(i) as conn:
            node = conn.execute("SELECT name, phase, accepts_writes, quorate, committed_gid, members_online "
                                "FROM chorus.node").fetchall()
            assert node == [(cluster.nodes[i].name, "online", True, True, committed, 3)]
            members = conn.execute("SELECT name, this_node, phase FROM chorus.members ORDER BY name").fetchall()
            assert members == [(n.name, n.name == cluster.nodes[i].name, "online") for n in cluster.nodes]
            rows = conn.execute("SELECT gid, schema_name, table_name, key, winner_gid, winner_node, loser_node, "
                                "loser_xid FROM chorus.conflicts WHERE table_name = 'ops_hot'").fetchall()
            assert rows and rows[-1][1:4] == ("public", "ops_hot", "(id)=(7)")
            assert rows[-1][5:] == (cluster.nodes[0].name, loser_node, loser_xid)
            assert rows[-1][4] < rows[-1][0]
            seen.append(rows[-1])
    assert seen[0] == seen[1] == seen[2]  # the same conflict, the same GIDs, on every node

    with psycopg.connect(cluster.dsn_as(2, "ops_watcher", "ops-watcher-pw"), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM chorus.members").fetchone() == (3,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM chorus.conflicts")

    r = chorus("status", "--config", cluster.info["nodes"][0]["config"], "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [m["name"] for m in doc["members_view"]] == [n.name for n in cluster.nodes]
    assert any(c["table"] == "ops_hot" and c["key"] == "(id)=(7)" for c in doc["conflicts"])
    r = chorus("status", "--config", cluster.info["nodes"][0]["config"])
    assert r.returncode == 0 and "recent certification conflicts" in r.stdout and "(id)=(7)" in r.stdout
    r = chorus("local", "status", "--dir", cluster.dir, "--json")
    assert r.returncode == 0
    assert [(n["state"], n["accepts_writes"], n["lag_gids"]) for n in json.loads(r.stdout)["nodes"]] == \
        [("online", True, 0)] * 3


def _watch(port: int, stop: threading.Event, seen: list[tuple[int, int, str, str]]) -> None:
    """Ask /health and /ready every 20 ms, noting each (health status, ready status, phase, why)
    that differs from the last: the phase as /ready saw it (the node may go online between the
    two requests), why as /health said. One last look after ``stop``, so that the last entry is
    never older than what made the caller stop."""
    while True:
        last = stop.is_set()
        code, doc = get(port, "/health", timeout=1)
        ready, ready_doc = get(port, "/ready", timeout=1)
        phase = ready_doc.get("phase", "") if isinstance(ready_doc, dict) else ""
        entry = (code, ready, phase, doc.get("why", "") if isinstance(doc, dict) else "")
        if not seen or seen[-1] != entry:
            seen.append(entry)
        if last:
            return
        time.sleep(0.02)


def test_health_checks_follow_the_node() -> None:
    with extra_cluster("chorus-ops-", 75) as c:
        lc = LocalCluster(c.dir)
        ports = [http_port(c, i) for i in range(3)]
        # online
        assert [checks(p) for p in ports] == [(200, 200, 200)] * 3
        code, doc = get(ports[0], "/writable")
        assert isinstance(doc, dict) and doc["node"] == "n1" and doc["ok"] and doc["accepts_writes"]
        c.quiesce()
        assert get(ports[1], "/ready?lag=0")[0] == 200 and get(ports[1], "/ready?lag=x")[0] == 400

        # n3's PostgreSQL is gone: its coordinator runs on, and says so
        r = chorus("local", "kill", "--dir", c.dir, "n3", "--what", "postgres")
        assert r.returncode == 0, r.stderr
        wait_for("n3 unhealthy", lambda: checks(ports[2]) == (503, 503, 503))
        assert "database" in str(get(ports[2], "/health")[1])
        assert checks(ports[0]) == (200, 200, 200)
        r = chorus("local", "start", "--dir", c.dir, "n3")
        assert r.returncode == 0, r.stderr
        wait_for("n3 healthy again", lambda: checks(ports[2]) == (200, 200, 200))

        # starting and catching up: from the coordinator's start on, 503 until it is online
        with c.connect(0) as conn:
            conn.execute("CREATE TABLE ops_rows (id integer PRIMARY KEY, v integer)")
        c.quiesce()
        r = chorus("local", "stop", "--dir", c.dir, "n3")
        assert r.returncode == 0, r.stderr
        with c.connect(0) as conn:
            for k in range(1500):
                conn.execute("INSERT INTO ops_rows VALUES (%s, %s)", (k, k))
        stop, seen = threading.Event(), list[tuple[int, int, str, str]]()
        watcher = threading.Thread(target=_watch, args=(ports[2], stop, seen))
        watcher.start()
        try:
            lc.start("n3", wait=False)
            wait_for("n3 online", lambda: get(ports[2], "/ready")[0] == 200, timeout=120)
        finally:
            stop.set()
            watcher.join()
        # not ready until online; alive (health) once connected to its database
        assert all(e[1] in (0, 503) for e in seen if e[2] != "online"), seen  # 0: not listening yet
        assert (200, 503, "recovering", "running") in seen, seen  # caught up from a partner's log
        assert seen[-1][:3] == (200, 200, "online")

        # n1 alone: outside the primary component, alive but neither writable nor ready
        for name in ("n2", "n3"):
            r = chorus("local", "stop", "--dir", c.dir, name)
            assert r.returncode == 0, r.stderr
        wait_for("n1 outside the primary component", lambda: checks(ports[0]) == (200, 503, 503))
        code, doc = get(ports[0], "/ready")
        assert isinstance(doc, dict) and doc["phase"] == "non-primary", doc
        with c.connect(0) as conn:
            assert conn.execute("SELECT phase, quorate, accepts_writes FROM chorus.node").fetchone() == \
                ("non-primary", False, False)
        for name in ("n2", "n3"):  # the primary component re-forms once every node is back (MEMBERSHIP.md)
            lc.start(name, wait=False)
        wait_for("all online", lambda: [checks(p) for p in ports] == [(200, 200, 200)] * 3, timeout=120)

        # n1's coordinator stopping: an applier waits for a local session's row lock (for the
        # idle blocker grace, 1 s), so the shutdown takes that long; meanwhile 503, "stopping"
        with c.connect(0) as conn:
            conn.execute("INSERT INTO ops_rows VALUES (-1, 0)")
        c.quiesce()
        blocker = c.connect(0, autocommit=False)
        blocker.execute("UPDATE ops_rows SET v = 1 WHERE id = -1")
        with c.connect(1) as conn:
            conn.execute("UPDATE ops_rows SET v = 2 WHERE id = -1")
        with c.connect(0) as conn:
            wait_for("the applier waiting for the row lock", lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'chorus apply%' "
                "AND wait_event_type = 'Lock'").fetchone() == (1,), timeout=10)
        stop, seen = threading.Event(), list[tuple[int, int, str, str]]()
        watcher = threading.Thread(target=_watch, args=(ports[0], stop, seen))
        watcher.start()
        pid: Optional[int] = c.info["nodes"][0]["coordinator_pid"]
        assert pid
        try:
            os.kill(pid, signal.SIGTERM)
            wait_for("n1's endpoints to close", lambda: seen and seen[-1][0] == 0, timeout=60)
        finally:
            stop.set()
            watcher.join()
            blocker.close()
        assert (503, 503, "online", "the coordinator is stopping") in seen, seen
        r = chorus("local", "start", "--dir", c.dir, "n1")
        assert r.returncode == 0, r.stderr
        c.quiesce()
        c.assert_identical()
