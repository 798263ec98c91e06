"""The node's commit pipeline: certified writesets from admission to their commit here.

Every certified writeset, local or remote, is admitted in GID order: into the writeset log, the
commit book (pending set, watermark, lanes: book.py) and the dependency scheduler
(scheduler.py). Remote ones are applied by a pool of apply sessions (applier.py), in parallel
where independent and as runs of consecutive writesets where they are not; a local one is
committed by its backend, or replayed by the replay session if its backend gave up. After a
PostgreSQL restart the pipeline applies again what the database lost.

It owns admission: what becomes of a certified local writeset (its backend commits it, or the
replay session does), and of one whose backend closed its socket, is decided here; the backends'
socket (backends.py) only sends the frames.

It talks to the rest of the node through what it is given: ``db`` is the node's own database
connection (nodedb.py), ``send`` puts a message on the bus, ``spawn`` starts a background task,
and :class:`Hooks` hear of commits, failures and fatal bugs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Optional, Protocol

import psycopg

from chorus.bus import proto as bp
from chorus import wire
from chorus.commit.applier import (ApplyConnectionLost, ApplyError, ApplySession, LinkApply, LinkQuery, PartlyCommitted,
                                   TransientApplyError)
from chorus.commit.book import CommitBook
from chorus.concurrent import ConcurrentSchemaChanges
from chorus.nodestatus import Counters
from chorus.actions import DdlOutcome, LocalVerdict
from chorus.commit.scheduler import ApplyScheduler, Scheduler
from chorus.link import copy as link_copy
from chorus.link import position as link_position
from chorus.link.funcall import decide_calls
from chorus.link.settle import SITE_SQL, STAMP_SQL, Settings, Settlement, row_sql
from chorus.spool import Spool
from chorus.wslog import LogFeeder

log = logging.getLogger("chorus.coordinator")

RUN_BYTES = 4 << 20  # a run of live remote writesets applied as one transaction: at most this much


class BackendRef(Protocol):
    """The local backend committing a certified writeset (backends.py)."""
    pid: int
    certified: set[int]  # its certified GIDs not yet committed
    closed: bool  # its socket is closed


class NodeDb(Protocol):
    """What the pipeline asks of the node's own database connection (nodedb.py:NodeDatabase).
    The queries raise ``psycopg.Error`` when the database fails."""
    ok: asyncio.Event  # connected and initialised

    async def committed_gid(self) -> int: ...

    async def local_xact_ended(self, xid: int, pid: int) -> bool: ...


@dataclass
class Waiter:
    """A session committing a certified writeset, watched for local lock blockers (lockwatch.py)."""
    pid: Callable[[], int]  # 0 while unknown (connecting) or gone
    since: float


class Waiters(dict[int, Waiter]):
    """GID -> the session committing it, watched by lockwatch.py, which sleeps while there is
    none: ``added(loop)`` is a future done at the next GID put in."""

    def __init__(self) -> None:
        super().__init__()
        self._added: Optional[asyncio.Future[None]] = None

    def __setitem__(self, gid: int, waiter: Waiter) -> None:
        super().__setitem__(gid, waiter)
        f = self._added
        if f is not None and not f.done():
            f.set_result(None)

    def added(self, loop: asyncio.AbstractEventLoop) -> "asyncio.Future[None]":
        if self._added is None or self._added.done():
            self._added = loop.create_future()
        return self._added


@dataclass
class Pending:
    gid: int
    prev: int  # the GID certified before it
    origin: str
    writeset: wire.Writeset
    backend: Optional[BackendRef] = None
    # schema changes: the outcome on the origin (None until the cluster knows it)
    ddl_ok: Optional[bool] = None
    ddl_known: Optional[asyncio.Event] = None
    ddl_failure_sent: bool = False
    # a schema change that commits once every node reported applying it (replicator: settle):
    # settle_ok is None until the reports are counted; False: undone everywhere (committed empty)
    settle: bool = False
    settle_ok: Optional[bool] = None
    settle_failure: str = ""
    settled: Optional[asyncio.Event] = None
    # inconsistency voting decided that the majority failed to apply it: it commits empty here
    skip: bool = False
    delivered_at: float = field(default_factory=time.monotonic)
    # what its commit waits for: prev with one commit lane, the previous certified GID of its
    # lane with several (docs/APPLY.md; set by CommitBook.assign_lane); the extension's names are the same
    wait_for: int = -1
    # catch-up: the writesets of the GIDs just before it (after prev), committed with it as one
    # run, and their GIDs
    before: tuple[wire.Writeset, ...] = ()
    before_gids: tuple[int, ...] = ()
    # a link writeset (docs/LINKS.md section 3): its message; once decided (the first attempt
    # to apply it read the link's position), what it commits, and why
    link: Optional[bp.LinkWriteset] = None
    link_final: Optional[bytes] = None
    link_decision: Optional[link_position.Decision] = None
    link_applied: int = 0  # of its peer transactions (a batch has several), how many it applied
    # its origin's commit time, µs since the Unix epoch, as its bus message (or log record) said:
    # the same on every node (0: unknown); kept in its log record
    commit_time: int = 0

    def run(self) -> tuple[wire.Writeset, ...]:
        """The writesets its commit applies, in GID order."""
        return (*self.before, self.writeset)

    def __post_init__(self) -> None:
        if self.wait_for < 0:
            self.wait_for = self.prev
        if self.writeset.toi:  # a schema change's place: its outcome and content come later
            self.ddl_known = asyncio.Event()
        if self.settle:
            self.settled = asyncio.Event()

    def settle_after_reports(self) -> None:
        """Its commit now waits for every node's report (a schema change that ran on its origin)."""
        self.settle = True
        if self.settled is None:
            self.settled = asyncio.Event()


