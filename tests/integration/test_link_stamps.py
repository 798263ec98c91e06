"""Row stamps written by the apply function (docs/LINKS.md section 5.1, extension/chorus_stamp.c)
against one PostgreSQL without a cluster: where ``chorus.link_site`` is set, the apply of a
writeset at GID g records g for each of its row keys in ``chorus.link_stamp``, under the key the
coordinator computes (``link.settle.stamp_hash``); references, a link writeset's own rows and a
node without the setting write none; a run of writesets is refused there. (The origin's part, in
its PRE_COMMIT, needs a cluster: tests/integration/test_link_conflicts.py.)"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from chorus import wire
from chorus.link.settle import stamp_hash
from chorus.nodedb import PIN_SEARCH_PATH
from chorus.testkit.localcluster import PlainPostgres

pytestmark = pytest.mark.integration

T = wire.Table("app", "t", (wire.Column("id", "integer"), wire.Column("v", "text")), (0,))


@pytest.fixture(scope="module")
def server(chorus_postgres: PlainPostgres) -> PlainPostgres:
    """The session's PostgreSQL with the extension (conftest.chorus_postgres), this file's table app.t."""
    with psycopg.connect(chorus_postgres.dsn, autocommit=True) as c:
        c.execute("SET chorus.capture = off")
        c.execute("SET chorus.replicate_ddl = off")
        c.execute("CREATE TABLE app.t (id int PRIMARY KEY, v text)")
    return chorus_postgres


def _site(pg: PlainPostgres, name: str) -> None:
    """chorus.link_site (PGC_SIGHUP) set for the server, and seen by a new session."""
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute(f"ALTER SYSTEM SET chorus.link_site = '{name}'")
        c.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            row = c.execute("SHOW chorus.link_site").fetchone()
        if row is not None and row[0] == name:
            return
        time.sleep(0.1)
    pytest.fail(f"chorus.link_site did not become {name!r}")


def _session(pg: PlainPostgres) -> psycopg.Connection[Any]:
    c = psycopg.connect(pg.dsn, autocommit=True)
    c.execute("SET session_replication_role = replica")
    c.execute("SET chorus.capture = off")
    c.execute(PIN_SEARCH_PATH)
    return c


def _gid(c: psycopg.Connection[Any]) -> int:
    row = c.execute("SELECT chorus.committed_gid()").fetchone()
    assert row is not None
    return int(row[0])


def _key(k: int, mode: wire.KeyMode = wire.KeyMode.EXCLUSIVE) -> wire.Key:
    return wire.Key(mode, (b"app", b"t", b"id", b"%d" % k))


def _insert(k: int, *extra: wire.Key) -> wire.Writeset:
    return wire.Writeset(1, 1, 0, (T,), (wire.Row("I", 0, (), (b"%d" % k, b"x")),), (_key(k), *extra))


def _stamps(c: psycopg.Connection[Any]) -> dict[bytes, tuple[str, int]]:
    return {bytes(k): (s, int(g)) for k, s, g in c.execute("SELECT key, site, clock FROM chorus.link_stamp")}


def test_the_apply_stamps_each_row_key_with_its_gid_where_the_site_is_set(server: PlainPostgres) -> None:
    _site(server, "")
    with _session(server) as c:
        g = _gid(c)
        c.execute("SELECT chorus.apply_writeset(%s, %s, %s)", (g + 1, g, wire.encode(_insert(1))))
        assert _stamps(c) == {}  # no site: no stamps
    _site(server, "east")
    with _session(server) as c:
        g = _gid(c)
        parent = wire.Key(wire.KeyMode.REFERENCE, (b"app", b"p", b"id", b"1"))
        c.execute("SELECT chorus.apply_writeset(%s, %s, %s)", (g + 1, g, wire.encode(_insert(2, parent))))
        assert _stamps(c) == {stamp_hash(_key(2).parts): ("east", g + 1)}  # the reference is not stamped
        # a later change of the row moves its stamp to that GID
        upd = wire.Writeset(1, 1, 0, (T,), (wire.Row("U", 0, (b"2",), (b"2", b"y")),), (_key(2, wire.KeyMode.UPDATE),))
        c.execute("SELECT chorus.apply_writeset(%s, %s, %s)", (g + 2, g + 1, wire.encode(upd)))
        assert _stamps(c)[stamp_hash(_key(2).parts)] == ("east", g + 2)
        # a table certified whole is stamped as a whole
        whole = wire.Writeset(1, 1, 0, (T,), (wire.Row("I", 0, (), (b"3", b"z")),),
                              (wire.Key(wire.KeyMode.EXCLUSIVE, (b"app", b"t")),))
        c.execute("SELECT chorus.apply_writeset(%s, %s, %s)", (g + 3, g + 2, wire.encode(whole)))
        assert _stamps(c)[stamp_hash((b"app", b"t"))] == ("east", g + 3)


def test_a_link_writeset_is_not_stamped_by_the_extension(server: PlainPostgres) -> None:
    """Its stamps are rows the coordinator decided (link/settle.py)."""
    _site(server, "east")
    with _session(server) as c:
        before = _stamps(c)
        g = _gid(c)
        link_key = wire.Key(wire.KeyMode.EXCLUSIVE, (b"chorus", b"link_position", b"link", b"east-west"))
        c.execute("SELECT chorus.apply_writeset(%s, %s, %s)", (g + 1, g, wire.encode(_insert(10, link_key))))
        assert _stamps(c) == before


def test_a_run_is_refused_where_rows_are_stamped(server: PlainPostgres) -> None:
    _site(server, "east")
    with _session(server) as c:
        g = _gid(c)
        run = b"".join(len(raw).to_bytes(4, "big") + raw for raw in (wire.encode(_insert(20)), wire.encode(_insert(21))))
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="run of writesets is not applied"):
            c.execute("SELECT chorus.apply_run(%s, %s, %s)", (g + 2, g, run))
        one = len(wire.encode(_insert(22))).to_bytes(4, "big") + wire.encode(_insert(22))
        c.execute("SELECT chorus.apply_run(%s, %s, %s)", (g + 1, g, one))  # a run of one is a writeset
        assert _stamps(c)[stamp_hash(_key(22).parts)] == ("east", g + 1)
    _site(server, "")


def test_the_coordinator_sets_the_site_its_links_say(server: PlainPostgres) -> None:
    """A node deployed without the settings its links need, or with another site's, gets them from
    its configuration when its coordinator starts (before it applies or takes a write)."""
    import asyncio

    from chorus.nodedb import NodeDatabase

    async def settle(want: dict[str, str]) -> None:
        db = NodeDatabase(server.dsn, "n1")
        await db.connect(asyncio.Event())
        try:
            await db.settle_settings(want)
        finally:
            await db.close()

    _site(server, "west")
    for site, columns in (("east", "app.t:v"), ("", ""), ("east", "")):
        asyncio.run(settle({"chorus.link_site": site, "chorus.link_old_columns": columns}))
        with psycopg.connect(server.dsn, autocommit=True) as c:
            assert c.execute("SHOW chorus.link_site").fetchone() == (site,)
            assert c.execute("SHOW chorus.link_old_columns").fetchone() == (columns,)
    _site(server, "")


def test_the_apply_session_sends_the_commit_time_only_where_the_node_stamps_rows(server: PlainPostgres) -> None:
    """A node that stamps rows (a site that receives a link) gives each apply its origin commit
    time, which the stamps record; any other node sends the plain call (no set_config: it costs
    every apply, docs/NATIVE.md "Step 5, second measures")."""
    import asyncio

    from chorus.commit.applier import ApplySession

    when = 1_790_000_000_123_456  # µs since the Unix epoch

    async def apply(stamps: bool, k: int) -> tuple[str, bool]:
        s = ApplySession(server.dsn, "stamps-test", stamps=stamps)
        await s.connect()
        try:
            assert s.conn is not None
            cur = await s.conn.execute("SELECT chorus.committed_gid()")
            row = await cur.fetchone()
            assert row is not None
            g = int(row[0])
            assert await s.apply_run(g + 1, g, [_insert(k)], commit_time=when)
            cur = await s.conn.execute("SELECT statement FROM pg_prepared_statements WHERE name = 'chorus_apply'")
            text = await cur.fetchone()
            assert text is not None
            return str(text[0]), s.timed
        finally:
            await s.close()

    _site(server, "")
    statement, timed = asyncio.run(apply(False, 30))
    assert not timed and "set_config" not in statement and "commit_time" not in statement
    _site(server, "east")
    statement, timed = asyncio.run(apply(True, 31))
    assert timed and "chorus.commit_time" in statement
    with _session(server) as c:
        row = c.execute("SELECT (extract(epoch FROM commit_time) * 1000000)::bigint FROM chorus.link_stamp "
                        "WHERE key = %s", (stamp_hash(_key(31).parts),)).fetchone()
    assert row == (when,)
    _site(server, "")
