"""Jepsen-style consistency suite on a 3-node cluster (issue: certification under concurrency).

Workers are bound to one node each, retry certification losses (40001) and record what they were
told committed. After the load the cluster must be quiescent and every node must hold exactly
what the clients were told. Each check names what differs (node, table, key).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time
from collections import Counter
from typing import Any, Optional

import psycopg
import pytest

from chorus.testkit import workload as wl
from conftest import Cluster, chorus, commit_all

pytestmark = pytest.mark.integration

SECONDS = float(os.environ.get("CHORUS_CONSISTENCY_SECONDS", "8"))


def _nodes(cluster: Cluster) -> list[tuple[str, str]]:
    return [(n.name, n.dsn) for n in cluster.nodes]


def _summary(name: str, results: list[wl.WorkerResult]) -> dict[str, Any]:
    commits = sum(r.commits for r in results)
    conflicts = sum(r.conflicts for r in results)
    errors = [e for r in results for e in r.errors]
    out = {"workload": name, "commits": commits, "tps": round(commits / SECONDS, 1),
           "abort_rate": round(conflicts / max(1, commits + conflicts), 3),
           "refused": sum(r.refused for r in results)}
    print(f"\n{name}: {out}")
    assert not errors, f"{name}: unexpected errors: {errors[:5]}"
    assert commits > 0, f"{name}: nothing committed"
    return out


def _on_every_node(cluster: Cluster, query: str) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    for i, n in enumerate(cluster.nodes):
        with cluster.connect(i) as c:
            out[n.name] = c.execute(query).fetchall()
    return out


def test_bank_total_never_changes(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute(wl.BANK_SCHEMA)
    cluster.quiesce()
    wl.bank_setup(cluster.dsn(0), 50, 1000)
    cluster.quiesce()
    results = wl.run_bank(_nodes(cluster), 50, SECONDS)
    _summary("bank", results)
    cluster.assert_identical()
    for name, rows in _on_every_node(cluster, "SELECT sum(balance), count(*) FROM bank_accounts").items():
        assert rows == [(50 * 1000, 50)], f"{name}: bank total {rows}"


def test_counter_equals_acknowledged_increments(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute(wl.COUNTER_SCHEMA)
        c.execute("INSERT INTO jepsen_counter VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET n = 0")
    cluster.quiesce()
    results = wl.run_workload(_nodes(cluster), wl.counter_op, SECONDS)
    _summary("counter", results)
    acked = sum(len(r.acked) for r in results)
    cluster.assert_identical()
    for name, rows in _on_every_node(cluster, "SELECT n FROM jepsen_counter WHERE id = 1").items():
        assert rows == [(acked,)], f"{name}: counter is {rows[0][0]}, clients were told {acked}"


def test_set_holds_exactly_the_acknowledged_rows(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute(wl.SET_SCHEMA)
    cluster.quiesce()
    results = wl.run_workload(_nodes(cluster), wl.set_op, SECONDS, expected=frozenset({"23505"}))
    _summary("set", results)
    acked = [tuple(a) for r in results for a in r.acked]
    assert len(set(a[0] for a in acked)) == len(acked), "two acknowledged rows share a primary key"
    assert len(set(a[1] for a in acked)) == len(acked), "two acknowledged rows share a unique value"
    cluster.assert_identical()
    want = set(acked)
    for name, rows in _on_every_node(cluster, "SELECT id, u, node FROM jepsen_set").items():
        have = set(rows)
        missing, extra = want - have, have - want
        assert not missing, f"{name}: acknowledged rows missing (id, u, node): {sorted(missing)[:10]}"
        assert not extra, f"{name}: rows nobody was told committed: {sorted(extra)[:10]}"


def _two_nodes_commit(cluster: Cluster, statements: tuple[str, str]) -> list[str]:
    """Run one statement on node 0 and one on node 1, each in its own open transaction, then
    commit both."""
    conns = [cluster.connect(i, autocommit=False) for i in (0, 1)]
    for c, stmt in zip(conns, statements):
        c.execute(stmt)
    return commit_all(conns)


@pytest.mark.parametrize("index, rows", [
    ("CREATE UNIQUE INDEX IF NOT EXISTS uk_email_lower ON uk_t (lower(email))",
     ("INSERT INTO uk_t VALUES (1, 'Ann@Example.org', 1, 1)", "INSERT INTO uk_t VALUES (2, 'ann@example.ORG', 2, 2)")),
    ("CREATE UNIQUE INDEX IF NOT EXISTS uk_ab ON uk_t (a, b)",
     ("INSERT INTO uk_t VALUES (3, 'x3', 7, 8)", "INSERT INTO uk_t VALUES (4, 'x4', 7, 8)")),
    ("CREATE UNIQUE INDEX IF NOT EXISTS uk_a_partial ON uk_t (a) WHERE b > 100",
     ("INSERT INTO uk_t VALUES (5, 'x5', 9, 101)", "INSERT INTO uk_t VALUES (6, 'x6', 9, 102)")),
])
def test_unique_indexes_of_every_kind_conflict_across_nodes(cluster: Cluster, index: str,
                                                            rows: tuple[str, str]) -> None:
    """Different primary keys, same value in a unique index on an expression, on several columns,
    or a partial one: exactly one commits, and every node holds that one."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS uk_t (id integer PRIMARY KEY, email text, a integer, b integer)")
    with cluster.connect(0) as c:
        c.execute(index)
    cluster.quiesce()
    outcomes = _two_nodes_commit(cluster, rows)
    assert sorted(outcomes) == ["40001", "ok"], outcomes
    cluster.quiesce()
    cluster.assert_identical()
    with cluster.connect(0) as c:
        c.execute("DROP INDEX " + index.split()[6])
        c.execute("DELETE FROM uk_t")
    cluster.quiesce()


