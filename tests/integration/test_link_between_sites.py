"""A link between two sites (docs/LINKS.md section 3, issue 38): site "east" (one node) streams its
commits to site "west" (two nodes), whose receiver sends each transaction on through west's total
order, where every node applies it and moves ``chorus.link_position`` in the same transaction.

Two real local clusters on one Corosync (each its own group), each started and stopped by
:class:`LocalCluster`, which stops exactly the processes it started (by pid). Every wait is
bounded."""

from __future__ import annotations

import os
from typing import Callable, Iterator

import pytest

from linksites import LISTEN_OFFSET, TABLE, Site, link_table, two_sites
from linksites import wait as _wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 100
EAST_PORT, WEST_PORT = BASE, BASE + 2  # east: one node; west: two


@pytest.fixture(scope="module")
def sites() -> Iterator[tuple[Site, Site]]:
    with two_sites((1, EAST_PORT, lambda d: link_table(d, "east", "west", listen_offset=LISTEN_OFFSET)),
                   (2, WEST_PORT, lambda d: link_table(d, "west", "east", window=8,
                                                       peers=[f"127.0.0.1:{EAST_PORT + LISTEN_OFFSET}"]))) as (
            east, west, _, _):
        yield east, west


def _write(site: Site, first: int, count: int) -> None:
    """Transactions on ``site``: inserts, then an update and a delete among them."""
    with site.connect() as c:
        for i in range(first, first + count):
            c.execute("INSERT INTO app.items VALUES (%s, %s, 0)", (i, f"row {i}"))
        with c.transaction():
            c.execute("UPDATE app.items SET n = n + 1, v = v || ' updated' WHERE id BETWEEN %s AND %s",
                      (first, first + 2))
            c.execute("DELETE FROM app.items WHERE id = %s", (first + count - 1,))


def _arrived(east: Site, west: Site) -> Callable[[], bool]:
    def ok() -> bool:
        want = east.rows(0)
        return all(west.rows(i) == want for i in range(2))
    return ok


def test_link_applies_through_the_receiving_sites_order(sites: tuple[Site, Site]) -> None:
    east, west = sites
    for site in (east, west):  # links carry no schema change: each site makes the table
        with site.connect() as c:
            c.execute("CREATE SCHEMA app")
            c.execute(TABLE)
    _write(east, 1, 20)
    _wait("east's rows on both of west's nodes", _arrived(east, west))
    # the position moved, in the same transactions, alike on both nodes: at east's last GID
    _wait("west's position at east's committed GID",
          lambda: all(west.position(i) and west.position(i)[0][2] == east.committed() for i in range(2)))
    p0, p1 = west.position(0), west.position(1)
    assert p0 == p1
    assert p0[0][:2] == ("east-west", "east")
    # west's own writes go on beside the link
    with west.connect(1) as c:
        c.execute("INSERT INTO app.items VALUES (1000, 'west', 0)")
    _wait("west's own row on both west nodes", lambda: all(
        (1000, "west", 0) in west.rows(i) for i in range(2)))
    with west.connect(0) as c:
        c.execute("DELETE FROM app.items WHERE id = 1000")


def test_link_cut_and_restored_loses_nothing_and_applies_nothing_twice(sites: tuple[Site, Site]) -> None:
    east, west = sites
    _wait("caught up", _arrived(east, west))
    before = west.position(0)[0][2]

    # the receiver's node goes (its coordinator killed) while east writes; west has no quorum
    # without it, then both come back and the receiver resumes from the durable position
    west.cluster.kill("n1", "coordinator")
    _write(east, 100, 15)
    west.cluster.start("n1", wait=False)
    west.cluster.wait_online(west.cluster.load(), timeout=120)
    _wait("east's rows after the receiver came back", _arrived(east, west))
    mid = west.position(0)[0][2]
    assert mid > before

    # the sender goes (east's coordinator and PostgreSQL stopped and started again)
    _write(east, 200, 10)
    east.cluster.stop("n1")
    east.cluster.up(1, EAST_PORT)  # (a lone node comes back through up, which lets it bootstrap again)
    _write(east, 300, 10)
    _wait("east's rows after the sender came back", _arrived(east, west))
    _wait("west's position at east's committed GID",
          lambda: all(west.position(i)[0][2] == east.committed() for i in range(2)))
    assert west.position(0) == west.position(1)
    # nothing applied twice: every insert would have failed on a duplicate key (and the apply
    # with it); every node of west is online, and the link applied each transaction once
    for i in range(2):
        with west.connect(i) as c:
            row = c.execute("SELECT phase, accepts_writes FROM chorus.node").fetchone()
            assert row == ("online", True)
