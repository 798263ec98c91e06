"""Membership under faults on a 3-host lab (docs/ARCHITECTURE.md invariants 7 and 8; seed 8.3, 8.4, 14).

Each scenario runs the bank and set workloads on every host while it breaks something, puts it
right, and then holds the cluster to what the clients were told: every acknowledged insert is
on every node, no insert that certainly failed is anywhere, the bank's total is intact, and
every table is identical on every node.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg
import pytest
from conftest import ACCOUNTS, INITIAL, LabCluster

from chorus.testkit.workload import Load, bank_intent_op, check_set, set_intent_op

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


class Workloads:
    def __init__(self, lab: LabCluster) -> None:
        self.lab = lab
        self.bank = Load(lab.endpoints(), bank_intent_op(ACCOUNTS), workers_per_node=1)
        self.set = Load(lab.endpoints(), set_intent_op, workers_per_node=1)

    def __enter__(self) -> "Workloads":
        self.bank.start()
        self.set.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.results = self.bank.stop() + self.set.stop()
        self.set_results = self.set.results

    def commits(self, node: str | None = None, since: float = 0.0) -> int:
        return sum(1 for o in self.bank.results + self.set.results if node in (None, o.node)
                   for t in o.commit_times if t >= since)


def check(lab: LabCluster, w: Workloads) -> None:
    lab.assert_identical()
    for n in lab.names:
        assert lab.bank_total(n) == ACCOUNTS * INITIAL, f"bank total broken on {n}"
    rows = lab.set_rows("n1")
    problems = check_set(w.set_results, rows)
    assert not problems, "\n".join(problems)
    acked = sum(len(o.commit_times) for o in w.results)
    assert acked > 0, "no transaction committed at all"


def refused_write(lab: LabCluster, node: str) -> psycopg.Error:
    with psycopg.connect(lab.dsn(node), autocommit=True) as c:
        with pytest.raises(psycopg.Error) as e:
            c.execute("INSERT INTO jepsen_set (id, u, node) VALUES (-1, -1, 'probe')")
        c.execute("SELECT count(*) FROM bank_accounts")  # reads keep working
    return e.value


def test_partition_two_one_then_heal(healthy: LabCluster) -> None:
    lab = healthy
    with Workloads(lab) as w:
        time.sleep(2)
        lab.lab.partition([[1, 2], [3]])
        st = lab.wait_state("n3", ("non-primary",), timeout=20)
        assert "quorate" in st["reason"]
        err = refused_write(lab, "n3")
        assert err.sqlstate == "25006" and "quorate partition" in str(err), str(err)
        # what a load balancer's health checks see (docs/OPERATIONS.md)
        assert [lab.http("n3", p) for p in ("/health", "/writable", "/ready")] == [200, 503, 503]
        assert [lab.http("n1", p) for p in ("/health", "/writable", "/ready")] == [200, 200, 200]
        during = time.monotonic()
        time.sleep(4)
        assert w.commits("n1", during) + w.commits("n2", during) > 0, "the majority stopped committing"
        assert w.commits("n3", during + 1) == 0, "the minority committed"
        lab.lab.heal()
        lab.wait_state("n3", ("online",), timeout=60)  # through partial recovery, by itself
        assert lab.http("n3", "/writable") == 200
        time.sleep(2)
    assert w.commits("n3") > 0
    check(lab, w)


def test_kill_one_host_and_restart_it(healthy: LabCluster) -> None:
    lab = healthy
    with Workloads(lab) as w:
        time.sleep(2)
        lab.lab.kill_host("n3")
        killed = time.monotonic()
        time.sleep(9)
        assert w.commits("n1", killed + 7) + w.commits("n2", killed + 7) > 0, "survivors stopped committing"
        lab.lab.restart_host("n3")
        time.sleep(2)
    check(lab, w)


def test_delay_and_loss_on_every_link(healthy: LabCluster) -> None:
    lab = healthy
    lab.lab.netem("delay 50ms loss 5%")
    start = time.monotonic()
    with Workloads(lab) as w:
        time.sleep(12)
    elapsed = time.monotonic() - start
    lab.lab.netem("")
    lat = [x for o in w.results for x in o.latencies_ms]
    print(f"\n50 ms delay, 5 % loss: {sum(len(o.commit_times) for o in w.results) / elapsed:.1f} commits/s, "
          f"commit latency p50 {statistics.median(lat) if lat else 0:.0f} ms, "
          f"p95 {statistics.quantiles(lat, n=20)[-1] if len(lat) > 20 else 0:.0f} ms")
    check(lab, w)


def test_freeze_the_leader_longer_than_the_token_timeout(healthy: LabCluster) -> None:
    """n1 has the lowest node id: Corosync's ring representative. Frozen for longer than the
    token timeout (2.65 s with three nodes), the others form a new membership and go on; n1, resumed, finds it was
    cut off and rejoins through partial recovery without committing anything the others lack."""
    lab = healthy
    with Workloads(lab) as w:
        time.sleep(2)
        lab.lab.freeze("n1")
        frozen = time.monotonic()
        time.sleep(7)
        lab.lab.thaw("n1")
        assert w.commits("n2", frozen + 5) + w.commits("n3", frozen + 5) > 0, "the others stopped committing"
        lab.wait_all_online(60)
        time.sleep(2)
    check(lab, w)


def test_partition_with_no_quorate_side_then_heal(healthy: LabCluster) -> None:
    """1|1|1: no side is quorate, every node refuses writes. After the heal no member has the
    primary component to rejoin; with every configured node back, the one with the highest GID
    starts the cluster again at its GID and the others catch up from it, by themselves."""
    lab = healthy
    with Workloads(lab) as w:
        time.sleep(2)
        lab.lab.partition([[1], [2], [3]])
        for n in lab.names:
            lab.wait_state(n, ("non-primary",), timeout=20)
        during = time.monotonic()
        time.sleep(3)
        assert w.commits(None, during + 1) == 0, "a node committed without a quorum"
        lab.lab.heal()
        lab.wait_all_online(60)
        healed = time.monotonic()
        time.sleep(3)
        assert w.commits(None, healed) > 0, "nothing committed after the cluster re-formed"
    check(lab, w)


def test_every_host_crashes_and_restarts(healthy: LabCluster) -> None:
    """A power cut: every host is killed at once and started again. Nobody is online to answer;
    the cluster re-forms from the node with the highest GID, by itself, and every acknowledged
    transaction is still there."""
    lab = healthy
    with Workloads(lab) as w:
        time.sleep(3)
        for n in lab.names:
            lab.lab.kill_host(n)
        time.sleep(1)
        for n in lab.names:
            lab.lab.restart_host(n, wait=False)
        lab.wait_all_online(90)
        back = time.monotonic()
        time.sleep(3)
        assert w.commits(None, back) > 0, "nothing committed after the restart"
    check(lab, w)
