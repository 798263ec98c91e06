"""Inconsistency voting on the lab (Galera 4; docs/MEMBERSHIP.md): three hosts, each with its own
Corosync, PostgreSQL and coordinator. A certified writeset that fails to apply on some nodes is
voted on through the bus; the majority's outcome stands and every node on the other side, the
origin too, leaves and stops, with the vote in its log."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

import psycopg
import pytest
from conftest import LabCluster, make_lab

from chorus.testkit.check import wait_quiescent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@contextlib.contextmanager
def lab(port_offset: int) -> Iterator[LabCluster]:
    with make_lab(3, port_offset) as c:
        with psycopg.connect(c.dsn("n1"), autocommit=True) as conn:
            conn.execute("CREATE TABLE voted (id int PRIMARY KEY, v text)")
        wait_quiescent(c.refs)
        yield c


def _local_row(c: LabCluster, node: str, key: int) -> None:
    """A row only this node has (capture off): its data now differs from the cluster's."""
    with psycopg.connect(c.dsn(node), autocommit=True) as conn:
        conn.execute("SET chorus.capture = off")
        conn.execute("INSERT INTO voted VALUES (%s, %s)", (key, f"only on {node}"))


def _left(c: LabCluster, node: str, why: str, timeout: float = 60) -> None:
    """Wait until node's coordinator has stopped after the vote, with ``why`` in its log."""
    path = os.path.join(c.lab.dir, "nodes", node, "coordinator.log")
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        with open(path, errors="replace") as f:
            text = f.read()
        if why in text:
            try:
                c.status(node)
            except OSError:
                return
        time.sleep(0.3)
    raise AssertionError(f"{node} did not leave on the vote:\n{text[-3000:]}")


def _rows(c: LabCluster, node: str) -> list[tuple[int, str]]:
    with psycopg.connect(c.dsn(node), autocommit=True) as conn:
        return [(int(a), str(b)) for a, b in conn.execute("SELECT id, v FROM voted ORDER BY id")]


def test_a_node_that_cannot_apply_leaves_and_the_others_go_on() -> None:
    with lab(100) as c:
        _local_row(c, "n3", 5)
        with psycopg.connect(c.dsn("n1"), autocommit=True) as conn:
            conn.execute("INSERT INTO voted VALUES (5, 'from n1')")
        _left(c, "n3", "the majority applied it and this node could not")
        with psycopg.connect(c.dsn("n2"), autocommit=True) as conn:
            conn.execute("INSERT INTO voted VALUES (6, 'after the vote')")
        wait_quiescent(c.refs[:2])
        assert _rows(c, "n1") == _rows(c, "n2") == [(5, "from n1"), (6, "after the vote")]


def test_the_origin_leaves_when_two_of_three_cannot_apply() -> None:
    with lab(200) as c:
        _local_row(c, "n2", 7)
        _local_row(c, "n3", 7)
        with psycopg.connect(c.dsn("n1"), autocommit=True) as conn:
            conn.execute("INSERT INTO voted VALUES (7, 'from n1')")
        _left(c, "n1", "the majority could not apply it and this node did")
        c.wait_state("n2", ("online",))
        with psycopg.connect(c.dsn("n3"), autocommit=True) as conn:
            conn.execute("INSERT INTO voted VALUES (8, 'after the vote')")
        wait_quiescent(c.refs[1:])
        for n in ("n2", "n3"):
            assert _rows(c, n) == [(7, f"only on {n}"), (8, "after the vote")]
