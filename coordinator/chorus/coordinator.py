"""The coordinator daemon: one beside each postmaster (``chorus run --config FILE``).

Thin I/O around the pure parts (docs/ARCHITECTURE.md). This module is the daemon loop: it starts
the parts and wires them, feeds bus events to the :class:`~chorus.replicator.Replicator` and
carries out the actions it returns, ticks, answers the admin socket and stops. The parts, each
in its own module, know one another only through what they are given here:

- nodedb.py: the coordinator's database connection; bus/sender.py: sending on the bus;
- commit/backends.py: the backends' socket; commit/causal.py: causal-read markers;
- commit/pipeline.py: certified writesets from admission to commit (the apply pool);
- voting.py: inconsistency voting; lockwatch.py: aborting local sessions in an applier's way;
- catchup.py: partial recovery; nodestatus.py: what the node reports.

Database errors and bus errors are handled in separate places; :class:`FatalError` stops the
daemon, anything else is logged and survived.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import time
import uuid
from typing import Any, Awaitable, Callable, Coroutine, Optional

import psycopg

from chorus import admin
from chorus import recovery as rc
from chorus import certifier, outcomes, wire
from chorus.bus import proto as bp
from chorus.bus import Bus, BusError, View
from chorus.bus.sender import BusSender
from chorus.catchup import CatchUpRunner
from chorus.commit.causal import CausalReads
from chorus.commit import scheduler
from chorus.commit.backends import BackendServer
from chorus.commit.book import FlowControl
from chorus.commit.pipeline import CommitPipeline, Hooks, Pending, raw
from chorus.concurrent import ConcurrentSchemaChanges
from chorus.dataplane import native
from chorus.config import NodeConfig, link_settings, old_columns_setting
from chorus.endpoints import Endpoints
from chorus.link.proto import LinkError
from chorus.link.site import SiteLinks
from chorus.lockwatch import watch_blockers
from chorus.nodedb import DB_RETRY_S, DatabaseFatal, NodeDatabase, NodeStart
from chorus import nodestatus
from chorus.nodestatus import Counters, NodeStatus
from chorus.actions import (Action, Apply, CatchUp, DdlOutcome, Joined, LinkPinned, LocalVerdict, LogOffered,
                            LogQueried, Pause, Phase, PhaseChange, Reconfigure, Reconfigured, Remember, Removed, Send,
                            SyncReached, VoteDecided, VoteOpened)
from chorus.membership import Holding
from chorus.replicator import Replicator
from chorus.spool import Spool
from chorus.state import NodeState, load_state, save_state
from chorus.voting import InconsistencyVoting
from chorus.wslog import LogError, LogFeeder, WritesetLog, starts_again

log = logging.getLogger("chorus.coordinator")

TICK_S = 0.2
REAPPLY_POLL_S = 0.02  # how often writes waiting for a restarted PostgreSQL to re-apply look again
PROGRESS_EVERY_S = 1.0
LINK_STATUS_EVERY_S = 1.0  # how often the links' durable rows and conflict counts are read for status


class FatalError(Exception):
    """Stops the daemon."""



def hot_path_impl() -> str:
    """Which implementation the hot path runs (CHORUS_IMPL): "c" or "python" when its parts agree
    (the writeset reader, the certification index, the scheduler, the order core), else each part's."""
    parts = {"reader": wire.IMPL, "certifier": certifier.IMPL, "scheduler": scheduler.IMPL, "order": native.IMPL}
    if len(set(parts.values())) == 1:
        return wire.IMPL
    return ",".join(f"{k}={v}" for k, v in parts.items())

