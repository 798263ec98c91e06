"""A link's rules between two real local sites (docs/LINKS.md section 8, issue 38): site "east"
sends to site "west" what its [[link]] rules choose, reshaped as they say, evaluated in east's
PostgreSQL by a read-only session of a role that is not a superuser (link/sqleval.py).

- an excluded table does not arrive; a row filter lets only its rows through, and an UPDATE that
  moves a row out of the subset arrives as a DELETE;
- a renamed table, a renamed and a dropped column and a computed column arrive as configured; a
  row function reshapes a row (and drops one);
- a hostile row filter (a volatile function doing an INSERT) is refused by the read-only
  session: the insert does not happen, the link stops at that transaction with the reason in
  east's log and status, nothing after it arrives; once the operator fixes the rule (and
  restarts east's coordinator) the link resumes from west's durable position, losing nothing.

Two real local clusters on one Corosync (each its own group), each started and stopped by
:class:`LocalCluster`, which stops exactly the processes it started (by pid). Every wait is
bounded."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from linksites import LISTEN_OFFSET, Site, link_table, two_sites, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 260
EAST_PORT, WEST_PORT = BASE, BASE + 2  # one node each
ROLE, PASSWORD = "link_rules", "link-rules-Pw-0"

EAST_SQL = [
    "CREATE SCHEMA app",
    "CREATE TABLE app.items (id int PRIMARY KEY, v text, n int)",
    "CREATE TABLE app.secret (id int PRIMARY KEY, v text)",
    "CREATE TABLE app.emp (id int PRIMARY KEY, region text, ssn text, salary int)",
    "CREATE TABLE app.notes (id int PRIMARY KEY, body text, n int)",
    "CREATE TABLE app.hostile (id int PRIMARY KEY)",
    "CREATE TABLE app.victim (x int)",
    # f(jsonb) returns jsonb: shouts the body, keeps the private ones home
    "CREATE FUNCTION app.shout(r jsonb) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$ SELECT CASE "
    "WHEN r->>'body' = 'private' THEN NULL ELSE r || jsonb_build_object('body', upper(r->>'body')) END $$",
    # what a hostile rule would call: it writes
    "CREATE FUNCTION app.evil(int) RETURNS boolean LANGUAGE sql VOLATILE AS "
    "'INSERT INTO app.victim VALUES ($1) RETURNING true'",
    f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'",  # the rules' role: no superuser, no more than it needs
    f"GRANT USAGE ON SCHEMA app TO {ROLE}",
    f"GRANT INSERT ON app.victim TO {ROLE}",  # even with the right to, the read-only session does not write
]
WEST_SQL = [
    "CREATE SCHEMA app",
    "CREATE TABLE app.items (id int PRIMARY KEY, v text, n int)",
    "CREATE TABLE app.secret (id int PRIMARY KEY, v text)",
    "CREATE TABLE app.staff (id int PRIMARY KEY, region text, pay int, pay_k int)",  # app.emp, reshaped
    "CREATE TABLE app.notes (id int PRIMARY KEY, body text, n int)",
    "CREATE TABLE app.hostile (id int PRIMARY KEY)",
]


def _tables(hostile: str) -> list[dict[str, Any]]:
    return [
        {"name": "app.emp", "filter": "region = 'eu'", "rename": "app.staff", "rename_columns": {"salary": "pay"},
         "drop": ["ssn"], "compute": [{"column": "pay_k", "type": "integer", "sql": "pay * 1000"}]},
        {"name": "app.notes", "function": "app.shout"},
        {"name": "app.hostile", "filter": hostile},
    ]


def _east_link(d: Path, hostile: str) -> dict[str, Any]:
    rules_dsn = psycopg.conninfo.make_conninfo(host="127.0.0.1", port=EAST_PORT, dbname="postgres", user=ROLE,
                                               password=PASSWORD)
    return link_table(d, "east", "west", listen_offset=LISTEN_OFFSET, include=["app.*"], exclude=["app.secret"],
                      rules_dsn=rules_dsn, rules_timeout_ms=2000, table=_tables(hostile))


@pytest.fixture(scope="module")
def sites() -> Iterator[tuple[Site, Site, Path]]:
    with two_sites((1, EAST_PORT, lambda d: _east_link(d, "app.evil(id)")),
                   (1, WEST_PORT, lambda d: link_table(d, "west", "east", subset=True,
                                                       peers=[f"127.0.0.1:{EAST_PORT + LISTEN_OFFSET}"])),
                   prefix="chorus-rules-") as (east, west, east_dir, _):
        yield east, west, east_dir


def _rows(site: Site, query: str) -> list[tuple[Any, ...]]:
    return site.rows(0, query)


def test_rules_choose_and_reshape_what_arrives(sites: tuple[Site, Site, Path]) -> None:
    east, west, _ = sites
    for site, statements in ((east, EAST_SQL), (west, WEST_SQL)):  # links carry no schema change
        with site.connect() as c:
            for s in statements:
                c.execute(s)
    with east.connect() as c:
        c.execute("INSERT INTO app.secret VALUES (1, 'stays home')")
        c.execute("INSERT INTO app.emp VALUES (1, 'eu', '111', 5), (2, 'us', '222', 6), (3, 'eu', '333', 7),"
                  " (4, NULL, '444', 8)")
        c.execute("INSERT INTO app.notes VALUES (1, 'hello', 1), (2, 'private', 2)")
        c.execute("UPDATE app.emp SET salary = 9 WHERE id = 1")  # stays in the subset: an update
        c.execute("UPDATE app.emp SET region = 'us' WHERE id = 3")  # leaves it: a DELETE at west
        c.execute("UPDATE app.emp SET region = 'eu' WHERE id = 2")  # enters it: the row arrives
        c.execute("UPDATE app.notes SET body = 'again' WHERE id = 1")
        c.execute("INSERT INTO app.items VALUES (1, 'last', 0)")  # the marker: everything before it arrived
    wait("east's last row at west", lambda: _rows(west, "SELECT id FROM app.items") == [(1,)])
    assert _rows(west, "SELECT * FROM app.secret") == []  # excluded
    # filtered (region = 'eu', NULL is not), renamed, salary renamed pay, ssn dropped, pay_k computed
    assert _rows(west, "SELECT id, region, pay, pay_k FROM app.staff ORDER BY id") == [
        (1, "eu", 9, 9000), (2, "eu", 6, 6000)]
    # the row function shouted and kept the private note home
    assert _rows(west, "SELECT id, body, n FROM app.notes ORDER BY id") == [(1, "AGAIN", 1)]
    # west's position moved to east's last GID
    wait("west's position at east's committed GID", lambda: west.position(0)[0][2] == east.committed())


def test_a_hostile_rule_is_refused_and_the_link_resumes_once_fixed(sites: tuple[Site, Site, Path]) -> None:
    east, west, east_dir = sites
    log = east_dir / "nodes" / "n1" / "coordinator.log"
    with east.connect() as c:
        c.execute("INSERT INTO app.hostile VALUES (7)")  # its rule tries to write
        c.execute("INSERT INTO app.items VALUES (2, 'after the hostile one', 0)")
        c.execute("DELETE FROM app.items WHERE id = 1")
    wait("the link stopped with the reason in east's log",
         lambda: "cannot execute INSERT in a read-only transaction" in log.read_text(errors="replace")
         and "link east-west stops" in log.read_text(errors="replace"))
    stopped_at = west.position(0)[0][2]
    time.sleep(3)  # nothing after the refused transaction arrives, nothing is skipped
    assert west.position(0)[0][2] == stopped_at
    assert _rows(west, "SELECT id FROM app.items") == [(1,)]
    assert _rows(west, "SELECT id FROM app.hostile") == []
    with east.connect() as c:
        assert c.execute("SELECT count(*) FROM app.victim").fetchone() == (0,)  # the insert did not happen
    # the operator fixes the rule; east's coordinator restarts with it; the link resumes from
    # west's durable position: the refused transaction and everything after it arrive, once
    east.cluster.stop("n1")
    east.cluster.up(1, EAST_PORT, links=[_east_link(east_dir, "id > 0")])
    wait("the transactions after the fix at west", lambda: _rows(west, "SELECT id FROM app.items") == [(2,)]
         and _rows(west, "SELECT id FROM app.hostile") == [(7,)])
    wait("west's position at east's committed GID", lambda: west.position(0)[0][2] == east.committed())
    with west.connect() as c:
        row = c.execute("SELECT phase, accepts_writes FROM chorus.node").fetchone()
        assert row == ("online", True)
    with east.connect() as c:
        assert c.execute("SELECT count(*) FROM app.victim").fetchone() == (0,)