@dataclass
class Hooks:
    """What the pipeline tells the rest of the node."""
    committed_here: Callable[[int], None]  # GID committed here (applied or by its backend)
    apply_failed: Callable[[int, str], None]  # it cannot be applied here (voting.py decides)
    connection_lost: Callable[[str], Coroutine[Any, Any, None]]  # an apply session lost PostgreSQL
    fatal: Callable[[str], None]  # a bug: stop rather than stall
    backlog_changed: Callable[[], None]  # the pending set may have grown or shrunk
    # a schema change of this node's settled: tell its waiting backend (ok, or why it was undone)
    tell_backend: Callable[[Pending, bool, str], None] = lambda p, ok, failure: None
    # a link writeset committed here (applied, or empty: p.link_decision says which)
    link_committed: Callable[[Pending], None] = lambda p: None


class CommitPipeline:
    def __init__(self, name: str, dsn: str, workers: int, max_run: int, concurrent: ConcurrentSchemaChanges,
                 feeder: LogFeeder, db: NodeDb, counters: Counters,
                 send: Callable[[bp.Message], None],
                 spawn: Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"], hooks: Hooks,
                 spool: Optional[Spool] = None) -> None:
        self.name = name
        self.dsn = dsn
        self.max_run = max_run
        self.stamps = False  # this node stamps the rows it applies (stamp_rows)
        self.feeder = feeder
        self.db = db
        self.counters = counters
        self._send = send
        self._spawn = spawn
        self.hooks = hooks
        # pending certified writesets, the watermark, commit lanes, unflushed commits (book.py):
        # applied commits are not flushed one by one (applier.py), and a local one may be counted
        # before its backend flushed it; they are re-applied if PostgreSQL crashes before
        # chorus.durable_gid() passes them
        self.book: CommitBook[Pending] = CommitBook()
        self.scheduler = Scheduler()
        self.workers = [ApplySession(dsn, f"{name}-{i}", concurrent, spool) for i in range(max(1, workers))]
        self.replay_session = ApplySession(dsn, f"{name}-replay", concurrent, spool)
        self.idle = list(self.workers)
        self.replay_busy = False
        # counts restarts of PostgreSQL: an apply begun before one must not touch what the restart
        # rebuilt (the scheduler, the idle sessions) when it ends, failed, after it
        self.epoch = 0
        self._restarting = False
        self.waiters = Waiters()  # GID -> the session committing it
        self.last_apply_ms = 0.0
        # schema changes whose reports were counted before they were admitted here (this node
        # held them while catching up): GID -> (ok, failure)
        self._early: dict[int, tuple[bool, str]] = {}
        self._dispatch_scheduled = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # kept: looking it up costs a system call
        # [[link]]: how each link's conflicts are settled here (link/settle.py), by link name
        self.link_settings: dict[str, Settings] = {}

    def stamp_rows(self) -> None:
        """This node stamps the rows it applies (a site that receives a link; extension/chorus_stamp.c),
        each with its own GID and origin commit time: one writeset per apply transaction, and the
        apply sessions give the time with each (before they connect)."""
        self.max_run = 1
        self.stamps = True
        for w in self.sessions():
            w.stamps = True

    @property
    def pending(self) -> dict[int, Pending]:
        """Certified writesets not committed here yet, by GID."""
        return self.book.pending

    @property
    def watermark(self) -> int:
        """Every GID up to it is committed here."""
        return self.book.watermark

    @property
    def busy(self) -> int:
        return len(self.workers) - len(self.idle)

    def sessions(self) -> list[ApplySession]:
        return [*self.workers, self.replay_session]

    async def close(self) -> None:
        for w in self.sessions():
            await w.close()

    # ---- admission and commits ------------------------------------------------------------

    def admit(self, p: Pending, local: bool) -> None:
        """A certified writeset (in GID order): into the writeset log, the pending set and the
        scheduler. With several commit lanes its commit waits for the previous certified GID of
        its lane (a schema change also waits for everything before it: applier.py)."""
        if not self._admit(p):
            return
        early = self._early.pop(p.gid, None)
        if p.settle and early is not None:
            self._settle(p, *early)
        # a link writeset's record waits, as a schema change's does, for what it commits (its
        # apply decides: link/position.py), and is logged as that
        self.feeder.certified(p.gid, p.origin, raw(p.writeset), p.writeset.toi or p.settle or p.link is not None,
                              p.commit_time)
        if p.settle and p.settle_ok is not None:
            self._log_outcome(p)
        keys = order_keys(p.writeset)
        if p.link is not None:  # one link's writesets one after another: each reads where the last left it
            keys.append((link_position.position_key(p.link.link).hashed(), wire.KeyMode.EXCLUSIVE))
        self.scheduler.add(p.gid, keys, local=local, barrier=p.writeset.has_schema)

    def admit_run(self, p: Pending) -> None:
        """A run of catch-up writesets (``p.before`` and ``p.writeset``), committed as one at
        ``p.gid``; their records are logged already."""
        if not self._admit(p):
            return
        self.scheduler.add(p.gid, [k for ws in p.run() for k in order_keys(ws)], local=False)

    def _admit(self, p: Pending) -> bool:
        """Into the commit book; out of GID order is a bug that would stall the node (a commit
        waiting for one admitted after it) or log out of order: stop rather than go on."""
        try:
            self.book.admit(p)
            return True
        except ValueError as e:
            log.error("%s; stopping", e)
            self.hooks.fatal(str(e))
            return False

    # ---- local writesets and their backends ----------------------------------------------

    def admit_local(self, v: LocalVerdict, backend: Optional[BackendRef]) -> Optional[Pending]:
        """The cluster certified local writeset ``v`` of ``backend`` (None if it went away before
        the verdict): admitted like any other. Returns it when its backend is to commit it now
        (the socket server sends the COMMIT verdict); None when it is replayed (its backend is
        gone) or when its backend hears later (a schema change that commits once every node has
        reported: :meth:`settled`, ``Hooks.tell_backend``)."""
        assert v.ok and v.writeset is not None
        p = Pending(v.gid, v.prev, self.name, v.writeset, backend, settle=v.settle, commit_time=v.commit_time)
        self.admit(p, local=True)
        if backend is None or backend.closed:
            log.info("backend of certified GID %d is gone: replaying it", v.gid)
            self.replay(v.gid)
            return None
        backend.certified.add(v.gid)
        if p.settle and p.settle_ok is None:
            return None
        if v.writeset.toi:  # it runs now: local transactions in its way lose (lockwatch.py)
            b = backend
            self.waiters[v.gid] = Waiter(lambda: b.pid if p.backend is b else 0, time.monotonic())
        return p

    def ddl_ran(self, gid: int, backend: BackendRef, content: bytes) -> None:
        """The origin's backend ran schema change ``gid``: its content (checked) goes to the
        cluster, unless the backend no longer holds it (then the replay told the cluster)."""
        p = self.pending.get(gid)
        if p is not None and p.writeset.toi and p.backend is backend:
            self._send(bp.DdlResult(self.name, gid, True, "", content))

    def backend_gone(self, backend: BackendRef) -> None:
        """``backend`` closed its socket: each certified GID it holds is watched until it
        commits or is replayed (:meth:`_orphaned`)."""
        for gid in list(backend.certified):
            self._spawn(self._orphaned(backend, gid))

    async def _orphaned(self, backend: BackendRef, gid: int) -> None:
        """A backend closed its socket holding certified GID ``gid``: wait until its transaction
        committed (the committed GID passes it) or ended without committing (replay). The
        session itself may live on: a backend whose wait was interrupted rolls back and goes on
        with its next transaction."""
        p = self.pending.get(gid)
        xid = p.writeset.xid if p is not None else 0
        while (p := self.pending.get(gid)) is not None and p.backend is backend:
            if not self.db.ok.is_set():
                return  # the restart path re-applies everything above the durable GID
            try:
                if await self.db.committed_gid() >= gid:
                    self.local_done(gid)
                    return
                if await self.db.local_xact_ended(xid, backend.pid) and await self.db.committed_gid() < gid:
                    self.replay(gid)
                    return
            except psycopg.Error:
                return
            await asyncio.sleep(0.05)

    def local_done(self, gid: int) -> None:
        """The backend of local GID ``gid`` (or an earlier coordinator's) committed it."""
        p = self.book.committed(gid)
        if p is None:
            return
        if p.backend is not None:
            p.backend.certified.discard(gid)
        self.counters.local_commits += 1
        self.scheduler.committed(gid)
        self.hooks.committed_here(gid)
        self.dispatch()

    def reap_committed(self, watermark: int) -> None:
        """Local writesets whose commit the database shows though their backend did not say so."""
        for g in [g for g in self.pending if g <= watermark and self.pending[g].backend is not None]:
            self.local_done(g)

    def replay(self, gid: int) -> None:
        """Local GID ``gid`` lost its backend before it committed: the replay session commits it."""
        p = self.pending.get(gid)
        if p is None:
            return
        if p.backend is not None:
            p.backend.certified.discard(gid)
            p.backend = None
        if p.settle and p.settle_ok is None:
            return  # the nodes' reports decide: then it is replayed, whole or empty (settled)
        if p.ddl_known is not None and p.ddl_ok is None:
            # A schema change whose origin backend gave up: the cluster must learn that it did not
            # run here; the outcome (the first result delivered) decides what every node does.
            if not p.ddl_failure_sent:
                p.ddl_failure_sent = True
                self._send(bp.DdlResult(self.name, gid, False, f"it failed on its origin {self.name}"))
            return
        self.scheduler.replay(gid)
        self.dispatch()

    def ddl_outcome(self, o: DdlOutcome, tell_backend: Callable[[Pending], None]) -> None:
        """The cluster knows how a schema change went on its origin. ``tell_backend`` answers the
        origin's waiting backend, if this node is the origin and it still waits."""
        p = self.pending.get(o.gid)
        if p is None or p.ddl_known is None:
            return
        p.ddl_ok = o.ok
        if o.ok and o.content is not None:
            p.writeset = o.content  # what every node applies for it
        if o.settle:
            p.settle_after_reports()  # committed once every node has applied it (settled)
            early = self._early.pop(o.gid, None)
            if early is not None:
                self._settle(p, *early)
        p.ddl_known.set()
        if not o.ok:
            log.info("schema change GID %d from %s is skipped: %s", o.gid, p.origin, o.error)
        if p.settle and p.settle_ok is None:
            self.dispatch()  # the others apply it; its origin's backend hears when they have reported
            return
        if p.settle:
            self._log_outcome(p)
        if p.backend is not None:
            tell_backend(p)
            if o.ok:
                return  # the backend commits it
            self.replay(o.gid)  # commit the GID without the change
        elif p.origin == self.name:
            self.scheduler.replay(o.gid)
        self.dispatch()

    # ---- schema changes settled by every node's report (docs/SECURITY.md) ----------------

    def settled(self, gid: int, ok: bool, failure: str) -> None:
        """Every node reported on schema change ``gid`` (VoteDecided, schema): it commits
        everywhere (``ok``), or is undone everywhere, ``failure`` saying where and why."""
        p = self.pending.get(gid)
        if p is None or not p.settle:
            if gid > self.watermark:
                self._early[gid] = (ok, failure)  # held while catching up: admitted later
                while len(self._early) > 1000:
                    del self._early[min(self._early)]
            return
        if p.settle_ok is not None:
            return
        self._settle(p, ok, failure)
        self._log_outcome(p)
        if p.origin == self.name:
            if p.backend is not None:
                self.hooks.tell_backend(p, ok, failure)
                if ok:
                    return  # its backend commits it
                self.replay(gid)  # commits the GID empty once the backend has given up
            else:
                self.scheduler.replay(gid)  # its backend is gone: whole or empty, as decided
        self.dispatch()

    def settle_from_log(self, gid: int, ok: bool) -> None:
        """A member's log says what became of schema change ``gid`` (a catch-up after this node
        left the primary component while the nodes' reports on it were being counted)."""
        p = self.pending.get(gid)
        if p is not None and p.settle and p.settle_ok is None:
            log.info("schema change GID %d was %s in the cluster (a member's log)", gid,
                     "committed" if ok else "undone")
            self.settled(gid, ok, "" if ok else "it was undone in the cluster while this node was away")

    def _settle(self, p: Pending, ok: bool, failure: str) -> None:
        p.settle_ok, p.settle_failure = ok, failure
        if not ok:
            p.skip = True
            log.warning("schema change GID %d from %s is undone on every node: %s", p.gid, p.origin, failure)
        assert p.settled is not None
        p.settled.set()

    def _log_outcome(self, p: Pending) -> None:
        """The log record of a settled schema change: its content, or flagged skipped."""
        self.feeder.outcome(p.gid, bool(p.settle_ok), raw(p.writeset) if p.settle_ok else b"")

    def flushed(self, durable: int) -> None:
        """Everything up to GID ``durable`` is on disk: forget the writesets kept for a crash."""
        self.book.flushed(durable)

    async def restart(self, lanes: int, durable: int) -> None:
        """PostgreSQL came back at GID ``durable`` with ``lanes`` commit lanes: apply again what it
        lost (committed, not flushed), before everything else, then the rest. Nothing is
        dispatched until it is done (the sessions are closed meanwhile), and applies begun before
        it leave what it rebuilds alone (``epoch``)."""
        self.epoch += 1
        self._restarting = True
        try:
            self._reschedule(lanes, durable)
            await self.close()
            self.idle = list(self.workers)
            self.replay_busy = False
        finally:
            self._restarting = False

    def _reschedule(self, lanes: int, durable: int) -> None:
        self.scheduler = reschedule(self.book, self.scheduler, self.name, lanes, durable)

    # ---- apply ------------------------------------------------------------------------------

    def dispatch_soon(self) -> None:
        """Dispatch once the writesets delivered together are all admitted: consecutive ones can
        then go to one session as a run."""
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self.dispatch)

    def dispatch(self) -> None:
        """Hand what is ready to idle sessions."""
        self._dispatch_scheduled = False
        self.hooks.backlog_changed()
        if not self.db.ok.is_set() or self._restarting:
            return
        if not self.replay_busy:
            gid = self.scheduler.next_replay()
            if gid is not None:
                self.replay_busy = True
                self._spawn(self._apply(self.replay_session, [gid], replay=True))
        # a run commits its GIDs as one: only where commits follow the order of GIDs (one lane)
        max_run = self.max_run if self.book.lanes == 1 else 1
        for run in self.scheduler.ready_runs(len(self.idle), max_run, self._run_fits):
            if len(self.idle) < len(self.workers):
                self.counters.overlapped_applies += 1
            session = self.idle.pop()
            self._spawn(self._apply(session, run, replay=False))
        if self.busy > self.counters.max_workers_busy:
            self.counters.max_workers_busy = self.busy

    def _run_fits(self, run: list[int]) -> bool:
        if any(self.pending[g].link is not None for g in run):
            return False  # a link writeset is applied alone (applier.apply_link)
        return sum(len(raw(ws)) for g in run for ws in self.pending[g].run()) <= RUN_BYTES

    async def commit_skipped(self, gid: int) -> None:
        """Commit GID ``gid`` without its changes (the majority could not apply it either), in a
        session of its own: the pool's may all wait for this GID's turn."""
        p = self.pending.get(gid)
        if p is None:
            return
        log.warning("GID %d: the majority could not apply it either; it commits empty here", gid)
        p.skip = True
        session = ApplySession(self.dsn, f"{self.name}-vote", stamps=self.stamps)
        try:
            await self._apply(session, [gid], replay=False, pooled=False)
        finally:
            await session.close()

    async def _apply(self, session: ApplySession, run: list[int], replay: bool, pooled: bool = True) -> None:
        """Apply certified writesets ``run`` (one, or consecutive remote ones applied as one
        transaction) in ``session`` (one of the pool's unless ``pooled`` is false)."""
        gid = run[-1]
        epoch = self.epoch
        try:
            ps = [self.pending.get(g) for g in run]
            if any(p is None for p in ps):
                return
            p = ps[-1]
            assert p is not None
            if p.ddl_known is not None:
                await p.ddl_known.wait()  # then its writeset is the content every node applies
            if p.settle and p.settle_ok is None and p.origin != self.name:
                await self._apply_and_report(session, p)
                return
            writesets = [ws for p in ps if p is not None for ws in p.run()]
            t0 = time.monotonic()
            self.waiters[gid] = Waiter(lambda: session.pid, t0)
            try:
                first = ps[0]
                assert first is not None
                if p.link is not None and len(run) == 1:
                    link, final = p.link, functools.partial(self._link_final, p)
                    done = await session.apply_link(gid, p.wait_for, p.prev, link.link, final, skip=p.skip)
                    self._log_link(p)
                else:
                    done = await session.apply_run(gid, first.wait_for, writesets,
                                                   ddl_ok=p.ddl_ok is not False and not p.skip, prev=first.prev,
                                                   commit_time=p.commit_time if len(writesets) == 1 else 0)
            finally:
                self.waiters.pop(gid, None)
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
                    self.hooks.committed_here(g)
                if done_p is not None and done_p.link is not None:
                    self.hooks.link_committed(done_p)
            self.book.advance(gid)
        except Exception as e:
            if epoch == self.epoch:
                self._apply_failed(run, e)
                if isinstance(e, TransientApplyError):
                    await asyncio.sleep(0.01)  # (a moment before the retry)
            else:  # PostgreSQL restarted meanwhile: the restart scheduled this run again
                log.info("GID %d: %s (PostgreSQL restarted meanwhile; applied again after it)", gid, e)
        finally:
            if epoch == self.epoch:
                if replay:
                    self.replay_busy = False
                elif pooled:
                    self.idle.append(session)
            self.dispatch()

    async def _apply_and_report(self, session: ApplySession, p: Pending) -> None:
        """A schema change whose outcome the nodes' reports decide: apply it in a transaction
        left open, report (a Vote), and commit it, or roll it back and commit its GID empty,
        once every node has reported. A failure here is reported, not voted on: it undoes the
        change everywhere and no node leaves (docs/SECURITY.md)."""
        gid = p.gid
        assert p.settled is not None
        self.waiters[gid] = Waiter(lambda: session.pid, time.monotonic())
        try:
            try:
                held = await session.apply_held(gid, p.wait_for, p.writeset, p.prev)
            except ApplyError as e:
                log.error("schema change GID %d failed here: %s; reporting it (it is undone everywhere)", gid, e)
                self._send(bp.Vote(self.name, gid, False, f"{e.sqlstate or 'XX000'} {e.message}"[:2000]))
                held = None
            else:
                self._send(bp.Vote(self.name, gid, True))
            await p.settled.wait()
            if held:
                if p.settle_ok:
                    await session.finish_held(True)
                else:
                    await session.finish_held(False)
                    await session.apply_run(gid, p.wait_for, [p.writeset], ddl_ok=False, prev=p.prev)
            elif held is None:
                await session.apply_run(gid, p.wait_for, [p.writeset], ddl_ok=False, prev=p.prev)
        finally:
            self.waiters.pop(gid, None)
        self.counters.applied += 1
        self.counters.apply_transactions += 1
        self.book.committed(gid)
        self.scheduler.committed(gid)
        if p.settle_ok:
            self.hooks.committed_here(gid)
        self.book.advance(gid)

    async def _link_final(self, p: Pending, row: Optional[tuple[object, ...]], query: LinkQuery,
                          apply: LinkApply) -> bytes:
        """Decide and apply (with ``apply``, in the apply's transaction) what link writeset ``p``
        commits, given the link's row of ``chorus.link_position`` before it and, for each peer
        transaction it applies, the stamps and rows its conflicts are decided by (read with
        ``query`` in that transaction, link/settle.py). A batch's transactions are decided one
        after another, each as a link writeset of its own from the row the one before left; each
        reads the stamps and rows after those before it that touch the same keys are applied
        (:func:`link_segments`: consecutive ones whose keys are apart read and apply together).
        Decided at the first attempt and kept, then logged as the GID's record
        (link/position.py ``merged``). A later attempt (after a failure that may have committed,
        or a PostgreSQL restart that lost the commit) applies the same bytes."""
        if p.link_final is not None:
            await apply(p.link_final)
            return p.link_final
        assert p.link is not None
        current = link_position.PositionRow.of(row)
        if link_copy.is_copy(p.writeset):  # a batch of a re-instantiation (never batched by the receiver)
            await self._check_link_site(p.link.link, query)
            copying = self._link_settings(p.link.link)
            p.link_final = await self._copy_final(p.link, wire.decode(bytes(raw(p.writeset))), current, p.gid,
                                                  copying.site, copying.subset, query)
            p.link_decision = link_position.Decision.COPY
            await apply(p.link_final)
            return p.link_final
        finals: list[bytes] = []
        decisions: list[link_position.Decision] = []
        numbered = 0  # the exceptions of the batch's transactions before: each is (GID, its number)
        checked = False
        batched = bool(p.link.steps)
        steps = [(step, wire.decode(bytes(step.writeset if batched else raw(p.writeset))))
                 for step in link_position.steps(p.link)]
        settings = self.link_settings.get(p.link.link)
        for segment in link_segments([ws for _s, ws in steps], settings is None or settings.calls_functions):
            plans: list[tuple[link_position.Decision, Optional[Settlement]]] = []
            for step, remote in (steps[k] for k in segment):
                decision = link_position.decide(step, current)
                if decision == link_position.Decision.APPLY:
                    if not checked:
                        await self._check_link_site(step.link, query)
                        checked = True
                    plans.append((decision, Settlement(step, remote, current, p.gid, self._link_settings(step.link))))
                    current = link_position.advanced(current, step)
                else:
                    plans.append((decision, None))
                    log.info("GID %d: link %s, peer GID %d after %d, commits empty (%s; the link is at peer GID %s)",
                             p.gid, step.link, step.peer_gid, step.after, decision.value,
                             current.applied_gid if current is not None else "none")
            wanted = sorted({k for _d, plan in plans if plan is not None for k in plan.stamp_keys()})
            stamps = await query(STAMP_SQL, (wanted,)) if wanted else []
            done: list[bytes] = []
            for (decision, plan), k in zip(plans, segment):
                if plan is None:
                    step = steps[k][0]
                    done.append(link_position.final_writeset(step, None, None, decision, p.writeset.encoding))
                else:
                    plan.numbered = numbered
                    done.append(await self._settle_link(plan, stamps, query))
                    numbered += plan.conflicts
                decisions.append(decision)
            finals.append(link_position.merged(done))
            await apply(finals[-1])
        p.link_final = link_position.merged(finals)
        p.link_applied = decisions.count(link_position.Decision.APPLY)
        p.link_decision = link_position.outcome(decisions)
        return p.link_final

    async def _settle_link(self, plan: Settlement, stamps: list[tuple[Any, ...]], query: LinkQuery) -> bytes:
        """What peer transaction ``plan`` commits, given the stamps read: the rows in conflict read,
        the conflict function's calls made."""
        values: dict[bytes, Optional[tuple[wire.Value, ...]]] = {}
        for table, key, params in plan.wanted(stamps):
            found = await query(row_sql(table), params)
            values[key.hashed()] = (tuple(None if v is None else str(v).encode("utf-8") for v in found[0])
                                    if found else None)
        await decide_calls(lambda: plan.function_calls(stamps, values), plan.functions, query,
                           plan.settings.function_timeout_ms)
        final = plan.final(stamps, values)
        if plan.conflicts:
            log.warning("GID %d: link %s, peer GID %d: %d row(s) in conflict, settled (chorus.link_exceptions)",
                        plan.gid, plan.step.link, plan.step.peer_gid, plan.conflicts)
        return final

    def _link_settings(self, link: str) -> Settings:
        settings = self.link_settings.get(link)
        if settings is None:
            raise ValueError(f"this node has no [[link]] {link}: every node of the site needs it, "
                             "with the same conflict settings, to apply the link's writesets")
        return settings

    async def _check_link_site(self, link: str, query: LinkQuery) -> None:
        """This node stamps its local changes for ``link``'s site (once per link writeset)."""
        site = self._link_settings(link).site
        here = await query(SITE_SQL, ())
        if not here or here[0][0] != site:
            raise ValueError(f"chorus.link_site is {here[0][0] if here else None!r} on this node, but link "
                             f"{link} receives for site {site!r}: its local changes are not "
                             "stamped as the link's conflict windows need (docs/LINKS.md section 5)")

    @staticmethod
    async def _copy_final(step: bp.LinkWriteset, ws: wire.Writeset, current: Optional[link_position.PositionRow],
                          gid: int, site: str, subset: bool, query: LinkQuery) -> bytes:
        """What a batch of a link's re-instantiation commits (link/copy.py): its range of the
        table made the peer's copy, read in the apply's transaction, as every node reads it."""
        if current is not None and current.peer_site != step.peer_site:
            raise ValueError(f"the link's position belongs to site {current.peer_site}, its copy came from "
                             f"{step.peer_site}")
        batch = link_copy.decode(ws)
        plan = link_copy.CopyPlan(step, batch, current, gid, site, subset)
        local: list[tuple[Any, ...]] = []
        if batch.table is not None:
            sql, params = link_copy.range_sql(batch.table, batch.lower, batch.upper)
            local = await query(sql, params)
        changes = plan.diff(local)
        stamps = await query(STAMP_SQL, (plan.stamp_keys(changes),)) if changes else []
        if changes or batch.final:
            log.info("GID %d: link %s, re-instantiation at peer GID %d: %s%s", gid, step.link, batch.gid,
                     f"{batch.table.qualified}: {len(changes)} row(s) realigned" if batch.table is not None else "",
                     "the link's position moves there" if batch.final else "")
        return plan.final(changes, stamps)

    def _log_link(self, p: Pending) -> None:
        """Link writeset ``p`` committed here: its log record is what it committed (the record
        waited for this since its admission), empty if voting made it commit empty."""
        if p.skip or p.link_final is None:
            if p.link_final is not None and p.link_decision in (link_position.Decision.APPLY,
                                                                 link_position.Decision.COPY):
                p.link_decision = None  # decided, but voting had it commit empty
                p.link_applied = 0
            p.link_final = wire.empty(p.writeset.encoding)
        self.feeder.outcome(p.gid, True, p.link_final)

    def _apply_failed(self, run: list[int], e: Exception) -> None:
        """What a failed apply of ``run`` leads to: the run again, whole or in parts, or the
        failure hooks."""
        gid = run[-1]
        if isinstance(e, PartlyCommitted):
            why = partly_committed(run, self.pending.get(gid), e.committed)
            if why is not None:
                self.hooks.apply_failed(gid, f"{e}: {why}")
            else:
                log.info("GIDs %d..%d: %s; applying the rest", run[0], gid, e)
                for g in run:
                    self.scheduler.redispatch(g)
        elif isinstance(e, TransientApplyError):
            self.counters.apply_retries += 1
            log.info("retrying GID %s: %s", gid if len(run) == 1 else f"{run[0]}..{gid}", e)
            for g in run:
                self.scheduler.redispatch(g)
            if isinstance(e, ApplyConnectionLost):
                self._spawn(self.hooks.connection_lost(str(e)))
        elif isinstance(e, ApplyError):
            if len(run) > 1:  # which one fails: each is tried alone
                log.info("GIDs %d..%d failed as a run: applying them one by one (%s)", run[0], gid, e)
                for g in run:
                    self.scheduler.redispatch(g)
            else:
                self.hooks.apply_failed(gid, str(e))
        else:  # a bug: the writeset would never commit here; stop rather than stall
            msg = f"applying GID {gid} failed unexpectedly: {e!r}"
            log.error("%s; stopping", msg, exc_info=e)
            self.hooks.fatal(msg)

    def describe(self, gid: int) -> dict[str, Any]:
        p = self.pending[gid]
        return {"gid": gid, "prev": p.prev, "wait_for": p.wait_for, "origin": p.origin,
                "backend_pid": p.backend.pid if p.backend is not None else None,
                "ddl": p.writeset.has_schema, **self.scheduler.describe(gid)}

    def lag_ms(self) -> float:
        """How long the oldest certified writeset not committed here has been waiting."""
        if not self.pending:
            return 0.0
        oldest = min(p.delivered_at for p in self.pending.values())
        return round((time.monotonic() - oldest) * 1000, 1)


