"""Schema changes that run beside the total order: CREATE INDEX, DROP INDEX and REINDEX
CONCURRENTLY (docs/DDL.md).

On a single PostgreSQL these statements let other sessions write while they work. Chorus keeps
that: the origin commits the statement's first step (the index's catalog entry, marking it
invalid, or the new copies) at a GID like any writeset (chorus_ddl.c, flag CONCURRENT); every other node commits
that GID empty, then runs the same statement here, in a session of its own, under the origin's
settings and role, and goes on with the total order once the statement holds its table's lock.
Row writes go on everywhere meanwhile; a later schema change of the same table waits for the
build, as it would on the origin. A build that fails on a node leaves its index invalid there, as
PostgreSQL leaves it; the reason is logged and shown by ``chorus status``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Optional

import psycopg

from chorus import wire
from chorus.nodedb import PIN_SEARCH_PATH

log = logging.getLogger("chorus.concurrent")

# How long the total order waits for a statement to take its table's lock. Another session
# holding a conflicting lock (a VACUUM, an ANALYZE, a plain CREATE INDEX) can delay it; past
# this the order goes on and the statement takes the lock when it can.
LOCK_WAIT_S = 10.0

_HOLDS_LOCK = ("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE pid = %s AND granted "
               "AND locktype = 'relation' AND mode = 'ShareUpdateExclusiveLock')")
# the tables (and their indexes' tables) the running statements hold locks on
_TABLES_LOCKED = ("SELECT DISTINCT l.pid, n.nspname, t.relname FROM pg_catalog.pg_locks l "
                  "JOIN pg_catalog.pg_class c ON c.oid = l.relation "
                  "LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = c.oid "
                  "JOIN pg_catalog.pg_class t ON t.oid = coalesce(i.indrelid, c.oid) "
                  "JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace "
                  "WHERE l.pid = ANY(%s) AND l.locktype = 'relation'")


@dataclass(frozen=True)
class Outcome:
    gid: int
    statement: str
    ok: bool
    error: str
    seconds: float


def _literal(value: str) -> bytes:
    """``value`` as an escape string literal, whatever standard_conforming_strings says; its
    bytes as the origin's database wrote them."""
    b = wire.name_bytes(value)
    return b"E'" + b.replace(b"\\", b"\\\\").replace(b"'", b"''") + b"'"




def session_setup(item: wire.Schema) -> list[bytes]:
    """The statements that give a session the origin's context for ``item``: replication of
    its schema changes off (every node runs it itself), its node-local parts fixed up as in an
    apply (a tablespace this node lacks), deadlocks decided by the other session (an apply that
    meets one is retried), the origin's settings, then its role: the extension runs each
    statement of a replaying session as ``chorus.replay_role``, in a restricted security context
    (no SET ROLE back to this session's superuser), as a replay in an apply runs
    (docs/SECURITY.md)."""
    out = [b"SET search_path = pg_catalog, pg_temp",
           b"SET chorus.replicate_ddl = off", b"SET chorus.replaying = on", b"SET deadlock_timeout = '30s'"]
    out += [b"SELECT pg_catalog.set_config(" + _literal(name) + b", " + _literal(value) + b", false)"
            for name, value in item.settings]
    out.append(b"SELECT pg_catalog.set_config('chorus.replay_role', " + _literal(item.role) + b", false)")
    return out


