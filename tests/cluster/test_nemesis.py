"""Jepsen-style: the list-append, bank and set workloads on every host while a randomized
nemesis (chorus/lab/nemesis.py) partitions, kills, crashes, freezes and slows the lab for about
two minutes; then everything is healed and the cluster is held to what clients were told: the
append history has no anomaly snapshot isolation forbids and no lost acknowledged append, the
bank total is intact, every acknowledged set insert is there and no failed one is, and every
table is identical on every host (issue 23; DESIGN.md invariants 7 and 8).

CHORUS_NEMESIS_SECONDS and CHORUS_NEMESIS_SEED change the run (the schedule follows the seed).
"""

from __future__ import annotations

import os
import threading

import pytest
from conftest import ACCOUNTS, INITIAL, LabCluster

from chorus import appendload
from chorus.lab.nemesis import Nemesis
from chorus.workload import Load, bank_intent_op, check_set, set_intent_op

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SECONDS = float(os.environ.get("CHORUS_NEMESIS_SECONDS", "110"))
SEED = int(os.environ.get("CHORUS_NEMESIS_SEED", "1"))


def test_randomized_faults_lose_nothing_and_break_no_isolation(healthy: LabCluster) -> None:
    lab = healthy
    nodes = lab.endpoints()
    histories: list[appendload.History] = []
    appendload.setup(nodes[0][1], appendload.Settings().keys)  # before anything breaks
    lab.assert_identical()
    appends = threading.Thread(target=lambda: histories.append(
        appendload.run(nodes, SECONDS + 8, clients_per_node=1, seed=SEED, prepared=True)), daemon=True)
    bank = Load(nodes, bank_intent_op(ACCOUNTS), workers_per_node=1).start()
    sets = Load(nodes, set_intent_op, workers_per_node=1).start()
    appends.start()
    try:
        events = Nemesis(lab.lab, lab.names, SEED, say=print).run(SECONDS)
    finally:
        lab.restore()  # healed, thawed, every host up and online
    appends.join(SECONDS + 180)
    assert histories, "the list-append workload did not end"
    results = bank.stop() + sets.stop()
    h = histories[0]
    lab.assert_identical()  # settled, and every table identical on every host
    appendload.read_final(nodes, h)
    report = appendload.check(h)
    counts = h.counts()
    print(f"\nnemesis seed {SEED}: {len(events)} events; list-append {counts}; "
          f"{len(report.violations)} forbidden anomalies")
    assert report.valid, "\n".join(f"{a.kind}: {a.description}" for a in report.violations)
    assert counts["ok"] > 100
    for n in lab.names:
        assert lab.bank_total(n) == ACCOUNTS * INITIAL, f"bank total broken on {n}"
    problems = check_set(sets.results, lab.set_rows("n1"))
    assert not problems, "\n".join(problems)
    assert sum(len(o.commit_times) for o in results) > 0
    assert any(e.what != "heal all" for e in events)