def partly_committed(run: list[int], last: Optional[Pending], committed: int) -> Optional[str]:
    """An apply of ``run`` (its last GID's writeset ``last``) found the GIDs up to ``committed``
    committed here already: local backends of the previous coordinator committed their certified
    GIDs while this one caught up. The run goes again, each GID in it alone if there are several
    (one committed whole is then found committed; the one the committed GIDs end in applies its
    rest: a lab node was voted out when this went to the vote); alone, without the GIDs
    committed (``last`` is trimmed to them and waits for ``committed``). Returns None when the
    run's GIDs are to be dispatched again, else why it cannot be applied here."""
    if len(run) > 1:
        return None
    gid = run[-1]
    if last is None or len(last.before_gids) != len(last.before) or committed >= gid:
        return "the committed GIDs are not the first of its run"
    if committed not in last.before_gids:
        return f"GID {committed} is not in its run"
    keep = [(g, ws) for g, ws in zip(last.before_gids, last.before) if g > committed]
    last.before, last.before_gids = tuple(ws for _, ws in keep), tuple(g for g, _ in keep)
    last.prev = last.wait_for = committed
    return None


def reschedule(book: CommitBook[Pending], scheduler: ApplyScheduler, node: str, lanes: int,
               durable: int, new: Optional[Callable[[], ApplyScheduler]] = None) -> ApplyScheduler:
    """The commit book and the scheduler as PostgreSQL came back at GID ``durable`` with ``lanes``
    commit lanes: GIDs it lost (committed, not flushed) pending again and first, everything after
    ``durable`` to be applied again (``node``'s own by replay). Returns the scheduler to use
    (a new one from ``new``, by default ``Scheduler``, when GIDs were lost)."""
    book.start(lanes, durable)
    lost = book.restart(durable)  # pending again, the lanes starting at the durable GID
    if lost:
        log.info("PostgreSQL lost GIDs %d..%d it had committed but not flushed: applying them again",
                 lost[0].gid, lost[-1].gid)
        again = {p.gid for p in lost}
        scheduler = (new or Scheduler)()
        for p in [*lost, *(p for g, p in book.pending.items() if g not in again)]:
            if p.gid in again:
                p.backend = None
            # a catch-up run holds several writesets: it is ordered by the keys of all of them (by
            # its last one's only, a later writeset on a key of its earlier ones was applied at
            # once, took the row, then waited for its turn, while the run waited for the row: a
            # lab node stalled so after its PostgreSQL was killed)
            scheduler.add(p.gid, [k for ws in p.run() for k in order_keys(ws)],
                          local=p.origin == node and not p.before, barrier=p.writeset.has_schema)
    else:
        scheduler.committed_upto(durable)
    replays = scheduler.replay_all_from(durable)
    log.info("PostgreSQL is back at GID %d; re-applying %d certified writesets", durable, len(replays))
    return scheduler


