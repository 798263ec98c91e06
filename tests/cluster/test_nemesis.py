"""Jepsen-style: the list-append, bank and set workloads on every host while a randomized
nemesis (chorus/testkit/lab/nemesis.py) partitions, kills, crashes, freezes and slows the lab for about
two minutes; then everything is healed and the cluster must come back by itself within the
recovery timeout and be held to what clients were told: the append history has no anomaly
snapshot isolation forbids and no lost acknowledged append, the bank total is intact, every
acknowledged set insert is there and no failed one is, and every table is identical on every
host (issue 23 and 34; docs/ARCHITECTURE.md invariants 7, 8 and 9). chorus/testkit/lab/campaign.py runs a seed.

CHORUS_NEMESIS_SECONDS and CHORUS_NEMESIS_SEEDS (A..B, or one seed) change the run (the schedule
follows the seed); ``chorus lab nemesis --seeds A..B`` runs long campaigns by hand (docs/LAB.md).
"""

from __future__ import annotations

import os

import pytest
from conftest import LabCluster

from chorus.testkit.lab.campaign import run_seed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

SECONDS = float(os.environ.get("CHORUS_NEMESIS_SECONDS", "110"))
_a, _, _b = os.environ.get("CHORUS_NEMESIS_SEEDS", os.environ.get("CHORUS_NEMESIS_SEED", "1")).partition("..")
SEEDS = range(int(_a), int(_b or _a) + 1)


@pytest.mark.parametrize("seed", SEEDS)
def test_randomized_faults_lose_nothing_break_no_isolation_and_the_cluster_comes_back(healthy: LabCluster,
                                                                                     seed: int) -> None:
    lab = healthy
    r = run_seed(lab.lab, lab.info, seed, SECONDS, recover_timeout=300, say=print)
    print("\n" + r.line())
    assert r.stuck is None, f"the cluster did not come back after the heal:\n{lab.brief()}"
    assert not r.anomalies, "\n".join(r.anomalies)
    assert r.appends.get("ok", 0) > 100 and r.transfers["acked"] > 0 and r.inserts["acked"] > 0, r.line()
    assert sum(r.faults.values()) > 0
