"""Inconsistency voting (Galera 4; docs/MEMBERSHIP.md): when a certified writeset fails to apply
on some nodes, the members vote through the bus and the majority's outcome stands; every node on
the other side, the origin too, leaves and stops. A local cluster counts its coordinators as
votes, so no node goes on alone."""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Iterator

import psycopg
import pytest

from chorus.testkit.check import wait_quiescent
from conftest import Cluster, extra_cluster

pytestmark = pytest.mark.integration


def _local_row(c: Cluster, i: int, key: int) -> None:
    """A row only node i has (capture off): the node's data now differs from the cluster's."""
    with c.connect(i) as conn:
        conn.execute("SET chorus.capture = off")
        conn.execute("INSERT INTO voted VALUES (%s, %s)", (key, f"only on n{i + 1}"))


def _stopped(c: Cluster, i: int, timeout: float = 30) -> str:
    """Wait until node i's coordinator has stopped; the end of its log."""
    log_path = os.path.join(c.dir, "nodes", c.nodes[i].name, "coordinator.log")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path, errors="replace") as f:
            text = f.read()
        if "inconsistency vote on GID" in text and "leaves the cluster" in text:
            try:
                c.status(i)
            except OSError:
                return text
        time.sleep(0.2)
    raise AssertionError(f"{c.nodes[i].name} did not stop on the vote:\n{text[-3000:]}")


@contextlib.contextmanager
def _cluster(prefix: str, port_offset: int) -> Iterator[Cluster]:
    with extra_cluster(prefix, port_offset) as c:
        with c.connect(0) as conn:
            conn.execute("CREATE TABLE voted (id int PRIMARY KEY, v text)")
        c.quiesce()
        yield c


def _writes(c: Cluster, i: int, key: int) -> None:
    with c.connect(i) as conn:
        conn.execute("INSERT INTO voted VALUES (%s, 'after the vote')", (key,))


def test_the_node_that_cannot_apply_leaves() -> None:
    with _cluster("chorus-vote1-", 50) as c:
        _local_row(c, 2, 5)
        with c.connect(0) as conn:
            conn.execute("INSERT INTO voted VALUES (5, 'from n1')")  # n3 cannot apply it
        log = _stopped(c, 2)
        assert "the majority applied it and this node could not" in log
        # it does not start again with data the cluster does not have (only total recovery)
        with open(os.path.join(c.dir, "nodes", "n3", "state.json")) as f:
            assert "inconsistency vote on GID" in json.load(f)["left_by_vote"]
        c.wait_online(0)
        _writes(c, 1, 6)  # the majority goes on
        wait_quiescent(c.nodes[:2])
        for i in (0, 1):
            with c.connect(i) as conn:
                assert conn.execute("SELECT id, v FROM voted ORDER BY id").fetchall() == [
                    (5, "from n1"), (6, "after the vote")]


def test_the_origin_leaves_when_the_majority_cannot_apply() -> None:
    with _cluster("chorus-vote2-", 60) as c:
        _local_row(c, 1, 7)
        _local_row(c, 2, 7)
        with c.connect(0) as conn:
            conn.execute("INSERT INTO voted VALUES (7, 'from n1')")  # committed on n1, fails on n2 and n3
        log = _stopped(c, 0)
        assert "the majority could not apply it and this node did" in log
        with pytest.raises(psycopg.Error):  # n1 takes no more writes
            _writes(c, 0, 9)
        c.wait_online(1)
        _writes(c, 2, 8)
        wait_quiescent(c.nodes[1:])
        for i in (1, 2):
            with c.connect(i) as conn:
                assert conn.execute("SELECT id, v FROM voted ORDER BY id").fetchall() == [
                    (7, f"only on n{i + 1}"), (8, "after the vote")]
