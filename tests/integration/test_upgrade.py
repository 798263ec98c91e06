"""Extension upgrade (issue 35): a database made at version 0.1 of the extension, whose tables
carry 0.1's visible capture triggers, moves to 0.2 with ``ALTER EXTENSION chorus UPDATE`` and
ends identical in behaviour to a fresh ``CREATE EXTENSION chorus`` at 0.2: the same functions
(bodies, languages, pinned ``search_path``, privileges), views and event trigger, and the new
capture: internal triggers that ``pg_dump`` leaves out and that fire on every write.

One PostgreSQL with the extension preloaded and no coordinator: a write to a captured table
fails there (the node is not online), which is how the test sees that capture fires."""

from __future__ import annotations

import os
import subprocess
from typing import Any, Iterator

import psycopg
import pytest

from chorus.testkit.localcluster import PGBIN, PlainPostgres, temporary_postgres

pytestmark = pytest.mark.integration

PORT = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 93

# Everything of the extension a session can call or read, as the catalogs hold it.
FUNCTIONS = """
SELECT p.oid::regprocedure::text, l.lanname, p.prosrc, p.probin, p.proconfig, p.prosecdef, p.provolatile,
       p.proisstrict, p.proacl::text, p.prorettype::regtype::text, pg_get_expr(p.proargdefaults, 0),
       p.proargnames, p.proretset
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = 'chorus'::regnamespace ORDER BY 1
"""
VIEWS = """
SELECT c.relname, pg_get_viewdef(c.oid), c.relacl::text FROM pg_class c
 WHERE c.relnamespace = 'chorus'::regnamespace AND c.relkind = 'v' ORDER BY 1
"""
EVENT_TRIGGERS = "SELECT evtname, evtevent, evtfoid::regproc::text, evtenabled, evttags FROM pg_event_trigger ORDER BY 1"
MEMBERS = """
SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'chorus')
   AND deptype = 'e' ORDER BY 1
"""
SCHEMA = "SELECT nspacl::text FROM pg_namespace WHERE nspname = 'chorus'"
TABLES = """
SELECT c.relname, c.relacl::text, c.relowner::regrole::text,
       array_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                 ORDER BY a.attnum),
       (SELECT array_agg(pg_get_constraintdef(k.oid) ORDER BY k.conname) FROM pg_constraint k WHERE k.conrelid = c.oid),
       (SELECT array_agg(x.extcondition) FROM pg_extension x WHERE x.extname = 'chorus' AND c.oid = ANY(x.extconfig))
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE c.relnamespace = 'chorus'::regnamespace AND c.relkind = 'r' GROUP BY c.oid, c.relname ORDER BY 1
"""
TRIGGERS = """
SELECT tgrelid::regclass::text, tgfoid::regproc::text, tgisinternal, tgenabled, tgtype FROM pg_trigger
 WHERE tgfoid IN ('chorus.capture()'::regprocedure, 'chorus.capture_truncate()'::regprocedure)
 ORDER BY 1, 2
"""

APP = """
CREATE SCHEMA app;
CREATE TABLE app.accounts (id int PRIMARY KEY, balance int);
CREATE TABLE app.audit (at timestamptz, what text);
CREATE TABLE app.kept_local (id int);
CREATE SEQUENCE app.ticket;
"""


@pytest.fixture(scope="module")
def server() -> Iterator[PlainPostgres]:
    with temporary_postgres("chorus-upgrade-", PORT, extension=True) as pg:
        yield pg


def _db(pg: PlainPostgres, name: str) -> str:
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name}")
        c.execute(f"CREATE DATABASE {name}")
    return pg.dsn.replace("dbname=postgres", f"dbname={name}")


def _session(dsn: str) -> psycopg.Connection[Any]:
    c = psycopg.connect(dsn, autocommit=True)
    c.execute("SET chorus.replicate_ddl = off")
    return c


def _state(c: psycopg.Connection[Any]) -> dict[str, Any]:
    return {name: c.execute(q).fetchall()
            for name, q in (("functions", FUNCTIONS), ("views", VIEWS), ("event triggers", EVENT_TRIGGERS),
                            ("members", MEMBERS), ("schema", SCHEMA), ("triggers", TRIGGERS),
                            ("tables", TABLES))}


# What version 0.1's library made for each table it attached (extension/chorus_ddl.c at 0.1): two
# ordinary triggers, enabled ALWAYS. This library makes internal ones even for 0.1's SQL (the
# functions are the same C symbols), so a node made at 0.1 is rebuilt here as 0.1 left it.
ATTACH_0_1 = """
CREATE TRIGGER chorus_capture AFTER INSERT OR UPDATE OR DELETE ON {t} FOR EACH ROW EXECUTE FUNCTION chorus.capture();
CREATE TRIGGER chorus_capture_truncate AFTER TRUNCATE ON {t} FOR EACH STATEMENT EXECUTE FUNCTION chorus.capture_truncate();
ALTER TABLE {t} ENABLE ALWAYS TRIGGER chorus_capture;
ALTER TABLE {t} ENABLE ALWAYS TRIGGER chorus_capture_truncate;
"""


