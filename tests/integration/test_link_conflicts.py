"""Conflicts between two linked sites (docs/LINKS.md sections 4-7 and 9, issue 38): site "east"
(one node) and site "west" (two nodes) linked both ways. Concurrent updates of one row on both
sites are detected on both (NDB$EPOCH: the row's stamp at or above the clock the other site had
reflected), settled by the link's policy (latest-commit-wins: equal commit times go to the site
that sorts last, west) alike on every node, and recorded in ``chorus.link_exceptions``; changes
that are not concurrent (one site's change made after the other's came back) and concurrent
changes of different rows are not flagged.

To make two changes concurrent for certain, each direction of the link goes through a TCP relay
of the test's own (linksites.Relay), which it stops (cutting the connections) and starts again:
while it is stopped neither site hears of the other's change. Two real local clusters on one
Corosync, each started and stopped by :class:`LocalCluster`, which stops exactly the processes
it started (by pid); the relays are threads of this process. Every wait is bounded."""

from __future__ import annotations

import os
import time
from typing import Iterator

import pytest

from linksites import TABLE, Relay, Site, alike, linked_both_ways, settle, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 200
EAST_PORT, WEST_PORT = BASE, BASE + 2  # east: one node; west: two


@pytest.fixture(scope="module")
def sites() -> Iterator[tuple[Site, Site, list[Relay]]]:
    with linked_both_ways("chorus-c", EAST_PORT, 1, WEST_PORT, 2, window=8) as linked:
        yield linked


def test_concurrent_updates_are_detected_settled_alike_and_recorded(sites: tuple[Site, Site, list[Relay]]) -> None:
    east, west, relays = sites
    for site in (east, west):  # links carry no schema change: each site makes the table
        site.sql("CREATE SCHEMA app")
        site.sql(TABLE)
    # rows made on east reach west; west's changes of them, made after they arrived, reach east
    for i in range(1, 5):
        east.sql("INSERT INTO app.items VALUES (%s, 'east', 0)", (i,))
    wait("east's rows on west", alike(east, west))
    west.sql("UPDATE app.items SET v = 'west after east', n = 1 WHERE id = 1", i=1)
    wait("west's change on east", lambda: (1, "west after east", 1) in east.rows(0))
    east.sql("UPDATE app.items SET v = 'east after west', n = 2 WHERE id = 1")
    wait("east's change on west", alike(east, west))
    # not concurrent: nothing flagged anywhere
    assert east.exceptions(0) == [] and all(west.exceptions(i) == [] for i in west.nodes())

    # the link cut both ways: one row changed on both sites, two others each on one
    for r in relays:
        r.cut()
    east.sql("UPDATE app.items SET v = 'east, concurrent', n = 3 WHERE id = 2")
    west.sql("UPDATE app.items SET v = 'west, concurrent', n = 4 WHERE id = 2", i=1)
    east.sql("UPDATE app.items SET v = 'east alone' WHERE id = 3")
    west.sql("UPDATE app.items SET v = 'west alone' WHERE id = 4", i=0)
    time.sleep(1.0)
    for r in relays:
        r.restore()

    settle(east, west, "the conflict settled on every node", (1, 1))
    rows = east.rows(0)
    # latest-commit-wins, equal commit times: the site that sorts last (west) wins, on both sites
    assert (2, "west, concurrent", 4) in rows
    assert (3, "east alone", 0) in rows and (4, "west alone", 0) in rows
    (e,) = east.exceptions(0)
    assert e[:9] == ("\"app\".\"items\" (id)=(2)", "east", "west", "row", "latest-commit-wins", "took-remote",
                     "east, concurrent", "west, concurrent", "west, concurrent")
    (w,) = west.exceptions(0)
    assert w[:9] == ("\"app\".\"items\" (id)=(2)", "west", "east", "row", "latest-commit-wins", "kept-local",
                     "west, concurrent", "east, concurrent", "west, concurrent")
    # the window: the local change's clock at or above what the other site had reflected
    for x in (e, w):
        assert x[9] >= x[11]
    # every node of west recorded the same, and holds the same stamps
    assert west.exceptions(0) == west.exceptions(1)
    wait("west's stamps alike on both nodes", lambda: west.stamps(0) == west.stamps(1))
    assert west.stamps(0)  # west's own changes are stamped

    # after the conflict, changes go on without being flagged
    east.sql("UPDATE app.items SET n = 10 WHERE id = 2")
    wait("east's later change on west", lambda: all((2, "west, concurrent", 10) in west.rows(i)
                                                      for i in west.nodes()))
    assert len(east.exceptions(0)) == 1 and all(len(west.exceptions(i)) == 1 for i in west.nodes())
