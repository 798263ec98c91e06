"""The reference core as it is wired today, behind the event and action boundary of
``events.py``: the replicator, the commit book, the scheduler, the certifier and the log feeder,
wired as the simulation's coordinator (tests/sim/simworld.py:Coord) wires them: one commit lane,
a pool of apply sessions, a replay session, one bus message of writesets in flight.

``RefCore.step`` takes an event and carries out its actions through ``sink``, the shell's
handler, synchronously and in order: the shell may feed further events from inside the handler
(a control-plane call made while it handles a handoff), and those are processed at once, nested,
as NATIVE.md 2.5's ``CALL`` is. ``tap`` sees every event fed and every action produced, in that
order: a recorder writes them to a trace (``trace.py``), and ``replay.py`` drives a fresh core
from a trace's events and compares what it taps.

Nothing here reads a clock or draws at random: times come with the events, random bits through
``Random`` events. Step 0's ``PyCore`` (``OrderCore`` and ``CommitCore`` taken out of
``replicator.py`` and ``commit/pipeline.py``) replaces this wiring; the trace format stays.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections import deque
from dataclasses import replace
from typing import Any, Callable, Optional

from chorus import wire
from chorus.actions import Action, Apply, DdlOutcome, LocalVerdict, Send
from chorus.bus import Delivery, View
from chorus.bus import proto as bp
from chorus.bus.sender import OwnMessages
from chorus.certifier import CertifierClass
from chorus.commit.book import CommitBook
from chorus.confchange import ClusterConfig
from chorus.commit.pipeline import Pending, order_keys, partly_committed, reschedule
from chorus.commit.scheduler import ApplyScheduler, Scheduler
from chorus.dataplane import events as ev
from chorus.dataplane.events import ApplyOutcome, Record
from chorus.history import Epoch, MemberRecord
from chorus.replicator import Holding, Replicator
from chorus.wslog import LogFeeder

Sink = Callable[[Record], None]


class CoreFault(AssertionError):
    """The core's own invariant broke (an admission out of GID order)."""


