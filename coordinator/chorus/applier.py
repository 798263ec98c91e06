"""Apply sessions: turn a decoded writeset into rows in the local database.

No SQL text is built from row values: statements are built from quoted identifiers only and
cached per table shape; values travel as text parameters of prepared statements (PostgreSQL
parses them with each column's input function, exactly as the origin printed them). Each apply
transaction calls ``chorus.apply_begin(gid, wait_for)`` so its commit waits for its turn and
records its GID in the commit record (docs/PROTOCOL.md section 4). Sessions run with
``session_replication_role = replica``: user triggers and foreign-key checks do not fire again
(their effects are in the writeset) and nothing is captured twice.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any, Optional, Sequence

import psycopg
from psycopg import pq, sql

from chorus import wire

log = logging.getLogger("chorus.applier")

TRANSIENT_SQLSTATES = {
    "40001",  # serialization failure
    "40P01",  # deadlock detected
    "55P03",  # lock not available
    "57014",  # query canceled (by the watchdog or a statement timeout)
}


ALREADY_COMMITTED = "CH001"  # the extension: this GID is committed on this node already

SYNC_EVERY = 1000  # statements between pipeline syncs in a large writeset


class ApplyError(Exception):
    """Applying a certified writeset failed in a way that retrying cannot fix: the node's data
    would diverge, so the node must stop taking part."""


class TransientApplyError(Exception):
    """Retry the writeset (deadlock, lock timeout, lost connection)."""


class ApplyConnectionLost(TransientApplyError):
    """The apply session's connection ended: retry; PostgreSQL itself may have gone away."""


class AlreadyCommitted(Exception):
    """The GID is committed here already (by a local backend of an earlier coordinator, or an
    earlier copy of the same writeset): nothing to do."""


def _ident(name: str) -> sql.Identifier:
    return sql.Identifier(name)


