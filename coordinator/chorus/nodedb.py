"""The coordinator's own connection to its PostgreSQL: the node's committed and durable GIDs,
the writes switch, and the start of a coordinator (``chorus.node_init``). Apply sessions have
connections of their own (commit/applier.py)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Optional

import psycopg
from psycopg import sql

log = logging.getLogger("chorus.coordinator")

DB_RETRY_S = 0.5

# The status of a 32-bit xid of this epoch's recent past (pg_xact_status wants the full xid8).
_XACT_STATUS = ("SELECT pg_xact_status((CASE WHEN f > c THEN f - 4294967296 ELSE f END)::text::xid8)"
                " FROM (SELECT c, (c >> 32 << 32) + %s AS f"
                " FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS c) s) t")


class DatabaseFatal(Exception):
    """The database cannot serve this node (no extension, wrong state): the daemon stops."""


@dataclass(frozen=True)
class NodeStart:
    """What the database says when a coordinator (re)starts."""
    committed: int  # the node's committed GID (the watermark)
    lanes: int  # the commit lanes it runs
    max_committed: int  # the highest GID committed through any lane
    compat: str  # its encoding and PostgreSQL major version (docs/PROTOCOL.md section 2)


# Every session the coordinator opens resolves names in the catalogs only: a function or
# operator a role created elsewhere cannot stand in for a built-in one (CVE-2018-1058), nor a
# temporary object for a catalog (docs/SECURITY.md).
PIN_SEARCH_PATH = "SET search_path = pg_catalog, pg_temp"


class NodeDatabase:
    def __init__(self, dsn: str, name: str) -> None:
        self.dsn = dsn
        self.name = name
        self.conn: Optional[psycopg.AsyncConnection[Any]] = None
        self.ok = asyncio.Event()  # connected and initialised

    async def connect(self, stopping: asyncio.Event) -> None:
        """Connect, retrying with backoff until it works or ``stopping`` is set."""
        delay = DB_RETRY_S
        while True:
            try:
                self.conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, application_name=f"chorus coordinator {self.name}")
                await self.conn.execute(PIN_SEARCH_PATH)
                return
            except psycopg.Error as e:
                if stopping.is_set():
                    raise DatabaseFatal("stopped while waiting for PostgreSQL") from e
                log.warning("cannot connect to PostgreSQL (%s); retrying", str(e).strip())
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def close(self) -> None:
        if self.conn is not None:
            try:
                await self.conn.close()
            except psycopg.Error:
                pass

    async def q(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        """The first column of the first row."""
        assert self.conn is not None
        async with self.conn.cursor() as cur:
            await cur.execute(query, params)
            row = await cur.fetchone()
            return row[0] if row else None

    async def q_all(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        assert self.conn is not None
        async with self.conn.cursor() as cur:
            await cur.execute(query, params)
            return await cur.fetchall()

    async def q_logged(self, query: str, params: tuple[Any, ...]) -> None:
        """Run it; a failure is only logged."""
        try:
            await self.q(query, params)
        except psycopg.Error as e:
            log.warning("%s: %s", query, str(e).strip())

    async def start_node(self, commit_lanes: int) -> NodeStart:
        """Tell the extension the coordinator is (re)starting. After a coordinator restart the
        committed GID can be past the durable one (a backend committed meanwhile)."""
        try:
            lanes = int(await self.q("SELECT chorus.set_lanes(%s)", (commit_lanes,)))
            if lanes != commit_lanes:
                log.warning("using %d commit lanes, not the %d configured: the lanes were not settled by a clean "
                            "shutdown; the change takes effect after one", lanes, commit_lanes)
            durable = await self.durable_gid()
            await self.q("SELECT chorus.node_init(%s, %s)", (durable, lanes))
            start = NodeStart(
                committed=await self.committed_gid(), lanes=lanes,
                max_committed=int(await self.q("SELECT max_done FROM chorus.lane_state()")),
                compat=str(await self.q(
                    "SELECT current_setting('server_encoding') || ' / PostgreSQL ' || "
                    "current_setting('server_version_num')::int / 10000")))
            await self.q("SELECT chorus.set_online(false, 'Its coordinator is starting and has not joined the cluster yet')")
        except psycopg.errors.UndefinedFunction as e:
            raise DatabaseFatal("the chorus extension is not installed in this database "
                                "(CREATE EXTENSION chorus)") from e
        except psycopg.errors.ObjectNotInPrerequisiteState as e:
            raise DatabaseFatal(f"{e}".strip()) from e
        self.ok.set()
        return start

    async def settle_settings(self, want: dict[str, str], wait_s: float = 10.0) -> None:
        """Make server settings what this node's configuration says, before it applies or takes
        any write: ``chorus.link_site`` (the site its links receive for, "" for none) and
        ``chorus.link_old_columns`` (the delta columns whose old values its changes carry;
        docs/LINKS.md sections 5.1 and 7.1). Every node of a site must stamp and capture alike
        from the first GID it applies, so a node whose setting differs (a host deployed by hand,
        a file lost) gets it here: ``ALTER SYSTEM`` and a reload, then each setting read back."""
        read = "SELECT COALESCE(pg_catalog.current_setting(%s, true), '')"
        changed = []
        for name, value in want.items():
            if await self.q(read, (name,)) == value:
                continue
            assert self.conn is not None
            log.warning("%s is not %r, as this node's configuration says: setting it (ALTER SYSTEM)", name, value)
            try:
                await self.conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(
                    sql.SQL(".").join(sql.Identifier(part) for part in name.split(".")), sql.Literal(value)))
            except psycopg.Error as e:
                raise DatabaseFatal(f"{name} must be {value!r} on this node (its configuration says so), and this "
                                    f"coordinator cannot set it: {str(e).strip()}") from e
            changed.append(name)
        if not changed:
            return
        await self.q("SELECT pg_catalog.pg_reload_conf()")
        deadline = asyncio.get_running_loop().time() + wait_s
        for name in changed:
            while (have := await self.q(read, (name,))) != want[name]:
                if asyncio.get_running_loop().time() > deadline:
                    raise DatabaseFatal(f"{name} is still {have!r} after a reload, not {want[name]!r} as this "
                                        "node's configuration says (is it set where ALTER SYSTEM does not override it?)")
                await asyncio.sleep(0.05)

    async def committed_gid(self) -> int:
        return int(await self.q("SELECT chorus.committed_gid()"))

    async def durable_gid(self) -> int:
        return int(await self.q("SELECT chorus.durable_gid()"))

    async def local_xact_ended(self, xid: int, pid: int) -> bool:
        """Whether the local transaction ``xid`` of backend ``pid`` has ended: the commit log
        says it aborted; a schema change (no ``xid``: it runs as one statement) ended when its
        session is no longer active."""
        if xid:
            return bool(await self.q(_XACT_STATUS, (xid,)) == "aborted")
        return not await self.q("SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND state = 'active'",
                                (pid,))

    async def set_online(self, online: bool, reason: str = "") -> None:
        if self.conn is None or self.conn.closed:
            return
        try:
            await self.q("SELECT chorus.set_online(%s, %s)", (online, reason[:250]))
        except psycopg.Error as e:
            log.warning("cannot set online=%s: %s", online, str(e).strip())

    async def alive(self) -> bool:
        try:
            await self.q("SELECT 1")
            return True
        except psycopg.Error:
            return False
