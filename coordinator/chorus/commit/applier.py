"""Apply sessions: hand certified writesets to the extension's apply function.

One call per writeset (or run of writesets): ``chorus.apply_writeset`` parses it in the server,
applies its rows and schema changes in order, and commits it as its GID in its turn
(docs/PROTOCOL.md section 4, ``extension/chorus_apply.c``). No SQL is built here. Sessions run
with ``session_replication_role = replica``: user triggers and foreign-key checks do not fire again
(their effects are in the writeset) and nothing is captured twice.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any, Awaitable, Callable, Optional, Sequence

import psycopg
from psycopg import pq

from chorus import wire
from chorus.concurrent import ConcurrentSchemaChanges
from chorus.link import position as link_position
from chorus.nodedb import PIN_SEARCH_PATH
from chorus.spool import SPOOL_AT, Spool

log = logging.getLogger("chorus.applier")

TRANSIENT_SQLSTATES = {
    "40001",  # serialization failure
    "40P01",  # deadlock detected
    "55P03",  # lock not available
    "57014",  # query canceled (by the watchdog or a statement timeout)
}


ALREADY_COMMITTED = "CH001"  # the extension: this GID is committed on this node already
PARTLY_COMMITTED = "CH002"  # the extension: the first GIDs of this run are committed here already


class ApplyError(Exception):
    """Applying a certified writeset failed in a way that retrying cannot fix: the node's data
    would diverge, so the node must stop taking part (or, for a schema change whose outcome the
    nodes' reports decide, the change is undone everywhere). ``sqlstate`` and ``message``: the
    server's error, where it gave one."""

    def __init__(self, text: str, sqlstate: str = "", message: str = "") -> None:
        super().__init__(text)
        self.sqlstate = sqlstate
        self.message = message or text


class TransientApplyError(Exception):
    """Retry the writeset (deadlock, lock timeout, lost connection)."""


class ApplyConnectionLost(TransientApplyError):
    """The apply session's connection ended: retry; PostgreSQL itself may have gone away."""


class PartlyCommitted(Exception):
    """The first GIDs of a run are committed here already, up to ``committed`` (local backends of
    the previous coordinator committed their certified GIDs while this one caught up): the rest
    of the run is to be applied."""

    def __init__(self, gid: int, committed: int) -> None:
        super().__init__(f"the run up to GID {gid} is committed here up to GID {committed}")
        self.committed = committed


class AlreadyCommitted(Exception):
    """The GID is committed here already (by a local backend of an earlier coordinator, or an
    earlier copy of the same writeset): nothing to do."""


def _resolve(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


_APPLY = b"chorus_apply"  # the prepared statements of the fast path: one writeset,
_APPLY_RUN = b"chorus_apply_run"  # and a run of consecutive ones
_APPLY_FILE = b"chorus_apply_file"  # a large writeset, from a spool file (spool.py)
_U32 = struct.Struct(">I")

# what the decision of a link writeset reads in its apply transaction: (sql, parameters) -> rows
LinkQuery = Callable[[str, Sequence[Any]], Awaitable[list[tuple[Any, ...]]]]
# what it applies in that transaction, in parts or whole: a writeset
LinkApply = Callable[[bytes], Awaitable[None]]


class ApplySession:
    """One PostgreSQL connection that applies writesets, one transaction each.

    The connection is in autocommit mode: an apply is one statement,
    ``SELECT chorus.apply_writeset(gid, wait_for, writeset)``, committed as it ends (one round
    trip per writeset). It goes straight through libpq (psycopg's ``pgconn``), with the socket
    registered once with the event loop rather than for every wait; everything else (checks)
    uses psycopg's API.
    """

    def __init__(self, dsn: str, name: str, concurrent: Optional[ConcurrentSchemaChanges] = None,
                 spool: Optional[Spool] = None, stamps: bool = False) -> None:
        self.dsn = dsn
        self.name = name
        self.spool = spool  # where a writeset larger than SPOOL_AT goes for the server to read (None: sent whole)
        # runs CREATE/DROP INDEX CONCURRENTLY once its GID has committed here (None: such a
        # writeset only commits its GID, as on its origin, where the origin's backend runs it)
        self.concurrent = concurrent
        self.conn: Optional[psycopg.AsyncConnection[Any]] = None
        self.pid = 0
        self._reading = -1  # the socket registered with the loop for the fast path, or -1
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._waiter: Optional[asyncio.Future[Optional[pq.abc.PGresult]]] = None
        self._result: Optional[pq.abc.PGresult] = None
        # this node stamps the rows it applies (a site that receives a link: coordinator.py): each
        # apply sets the origin commit time the stamps record (chorus.commit_time); elsewhere the
        # statement is the plain call, which costs the server less (docs/NATIVE.md, Step 5)
        self.stamps = stamps
        # the apply statement sets chorus.commit_time: the node stamps rows and its extension
        # takes the time (False with an extension of a release before)
        self.timed = False

    async def connect(self) -> None:
        self.conn = await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, prepare_threshold=0, application_name=f"chorus apply {self.name}")
        async with self.conn.cursor() as cur:
            await cur.execute(PIN_SEARCH_PATH)
            await cur.execute("SET session_replication_role = replica")
            await cur.execute("SET chorus.capture = off")
            # An applied commit is not flushed before the next one (docs/RECOVERY.md): its origin
            # flushed it before its client heard of it, and after a crash this node re-applies
            # what it lost (commits are in GID order, so it lost a suffix of them).
            await cur.execute("SET synchronous_commit = off")
            # the settings text values are read under (the apply function sets them too, where a
            # session has them otherwise: chorus_values.c)
            for setting in ("datestyle = 'ISO'", "intervalstyle = 'postgres'", "timezone = 'UTC'",
                            "extra_float_digits = 3", "bytea_output = 'hex'"):
                await cur.execute("SET " + setting)
            await cur.execute("SELECT pg_backend_pid(), "
                              "pg_catalog.current_setting('chorus.commit_time', true) IS NOT NULL")
            row = await cur.fetchone()
            self.pid = int(row[0]) if row else 0
            self.timed = self.stamps and bool(row[1]) if row else False
        await self._prepare()

    async def _prepare(self) -> None:
        """The fast path's statement. psycopg deallocates every prepared statement of its
        connection after some commands (DROP, ALTER, ROLLBACK): then it is prepared again."""
        assert self.conn is not None
        self._stop_reading()
        # with the commit time: set for the transaction before the apply runs (the subquery, kept
        # apart by OFFSET 0, gives the row the call is evaluated on)
        set_time = b" FROM (SELECT pg_catalog.set_config('chorus.commit_time', $%d, true) OFFSET 0) AS t"
        await self.conn.execute(b"PREPARE " + _APPLY + b" (bigint, bigint, bytea, bigint"
                                + (b", text" if self.timed else b"") + b") AS SELECT chorus.apply_writeset($1, $2, $3, $4)"
                                + (set_time % 5 if self.timed else b""))
        await self.conn.execute(b"PREPARE " + _APPLY_RUN + b" (bigint, bigint, bytea, bigint) AS "
                                b"SELECT chorus.apply_run($1, $2, $3)")
        await self.conn.execute(b"PREPARE " + _APPLY_FILE + b" (bigint, bigint, text, bigint, bigint, bigint"
                                + (b", text" if self.timed else b"")
                                + b") AS SELECT chorus.apply_writeset_file($1, $2, $3, $4, $5, $6)"
                                + (set_time % 7 if self.timed else b""))

    async def close(self) -> None:
        self._stop_reading()
        if self.conn is not None:
            try:
                await self.conn.close()
            finally:
                self.conn = None

    async def apply_run(self, gid: int, wait_for: int, writesets: Sequence[wire.Writeset],
                        ddl_ok: bool = True, prev: int = -1, commit_time: int = 0) -> bool:
        """Apply one certified writeset, or a run of consecutive ones (no other certified GID
        between them), the last one GID ``gid``, as one transaction committed as ``gid`` once
        ``wait_for`` is committed; raise TransientApplyError or ApplyError. A writeset with schema
        changes runs once every earlier GID has committed here (the extension waits for
        ``prev``) and is always alone; one that failed on its origin (``ddl_ok`` false) commits
        nothing but its GID. ``prev``: the GID certified before the run (-1: ``wait_for``; they
        differ with several commit lanes, where a run is one writeset). ``commit_time``: the origin
        commit time of a single writeset, which the row stamps record. False if ``gid`` was
        committed here already."""
        try:
            await self._apply(gid, wait_for, writesets, ddl_ok, prev, commit_time=commit_time)
            return True
        except AlreadyCommitted:
            return False

    async def apply_link(self, gid: int, wait_for: int, prev: int, link: str,
                         final: Callable[[Optional[tuple[object, ...]], LinkQuery, LinkApply], Awaitable[bytes]],
                         skip: bool = False) -> bool:
        """Apply link writeset ``gid`` of link ``link`` (docs/LINKS.md section 3) in one
        transaction: read the link's row of ``chorus.link_position``, have ``final`` decide and
        apply what to commit given that row (link/position.py: the peer's rows settled against
        the stamps and rows it reads with the query it is given, link/settle.py, and the row
        moved; or nothing; a batch's transactions one after another, each decided after those
        before it were applied), through the apply it is given (``chorus.apply_writeset``, in
        this transaction), and commit as ``gid`` in its turn. What it reads
        is what every node reads at this GID: the link's writesets are applied one after another
        (the pipeline orders them by the row's key), and the rows they touch were committed
        before (certification: a local transaction certified after it that overlaps it fails).
        ``skip``: voting decided it commits empty. Raises as :meth:`apply_run`; False if ``gid``
        was committed here already."""
        try:
            if self.conn is None or self.conn.closed:
                await self.connect()
        except psycopg.Error as e:
            await self._reset()
            raise ApplyConnectionLost(f"GID {gid}: connecting the apply session: {e}") from e
        conn = self.conn
        assert conn is not None
        self._stop_reading()
        try:
            await conn.execute(b"BEGIN")

            async def apply(data: bytes) -> None:
                await conn.execute("SELECT chorus.apply_writeset(%s, %s, %s, %s)", (gid, wait_for, data, prev))
            if skip:
                await apply(wire.empty())
            else:
                cur = await conn.execute(link_position.READ_SQL, (link,))

                async def query(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                    c = await conn.execute(sql, params)
                    return await c.fetchall()
                row = await cur.fetchone()
                try:
                    await final(row, query, apply)
                except psycopg.Error:
                    raise
                except Exception as e:  # what cannot be decided here (settings, a key type): said, not retried
                    await self._rollback()
                    raise ApplyError(f"GID {gid}: link {link}: {e}") from e
            await conn.execute(b"COMMIT")
            return True
        except psycopg.Error as e:
            failure = await self._failure(gid, e, f"link {link}: ")
            if isinstance(failure, AlreadyCommitted):
                return False
            raise failure from e

    async def apply_held(self, gid: int, wait_for: int, writeset: wire.Writeset, prev: int = -1) -> bool:
        """Apply schema change ``gid`` in a transaction left open: it commits (:meth:`finish_held`)
        once every node has reported applying it. Raises as :meth:`apply_run`; False if ``gid``
        is committed here already (nothing is left open)."""
        try:
            await self._apply(gid, wait_for, [writeset], True, prev, hold=True)
            return True
        except AlreadyCommitted:
            return False

    async def finish_held(self, commit: bool) -> None:
        """Commit (or roll back) the transaction :meth:`apply_held` left open."""
        self._stop_reading()
        conn = self.conn
        if conn is None or conn.closed:
            raise ApplyConnectionLost("the apply session holding a schema change lost its connection")
        try:
            await conn.execute(b"COMMIT" if commit else b"ROLLBACK")
        except psycopg.Error as e:
            raise await self._failure(0, e, "committing a schema change every node applied: ") from e

    async def _apply(self, gid: int, wait_for: int, writesets: Sequence[wire.Writeset], ddl_ok: bool,
                     prev: int = -1, hold: bool = False, commit_time: int = 0) -> None:
        try:
            if self.conn is None or self.conn.closed:
                await self.connect()
        except psycopg.Error as e:  # the session was ended while it was being set up: retried
            await self._reset()
            raise ApplyConnectionLost(f"GID {gid}: connecting the apply session: {e}") from e
        conn = self.conn
        assert conn is not None
        if any(ws.has_schema for ws in writesets) and len(writesets) != 1:
            raise ApplyError(f"GID {gid}: a schema change is applied alone")
        first = writesets[0]
        if first.has_schema and ddl_ok and not first.concurrent and self.concurrent is not None:
            # after the index builds running here on the tables it names, as on its origin
            await self.concurrent.wait_clear({(k.parts[0], k.parts[1]) for k in first.keys if len(k.parts) == 2})
        if not ddl_ok:
            name, data = _APPLY, wire.empty(first.encoding)  # the GID commits, nothing changes
        elif first.toi:
            raise ApplyError(f"GID {gid}: the content of the schema change is missing")
        elif first.concurrent:
            name, data = _APPLY, wire.empty(first.encoding)  # its GID commits; then it runs beside
        elif len(writesets) == 1:
            name, data = _APPLY, first.raw or wire.encode(first)
        else:
            name = _APPLY_RUN
            data = b"".join(_U32.pack(len(raw)) + raw for raw in (ws.raw or wire.encode(ws) for ws in writesets))
        spooled = ""  # a spool file written for this apply, removed after it
        where = (0, -1)  # the writeset's bytes in a spool file
        try:
            if name == _APPLY and first.spool is not None:
                # spooled when it came from the bus or the backend: the server maps it there
                name, data, where = _APPLY_FILE, first.spool.path.encode(), (first.spool.offset, first.spool.length)
            elif name == _APPLY and self.spool is not None and len(data) > SPOOL_AT:
                # the server reads it from a file: its backend holds none of it (spool.py)
                spooled = await self.spool.write_async(data)
                name, data = _APPLY_FILE, spooled.encode()
            # One call: the extension parses the writesets and applies their rows (with plans it
            # prepared once per table shape) and schema changes (chorus_apply.c); the statement
            # commits, unless it runs in a transaction held open (hold).
            if hold:
                self._stop_reading()
                await conn.execute(b"BEGIN")
            try:
                await self._call(conn, name, gid, wait_for, data, prev, where, commit_time)
            except psycopg.errors.InvalidSqlStatementName:  # deallocated: nothing ran
                if hold:  # (and the transaction it failed in is over)
                    await self._rollback()
                await self._prepare()
                if hold:
                    await conn.execute(b"BEGIN")
                await self._call(conn, name, gid, wait_for, data, prev, where, commit_time)
            except psycopg.errors.InsufficientPrivilege:
                if name != _APPLY_FILE:
                    raise
                # the server may not read the coordinator's files (it runs as another user): the
                # writeset goes as a parameter, as a small one does (nothing ran: the check is first)
                log.warning("GID %d: PostgreSQL cannot read the spool file %s (run the coordinator as "
                            "the server's user); sending the writeset in the statement", gid, data.decode())
                await self._call(conn, _APPLY, gid, wait_for, bytes(first.raw or wire.encode(first)), prev,
                                 commit_time=commit_time)
        except psycopg.Error as e:
            what, tail = "", ""
            if first.has_schema and ddl_ok:
                what = "a writeset with schema changes that succeeded on its origin failed here: "
                stmts = first.statements
                if stmts:
                    tail = f" (statement: {stmts[0].statement[:200].decode('utf-8', 'replace')})"
            raise await self._failure(gid, e, what, tail) from e
        except ApplyError:
            await self._rollback()
            raise
        finally:
            if spooled:
                Spool.remove(spooled)
        if first.concurrent and ddl_ok and self.concurrent is not None:
            await self.concurrent.start(gid, first.statements[0])

    async def _call(self, conn: psycopg.AsyncConnection[Any], statement: bytes, gid: int, wait_for: int,
                    data: bytes, prev: int, where: tuple[int, int] = (0, -1), commit_time: int = 0) -> None:
        """Run prepared ``statement(gid, wait_for, data, prev)`` as one autocommitted statement
        (for a spool file, ``data`` is its path and ``where`` the writeset's offset and length;
        with an extension that takes it, the origin ``commit_time`` last)."""
        pg = conn.pgconn
        timed = [b"%d" % commit_time] if self.timed and statement != _APPLY_RUN else []
        if statement == _APPLY_FILE:
            pg.send_query_prepared(statement, [b"%d" % gid, b"%d" % wait_for, data, b"%d" % prev,
                                               b"%d" % where[0], b"%d" % where[1], *timed], [0] * (6 + len(timed)))
        else:
            pg.send_query_prepared(statement, [b"%d" % gid, b"%d" % wait_for, data, b"%d" % prev, *timed],
                                   [0, 0, 1, 0] + [0] * len(timed))
        loop = self._loop
        if loop is None:  # kept: looking it up costs a system call (getpid) per apply in Python 3.11
            loop = self._loop = asyncio.get_running_loop()
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

    async def _failure(self, gid: int, e: psycopg.Error, what: str = "", tail: str = "") -> Exception:
        """Clean up the session after a failed apply and say what to raise: a lost connection or a
        transient SQLSTATE is retried (TransientApplyError), anything else stops the node."""
        self._stop_reading()
        conn = self.conn
        state = e.sqlstate or ""
        if (conn is None or conn.broken or conn.closed or conn.pgconn.status != pq.ConnStatus.OK or not state
                or state.startswith(("08", "57P"))):
            # the connection is gone (psycopg's OperationalError also covers SQLSTATEs such as
            # 55000 "not populated": those are the statement's, and answered below)
            await self._reset()
            return ApplyConnectionLost(f"GID {gid}: connection problem: {e}")
        await self._rollback()
        if state == PARTLY_COMMITTED:
            detail = e.diag.message_detail or ""
            if detail.startswith("committed up to GID "):
                return PartlyCommitted(gid, int(detail.rsplit(" ", 1)[1]))
        if state == ALREADY_COMMITTED or await self._committed_here(gid):
            # e.g. a duplicate key because a local backend of the previous coordinator committed
            # the same writeset while this apply waited for its row locks
            return AlreadyCommitted(f"GID {gid}")
        if state in TRANSIENT_SQLSTATES:
            return TransientApplyError(f"GID {gid}: {state} {e}")
        return ApplyError(f"GID {gid}: {what}{state} {str(e).strip()}{tail}", state,
                          e.diag.message_primary or str(e).strip())

    async def _committed_here(self, gid: int) -> bool:
        try:
            assert self.conn is not None
            cur = await self.conn.execute("SELECT chorus.committed_gid() >= %s", (gid,))
            row = await cur.fetchone()
            return bool(row and row[0])
        except (psycopg.Error, AssertionError):
            return False

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