class StatementCache:
    """SQL for each (table shape, op), built once from identifiers."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], sql.Composed] = {}

    def _table(self, t: wire.Table) -> sql.Composed:
        return sql.SQL("{}.{}").format(_ident(t.nspname), _ident(t.relname))

    def insert(self, t: wire.Table) -> sql.Composed:
        key = ("I", t)
        q = self._cache.get(key)
        if q is None:
            cols = [c for c in t.columns if not c.generated]
            q = sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE VALUES ({})").format(
                self._table(t),
                sql.SQL(", ").join(_ident(c.name) for c in cols),
                sql.SQL(", ").join(sql.Placeholder() * len(cols)),
            )
            self._cache[key] = q
        return q

    def _where(self, t: wire.Table) -> sql.Composable:
        cols = [t.columns[i] for i in t.identity]
        if self._full_identity(t):
            cond = sql.SQL(" AND ").join(
                sql.SQL("{} IS NOT DISTINCT FROM {}").format(_ident(c.name), sql.Placeholder()) for c in cols)
            return sql.SQL("ctid = (SELECT ctid FROM {} WHERE {} LIMIT 1)").format(self._table(t), cond)
        return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(_ident(c.name), sql.Placeholder()) for c in cols)

    @staticmethod
    def _full_identity(t: wire.Table) -> bool:
        return len(t.identity) == len(t.columns) and len(t.columns) > 0 and t.identity == tuple(range(len(t.columns)))

    def update(self, t: wire.Table) -> sql.Composed:
        key = ("U", t)
        q = self._cache.get(key)
        if q is None:
            cols = [c for c in t.columns if not c.generated]
            q = sql.SQL("UPDATE {} SET {} WHERE {}").format(
                self._table(t),
                sql.SQL(", ").join(sql.SQL("{} = {}").format(_ident(c.name), sql.Placeholder()) for c in cols),
                self._where(t),
            )
            self._cache[key] = q
        return q

    def delete(self, t: wire.Table) -> sql.Composed:
        key = ("D", t)
        q = self._cache.get(key)
        if q is None:
            q = sql.SQL("DELETE FROM {} WHERE {}").format(self._table(t), self._where(t))
            self._cache[key] = q
        return q

    def truncate(self, tables: Sequence[wire.Table]) -> sql.Composed:
        return sql.SQL("TRUNCATE ONLY {}").format(sql.SQL(", ").join(self._table(t) for t in tables))


def _resolve(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


def _new_values(t: wire.Table, row: wire.Row) -> list[Optional[str]]:
    return [v for c, v in zip(t.columns, row.new) if not c.generated]


_APPLY = b"chorus_apply"  # the prepared statements of the fast path: one writeset,
_APPLY_RUN = b"chorus_apply_run"  # and a run of consecutive ones
_U32 = struct.Struct(">I")


class ApplySession:
    """One PostgreSQL connection that applies writesets, one transaction each.

    The connection is in autocommit mode: the fast path is one statement,
    ``SELECT chorus.apply_writeset(gid, wait_for, writeset)``, committed as it ends (one round
    trip per writeset). It goes straight through libpq (psycopg's ``pgconn``), with the socket
    registered once with the event loop rather than for every wait; everything else (schema
    changes, the SQL method, checks) uses psycopg's API in explicit transactions.
    """

    def __init__(self, dsn: str, name: str, fast: bool = True) -> None:
        self.dsn = dsn
        self.name = name
        self.fast = fast  # apply rows with chorus.apply_writeset (C) rather than SQL statements
        self.conn: Optional[psycopg.AsyncConnection[Any]] = None
        self.pid = 0
        self.cache = StatementCache()
        self._reading = -1  # the socket registered with the loop for the fast path, or -1
        self._waiter: Optional[asyncio.Future[Optional[pq.abc.PGresult]]] = None
        self._result: Optional[pq.abc.PGresult] = None

    async def connect(self) -> None:
        self.conn = await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, prepare_threshold=0, application_name=f"chorus apply {self.name}")
        async with self.conn.cursor() as cur:
            await cur.execute("SET session_replication_role = replica")
            await cur.execute("SET chorus.capture = off")
            # An applied commit is not flushed before the next one (docs/RECOVERY.md): its origin
            # flushed it before its client heard of it, and after a crash this node re-applies
            # what it lost (commits are in GID order, so it lost a suffix of them).
            await cur.execute("SET synchronous_commit = off")
            await cur.execute("SELECT pg_backend_pid()")
            row = await cur.fetchone()
            self.pid = int(row[0]) if row else 0
        if self.fast:
            await self._prepare()

    async def _prepare(self) -> None:
        """The fast path's statement. psycopg deallocates every prepared statement of its
        connection after some commands (DROP, ALTER, ROLLBACK): then it is prepared again."""
        assert self.conn is not None
        self._stop_reading()
        await self.conn.execute(b"PREPARE " + _APPLY + b" (bigint, bigint, bytea, bigint) AS "
                                b"SELECT chorus.apply_writeset($1, $2, $3, $4)")
        await self.conn.execute(b"PREPARE " + _APPLY_RUN + b" (bigint, bigint, bytea, bigint) AS "
                                b"SELECT chorus.apply_run($1, $2, $3)")

    async def close(self) -> None:
        self._stop_reading()
        if self.conn is not None:
            try:
                await self.conn.close()
            finally:
                self.conn = None

    async def apply_run(self, gid: int, wait_for: int, writesets: Sequence[wire.Writeset],
                        ddl_ok: bool = True, prev: int = -1) -> bool:
        """Apply one certified writeset, or a run of consecutive ones (no other certified GID
        between them), the last one GID ``gid``, as one transaction committed as ``gid`` once
        ``wait_for`` is committed; raise TransientApplyError or ApplyError. A schema change runs
        once every earlier GID has committed here; one that failed on its origin (``ddl_ok``
        false) commits nothing but its GID, and is always alone. ``prev``: the GID certified
        before the run (-1: ``wait_for``; they differ with several commit lanes, where a run is
        one writeset). False if ``gid`` was committed here already."""
        try:
            await self._apply(gid, wait_for, writesets, ddl_ok, prev)
            return True
        except AlreadyCommitted:
            return False

    async def _apply(self, gid: int, wait_for: int, writesets: Sequence[wire.Writeset], ddl_ok: bool,
                     prev: int = -1) -> None:
        if self.conn is None or self.conn.closed:
            await self.connect()
        conn = self.conn
        assert conn is not None
        ddl = writesets[0].ddl
        if ddl is not None:
            if len(writesets) != 1:
                raise ApplyError(f"GID {gid}: a schema change is applied alone")
            return await self._apply_ddl(gid, wait_for, ddl, ddl_ok, wait_for if prev < 0 else prev)
        try:
            if self.fast:
                # One call: the extension parses the writesets and applies their rows with plans
                # it prepared once per table shape (chorus_apply.c), and the statement commits.
                if len(writesets) == 1:
                    name, data = _APPLY, writesets[0].raw or wire.encode(writesets[0])
                else:
                    name = _APPLY_RUN
                    data = b"".join(_U32.pack(len(raw)) + raw for raw in (ws.raw or wire.encode(ws)
                                                                         for ws in writesets))
                try:
                    await self._call(conn, name, gid, wait_for, data, prev)
                except psycopg.errors.InvalidSqlStatementName:  # deallocated: nothing ran
                    await self._prepare()
                    await self._call(conn, name, gid, wait_for, data, prev)
            else:
                self._stop_reading()
                async with conn.transaction():
                    await self._apply_pipelined(conn, gid, wait_for, wire.merge(list(writesets)), prev)
        except psycopg.Error as e:
            raise await self._failure(gid, e) from e
        except ApplyError:
            await self._rollback()
            raise

    async def _call(self, conn: psycopg.AsyncConnection[Any], statement: bytes, gid: int, wait_for: int,
                    data: bytes, prev: int) -> None:
        """Run prepared ``statement(gid, wait_for, data, prev)`` as one autocommitted statement."""
        pg = conn.pgconn
        pg.send_query_prepared(statement, [b"%d" % gid, b"%d" % wait_for, data, b"%d" % prev], [0, 0, 1, 0])
        loop = asyncio.get_running_loop()
        while pg.flush():  # a large writeset: wait until the socket takes the rest
            writable: asyncio.Future[None] = loop.create_future()
            loop.add_writer(pg.socket, _resolve, writable)
            try:
                await writable
            finally:
                loop.remove_writer(pg.socket)
        waiter: asyncio.Future[Optional[pq.abc.PGresult]] = loop.create_future()
        self._waiter, self._result = waiter, None
        if self._reading != pg.socket:
            self._stop_reading()
            loop.add_reader(pg.socket, self._readable)
            self._reading = pg.socket
        self._readable()  # libpq may hold the reply already
        res = await waiter
        if res is None or res.status != pq.ExecStatus.TUPLES_OK:
            if res is None:
                raise psycopg.OperationalError("the apply statement returned no result")
            raise psycopg.errors.error_from_result(res, encoding=conn.info.encoding)

    def _readable(self) -> None:
        """The socket of the fast path has data: collect the statement's result when whole."""
        conn, waiter = self.conn, self._waiter
        if conn is None:
            return
        pg = conn.pgconn
        try:
            pg.consume_input()
            while not pg.is_busy():
                res = pg.get_result()
                if res is None:  # the statement is done
                    self._waiter = None
                    if waiter is not None and not waiter.done():
                        waiter.set_result(self._result)
                    return
                if self._result is None or res.status == pq.ExecStatus.FATAL_ERROR:
                    self._result = res
        except psycopg.Error as e:
            self._stop_reading()
            self._waiter = None
            if waiter is not None and not waiter.done():
                waiter.set_exception(e)

    def _stop_reading(self) -> None:
        """Hand the socket back to psycopg (which registers it for each of its own waits)."""
        if self._reading >= 0:
            try:
                asyncio.get_running_loop().remove_reader(self._reading)
            except (RuntimeError, ValueError, OSError):
                pass
            self._reading = -1

    async def _apply_pipelined(self, conn: psycopg.AsyncConnection[Any], gid: int, wait_for: int,
                               ws: wire.Writeset, prev: int = -1) -> None:
        """The same in SQL from Python: statements in one pipeline (apply.method = "sql")."""
        # One pipeline: every statement goes out at once; results are checked at the sync,
        # before the commit (two round trips per writeset, whatever its size).
        checks: list[tuple[Any, wire.Table, wire.Row]] = []
        async with conn.pipeline() as pipe:
            await conn.execute("SELECT chorus.apply_begin(%s, %s, %s)", (gid, wait_for, prev))
            truncates: list[wire.Table] = []
            for row in ws.rows:
                t = ws.tables[row.table]
                if row.op == "T":
                    truncates.append(t)
                    continue
                if truncates:
                    await conn.execute(self.cache.truncate(truncates))
                    truncates = []
                if row.op == "I":
                    await conn.execute(self.cache.insert(t), _new_values(t, row))
                elif row.op == "U":
                    checks.append((await conn.execute(self.cache.update(t), _new_values(t, row) + list(row.old)),
                                   t, row))
                else:
                    checks.append((await conn.execute(self.cache.delete(t), list(row.old)), t, row))
                if len(checks) >= SYNC_EVERY:
                    await pipe.sync()
                    for cur, ct, crow in checks:
                        self._check(cur.rowcount, gid, ct, crow)
                    checks.clear()
            if truncates:
                await conn.execute(self.cache.truncate(truncates))
            await pipe.sync()
            for cur, t, row in checks:
                self._check(cur.rowcount, gid, t, row)

    async def _apply_ddl(self, gid: int, wait_for: int, ddl: wire.Ddl, ok: bool, prev: int) -> None:
        """Run a schema change once every GID before it has committed here (``prev``, the GID
        certified before it: with several commit lanes its lane's ``wait_for`` is not enough)."""
        conn = self.conn
        assert conn is not None
        self._stop_reading()
        try:
            async with conn.transaction(), conn.cursor() as cur:
                await cur.execute("SELECT chorus.apply_begin(%s, %s, %s)", (gid, wait_for, prev))
                await cur.execute("SELECT chorus.wait_turn(%s)", (prev,))
                if not ok:
                    await cur.execute("SELECT pg_current_xact_id()")  # a commit record for the GID
                else:
                    await cur.execute("SELECT set_config('search_path', %s, true)", (ddl.search_path,))
                    await cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ddl.role,))
                    if await cur.fetchone() is not None:
                        await cur.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(ddl.role)))
                    else:
                        log.warning("GID %d: role %s does not exist here; running the schema change "
                                    "as %s", gid, ddl.role, conn.info.user)
                    await cur.execute(ddl.statement.encode("utf-8"))
        except psycopg.Error as e:
            raise await self._failure(gid, e, "the schema change that succeeded on its origin failed here: ",
                                      f" (statement: {ddl.statement[:200]})") from e

    async def _failure(self, gid: int, e: psycopg.Error, what: str = "", tail: str = "") -> Exception:
        """Clean up the session after a failed apply and say what to raise: a lost connection or a
        transient SQLSTATE is retried (TransientApplyError), anything else stops the node."""
        self._stop_reading()
        if isinstance(e, psycopg.OperationalError):
            await self._reset()
            return ApplyConnectionLost(f"GID {gid}: connection problem: {e}")
        await self._rollback()
        state = e.sqlstate or ""
        if state == ALREADY_COMMITTED or await self._committed_here(gid):
            # e.g. a duplicate key because a local backend of the previous coordinator committed
            # the same writeset while this apply waited for its row locks
            return AlreadyCommitted(f"GID {gid}")
        if state in TRANSIENT_SQLSTATES:
            return TransientApplyError(f"GID {gid}: {state} {e}")
        return ApplyError(f"GID {gid}: {what}{state} {str(e).strip()}{tail}")

    async def _committed_here(self, gid: int) -> bool:
        try:
            assert self.conn is not None
            cur = await self.conn.execute("SELECT chorus.committed_gid() >= %s", (gid,))
            row = await cur.fetchone()
            return bool(row and row[0])
        except (psycopg.Error, AssertionError):
            return False

    @staticmethod
    def _check(rowcount: int, gid: int, t: wire.Table, row: wire.Row) -> None:
        if rowcount != 1:
            names = ", ".join(t.columns[i].name for i in t.identity)
            raise ApplyError(f"GID {gid}: {row.op} on {t.qualified} ({names})=({', '.join(map(str, row.old))}) "
                             f"matched {rowcount} rows: this node's data differs from the cluster's")

    async def _rollback(self) -> None:
        self._stop_reading()
        if self.conn is not None and not self.conn.closed:
            try:
                await self.conn.rollback()
            except psycopg.Error:
                await self._reset()

    async def _reset(self) -> None:
        try:
            await self.close()
        except psycopg.Error:
            self.conn = None