def _made(dsn: str, version: str) -> psycopg.Connection[Any]:
    """The application's tables in a database with the extension at ``version``; every table
    captured but app.kept_local (detached)."""
    c = _session(dsn)
    c.execute("SET chorus.capture = off")
    c.execute(f"CREATE EXTENSION chorus VERSION '{version}'")
    if version == "0.1":
        c.execute("ALTER EVENT TRIGGER chorus_on_ddl_end DISABLE")
        c.execute(APP)
        for t in ("app.accounts", "app.audit"):
            c.execute(ATTACH_0_1.format(t=t))
        c.execute("ALTER EVENT TRIGGER chorus_on_ddl_end ENABLE ALWAYS")
    else:
        c.execute(APP)
        c.execute("SELECT chorus.detach('app.kept_local')")
    c.execute("RESET chorus.capture")
    return c


def test_update_from_0_1_equals_a_fresh_0_2(server: PlainPostgres) -> None:
    with _made(_db(server, "up01"), "0.1") as old, _made(_db(server, "fresh02"), "0.2") as fresh:
        before = old.execute(TRIGGERS).fetchall()
        # 0.1: visible triggers named chorus_capture, as pg_dump and \d show them
        assert {(r[0], r[2]) for r in before} == {("app.accounts", False), ("app.audit", False)}
        assert old.execute("SELECT extversion FROM pg_extension WHERE extname = 'chorus'").fetchone() == ("0.1",)
        old.execute("ALTER EXTENSION chorus UPDATE TO '0.2'")
        assert old.execute("SELECT extversion FROM pg_extension WHERE extname = 'chorus'").fetchone() == ("0.2",)
        got, want = _state(old), _state(fresh)
        for part in want:
            assert got[part] == want[part], part
        assert {(r[0], r[2], r[3]) for r in got["triggers"]} == {
            ("app.accounts", True, "A"), ("app.audit", True, "A")}
        # every function's search_path is pinned, as docs/SECURITY.md says
        for row in got["functions"]:
            if row[1] in ("sql", "plpgsql"):
                assert row[4] is not None and any(s.startswith("search_path=pg_catalog, pg_temp") for s in row[4]), row


def test_update_from_0_1_0_2_and_0_3_equals_a_fresh_0_4(server: PlainPostgres) -> None:
    """0.3 adds chorus.link_position, 0.4 chorus.link_stamp and chorus.link_exceptions
    (docs/LINKS.md sections 3, 5 and 9), owned by the extension, readable by pg_read_all_stats
    only; a node at 0.1 or 0.2 goes through each version to it."""
    with _made(_db(server, "up03"), "0.3") as v3, _made(_db(server, "up02"), "0.2") as old, \
            _made(_db(server, "up01c"), "0.1") as older, _made(_db(server, "fresh04"), "0.4") as fresh:
        assert sorted(r[0] for r in _state(v3)["tables"]) == ["link_position"]
        for c in (v3, old, older):
            c.execute("ALTER EXTENSION chorus UPDATE")
            assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'chorus'").fetchone() == ("0.4",)
        want = _state(fresh)
        assert sorted(r[0] for r in want["tables"]) == ["link_exceptions", "link_position", "link_stamp"]
        for table in want["tables"]:
            assert "pg_read_all_stats=r/" in table[1] and "=r/" not in table[1].replace("pg_read_all_stats=r/", "")
        for c in (v3, old, older):
            got = _state(c)
            for part in want:
                assert got[part] == want[part], part


def test_the_upgraded_capture_fires_and_is_invisible(server: PlainPostgres) -> None:
    dsn = _db(server, "up01b")
    with _made(dsn, "0.1") as c:
        c.execute("ALTER EXTENSION chorus UPDATE")
        # the node is not online: a captured write is refused (capture fired); a detached table's is not
        with pytest.raises(psycopg.Error, match="chorus"):
            c.execute("INSERT INTO app.accounts VALUES (1, 10)")
        c.execute("INSERT INTO app.kept_local VALUES (1)")
        # a table owner's DISABLE TRIGGER ALL leaves capture on
        c.execute("CREATE ROLE upgrade_owner")
        c.execute("ALTER TABLE app.accounts OWNER TO upgrade_owner")
        c.execute("GRANT USAGE ON SCHEMA app TO upgrade_owner")
        c.execute("SET ROLE upgrade_owner")
        c.execute("ALTER TABLE app.accounts DISABLE TRIGGER ALL")
        with pytest.raises(psycopg.Error, match="chorus"):
            c.execute("INSERT INTO app.accounts VALUES (2, 10)")
        c.execute("RESET ROLE")
        # new tables get the new capture
        c.execute("CREATE TABLE app.later (id int PRIMARY KEY)")
        assert c.execute("SELECT tgisinternal FROM pg_trigger WHERE tgrelid = 'app.later'::regclass").fetchall() == [
            (True,), (True,)]
    dump = subprocess.run([str(PGBIN / "pg_dump"), "--schema-only", "--schema=app", "-d", dsn],
                          capture_output=True, text=True, check=True).stdout
    assert "CREATE TABLE app.accounts" in dump
    assert "TRIGGER" not in dump and "chorus" not in dump