def test_foreign_keys_never_leave_orphans(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        for stmt in wl.FK_SCHEMA:
            c.execute(stmt)
        c.execute("INSERT INTO jepsen_parent SELECT g FROM generate_series(0, %s) g ON CONFLICT DO NOTHING",
                  (wl.FK_PARENTS - 1,))
    cluster.quiesce()
    results = wl.run_workload(_nodes(cluster), wl.fk_op, SECONDS,
                              expected=frozenset({"23503", "23505"}))
    out = _summary("foreign keys", results)
    kinds = Counter(a[0] for r in results for a in r.acked)
    assert kinds["child"] > 0 and kinds["parent-"] > 0, kinds
    cluster.assert_identical()
    for name, rows in _on_every_node(
            cluster, "SELECT c.id, c.parent FROM jepsen_child c "
                     "LEFT JOIN jepsen_parent p ON p.id = c.parent WHERE p.id IS NULL").items():
        assert not rows, f"{name}: children without their parent (id, parent): {rows[:10]}"
    assert out["commits"] > 0


def test_children_of_one_parent_from_two_nodes_both_commit(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        for stmt in wl.FK_SCHEMA:
            c.execute(stmt)
        c.execute("INSERT INTO jepsen_parent VALUES (100000) ON CONFLICT DO NOTHING")
    cluster.quiesce()
    conns = [cluster.connect(i, autocommit=False) for i in (1, 2)]
    for i, c in zip((1, 2), conns):
        c.execute("INSERT INTO jepsen_child (parent, node) VALUES (100000, %s)", (f"n{i}",))
    for c in conns:  # both reference the parent: reference keys do not conflict
        c.commit()
        c.close()
    # a child and a delete of its parent, concurrently: exactly one wins
    child = cluster.connect(1, autocommit=False)
    child.execute("INSERT INTO jepsen_parent VALUES (100001)")
    child.commit()
    cluster.quiesce()
    child.execute("INSERT INTO jepsen_child (parent, node) VALUES (100001, 'n1')")
    deleter = cluster.connect(2, autocommit=False)
    deleter.execute("DELETE FROM jepsen_parent WHERE id = 100001")
    outcomes = commit_all([child, deleter])
    assert sorted(outcomes) == ["40001", "ok"], outcomes
    cluster.assert_identical()


def test_lost_update_is_impossible(cluster: Cluster) -> None:
    """Two REPEATABLE READ read-modify-writes of one row on two nodes: one loses (40001)."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS iso_acct (id integer PRIMARY KEY, v integer NOT NULL)")
        c.execute("INSERT INTO iso_acct VALUES (1, 100) ON CONFLICT (id) DO UPDATE SET v = 100")
    cluster.quiesce()
    conns = [cluster.connect(i, autocommit=False) for i in (0, 1)]
    for c in conns:
        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        v = c.execute("SELECT v FROM iso_acct WHERE id = 1").fetchone()[0]
        c.execute("UPDATE iso_acct SET v = %s WHERE id = 1", (v + 10,))
    results = commit_all(conns)
    assert sorted(results) == ["40001", "ok"], results
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT v FROM iso_acct WHERE id = 1").fetchone() == (110,)


def test_write_skew_behaves_as_snapshot_isolation(cluster: Cluster) -> None:
    """As in one PostgreSQL under REPEATABLE READ: disjoint writes based on the same snapshot
    both commit (write skew is allowed by snapshot isolation)."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS iso_oncall (doctor text PRIMARY KEY, on_call boolean NOT NULL)")
        c.execute("INSERT INTO iso_oncall VALUES ('alice', true), ('bob', true) "
                  "ON CONFLICT (doctor) DO UPDATE SET on_call = true")
    cluster.quiesce()
    conns = [cluster.connect(i, autocommit=False) for i in (0, 1)]
    for c, who in zip(conns, ("alice", "bob")):
        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        n = c.execute("SELECT count(*) FROM iso_oncall WHERE on_call").fetchone()[0]
        assert n == 2
        c.execute("UPDATE iso_oncall SET on_call = false WHERE doctor = %s", (who,))
    for c in conns:
        c.commit()
        c.close()
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT count(*) FROM iso_oncall WHERE on_call").fetchone() == (0,)


def _commit_into(outcome: dict[str, Any], name: str, conn: psycopg.Connection[Any], statement: Optional[str]) -> None:
    """Run ``statement`` (if any) and COMMIT on ``conn``; ``outcome[name]``: "committed" or the error."""
    try:
        if statement:
            conn.execute(statement)
        conn.commit()
        outcome[name] = "committed"
    except psycopg.Error as e:
        outcome[name] = e


def _waits(c: psycopg.Connection[Any], pid: int, event: str) -> None:
    """Until backend ``pid`` waits on ``event`` (a wait event or its type), 10 s at most."""
    deadline = time.monotonic() + 10
    state = None
    while time.monotonic() < deadline:
        state = c.execute("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s",
                          (pid,)).fetchone()
        if state and event in state:
            return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited on {event}: {state}")


def test_certified_transaction_whose_backend_dies_is_replayed(cluster: Cluster) -> None:
    """A backend killed after its transaction was certified, while it waits for its commit turn:
    the coordinator commits it from its writeset, on its own node as on the others."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS replay_t (id integer PRIMARY KEY, v text)")
        c.execute("INSERT INTO replay_t VALUES (1, 'a'), (2, 'b') ON CONFLICT (id) DO NOTHING")
    cluster.quiesce()
    # hold node 0's applier: an idle transaction there holds row 1 (ended after the grace period)
    holder = cluster.connect(0, autocommit=False)
    holder.execute("UPDATE replay_t SET v = 'held' WHERE id = 1")
    with cluster.connect(1) as c:
        c.execute("UPDATE replay_t SET v = 'remote' WHERE id = 1")  # certified; waits on node 0
    # a local transaction on node 0, certified after it, waits for its commit turn
    victim = cluster.connect(0, autocommit=False)
    pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
    victim.execute("UPDATE replay_t SET v = 'replayed' WHERE id = 2")
    errors: list[Any] = []

    def commit() -> None:
        try:
            victim.commit()
        except psycopg.Error as e:
            errors.append(e)

    t = threading.Thread(target=commit)
    t.start()
    with cluster.connect(0) as c:
        _waits(c, pid, "Extension")  # certified, waiting for its turn
        c.execute("SELECT pg_terminate_backend(%s)", (pid,))
    t.join(10)
    assert errors, "the killed backend's client should see its connection end"
    holder.close()
    cluster.assert_identical()
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT v FROM replay_t ORDER BY id").fetchall() == [("remote",), ("replayed",)]
    assert cluster.status(0)["replayed"] >= 1


def test_a_local_transaction_that_changed_a_replayed_transactions_rows_is_refused(cluster: Cluster) -> None:
    """A local transaction certified, then terminated while it waits for its commit turn, releases
    its row locks uncommitted; another session of the same node that was waiting for one of them
    changes the row as it was before it. Certification does not compare writesets of one node, so
    that transaction is refused at its commit (40001), or the replayed one's change would be lost
    (found by the lab: a bank transfer's debit lost after a PostgreSQL kill, nemesis seed 20)."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS lost_acct (id integer PRIMARY KEY, balance integer NOT NULL)")
        c.execute("INSERT INTO lost_acct VALUES (1, 0), (2, 100) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance")
    cluster.quiesce()
    # hold node 0's applier: an idle transaction there holds row 1 (ended after the grace period)
    holder = cluster.connect(0, autocommit=False)
    holder.execute("UPDATE lost_acct SET balance = -1 WHERE id = 1")
    with cluster.connect(1) as c:
        c.execute("UPDATE lost_acct SET balance = 1 WHERE id = 1")  # certified; waits on node 0
    # a local debit on node 0, certified after it, waits for its commit turn
    victim = cluster.connect(0, autocommit=False)
    pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
    victim.execute("UPDATE lost_acct SET balance = balance - 10 WHERE id = 2")
    # a local credit on node 0 waits for the debit's row lock
    other = cluster.connect(0, autocommit=False)
    other_pid = other.execute("SELECT pg_backend_pid()").fetchone()[0]
    outcome: dict[str, Any] = {}
    commit = functools.partial(_commit_into, outcome)

    threads = [threading.Thread(target=commit, args=("victim", victim, None)),
               threading.Thread(target=commit, args=("other", other,
                                                     "UPDATE lost_acct SET balance = balance + 5 WHERE id = 2"))]
    threads[0].start()
    with cluster.connect(0) as c:
        _waits(c, pid, "Extension")  # certified, waiting for its turn
        threads[1].start()
        _waits(c, other_pid, "Lock")  # waiting for the debit's row
        c.execute("SELECT pg_terminate_backend(%s)", (pid,))
    for t in threads:
        t.join(20)
    holder.close()
    assert isinstance(outcome.get("victim"), psycopg.Error), outcome
    refused = outcome.get("other")
    assert isinstance(refused, psycopg.Error) and refused.sqlstate == "40001", outcome
    assert "applied from its writeset" in str(refused)
    cluster.quiesce()
    cluster.assert_identical()
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT balance FROM lost_acct WHERE id = 2").fetchone() == (90,)
    # once the debit is committed here, a retry sees it
    with cluster.connect(0) as c:
        c.execute("UPDATE lost_acct SET balance = balance + 5 WHERE id = 2")
    cluster.quiesce()
    with cluster.connect(2) as c:
        assert c.execute("SELECT balance FROM lost_acct WHERE id = 2").fetchone() == (95,)


def test_a_session_terminated_while_it_waits_for_its_verdict_learns_it_before_its_rows_go(cluster: Cluster) -> None:
    """The same with the debit's session terminated before its verdict came (its coordinator
    frozen meanwhile): the session's abort reads the verdict before it releases its row locks,
    so the credit waiting for the row is refused at its commit; the debit is committed from its
    writeset everywhere."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS lost_acct2 (id integer PRIMARY KEY, balance integer NOT NULL)")
        c.execute("INSERT INTO lost_acct2 VALUES (1, 100) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance")
    cluster.quiesce()
    victim = cluster.connect(0, autocommit=False)
    pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
    victim.execute("UPDATE lost_acct2 SET balance = balance - 10 WHERE id = 1")
    other = cluster.connect(0, autocommit=False)
    other_pid = other.execute("SELECT pg_backend_pid()").fetchone()[0]
    outcome: dict[str, Any] = {}
    commit = functools.partial(_commit_into, outcome)

    # the coordinator running now (an earlier test may have started it again)
    r = chorus("local", "status", "--dir", cluster.dir, "--json")
    coordinator = int(json.loads(r.stdout)["nodes"][0]["coordinator_pid"])
    os.kill(coordinator, signal.SIGSTOP)  # the debit's verdict waits
    try:
        threads = [threading.Thread(target=commit, args=("victim", victim, None)),
                   threading.Thread(target=commit, args=("other", other,
                                                         "UPDATE lost_acct2 SET balance = balance + 5 WHERE id = 1"))]
        threads[0].start()
        with cluster.connect(0) as c:
            _waits(c, pid, "Extension")  # waiting for its verdict
            threads[1].start()
            _waits(c, other_pid, "Lock")  # waiting for the debit's row
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))
            time.sleep(0.5)  # the victim's abort waits for the verdict, holding its rows
    finally:
        os.kill(coordinator, signal.SIGCONT)
    for t in threads:
        t.join(30)
    assert isinstance(outcome.get("victim"), psycopg.Error), outcome
    refused = outcome.get("other")
    assert isinstance(refused, psycopg.Error) and refused.sqlstate == "40001", outcome
    cluster.quiesce()
    cluster.assert_identical()
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT balance FROM lost_acct2 WHERE id = 1").fetchone() == (90,)
