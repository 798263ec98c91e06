"""Schema changes over a link (docs/LINKS.md section 8.1, issue 38): site "east" (one node) sends
its schema changes to site "west" (two nodes) with ``ddl = true`` in both sites' [[link]]; west
applies each through its own total order, as the role that ran it on east.

- ``CREATE TABLE``, rows, ``ALTER TABLE ... ADD COLUMN`` and rows written after it arrive on both
  of west's nodes, alike;
- a schema change of a table the lists exclude, and one naming no table (``CREATE SCHEMA``), are
  not sent: counted and said in ``chorus link status``;
- a hostile ordinary role's schema change runs on west as that role: where it lacks the right
  there, it fails on west, and the link stops at it, visibly, without diverging; once west grants
  the right, it resumes from west's durable position and everything arrives once.

Two real local clusters on one Corosync (each its own group), each started and stopped by
:class:`LocalCluster`, which stops exactly the processes it started (by pid). Every wait is
bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Iterator

import psycopg
import pytest

from linksites import LISTEN_OFFSET, Site, link_table, two_sites, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 770
EAST_PORT, WEST_PORT = BASE, BASE + 2  # east: one node; west: two
INCLUDE = {"include": ["app.*", "open.*"], "exclude": ["app.private*"]}
ROLES = ["postgres", "hostile"]  # the roles whose schema changes the link carries (not "stranger")


@pytest.fixture(scope="module")
def sites() -> Iterator[tuple[Site, Site]]:
    with two_sites((1, EAST_PORT, lambda d: link_table(d, "east", "west", listen_offset=LISTEN_OFFSET, ddl=True,
                                                       ddl_roles=ROLES, **INCLUDE)),
                   (2, WEST_PORT, lambda d: link_table(d, "west", "east", window=8, ddl=True, ddl_roles=ROLES,
                                                       peers=[f"127.0.0.1:{EAST_PORT + LISTEN_OFFSET}"])),
                   prefix="chorus-ddl-") as (east, west, _, _):
        yield east, west


def tables(site: Site, i: int, schema: str) -> list[tuple[Any, ...]]:
    return site.rows(i, "SELECT table_name, column_name, data_type FROM information_schema.columns "
                        "WHERE table_schema = %s ORDER BY table_name, ordinal_position", (schema,))


def out_row(site: Site) -> dict[str, Any]:
    """The ``out`` row of ``chorus link status --json`` on the site's first node."""
    p = subprocess.run([sys.executable, "-m", "chorus", "link", "status", "--dir", site.cluster.dir.as_posix(),
                        site.info[0]["name"], "--json"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    (r,) = [r for r in json.loads(p.stdout)["links"] if r["direction"] == "out"]
    return r


def test_create_alter_and_rows_arrive_on_every_node_and_an_excluded_table_does_not(
        sites: tuple[Site, Site]) -> None:
    east, west = sites
    west.sql("CREATE SCHEMA app")  # a statement naming no table is each site's own
    with east.connect() as c:
        c.execute("CREATE SCHEMA app")
        c.execute("CREATE TABLE app.items (id int PRIMARY KEY, v text)")
        for i in range(1, 6):
            c.execute("INSERT INTO app.items VALUES (%s, %s)", (i, f"row {i}"))
        c.execute("ALTER TABLE app.items ADD COLUMN n int DEFAULT 7")
        c.execute("INSERT INTO app.items VALUES (6, 'row 6', 60)")
        with c.transaction():  # a migration: a schema change and its rows in one transaction
            c.execute("CREATE TABLE app.more (id int PRIMARY KEY, w text)")
            c.execute("INSERT INTO app.more VALUES (1, 'one')")
        c.execute("CREATE TABLE app.private_notes (id int PRIMARY KEY, secret text)")  # excluded
        c.execute("INSERT INTO app.private_notes VALUES (1, 'no')")
        c.execute("CREATE INDEX items_v ON app.items (v)")
        c.execute("INSERT INTO app.items VALUES (7, 'last', 70)")
    want = east.rows(0, "SELECT id, v, n FROM app.items ORDER BY id")
    assert want[-1] == (7, "last", 70) and want[0] == (1, "row 1", 7)
    wait("east's rows after the schema changes, on both of west's nodes",
         lambda: all(west.rows(i, "SELECT to_regclass('app.items') IS NOT NULL")[0][0]
                     and west.rows(i, "SELECT id, v, n FROM app.items ORDER BY id") == want for i in range(2)))
    for i in range(2):
        assert tables(west, i, "app") == [("items", "id", "integer"), ("items", "v", "text"), ("items", "n", "integer"),
                                          ("more", "id", "integer"), ("more", "w", "text")]
        assert west.rows(i, "SELECT id, w FROM app.more") == [(1, "one")]
        assert west.rows(i, "SELECT indexname FROM pg_indexes WHERE schemaname = 'app' AND indexname = 'items_v'") \
            == [("items_v",)]
        assert west.rows(i, "SELECT to_regclass('app.private_notes')") == [(None,)]
    assert west.position(0) == west.position(1)
    r = out_row(east)
    # CREATE SCHEMA (no table) and app.private_notes' CREATE TABLE were not sent
    assert r["ddl_skipped"] == 2, r
    assert "app.private_notes" in r["ddl_skipped_last"], r
    # west's own writes go on beside the link, on the new column
    west.sql("INSERT INTO app.items VALUES (1000, 'west', 1)", i=1)
    wait("west's own row on both nodes",
         lambda: all((1000, "west", 1) in west.rows(i, "SELECT id, v, n FROM app.items") for i in range(2)))


def test_a_hostile_roles_schema_change_runs_as_it_and_stops_the_link_where_it_lacks_the_right(
        sites: tuple[Site, Site]) -> None:
    east, west = sites
    for site in (east, west):  # roles are each site's own; west does not let it create in schema open
        site.sql("CREATE ROLE hostile LOGIN PASSWORD 'hostile-pw'")
        site.sql("CREATE SCHEMA open")
    east.sql("GRANT CREATE, USAGE ON SCHEMA open TO hostile")
    west.sql("GRANT USAGE ON SCHEMA open TO hostile")
    # a role the link does not carry schema changes of: its table is not sent (counted, said why)
    east.sql("CREATE ROLE stranger LOGIN PASSWORD 'stranger-pw'")
    east.sql("GRANT CREATE, USAGE ON SCHEMA open TO stranger")
    skipped = out_row(east)["ddl_skipped"]
    stranger = psycopg.conninfo.make_conninfo(east.dsns[0], user="stranger", password="stranger-pw", passfile="")
    with psycopg.connect(stranger, autocommit=True) as c:
        c.execute("CREATE TABLE open.s (id int PRIMARY KEY)")
    wait("the stranger's schema change counted as not sent",
         lambda: "stranger, not in the link's ddl_roles" in (out_row(east)["ddl_skipped_last"] or ""))
    assert out_row(east)["ddl_skipped"] > skipped
    before = west.position(0)[0][2]
    dsn = psycopg.conninfo.make_conninfo(east.dsns[0], user="hostile", password="hostile-pw", passfile="")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE open.h (id int PRIMARY KEY)")
        c.execute("INSERT INTO open.h VALUES (1)")
    east.sql("INSERT INTO app.items VALUES (8, 'after', 80)")
    # on west the statement runs as hostile, which may not create there: the link stops at it
    time.sleep(8)
    for i in range(2):
        assert west.rows(i, "SELECT to_regclass('open.h')") == [(None,)]
        assert (8, "after", 80) not in west.rows(i, "SELECT id, v, n FROM app.items")
        assert west.rows(i, "SELECT phase, accepts_writes FROM chorus.node") == [("online", True)]
    assert west.position(0)[0][2] == west.position(1)[0][2] < east.committed()
    assert west.position(0)[0][2] >= before
    # granted on west, the link goes on from its position: the table, owned by hostile, and the rows
    west.sql("GRANT CREATE ON SCHEMA open TO hostile")
    wait("the link resumed past the hostile role's schema change",
         lambda: all((8, "after", 80) in west.rows(i, "SELECT id, v, n FROM app.items") for i in range(2)),
         timeout=180)
    for i in range(2):
        assert west.rows(i, "SELECT tableowner FROM pg_tables WHERE schemaname = 'open' AND tablename = 'h'") \
            == [("hostile",)]
        assert west.rows(i, "SELECT id FROM open.h") == [(1,)]
        assert west.rows(i, "SELECT to_regclass('open.s')") == [(None,)]
    assert west.position(0) == west.position(1)
