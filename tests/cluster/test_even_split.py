"""An even split on a 4-host lab: Corosync's auto_tie_breaker and Chorus's own count agree that
the half holding the lowest node id (host 1) is the primary component.

The bank and set workloads run on every host while the lab is split 2|2. The half with n1
keeps committing; the other half refuses writes with the documented error and keeps serving
reads; after the heal it rejoins by itself, and the clients' view holds on every node.
"""

from __future__ import annotations

import time

import pytest
from conftest import LabCluster
from test_faults import Workloads, check, refused_write

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LAB_HOSTS = 4


def test_even_split_the_half_with_the_lowest_node_id_goes_on(healthy: LabCluster) -> None:
    lab = healthy
    assert lab.status("n1")["tie_breaker"] == "1"
    with Workloads(lab) as w:
        time.sleep(2)
        lab.lab.partition([[1, 2], [3, 4]])
        for n in ("n3", "n4"):
            st = lab.wait_state(n, ("non-primary",), timeout=20)
            assert "quorate" in st["reason"], st
        for n in ("n1", "n2"):
            assert lab.status(n)["state"] == "online"
        err = refused_write(lab, "n4")
        assert err.sqlstate == "25006" and "quorate partition" in str(err), str(err)
        during = time.monotonic()
        time.sleep(4)
        assert w.commits("n1", during) > 0 and w.commits("n2", during) > 0, "the tie-winning half stopped committing"
        assert w.commits("n3", during + 1) + w.commits("n4", during + 1) == 0, "the losing half committed"
        lab.lab.heal()
        for n in ("n3", "n4"):
            lab.wait_state(n, ("online",), timeout=60)  # through partial recovery, by itself
        time.sleep(2)
    assert w.commits("n3") > 0 and w.commits("n4") > 0
    check(lab, w)