class Coordinator:
    def __init__(self, cfg: NodeConfig, bus_factory: Callable[[], Bus], event_loop: str = "asyncio") -> None:
        self.cfg = cfg
        self.event_loop = event_loop  # which asyncio loop runs it (eventloop.py), for status
        self.bus_factory = bus_factory
        self.bus: Optional[Bus] = None
        self.state: NodeState = load_state(cfg.state_file, cfg.name)
        self.replicator: Optional[Replicator] = None
        self.counters = Counters()
        self.stopping = asyncio.Event()
        self.fatal: Optional[str] = None
        self.phase_reason = "starting"
        self.started = time.time()
        self.compat = ""  # the database's encoding and PostgreSQL major version
        self._max_committed = 0  # the highest GID the database had committed at start
        self._tasks: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[Any]] = set()  # the loop keeps only weak references
        self._configuring: dict[str, asyncio.Future[Reconfigured]] = {}  # chorus node add/remove, by request id
        self._servers: list[asyncio.base_events.Server] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # kept once running: see _spawn
        self._pause_wanted = False  # flow control: whether writes here should wait (the replicator's Pause)
        self._paused_told = False  # what the extension was last told

        self.db = NodeDatabase(cfg.dsn, cfg.name)
        self.wslog = WritesetLog(cfg.wslog_dir, cfg.log_segment_mb << 20, cfg.log_total_mb << 20)
        self.spool = Spool(cfg.spool_dir)
        self.feeder = LogFeeder(self.wslog)
        self.keys = (rc.ClusterKeys(cfg.tls_cert, cfg.tls_key, cfg.secret_file)
                     if cfg.tls_cert and cfg.tls_key and cfg.secret_file else None)
        self.recovery_server: Optional[rc.RecoveryServer] = None
        self.concurrent = ConcurrentSchemaChanges(cfg.dsn, cfg.name)
        self.flow = FlowControl(cfg.flow_pause_at, cfg.flow_resume_at)
        self.sender = BusSender(cfg.name, self._spawn, self._batch_failed)
        send = self.sender.send
        self.voting = InconsistencyVoting(
            cfg.name, send, decided=self._decided, watermark=lambda: self.pipeline.watermark,
            commit_skipped=self._commit_skipped,
            leave=self._leave)
        self.pipeline = CommitPipeline(
            cfg.name, cfg.dsn, cfg.apply_workers, cfg.apply_run, self.concurrent, self.feeder, self.db,
            self.counters, send, self._spawn,
            Hooks(committed_here=self.voting.committed_here, apply_failed=self.voting.apply_failed,
                  tell_backend=lambda p, ok, failure: BackendServer.settled(p, ok, failure),
                  connection_lost=self._check_database, fatal=self._fail, backlog_changed=self._flow_check,
                  link_committed=self._link_committed),
            self.spool)
        self.pipeline.link_settings = {link.name: link_settings(link, cfg.links) for link in cfg.links}
        # a site that receives a link stamps its rows, each with its own GID (extension/chorus_stamp.c):
        # one writeset per apply transaction, in the pipeline and in catch-up
        self.stamps_rows = any(link.peers for link in cfg.links)
        if self.stamps_rows:
            self.pipeline.stamp_rows()
        self.causal = CausalReads(cfg.name, send)
        self.backends = BackendServer(
            cfg.name, self.wslog.max_payload(cfg.name), self.counters, self.pipeline, self.sender, self.causal,
            refusal=self._refusal, expect=self._expect_local, stale=self._stale_local)
        self.catchup: Optional[CatchUpRunner] = None  # once the replicator exists
        # [[link]]: this node's part in its site's links to other sites (docs/LINKS.md)
        self.links = (SiteLinks(cfg.name, cfg.links, self.wslog, lambda: self.pipeline.watermark, send,
                                self.db.q_all, self.spool, cfg.dsn, self._bus_version) if cfg.links else None)
        self.endpoints: Optional[Endpoints] = None  # [metrics] listen

    # ---- start and stop -----------------------------------------------------------------

    async def run(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        if self.cfg.metrics_listen:  # first: health checks answer (503) while the node starts
            self.endpoints = Endpoints(self.status, self.stopping.is_set, self.db.ok.is_set)
            try:
                await self.endpoints.start(self.cfg.metrics_listen)
            except OSError as e:
                raise FatalError(f"cannot listen on metrics.listen {self.cfg.metrics_listen}: {e}") from e
            log.info("metrics and health checks on http://%s/", self.cfg.metrics_listen)
        try:
            await self._run(loop)
        finally:
            if self.endpoints is not None:
                await self.endpoints.close()

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.state.left_by_vote:
            raise FatalError(f"this node left its cluster by an inconsistency vote ({self.state.left_by_vote}); "
                             "it starts again only once total recovery has rebuilt it")
        if self.state.removed:
            raise FatalError(f"{self.state.removed} (then `chorus node join --total` rebuilds it)")
        await self._connect_db()
        start = await self._start_node()
        durable = start.committed
        self.pipeline.book.start(start.lanes, durable)
        if self.state.cluster_uuid and durable != self.state.last_gid:
            log.info("database is at GID %d (state file said %d)", durable, self.state.last_gid)
        self._open_log(durable)
        r = self.replicator = Replicator(
            node=self.cfg.name,
            cluster_uuid=self.state.cluster_uuid,
            last_gid=durable,
            max_committed=self._max_committed,
            bootstrap=self.state.bootstrap,  # only when told (`chorus bootstrap`; seed 8.2)
            compat=self.compat,
            member_votes=self.cfg.bus_members,
            epochs=self.state.epochs,
            records=dict(self.state.records),
            holding=self._holding,
            config=self.state.config,
        )
        self.sender.version = lambda: r.send_version
        batch = 1 if self.stamps_rows else self.cfg.catchup_batch
        self.catchup = CatchUpRunner(self.cfg.name, r, self.pipeline, self.feeder, self.keys,
                                     self.cfg.recovery_partners, batch, self.sender.send,
                                     self._act, self.stopping, lambda: self.fatal is not None, self.spool)
        self._servers.append(await _unix_server(
            self.cfg.socket_path, lambda p: loop.create_unix_server(self.backends.protocol, path=p)))
        self._servers.append(await _unix_server(
            self.cfg.admin_socket, lambda p: asyncio.start_unix_server(self._serve_admin, path=p)))
        if self.cfg.recovery_listen and self.keys is not None:
            self.recovery_server = rc.RecoveryServer(self.wslog, self.keys, lambda: r.cluster_uuid,
                                                     lambda: self.pipeline.watermark)
            await self.recovery_server.start(self.cfg.recovery_listen)
            log.info("recovery server listening on %s", self.cfg.recovery_listen)
        if self.links is not None:
            try:
                await self.links.start()
            except (OSError, LinkError) as e:
                raise FatalError(f"cannot serve a link: {e}") from e
        self.bus = self.bus_factory()
        self.bus.use_spool(self.spool)
        self.backends.spool = self.spool
        self.backends.info = functools.partial(nodestatus.info, s=self.status, conflicts=self._conflicts,
                                               outcome=self._outcome)
        self.sender.attach(self.bus, loop)
        await self.bus.join()
        log.info("node %s joined bus group as %s", self.cfg.name, self.bus.local_id)
        self._tasks = [
            asyncio.create_task(self._bus_loop(), name="bus"),
            asyncio.create_task(self._tick_loop(), name="tick"),
            asyncio.create_task(watch_blockers(self.db, self.pipeline, self.concurrent, self.counters,
                                               self.cfg.idle_blocker_grace_ms / 1000), name="blockers"),
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
        await self.db.set_online(False, "Its coordinator is shutting down")
        for s in self._servers:
            s.close()
        pipeline = self.pipeline
        deadline = time.monotonic() + 10
        # what was certified when the shutdown began commits first; not what the others go on
        # sending meanwhile (under a steady load the pipeline is never idle: waiting for that
        # held every stop for the whole 10 s)
        target = self.replicator.last_certified if self.replicator is not None else 0
        while (pipeline.scheduler.queued or pipeline.busy) and pipeline.watermark < target \
                and time.monotonic() < deadline and self.db.ok.is_set() and not self.fatal:
            await asyncio.sleep(0.05)
        r = self.replicator
        last = pipeline.watermark
        try:
            last = await self.db.committed_gid()
            if pipeline.book.lanes > 1 and not pipeline.pending and self.db.ok.is_set() \
                    and not await self.db.q("SELECT chorus.settle_lanes()"):
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
        if self.links is not None:
            await self.links.close()
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
        await pipeline.close()
        await self.db.close()
        for path in (self.cfg.socket_path, self.cfg.admin_socket):
            try:
                os.unlink(path)
            except OSError:
                pass

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: Optional[str] = None) -> asyncio.Task[Any]:
        """Start a background task and keep it referenced until it ends (an unreferenced
        pending task can be garbage-collected mid-flight: found with a catch-up that vanished)."""
        # on the loop kept at start: asyncio.create_task looks it up, a getpid() system call in 3.11
        loop = self._loop or asyncio.get_running_loop()
        task = loop.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _fail(self, why: str) -> None:
        """A bug: a writeset would never commit here. Stop rather than stall."""
        self.fatal = why
        self.stopping.set()

    def _removed(self, why: str) -> None:
        """This node is not one of the cluster's configured nodes any more (or was never added):
        it stops, and does not start again until it is added back (confchange.py)."""
        self._stop_for_good(why, "the removal", removed=why)

    def _stop_for_good(self, why: str, what: str, **recorded: str) -> None:
        """Stop, with ``recorded`` written to the state file first so the node does not start again."""
        if self.fatal:
            return
        self.fatal = why
        log.error("%s", why)
        try:
            self.state = self.state.with_(**recorded)
            save_state(self.cfg.state_file, self.state)
        except OSError as e:
            log.error("cannot record %s in the state file: %s", what, e)
        self.stopping.set()

    async def _configure(self, req: dict[str, Any]) -> dict[str, Any]:
        """``chorus node add``/``remove``: send the new configured nodes through the total order
        and wait until they are applied (or refused) there."""
        r = self.replicator
        if r is None or r.phase != Phase.ONLINE or not r.quorate:
            return {"ok": False, "error": f"this node is {r.phase.value if r else 'starting'}, not online in the "
                                          "primary component: ask an online node"}
        if r.membership.version < 4:
            return {"ok": False, "error": f"the cluster runs bus protocol version {r.membership.version}: a member of a "
                                          "release before is in it, and it could not switch with the others; finish "
                                          "the rolling upgrade first (docs/DEPLOY.md section 8)"}
        nodes, version, ids = req.get("nodes"), req.get("version"), req.get("ids", {})
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes) or not isinstance(version, int):
            return {"ok": False, "error": "configure needs nodes (a list of names) and version (a number)"}
        if not isinstance(ids, dict) or not all(isinstance(n, str) and isinstance(i, (str, int))
                                                for n, i in ids.items()):
            return {"ok": False, "error": "configure's ids are an object: node name -> its Corosync node id"}
        request_id = uuid.uuid4().hex
        waiter: asyncio.Future[Reconfigured] = asyncio.get_running_loop().create_future()
        self._configuring[request_id] = waiter
        self.sender.send(bp.Configure(self.cfg.name, request_id, version, tuple(nodes), str(req.get("tie_breaker", "")),
                                      tuple(sorted((n, str(i)) for n, i in ids.items() if n in nodes))))
        try:
            done = await asyncio.wait_for(waiter, float(req.get("timeout", 20)))
        except asyncio.TimeoutError:
            return {"ok": False, "error": "the change did not come back through the bus in time (the node may have "
                                          "left the primary component): look at `chorus status` before trying again"}
        finally:
            self._configuring.pop(request_id, None)
        return {"ok": done.ok, "error": done.reason} if not done.ok else {"ok": True, "result": done.reason}

    def _commit_skipped(self, gid: int) -> None:
        """Voting decided that GID ``gid`` commits here without its changes."""
        self._spawn(self.pipeline.commit_skipped(gid), name=f"skip {gid}")

    def _leave(self, why: str) -> None:
        """This node's data differs from the majority's: stop taking part, and do not start
        again with data the cluster does not have."""
        self._stop_for_good(why, "the vote", left_by_vote=why)

    # ---- the database -------------------------------------------------------------------

    async def _connect_db(self) -> None:
        try:
            await self.db.connect(self.stopping)
        except DatabaseFatal as e:
            raise FatalError(str(e)) from e

    async def _start_node(self) -> NodeStart:
        sites = sorted({link.site for link in self.cfg.links if link.peers})
        if len(sites) > 1:
            raise FatalError(f"this node's links receive for more than one site ({', '.join(sites)}): "
                             "a node belongs to one site")
        try:
            await self.db.settle_settings({"chorus.link_site": sites[0] if sites else "",
                                           "chorus.link_old_columns": old_columns_setting(self.cfg.links)})
            start = await self.db.start_node(self.cfg.commit_lanes)
        except DatabaseFatal as e:
            raise FatalError(str(e)) from e
        self.compat = start.compat
        self._max_committed = start.max_committed
        if self.replicator is not None:
            self.replicator.max_committed = start.max_committed
        return start

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
        try:
            self.spool.open()
        except OSError as e:
            raise FatalError(f"cannot use the spool directory {self.spool.directory}: {e}") from e
        if starts_again(self.wslog.base_gid, self.wslog.end_gid, committed):
            if self.wslog.end_gid:
                log.warning("the writeset log ends at GID %d but the database has committed GID %d (the "
                            "log's unsynced tail was lost): starting the log again after GID %d",
                            self.wslog.end_gid, committed, committed)
            self.wslog.reset(committed)

    async def _check_database(self, why: str) -> None:
        """An apply session lost its connection: if only that session ended (terminated by an
        administrator, say) its writeset is simply retried; if PostgreSQL went away, recover."""
        if not await self.db.alive():
            await self._database_lost(why)

    async def _database_lost(self, why: str) -> None:
        """PostgreSQL restarted or vanished: reconnect, re-read the durable GID, re-apply."""
        if not self.db.ok.is_set():
            return
        self.db.ok.clear()
        log.warning("lost PostgreSQL (%s); reconnecting", why)
        await self.db.close()
        while not self.stopping.is_set():
            await self._connect_db()
            try:
                start = await self._start_node()
                break
            except psycopg.Error as e:
                log.warning("re-initialising after restart: %s", str(e).strip())
                await asyncio.sleep(DB_RETRY_S)
        else:
            return
        await self.pipeline.restart(start.lanes, start.committed)
        self.pipeline.dispatch()
        if self.replicator is not None and self.replicator.accepts_writes:
            await self._reapplied()
            if self.replicator.accepts_writes and self.db.ok.is_set():
                await self.db.set_online(True)

    async def _reapplied(self) -> None:
        """Wait until PostgreSQL, back after a restart, has committed again every certified GID
        (this node's own ones too, whose sessions died with it: they are applied from their
        writesets) and this node's writesets still on the bus are settled. Writes stay refused
        until then: a local transaction that ran meanwhile could change their rows as they were
        before them, and certification does not compare writesets of one node (their sessions
        order them by row locks) — found by the lab (a bank transfer's debit lost after a
        PostgreSQL kill, seed 20)."""
        r = self.replicator
        assert r is not None
        # Once none of this node's writesets is on the bus (it takes none while writes are
        # refused), the GIDs certified so far hold all of its own: the others' GIDs certified
        # later are certified against local transactions as always, so the target stays put
        # (under the others' load the watermark never catches up with a moving one).
        target: Optional[int] = None
        while not self.stopping.is_set() and r.accepts_writes and self.db.ok.is_set():
            if target is None and not r.local_in_flight():
                target = r.last_certified
                log.info("writes wait until the certified writesets up to GID %d are committed again", target)
            if target is not None and self.pipeline.book.watermark >= target:
                return
            await asyncio.sleep(REAPPLY_POLL_S)

    # ---- the bus and the replicator's actions ---------------------------------------------

    async def _bus_loop(self) -> None:
        assert self.bus is not None and self.replicator is not None
        r = self.replicator
        local = self.bus.local_id
        counters = self.counters
        try:
            async for batch in self.bus.batches():
                for ev in batch:
                    if isinstance(ev, View):
                        log.info("view %d: members %s, joined %s, left %s, quorate %s",
                                 ev.view_id, ev.members, ev.joined, ev.left, ev.quorate)
                        actions = r.on_view(ev, time.monotonic())
                        self.sender.view_changed()
                        self.causal.view_changed()
                    else:
                        counters.bus_messages_received += 1
                        counters.bus_bytes_received += len(ev.payload)
                        actions = r.on_delivery(ev)
                        if ev.sender == local:
                            self._lost(self.sender.delivered_own(ev.payload))
                    await self._act(actions)
                self.feeder.flush()  # the log records of this batch, in one write
                if self.sender.outbox:
                    self.sender.pump()
        except BusError as e:
            self.fatal = f"bus failed: {e}"
            raise

    async def _act(self, actions: list[Action]) -> None:
        r = self.replicator
        catchup = self.catchup
        for a in actions:
            if isinstance(a, Pause):
                self._pause_wanted = a.paused
            elif isinstance(a, LocalVerdict):
                self.backends.verdict(a)
            elif isinstance(a, (Apply, DdlOutcome)) and catchup is not None and catchup.hold(a):
                # after the catch-up range: held until it is applied
                if a.settle:  # a schema change that waits for every node's report: this one
                    # applies it only once caught up, and reports now (docs/SECURITY.md)
                    self.sender.send(bp.Vote(self.cfg.name, a.gid, True, "catching up: applies it later"))
            elif isinstance(a, Apply):
                self.pipeline.admit(Pending(a.gid, a.prev, a.origin, a.writeset, settle=a.settle, link=a.link,
                                            commit_time=a.link.commit_time if a.link is not None else a.commit_time),
                                    local=False)
                self.pipeline.dispatch_soon()
            elif isinstance(a, DdlOutcome):
                if not a.settle:  # (a settled one is logged once every node has reported)
                    self.feeder.outcome(a.gid, a.ok, raw(a.content) if a.content is not None else b"")
                self.pipeline.ddl_outcome(a, functools.partial(BackendServer.ddl_outcome, ok=a.ok, error=a.error))
            elif isinstance(a, CatchUp):
                assert catchup is not None
                self._spawn(catchup.start(a), name="catch-up")  # holds the live stream from here
            elif isinstance(a, LogQueried):
                self._answer_log_query(a)
            elif isinstance(a, LogOffered):
                if catchup is not None:
                    catchup.offered(a.info)
            elif isinstance(a, SyncReached):
                self.causal.reached(a)
            elif isinstance(a, VoteOpened):
                self.voting.opened(a.gid)
            elif isinstance(a, VoteDecided) and a.schema:
                self.pipeline.settled(a.gid, a.ok, a.failure)
            elif isinstance(a, VoteDecided):
                self.voting.decided(a)
            elif isinstance(a, Send):
                self.sender.send(a.message, a.version)
            elif isinstance(a, PhaseChange):
                self.phase_reason = a.reason
                log.info("phase %s: %s", a.phase.value, a.reason)
                if a.phase in (Phase.RECOVERING, Phase.ONLINE):
                    self.voting.rejoined()
                await self.db.set_online(a.phase == Phase.ONLINE and r is not None and r.accepts_writes,
                                         f"Phase {a.phase.value}: {a.reason}")
            elif isinstance(a, Remember):
                # before anything after it: a re-form trusts what the state file says (history.py)
                self.state = self.state.with_(epochs=a.epochs, records=dict(a.records))
                save_state(self.cfg.state_file, self.state)
            elif isinstance(a, Reconfigure):
                # before anything after it: a restart counts votes from the new configured nodes
                self.state = self.state.with_(config=a.config)
                save_state(self.cfg.state_file, self.state)
            elif isinstance(a, Reconfigured):
                waiter = self._configuring.pop(a.request_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(a)
            elif isinstance(a, Removed):
                self._removed(a.reason)
            elif isinstance(a, LinkPinned):
                if self.links is not None:
                    self.links.pinned(a.node, a.link, a.gid)
            elif isinstance(a, Joined):
                self.state = self.state.with_(cluster_uuid=a.cluster_uuid, bootstrap=False,
                                              safe_to_bootstrap=False, last_gid=a.gid)
                save_state(self.cfg.state_file, self.state)
        if self._pause_wanted != self._paused_told and self.db.ok.is_set():
            self._paused_told = self._pause_wanted
            self._spawn(self.db.q_logged("SELECT chorus.set_paused(%s)", (self._paused_told,)))

    async def _tick_loop(self) -> None:
        assert self.replicator is not None
        last_progress = last_links = 0.0
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            await self._act(self.replicator.tick(now))
            self.feeder.flush()
            if not self.db.ok.is_set():
                continue
            try:
                wm = await self.db.committed_gid()
                self.pipeline.book.advance(wm)
                self.pipeline.reap_committed(wm)
                self.voting.check_due()
                self.pipeline.flushed(await self.db.durable_gid())
            except psycopg.Error as e:
                self._spawn(self._database_lost(str(e).strip()))
                continue
            if self.links is not None:
                r = self.replicator
                self.links.membership(r.synced & set(r.online), r.phase == Phase.ONLINE and r.accepts_writes)
                if now - last_links >= LINK_STATUS_EVERY_S:
                    last_links = now
                    try:
                        await self.links.refresh()
                    except psycopg.Error as e:  # a node whose extension predates links, or a lost connection
                        log.debug("reading the links' positions: %s", e)
            if now - last_progress >= PROGRESS_EVERY_S:
                last_progress = now
                msg = self.replicator.progress_message(self.pipeline.watermark)
                if msg is not None:
                    await self._act([msg])
                self._flow_reassert()

    # ---- what the parts ask of the daemon ------------------------------------------------

    def _decided(self, gid: int) -> Optional[bool]:
        """The cluster's decision on GID ``gid``, if any: an inconsistency vote's, or a schema
        change's settled by every node's report (a node that applies a committed schema change
        late, after its catch-up, and fails is on the losing side of it)."""
        r = self.replicator
        if r is None:
            return None
        return r.decided.get(gid, r.settled.get(gid))

    def _bus_version(self) -> int:
        """The site's bus version (0: not in a primary component)."""
        return self.replicator.cluster_version if self.replicator is not None else 0

    def _link_committed(self, p: Pending) -> None:
        """A link writeset committed here: this node's receiver of its link waits for it."""
        if self.links is not None and p.link is not None:
            self.links.committed(p.link, p.link_decision, p.link_applied)

    def _refusal(self) -> Optional[str]:
        """Why this node takes no writes now, or None if it does."""
        r = self.replicator
        if r is None:
            return "the coordinator is starting"
        if not r.accepts_writes or not self.db.ok.is_set():
            return self.phase_reason
        return None

    def _stale_local(self, last_seen: int) -> Optional[str]:
        r = self.replicator
        return r.stale_local(last_seen) if r is not None else None

    def _expect_local(self, ticket: int, writeset: wire.Writeset) -> None:
        assert self.replicator is not None
        self.replicator.expect_local(ticket, writeset)

    def _lost(self, tickets: list[int]) -> None:
        """Local writesets whose messages the bus lost at a view change (bus.sender.OwnMessages):
        the primary component may have committed them; their backends hear that the outcome is
        unknown (SQLSTATE 08007), as when the node leaves the primary component."""
        for ticket in tickets:
            assert self.replicator is not None
            self.replicator.forget_local(ticket)
            self.backends.verdict(LocalVerdict(
                ticket, False, 0, 0, "the bus lost this transaction's writeset at a membership change: whether it "
                "committed is decided by the primary component (chorus.commit_outcome tells)", None, unknown=True))

    def _batch_failed(self, tickets: list[int], e: BusError) -> None:
        if self.replicator is not None:
            for ticket in tickets:
                self.replicator.forget_local(ticket)
        self.backends.batch_failed(tickets, e)

    def _flow_check(self) -> None:
        if self.catchup is not None and self.catchup.held is not None:
            return  # streaming a catch-up: the cluster need not wait for that (Galera's joiner)
        request = self.flow.check(len(self.pipeline.pending))
        if request is not None:
            self.sender.send(bp.FlowControl(self.cfg.name, request))

    def _flow_reassert(self) -> None:
        r = self.replicator
        if r is None or r.phase != Phase.ONLINE:
            return
        again = self.flow.reassert(self.cfg.name in r.paused_by)
        if again is not None:
            self.sender.send(bp.FlowControl(self.cfg.name, again))

    def _answer_log_query(self, q: LogQueried) -> None:
        """A recovering member asks whose log holds what (the donor side of catch-up). Every
        member answers, with no address if it runs no recovery server: the asker concludes that
        no log holds its range only once every member has answered."""
        if q.node == self.cfg.name:
            return
        address = (self.cfg.recovery_advertise or self.cfg.recovery_listen) if self.recovery_server is not None else ""
        self.sender.send(bp.LogInfo(q.node, q.request_id, self.cfg.name, address, self.wslog.base_gid,
                                    self.wslog.end_gid, self.pipeline.watermark, len(self.pipeline.pending)))

    def _holding(self) -> Holding:
        """What this node holds, for its GID requests: the GID its database holds or will once
        what it admitted commits, and its writeset log's range."""
        try:
            after, high = self.wslog.base_gid, self.wslog.end_gid
        except LogError:
            after = high = 0
        return Holding(max(self.pipeline.watermark, self.pipeline.book.admitted), after, high)

    # ---- admin --------------------------------------------------------------------------

    def status(self) -> NodeStatus:
        r, p, c = self.replicator, self.pipeline, self.counters
        phase = "failed" if self.fatal else r.phase.value if r is not None else "starting"
        return NodeStatus(
            node=self.cfg.name,
            state=phase,
            reason=self.fatal or self.phase_reason,
            accepts_writes=bool(r and r.accepts_writes and self.db.ok.is_set()),
            cluster_uuid=r.cluster_uuid if r else self.state.cluster_uuid,
            bus_member=self.bus.local_id if self.bus else "",
            members=sorted(r.online) if r else [],
            member_committed_gid={n: r.progress[n] for n in sorted(r.online) if n in r.progress} if r else {},
            bus_members=list(r.members) if r else [],
            bus_version=r.cluster_version if r else 0,
            bus_versions=list(r.membership.own) if r else list(bp.SPEAKS),
            member_bus_versions={n: list(r.membership.speaks.get(n, bp.LEGACY)) for n in sorted(r.online)} if r else {},
            quorate=bool(r and r.quorate),
            quorum_votes=r.votes.quorum if r else 0,
            tie_breaker=r.votes.tie_breaker if r else "",
            config_version=r.config.version if r and r.config else 0,
            configured_nodes=list(r.config.nodes) if r and r.config else [],
            configured_ids=dict(r.config.ids) if r and r.config else {},
            configured_votes=(r.member_votes or r.votes.expected) if r else 0,
            released_gid=r.released if r else 0,
            held_for_quorum=r.held_count if r else 0,
            committed_gid=p.watermark,
            delivered_gid=r.gid if r else 0,
            certified_gid=r.last_certified if r else 0,
            lag_gids=max(0, r.last_certified - p.watermark) if r else 0,
            lag_ms=p.lag_ms(),
            local_commits=c.local_commits,
            certification_failures=r.stats.cert_failures if r else 0,
            local_certification_failures=r.stats.local_failed if r else 0,
            certification_failures_by_table=dict(r.stats.failures_by_table) if r else {},
            applied=c.applied,
            apply_transactions=c.apply_transactions,
            replayed=c.replayed,
            apply_retries=c.apply_retries,
            apply_queue=p.scheduler.queued,
            send_queue=len(self.sender.outbox),
            flow_control={"requested_by_this_node": self.flow.requested,
                          "paused_by": sorted(r.paused_by) if r else []},
            pending=len(p.pending),
            pending_head=[p.describe(g) for g in sorted(p.pending)[:5]],
            workers=len(p.workers),
            commit_lanes=p.book.lanes,
            workers_busy=p.busy,
            max_workers_busy=c.max_workers_busy,
            overlapped_applies=c.overlapped_applies,
            already_committed=c.already_committed,
            last_apply_ms=round(p.last_apply_ms, 3),
            certification_index_keys=len(r.certifier) if r else 0,
            certification_horizon=r.certifier.horizon if r else 0,
            refused=c.refused,
            local_aborts_for_appliers=c.local_aborts,
            malformed_frames=c.malformed_frames,
            bus_batches=self.sender.batches,
            bus_writesets=self.sender.writesets,
            bus_messages_sent=self.sender.messages,
            bus_bytes_sent=self.sender.bytes,
            bus_messages_received=c.bus_messages_received,
            bus_bytes_received=c.bus_bytes_received,
            uptime_s=round(time.time() - self.started, 1),
            event_loop=self.event_loop,
            impl=hot_path_impl(),
            recovery=self.catchup.status() if self.catchup is not None else None,
            concurrent_index_changes=self.concurrent.as_dict(),
            writeset_log={"low_gid": self.wslog.low_gid, "high_gid": self.wslog.high_gid,
                          "holds_after_gid": self.wslog.base_gid,
                          "waiting_for_schema_outcome": self.feeder.waiting, **self._log_size()},
            synced_members=sorted(r.synced & set(r.online)) if r else [],
            epochs=[[e.number, e.start, e.node] for e in (r.epochs if r else self.state.epochs)],
            reform=({"reason": r.reform.reason,
                     "waiting_for": [{"node": n, "why": why} for n, why in r.reform.waiting_for]}
                    if r is not None and r.reform is not None and r.phase not in (Phase.ONLINE, Phase.RECOVERING)
                    else None),
            links=self.links.status() if self.links is not None else [],
        )

    def _outcome(self, xid: int, began: int, origin_db_status: str, origin: str) -> dict[str, Any]:
        """chorus.commit_outcome: what became of transaction ``xid`` of node ``origin`` (outcomes.py)."""
        r = self.replicator
        if r is None:
            return {"outcome": "in doubt", "gid": None, "detail": "this node's coordinator is starting"}
        low = xid & 0xFFFFFFFF
        in_flight = origin == self.cfg.name and any(
            ws.xid == low for ws in r.local_in_flight())
        phase = "online" if r.accepts_writes and self.db.ok.is_set() else r.phase.value
        return outcomes.lookup(r.outcomes, origin, xid, began, this_node=self.cfg.name, phase=phase,
                               online=set(r.online), committed_here=self.pipeline.watermark,
                               origin_db_status=origin_db_status if origin == self.cfg.name else "",
                               in_flight=in_flight)

    def _conflicts(self) -> list[dict[str, Any]]:
        """The certification failures the replicator remembers, oldest first."""
        return [c.as_dict() for c in self.replicator.conflicts] if self.replicator is not None else []

    def _log_size(self) -> dict[str, int]:
        try:
            st = self.wslog.stats()
        except LogError:  # not open (yet, or any more)
            return {}
        return {"segments": st["segments"], "bytes": st["segments"] * st["segment_bytes"],
                "bytes_used": st["bytes_used"]}

    async def _serve_admin(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await admin.serve(reader, writer, self._admin_answer)

    async def _admin_answer(self, cmd: str, req: dict[str, Any]) -> dict[str, Any]:
        """The answer to one admin request (chorus/admin.py)."""
        if cmd == "status":
            return {"ok": True, "status": self.status().as_dict()}
        if cmd == "views":  # what the extension's views show (chorus status, chorus local status)
            st = self.status()
            recent = int(req.get("conflicts", 20))
            return {"ok": True, "node": nodestatus.node_view(st), "members": nodestatus.members_view(st),
                    "conflicts": self._conflicts()[-recent:] if recent > 0 else []}
        if cmd == "links":  # chorus link status
            return {"ok": True, "node": self.cfg.name, "links": self.links.status() if self.links is not None else []}
        if cmd == "link-reinstantiate":  # chorus link reinstantiate (docs/LINKS.md section 10)
            name = req.get("link")
            if self.links is None or not isinstance(name, str):
                return {"ok": False, "error": "this node has no links" if self.links is None else "which link?"}
            if req.get("poll"):
                copy = self.links.copies.get(name)
                return copy.report() if copy is not None else {"ok": False, "error": f"no re-instantiation of {name} here"}
            try:
                return await self.links.reinstantiate(name, bool(req.get("force")))
            except ValueError as e:
                return {"ok": False, "error": str(e)}
            except Exception as e:  # the position could not be read: said
                return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        if cmd == "settled":
            # verify: has this node committed every writeset it certified up to GID upto?
            upto = int(req.get("upto", 0))
            return {"ok": True, "settled": self.replicator is not None and self.pipeline.book.settled(upto)}
        if cmd in ("stop", "leave"):
            self.stopping.set()
            return {"ok": True}
        if cmd == "configure":
            return await self._configure(req)
        if cmd == "recover":
            r = self.replicator
            if r is None or r.phase in (Phase.ONLINE, Phase.RECOVERING):
                return {"ok": False, "error": f"the node is {r.phase.value if r else 'starting'}"}
            await self._act(r.rejoin(await self.db.committed_gid(), time.monotonic()))
            return {"ok": True}
        return {"ok": False, "error": f"unknown admin command {cmd!r}"}


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
