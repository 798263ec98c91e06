"""The coordinator daemon: one beside each postmaster (``chorus run --config FILE``).

Thin I/O around the pure parts: it feeds bus events to the :class:`~chorus.replicator.Replicator`,
answers backends on the local socket, runs apply sessions through the
:class:`~chorus.scheduler.Scheduler`, and serves the admin socket. Database errors and bus errors
are handled in separate places; :class:`FatalError` stops the daemon, anything else is logged and
survived.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine, Optional

import psycopg

from chorus import admin
from chorus import backendproto as bpf
from chorus import busproto as bp
from chorus import recovery as rc
from chorus import wire
from chorus.applier import ApplyConnectionLost, ApplyError, ApplySession, TransientApplyError
from chorus.blockers import Blocking, BlockerWatch
from chorus.bus import Bus, BusError, View
from chorus.commitbook import CommitBook
from chorus.concurrent import ConcurrentSchemaChanges
from chorus.config import NodeConfig
from chorus.replicator import (Apply, CatchUp, DdlOutcome, Joined, LocalVerdict, LogOffered, LogQueried, Phase,
                               PhaseChange, Replicator, Send, SyncReached, VoteDecided, VoteOpened)
from chorus.scheduler import Scheduler
from chorus.state import NodeState, load_state, save_state
from chorus.wslog import FLAG_DDL_SKIPPED, LogError, LogFeeder, LogRecord, WritesetLog

log = logging.getLogger("chorus.coordinator")

TICK_S = 0.2
PROGRESS_EVERY_S = 1.0
BATCH_BYTES = 256 * 1024
MAX_IN_FLIGHT = 1  # own writeset messages sent and not yet delivered
BLOCKER_CHECK_S = 0.005  # how often (and after how long) applies have their lock blockers checked
DB_RETRY_S = 0.5
LOG_QUERY_WAIT_S = 1.0  # how long a recovering node collects answers to its LogQuery
CATCHUP_WINDOW = 256  # catch-up transactions queued for apply at most
CATCHUP_BATCH_BYTES = 8 << 20  # a run of catch-up writesets applied as one transaction: at most this much
RUN_BYTES = 4 << 20  # a run of live remote writesets applied as one transaction: at most this much


class FatalError(Exception):
    """Stops the daemon."""


@dataclass
class _Backend:
    transport: asyncio.WriteTransport
    pid: int = 0
    ticket: int = 0  # outstanding writeset ticket, 0 if none
    certified: set[int] = field(default_factory=set)  # certified GIDs not yet reported committed
    closed: bool = False

    def send(self, frame: bytes) -> None:
        if not self.closed:
            self.transport.write(frame)


class _BackendConnection(asyncio.Protocol):
    """One backend's socket. Frames are handled as they arrive, in the callback that reads
    them: the commit path costs no task switch per frame."""

    def __init__(self, coordinator: "Coordinator") -> None:
        self.coordinator = coordinator
        self.parser = bpf.FrameParser()
        self.backend: Optional[_Backend] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.backend = _Backend(transport)

    def data_received(self, data: bytes) -> None:
        b = self.backend
        assert b is not None
        try:
            for frame in self.parser.feed(data):
                self.coordinator._backend_frame(b, frame)
        except (bpf.FrameError, wire.WireError) as e:
            self.coordinator.counters.malformed_frames += 1
            log.warning("closing backend connection (pid %d): malformed frame: %s", b.pid, e)
            b.transport.close()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.backend is not None:
            self.coordinator._backend_closed(self.backend)


# The status of a 32-bit xid of this epoch's recent past (pg_xact_status wants the full xid8).
_XACT_STATUS = ("SELECT pg_xact_status((CASE WHEN f > c THEN f - 4294967296 ELSE f END)::text::xid8)"
                " FROM (SELECT c, (c >> 32 << 32) + %s AS f"
                " FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS c) s) t")


@dataclass
class _Waiter:
    """A session committing a certified writeset, watched for local lock blockers."""
    pid: Callable[[], int]  # 0 while unknown (connecting) or gone
    since: float


@dataclass
class _Pending:
    gid: int
    prev: int  # the GID certified before it
    origin: str
    writeset: wire.Writeset
    backend: Optional[_Backend] = None
    # schema changes: the outcome on the origin (None until the cluster knows it)
    ddl_ok: Optional[bool] = None
    ddl_known: Optional[asyncio.Event] = None
    ddl_failure_sent: bool = False
    # inconsistency voting decided that the majority failed to apply it: it commits empty here
    skip: bool = False
    delivered_at: float = field(default_factory=time.monotonic)
    # what its commit waits for: prev with one commit lane, the previous certified GID of its
    # lane with several (docs/APPLY.md; set by CommitBook.assign_lane); the extension's names are the same
    wait_for: int = -1

    def __post_init__(self) -> None:
        if self.wait_for < 0:
            self.wait_for = self.prev
        if self.writeset.toi:  # a schema change's place: its outcome and content come later
            self.ddl_known = asyncio.Event()


@dataclass
class Counters:
    local_commits: int = 0
    applied: int = 0
    replayed: int = 0
    apply_retries: int = 0
    malformed_frames: int = 0
    refused: int = 0
    local_aborts: int = 0
    bus_batches: int = 0  # bus messages carrying local writesets
    bus_writesets: int = 0  # local writesets sent
    max_workers_busy: int = 0  # the most apply sessions ever busy at once
    overlapped_applies: int = 0  # applies dispatched while another was still running
    already_committed: int = 0  # applies found their GID committed here already (nothing done)
    apply_transactions: int = 0  # transactions that applied remote writesets (a run is one)


class Coordinator:
    def __init__(self, cfg: NodeConfig, bus_factory: Callable[[], Bus]) -> None:
        self.cfg = cfg
        self.bus_factory = bus_factory
        self.bus: Optional[Bus] = None
        self.state: NodeState = load_state(cfg.state_file, cfg.name)
        self.replicator: Optional[Replicator] = None
        self.scheduler = Scheduler()
        # pending certified writesets, the watermark, commit lanes, unflushed commits (commitbook.py):
        # applied commits are not flushed one by one (applier.py), and a local one may be counted
        # before its backend flushed it; they are re-applied if PostgreSQL crashes before
        # chorus.durable_gid() passes them
        self.book: CommitBook[_Pending] = CommitBook()
        self.tickets: dict[int, _Backend] = {}
        self.next_ticket = 1
        self.counters = Counters()
        self._max_committed = 0  # the highest GID the database had committed at start
        self.compat = ""  # the database's encoding and PostgreSQL major version
        self.db: Optional[psycopg.AsyncConnection[Any]] = None
        self.catchup_batch = cfg.catchup_batch
        self.concurrent = ConcurrentSchemaChanges(cfg.dsn, cfg.name)
        self.workers = [ApplySession(cfg.dsn, f"{cfg.name}-{i}", self.concurrent)
                        for i in range(max(1, cfg.apply_workers))]
        self.replay_session = ApplySession(cfg.dsn, f"{cfg.name}-replay", self.concurrent)
        self.idle = list(self.workers)
        self.replay_busy = False
        self.db_ok = asyncio.Event()
        self.stopping = asyncio.Event()
        self.fatal: Optional[str] = None
        self.phase_reason = "starting"
        self.started = time.time()
        self.last_apply_ms = 0.0
        self._tasks: list[asyncio.Task[Any]] = []
        self._outbox: list[tuple[int, bytes]] = []  # local writesets waiting for the bus
        self._pump_scheduled = False
        self._dispatch_scheduled = False
        self._in_flight = 0
        self._sends_waiting = 0  # messages handed to a task because the bus could not take them at once
        self._sync_waiting: list[_Backend] = []  # causal readers waiting for the next marker
        self._sync_on_bus: dict[int, list[_Backend]] = {}  # marker token -> its readers
        self._sync_token = 0
        self._waiters: dict[int, _Waiter] = {}  # GID -> the session committing it
        # inconsistency voting (docs/MEMBERSHIP.md)
        self._apply_failures: dict[int, str] = {}  # GIDs this node failed to apply -> why
        self._vote_waits: dict[int, asyncio.Future[bool]] = {}  # ... waiting for the decision
        self._vote_due: set[int] = set()  # votes open on GIDs not committed here yet
        self._flow_requested = False
        self._flow_paused = False  # what the extension was last told
        self._servers: list[asyncio.base_events.Server] = []
        self._background: set[asyncio.Task[Any]] = set()  # the loop keeps only weak references
        self.wslog = WritesetLog(cfg.wslog_dir, cfg.log_segment_mb << 20, cfg.log_total_mb << 20)
        self.max_writeset = self.wslog.max_payload(cfg.name)  # one log record: larger local writesets are refused
        self.feeder = LogFeeder(self.wslog)
        self.keys = (rc.ClusterKeys(cfg.tls_cert, cfg.tls_key, cfg.secret_file)
                     if cfg.tls_cert and cfg.tls_key and cfg.secret_file else None)
        self.recovery_server: Optional[rc.RecoveryServer] = None
        self.catchup: Optional[rc.Progress] = None  # the current or last partial recovery
        self._held_live: Optional[list[Any]] = None  # live actions held while catching up
        self._log_offers: dict[str, list[bp.LogInfo]] = {}

    # ---- start and stop -----------------------------------------------------------------

    @property
    def pending(self) -> dict[int, _Pending]:
        """Certified writesets not committed here yet, by GID."""
        return self.book.pending

    @property
    def watermark(self) -> int:
        """Every GID up to it is committed here."""
        return self.book.watermark

    @property
    def lanes(self) -> int:
        return self.book.lanes

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        if self.state.left_by_vote:
            raise FatalError(f"this node left its cluster by an inconsistency vote ({self.state.left_by_vote}); "
                             "it starts again only once total recovery has rebuilt it")
        await self._connect_db()
        durable = await self._init_node()
        self.book.advance(durable)
        if self.state.cluster_uuid and durable != self.state.last_gid:
            log.info("database is at GID %d (state file said %d)", durable, self.state.last_gid)
        self._open_log(durable)
        self.replicator = Replicator(
            node=self.cfg.name,
            cluster_uuid=self.state.cluster_uuid,
            last_gid=durable,
            max_committed=self._max_committed,
            bootstrap=self.state.bootstrap,  # only when told (`chorus bootstrap`; seed 8.2)
            compat=self.compat,
            member_votes=self.cfg.bus_members,
        )
        self._servers.append(await _unix_server(
            self.cfg.socket_path, lambda p: loop.create_unix_server(lambda: _BackendConnection(self), path=p)))
        self._servers.append(await _unix_server(
            self.cfg.admin_socket, lambda p: asyncio.start_unix_server(self._serve_admin, path=p)))
        if self.cfg.recovery_listen and self.keys is not None:
            self.recovery_server = rc.RecoveryServer(self.wslog, self.keys, lambda: self.replicator.cluster_uuid
                                                     if self.replicator else "", lambda: self.watermark)
            await self.recovery_server.start(self.cfg.recovery_listen)
            log.info("recovery server listening on %s", self.cfg.recovery_listen)
        self.bus = self.bus_factory()
        await self.bus.join()
        log.info("node %s joined bus group as %s", self.cfg.name, self.bus.local_id)
        self._tasks = [
            asyncio.create_task(self._bus_loop(), name="bus"),
            asyncio.create_task(self._tick_loop(), name="tick"),
            asyncio.create_task(self._blocker_loop(), name="blockers"),
        ]
        stop = asyncio.create_task(self.stopping.wait())
        done, _ = await asyncio.wait([stop, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not stop and t.exception() is not None:
                self.fatal = self.fatal or f"{t.get_name()} task failed: {t.exception()!r}"
                log.error("%s", self.fatal)
        await self._shutdown()
        if self.fatal:
            raise FatalError(self.fatal)

    async def _shutdown(self) -> None:
        log.info("shutting down")
        await self._set_online(False, "Its coordinator is shutting down")
        for s in self._servers:
            s.close()
        deadline = time.monotonic() + 10
        while (self.scheduler.queued or len(self.idle) < len(self.workers)) and time.monotonic() < deadline \
                and self.db_ok.is_set() and not self.fatal:
            await asyncio.sleep(0.05)
        r = self.replicator
        last = self.watermark
        try:
            last = await self._committed_gid()
            if self.lanes > 1 and not self.pending and self.db_ok.is_set() \
                    and not await self._q("SELECT chorus.settle_lanes()"):
                log.warning("the commit lanes are not settled (commits above the watermark): a change of "
                            "apply.commit_lanes waits for a clean shutdown")
        except psycopg.Error:
            pass
        if r is not None:
            alone = r.phase == Phase.ONLINE and set(r.online) <= {self.cfg.name}
            self.state = self.state.with_(last_gid=last, safe_to_bootstrap=alone and not self.fatal,
                                          cluster_uuid=r.cluster_uuid or self.state.cluster_uuid)
            save_state(self.cfg.state_file, self.state)
        for t in self._tasks:
            t.cancel()
        if self.recovery_server is not None:
            await self.recovery_server.close()
        try:
            self.feeder.flush()
            self.wslog.sync()
            self.wslog.close()
        except (LogError, OSError) as e:
            log.warning("closing the writeset log: %s", e)
        if self.bus is not None:
            try:
                await self.bus.leave()
            except BusError as e:
                log.warning("leaving the bus: %s", e)
        for w in [*self.workers, self.replay_session]:
            await w.close()
        if self.db is not None:
            await self.db.close()
        for path in (self.cfg.socket_path, self.cfg.admin_socket):
            try:
                os.unlink(path)
            except OSError:
                pass

    # ---- the database -------------------------------------------------------------------

    async def _connect_db(self) -> None:
        delay = DB_RETRY_S
        while True:
            try:
                self.db = await psycopg.AsyncConnection.connect(
                    self.cfg.dsn, autocommit=True, application_name=f"chorus coordinator {self.cfg.name}")
                return
            except psycopg.Error as e:
                if self.stopping.is_set():
                    raise FatalError("stopped while waiting for PostgreSQL") from e
                log.warning("cannot connect to PostgreSQL (%s); retrying", str(e).strip())
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _q(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        assert self.db is not None
        async with self.db.cursor() as cur:
            await cur.execute(query, params)
            row = await cur.fetchone()
            return row[0] if row else None

    async def _q_all(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        assert self.db is not None
        async with self.db.cursor() as cur:
            await cur.execute(query, params)
            return await cur.fetchall()

    def _open_log(self, committed: int) -> None:
        """Open the writeset log, ending at the database's committed GID. Its records are not
        synced per commit (seed 9.5.1): after a host crash it can end before that GID; it then
        starts again after it (this node serves no older range; the records it lost are in the
        others' logs). Records after that GID are cut: they were certified in a view this node
        did not commit them in, and after every node crashed the cluster may re-form without
        them and give those GIDs to other writesets (the others' logs hold what the cluster
        kept)."""
        try:
            self.wslog.open(upto=committed)
        except (LogError, OSError) as e:
            raise FatalError(f"cannot open the writeset log in {self.cfg.wslog_dir}: {e}") from e
        if self.wslog.end_gid < committed or self.wslog.base_gid > committed:
            if self.wslog.end_gid:
                log.warning("the writeset log ends at GID %d but the database has committed GID %d (the "
                            "log's unsynced tail was lost): starting the log again after GID %d",
                            self.wslog.end_gid, committed, committed)
            self.wslog.reset(committed)

    async def _init_node(self) -> int:
        """Tell the extension the coordinator is (re)starting; the node's committed GID. After a
        coordinator restart this can be past the durable GID read before (a backend committed
        meanwhile)."""
        try:
            lanes = int(await self._q("SELECT chorus.set_lanes(%s)", (self.cfg.commit_lanes,)))
            if lanes != self.cfg.commit_lanes:
                log.warning("using %d commit lanes, not the %d configured: the lanes were not settled by a clean "
                            "shutdown; the change takes effect after one", lanes, self.cfg.commit_lanes)
            durable = int(await self._q("SELECT chorus.durable_gid()"))
            await self._q("SELECT chorus.node_init(%s, %s)", (durable, lanes))
            durable = await self._committed_gid()
            self.book.start(lanes, durable)
            self._max_committed = int(await self._q("SELECT max_done FROM chorus.lane_state()"))
            # what a node's data must share with the cluster's (docs/PROTOCOL.md section 2)
            self.compat = str(await self._q(
                "SELECT current_setting('server_encoding') || ' / PostgreSQL ' || "
                "current_setting('server_version_num')::int / 10000"))
            if self.replicator is not None:
                self.replicator.max_committed = self._max_committed
            await self._q("SELECT chorus.set_online(false, 'Its coordinator is starting and has not joined the cluster yet')")
        except psycopg.errors.UndefinedFunction as e:
            raise FatalError("the chorus extension is not installed in this database "
                             "(CREATE EXTENSION chorus)") from e
        except psycopg.errors.ObjectNotInPrerequisiteState as e:
            raise FatalError(f"{e}".strip()) from e
        self.db_ok.set()
        return durable

    async def _committed_gid(self) -> int:
        return int(await self._q("SELECT chorus.committed_gid()"))

    async def _set_online(self, online: bool, reason: str = "") -> None:
        if self.db is None or self.db.closed:
            return
        try:
            await self._q("SELECT chorus.set_online(%s, %s)", (online, reason[:250]))
        except psycopg.Error as e:
            log.warning("cannot set online=%s: %s", online, str(e).strip())

    async def _check_database(self, why: str) -> None:
        """An apply session lost its connection: if only that session ended (terminated by an
        administrator, say) its writeset is simply retried; if PostgreSQL went away, recover."""
        try:
            await self._q("SELECT 1")
        except psycopg.Error:
            await self._database_lost(why)

    async def _database_lost(self, why: str) -> None:
        """PostgreSQL restarted or vanished: reconnect, re-read the durable GID, re-apply."""
        if not self.db_ok.is_set():
            return
        self.db_ok.clear()
        log.warning("lost PostgreSQL (%s); reconnecting", why)
        if self.db is not None:
            try:
                await self.db.close()
            except psycopg.Error:
                pass
        while not self.stopping.is_set():
            await self._connect_db()
            try:
                durable = await self._init_node()
                break
            except psycopg.Error as e:
                log.warning("re-initialising after restart: %s", str(e).strip())
                await asyncio.sleep(DB_RETRY_S)
        else:
            return
        lost = self.book.restart(durable)  # pending again, the lanes starting at the durable GID
        if lost:
            # committed before the crash but not flushed: applied again, before everything else
            log.info("PostgreSQL lost GIDs %d..%d it had committed but not flushed: applying them again",
                     lost[0].gid, lost[-1].gid)
            again = {p.gid for p in lost}
            self.scheduler = Scheduler()
            for p in [*lost, *(p for g, p in self.pending.items() if g not in again)]:
                if p.gid in again:
                    p.backend = None
                self.scheduler.add(p.gid, _keys(p.writeset), local=p.origin == self.cfg.name,
                                   barrier=p.writeset.has_schema)
        else:
            self.scheduler.committed_upto(durable)
        replays = self.scheduler.replay_all_from(durable)
        log.info("PostgreSQL is back at GID %d; re-applying %d certified writesets", durable, len(replays))
        for w in [*self.workers, self.replay_session]:
            await w.close()
        self.idle = list(self.workers)
        self.replay_busy = False
        if self.replicator is not None and self.replicator.accepts_writes:
            await self._set_online(True)
        self._dispatch()

    # ---- the bus ------------------------------------------------------------------------

    async def _bus_loop(self) -> None:
        assert self.bus is not None and self.replicator is not None
        r = self.replicator
        local = self.bus.local_id
        try:
            async for batch in self.bus.batches():
                for ev in batch:
                    if isinstance(ev, View):
                        log.info("view %d: members %s, joined %s, left %s, quorate %s",
                                 ev.view_id, ev.members, ev.joined, ev.left, ev.quorate)
                        actions = r.on_view(ev, time.monotonic())
                        self._in_flight = 0  # what was not delivered before a view change never will be
                        self._sync_resend()
                    else:
                        actions = r.on_delivery(ev)
                        if ev.sender == local and ev.payload[1:2] in (b"W", b"M"):
                            self._in_flight = max(0, self._in_flight - 1)
                    await self._act(actions)
                self.feeder.flush()  # the log records of this batch, in one write
                if self._outbox:
                    self._pump()
        except BusError as e:
            self.fatal = f"bus failed: {e}"
            raise

    def _post(self, payload: bytes, on_error: Callable[[BusError], None]) -> None:
        """Multicast ``payload``: at once if the bus takes it, else from a task that retries
        (``on_error`` if it cannot). Messages leave in the order they are posted."""
        assert self.bus is not None
        if self._sends_waiting == 0 and self.bus.send_nowait(payload):
            return
        self._sends_waiting += 1
        self._spawn(self._send_later(payload, on_error))

    async def _send_later(self, payload: bytes, on_error: Callable[[BusError], None]) -> None:
        assert self.bus is not None
        try:
            await self.bus.send(payload)
        except BusError as e:
            on_error(e)
        finally:
            self._sends_waiting -= 1

    async def _act(self, actions: list[Any]) -> None:
        r = self.replicator
        if r is not None and bool(r.paused_by) != self._flow_paused and self.db_ok.is_set():
            self._flow_paused = bool(r.paused_by)
            self._spawn(self._q_logged("SELECT chorus.set_paused(%s)", (self._flow_paused,)))
        for a in actions:
            if isinstance(a, LocalVerdict):
                self._local_verdict(a)
            elif isinstance(a, (Apply, DdlOutcome)) and self._held_live is not None:
                self._held_live.append(a)  # after the catch-up range
            elif isinstance(a, Apply):
                self._admit(_Pending(a.gid, a.prev, a.origin, a.writeset), local=False)
                self._dispatch_soon()
            elif isinstance(a, DdlOutcome):
                self.feeder.outcome(a.gid, a.ok, _raw(a.content) if a.content is not None else b"")
                self._ddl_outcome(a)
            elif isinstance(a, CatchUp):
                self._spawn(self._catch_up(a), name="catch-up")
            elif isinstance(a, LogQueried):
                self._answer_log_query(a)
            elif isinstance(a, LogOffered):
                if a.info.request_id in self._log_offers:
                    self._log_offers[a.info.request_id].append(a.info)
            elif isinstance(a, SyncReached):
                self._sync_reached(a)
            elif isinstance(a, VoteOpened):
                self._vote_opened(a.gid)
            elif isinstance(a, VoteDecided):
                self._vote_decided(a)
            elif isinstance(a, Send):
                self._send_msg(a.message)
            elif isinstance(a, PhaseChange):
                self.phase_reason = a.reason
                log.info("phase %s: %s", a.phase.value, a.reason)
                await self._set_online(a.phase == Phase.ONLINE and self.replicator is not None
                                       and self.replicator.accepts_writes, f"Phase {a.phase.value}: {a.reason}")
            elif isinstance(a, Joined):
                self.state = self.state.with_(cluster_uuid=a.cluster_uuid, bootstrap=False,
                                              safe_to_bootstrap=False, last_gid=a.gid)
                save_state(self.cfg.state_file, self.state)

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: Optional[str] = None) -> asyncio.Task[Any]:
        """Start a background task and keep it referenced until it ends (an unreferenced
        pending task can be garbage-collected mid-flight: found with a catch-up that vanished)."""
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _q_logged(self, query: str, params: tuple[Any, ...]) -> None:
        try:
            await self._q(query, params)
        except psycopg.Error as e:
            log.warning("%s: %s", query, str(e).strip())

    def _send_msg(self, msg: bp.Message) -> None:
        self._post(bp.encode(msg), lambda e: log.error("cannot send %s: %s", type(msg).__name__, e))

    async def _tick_loop(self) -> None:
        assert self.replicator is not None
        last_progress = 0.0
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            await self._act(self.replicator.tick(now))
            self.feeder.flush()
            if not self.db_ok.is_set():
                continue
            try:
                wm = await self._committed_gid()
            except psycopg.Error as e:
                self._spawn(self._database_lost(str(e).strip()))
                continue
            self.book.advance(wm)
            self._reap_committed(wm)
            try:
                self._flushed(int(await self._q("SELECT chorus.durable_gid()")))
            except psycopg.Error as e:
                self._spawn(self._database_lost(str(e).strip()))
                continue
            if now - last_progress >= PROGRESS_EVERY_S:
                last_progress = now
                msg = self.replicator.progress_message(self.watermark)
                if msg is not None:
                    await self._act([msg])
                self._flow_reassert()

    def _flushed(self, durable: int) -> None:
        """Everything up to GID ``durable`` is on disk: forget the writesets kept for a crash."""
        self.book.flushed(durable)

    def _reap_committed(self, watermark: int) -> None:
        for g in [g for g in self.pending if g <= watermark and self.pending[g].backend is not None]:
            self._local_done(g)

    # ---- local backends -----------------------------------------------------------------

    def _backend_frame(self, b: _Backend, frame: bpf.Frame) -> None:
        t = frame.type
        if t == b"W":
            self._local_writeset(b, frame.payload)
        elif t == b"C":
            gid, _ = bpf.parse_done(frame.payload)
            self._local_done(gid)
        elif t == b"S":
            self._sync_request(b)
        elif t == b"R":
            gid, _, content = bpf.parse_ran(frame.payload)
            wire.scan(content)  # checked before it reaches the bus
            p = self.pending.get(gid)
            if p is not None and p.writeset.toi and p.backend is b:
                self._send_msg(bp.DdlResult(self.cfg.name, gid, True, "", content))
        else:
            gid, xid = bpf.parse_done(frame.payload)
            log.info("backend %d aborted certified GID %d (xid %d): replaying it", b.pid, gid, xid)
            self._replay(gid)

    def _backend_closed(self, b: _Backend) -> None:
        b.closed = True
        if b.ticket:
            self.tickets.pop(b.ticket, None)
        for gid in list(b.certified):
            self._spawn(self._orphaned(b, gid))

    def _local_writeset(self, b: _Backend, payload: bytes) -> None:
        ws = wire.scan(payload)  # checked before it reaches the bus
        b.pid = ws.pid
        r = self.replicator
        if r is None or not r.accepts_writes or not self.db_ok.is_set():
            self.counters.refused += 1
            why = self.phase_reason if r is not None else "the coordinator is starting"
            b.send(bpf.verdict_frame(bpf.VERDICT_REFUSED, 0, 0, f"this node does not accept writes: {why}"))
            return
        limit = self.max_writeset
        if len(payload) > limit:
            # every certified writeset must fit in a log record (partial recovery serves it)
            self.counters.refused += 1
            b.send(bpf.verdict_frame(
                bpf.VERDICT_TOO_LARGE, 0, 0,
                f"the transaction's writeset ({len(payload) / 1e6:.1f} MB) is larger than this node's writeset log "
                f"can hold in one record ({limit / 1e6:.1f} MB): raise log.segment_mb or lower "
                "chorus.max_writeset_size"))
            return
        ticket = self.next_ticket
        self.next_ticket += 1
        b.ticket = ticket
        self.tickets[ticket] = b
        r.local_decoded[ticket] = ws
        self._outbox.append((ticket, payload))
        if not self._pump_scheduled:
            # after the other sockets that are readable now: their writesets go in the same message
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Send queued local writesets. At most MAX_IN_FLIGHT of this node's messages are on the
        bus, not yet delivered, at a time; writesets that queue up meanwhile go together in the
        next message (their order is kept). An idle node sends at once; a busy one sends fewer,
        larger messages (group commit through the bus)."""
        self._pump_scheduled = False
        while self._outbox and self._in_flight < MAX_IN_FLIGHT:
            n, size = 0, 0
            for _, payload in self._outbox:
                if n and size + len(payload) > BATCH_BYTES:
                    break
                n += 1
                size += len(payload)
            batch, self._outbox = self._outbox[:n], self._outbox[n:]
            msg: bp.Message = (bp.WritesetMsg(self.cfg.name, *batch[0]) if n == 1
                               else bp.WritesetBatch(self.cfg.name, tuple(batch)))
            self.counters.bus_batches += 1
            self.counters.bus_writesets += n
            self._in_flight += 1
            self._post(bp.encode(msg), functools.partial(self._send_failed, batch))

    def _send_failed(self, batch: list[tuple[int, bytes]], e: BusError) -> None:
        self._in_flight -= 1
        for ticket, _ in batch:
            if self.replicator is not None:
                self.replicator.local_decoded.pop(ticket, None)
            b = self.tickets.pop(ticket, None)
            if b is not None and not b.closed:
                b.ticket = 0
                b.send(bpf.verdict_frame(bpf.VERDICT_REFUSED, 0, 0, f"the group bus failed: {e}"))
        if self._outbox:
            self._pump()

    # ---- causal reads --------------------------------------------------------------------

    def _sync_request(self, b: _Backend) -> None:
        """A backend wants to read causally: answer with the GID certified before a marker sent
        after its request. Requests that arrive while a marker is on the bus share the next."""
        r = self.replicator
        if r is None or not r.accepts_writes or not self.db_ok.is_set():
            b.send(bpf.verdict_frame(bpf.VERDICT_REFUSED, 0, 0,
                                     f"this node is not in the primary component: {self.phase_reason}"))
            return
        self._sync_waiting.append(b)
        if not self._sync_on_bus:
            self._sync_send()

    def _sync_send(self) -> None:
        self._sync_token += 1
        self._sync_on_bus[self._sync_token] = self._sync_waiting
        self._sync_waiting = []
        self._send_msg(bp.SyncMarker(self.cfg.name, self._sync_token))

    def _sync_reached(self, s: SyncReached) -> None:
        for b in self._sync_on_bus.pop(s.token, []):
            if b.closed:
                continue
            if s.ok:
                b.send(bpf.verdict_frame(bpf.VERDICT_COMMIT, s.gid, 0, ""))
            else:
                b.send(bpf.verdict_frame(bpf.VERDICT_REFUSED, 0, 0, "this node left the primary component"))
        if self._sync_waiting and not self._sync_on_bus:
            self._sync_send()

    def _sync_resend(self) -> None:
        """A view change: markers not delivered yet never will be; send a new one."""
        for token in sorted(self._sync_on_bus):
            self._sync_waiting = self._sync_on_bus.pop(token) + self._sync_waiting
        if self._sync_waiting:
            self._sync_send()

    def _local_verdict(self, v: LocalVerdict) -> None:
        b = self.tickets.pop(v.ticket, None)
        if b is not None:
            b.ticket = 0
        if not v.ok:
            if b is not None and not b.closed:
                kind = (bpf.VERDICT_UNKNOWN if v.unknown else bpf.VERDICT_CONFLICT if v.gid
                        else bpf.VERDICT_REFUSED)
                b.send(bpf.verdict_frame(kind, v.gid, 0, v.reason))
            return
        assert v.writeset is not None
        p = _Pending(v.gid, v.prev, self.cfg.name, v.writeset, b)
        self._admit(p, local=True)
        if b is None or b.closed:
            log.info("backend of certified GID %d is gone: replaying it", v.gid)
            self._replay(v.gid)
            return
        b.certified.add(v.gid)
        b.send(bpf.verdict_frame(bpf.VERDICT_COMMIT, v.gid, p.wait_for, "", prev=v.prev))
        if v.writeset.toi:  # it runs now: local transactions in its way lose
            self._waiters[v.gid] = _Waiter(lambda: b.pid if p.backend is b else 0, time.monotonic())

    def _ddl_outcome(self, o: DdlOutcome) -> None:
        p = self.pending.get(o.gid)
        if p is None or p.ddl_known is None:
            return
        p.ddl_ok = o.ok
        if o.ok and o.content is not None:
            p.writeset = o.content  # what every node applies for it
        p.ddl_known.set()
        if not o.ok:
            log.info("schema change GID %d from %s is skipped: %s", o.gid, p.origin, o.error)
        if p.backend is not None:
            b = p.backend
            if not b.closed:
                b.send(bpf.verdict_frame(bpf.VERDICT_COMMIT if o.ok else bpf.VERDICT_REFUSED,
                                         o.gid, p.prev, o.error))
            if o.ok:
                return  # the backend commits it
            self._replay(o.gid)  # commit the GID without the change
        elif p.origin == self.cfg.name:
            self.scheduler.replay(o.gid)
        self._dispatch()

    def _admit(self, p: _Pending, local: bool) -> None:
        """A certified writeset (in GID order): into the writeset log, the pending set and the
        scheduler. With several commit lanes its commit waits for the previous certified GID of
        its lane (a schema change also waits for everything before it: applier.py)."""
        self.book.admit(p)
        self.feeder.certified(p.gid, p.origin, _raw(p.writeset), p.writeset.toi)
        self.scheduler.add(p.gid, _keys(p.writeset), local=local, barrier=p.writeset.has_schema)

    def _local_done(self, gid: int) -> None:
        p = self.book.committed(gid)
        if p is None:
            return
        if p.backend is not None:
            p.backend.certified.discard(gid)
        self.counters.local_commits += 1
        self.scheduler.committed(gid)
        self._applied_here(gid)
        self._dispatch()

    def _replay(self, gid: int) -> None:
        p = self.pending.get(gid)
        if p is None:
            return
        if p.backend is not None:
            p.backend.certified.discard(gid)
            p.backend = None
        if p.ddl_known is not None and p.ddl_ok is None:
            # A schema change whose origin backend gave up: the cluster must learn that it did not
            # run here; the outcome (the first result delivered) decides what every node does.
            if not p.ddl_failure_sent:
                p.ddl_failure_sent = True
                self._send_msg(bp.DdlResult(self.cfg.name, gid, False, f"it failed on its origin {self.cfg.name}"))
            return
        self.scheduler.replay(gid)
        self._dispatch()

    async def _orphaned(self, b: _Backend, gid: int) -> None:
        """A backend closed its socket holding a certified GID: wait until its transaction
        committed (the watermark passes the GID) or ended without committing (replay). The
        session itself may live on: a backend whose wait was interrupted rolls back and goes on
        with its next transaction."""
        p = self.pending.get(gid)
        xid = p.writeset.xid if p is not None else 0
        while gid in self.pending and self.pending[gid].backend is b:
            if not self.db_ok.is_set():
                return  # the restart path re-applies everything above the durable GID
            try:
                wm = await self._committed_gid()
                if wm >= gid:
                    self._local_done(gid)
                    return
                if xid:  # the commit log knows: committed, aborted or in progress
                    ended = await self._q(_XACT_STATUS, (xid,)) == "aborted"
                else:  # a schema change runs as one statement: it ended when the session is idle
                    ended = not await self._q("SELECT count(*) FROM pg_stat_activity"
                                              " WHERE pid = %s AND state = 'active'", (b.pid,))
                if ended and await self._committed_gid() < gid:
                    self._replay(gid)
                    return
            except psycopg.Error:
                return
            await asyncio.sleep(0.05)

    # ---- apply --------------------------------------------------------------------------

    def _flow_check(self) -> None:
        if self._held_live is not None:
            return  # streaming a catch-up: the cluster need not wait for that (Galera's joiner)
        backlog = len(self.pending)
        if not self._flow_requested and backlog >= self.cfg.flow_pause_at:
            self._flow_requested = True
            self._send_msg(bp.FlowControl(self.cfg.name, True))
        elif self._flow_requested and backlog <= self.cfg.flow_resume_at:
            self._flow_requested = False
            self._send_msg(bp.FlowControl(self.cfg.name, False))

    def _flow_reassert(self) -> None:
        """Flow control is a state, not an event: if the cluster's view of this node's request
        (as delivered back to it) differs from what it wants, say it again. Covers a request
        sent while this node was not yet counted online, or lost to a failed send."""
        r = self.replicator
        if r is None or r.phase != Phase.ONLINE:
            return
        if (self.cfg.name in r.paused_by) != self._flow_requested:
            self._send_msg(bp.FlowControl(self.cfg.name, self._flow_requested))

    def _dispatch_soon(self) -> None:
        """Dispatch once the writesets delivered together are all admitted: consecutive ones can
        then go to one session as a run."""
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        self._flow_check()
        if not self.db_ok.is_set():
            return
        if not self.replay_busy:
            gid = self.scheduler.next_replay()
            if gid is not None:
                self.replay_busy = True
                self._spawn(self._apply(self.replay_session, [gid], replay=True))
        # a run commits its GIDs as one: only where commits follow the order of GIDs (one lane)
        max_run = self.cfg.apply_run if self.lanes == 1 else 1
        for run in self.scheduler.ready_runs(len(self.idle), max_run, self._run_fits):
            if len(self.idle) < len(self.workers):
                self.counters.overlapped_applies += 1
            session = self.idle.pop()
            self._spawn(self._apply(session, run, replay=False))
        busy = len(self.workers) - len(self.idle)
        if busy > self.counters.max_workers_busy:
            self.counters.max_workers_busy = busy

    def _run_fits(self, run: list[int]) -> bool:
        return sum(len(_raw(self.pending[g].writeset)) for g in run) <= RUN_BYTES

    async def _apply(self, session: ApplySession, run: list[int], replay: bool, pooled: bool = True) -> None:
        """Apply certified writesets ``run`` (one, or consecutive remote ones applied as one
        transaction) in ``session`` (one of the pool's unless ``pooled`` is false)."""
        gid = run[-1]
        try:
            ps = [self.pending.get(g) for g in run]
            if any(p is None for p in ps):
                return
            p = ps[-1]
            assert p is not None
            if p.ddl_known is not None:
                await p.ddl_known.wait()  # then its writeset is the content every node applies
            writesets = [p.writeset for p in ps if p is not None]
            t0 = time.monotonic()
            self._waiters[gid] = _Waiter(lambda: session.pid, t0)
            try:
                first = ps[0]
                assert first is not None
                done = await session.apply_run(gid, first.wait_for, writesets,
                                               ddl_ok=p.ddl_ok is not False and not p.skip, prev=first.prev)
            finally:
                self._waiters.pop(gid, None)
            self.last_apply_ms = (time.monotonic() - t0) * 1000
            if not done:
                self.counters.already_committed += len(run)
            elif replay:
                self.counters.replayed += len(run)
            else:
                self.counters.applied += len(run)
                self.counters.apply_transactions += 1
            for g in run:
                done_p = self.book.committed(g)
                self.scheduler.committed(g)
                if done_p is None or not done_p.skip:
                    self._applied_here(g)
            self.book.advance(gid)
        except TransientApplyError as e:
            self.counters.apply_retries += 1
            log.info("retrying GID %s: %s", gid if len(run) == 1 else f"{run[0]}..{gid}", e)
            for g in run:
                self.scheduler.redispatch(g)
            if isinstance(e, ApplyConnectionLost):
                self._spawn(self._check_database(str(e)))
            await asyncio.sleep(0.01)
        except ApplyError as e:
            if len(run) > 1:  # which one fails: each is tried alone
                log.info("GIDs %d..%d failed as a run: applying them one by one (%s)", run[0], gid, e)
                for g in run:
                    self.scheduler.redispatch(g)
            else:
                self._spawn(self._apply_failed(gid, str(e)))
        except Exception as e:  # a bug: the writeset would never commit here; stop rather than stall
            self.fatal = f"applying GID {gid} failed unexpectedly: {e!r}"
            log.exception("%s; stopping", self.fatal)
            self.stopping.set()
        finally:
            if replay:
                self.replay_busy = False
            elif pooled:
                self.idle.append(session)
            self._dispatch()

    # ---- inconsistency voting (Galera 4; docs/MEMBERSHIP.md) -------------------------------

    async def _apply_failed(self, gid: int, reason: str) -> None:
        """This node failed to apply certified writeset ``gid`` (it succeeded on its origin).
        The members vote: if the majority applied it, this node leaves and stops; if the
        majority failed too, the GID commits empty here and the node goes on (the nodes that
        applied it leave)."""
        r = self.replicator
        decided = r.decided.get(gid) if r is not None else None
        if decided is None:
            self._apply_failures[gid] = reason
            waiter = self._vote_waits.setdefault(gid, asyncio.get_running_loop().create_future())
            log.error("GID %d could not be applied here (%s): the nodes vote on it", gid, reason)
            self._send_msg(bp.Vote(self.cfg.name, gid, False, reason))
            decided = await waiter
        if decided:
            self._leave_inconsistent(gid, f"the majority applied it and this node could not ({reason})")
            return
        p = self.pending.get(gid)
        if p is not None:
            # In a session of its own: the pool's may all wait for this GID's turn.
            log.warning("GID %d: the majority could not apply it either; it commits empty here", gid)
            p.skip = True
            session = ApplySession(self.cfg.dsn, f"{self.cfg.name}-vote")
            try:
                await self._apply(session, [gid], replay=False, pooled=False)
            finally:
                await session.close()

    def _vote_opened(self, gid: int) -> None:
        """A node failed to apply ``gid``: say whether this one did, now or once it has."""
        if gid in self._apply_failures:
            return  # voted already
        if self.watermark >= gid:
            self._send_msg(bp.Vote(self.cfg.name, gid, True))
        else:
            self._vote_due.add(gid)

    def _applied_here(self, gid: int) -> None:
        """GID ``gid`` committed here (applied, or committed by its local backend)."""
        if gid in self._vote_due:
            self._vote_due.discard(gid)
            self._send_msg(bp.Vote(self.cfg.name, gid, True))
        r = self.replicator
        if r is not None and r.decided.get(gid) is False:
            self._leave_inconsistent(gid, "the majority could not apply it and this node did")

    def _vote_decided(self, d: VoteDecided) -> None:
        log.warning("inconsistency vote on GID %d: %s (%s)", d.gid,
                    "the majority applied it" if d.ok else "the majority could not apply it", d.detail)
        waiter = self._vote_waits.pop(d.gid, None)
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(d.ok)
        elif not d.ok and self.watermark >= d.gid and d.gid not in self._vote_due:
            self._leave_inconsistent(d.gid, "the majority could not apply it and this node did")

    def _leave_inconsistent(self, gid: int, why: str) -> None:
        """This node's data differs from the majority's at GID ``gid``: stop taking part."""
        if self.fatal:
            return
        self.fatal = (f"inconsistency vote on GID {gid}: {why}; this node leaves the cluster and stops "
                      "(rebuild it with chorus node join --total)")
        log.error("%s", self.fatal)
        try:  # it does not start again with data the cluster does not have
            self.state = self.state.with_(left_by_vote=self.fatal)
            save_state(self.cfg.state_file, self.state)
        except OSError as e:
            log.error("cannot record the vote in the state file: %s", e)
        self.stopping.set()

    async def _blocker_loop(self) -> None:
        """Local loses to remote (DESIGN.md invariant 6; the policy: chorus/blockers.py). Every
        BLOCKER_CHECK_S, one query asks what blocks the sessions of certified writesets that have
        been running a while (apply sessions, and the backend of a schema change while it runs);
        the watch says which local sessions to abort and how."""
        watch = BlockerWatch(self.cfg.idle_blocker_grace_ms / 1000)
        while True:
            await asyncio.sleep(BLOCKER_CHECK_S)
            if self.db is None or not self.db_ok.is_set():
                continue
            now = time.monotonic()
            for g in [g for g in self._waiters if g not in self.pending]:
                del self._waiters[g]
            waiting = {w.pid(): g for g, w in self._waiters.items()
                       if now - w.since >= BLOCKER_CHECK_S and w.pid()}
            watch.forget(waiting.values())
            if not waiting:
                continue
            try:
                rows = await self._q_all(
                    "SELECT w.pid, a.pid, a.state, a.xact_start FROM unnest(%s::int[]) AS w(pid),"
                    " unnest(pg_blocking_pids(w.pid)) AS b(pid) JOIN pg_stat_activity a ON a.pid = b.pid",
                    (list(waiting),))
                # appliers, and the sessions running other nodes' index builds, are never touched
                appliers = {w.pid for w in [*self.workers, self.replay_session]} | set(self.concurrent.pids.values())
                certified = {p.backend.pid: g for g, p in self.pending.items() if p.backend is not None}
                for a in watch.decide([Blocking(*row) for row in rows], waiting, appliers, certified,
                                      time.monotonic()):
                    if a.note:
                        (log.warning if a.warning else log.info)("%s", a.note)
                    if await self._q("SELECT chorus.abort_local(%s, %s, %s)", (a.pid, a.gid, a.how)) and a.counts:
                        self.counters.local_aborts += 1
            except psycopg.Error as e:
                log.warning("checking what blocks the appliers: %s", str(e).strip())

    # ---- partial recovery ---------------------------------------------------------------

    def _answer_log_query(self, q: LogQueried) -> None:
        if self.recovery_server is None or q.node == self.cfg.name:
            return
        self._send_msg(bp.LogInfo(
            q.node, q.request_id, self.cfg.name, self.cfg.recovery_advertise or self.cfg.recovery_listen,
            self.wslog.base_gid, self.wslog.end_gid, self.watermark, len(self.pending)))

    async def _ask_logs(self) -> list[bp.LogInfo]:
        """Which members' logs hold what: a LogQuery through the bus, answers for a moment."""
        r = self.replicator
        assert r is not None
        rid = uuid.uuid4().hex
        self._log_offers[rid] = []
        self._send_msg(bp.LogQuery(self.cfg.name, rid))
        deadline = time.monotonic() + LOG_QUERY_WAIT_S
        others = len([n for n in r.online if n != self.cfg.name])
        while time.monotonic() < deadline and len(self._log_offers[rid]) < others:
            await asyncio.sleep(0.02)
        return self._log_offers.pop(rid)

    async def _catch_up(self, c: CatchUp) -> None:
        """Stream the certified writesets in (c.after, c.upto] from a member's log and apply them
        in order (in parallel where independent, like live ones); meanwhile the live stream after
        c.upto is held. Then apply what was held and go online once everything up to c.upto is
        committed."""
        r = self.replicator
        assert r is not None
        self._held_live = []
        prog = self.catchup = rc.Progress(c.after, c.upto)
        prev = c.after  # the last certified GID handed to apply: the next one's prev
        # Runs of consecutive row writesets are applied as one transaction (wire.merge): the
        # commit of the run's last GID covers the GIDs before it, and the per-transaction cost
        # (a round trip, a commit, the commit turn) is paid once per run, not per writeset.
        batch: list[LogRecord] = []
        batch_bytes = 0
        batch_prev = prev

        def flush() -> None:
            nonlocal batch, batch_bytes
            self.feeder.flush()  # logged before anything of it can commit
            if not batch:
                return
            try:
                merged = wire.merge([wire.decode(b.payload) for b in batch])
            except wire.WireError as e:
                raise rc.RecoveryError(f"a writeset in GIDs {batch[0].gid}..{batch[-1].gid} from the partner's "
                                       f"log does not decode: {e}") from e
            last = batch[-1]
            self.book.admit(_Pending(last.gid, batch_prev, last.origin, merged))
            self.scheduler.add(last.gid, _keys(merged), local=False)
            batch, batch_bytes = [], 0
            self._dispatch()

        async def take(rec: LogRecord) -> None:
            nonlocal prev, batch_prev, batch_bytes
            prog.position, prog.records, prog.bytes = rec.gid, prog.records + 1, prog.bytes + len(rec.payload)
            if rec.gid <= self.watermark:
                prev = rec.gid
                return
            if not _is_ddl(rec.payload) and self.catchup_batch > 1 and self.lanes == 1:
                if not batch:
                    batch_prev = prev
                self.feeder.certified(rec.gid, rec.origin, rec.payload, False)
                batch.append(rec)
                batch_bytes += len(rec.payload)
                prev = rec.gid
                if len(batch) >= self.catchup_batch or batch_bytes > CATCHUP_BATCH_BYTES:
                    flush()
            else:
                flush()
                try:
                    ws = wire.scan(rec.payload)
                except wire.WireError as e:
                    raise rc.RecoveryError(f"GID {rec.gid} from the partner's log does not decode: {e}") from e
                p = _Pending(rec.gid, prev, rec.origin, ws)
                self._admit(p, local=False)
                if p.ddl_known is not None:  # the log records a failed schema change as skipped
                    p.ddl_ok = not rec.flags & FLAG_DDL_SKIPPED
                    self.feeder.outcome(rec.gid, p.ddl_ok)
                    p.ddl_known.set()
                prev = rec.gid
                self.feeder.flush()
                self._dispatch()
            while len(self.pending) > CATCHUP_WINDOW and not self.fatal:
                await asyncio.sleep(0.005)

        try:
            target, backlog = c.upto, None
            while True:
                while prog.position < target:
                    if r.phase != Phase.RECOVERING or self.stopping.is_set():
                        log.warning("catch-up stopped at GID %d: the node is %s", prog.position, r.phase.value)
                        return
                    before = prog.position
                    ok = await self._fetch_round(prog, target, take)
                    flush()  # what this round brought, before waiting for more
                    if not ok:
                        return
                    if prog.position == before:
                        await asyncio.sleep(0.2)  # the partner has not committed further yet: reload
                    if target > c.upto:
                        break  # following the live stream: one round at a time
                # The live stream held meanwhile is in the members' logs too: rather than hold it
                # all in memory and apply it in one go, keep streaming while that shrinks it.
                self._held_live = [a for a in self._held_live if not (isinstance(a, Apply) and a.gid <= prog.position)]
                live = [a.gid for a in self._held_live if isinstance(a, Apply)]
                if len(live) <= CATCHUP_WINDOW or (backlog is not None and len(live) >= backlog):
                    break
                backlog, target = len(live), live[-1]
                prog.upto = target
            prog.state = "applying"
            held, self._held_live = self._held_live, None
            await self._act(held)
            while self.watermark < c.upto and not self.fatal:
                await asyncio.sleep(0.02)
            prog.state, prog.finished = "done", time.monotonic()
            log.info("caught up from GID %d to %d: %d writesets, %.1f MB from %s", c.after, c.upto,
                     prog.records, prog.bytes / 1e6, prog.partner)
            await self._act(r.recovered())
        finally:
            if self._held_live is not None:
                self._held_live = None
                if prog.state != "done":
                    prog.state, prog.finished = "failed", time.monotonic()

    async def _fetch_round(self, prog: rc.Progress, upto: int,
                           take: Callable[[LogRecord], Awaitable[None]]) -> bool:
        """One round of catch-up: ask who holds the range, stream from the best partner up to
        its safe stop. False (and the node marked as needing total recovery) if nobody can."""
        r = self.replicator
        assert r is not None
        prog.state = "choosing a partner"
        offers = await self._ask_logs()
        partners = rc.choose_partners(offers, prog.position, self.cfg.recovery_partners)
        if self.keys is None or not partners:
            held = ", ".join(f"{o.partner} after GID {o.after_min}" for o in offers) or "no member answered"
            why = ("this node has no recovery keys configured" if self.keys is None else
                   f"no member's writeset log holds the GIDs after {prog.position} ({held})")
            await self._act(r.recovery_failed(
                f"partial recovery impossible: {why}; total recovery is needed "
                f"(chorus node join --total)"))
            return False
        for o in partners:
            prog.partner, prog.state = o.partner, "streaming"
            try:
                stop = await rc.fetch(o.address, self.keys, r.cluster_uuid, self.cfg.name,
                                      prog.position, upto, take)
                prog.position = max(prog.position, stop)
                break
            except rc.RecoveryError as e:
                log.warning("catch-up from %s (%s) failed at GID %d: %s", o.partner, o.address,
                            prog.position, e)
        return True

    # ---- admin --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        r = self.replicator
        phase = r.phase.value if r is not None else "starting"
        if self.fatal:
            phase = "failed"
        return {
            "node": self.cfg.name,
            "state": phase,
            "reason": self.fatal or self.phase_reason,
            "accepts_writes": bool(r and r.accepts_writes and self.db_ok.is_set()),
            "cluster_uuid": r.cluster_uuid if r else self.state.cluster_uuid,
            "bus_member": self.bus.local_id if self.bus else "",
            "members": sorted(r.online) if r else [],
            "bus_members": list(r.members) if r else [],
            "quorate": bool(r and r.quorate),
            "quorum_votes": r.votes.quorum if r else 0,
            "tie_breaker": r.votes.tie_breaker if r else "",
            # uniform commit (docs/MEMBERSHIP.md): certified, waiting until a quorum has them
            "released_gid": r.released if r else 0,
            "held_for_quorum": r.held_count if r else 0,
            "committed_gid": self.watermark,
            "delivered_gid": r.gid if r else 0,
            "certified_gid": r.last_certified if r else 0,
            "lag_gids": max(0, r.last_certified - self.watermark) if r else 0,
            "lag_ms": self._lag_ms(),
            "local_commits": self.counters.local_commits,
            "certification_failures": r.stats.cert_failures if r else 0,
            "local_certification_failures": r.stats.local_failed if r else 0,
            "applied": self.counters.applied,
            "apply_transactions": self.counters.apply_transactions,
            "replayed": self.counters.replayed,
            "apply_retries": self.counters.apply_retries,
            "apply_queue": self.scheduler.queued,
            "send_queue": len(self._outbox),
            "flow_control": {"requested_by_this_node": self._flow_requested,
                             "paused_by": sorted(r.paused_by) if r else []},
            "pending": len(self.pending),
            "pending_head": [self._describe_pending(g) for g in sorted(self.pending)[:5]],
            "workers": len(self.workers),
            "commit_lanes": self.lanes,
            "workers_busy": len(self.workers) - len(self.idle),
            "max_workers_busy": self.counters.max_workers_busy,
            "overlapped_applies": self.counters.overlapped_applies,
            "already_committed": self.counters.already_committed,
            "last_apply_ms": round(self.last_apply_ms, 3),
            "certification_index_keys": len(r.certifier) if r else 0,
            "certification_horizon": r.certifier.horizon if r else 0,
            "refused": self.counters.refused,
            "local_aborts_for_appliers": self.counters.local_aborts,
            "malformed_frames": self.counters.malformed_frames,
            "bus_batches": self.counters.bus_batches,
            "bus_writesets": self.counters.bus_writesets,
            "uptime_s": round(time.time() - self.started, 1),
            "recovery": self.catchup.as_dict() if self.catchup is not None else None,
            "concurrent_index_changes": self.concurrent.as_dict(),
            "writeset_log": {"low_gid": self.wslog.low_gid, "high_gid": self.wslog.high_gid,
                             "holds_after_gid": self.wslog.base_gid,
                             "waiting_for_schema_outcome": self.feeder.waiting},
        }

    def _lag_ms(self) -> float:
        """How long the oldest certified writeset not committed here has been waiting."""
        if not self.pending:
            return 0.0
        oldest = min(p.delivered_at for p in self.pending.values())
        return round((time.monotonic() - oldest) * 1000, 1)

    def _describe_pending(self, gid: int) -> dict[str, Any]:
        p = self.pending[gid]
        return {"gid": gid, "prev": p.prev, "wait_for": p.wait_for, "origin": p.origin,
                "backend_pid": p.backend.pid if p.backend is not None else None,
                "ddl": p.writeset.has_schema, **self.scheduler.describe(gid)}

    async def _serve_admin(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await admin.serve(reader, writer, self._admin_answer)

    async def _admin_answer(self, cmd: str, req: dict[str, Any]) -> dict[str, Any]:
        """The answer to one admin request (chorus/admin.py)."""
        if cmd == "status":
            return {"ok": True, "status": self.status()}
        if cmd == "settled":
            # verify: has this node committed every writeset it certified up to GID upto?
            upto = int(req.get("upto", 0))
            return {"ok": True, "settled": self.replicator is not None and self.book.settled(upto)}
        if cmd in ("stop", "leave"):
            self.stopping.set()
            return {"ok": True}
        if cmd == "recover":
            r = self.replicator
            if r is None or r.phase in (Phase.ONLINE, Phase.RECOVERING):
                return {"ok": False, "error": f"the node is {r.phase.value if r else 'starting'}"}
            await self._act(r.rejoin(await self._committed_gid(), time.monotonic()))
            return {"ok": True}
        return {"ok": False, "error": f"unknown admin command {cmd!r}"}


def _raw(ws: wire.Writeset) -> bytes:
    return ws.raw or wire.encode(ws)


def _is_ddl(payload: bytes) -> bool:
    """Whether an encoded writeset holds a schema change (its header's flags), without decoding it."""
    return len(payload) > 3 and bool(payload[3] & (wire.FLAG_DDL | wire.FLAG_TOI))


def _keys(ws: wire.Writeset) -> list[tuple[bytes, wire.KeyMode]]:
    """What the scheduler orders writesets by: their certification keys, and for each table
    without a primary key one more key, only for the order of apply: its rows are found by their
    whole image, and an INSERT has no row key, so a later UPDATE of the row it inserted must not
    overtake it (it would find no row). Certification does not see it: two nodes may still
    insert into such a table at once."""
    keys = [(k.hashed(), k.mode) for k in ws.keys]
    for i, t in enumerate(ws.tables):
        if t.full_identity:
            # inserts may pass each other (shared); an UPDATE, DELETE or TRUNCATE waits for the
            # writesets of the table before it, and those after it wait for it (exclusive)
            changes = i in ws.changed_tables
            keys.append((_order_key(t), wire.KeyMode.EXCLUSIVE if changes else wire.KeyMode.REFERENCE))
    return keys


@functools.lru_cache(maxsize=4096)
def _order_key(t: wire.Table) -> bytes:
    return wire.key_hash((b"", t.nspname.encode("utf-8", "surrogateescape"),
                          t.relname.encode("utf-8", "surrogateescape")))


async def _unix_server(path: str, create: Callable[[str], Awaitable[asyncio.base_events.Server]]
                       ) -> asyncio.base_events.Server:
    """A Unix socket readable and writable by its owner only, served by ``create(path)``."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    old = os.umask(0o177)
    try:
        server = await create(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    return server


