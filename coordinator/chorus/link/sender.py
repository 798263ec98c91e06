"""A link's sender (docs/LINKS.md sections 2 and 4): serves this site's writeset log to the
peer site's receiver, from the receiver's resume position, in GID order, for as long as the
connection lasts.

:class:`Outbound` decides what goes out, without I/O: it takes the log's records in order and
returns frames (a transaction the link's rules carry, reshaped; the peer's clock passed through
where a record came from the peer; this site's clock after filtered records or when idle).
:class:`LinkServer` is the thin asyncio shell around it: TLS, the proof (link/proto.py), a log
reader that follows the log as it grows and never passes the committed GID.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import ssl
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from chorus import wire
from chorus.link import copy as lc
from chorus.link import proto, settle
from chorus.link.events import ClockEvent, SiteId
from chorus.link.proto import LinkBroken, LinkEnd, LinkError, LinkProtocolError, Position, Record
from chorus.link.rules import RuleError, RuleSet, SqlEvaluator, ddl_refusal, route, transform_table
from chorus.recovery import CHUNK_BYTES, split_address
from chorus.wslog import FLAG_DDL_SKIPPED, LogRangeUnavailable, LogRecord, WritesetLog

log = logging.getLogger("chorus.link.sender")

CLOCK_INTERVAL_S = 1.0  # link.clock_interval
MAX_RETAIN_BYTES = 16384 << 20  # link.max_retain_mb
POLL_S = 0.05  # how often a sender that is caught up looks at the log again
STOP_S = 1.0  # how long closing waits for the streams to end with an END frame

Outgoing = Union[Record, ClockEvent]


@dataclass(frozen=True)
class Provenance:
    """What the log does not say of a record by itself: its origin commit time (µs since the
    Unix epoch) and, for a record a link applied here, the site it came from and the clock event
    passed through with it (None where there was none, as with a coarse clock between ticks).
    How the apply path marks link-applied records is its own (a later step); the sender asks."""

    commit_time: int
    applied_from: Optional[SiteId] = None
    reflection: Optional[ClockEvent] = None
    # on the link's arbiter, for a record of the peer's whose conflicts it settled: the rows it
    # realigns (docs/LINKS.md section 7.1), sent after the reflection as this site's change
    realign: Optional[wire.Writeset] = None
    # for a record a link applied here: the site where its transaction was made, where the link's
    # peer had forwarded it from a third site (docs/LINKS.md section 10); None: the peer itself
    origin: Optional[SiteId] = None


def retained(after: int, base_gid: int) -> None:
    """Check that the log, which holds every GID after ``base_gid``, holds what a receiver that
    applied up to ``after`` needs; else the link is broken (never skipped)."""
    if after < base_gid:
        raise LinkBroken(after + 1, base_gid)


class Outbound:
    """What one link sends from a site's log, given where the receiver resumes.

    Records come in GID order (:meth:`take`); the site's own transactions go through the link's
    rules and are sent if anything is left of them; a record the link applied from the peer is
    not sent back, only the clock event passed through with it (the reflection that closes the
    peer's windows, [epoch]) and, on the link's arbiter, then the rows it realigns, as this
    site's change at that GID (``Provenance.realign``, docs/LINKS.md section 7.1); a record
    another link applied here (a third site's change) is sent on only with ``forward`` (a chain,
    docs/LINKS.md section 10), named with its origin site, and never to that origin. This
    site's clock goes out with every record sent (its GID), and in an explicit CLOCK frame
    ``(site, next GID)`` when records were filtered or the log is idle and ``clock_interval``
    seconds have passed since it last went out (the receiver's positions and lag advance, and it
    hears from a quiet sender). A clock value never goes below one the receiver saw: after a
    reconnect, the records filtered before that point are passed again. Times are the caller's
    (monotonic seconds).
    """

    def __init__(self, site: SiteId, peer: SiteId, resume: Position, rules: RuleSet, evaluator: SqlEvaluator,
                 provenance: Callable[[LogRecord], Provenance], clock_interval: float = CLOCK_INTERVAL_S,
                 forward: bool = False) -> None:
        self.site = site
        self.forward = forward
        self.peer = peer
        self.rules = rules
        self.evaluator = evaluator
        self.provenance = provenance
        self.clock_interval = clock_interval
        self.position = resume.applied_gid  # the last GID passed: sent, or filtered out
        self.clock = resume.peer_clock  # the highest value of this site's clock the receiver has
        self.sent = 0
        self.filtered = 0  # records the rules dropped, schema changes that failed, a third site's not forwarded
        self.returned = 0  # the peer's own changes, not sent back
        # schema changes not sent with ddl on (docs/LINKS.md 8.1), and the last one: (GID, why)
        self.ddl_skipped = 0
        self.ddl_skipped_last: Optional[tuple[int, str]] = None
        self._clock_at: Optional[float] = None  # when this site's clock last went out

    def take(self, record: LogRecord, now: float) -> list[Outgoing]:
        """The frames for the next record of the log."""
        if record.gid <= self.position:
            raise ValueError(f"GID {record.gid} after GID {self.position}: the log is read in GID order")
        self.position = record.gid
        out: list[Outgoing] = []
        if not record.flags & FLAG_DDL_SKIPPED:  # else a schema change that failed: nothing to carry
            facts = self.provenance(record)
            if facts.applied_from is None:
                raw = bytes(record.payload)
                ws = wire.decode(raw)
                if ws.has_schema and self.rules.ddl:
                    self._ddl_check(record.gid, ws)
                routed = route(self.rules, ws, self.evaluator)
                if routed is not None:
                    self.sent += 1
                    self.clock = max(self.clock, record.gid + 1)
                    self._clock_at = now
                    return [Record(record.gid, self.site, facts.commit_time,
                                         raw if routed == ws else wire.encode(routed))]
            elif facts.applied_from == self.peer:
                self.returned += 1
                if facts.reflection is not None:
                    out.append(facts.reflection)
                routed = None if facts.realign is None else route(self.rules, facts.realign, self.evaluator)
                if routed is not None:
                    # the arbiter's realignment: this site's change at this GID, after the reflection
                    # (the peer's window then holds everything of its own this site had applied)
                    self.sent += 1
                    self.clock = max(self.clock, record.gid + 1)
                    self._clock_at = now
                    return out + [Record(record.gid, self.site, facts.commit_time, wire.encode(settle.marked(routed)))]
                return out + self._tick(record.gid + 1, now)
            elif self.forward:
                # a third site's change another link applied here (a chain): sent on as it was
                # committed here, without this site's own tables of the link (position, stamps,
                # exceptions, the origin's mark: schema chorus is never carried), named with its
                # origin, never to that origin (a ring of one-way links stops there)
                origin = facts.origin or facts.applied_from
                routed = None if origin == self.peer else route(self.rules, wire.decode(bytes(record.payload)),
                                                               self.evaluator)
                if routed is not None and routed.rows:
                    self.sent += 1
                    self.clock = max(self.clock, record.gid + 1)
                    self._clock_at = now
                    return [Record(record.gid, origin, facts.commit_time, wire.encode(routed))]
        self.filtered += 1
        return out + self._tick(record.gid + 1, now)

    def _ddl_check(self, gid: int, ws: wire.Writeset) -> None:
        """Count and say a schema change the link's lists keep from being sent (RuleError: one it
        cannot carry, which stops the link here)."""
        why = ddl_refusal(self.rules, ws)
        if why is None:
            return
        self.ddl_skipped += 1
        self.ddl_skipped_last = (gid, why)
        log.warning("link %s -> %s: the schema change of GID %d is not sent: %s (its rows go by the lists)",
                    self.site, self.peer, gid, why)

    def idle(self, bound: int, now: float) -> list[Outgoing]:
        """The frames to send when the log holds nothing more up to ``bound`` (the committed GID
        the sender may not pass)."""
        return self._tick(max(bound, self.position) + 1, now)

    def _tick(self, value: int, now: float) -> list[Outgoing]:
        if self._clock_at is not None and now - self._clock_at < self.clock_interval:
            return []
        self._clock_at = now
        self.clock = max(self.clock, value)
        return [ClockEvent(self.site, self.clock)]


def pin_name(link: str) -> str:
    """The name of the log's pin a link's sender keeps (docs/WSLOG.md, Pins)."""
    return "link:" + link


class LinkServer:
    """Serves one link from this node's writeset log to authenticated receivers of the peer
    site. ``committed`` is the last GID this node committed: nothing past it is sent (schema
    change outcomes known, as recovery's safe stop)."""

    def __init__(self, wslog: WritesetLog, end: LinkEnd, committed: Callable[[], int], rules: RuleSet,
                 evaluator: SqlEvaluator, provenance: Callable[[LogRecord], Provenance],
                 clock_interval: float = CLOCK_INTERVAL_S, poll_s: float = POLL_S,
                 max_retain: int = MAX_RETAIN_BYTES, announce: Optional[Callable[[int], None]] = None,
                 copy_dsn: Optional[str] = None, receives: bool = False, forward: bool = False) -> None:
        self.log = wslog
        self.forward = forward  # a third site's changes applied here are sent on (docs/LINKS.md section 10)
        self.end = end
        self.committed = committed
        self.rules = rules
        self.evaluator = evaluator
        self.provenance = provenance
        self.clock_interval = clock_interval
        self.poll_s = poll_s
        self.server: Optional[asyncio.base_events.Server] = None
        self.streams: set[asyncio.Task[None]] = set()
        self._stopping = False
        # why the link stopped at a transaction it cannot send (its rules failed on it), until a
        # stream passes it: (GID, reason)
        self.error: Optional[tuple[int, str]] = None
        # for status (link/status.py): each open stream's receiver and Outbound, the counts of the
        # streams that ended, and why the last one ended broken (cleared by the next stream)
        self.outbound: dict[asyncio.Task[None], tuple[str, Outbound]] = {}
        self.ended = [0, 0, 0]  # sent, filtered, returned
        self.ddl_ended: tuple[int, Optional[tuple[int, str]]] = (0, None)  # schema changes not sent, the last
        self.broken: Optional[str] = None
        # the log's pin (docs/LINKS.md section 2): at the last GID the peer applied, as its receiver
        # said (HELLO, then APPLIED frames), the lowest of the open streams'
        self.max_retain = max_retain
        self.pin = pin_name(end.link)
        self.applied: dict[asyncio.Task[None], int] = {}
        # tells the site's other nodes where the pin moved (SiteLinks: a bus message, bp.LinkApplied)
        self.announce = announce
        self._announced: Optional[int] = None
        # re-instantiation (docs/LINKS.md section 10): this node's database, read for the copy, and
        # whether this site receives the link too
        self.copy_dsn = copy_dsn
        self.receives = receives

    async def start(self, listen: str) -> None:
        host, port = split_address(listen)
        self.server = await asyncio.start_server(self._serve, host, port, ssl=self.end.keys.context(True),
                                                 ssl_handshake_timeout=proto.HANDSHAKE_TIMEOUT_S)

    async def close(self) -> None:
        """Stop listening and end every stream: with an END frame saying where it got to (the
        receiver resumes elsewhere), or cut if it does not end within STOP_S."""
        self._stopping = True
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        if self.streams:
            await asyncio.wait(self.streams, timeout=STOP_S)
        for task in list(self.streams):
            task.cancel()
        await asyncio.gather(*self.streams, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.streams.add(task)
        peer = writer.get_extra_info("peername")
        try:
            resume, version, mode = await self._handshake(reader, writer)
            if mode == proto.COPY:
                await self._copy(writer)
                return
            log.info("link %s: streaming to %s after GID %d", self.end.link, peer, resume.applied_gid)
            await self._stream(reader, writer, resume, version)
        except LinkBroken as e:
            self.broken = str(e)
            log.error("link %s to %s: %s", self.end.link, peer, e)
            with contextlib.suppress(ConnectionError):
                writer.write(proto.write_error(proto.broken(e)))
                await writer.drain()
        except (LinkError, ConnectionError, asyncio.TimeoutError, ssl.SSLError) as e:
            log.warning("link %s: stream to %s ended: %s", self.end.link, peer, e)
        finally:
            self.streams.discard(task)
            ended = self.outbound.pop(task, None)
            if ended is not None:
                out = ended[1]
                self.ended = [self.ended[0] + out.sent, self.ended[1] + out.filtered, self.ended[2] + out.returned]
                self.ddl_ended = (self.ddl_ended[0] + out.ddl_skipped, out.ddl_skipped_last or self.ddl_ended[1])
            writer.close()

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> tuple[Position, int, int]:
        """The receiver's resume position and protocol version, once it proved it holds the link's keys."""
        end = self.end
        secret = end.keys.secret()
        try:
            hello = await asyncio.wait_for(proto.read_frame(reader), proto.HANDSHAKE_TIMEOUT_S)
        except LinkProtocolError as e:  # an unknown version among them: say why
            writer.write(proto.write_error(proto.Error(str(e))))
            raise
        if not isinstance(hello, proto.Hello):
            raise LinkProtocolError(f"expected HELLO, got {type(hello).__name__}")
        if (hello.link, hello.sender, hello.receiver) != (end.link, end.site, end.peer):
            writer.write(proto.write_error(proto.Error(f"this is link {end.link} from site {end.site} to site {end.peer}")))
            raise LinkError(f"a receiver asked for link {hello.link} from site {hello.sender} to site {hello.receiver}")
        nonce = secrets.token_bytes(proto.NONCE_BYTES)
        writer.write(proto.write_proof(proto.Proof(
            nonce, proto.proof(secret, b"sender", end.link, end.site, end.peer, hello.nonce, nonce))))
        answer = await asyncio.wait_for(proto.read_frame(reader), proto.HANDSHAKE_TIMEOUT_S)
        if not isinstance(answer, proto.Proof) or answer.nonce != hello.nonce or not hmac.compare_digest(
                answer.mac, proto.proof(secret, b"receiver", end.link, end.site, end.peer, nonce, hello.nonce)):
            raise LinkError("the receiver failed authentication")
        return hello.position, hello.version, hello.mode

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, resume: Position,
                      version: int = proto.PROTOCOL) -> None:
        """Follow the log from ``resume`` until the receiver goes away or the server closes (then
        END). Raises :class:`LinkBroken` when the log no longer holds what comes next."""
        if self.forward and version < proto.FORWARDED:
            text = (f"link {self.end.link} forwards other sites' changes, which needs link protocol version "
                    f"{proto.FORWARDED}; the receiver speaks {version}: upgrade site {self.end.peer}, or set "
                    f"forward = false on site {self.end.site}")
            writer.write(proto.write_error(proto.Error(text)))
            raise LinkError(text)
        out = Outbound(self.end.site, self.end.peer, resume, self.rules, self.evaluator, self.provenance,
                       self.clock_interval, forward=self.forward)
        self._check_pin()
        retained(resume.applied_gid, self.log.base_gid)
        task = asyncio.current_task()
        assert task is not None
        if version >= 2:  # (a receiver of version 1 says nothing of what it applied: no pin)
            self.applied[task] = resume.applied_gid
            self._move_pin()
        peer = writer.get_extra_info("peername")
        self.outbound[task] = (f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer), out)
        self.broken = None
        rd = self.log.reader(resume.applied_gid)
        # the receiver sends only APPLIED frames: this ends when it closes (or sends anything else)
        gone = asyncio.ensure_future(self._hear(reader, task, out))
        try:
            while not gone.done() and not self._stopping:
                self._check_pin()
                bound = min(self.committed(), self.log.end_gid)
                try:
                    records = rd.read(bound, CHUNK_BYTES)
                    if not records:
                        await self._send(writer, out.idle(bound, time.monotonic()))
                        await asyncio.sleep(self.poll_s)
                    for r in records:
                        if self.rules.needs_sql:  # the evaluator waits on PostgreSQL: not in the event loop
                            frames = await asyncio.to_thread(out.take, r, time.monotonic())
                        else:
                            frames = out.take(r, time.monotonic())
                        await self._send(writer, frames)
                        if self.error is not None and out.position >= self.error[0]:
                            log.info("link %s: GID %d is sent now", self.end.link, self.error[0])
                            self.error = None
                except LogRangeUnavailable:  # the ring reused a segment the link had not sent yet
                    raise LinkBroken(out.position + 1, max(self.log.base_gid, out.position + 1)) from None
                except (wire.WireError, RuleError) as e:  # the link stops at a record it cannot carry, visibly
                    text = f"GID {out.position} cannot be sent: {e}"
                    if self.error != (out.position, text):
                        log.error("link %s stops: %s (nothing past it is sent until it can be: a rule's fault is "
                                  "fixed in [[link]], then this coordinator restarted)", self.end.link, text)
                    self.error = (out.position, text)
                    writer.write(proto.write_error(proto.Error(text)))
                    raise LinkError(text) from e
            self._check_pin()
            if self._stopping:
                writer.write(proto.write_end(proto.End(out.position)))
                await writer.drain()
        finally:
            rd.close()
            gone.cancel()
            self.applied.pop(task, None)

    async def _hear(self, reader: asyncio.StreamReader, task: "asyncio.Task[None]", out: Outbound) -> None:
        """Read the receiver's APPLIED frames (the last GID its site applied, never past what was
        passed to it) and move the pin with them, until it closes or sends anything else."""
        with contextlib.suppress(LinkError, ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            while True:
                frame = await proto.read_frame(reader)
                if not isinstance(frame, proto.Applied) or frame.gid > out.position or task not in self.applied:
                    log.warning("link %s: the receiver sent %r (passed GID %d): ending the stream", self.end.link,
                                frame, out.position)
                    return
                if frame.gid > self.applied[task]:
                    self.applied[task] = frame.gid
                    self._move_pin()

    async def _copy(self, writer: asyncio.StreamWriter) -> None:
        """Serve a re-instantiation (docs/LINKS.md section 10): take a snapshot of this node's
        database at its GID G, pin the log at G (a broken pin is dropped: the peer starts again
        from G) and say so to the site, then send the rows the link carries as of G, through its
        rules, table by table in key order (link/copy.py), and COPIED."""
        if self.copy_dsn is None:
            raise LinkError("this node cannot serve a copy of the link's tables (no database)")
        import psycopg
        import psycopg.sql

        from chorus.nodedb import PIN_SEARCH_PATH

        try:
            conn = await psycopg.AsyncConnection.connect(self.copy_dsn, autocommit=True,
                                                         application_name=f"chorus link copy {self.end.link}")
        except psycopg.Error as e:
            writer.write(proto.write_error(proto.Error(f"the copy failed: this node's database: {e}")))
            raise LinkError(f"the copy failed: this node's database: {e}") from e
        try:
            # row_security off: a table whose policies would hide rows from its owner fails the copy
            # rather than send part of it (the receiving site would delete the rest)
            for setting in (PIN_SEARCH_PATH, "SET datestyle = 'ISO'", "SET intervalstyle = 'postgres'",
                            "SET timezone = 'UTC'", "SET extra_float_digits = 3", "SET bytea_output = 'hex'",
                            "SET row_security = off"):
                await conn.execute(setting)
            for attempt in range(100):
                await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                try:
                    cur = await conn.execute("SELECT chorus.snapshot_gid()")
                    row = await cur.fetchone()
                    break
                except psycopg.errors.SerializationFailure:  # a commit above the watermark is visible: a moment later
                    await conn.execute("ROLLBACK")
                    await asyncio.sleep(0.05)
            else:
                raise LinkError("no snapshot of this node's database at one GID could be taken")
            assert row is not None
            gid = int(row[0])
            applied = 0
            if self.receives:
                cur = await conn.execute("SELECT applied_gid FROM chorus.link_position "
                                         "WHERE link OPERATOR(pg_catalog.=) %s", (self.end.link,))
                found = await cur.fetchone()
                applied = int(found[0]) if found is not None else 0
            # the pin first: nothing after G can be lost from here on
            self.log.unpin(self.pin)
            self.log.pin(self.pin, gid, self.max_retain)
            self.broken = None
            if self.announce is not None:
                self._announced = gid
                self.announce(gid)
            log.info("link %s: re-instantiation: copying the link's tables as of GID %d (the log pinned there)",
                     self.end.link, gid)
            writer.write(proto.write_snapshot(proto.Snapshot(gid, self.receives, applied)))
            sent = 0
            cur = await conn.execute(lc.TABLES_SQL)
            for schema, name, _oid, columns, types, key, owner in await cur.fetchall():
                if not self.rules.carries(schema, name):
                    continue
                table = lc.table_of(schema, name, columns or [], types or [], key)
                if table is None:
                    log.warning("link %s: table %s has no primary key: the copy leaves it out", self.end.link,
                                f"{schema}.{name}")
                    continue
                # read as its owner (a cast to text may run code the owner chose), in the snapshot
                await conn.execute(psycopg.sql.SQL("SET LOCAL ROLE {}").format(psycopg.sql.Identifier(owner)))
                sent += await self._copy_table(conn, writer, table, gid)
            writer.write(proto.write_copied(proto.Copied(gid, sent)))
            await writer.drain()
            log.info("link %s: re-instantiation: %d row(s) sent as of GID %d", self.end.link, sent, gid)
        except (psycopg.Error, RuleError, wire.WireError, LogRangeUnavailable) as e:
            writer.write(proto.write_error(proto.Error(f"the copy failed: {e}")))
            await writer.drain()
            raise LinkError(f"the copy failed: {e}") from e
        finally:
            await conn.close()

    async def _copy_table(self, conn: Any, writer: asyncio.StreamWriter, table: wire.Table, gid: int) -> int:
        """Send one table's rows as of the snapshot, through the link's rules, in batches."""
        rule = self.rules.rule_for(table.nspname, table.relname)
        shaped = transform_table(table, rule.transformations if rule is not None else ())
        sent = 0
        async with conn.cursor(name="chorus_link_copy") as cur:
            await cur.execute(lc.snapshot_sql(table))
            while True:
                batch: list[wire.Item] = []
                size = 0
                async for r in cur:
                    values = tuple(None if v is None else str(v).encode("utf-8", "surrogateescape") for v in r)
                    batch.append(wire.Row(wire.OP_INSERT, 0, (), values))
                    size += sum(len(v) for v in values if v is not None)
                    if len(batch) >= lc.BATCH_ROWS or size >= lc.BATCH_BYTES:
                        break
                if not batch:
                    break
                ws = wire.Writeset(0, 0, 0, (table,), tuple(batch), ())
                routed = (await asyncio.to_thread(route, self.rules, ws, self.evaluator) if self.rules.needs_sql
                          else route(self.rules, ws, self.evaluator))
                if routed is not None and routed.rows:
                    sent += len(routed.rows)
                    for data in proto.write_record(Record(gid, self.end.site, 0, wire.encode(routed))):
                        writer.write(data)
                        await writer.drain()
        end = wire.Writeset(0, 0, 0, (shaped,), (), ())
        for data in proto.write_record(Record(gid, self.end.site, 0, wire.encode(end))):
            writer.write(data)
        await writer.drain()
        return sent

    def _move_pin(self) -> None:
        """Pin the log at the lowest GID the open streams' receivers applied (it stays where it
        was when none is open: the peer resumes from there)."""
        if self.applied:
            gid = min(self.applied.values())
            try:
                self.log.pin(self.pin, gid, self.max_retain)
            except LogRangeUnavailable:
                self._check_pin()
                raise
            if self.announce is not None and gid != self._announced:
                self._announced = gid
                self.announce(gid)

    def _check_pin(self) -> None:
        """A broken pin breaks the link: it resumes from no position until instantiated again."""
        lost = self.log.broken(self.pin)
        if lost is not None:
            raise LinkBroken(*lost)

    def sending(self) -> tuple[tuple[tuple[str, int], ...], Optional[str], int, int, int]:
        """For status: each open stream (the receiver's address, the GID passed), why the link is
        broken (a transaction its rules cannot route, until a stream passes it, or why the last
        stream ended broken), and the records sent, filtered and not sent back, streams that
        ended included."""
        outs = list(self.outbound.values())
        lost = self.log.broken(self.pin) if self.log.is_open else None
        broken = (f"GID {self.error[0]} cannot be sent: {self.error[1]}" if self.error is not None
                  else str(LinkBroken(*lost)) if lost is not None else self.broken)
        return (tuple((a, o.position) for a, o in outs), broken,
                self.ended[0] + sum(o.sent for _a, o in outs), self.ended[1] + sum(o.filtered for _a, o in outs),
                self.ended[2] + sum(o.returned for _a, o in outs))

    def ddl_skipped(self) -> tuple[int, Optional[str]]:
        """For status: the schema changes not sent (ddl on, docs/LINKS.md 8.1), streams that ended
        included, and the last one ("GID g: why")."""
        outs = [o for _a, o in self.outbound.values()]
        lasts = [o.ddl_skipped_last for o in outs if o.ddl_skipped_last is not None]
        last = max(lasts) if lasts else self.ddl_ended[1]
        return (self.ddl_ended[0] + sum(o.ddl_skipped for o in outs),
                None if last is None else f"GID {last[0]}: {last[1]}")

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, frames: list[Outgoing]) -> None:
        for f in frames:
            for data in (proto.write_record(f) if isinstance(f, Record) else [proto.write_clock(f)]):
                writer.write(data)
                await writer.drain()
