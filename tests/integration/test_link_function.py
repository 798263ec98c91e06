"""The ``function`` conflict policy between two linked sites (docs/LINKS.md section 7.1, issue 38):
site "east" (one node, the arbiter: its name sorts first) and site "west" (two nodes) linked both
ways (the session's, conftest.linked) with ``table_policy = { "app.merged" = "function" }`` and
``conflict_function = "app.merge"``, a function owned by an ordinary role on each site. Concurrent
updates of one row are merged by the function, called with east's version first on both sites, so
every node of both sites holds the same merged row and records it in ``chorus.link_exceptions``. A
function that raises stops the link at that transaction on every node, visibly, with nothing after
it applied and no node leaving; once the function is fixed the link resumes and the row is merged.

Concurrency is made certain by cutting the test's relays (linksites.Relay), as in
test_link_conflicts.py. Two real local clusters on one Corosync, each stopped by pid by
:class:`LocalCluster`; every wait is bounded."""

from __future__ import annotations

import time

import pytest

from linksites import Relay, Site, cut, seed, settle, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SIG = "regclass, jsonb, text, jsonb, text, jsonb, jsonb"
MERGE = ("CREATE OR REPLACE FUNCTION app.merge(t regclass, a jsonb, a_site text, b jsonb, b_site text, am jsonb, "
         "bm jsonb) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $f$ BEGIN "
         "IF a->>'v' = 'east, refused' THEN RAISE EXCEPTION 'no merge of row %', a->>'id'; END IF; "
         "IF a IS NULL OR b IS NULL THEN RETURN COALESCE(a, b); END IF; "
         "RETURN a || jsonb_build_object('v', (a->>'v') || '+' || (b->>'v') || '@' || a_site, "
         "'n', (a->>'n')::int + (b->>'n')::int); END $f$")


@pytest.fixture(scope="module")
def sites(linked: tuple[Site, Site, list[Relay]]) -> tuple[Site, Site, list[Relay]]:
    """The session's linked sites (conftest.linked): app.merged's policy is function, app.merge."""
    east, west, relays = linked
    return east.on("app.merged"), west.on("app.merged"), relays


def concurrently(relays: list[Relay], east: Site, west: Site, east_sql: str, west_sql: str,
                 *more_east: str) -> None:
    """``east_sql`` (then ``more_east``) on east and ``west_sql`` on west while neither hears the other."""
    with cut(relays):
        for statement in (east_sql, *more_east):
            east.sql(statement)
        west.sql(west_sql, i=1)


def logs(site: Site) -> str:
    logs = sorted((site.cluster.dir / "nodes").glob("*/coordinator.log"))
    return "".join(p.read_text(errors="replace") for p in logs)


def test_concurrent_updates_are_merged_by_the_function_alike_everywhere(
        sites: tuple[Site, Site, list[Relay]]) -> None:
    east, west, relays = sites
    seed(east, west, 5, "start", "CREATE ROLE merger NOLOGIN", "CREATE SCHEMA IF NOT EXISTS app", MERGE,
         f"ALTER FUNCTION app.merge({SIG}) OWNER TO merger")

    concurrently(relays, east, west, "UPDATE app.merged SET v = 'east', n = 1 WHERE id = 2",
                 "UPDATE app.merged SET v = 'west', n = 2 WHERE id = 2")
    settle(east, west, "the conflict merged on every node", (1, 1))
    # east's version first on both sites: the same merged row everywhere
    assert (2, "east+west@east", 3) in east.rows(0)
    (e,) = east.exceptions(0)
    assert e[:9] == ("\"app\".\"merged\" (id)=(2)", "east", "west", "row", "function app.merge", "merged",
                     "east", "west", "east+west@east")
    (w,) = west.exceptions(0)
    assert w[:9] == ("\"app\".\"merged\" (id)=(2)", "west", "east", "row", "function app.merge", "merged",
                     "west", "east", "east+west@east")
    assert west.exceptions(0) == west.exceptions(1)
    wait("west's stamps alike on both nodes", lambda: west.stamps(0) == west.stamps(1))


def test_a_merge_that_is_not_commutative_is_realigned_by_the_arbiter(sites: tuple[Site, Site, list[Relay]]) -> None:
    """East changes row 5 twice while west changes it once: east merges its second change with
    west's, west merges east's first with its own and then east's second with that. East, the
    arbiter, realigns the rows it merged: afterwards every node holds east's last merge."""
    east, west, relays = sites
    before = (len(east.exceptions(0)), len(west.exceptions(0)))
    concurrently(relays, east, west, "UPDATE app.merged SET v = 'e1', n = 1 WHERE id = 5",
                 "UPDATE app.merged SET v = 'w', n = 2 WHERE id = 5",
                 "UPDATE app.merged SET v = 'e2', n = 1 WHERE id = 5")
    settle(east, west, "the merges realigned on every node", (before[0] + 1, before[1] + 2))
    assert (5, "e2+w@east", 3) in east.rows(0)


def test_a_function_that_raises_stops_the_link_there_until_fixed(sites: tuple[Site, Site, list[Relay]]) -> None:
    east, west, relays = sites
    before = (len(east.exceptions(0)), len(west.exceptions(0)))
    concurrently(relays, east, west, "UPDATE app.merged SET v = 'east, refused', n = 1 WHERE id = 3",
                 "UPDATE app.merged SET v = 'west', n = 2 WHERE id = 3")
    east.sql("UPDATE app.merged SET v = 'east later' WHERE id = 4")  # after it: must wait for it
    wait("the function's error in west's logs", lambda: "no merge of row 3" in logs(west))
    wait("the function's error in east's log", lambda: "no merge of row 3" in logs(east))
    time.sleep(3.0)
    for i in west.nodes():  # nothing of east's from there on, on any node; every node still serves
        rows = west.rows(i)
        assert (3, "west", 2) in rows and (4, "start", 0) in rows
    assert (3, "east, refused", 1) in east.rows(0)
    assert (len(east.exceptions(0)), len(west.exceptions(0))) == before

    # fixed (a schema change on each site, replicated to its nodes): the link resumes there
    fixed = MERGE.replace("'east, refused'", "'never'")
    for site in (east, west):
        site.sql(fixed)
    settle(east, west, "the link resumed and merged the row", (before[0] + 1, before[1] + 1), timeout=180)
    assert (3, "east, refused+west@east", 3) in east.rows(0)
    assert (4, "east later", 0) in east.rows(0)