class ConcurrentSchemaChanges:
    """The concurrent index statements this node runs for other nodes, and their outcomes."""

    def __init__(self, dsn: str, name: str, history: int = 20) -> None:
        self.dsn = dsn
        self.name = name
        self.running: dict[int, asyncio.Task[None]] = {}
        self.pids: dict[int, int] = {}  # GID -> the backend running it
        self.recent: deque[Outcome] = deque(maxlen=history)
        self.succeeded = 0
        self.failed = 0

    async def start(self, gid: int, item: wire.Schema, lock_wait: float = LOCK_WAIT_S) -> None:
        """Run ``item`` (GID ``gid``, committed here) in a session of its own; return once it holds
        its table's lock, has ended, or ``lock_wait`` seconds have passed."""
        text = item.statement.decode("utf-8", "replace")
        t0 = time.monotonic()
        conn: Optional[psycopg.AsyncConnection[Any]] = None
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, application_name=f"chorus concurrent {self.name} GID {gid}")
            for statement in session_setup(item):
                await conn.execute(statement)
        except psycopg.Error as e:
            if conn is not None:
                await conn.close()
            self._done(gid, text, t0, f"setting up its session: {e}")
            return
        pid = conn.info.backend_pid
        task = asyncio.create_task(self._run(gid, conn, item.statement, text, t0))
        self.running[gid] = task
        self.pids[gid] = pid
        log.info("GID %d: running %s", gid, text[:200])
        deadline = asyncio.get_running_loop().time() + lock_wait
        try:
            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as watch:
                await watch.execute(PIN_SEARCH_PATH)
                while not task.done() and asyncio.get_running_loop().time() < deadline:
                    cur = await watch.execute(_HOLDS_LOCK, (pid,))
                    row = await cur.fetchone()
                    if row and row[0]:
                        return
                    await asyncio.sleep(0.005)
        except psycopg.Error as e:
            log.warning("GID %d: cannot watch the statement's lock (%s); going on", gid, e)
            return
        if not task.done():
            log.warning("GID %d: the statement waits for its table's lock (held by another session); "
                        "the total order goes on without it", gid)

    async def _run(self, gid: int, conn: psycopg.AsyncConnection[Any], statement: bytes, text: str,
                   t0: float) -> None:
        error = ""
        try:
            await conn.execute(statement)
        except psycopg.Error as e:
            error = f"{e.sqlstate or ''} {str(e).strip()}".strip()
        finally:
            self.running.pop(gid, None)
            self.pids.pop(gid, None)
            try:
                await conn.close()
            except psycopg.Error:
                pass
        self._done(gid, text, t0, error)

    async def wait_clear(self, tables: set[tuple[bytes, bytes]]) -> None:
        """Wait until no running statement holds a lock on one of ``tables`` ((schema, name) as a
        writeset's keys name them): a later schema change of such a table runs after the build
        here, as it did on its origin (and takes no lock a build waits on: they would
        deadlock)."""
        while self.running and tables:
            try:
                async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                    await conn.execute(PIN_SEARCH_PATH)
                    codec = conn.info.encoding
                    cur = await conn.execute(_TABLES_LOCKED, (list(self.pids.values()),))
                    rows = await cur.fetchall()
            except psycopg.Error as e:
                log.warning("cannot see which tables the running index builds hold (%s): waiting for all", e)
                rows = [(pid, None, None) for pid in self.pids.values()]
            by_pid = {pid: gid for gid, pid in self.pids.items()}
            in_way = {by_pid[pid] for pid, nsp, rel in rows if pid in by_pid and (
                nsp is None or (nsp.encode(codec, "surrogateescape"), rel.encode(codec, "surrogateescape")) in tables)}
            waits = [self.running[g] for g in in_way if g in self.running]
            if not waits:
                return
            log.info("a schema change waits for the index builds of GIDs %s here", sorted(in_way))
            await asyncio.wait(waits)

    def _done(self, gid: int, text: str, t0: float, error: str) -> None:
        seconds = round(time.monotonic() - t0, 3)
        self.recent.append(Outcome(gid, text[:200], not error, error, seconds))
        if error:
            self.failed += 1
            log.error("GID %d: %s failed on this node: %s. Its index is left invalid here, as PostgreSQL "
                      "leaves it: drop it (DROP INDEX) or rebuild it (docs/DDL.md)",
                      gid, text[:200], error)
        else:
            self.succeeded += 1
            log.info("GID %d: done in %.1f s", gid, seconds)

    def as_dict(self) -> dict[str, Any]:
        return {"running": sorted(self.running), "succeeded": self.succeeded, "failed": self.failed,
                "recent": [asdict(o) for o in self.recent]}
