"""The list-append workload on every node at once, checked as Jepsen's Elle does (issue 23;
docs/CHECKER.md): no cycle snapshot isolation forbids, no lost acknowledged append, no garbage
or aborted read, and every node ends with the same lists. (Faults come with the nemesis.)"""

from __future__ import annotations

import dataclasses

import pytest

from chorus.testkit import appendload, elle
from chorus.testkit.localcluster import PlainPostgres
from conftest import Cluster, plain_database

pytestmark = pytest.mark.integration


def test_list_append_on_every_node_is_snapshot_isolated_and_loses_nothing(cluster: Cluster) -> None:
    nodes = [(n.name, n.dsn) for n in cluster.nodes]
    h = appendload.run(nodes, seconds=12, clients_per_node=2, seed=3)
    cluster.quiesce()
    appendload.read_final(nodes, h)
    report = appendload.check(h)
    assert h.errors == []
    counts = h.counts()
    assert counts["ok"] > 200 and counts["fail"] > 0  # conflicts happen on hot keys: 40001, retried
    assert report.valid, "\n".join(f"{a.kind}: {a.description}" for a in report.violations)
    lists = [[op for op in t.ops] for t in h.final]
    assert lists[0] == lists[1] == lists[2]  # every node holds the same lists
    # the checker is not blind on this history: one acknowledged value taken out of one node's
    # final read is a lost append
    first = h.final[0]
    victim = next(i for i, op in enumerate(first.ops) if isinstance(op, elle.Read) and op.seen)
    op = first.ops[victim]
    assert isinstance(op, elle.Read)
    cut = dataclasses.replace(first, ops=(*first.ops[:victim], elle.Read(op.key, op.seen[:-1]),
                                          *first.ops[victim + 1:]))
    broken = elle.check(h.txns, [cut, *h.final[1:]])
    assert not broken.valid


def test_a_single_plain_postgresql_gives_a_valid_history(plain: PlainPostgres) -> None:
    """The checker's reference: one plain PostgreSQL (no Chorus) at REPEATABLE READ, the same
    workload from six clients. It must find nothing forbidden (write skew, G2, it may list)."""
    with plain_database(plain, "append_reference") as dsn:
        nodes = [("plain", dsn)]
        h = appendload.run(nodes, seconds=8, clients_per_node=6, seed=4)
        appendload.read_final(nodes, h)
        report = appendload.check(h)
    assert h.errors == [] and h.counts()["ok"] > 200 and h.counts()["fail"] > 0
    assert report.valid, "\n".join(f"{a.kind}: {a.description}" for a in report.violations)
