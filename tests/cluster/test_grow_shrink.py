"""Adding and removing hosts online on the lab (issue 39; docs/MEMBERSHIP.md "Adding and removing
nodes"): 3 -> 4 -> 5 -> 4 -> 3 under the bank and set workloads, each host with its own Corosync
whose node list is rewritten and reloaded at every step. Checked at each step: every node counts
the quorum from the new configured set (status and an even split of four that no half survives,
where the tie breaker would have let one go on before the change); at the end nothing
acknowledged is lost, the bank total holds and every node is identical."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest
from conftest import LabCluster, make_lab, with_workload_tables
from test_faults import Workloads, check

from chorus.admin import admin_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


@pytest.fixture
def lab5() -> Iterator[LabCluster]:
    """A lab of three hosts and two spare ones, with the bank and set tables."""
    with make_lab(3, 40, spare=2) as c:
        yield with_workload_tables(c)


def _lab(c: LabCluster, *args: str) -> dict[str, Any]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "chorus", "lab", *args, "--dir", str(c.lab.dir), "--json"],
                       capture_output=True, text=True, timeout=600)
    print(f"chorus lab {' '.join(args)}: {time.monotonic() - t0:.1f} s")  # shown with -s, or on a failure
    assert r.returncode == 0, r.stderr + r.stdout + "\n" + c.brief()
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def _statuses(c: LabCluster) -> dict[str, dict[str, Any]]:
    return {d["name"]: admin_request(d["admin"], timeout=5)["status"] for d in c.lab.describe(c.lab.load())}


def _quorumtool_expected(namespace: str) -> int:
    r = subprocess.run(["ip", "netns", "exec", namespace, "corosync-quorumtool", "-s"], capture_output=True,
                       text=True, timeout=20)
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("Expected votes:"))
    return int(line.split(":")[1])


def _expected_votes(c: LabCluster) -> dict[str, int]:
    """votequorum's expected votes on every host, as `corosync-quorumtool -s` shows them (asked of
    every host at once)."""
    hosts = c.lab.describe(c.lab.load())
    with ThreadPoolExecutor(len(hosts)) as pool:
        return dict(zip((d["name"] for d in hosts), pool.map(_quorumtool_expected, [d["namespace"] for d in hosts])))


def _writes_go_on(c: LabCluster, w: Workloads, since: float, at_least: int = 3, timeout: float = 30) -> None:
    """The workloads commit (``at_least`` transactions after ``since``), as soon as they do: a
    check of the load going on, not a fixed load phase."""
    deadline = time.monotonic() + timeout
    while w.commits(None, since) < at_least:
        assert time.monotonic() < deadline, f"fewer than {at_least} commits in {timeout:.0f} s\n{c.brief()}"
        time.sleep(0.1)


def _wait_online(c: LabCluster, name: str, timeout: float) -> None:
    """Wait until host ``name`` (an added one too) is online."""
    deadline = time.monotonic() + timeout
    st: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            st = _statuses(c)[name]
            if st["state"] == "online":
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{name} not online: {st.get('state')} {st.get('reason')}\n{c.brief()}")


def _configured(c: LabCluster, version: int, nodes: list[str], quorum: int) -> None:
    with ThreadPoolExecutor(1) as pool:
        votes = pool.submit(_expected_votes, c)  # meanwhile
        statuses = _statuses(c)
    for name, st in statuses.items():
        assert st["state"] == "online", (name, st["state"], st["reason"])
        assert (st["config_version"], st["configured_nodes"], st["quorum_votes"]) == (version, nodes, quorum), \
            (name, st["config_version"], st["configured_nodes"], st["quorum_votes"])
        assert st["tie_breaker"] == ""
    # Corosync's own count follows the reloaded node list (the coordinators do not rely on it)
    assert votes.result() == {n: len(nodes) for n in nodes}


def test_the_lab_grows_to_five_hosts_and_shrinks_back_to_three_under_the_workloads(lab5: LabCluster) -> None:
    lab = lab5
    with Workloads(lab) as w:
        _writes_go_on(lab, w, 0.0)
        st = _lab(lab, "add", "--spark-master", "none")
        assert st["node"] == "n4" and st["state"] == "online"
        _configured(lab, 1, ["n1", "n2", "n3", "n4"], 3)

        # an even split of four: no tie breaker after a change, so neither half writes
        lab.lab.partition([[1, 2], [3, 4]])
        for n in ("n1", "n2", "n3"):
            lab.wait_state(n, ("non-primary",), timeout=30)
        lab.lab.heal()
        lab.wait_all_online(120)  # n1..n3 (the Workloads' hosts)
        _wait_online(lab, "n4", 120)
        _writes_go_on(lab, w, time.monotonic())

        st = _lab(lab, "add", "--spark-master", "none")
        assert st["node"] == "n5" and st["state"] == "online"
        _configured(lab, 2, ["n1", "n2", "n3", "n4", "n5"], 3)
        _writes_go_on(lab, w, time.monotonic())

        _lab(lab, "remove", "n5")
        _configured(lab, 3, ["n1", "n2", "n3", "n4"], 3)
        _lab(lab, "remove", "n4")
        _configured(lab, 4, ["n1", "n2", "n3"], 2)
        _writes_go_on(lab, w, time.monotonic())
    assert [d["name"] for d in lab.lab.describe(lab.lab.load())] == ["n1", "n2", "n3"]
    check(lab, w)