def raw(ws: wire.Writeset) -> bytes:
    """A writeset's bytes, as received or encoded anew."""
    return ws.raw or wire.encode(ws)


def link_segments(remotes: list[wire.Writeset], alone: bool) -> list[list[int]]:
    """A batch's transactions (their writesets, in order) cut into runs that read and apply
    together (docs/LINKS.md section 3.1): the transactions of a run touch keys apart, so none
    reads what another of its run writes (its rows, their stamps); one that certifies a table
    whole is a run of its own, and with ``alone`` (a conflict function, whose calls may read
    anything) each is."""
    out: list[list[int]] = []
    seen: set[bytes] = set()
    closed = True
    for i, ws in enumerate(remotes):
        keys = {k.hashed() for k in ws.keys}
        whole = any(len(k.parts) <= 2 for k in ws.keys)
        if closed or whole or keys & seen:
            out.append([i])
            seen = keys
        else:
            out[-1].append(i)
            seen |= keys
        closed = alone or whole
    return out


def order_keys(ws: wire.Writeset) -> list[tuple[bytes, wire.KeyMode]]:
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
            keys.append((_table_order_key(t), wire.KeyMode.EXCLUSIVE if changes else wire.KeyMode.REFERENCE))
    return keys


@functools.lru_cache(maxsize=4096)
def _table_order_key(t: wire.Table) -> bytes:
    return wire.key_hash((b"", t.nspname.encode("utf-8", "surrogateescape"),
                          t.relname.encode("utf-8", "surrogateescape")))
