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
it started (by pid); the relays are threads of this process. Every wait is bounded. The sites are
the session's (conftest.linked), shared with other link tests; this file's table is app.items."""

from __future__ import annotations

import time

import pytest

from linksites import Relay, Site, alike, cut, seed, settle, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def sites(linked: tuple[Site, Site, list[Relay]]) -> tuple[Site, Site, list[Relay]]:
    east, west, relays = linked
    return east.on("app.items"), west.on("app.items"), relays


def test_concurrent_updates_are_detected_settled_alike_and_recorded(sites: tuple[Site, Site, list[Relay]]) -> None:
    east, west, relays = sites
    # rows made on east reach west; west's changes of them, made after they arrived, reach east
    seed(east, west, 4, "east")
    west.sql("UPDATE app.items SET v = 'west after east', n = 1 WHERE id = 1", i=1)
    wait("west's change on east", lambda: (1, "west after east", 1) in east.rows(0))
    east.sql("UPDATE app.items SET v = 'east after west', n = 2 WHERE id = 1")
    wait("east's change on west", alike(east, west))
    # not concurrent: nothing flagged anywhere
    assert east.exceptions(0) == [] and all(west.exceptions(i) == [] for i in west.nodes())

    # the link cut both ways: one row changed on both sites, two others each on one
    with cut(relays):
        east.sql("UPDATE app.items SET v = 'east, concurrent', n = 3 WHERE id = 2")
        west.sql("UPDATE app.items SET v = 'west, concurrent', n = 4 WHERE id = 2", i=1)
        east.sql("UPDATE app.items SET v = 'east alone' WHERE id = 3")
        west.sql("UPDATE app.items SET v = 'west alone' WHERE id = 4", i=0)

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


def test_the_later_commit_wins_by_the_origins_commit_times(sites: tuple[Site, Site, list[Relay]]) -> None:
    """Real commit times (docs/LINKS.md sections 5.1 and 7.1): west changes a row, then east
    changes it while the link is cut. The site tie-break would pick west; east's commit is
    later, so east's version stands on every node of both sites. The stamps and the exceptions
    hold the origins' times, the same on both of west's nodes; an ordinary role cannot set the
    time the apply records."""
    east, west, relays = sites
    with cut(relays):
        west.sql("UPDATE app.items SET v = 'west, earlier', n = 5 WHERE id = 3", i=1)
        time.sleep(0.5)
        east.sql("UPDATE app.items SET v = 'east, later', n = 6 WHERE id = 3")
    settle(east, west, "the conflict of row 3 settled on every node", (2, 2))
    assert (3, "east, later", 6) in east.rows(0)
    query = ("SELECT row_key, decision, result_row->>'v', local_commit_time, remote_commit_time "
             "FROM chorus.link_exceptions WHERE table_name = %s ORDER BY gid, n")
    e = east.rows(0, query, (east.quoted,))[-1]
    w = west.rows(0, query, (west.quoted,))[-1]
    assert e[:3] == ("\"app\".\"items\" (id)=(3)", "kept-local", "east, later")
    assert w[:3] == ("\"app\".\"items\" (id)=(3)", "took-remote", "east, later")
    # each side recorded both origins' times: east's later than west's, and the same on both sites
    assert e[3] > e[4] and (e[3], e[4]) == (w[4], w[3])
    assert e[3].year >= 2024 and e[4].year >= 2024  # real times, not the epoch
    assert west.rows(0, query, (west.quoted,)) == west.rows(1, query, (west.quoted,))
    stamps = "SELECT key, site, clock, commit_time FROM chorus.link_stamp ORDER BY key"
    wait("west's stamps alike on both nodes", lambda: west.rows(0, stamps) == west.rows(1, stamps))
    assert all(s[3].year >= 2024 for s in west.rows(0, stamps) if s[1] == "west")  # its own, stamped with times

    # a hostile ordinary role cannot set the commit time an apply records, nor write stamps
    west.sql("CREATE ROLE ctime_mallory LOGIN PASSWORD 'm'")
    west.sql("GRANT USAGE ON SCHEMA app TO ctime_mallory")
    west.sql("GRANT SELECT, UPDATE ON app.items TO ctime_mallory")
    try:
        import psycopg
        with psycopg.connect(west.dsns[0], user="ctime_mallory", password="m", autocommit=True) as c:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("SET chorus.commit_time = '1'")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("SELECT pg_catalog.set_config('chorus.commit_time', '4102444800000000', true)")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("UPDATE chorus.link_stamp SET commit_time = now()")
            c.execute("UPDATE app.items SET n = 7 WHERE id = 3")  # its own change: stamped with the coordinator's time
        wait("mallory's change on east", lambda: (3, "east, later", 7) in east.rows(0))
        mine = west.rows(0, "SELECT commit_time FROM chorus.link_stamp WHERE site = 'west' ORDER BY clock DESC LIMIT 1")
        assert mine[0][0].year >= 2024 and mine[0][0].year < 2100
    finally:
        west.sql("REVOKE ALL ON app.items FROM ctime_mallory")
        west.sql("REVOKE ALL ON SCHEMA app FROM ctime_mallory")
        west.sql("DROP ROLE ctime_mallory")
