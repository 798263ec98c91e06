"""The arbiter's realignment between two linked sites (docs/LINKS.md section 7.1, issue 38):
site "east" (one node) and site "west" (two nodes, the primary and so the arbiter) linked both
ways with ``detection = transaction`` (NDB$EPOCH_TRANS). East's transaction changes a row west
changed concurrently and two rows west did not: west keeps its version of the first (primary
wins) and rejects the whole transaction, so it keeps its own version of the other two as well;
east takes west's version of the first. Without realignment east would keep its own change of
the other two rows and the sites would stay different. West's realignment, carried by the link
writeset it settled (its exceptions, in its log at that GID), goes to east as west's change:
afterwards every node of both sites holds the same rows.

The change is made concurrent for certain by cutting the test's relays (linksites.Relay), as in
test_link_conflicts.py. Two real local clusters on one Corosync, each stopped by pid by
:class:`LocalCluster`; every wait is bounded."""

from __future__ import annotations

import os
import time
from typing import Iterator

import psycopg
import pytest

from linksites import Relay, Site, alike, cut, linked_both_ways, ordinary_role, seed, settle, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 230
EAST_PORT, WEST_PORT = BASE, BASE + 2  # east: one node; west: two


@pytest.fixture(scope="module")
def sites() -> Iterator[tuple[Site, Site, list[Relay]]]:
    with linked_both_ways("chorus-r", EAST_PORT, 1, WEST_PORT, 2, window=8, policy="primary-wins",
                          primary="west", detection="transaction") as linked:
        yield linked


def test_a_rejected_transactions_rows_are_realigned_on_every_node(sites: tuple[Site, Site, list[Relay]]) -> None:
    east, west, relays = sites
    seed(east, west, 4, "start")

    with cut(relays):
        with east.connect(0) as c:  # one transaction: row 2 (concurrent with west's), rows 3 and 10 (not)
            with c.transaction():
                c.execute("UPDATE app.items SET v = 'east', n = 1 WHERE id = 2")
                c.execute("UPDATE app.items SET v = 'east', n = 1 WHERE id = 3")
                c.execute("INSERT INTO app.items VALUES (10, 'east', 1)")
        west.sql("UPDATE app.items SET v = 'west', n = 2 WHERE id = 2", i=1)

    settle(east, west, "the conflict settled and realigned on every node", (1, 3))
    # west's version of every row of east's rejected transaction, on every node of both sites
    want = [(1, "start", 0), (2, "west", 2), (3, "start", 0), (4, "start", 0)]
    assert east.rows(0) == want
    assert all(west.rows(i) == want for i in west.nodes())
    # west, the arbiter: row 2 kept (the primary's), rows 3 and 10 rejected with their transaction
    got = [(x[0], x[3], x[4], x[5]) for x in west.exceptions(0)]
    assert got == [('"app"."items" (id)=(2)', "row", "primary-wins", "kept-local"),
                   ('"app"."items" (id)=(3)', "transaction", "epoch-trans", "rejected"),
                   ('"app"."items" (id)=(10)', "transaction", "epoch-trans", "rejected")]
    assert west.exceptions(0) == west.exceptions(1)
    # east took west's row 2 (row by row: only the arbiter rejects), and the realignment of rows 3
    # and 10 met no conflict there (west had applied east's change when it realigned)
    (e,) = east.exceptions(0)
    assert (e[0], e[3], e[4], e[5]) == ('"app"."items" (id)=(2)', "row", "primary-wins", "took-remote")
    wait("west's stamps alike on both nodes", lambda: west.stamps(0) == west.stamps(1))

    # afterwards east's changes of the realigned rows go through without a conflict
    east.sql("UPDATE app.items SET n = 7 WHERE id = 3")
    east.sql("INSERT INTO app.items VALUES (10, 'east again', 1)")
    wait("east's later changes on west", alike(east, west))
    assert (3, "start", 7) in east.rows(0) and (10, "east again", 1) in east.rows(0)
    time.sleep(1.0)
    assert len(east.exceptions(0)) == 1 and all(len(west.exceptions(i)) == 3 for i in west.nodes())
    assert all(west.rows(i) == east.rows(0) for i in west.nodes())


def test_an_ordinary_role_on_the_arbiter_cannot_forge_a_realignment(sites: tuple[Site, Site, list[Relay]]) -> None:
    """The arbiter's sender builds realignments from ``chorus.link_exceptions`` rows of the link's
    own records, and the peer takes a writeset for one by the table ``chorus.link_realign``: an
    ordinary role of the arbiter's site can make neither."""
    with ordinary_role(sites[1]) as c:
        for q in ("CREATE TABLE chorus.link_realign (site text)",
                  "INSERT INTO chorus.link_exceptions (gid, n, link, table_name, row_key, remote_site, detection, "
                  "policy, decision) VALUES (1, 1, 'east-west', 'app.items', 'x', 'east', 'row', 'p', 'kept-local')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(q)
