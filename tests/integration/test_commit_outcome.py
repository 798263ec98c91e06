"""The outcome of a transaction whose client lost its connection at COMMIT, asked of its origin
and of the other nodes with chorus.commit_outcome(chorus.transaction_id()) (outcomes.py): the
connection cut by a proxy the moment COMMIT passes, also with the origin killed then."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Optional

import psycopg
import pytest

from conftest import Cluster, chorus

pytestmark = pytest.mark.integration


class CuttingProxy:
    """A TCP proxy to a PostgreSQL server that, once ``armed``, closes the client's side right
    after forwarding a simple query whose text starts with COMMIT: the client never hears the
    answer (psycopg: a connection error), the server runs it all the same."""

    def __init__(self, port: int, password: str) -> None:
        self.target = port
        self.password = password  # the node's: the password file names the nodes' ports only
        self.armed = threading.Event()
        self.cut = threading.Event()
        # called when COMMIT comes: before it is forwarded (with True) and after (with False)
        self.at_commit: Callable[[bool], None] = lambda before: None
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def dsn(self) -> str:
        return psycopg.conninfo.make_conninfo(host="127.0.0.1", port=self.port, dbname="postgres", user="postgres",
                                              sslmode="disable", password=self.password)

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while data := src.recv(65536):
                commit = from_client and self.armed.is_set() and data[:1] == b"Q" and data[5:11].upper() == b"COMMIT"
                if commit:
                    self.at_commit(True)
                dst.sendall(data)
                if commit:
                    self.cut.set()
                    src.shutdown(socket.SHUT_RDWR)  # the client's side: its answer never comes
                    self.at_commit(False)
                    return
        except OSError:
            pass
        finally:
            if not from_client and self.cut.is_set():
                return
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass


def outcome(c: Cluster, i: int, tid: str) -> tuple[str, Optional[int], str]:
    with c.connect(i) as conn:
        row = conn.execute("SELECT outcome, gid, detail FROM chorus.commit_outcome(%s)", (tid,)).fetchone()
        assert row is not None
        return row[0], row[1], row[2]


def settled(c: Cluster, i: int, tid: str, timeout: float = 30) -> tuple[str, Optional[int], str]:
    deadline = time.monotonic() + timeout
    while True:
        got = outcome(c, i, tid)
        if got[0] != "in doubt" or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def cut_commit(c: Cluster, proxy: CuttingProxy, key: int) -> str:
    """Insert row ``key`` through the proxy and COMMIT with the connection cut; the id."""
    conn = psycopg.connect(proxy.dsn(), autocommit=False)
    try:
        conn.execute("INSERT INTO outcome_t VALUES (%s, 'cut at commit')", (key,))
        row = conn.execute("SELECT chorus.transaction_id()").fetchone()
        assert row is not None
        tid = str(row[0])
        proxy.armed.set()
        with pytest.raises(psycopg.OperationalError):
            conn.commit()
        return tid
    finally:
        proxy.armed.clear()
        conn.close()


def test_outcomes_of_committed_aborted_and_running_transactions(cluster: Cluster) -> None:
    with cluster.connect(0) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS outcome_t (id integer PRIMARY KEY, v text)")
        conn.execute("INSERT INTO outcome_t VALUES (-1, 'hot') ON CONFLICT DO NOTHING")
    cluster.quiesce()
    with cluster.connect(0, autocommit=False) as conn:
        conn.execute("INSERT INTO outcome_t VALUES (1, 'committed')")
        done = conn.execute("SELECT chorus.transaction_id()").fetchone()
        conn.commit()
    # the loser of a certification conflict
    a, b = cluster.connect(0, autocommit=False), cluster.connect(1, autocommit=False)
    a.execute("UPDATE outcome_t SET v = 'a' WHERE id = -1")
    b.execute("UPDATE outcome_t SET v = 'b' WHERE id = -1")
    lost = b.execute("SELECT chorus.transaction_id()").fetchone()
    a.commit()
    with pytest.raises(psycopg.errors.SerializationFailure):
        b.commit()
    a.close()
    b.close()
    # rolled back on its origin, and one still running there
    with cluster.connect(2, autocommit=False) as conn:
        conn.execute("INSERT INTO outcome_t VALUES (2, 'rolled back')")
        rolled = conn.execute("SELECT chorus.transaction_id()").fetchone()
        conn.rollback()
    running_conn = cluster.connect(2, autocommit=False)
    running_conn.execute("INSERT INTO outcome_t VALUES (3, 'running')")
    running = running_conn.execute("SELECT chorus.transaction_id()").fetchone()
    assert done and lost and rolled and running
    cluster.quiesce()

    answers = [outcome(cluster, i, done[0]) for i in range(3)]
    assert {(o, g) for o, g, _ in answers} == {("committed", answers[0][1])} and answers[0][1]
    answers = [outcome(cluster, i, lost[0]) for i in range(3)]
    assert {(o, g) for o, g, _ in answers} == {("aborted", answers[0][1])}
    assert "certification" in answers[0][2]
    assert outcome(cluster, 2, rolled[0])[0] == "aborted"
    assert outcome(cluster, 0, rolled[0])[0] == "in doubt"  # n3 is online and could still send it
    assert outcome(cluster, 2, running[0])[:2] == ("in doubt", None)
    running_conn.rollback()
    running_conn.close()
    with cluster.connect(0) as conn, pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("SELECT chorus.commit_outcome('not an id')")


def test_connection_cut_at_commit(cluster: Cluster) -> None:
    with cluster.connect(0) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS outcome_t (id integer PRIMARY KEY, v text)")
    proxy = CuttingProxy(int(cluster.info["nodes"][0]["port"]), cluster.password)
    try:
        tid = cut_commit(cluster, proxy, 100)
    finally:
        proxy.close()
    answers = [settled(cluster, i, tid) for i in range(3)]
    assert [a[0] for a in answers] == ["committed"] * 3, answers
    assert len({a[1] for a in answers}) == 1
    cluster.quiesce()
    for i in range(3):
        with cluster.connect(i) as conn:
            assert conn.execute("SELECT v FROM outcome_t WHERE id = 100").fetchone() == ("cut at commit",)


def test_connection_cut_at_commit_and_the_origin_killed(cluster: Cluster) -> None:
    """The origin dies the moment COMMIT reaches it: the others answer, and the answer is what
    they hold (committed: the row is everywhere; aborted: nowhere)."""
    with cluster.connect(0) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS outcome_t (id integer PRIMARY KEY, v text)")
    cluster.quiesce()
    results: list[str] = []
    proxy = CuttingProxy(int(cluster.info["nodes"][0]["port"]), cluster.password)
    name = cluster.nodes[0].name
    # the moment: before COMMIT reaches the origin, as it does, and a little after
    moments = [(True, 0.0), (False, 0.0), (False, 0.001), (False, 0.003)]
    try:
        for key, (before, delay) in enumerate(moments, 200):
            r = chorus("local", "status", "--dir", cluster.dir, "--json")
            node = json.loads(r.stdout)["nodes"][0]
            pids = [node["coordinator_pid"], node["pg_pid"]]

            def kill(now_before: bool, when: bool = before, wait: float = delay, pids: list[int] = pids) -> None:
                if now_before == when:
                    time.sleep(wait)
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
            proxy.at_commit = kill
            tid = cut_commit(cluster, proxy, key)
            answers = [settled(cluster, i, tid, timeout=60) for i in (1, 2)]
            assert answers[0][:2] == answers[1][:2], answers
            verdict = answers[0][0]
            assert verdict in ("committed", "aborted"), answers
            results.append(verdict)
            r = chorus("local", "start", "--dir", cluster.dir, name)
            assert r.returncode == 0, r.stderr
            cluster.quiesce()
            for i in range(3):
                with cluster.connect(i) as conn:
                    held = conn.execute("SELECT count(*) FROM outcome_t WHERE id = %s", (key,)).fetchone()
                    assert held == ((1,) if verdict == "committed" else (0,)), (i, answers)
            origin_says = outcome(cluster, 0, tid)
            assert origin_says[0] in (verdict, "unknown"), origin_says  # it restarted: it may not remember
        assert results[0] == "aborted"  # killed before COMMIT reached it: nothing was ordered
    finally:
        proxy.close()
    cluster.assert_identical()
    print("outcomes with the origin killed at COMMIT:", results)


def test_the_client_helper_carries_the_id_to_look_up(cluster: Cluster) -> None:
    """run_transaction(outcome_id=True): the CommitOutcomeUnknown it raises holds the transaction
    id, and commit_outcome on another node says it committed."""
    from chorus.client import CommitOutcomeUnknown, commit_outcome, run_transaction

    with cluster.connect(0) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS outcome_t (id integer PRIMARY KEY, v text)")
    proxy = CuttingProxy(int(cluster.info["nodes"][0]["port"]), cluster.password)
    try:
        with psycopg.connect(proxy.dsn()) as conn:
            def work(c: psycopg.Connection[Any]) -> None:
                c.execute("INSERT INTO outcome_t VALUES (300, 'through the helper')")
                proxy.armed.set()
            with pytest.raises(CommitOutcomeUnknown) as e:
                run_transaction(conn, work, outcome_id=True)
    finally:
        proxy.armed.clear()
        proxy.close()
    tid = e.value.transaction_id
    assert tid and tid.startswith(cluster.nodes[0].name + ":")
    with cluster.connect(1) as conn:
        deadline = time.monotonic() + 30
        while (got := commit_outcome(conn, tid))[0] == "in doubt" and time.monotonic() < deadline:
            time.sleep(0.2)
    assert got[0] == "committed" and got[1], got
