"""The delta policy between two linked sites (docs/LINKS.md section 7.1, issue 38): site "east" (one
node) and site "west" (two nodes) linked both ways (the session's, conftest.linked), table
``app.counters`` settled by policy ``delta`` on its counter ``n``. With the link cut, both sites
increment the same counter, several times, from several nodes; once it is restored both sites hold
the sum of every increment on every node, and the conflicts are recorded as merged. The increments
travel as the changes' old and new values: each site's extension captures the old value of ``n``
(chorus.link_old_columns, written from the [[link]] configuration), and the other site adds the
difference to its own row.

The link goes through the test's relays (linksites.Relay), cut and restored as in
test_link_conflicts.py. Every wait is bounded."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from linksites import Relay, Site, cut, make_tables, ordinary_role, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def sites(linked: tuple[Site, Site, list[Relay]]) -> tuple[Site, Site, list[Relay]]:
    """The session's linked sites (conftest.linked): app.counters's policy is delta, its counter n."""
    east, west, relays = linked
    return east.on("app.counters"), west.on("app.counters"), relays


def counters(site: Site, i: int) -> list[tuple[Any, ...]]:
    return site.rows(i, "SELECT id, n FROM app.counters ORDER BY id")


def everywhere(east: Site, west: Site, want: list[tuple[int, int]]) -> bool:
    return counters(east, 0) == want and all(counters(west, i) == want for i in west.nodes())


def test_concurrent_increments_are_all_kept_on_every_node(sites: tuple[Site, Site, list[Relay]]) -> None:
    east, west, relays = sites
    make_tables(east, west)
    for site in (east, west):  # the extension captures the counter's old value (the local cluster wrote the setting)
        with site.connect(0) as c:
            assert c.execute("SHOW chorus.link_old_columns").fetchone() == ("app.counters:n",)
    for i in (1, 2):
        east.sql("INSERT INTO app.counters VALUES (%s, 'east', 100)", (i,))
    wait("east's rows on west", lambda: everywhere(east, west, [(1, 100), (2, 100)]))
    # not concurrent: an increment arrives as one
    west.sql("UPDATE app.counters SET n = n + 1 WHERE id = 2", i=1)
    wait("west's increment on east", lambda: everywhere(east, west, [(1, 100), (2, 101)]))
    assert east.exceptions(0) == [] and all(west.exceptions(i) == [] for i in west.nodes())

    # the link cut both ways: row 1 incremented on both sites, 3 times on east, twice on west
    # (once from each node), with another column changed too; row 2 on east alone
    with cut(relays):
        for _ in range(3):
            east.sql("UPDATE app.counters SET n = n + 1 WHERE id = 1")
        west.sql("UPDATE app.counters SET n = n + 10, v = 'west' WHERE id = 1", i=0)
        west.sql("UPDATE app.counters SET n = n + 20 WHERE id = 1", i=1)
        east.sql("UPDATE app.counters SET n = n - 5 WHERE id = 2")

    want = [(1, 100 + 3 + 10 + 20), (2, 101 - 5)]
    try:
        wait("the sum of every increment on every node", lambda: everywhere(east, west, want), timeout=120)
    finally:
        print("east", counters(east, 0), east.exceptions(0))
        for i in west.nodes():
            print(f"west {i}", counters(west, i), west.exceptions(i))
    # the other column by the fallback (latest-commit-wins: equal times go to west, which sorts last)
    assert east.rows(0) == west.rows(0) == west.rows(1)
    assert east.rows(0)[0][1] == "west"
    # the conflicts are recorded, merged, alike on every node of west
    wait("the conflicts recorded", lambda: east.exceptions(0) != [] and west.exceptions(0) != [])
    for site in (east, west):
        for x in site.exceptions(0):
            assert x[0] == "\"app\".\"counters\" (id)=(1)" and x[4] == "delta" and x[5] == "merged", x
    assert west.exceptions(0) == west.exceptions(1)

    # after the conflict, increments go on from either site without being lost
    east.sql("UPDATE app.counters SET n = n + 1000 WHERE id = 1")
    west.sql("UPDATE app.counters SET n = n + 1000 WHERE id = 2", i=1)
    want = [(1, 1133), (2, 1096)]
    wait("later increments on every node", lambda: everywhere(east, west, want), timeout=120)
    # a DELETE's old image carries the counter too: applied on every node by its identity
    east.sql("INSERT INTO app.counters VALUES (3, 'east', 7)")
    wait("row 3 on every node", lambda: everywhere(east, west, want + [(3, 7)]), timeout=120)
    west.sql("DELETE FROM app.counters WHERE id = 3", i=1)
    wait("row 3 deleted on every node", lambda: everywhere(east, west, want), timeout=120)


def test_an_ordinary_role_cannot_change_the_captured_columns_nor_apply_old_values(
        sites: tuple[Site, Site, list[Relay]]) -> None:
    """Which old values travel is the server's setting (PGC_SIGHUP, written from the [[link]]
    configuration): an ordinary role can neither change it for its session, its role or the
    server, nor apply a writeset of its own (old values included)."""
    with ordinary_role(sites[1], "GRANT USAGE ON SCHEMA app TO hostile",
                       "GRANT SELECT, UPDATE ON app.counters TO hostile") as c:
        for q in ("SET chorus.link_old_columns = 'app.counters:v'",
                  "SELECT pg_catalog.set_config('chorus.link_old_columns', 'app.counters:v', false)",
                  "ALTER ROLE hostile SET chorus.link_old_columns = 'app.counters:v'",
                  "ALTER SYSTEM SET chorus.link_old_columns = 'app.counters:v'",
                  "SELECT chorus.apply_writeset(1, 0, '\\x00'::bytea)"):
            with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.CantChangeRuntimeParam)):
                c.execute(q)
        assert c.execute("SHOW chorus.link_old_columns").fetchone() == ("app.counters:n",)
        # its own changes carry the real old value (the trigger's row), and arrive as increments
        c.execute("UPDATE app.counters SET n = n + 1 WHERE id = 1")
    wait("the ordinary role's increment on east", lambda: counters(sites[0], 0)[0] == (1, 1134))