class BackendRef:
    """The local backend committing a certified writeset (pipeline.BackendRef)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.certified: set[int] = set()
        self.closed = False


class MemoryLog:
    """A writeset log in memory with the bookkeeping of the simulation's ring (SimLog): the GIDs
    it holds, the oldest dropped once there are more than ``capacity``. What the core reads of a
    log: ``base_gid``, ``end_gid``, ``max_payload``; what the feeder writes."""

    def __init__(self, capacity: int, base: int, gids: list[int], max_payload: int = 1 << 30) -> None:
        self.capacity = capacity
        self.base = base
        self.gids: deque[int] = deque(gids)
        self._max_payload = max_payload

    @property
    def base_gid(self) -> int:
        return self.base

    @property
    def end_gid(self) -> int:
        return self.gids[-1] if self.gids else self.base

    def max_payload(self, origin: str) -> int:
        return self._max_payload

    def append_many(self, records: list[tuple[int, str, Any, int, int]]) -> None:
        for gid, *_ in records:
            if gid <= self.end_gid:
                raise CoreFault(f"log append of GID {gid} after GID {self.end_gid}")
            self.gids.append(gid)
        while len(self.gids) > self.capacity:
            self.base = self.gids.popleft()

    def reset(self, after: int) -> None:
        self.gids.clear()
        self.base = after


class _TappedLog:
    """The log as the feeder sees it: every append and reset is an action first."""

    def __init__(self, core: "RefCore", log: Any) -> None:
        self.core, self.log = core, log

    @property
    def end_gid(self) -> int:
        end: int = self.log.end_gid
        return end

    def max_payload(self, origin: str) -> int:
        n: int = self.log.max_payload(origin)
        return n

    def append_many(self, records: list[tuple[int, str, Any, int, int]]) -> None:
        if records:  # (the trace keeps no commit time: the reference core's messages carry none)
            self.core._emit(ev.LogAppend(tuple((g, o, f, bytes(p)) for g, o, p, f, *_ in records)))
        self.log.append_many(records)

    def reset(self, after: int) -> None:
        self.core._emit(ev.LogReset(after))
        self.log.reset(after)


def start_config(node: str, member: str, cluster_uuid: str, last_gid: int, bootstrap: bool,
                 epochs: tuple[Epoch, ...], records: dict[str, MemberRecord], workers: int, run: int,
                 log_capacity: int, log_base: int, log_gids: list[int], max_payload: int = 1 << 30,
                 config: Optional[ClusterConfig] = None) -> ev.Start:
    """The ``START`` event of a core (its body is JSON: NATIVE.md's START configuration; the
    configured set, confchange.py, only once the cluster's nodes were changed)."""
    body: dict[str, Any] = {
        "node": node, "member": member, "cluster_uuid": cluster_uuid, "last_gid": last_gid,
        "bootstrap": bootstrap, "epochs": [[e.number, e.start, e.node] for e in epochs],
        "records": {n: [r.epoch, r.gid, r.member] for n, r in records.items()},
        "workers": workers, "run": run, "lanes": 1,
        "log": {"capacity": log_capacity, "base": log_base, "gids": log_gids, "max_payload": max_payload},
    }
    if config is not None:
        body["config"] = {"version": config.version, "nodes": list(config.nodes), "tie_breaker": config.tie_breaker,
                          "ids": dict(config.ids)}
    return ev.Start(json.dumps(body, sort_keys=True))


class RefCore:
    """One node's core (see the module's docstring).

    ``log``: the writeset log the feeder appends to (None: a :class:`MemoryLog` as ``START``
    describes it). ``observe``: the shell's state the core acts on, read at each event and after
    each action: (process alive, database up, a catch-up holds the live stream); a change is fed
    as an event (``STOPPED``, ``DB_UP``, ``HOLD_LIVE``) so a trace holds it. ``fault``: the
    exception for a broken invariant. ``certifiers`` and ``schedulers``: the implementations
    (by default the ones ``CHORUS_IMPL`` chose); ``orders``: the order core's (by default
    dataplane/order.py's OrderCore)."""

    def __init__(self, start: ev.Start, sink: Sink, *, log: Any = None, tap: Optional[Sink] = None,
                 observe: Optional[Callable[[], tuple[bool, bool, bool]]] = None,
                 new_id: Optional[Callable[[], uuid.UUID]] = None, mono: float = 0.0, wall: float = 0.0,
                 fault: Callable[[str], Exception] = CoreFault, certifiers: Optional[CertifierClass] = None,
                 schedulers: Optional[Callable[[], ApplyScheduler]] = None,
                 orders: Optional[Callable[..., Any]] = None) -> None:
        cfg = json.loads(start.config)
        self.config = cfg
        self.sink = sink
        self.tap = tap
        self.observe = observe
        self.fault = fault
        self._new_id = new_id
        self.node: str = cfg["node"]
        self.member: str = cfg["member"]
        self.workers: int = cfg["workers"]
        self.run_max: int = cfg["run"]
        self._depth = 0
        self._seq = 0
        self._cur: Record = start  # the event being processed (its header stamps the actions)
        self._mono, self._wall = mono, wall
        if tap is not None:
            tap(self._stamp(start, mono, wall))
        lc = cfg["log"]
        self.wslog = log if log is not None else MemoryLog(lc["capacity"], lc["base"], list(lc["gids"]),
                                                           lc["max_payload"])
        self._schedulers = schedulers or Scheduler
        self.book: CommitBook[Pending] = CommitBook()
        self.book.start(1, cfg["last_gid"])
        self.scheduler = self._schedulers()
        self.feeder = LogFeeder(_TappedLog(self, self.wslog))  # type: ignore[arg-type]
        self.r = Replicator(node=self.node, cluster_uuid=cfg["cluster_uuid"], last_gid=cfg["last_gid"],
                            bootstrap=cfg["bootstrap"],
                            epochs=tuple(Epoch(int(n), int(g), str(x)) for n, g, x in cfg["epochs"]),
                            records={k: MemberRecord(int(e), int(g), bool(m)) for k, (e, g, m) in cfg["records"].items()},
                            holding=self._holding, certifiers=certifiers, orders=orders,
                            config=ClusterConfig(int(cfg["config"]["version"]), tuple(cfg["config"]["nodes"]),
                                                 str(cfg["config"]["tie_breaker"]),
                                                 tuple(dict(cfg["config"].get("ids", {})).items()))
                            if cfg.get("config") else None)
        self.r.order.clock = lambda: self._wall
        self.r.new_id = self._draw
        self.own = OwnMessages()
        self.alive = True
        self.db_up = True
        self.hold_live = False
        self.db_ok = True
        self.epoch = 0  # PostgreSQL restarts seen
        self.idle = self.workers
        self.replay_busy = False
        self.tickets: set[int] = set()
        self.outbox: list[tuple[int, bytes]] = []
        self.in_flight = 0
        self._ticket = itertools.count(1)

    # -- the boundary

    def _stamp(self, e: Record, mono: float, wall: float) -> Record:
        self._seq += 1
        return replace(e, depth=self._depth, seq=self._seq, mono=mono, wall=wall)

    def step(self, e: Record) -> Any:
        """Process event ``e`` (its header is kept if it has a seq: a replayed event), and return
        what the shell asked for (a WRITESET's ticket)."""
        if e.seq == 0:
            e = self._stamp(e, self._mono, self._wall)
        else:
            self._seq = e.seq
        if self.tap is not None:
            self.tap(e)
        outer = self._cur, self._mono, self._wall
        self._cur, self._mono, self._wall = e, e.mono, e.wall
        self._depth += 1
        try:
            return self._handle(e)
        finally:
            self._depth -= 1
            self._cur, self._mono, self._wall = outer

    def feed(self, e: Record, now: float) -> Any:
        """The shell feeds ``e`` at time ``now`` (after any change of the state it observes)."""
        outer = self._mono, self._wall
        self._mono = self._wall = now
        try:
            self._sync()
            return self.step(e)
        finally:
            self._mono, self._wall = outer

    def _emit(self, a: Record) -> None:
        c = self._cur
        a = replace(a, depth=c.depth, seq=c.seq, mono=c.mono, wall=c.wall)
        if self.tap is not None:
            self.tap(a)
        self.sink(a)
        self._sync()

    def _sync(self) -> None:
        if self.observe is None:
            return
        alive, up, hold = self.observe()
        if not alive and self.alive:
            self.step(ev.Stopped())
        if up != self.db_up:
            self.step(ev.DbUp(up))
        if hold != self.hold_live:
            self.step(ev.HoldLive(hold))

    def _draw(self) -> uuid.UUID:
        if self._new_id is not None:  # live: the shell's source, recorded
            u = self._new_id()
            self.step(ev.Random(u.bytes))
            return u
        raise self.fault("the core drew random bits, and nothing gives them")  # replaced by the replayer

    def draw_from(self, source: Callable[[], bytes]) -> None:
        """Replay: random bits come from ``source`` (the trace's next RANDOM)."""
        self.r.new_id = lambda: uuid.UUID(bytes=source())

    def _holding(self) -> Holding:
        return Holding(max(self.book.watermark, self.book.admitted), self.wslog.base_gid, self.wslog.end_gid)

    def _handle(self, e: Record) -> Any:
        if isinstance(e, ev.Deliver):
            self._deliver(Delivery(e.sender, e.payload))
        elif isinstance(e, ev.ViewEv):
            self._view(View(e.view_id, e.members, e.joined, e.left, e.local, e.quorate, e.quorum, e.expected,
                            e.tie_breaker))
        elif isinstance(e, ev.Flush):
            self._pump()
        elif isinstance(e, ev.WritesetEv):
            return self._writeset(e.payload)
        elif isinstance(e, ev.Committed):
            self._local_done(e.gid)
        elif isinstance(e, ev.Tick):
            self._act(self.r.tick(self._mono))
            self.feeder.flush()
        elif isinstance(e, ev.DbCommitted):
            self.book.advance(e.gid)
            for g in [g for g, p in self.book.pending.items() if g <= e.gid and p.backend is not None]:
                self._local_done(g)
        elif isinstance(e, ev.DbDurable):
            self.book.flushed(e.gid)
        elif isinstance(e, ev.DbLost):
            self.db_ok = False
        elif isinstance(e, ev.DbBack):
            self._restart(e.durable)
        elif isinstance(e, ev.DbUp):
            self.db_up = e.up
        elif isinstance(e, ev.HoldLive):
            self.hold_live = e.on
        elif isinstance(e, ev.Stopped):
            self.alive = False
        elif isinstance(e, ev.ApplyResult):
            self._apply_result(e)
        elif isinstance(e, ev.Send):
            self._send(e.payload, [])
        elif isinstance(e, ev.Skip):
            self._skip(e.gid)
        elif isinstance(e, ev.AdmitHeld):
            # live: the actions the catch-up held; replayed: made again from their bytes
            self._act(e.obj if e.obj is not None else [Apply(gid, prev, origin, wire.scan(payload), settle)
                                                       for gid, prev, origin, settle, payload in e.applies])
        elif isinstance(e, ev.AdmitRun):
            self._admit_run(e.records, e.prev)
        elif isinstance(e, ev.AdmitOne):
            gid, origin, _, payload = e.records[0]
            self._admit(Pending(gid, e.prev, origin, wire.scan(payload)), local=False)
            self.feeder.flush()
            self._dispatch()
        elif isinstance(e, ev.LogRec):
            for gid, origin, _, payload in e.records:
                self.feeder.certified(gid, origin, payload, False)
        elif isinstance(e, ev.Call):
            self._call(e)
        elif isinstance(e, ev.Dispatch):
            self._dispatch()
        elif isinstance(e, ev.Random):
            pass  # bits the core drew (_draw): recorded where they were drawn
        elif isinstance(e, ev.Start):
            raise self.fault("START fed to a running core")
        else:
            raise self.fault(f"not an event: {e!r}")
        return None

    # -- the order core's input (coordinator._bus_loop)

    def _view(self, view: View) -> None:
        actions = self.r.on_view(view, self._mono)
        self.in_flight = 0  # BusSender.view_changed
        self._act(actions)
        self.feeder.flush()

    def _deliver(self, d: Delivery) -> None:
        actions = self.r.on_delivery(d)
        if d.sender == self.member:  # coordinator._lost; BusSender.delivered_own
            if bp.carries_writesets(d.payload):
                self.in_flight = 0
            lost = self.own.delivered(d.payload)
            if lost:
                self.in_flight = 0
            for ticket in lost:
                self.r.forget_local(ticket)
                actions.insert(0, LocalVerdict(ticket, False, 0, 0, "lost at a view change", None, unknown=True))
        self._act(actions)
        self.feeder.flush()

    def _call(self, e: ev.Call) -> None:
        if e.call == "progress":
            msg = self.r.progress_message(self.book.watermark)
            if msg is not None:
                self._act([msg])
        elif e.call == "held_released":
            self.r.held_released()
        elif e.call == "recovered":
            self._act(self.r.recovered(e.number))
        elif e.call == "recovery_failed":
            self._act(self.r.recovery_failed(e.text))
        elif e.call == "backend_gone":
            # the backend of ticket ``number`` closed its socket before its verdict
            # (BackendServer.closed): certified, it is replayed (CommitPipeline.admit_local)
            self.tickets.discard(e.number)
        else:
            raise self.fault(f"unknown call {e.call!r}")

    def _act(self, actions: list[Action]) -> None:
        for a in actions:
            if not self.alive:
                return
            if isinstance(a, LocalVerdict):
                self._verdict(a)
            elif isinstance(a, (Apply, DdlOutcome)) and self.hold_live:
                self._emit(ev.Notify("HELD", a.gid, "", obj=a))
            elif isinstance(a, Apply):
                self._admit(Pending(a.gid, a.prev, a.origin, a.writeset), local=False)
                self._emit(ev.Notify("DISPATCH_SOON", a.gid, ""))
            elif isinstance(a, Send):
                self._send(bp.encode(a.message, a.version or self.r.send_version), [])
            else:
                self._emit(ev.Handoff(type(a).__name__, repr(a), obj=a))

    # -- the sender (bus/sender.py)

    def _writeset(self, payload: bytes) -> int:
        ticket = next(self._ticket)
        self.r.expect_local(ticket, wire.scan(payload))
        self.tickets.add(ticket)
        self.outbox.append((ticket, payload))
        return ticket

    def _pump(self) -> None:
        """One message of writesets on the bus at a time (BusSender.pump)."""
        if self.in_flight or not self.outbox:
            return
        out, self.outbox = self.outbox, []
        self.in_flight = 1
        msg: bp.Message = (bp.WritesetMsg(self.node, *out[0]) if len(out) == 1
                           else bp.WritesetBatch(self.node, tuple(out)))
        self._send(bp.encode(msg, self.r.send_version), [t for t, _ in out])

    def _send(self, payload: bytes, tickets: list[int]) -> None:
        if self.alive:
            self.own.posted(payload, tickets)
            self._emit(ev.BusSend(payload, tuple(tickets)))

    # -- the commit pipeline (commit/pipeline.py, commit/backends.py)

    def _verdict(self, v: LocalVerdict) -> None:
        known = v.ticket in self.tickets
        self.tickets.discard(v.ticket)
        if not v.ok:
            if known:
                self._emit(ev.Verdict(v.ticket, False, v.unknown, 0, 0, 0, v.reason))
            return
        assert v.writeset is not None
        b = BackendRef(v.ticket) if known else None
        p = Pending(v.gid, v.prev, self.node, v.writeset, b)
        self._admit(p, local=True)
        if b is None:
            self._replay(v.gid)
            return
        b.certified.add(v.gid)
        self._emit(ev.Verdict(v.ticket, True, False, v.gid, v.prev, p.wait_for, "", obj=b))

    def _admit(self, p: Pending, local: bool, logged: bool = False) -> None:
        try:
            self.book.admit(p)
        except ValueError as e:
            raise self.fault(f"{self.node}: {e}") from e
        if not logged:
            self.feeder.certified(p.gid, p.origin, p.writeset.raw or wire.encode(p.writeset), p.writeset.toi)
        keys = [k for ws in p.run() for k in order_keys(ws)]
        self.scheduler.add(p.gid, keys, local=local, barrier=p.writeset.has_schema)

    def _admit_run(self, records: tuple[tuple[int, str, int, bytes], ...], prev: int) -> None:
        self.feeder.flush()
        scanned = tuple(wire.scan(payload) for _, _, _, payload in records)
        gid, origin = records[-1][0], records[-1][1]
        self._admit(Pending(gid, prev, origin, scanned[-1], before=scanned[:-1],
                            before_gids=tuple(r[0] for r in records[:-1])), local=False, logged=True)
        self._dispatch()

    def _local_done(self, gid: int) -> None:
        p = self.book.committed(gid)
        if p is None:
            return
        if p.backend is not None:
            p.backend.certified.discard(gid)
        self.scheduler.committed(gid)
        self._emit(ev.Notify("COMMITTED", gid, ""))
        self._dispatch()

    def _skip(self, gid: int) -> None:
        p = self.book.pending.get(gid)
        if p is not None:
            p.skip = True
            self.scheduler.redispatch(gid)
            self._dispatch()

    def _replay(self, gid: int) -> None:
        p = self.book.pending.get(gid)
        if p is None:
            return
        p.backend = None
        self.scheduler.replay(gid)
        self._dispatch()

    def _dispatch(self) -> None:
        if not self.alive or not self.db_ok or not self.db_up:
            return
        if not self.replay_busy:
            gid = self.scheduler.next_replay()
            if gid is not None:
                self.replay_busy = True
                self._start_apply([gid], True)
        for run in self.scheduler.ready_runs(self.idle, self.run_max):
            self.idle -= 1
            self._start_apply(run, False)

    def _start_apply(self, run: list[int], replay: bool) -> None:
        p = self.book.pending.get(run[0])
        self._emit(ev.ApplyRun(replay, self.epoch, p.wait_for if p is not None else 0, tuple(run)))

    def _apply_result(self, e: ev.ApplyResult) -> None:
        run = list(e.run)
        if e.outcome == ApplyOutcome.DB_DOWN:
            for g in run:
                self.scheduler.redispatch(g)
        elif e.outcome == ApplyOutcome.FAILED:
            if len(run) > 1:
                for g in run:
                    self.scheduler.redispatch(g)
            else:
                self._emit(ev.Notify("APPLY_FAILED", run[0], e.error))
        elif e.outcome == ApplyOutcome.PARTLY:
            why = partly_committed(run, self.book.pending.get(run[-1]), e.committed)
            if why is not None:
                self._emit(ev.Notify("APPLY_FAILED", run[-1], why))
            else:
                for g in run:
                    self.scheduler.redispatch(g)
        elif e.outcome == ApplyOutcome.OK:
            for g in run:
                done = self.book.committed(g)
                self.scheduler.committed(g)
                if done is None or not done.skip:
                    self._emit(ev.Notify("COMMITTED", g, ""))
            self.book.advance(run[-1])
        elif e.outcome != ApplyOutcome.GONE:
            raise self.fault(f"unknown apply outcome {e.outcome}")
        if e.epoch == self.epoch:
            if e.replay:
                self.replay_busy = False
            else:
                self.idle += 1
        self._dispatch()

    def _restart(self, durable: int) -> None:
        """PostgreSQL is back at ``durable`` (pipeline.restart)."""
        self.epoch += 1
        self.scheduler = reschedule(self.book, self.scheduler, self.node, 1, durable, new=self._schedulers)
        self.idle, self.replay_busy = self.workers, False
        self.db_ok = True
        self._dispatch()
