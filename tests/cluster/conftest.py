"""Fixtures for the fault tests: a lab of 3 hosts (or a module's ``LAB_HOSTS``; chorus.testkit.lab), each host a network namespace with
its own Corosync, PostgreSQL and coordinator. One lab per module; every test leaves it healed,
thawed and online, and the lab is removed (processes, namespaces, devices) however the tests end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from chorus.testkit.check import NodeRef, compare, wait_quiescent
from chorus.admin import admin_request
from chorus.testkit.lab.rig import Lab
from chorus.testkit.workload import BANK_SCHEMA, SET_SCHEMA, bank_setup

ACCOUNTS = 40
INITIAL = 1000


class LabCluster:
    def __init__(self, lab: Lab, info: list[dict[str, Any]]) -> None:
        self.lab = lab
        self.info = info
        self.names = [n["name"] for n in info]
        # clients reach their host's PostgreSQL over its Unix socket: a partition between hosts
        # does not cut a client off from its own node (as on a real network)
        self.refs = [NodeRef(n["name"], n["socket_dsn"], n["admin"]) for n in info]

    def dsn(self, name: str) -> str:
        return next(r.dsn for r in self.refs if r.name == name)

    def endpoints(self) -> list[tuple[str, str]]:
        return [(r.name, r.dsn) for r in self.refs]

    def http(self, name: str, path: str) -> int:
        """The status code of GET ``path`` on host ``name``'s coordinator endpoints, asked from
        inside that host (as its load balancer's health check would)."""
        n = next(n for n in self.info if n["name"] == name)
        r = subprocess.run(["ip", "netns", "exec", n["namespace"], "curl", "-s", "-o", "/dev/null", "-m", "3",
                            "-w", "%{http_code}", n["http"] + path], capture_output=True, text=True, timeout=10)
        return int(r.stdout or 0)

    def status(self, name: str) -> dict[str, Any]:
        admin = next(r.admin for r in self.refs if r.name == name)
        st: dict[str, Any] = admin_request(admin, timeout=3)["status"]
        return st

    def wait_state(self, name: str, states: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        st: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                st = self.status(name)
                if st["state"] in states:
                    return st
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"{name} not {states} within {timeout}s: {st}\n{self.brief()}")

    BRIEF = ("state", "reason", "members", "delivered_gid", "certified_gid", "committed_gid", "pending",
             "pending_head", "workers_busy", "apply_queue", "flow_control", "recovery")

    def brief(self) -> str:
        """Every host's status in short, and its coordinator log's last lines (for a failure)."""
        out = []
        for n in self.info:
            try:
                st = self.status(n["name"])
                out.append(f"{n['name']}: " + ", ".join(f"{k}={st.get(k)!r}" for k in self.BRIEF))
            except (OSError, ValueError, KeyError) as e:
                out.append(f"{n['name']}: no status ({e})")
            log = Path(n["config"]).parent / "coordinator.log"
            if log.exists():
                out += ["    " + line for line in log.read_text(errors="replace").splitlines()[-15:]]
        return "\n".join(out)

    def wait_all_online(self, timeout: float = 90) -> None:
        for n in self.names:
            self.wait_state(n, ("online",), timeout)

    def restore(self) -> None:
        """Undo whatever a test did to the network and the hosts."""
        self.lab.heal_all()
        self.wait_all_online()

    def assert_identical(self, timeout: float = 90) -> None:
        wait_quiescent(self.refs, timeout)
        diffs = compare(self.refs)
        assert not diffs, "\n".join(diffs)

    def bank_total(self, name: str) -> int:
        with psycopg.connect(self.dsn(name), autocommit=True) as c:
            return int(c.execute("SELECT sum(balance) FROM bank_accounts").fetchone()[0])  # type: ignore[index]

    def set_rows(self, name: str) -> set[tuple[int, int, str]]:
        with psycopg.connect(self.dsn(name), autocommit=True) as c:
            return {(int(a), int(b), str(n)) for a, b, n in c.execute("SELECT id, u, node FROM jepsen_set")}


@contextlib.contextmanager
def make_lab(hosts: int, port_offset: int = 0, spare: int = 0) -> Iterator[LabCluster]:
    """A lab of ``hosts`` hosts (and ``spare`` ones for `chorus lab add`) on ports from
    CHORUS_LAB_PORT_BASE plus ``port_offset``, removed (processes, namespaces, devices) however
    the caller ends."""
    if os.geteuid() != 0:
        pytest.fail("the fault tests need root (network namespaces and TAP devices)")
    directory = tempfile.mkdtemp(prefix="chorus-lab-", dir="/tmp")
    os.chmod(directory, 0o755)
    rig = Lab(directory)
    try:
        info = rig.create(hosts, int(os.environ.get("CHORUS_LAB_PORT_BASE", "56433")) + port_offset, spare)
        yield LabCluster(rig, info)
    finally:
        if os.environ.get("CHORUS_KEEP_CLUSTER"):
            print(f"\nlab left running in {directory}")
        else:
            rig.down()
            shutil.rmtree(directory, ignore_errors=True)


def with_workload_tables(c: LabCluster) -> LabCluster:
    """``c`` with the bank and set workloads' tables, filled, on every node."""
    with psycopg.connect(c.dsn("n1"), autocommit=True) as conn:
        conn.execute(BANK_SCHEMA)
        conn.execute(SET_SCHEMA)
    bank_setup(c.dsn("n1"), ACCOUNTS, INITIAL)
    c.assert_identical()
    return c


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[LabCluster]:
    """A lab of ``LAB_HOSTS`` hosts (a module-level constant of the test module; 3 if unset)."""
    with make_lab(getattr(request.module, "LAB_HOSTS", 3)) as c:
        yield with_workload_tables(c)


@pytest.fixture
def healthy(lab: LabCluster) -> Iterator[LabCluster]:
    """The lab, put back into shape after the test (also when it failed)."""
    lab.wait_all_online()
    try:
        yield lab
    finally:
        lab.restore()
