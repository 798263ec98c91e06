"""The simulated world in which the coordinator's decision core runs (tests/sim/README.md).

One process, one seeded random generator, one simulated clock. Every host runs the real pure
core of a Chorus node: the replicator (membership, certification, uniform commit, re-forming),
the commit book and the scheduler, the catch-up plan (catchupplan.py) and the log feeder. Around
it, a twin of the coordinator's I/O shell (``Coord``, mirroring coordinator.py, commit/pipeline.py,
catchup.py and commit/backends.py step for step) drives it with simulated parts:

- ``SimBus``: Corosync CPG as bus/__init__.py promises it and no more: one agreed
  order per component, self-delivery, views in that order; at a membership change each new
  component delivers its own prefix of what was ordered (non-uniform delivery: a side may
  deliver what the other never gets), messages not yet ordered go out in the sender's next
  view; a token timeout before a crash or a partition shows; latency and jitter per member.
- ``SimDB``: a PostgreSQL that commits in GID order (the extension's commit turn), flushes local
  commits and, every tick, applied ones; a crash loses what was not flushed.
- ``SimLog``: a writeset log ring; a host's power cut loses its unsynced tail (a torn tail).
- streams between recovery servers and joiners that stall on partitions and break on crashes.

Nothing here is used by the daemon; the decisions are all the real ones.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from chorus.bus import proto as bp
from chorus import wire
from chorus.bus import Delivery, View, Votes, bus_node
from chorus.catchupplan import (CATCHUP_WINDOW, Abandoned, Act, AskLogs, CatchUpPlan, Fetch, Steps, Wait,
                                WaitCommitted)
from chorus.commit.book import CommitBook
from chorus.commit.pipeline import Pending
from chorus.dataplane import events as ev
from chorus.dataplane.events import ApplyOutcome
from chorus.dataplane.refcore import BackendRef, RefCore, start_config
from chorus.dataplane.trace import TraceWriter
from chorus.recoveryproto import RecoveryError
from chorus.actions import (Action, Apply, CatchUp, DdlOutcome, Joined, LogOffered, LogQueried, Pause, Phase,
                            PhaseChange, Reconfigure, Reconfigured, Remember, Removed, SyncReached, VoteDecided,
                            VoteOpened)
from chorus.replicator import Replicator
from chorus.state import NodeState
from chorus.voting import InconsistencyVoting
from chorus.wslog import LogRecord, starts_again

# the coordinator's timers (coordinator.py, catchup.py, recovery.py)
TICK_S = 0.2
PROGRESS_EVERY_S = 1.0
LOG_QUERY_WAIT_S = 1.0
FRAME_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
APPLY_WORKERS = 2
APPLY_RUN = 4
CATCHUP_BATCH = 8

# the bus (the lab's Corosync: token 2 s, consensus; docs/LAB.md)
TOKEN_TIMEOUT_S = 3.0
PROCESS_CHANGE_S = 0.05  # a coordinator that starts or ends: CPG sees it at once
MERGE_S = 1.5  # rings that can reach each other again merge


class Violation(AssertionError):
    """An invariant broke: the failure the simulation reports with its trace."""


class Stuck(AssertionError):
    """The cluster did not come back in the time allowed after the faults stopped."""


# ---- the event queue ------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def after(self, dt: float, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def run_until(self, t: float, stop: Callable[[], bool] = lambda: False) -> None:
        while self._heap and self._heap[0][0] <= t and not stop():
            when, _, fn, args = heapq.heappop(self._heap)
            self.now = when
            fn(*args)
        if not stop():
            self.now = max(self.now, t)


# ---- PostgreSQL and the disk ----------------------------------------------------------------


class SimDB:
    """A node's database: the GIDs it committed, in order, each with the writeset's identity
    (its xid, unique in a run) and a chain value (equal chain values at a GID: equal histories up to it)."""

    def __init__(self, keys_of: Optional[dict[int, list[int]]] = None) -> None:
        self.up = True
        self.frozen = False
        # what each writeset wrote (its xid -> its row keys: the simulation's clients')
        self.keys_of: dict[int, list[int]] = keys_of if keys_of is not None else {}
        self.writer: dict[int, int] = {}  # row key -> the GID of its last committed change here
        self.before: dict[int, dict[int, int]] = {}  # GID -> what its rows' writers were before it
        self.last = 0  # the committed watermark
        self.flushed = 0  # committed and durable
        self.tampered: set[int] = set()  # keys someone changed behind Chorus's back: applies touching them fail
        self.chain: dict[int, int] = {0: 0}
        self.ident: dict[int, int] = {}  # GID -> the xid of its writeset (unique in a run)
        self.order: list[int] = [0]  # committed GIDs, in order (0 first)
        # row locks held by apply transactions not committed yet (an apply takes its rows' locks
        # as it runs, then waits for its commit turn holding them): row key -> the apply's token
        self.locks: dict[bytes, int] = {}

    def release(self, token: int) -> None:
        for k in [k for k, t in self.locks.items() if t == token]:
            del self.locks[k]

    def lock(self, token: int, keys: list[bytes]) -> bool:
        """Take ``keys`` in order for ``token``, as far as none is held by another: whether all."""
        for k in keys:
            holder = self.locks.get(k)
            if holder is None:
                self.locks[k] = token
            elif holder != token:
                return False
        return True

    def commit(self, gids: list[tuple[int, int]]) -> None:
        c = self.chain[self.last]
        for gid, ident in gids:
            assert gid > self.last, (gid, self.last)
            c = hash((c, gid, ident))
            self.chain[gid] = c
            self.ident[gid] = ident
            self.order.append(gid)
            self.last = gid
            self._wrote(gid, ident)

    def _wrote(self, gid: int, ident: int) -> None:
        keys = self.keys_of.get(ident, ())
        self.before[gid] = {k: self.writer.get(k, 0) for k in keys}
        for k in keys:
            self.writer[k] = gid

    def _rows_again(self) -> None:
        """The rows' writers as the committed GIDs say (after commits were lost or replaced)."""
        self.writer.clear()
        self.before.clear()
        for g in self.order[1:]:
            self._wrote(g, self.ident[g])

    def flush(self) -> None:
        self.flushed = self.last

    def lose_unflushed(self, keep: int) -> list[int]:
        """A crash: keep what is flushed and ``keep`` more commits of the rest; return the GIDs lost."""
        self.locks.clear()  # every transaction ended with the server
        i = self.order.index(self.flushed) + 1 + keep
        lost = self.order[i:]
        for g in lost:
            del self.chain[g]
            del self.ident[g]
        del self.order[i:]
        self.last = self.order[-1]
        self.flushed = self.last
        if lost:
            self._rows_again()
        return lost

    def replace_with(self, other: "SimDB") -> list[int]:
        """Total recovery: this database becomes ``other``'s snapshot. Returns the GIDs it lost."""
        lost = [g for g in self.order[1:] if other.chain.get(g) != self.chain[g]]
        self.locks.clear()  # the old data directory's transactions are gone
        self.chain, self.ident = dict(other.chain), dict(other.ident)
        self.order = list(other.order)
        self.last = self.flushed = other.last
        self.tampered = set(other.tampered)
        self._rows_again()
        return lost


class SimLog:
    """A node's writeset log (the methods LogFeeder uses, and a reader): a ring of ``capacity``
    records; ``synced`` records survive a power cut."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.records: list[LogRecord] = []
        self.base = 0  # holds every certified GID after this one
        self.synced = 0

    @property
    def base_gid(self) -> int:
        return self.base

    @property
    def end_gid(self) -> int:
        return self.records[-1].gid if self.records else self.base

    def max_payload(self, origin: str) -> int:
        return 1 << 30

    def append_many(self, records: list[tuple[int, str, Any, int, int]]) -> None:
        for gid, origin, payload, flags, commit_time in records:
            assert gid > self.end_gid, (gid, self.end_gid)
            self.records.append(LogRecord(gid, origin, flags, bytes(payload), commit_time))
        while len(self.records) > self.capacity:  # the ring reuses its oldest segment
            self.base = self.records.pop(0).gid
            self.synced = max(0, self.synced - 1)

    def reset(self, after: int) -> None:
        self.records, self.base, self.synced = [], after, 0

    def sync(self) -> None:
        self.synced = len(self.records)

    def open(self, upto: int) -> None:
        """Coordinator._open_log: records after the committed GID are cut, and a log that does not
        reach it (a lost tail) starts again after it."""
        self.records = [r for r in self.records if r.gid <= upto]
        self.synced = min(self.synced, len(self.records))
        if starts_again(self.base, self.end_gid, upto):
            self.reset(upto)

    def power_cut(self, rnd: random.Random) -> None:
        """The page cache is lost: the unsynced tail survives only in part (torn)."""
        keep = self.synced + rnd.randint(0, len(self.records) - self.synced)
        del self.records[keep:]

    def read(self, after: int, stop: int) -> list[LogRecord]:
        if self.base > after:
            raise RecoveryError(f"range unavailable: the log holds GIDs after {self.base} only")
        return [r for r in self.records if after < r.gid <= stop]


# ---- the bus ----------------------------------------------------------------------------------


@dataclass
class _Comp:
    id: int
    members: tuple[str, ...]
    ordered: int = 0  # messages ordered in it so far
    deferred: list[tuple[str, bytes]] = field(default_factory=list)  # sent while it reconfigures
    sent_by: list[str] = field(default_factory=list)  # the sender of each ordered message
    payloads: list[bytes] = field(default_factory=list)


class SimBus:
    """Corosync CPG, simulated (see the module's docstring)."""

    def __init__(self, sim: "Sim", n: int, tie_breaker: str) -> None:
        self.sim = sim
        self.votes = Votes(n // 2 + 1, n, tie_breaker)
        self.comps: dict[str, _Comp] = {}  # member -> its component
        self.inbox: dict[str, deque[tuple[Any, ...]]] = {}
        self.pumping: set[str] = set()
        self.handler: dict[str, Callable[[Any], None]] = {}
        self.frozen: dict[str, float] = {}  # member -> frozen since
        self.busy_until = 0.0
        self._ids = itertools.count(1)
        self._regroup_at: Optional[float] = None
        self.extra_latency = 0.0  # netem
        self._last_send: dict[str, float] = {}  # member -> when its last message reaches the ring

    def host(self, member: str) -> int:
        return int(bus_node(member))

    def join(self, member: str, handler: Callable[[Any], None]) -> None:
        self.handler[member] = handler
        self.inbox[member] = deque()
        self.regroup(PROCESS_CHANGE_S)

    def drop(self, member: str, detect: float) -> None:
        """``member`` is gone (its process or its host died): the others see it after ``detect``."""
        self.handler.pop(member, None)
        self.inbox.pop(member, None)
        self.frozen.pop(member, None)
        self.regroup(detect)

    def freeze(self, member: str) -> None:
        self.frozen[member] = self.sim.clock.now
        self.regroup(TOKEN_TIMEOUT_S)

    def thaw(self, member: str) -> None:
        """A frozen member resumes: its Corosync finds the ring it was in gone and the others'
        at once, so the view it was alone in and the merged one come together."""
        if self.frozen.pop(member, None) is not None:
            self.regroup(0.001 + self.sim.rnd.random() * 0.02)
            self._pump(member)

    def regroup(self, delay: float) -> None:
        """The membership changes ``delay`` from now: nothing is ordered meanwhile."""
        at = self.sim.clock.now + delay
        self.busy_until = max(self.busy_until, at)
        self.sim.clock.at(at, self._regroup)

    # -- sending and delivering

    def send(self, member: str, payload: bytes) -> None:
        """``member`` multicasts ``payload``: it reaches the ring after a while, after the member's
        earlier messages (Corosync keeps one sender's messages in the order sent; a simulated bus
        that reordered them made the sender count an earlier writeset lost, OwnMessages, and then
        certify it: its session, told the outcome was unknown, had ended meanwhile)."""
        at = self.sim.clock.now + 0.0005 + self.sim.rnd.random() * 0.0015 + self.extra_latency
        at = max(at, self._last_send.get(member, 0.0) + 1e-7)
        self._last_send[member] = at
        self.sim.clock.at(at, self._order, member, payload)

    def _order(self, member: str, payload: bytes) -> None:
        comp = self.comps.get(member)
        if comp is None:
            return  # its process is gone, or it has no view yet: lost
        if self.sim.clock.now < self.busy_until:
            comp.deferred.append((member, payload))
            return
        self._append(comp, member, payload)

    def _append(self, comp: _Comp, member: str, payload: bytes) -> None:
        idx = comp.ordered
        comp.ordered += 1
        comp.sent_by.append(member)
        comp.payloads.append(payload)
        for m in comp.members:
            if m in self.inbox:
                self.inbox[m].append(("msg", comp.id, idx, member, payload))
                self._pump(m)

    def _pump(self, member: str) -> None:
        if member in self.pumping or member in self.frozen or not self.inbox.get(member):
            return
        self.pumping.add(member)
        lat = 0.0002 + self.sim.rnd.random() * 0.003 + self.extra_latency * (0.5 + self.sim.rnd.random())
        self.sim.clock.after(lat, self._deliver_one, member)

    def _deliver_one(self, member: str) -> None:
        """What piled up for ``member`` comes in one read (``cpg_dispatch``): a batch, then the
        batch's end (the coordinator sends its queued writesets then: Coordinator._bus_loop)."""
        self.pumping.discard(member)
        box = self.inbox.get(member)
        if not box or member in self.frozen:
            return
        while box and member in self.handler and member not in self.frozen:
            item = box.popleft()
            handler = self.handler[member]
            if item[0] == "msg":
                handler(Delivery(item[3], item[4]))
            else:
                handler(item[1])
        handler = self.handler.get(member)
        if handler is not None:
            handler(None)
        if box:
            self._pump(member)

    # -- membership

    def _desired(self) -> list[tuple[str, ...]]:
        """The components the live members form now: by the network's partition groups; a member
        frozen for longer than the token timeout is alone."""
        now = self.sim.clock.now
        groups: dict[int, list[str]] = {}
        alone: list[tuple[str, ...]] = []
        for m in sorted(self.handler):
            since = self.frozen.get(m)
            if since is not None and now - since >= TOKEN_TIMEOUT_S - 1e-9:
                alone.append((m,))
                continue
            groups.setdefault(self.sim.net_group(self.host(m)), []).append(m)
        return [tuple(g) for _, g in sorted(groups.items())] + alone

    def _regroup(self) -> None:
        now = self.sim.clock.now
        if now < self.busy_until - 1e-9:
            return  # a later change is due: that one regroups
        desired = self._desired()
        current = {c.members for c in {id(c): c for c in self.comps.values()}.values()}
        old_of = dict(self.comps)
        if set(desired) == current and all(m in self.comps for g in desired for m in g):
            for comp in {id(c): c for c in self.comps.values()}.values():
                self._flush_deferred(comp, comp)
            return
        old_comps = {id(c): c for c in old_of.values()}.values()
        new_comps: dict[str, _Comp] = {}
        resend: dict[int, list[tuple[str, bytes]]] = {}
        for g in desired:
            nc = _Comp(next(self._ids), g)
            for m in g:
                new_comps[m] = nc
        # what each new component delivers of each old one: its own prefix
        for oc in old_comps:
            parts: dict[int, list[str]] = {}
            for m in oc.members:
                if m in new_comps:
                    parts.setdefault(new_comps[m].id, []).append(m)
            cuts: dict[int, int] = {}
            for cid, ms in parts.items():
                delivered = max(oc.ordered - sum(1 for e in self.inbox[m] if e[0] == "msg" and e[1] == oc.id)
                                for m in ms)
                whole = set(ms) == set(m for m in oc.members if m in self.handler)
                cuts[cid] = oc.ordered if whole else self.sim.rnd.randint(delivered, oc.ordered)
            furthest = max(cuts.values(), default=0)
            for cid, ms in parts.items():
                for m in ms:
                    self.inbox[m] = deque(e for e in self.inbox[m]
                                          if not (e[0] == "msg" and e[1] == oc.id and e[2] >= cuts[cid]))
                # what nobody delivered in the old view, sent by a member of this component: it
                # goes out again in the new view (its sender still has it)
                for idx in range(furthest, oc.ordered):
                    if oc.sent_by[idx] in ms:
                        resend.setdefault(cid, []).append((oc.sent_by[idx], oc.payloads[idx]))
            for m in oc.members:
                if m in new_comps:
                    resend.setdefault(new_comps[m].id, []).extend(d for d in oc.deferred if d[0] == m)
        for m, nc in sorted(new_comps.items()):
            before = set(old_of[m].members) if m in old_of else set()
            members = nc.members
            view = View(nc.id, members, tuple(x for x in members if x not in before),
                        tuple(sorted(before - set(members))), m,
                        self.votes.holds({bus_node(x) for x in members}), self.votes.quorum,
                        self.votes.expected, self.votes.tie_breaker)
            self.inbox[m].append(("view", view))
            self._pump(m)
        self.comps = new_comps
        self.sim.trace("bus", "views " + " | ".join(",".join(c) for c in desired))
        for nc in {id(c): c for c in new_comps.values()}.values():
            for member, payload in resend.get(nc.id, []):
                if member in self.handler:
                    self._append(nc, member, payload)

    def _flush_deferred(self, comp: _Comp, into: _Comp) -> None:
        deferred, comp.deferred = comp.deferred, []
        for member, payload in deferred:
            if member in self.handler:
                self._append(into, member, payload)


# ---- clients ----------------------------------------------------------------------------------


KEYS = 12
_TABLE = wire.Table("public", "t", (wire.Column("id", "integer"), wire.Column("v", "text")), (0,))


def make_writeset(xid: int, last_seen: int, keys: list[int]) -> bytes:
    rows = tuple(wire.Row("U", 0, (str(k).encode(),), (str(k).encode(), str(xid).encode())) for k in keys)
    ks = (wire.Key(wire.KeyMode.REFERENCE, (b"public", b"t")),
          *(wire.Key(wire.KeyMode.UPDATE, (b"public", b"t", b"id", str(k).encode())) for k in keys))
    return wire.encode(wire.Writeset(xid, 1, last_seen, (_TABLE,), rows, ks))


@dataclass
class Txn:
    """A client's transaction on one node, as the client sees it."""
    node: str
    xid: int
    state: str = "sent"  # sent, certified, committed, failed, unknown, refused
    gid: int = 0
    wait_for: int = 0
    last_seen: int = 0  # the node's watermark when it wrote its rows (its snapshot)
    generation: int = 0  # which start of the node's PostgreSQL its backend belongs to (Host.db_generation)


# ---- the coordinator's twin ------------------------------------------------------------------


class _PlanOrder:
    """The replicator as the catch-up plan sees it: reads go to it, its calls into the order core
    go through the core as CALL events (so a trace holds them where they happened); their actions
    are carried out there and then, and the plan gets none back to carry out."""

    def __init__(self, coord: "Coord") -> None:
        self.c = coord

    @property
    def phase(self) -> Phase:
        return self.c.r.phase

    @property
    def online(self) -> Any:
        return self.c.r.online

    @property
    def synced(self) -> Any:
        return self.c.r.synced

    def held_released(self) -> None:
        self.c.feed(ev.Call("held_released", 0, ""))

    def recovered(self, committed_gid: int) -> list[Action]:
        self.c.feed(ev.Call("recovered", committed_gid, ""))
        return []

    def recovery_failed(self, reason: str) -> list[Action]:
        self.c.feed(ev.Call("recovery_failed", 0, reason))
        return []


class Coord:
    """One coordinator process: the real core (dataplane/refcore.py: the replicator, the commit
    book, the scheduler, the certifier, the log feeder, wired as coordinator.py wires them) fed
    events by this shell, which carries out its actions on the simulated world."""

    def __init__(self, host: "Host", member: str) -> None:
        self.host = host
        self.sim = host.sim
        self.name = host.name
        self.member = member
        self.alive = True
        # the PostgreSQL it is connected to (Host.db_generation): one that restarted meanwhile, even
        # while this process was frozen, closed its connections, which its next use of them tells it
        self.db_seen = host.db_generation
        self.frozen = False  # SIGSTOPped (the bus delivers nothing meanwhile, timers wait)
        st = host.state
        db = host.db
        # nodedb.start_node: chorus.durable_gid() flushes what the database committed (the
        # previous coordinator's applies, not flushed one by one), then the committed GID is read
        db.flush()
        durable = db.last
        host.node_epoch += 1  # chorus.node_init(): backends still waiting for a turn fail
        host.log.open(durable)
        start = start_config(self.name, member, st.cluster_uuid, durable, st.bootstrap, st.epochs, dict(st.records),
                             APPLY_WORKERS, APPLY_RUN, host.log.capacity, host.log.base,
                             [r.gid for r in host.log.records], config=st.config)
        self.trace = self.sim.recorder(self) if self.sim.recorder is not None else None
        self.core = RefCore(start, self._carry_out, log=host.log, tap=self.trace, observe=self._observed,
                            new_id=_replicator_uuid4, mono=self.sim.clock.now, wall=self.sim.clock.now,
                            fault=Violation)
        self.plan = CatchUpPlan(self.name, _PlanOrder(self), self, (), CATCHUP_BATCH, True,  # type: ignore[arg-type]
                                clock=lambda: self.sim.clock.now)
        self.voting = InconsistencyVoting(self.name, self.send, self.r.decided.get, lambda: self.book.watermark,
                                          self._commit_skipped, self._leave_by_vote)
        self.phase_reason = "starting"
        self.tickets: dict[int, Txn] = {}
        self.backends: dict[int, tuple[Txn, BackendRef]] = {}  # gid -> its waiting local backend
        self.reapplying = False  # PostgreSQL came back: writes wait until it has every certified GID again
        self.reapply_target: Optional[int] = None
        self.offers: dict[str, list[bp.LogInfo]] = {}
        self.lock_tokens: set[int] = set()  # its apply transactions holding row locks
        self.socket: list[tuple[Txn, list[int]]] = []  # backends' COMMITs sent while it is frozen
        self._pump_scheduled = False
        self._reform_seen: Optional[object] = None
        self.catchup_token = 0
        self.last_progress = 0.0
        self.sim.bus.join(member, self._bus_event)
        self.sim.clock.after(TICK_S, self._tick)

    # -- the core, and what the shell reads of it

    @property
    def r(self) -> Replicator:
        return self.core.r

    @property
    def book(self) -> CommitBook[Pending]:
        return self.core.book

    @property
    def scheduler(self) -> Any:
        return self.core.scheduler

    @property
    def db_ok(self) -> bool:
        return self.core.db_ok

    @property
    def epoch(self) -> int:
        return self.core.epoch

    def feed(self, e: ev.Record) -> Any:
        return self.core.feed(e, self.sim.clock.now)

    def _observed(self) -> tuple[bool, bool, bool]:
        return self.alive, self.host.db.up, self.plan.held is not None

    def _carry_out(self, a: ev.Record) -> None:
        """The core's actions, on the simulated world (coordinator._act, pipeline, backends)."""
        if isinstance(a, ev.BusSend):
            self.sim.bus.send(self.member, a.payload)
        elif isinstance(a, ev.Verdict):
            self._verdict(a)
        elif isinstance(a, ev.ApplyRun):
            self._start_apply(list(a.run), a.replay, a.epoch)
        elif isinstance(a, (ev.LogAppend, ev.LogReset)):
            pass  # the core's log is this host's: the feeder wrote it
        elif isinstance(a, ev.Notify):
            if a.kind == "COMMITTED":
                self.voting.committed_here(a.gid)
            elif a.kind == "DISPATCH_SOON":
                self.sim.clock.after(0, self.dispatch)
            elif a.kind == "APPLY_FAILED":
                self.voting.apply_failed(a.gid, a.text)
            elif a.kind == "HELD":
                held = self.plan.hold(a.obj)
                assert held, "the core holds live writesets only while a catch-up does"
            else:
                raise Violation(f"unknown notification {a!r}")
        elif isinstance(a, ev.Handoff):
            self._handoff(a.obj)
        else:
            raise Violation(f"unknown action {a!r}")

    # -- the Admission port of the catch-up plan (catchup.PipelineAdmission)

    @property
    def watermark(self) -> int:
        return self.book.watermark

    @property
    def admitted(self) -> int:
        return self.book.admitted

    @property
    def lanes(self) -> int:
        return 1

    def log(self, rec: LogRecord) -> None:
        self.feed(ev.LogRec(((rec.gid, rec.origin, rec.flags, rec.payload),)))

    def admit_run(self, run: list[LogRecord], prev: int) -> None:
        self.feed(ev.AdmitRun(prev, tuple((r.gid, r.origin, r.flags, r.payload) for r in run)))

    def settle(self, rec: LogRecord) -> None:
        pass  # the simulated clients make no schema changes: nothing waits for every node's report

    def admit_one(self, rec: LogRecord, prev: int) -> None:
        self.feed(ev.AdmitOne(prev, ((rec.gid, rec.origin, rec.flags, rec.payload),)))

    # -- the daemon loop (coordinator.py)

    def _bus_event(self, event: Any) -> None:
        if not self.alive:
            return
        if event is None:  # the end of a batch read from the bus
            self.pump()
            return
        assert not self.frozen, "the bus delivers nothing to a frozen member"
        if isinstance(event, View):
            self.sim.trace(self.name, f"view {','.join(event.members)} quorate={self.r.votes.holds({bus_node(m) for m in event.members}) if event.expected else event.quorate}")
            self.feed(ev.ViewEv(event.view_id, tuple(event.members), tuple(event.joined), tuple(event.left),
                                event.local, event.quorate, event.quorum, event.expected, event.tie_breaker))
        else:
            self.feed(ev.Deliver(event.sender, bytes(event.payload)))
        if self.r.reform is not self._reform_seen:
            self._reform_seen = self.r.reform
            if self.r.reform is not None:
                self.sim.trace(self.name, f"re-form: {self.r.reform.reason}")

    def _handoff(self, a: Action) -> None:
        if isinstance(a, Pause):
            pass  # flow control is not simulated
        elif isinstance(a, DdlOutcome):
            raise Violation("the simulation makes no schema changes")
        elif isinstance(a, CatchUp):
            self._start_catchup(a)
        elif isinstance(a, LogQueried):
            if a.node != self.name:
                self.send(bp.LogInfo(a.node, a.request_id, self.name, f"sim:{self.name}",
                                     self.host.log.base_gid, self.host.log.end_gid, self.book.watermark,
                                     len(self.book.pending)))
        elif isinstance(a, LogOffered):
            if a.info.request_id in self.offers:
                self.offers[a.info.request_id].append(a.info)
        elif isinstance(a, VoteOpened):
            self.voting.opened(a.gid)
        elif isinstance(a, VoteDecided):
            self.sim.trace(self.name, f"vote on GID {a.gid}: {'applied' if a.ok else 'failed'} ({a.detail})")
            self.voting.decided(a)
        elif isinstance(a, SyncReached):
            pass
        elif isinstance(a, PhaseChange):
            self.phase_reason = a.reason
            self.sim.trace(self.name, f"phase {a.phase.value}: {a.reason}")
            self.sim.checker.phase_changed(self.host, a)
            if a.phase in (Phase.RECOVERING, Phase.ONLINE):
                self.voting.rejoined()
        elif isinstance(a, Remember):
            self.host.state = self.host.state.with_(epochs=a.epochs, records=dict(a.records))
        elif isinstance(a, Joined):
            self.host.state = self.host.state.with_(cluster_uuid=a.cluster_uuid, bootstrap=False,
                                                    safe_to_bootstrap=False, last_gid=a.gid)
        elif isinstance(a, Reconfigure):  # the state file, before anything after it
            self.host.state = self.host.state.with_(config=a.config)
            self.sim.trace(self.name, f"configured nodes {','.join(a.config.nodes)} (version {a.config.version})")
        elif isinstance(a, Reconfigured):  # the operator who asked is told
            self.sim.answers[a.request_id] = a
        elif isinstance(a, Removed):  # Coordinator._removed: recorded, then the process ends
            self.host.state = self.host.state.with_(removed=a.reason)
            self.sim.trace(self.name, f"removed: {a.reason}")
            self.sim.clock.after(0.0, self.crash)
        else:
            raise Violation(f"unknown action {a!r}")

    def send(self, m: bp.Message) -> None:
        """A message of the control plane (voting, catch-up): through the core's sender."""
        if self.alive:
            self.feed(ev.Send(bp.encode(m)))

    def _tick(self) -> None:
        if not self.alive:
            return
        self.sim.clock.after(TICK_S, self._tick)
        if self.frozen:
            return
        now = self.sim.clock.now
        self.feed(ev.Tick())
        db = self.host.db
        if not self.db_ok:
            return
        if not db.up or self.db_seen != self.host.db_generation:
            self._database_lost()
            return
        self.feed(ev.DbCommitted(db.last))
        self.voting.check_due()
        db.flush()  # chorus.durable_gid() flushes
        self.feed(ev.DbDurable(db.flushed))
        if now - self.last_progress >= PROGRESS_EVERY_S:
            self.last_progress = now
            self.feed(ev.Call("progress", 0, ""))
        self.sim.checker.tick(self)

    def crash(self, detect: float = PROCESS_CHANGE_S) -> None:
        """The coordinator process ends (killed, or the bus failed); the others see it leave after
        ``detect`` (at once for a process; after the token timeout when its host or Corosync died)."""
        if not self.alive:
            return
        self.alive = False
        self.catchup_token += 1
        for token in self.lock_tokens:  # its sessions' transactions end with their connections
            self.host.db.release(token)
        for t in [*self.tickets.values(), *(t for t, _ in self.socket)]:
            t.state = "unknown"  # their backends lose the connection (08006)
        for gid, (t, _) in self.backends.items():
            p = self.book.pending.get(gid)
            if t.state == "certified" and p is not None:
                # a certified backend needs its coordinator no more: it commits at its turn
                # (chorus_wait_own_turn), holding its rows meanwhile
                self.host.orphan(t, [k.hashed() for k in p.writeset.keys if len(k.parts) == 4])
            elif t.state == "certified":
                t.state = "unknown"
        self.sim.bus.drop(self.member, detect)

    # -- the database (coordinator._database_lost, pipeline.restart)

    def _database_lost(self) -> None:
        if not self.db_ok:
            return
        self.feed(ev.DbLost())
        self.reapplying, self.reapply_target = True, None
        self.sim.trace(self.name, "lost PostgreSQL; reconnecting")
        self._wait_database()

    def _wait_database(self) -> None:
        if not self.alive:
            return
        db = self.host.db
        if not db.up or db.frozen:
            self.sim.clock.after(0.5, self._wait_database)
            return
        db.flush()  # nodedb.start_node, as at the coordinator's start
        self.db_seen = self.host.db_generation
        self.feed(ev.DbBack(db.last))

    # -- local transactions (commit/backends.py)

    def refusal(self) -> Optional[str]:
        if not self.alive:
            return "no coordinator"
        if not self.r.accepts_writes or not self.db_ok or not self.host.db.up:
            return self.phase_reason
        if self.reapplying:
            # coordinator._reapplied: writes wait until this node's writesets on the bus are settled
            # and PostgreSQL, back, has every GID certified by then again
            if self.reapply_target is None and not self.r.local_in_flight():
                self.reapply_target = self.r.last_certified
            if self.reapply_target is None or self.book.watermark < self.reapply_target:
                return "re-applying the certified writesets PostgreSQL lost"
            self.reapplying, self.reapply_target = False, None
        return None

    def submit(self, txn: Txn, keys: list[int], defer: bool = False) -> None:
        """A backend's writeset, taken (it was accepting writes): it leaves with the next pump
        (bus.sender.BusSender.queue_writeset), so a freeze in between holds it until the thaw;
        ``defer``: not before the end of the bus batch being read."""
        if self.host.lost_gid > txn.last_seen:
            txn.state = "refused"  # chorus_check_lost at its commit: 40001
            return
        if self.r.stale_local(txn.last_seen) is not None:
            txn.state = "refused"  # backends.BackendServer._writeset: 40001 before it is ordered
            return
        payload = make_writeset(txn.xid, txn.last_seen, keys)
        ticket = self.feed(ev.WritesetEv(payload))
        self.tickets[ticket] = txn
        if not self._pump_scheduled and not defer:
            self._pump_scheduled = True
            self.sim.clock.after(self.sim.rnd.random() * 0.001, self.pump)

    def backends_died(self) -> None:
        """Its PostgreSQL restarted: the old one's backends are gone, and with them their sockets
        (commit/backends.BackendServer.closed). A writeset still waiting for its verdict is no
        one's: the core replays it if the cluster certifies it, and its client hears nothing."""
        gen = self.host.db_generation
        for ticket, txn in list(self.tickets.items()):
            if txn.generation != gen:
                del self.tickets[ticket]
                txn.state = "unknown"
                self.feed(ev.Call("backend_gone", ticket, ""))
        for txn, _ in self.socket:
            if txn.generation != gen:
                txn.state = "unknown"
        self.socket = [(t, k) for t, k in self.socket if t.generation == gen]

    def thawed(self) -> None:
        """SIGCONT: the backends' frames that reached its socket just before the freeze are read
        in the same loop turn as the bus events that piled up (here: before them, while the node
        still thinks it is online); their writesets leave at the end of that bus batch. Sockets
        of backends that died with a PostgreSQL restarted meanwhile read as closed first."""
        self.backends_died()
        frames, self.socket = self.socket, []
        for txn, keys in frames:
            if self.refusal() is None:
                self.submit(txn, keys, defer=True)
            else:
                txn.state = "refused"

    def pump(self) -> None:
        """Send the queued local writesets as one message, if no writeset message of this node is
        on the bus (bus.sender.BusSender.pump: one in flight; another leaves once it comes back or
        a view changes, so after a freeze they leave after the node's GID request)."""
        self._pump_scheduled = False
        if not self.alive or self.frozen:
            return
        self.feed(ev.Flush())

    def _verdict(self, v: ev.Verdict) -> None:
        txn = self.tickets.pop(v.ticket, None)
        if not v.ok:
            if txn is not None:
                txn.state = "unknown" if v.unknown else "failed"
            return
        assert txn is not None
        txn.state, txn.gid, txn.wait_for = "certified", v.gid, v.wait_for
        self.backends[v.gid] = (txn, v.obj)
        self.sim.clock.after(0.0005, self._backend_commit, v.gid, txn.generation)

    def _backend_commit(self, gid: int, generation: int) -> None:
        """The local backend waits for its turn and commits (flushed)."""
        got = self.backends.get(gid)
        if got is None or not self.alive:
            return
        txn, b = got
        db = self.host.db
        if generation != self.host.db_generation or not db.up:
            self.backends.pop(gid, None)
            txn.state = "unknown"  # its connection died with PostgreSQL
            return
        if db.frozen or db.last < txn.wait_for:
            self.sim.clock.after(0.002, self._backend_commit, gid, generation)
            return
        self.backends.pop(gid, None)
        if db.last >= gid:
            # the pipeline applied it over the rows its live backend holds: the real apply would
            # have waited for them (only a backend gone, with its PostgreSQL or its session, is
            # replayed: backends_died, Host.orphan)
            txn.state = "unknown"
            raise Violation(f"{self.name}: GID {gid} applied by the pipeline while its backend, alive, waited for its turn")
        p = self.book.pending.get(gid)
        if p is None or p.backend is not b:
            txn.state = "unknown"
            self.host.lost(txn)
            return
        db.commit([(gid, txn.xid)])
        db.flush()
        self.sim.checker.committed(self.host, [gid])
        txn.state = "committed"
        self.sim.checker.ack(txn)
        self.local_done(gid)

    # -- the commit pipeline (commit/pipeline.py): its decisions are the core's

    def local_done(self, gid: int) -> None:
        self.feed(ev.Committed(gid))

    # -- inconsistency voting (voting.py; coordinator._leave, pipeline.commit_skipped)

    def _commit_skipped(self, gid: int) -> None:
        if self.book.pending.get(gid) is not None:
            self.sim.trace(self.name, f"GID {gid}: the majority could not apply it either; it commits empty here")
            self.feed(ev.Skip(gid))

    def _leave_by_vote(self, why: str) -> None:
        if not self.alive:
            return
        self.sim.trace(self.name, f"leaves: {why}")
        self.host.state = self.host.state.with_(left_by_vote=why)
        self.crash()

    def _fails_here(self, p: Pending) -> bool:
        """A remote writeset touching a row someone changed here behind Chorus's back."""
        tampered = self.host.db.tampered
        return bool(tampered) and p.origin != self.name and not p.skip and any(
            len(k.parts) == 4 and int(k.parts[3]) in tampered for ws in p.run() for k in ws.keys)

    def dispatch(self) -> None:
        """CommitPipeline.dispatch_soon came due."""
        if self.alive:
            self.feed(ev.Dispatch())

    def _start_apply(self, run: list[int], replay: bool, epoch: int) -> None:
        token = next(self.sim.tokens)
        self.lock_tokens.add(token)
        self.sim.clock.after(0.001 + self.sim.rnd.random() * 0.004, self._try_apply, run, replay, epoch, token)

    def _result(self, outcome: ApplyOutcome, run: list[int], replay: bool, epoch: int, committed: int = 0,
                error: str = "") -> None:
        self.feed(ev.ApplyResult(outcome, replay, epoch, tuple(run), committed, error))

    def _try_apply(self, run: list[int], replay: bool, epoch: int, token: int = 0) -> None:
        if not self.alive or epoch != self.epoch:
            self.host.db.release(token)
            return
        db = self.host.db
        if not db.up:
            self._result(ApplyOutcome.DB_DOWN, run, replay, epoch)
            self._database_lost()
            return
        ps = [self.book.pending.get(g) for g in run]
        if any(p is None for p in ps):
            db.release(token)
            self._result(ApplyOutcome.GONE, run, replay, epoch)
            return
        first = ps[0]
        assert first is not None
        rows = [k.hashed() for p in ps if p is not None for ws in p.run() for k in ws.keys if len(k.parts) == 4]
        if db.frozen or not db.lock(token, rows) or db.last < first.wait_for:
            # it takes its rows' locks as it runs, then waits for its commit turn holding them
            self.sim.clock.after(0.002, self._try_apply, run, replay, epoch, token)
            return
        if not replay and any(p is not None and self._fails_here(p) for p in ps):
            # pipeline._apply_failed, before the session is idle again: a run is tried GID by
            # GID (back at the queue's head, first again); a GID alone goes to the vote
            db.release(token)
            self._result(ApplyOutcome.FAILED, run, replay, epoch, error="a row it changes is not as its origin had it")
            return
        gids: list[tuple[int, int]] = []
        for p in ps:
            assert p is not None
            for g, ws in zip((*p.before_gids, p.gid), p.run()):
                gids.append((g, ws.xid))
        if first.wait_for < db.last < gids[-1][0]:
            # chorus_apply_run: ERRCODE_CHORUS_PARTLY_COMMITTED (a backend of the previous
            # coordinator committed the first GIDs); pipeline._apply_failed decides
            if db.last not in [g for g, _ in gids]:
                raise Violation(f"{self.name}: GIDs {[g for g, _ in gids]} would commit after GID {db.last}, "
                                f"past their turn (they wait for {first.wait_for})")
            db.release(token)
            self.lock_tokens.discard(token)
            self.sim.trace(self.name, f"GIDs {run[0]}..{run[-1]}: partly committed here (up to GID {db.last})")
            self._result(ApplyOutcome.PARTLY, run, replay, epoch, committed=db.last)
            return
        # committed whole already: ERRCODE_CHORUS_ALREADY_COMMITTED, nothing to do
        todo = [x for x in gids if x[0] > db.last]
        db.release(token)
        self.lock_tokens.discard(token)
        if todo:
            db.commit(todo)
            self.sim.checker.committed(self.host, [g for g, _ in todo])
        self._result(ApplyOutcome.OK, run, replay, epoch)

    # -- catch-up (catchup.py), its partner side (recovery.RecoveryServer)

    def _start_catchup(self, c: CatchUp) -> None:
        self.catchup_token += 1
        self._advance(self.plan.start(c), self.catchup_token, None, None)

    def _admit_held(self, actions: list[Action]) -> None:
        applies = []
        for a in actions:
            if not isinstance(a, Apply):
                raise Violation("the simulation makes no schema changes")
            applies.append((a.gid, a.prev, a.origin, a.settle, a.writeset.raw or wire.encode(a.writeset)))
        self.feed(ev.AdmitHeld(tuple(applies), obj=actions))

    def _advance(self, steps: Steps, token: int, result: Any, error: Optional[BaseException]) -> None:
        while True:
            if not self.alive or token != self.catchup_token:
                steps.close()
                return
            if self.frozen:
                self.sim.clock.after(0.1, self._advance, steps, token, result, error)
                return
            try:
                step = steps.send(result) if error is None else steps.throw(error)
            except StopIteration:
                return
            result, error = None, None
            if isinstance(step, Act):
                if step.actions:  # the live writesets held; the order core's calls acted already
                    self._admit_held(step.actions)
                continue
            if isinstance(step, Wait):
                self.sim.clock.after(step.seconds, self._advance, steps, token, None, None)
            elif isinstance(step, WaitCommitted):
                self._wait_committed(steps, token, step.gid)
            elif isinstance(step, AskLogs):
                rid = f"{self.name}-{self.sim.rnd.getrandbits(32):08x}"
                self.offers[rid] = []
                self.send(bp.LogQuery(self.name, rid))
                self._collect(steps, token, rid, step.members, self.sim.clock.now + LOG_QUERY_WAIT_S)
            elif isinstance(step, Fetch):
                self.sim.streams.open(self, steps, token, step)
            return

    def _wait_committed(self, steps: Steps, token: int, gid: int) -> None:
        if not self.alive or token != self.catchup_token:
            steps.close()
        elif self.book.watermark >= gid or not self.plan.live():
            self._advance(steps, token, None, None)
        else:
            self.sim.clock.after(0.05, self._wait_committed, steps, token, gid)

    def _collect(self, steps: Steps, token: int, rid: str, members: frozenset[str], deadline: float) -> None:
        got = self.offers.get(rid, [])
        if self.sim.clock.now >= deadline or members <= {o.partner for o in got}:
            self.offers.pop(rid, None)
            self._advance(steps, token, got, None)
        else:
            self.sim.clock.after(0.02, self._collect, steps, token, rid, members, deadline)




class Streams:
    """Recovery streams: a joiner's Fetch served from a partner's log (recovery.py), over a TCP
    connection that a partition stalls and a crash breaks."""

    def __init__(self, sim: "Sim") -> None:
        self.sim = sim

    def open(self, joiner: Coord, steps: Steps, token: int, step: Fetch) -> None:
        partner = self.sim.hosts.get(step.partner.partner)

        def fail(why: str, after: float) -> None:
            self.sim.clock.after(after, joiner._advance, steps, token, None, RecoveryError(why))

        if partner is None or not self.sim.reachable(joiner.host, partner):
            fail(f"cannot connect to {step.partner.partner}", CONNECT_TIMEOUT_S)
            return
        p = partner.coord
        if p is None or not p.alive:
            fail(f"{step.partner.partner} refused the connection", 0.001)
            return
        stop = min(step.upto, p.book.watermark)
        try:
            recs = partner.log.read(step.after, stop)
        except RecoveryError as e:
            fail(str(e), 0.002)
            return
        self.sim.clock.after(0.002, self._next, joiner, p, steps, token, recs, 0, stop, self.sim.clock.now, step.run)

    def _next(self, joiner: Coord, partner: Coord, steps: Steps, token: int, recs: list[LogRecord], i: int,
              stop: int, last_frame: float, run: object) -> None:
        if not joiner.alive:
            steps.close()
            return
        # a stream goes on when a newer catch-up began (catchup.py's fetch of the older one runs
        # until a record it hands over is refused); its records must not enter the newer one
        now = self.sim.clock.now
        if not partner.alive:
            joiner._advance(steps, token, None, RecoveryError(f"stream from {partner.name} broke"))
            return
        if not self.sim.reachable(joiner.host, partner.host) or partner.frozen or joiner.frozen:
            if now - last_frame >= FRAME_TIMEOUT_S:
                joiner._advance(steps, token, None, RecoveryError(f"{partner.name} sent nothing for 30 s"))
            else:
                self.sim.clock.after(0.5, self._next, joiner, partner, steps, token, recs, i, stop, last_frame, run)
            return
        if i >= len(recs):
            joiner._advance(steps, token, stop, None)
            return
        if len(joiner.book.pending) > CATCHUP_WINDOW:
            self.sim.clock.after(0.005, self._next, joiner, partner, steps, token, recs, i, stop, now, run)
            return
        rec = recs[i]
        if partner.host.log.base >= rec.gid:  # the ring reused the segment under the reader
            joiner._advance(steps, token, None, RecoveryError("range unavailable: the partner's log moved on"))
            return
        try:
            joiner.plan.take(rec, run)
        except Abandoned:
            steps.close()
            return
        self.sim.clock.after(0.0003, self._next, joiner, partner, steps, token, recs, i + 1, stop, now, run)


# ---- hosts ------------------------------------------------------------------------------------


class Host:
    """A machine: its disk (database, log, state file), and the processes on it."""

    def __init__(self, sim: "Sim", index: int, log_capacity: int) -> None:
        self.sim = sim
        self.index = index
        self.name = f"n{index}"
        self.db = SimDB(sim.writes)
        self.db_generation = 0  # PostgreSQL restarts: a backend of an older one is gone
        # the extension's lost GID (chorus_note_lost): the newest certified local GID whose session
        # ended uncommitted; it is in shared memory, so a PostgreSQL restart clears it
        self.lost_gid = 0
        self.log = SimLog(log_capacity)
        self.state = NodeState(self.name)
        self.coord: Optional[Coord] = None
        self.rows: dict[int, Txn] = {}  # row -> the last local transaction that wrote it
        self.node_epoch = 0  # chorus.node_init() calls: each coordinator's start
        self.bus_up = True  # its Corosync
        self.powered = True
        self.frozen = False  # its processes are SIGSTOPped (those running when it froze)
        self._incarnation = itertools.count(1)

    def start_coordinator(self) -> None:
        if self.coord is not None and self.coord.alive:
            return
        if self.state.left_by_vote or self.state.removed or not self.bus_up or not self.powered:
            return
        if not self.db.up:
            return  # it waits for its database (started again with PostgreSQL)
        self.coord = Coord(self, f"{self.index}:{next(self._incarnation)}")
        self.sim.trace(self.name, f"coordinator started at GID {self.db.last} as {self.coord.member}")

    def rows_busy(self, txn: Txn, keys: list[int]) -> bool:
        """Whether another open transaction of this node wrote one of ``keys``."""
        return any((t := self.rows.get(k)) is not None and t is not txn and t.state in ("sent", "certified")
                   for k in keys)

    def take_rows(self, txn: Txn, keys: list[int]) -> None:
        """``txn`` writes ``keys`` now: it read each row as this node's database has it."""
        txn.last_seen = self.db.last
        txn.generation = self.db_generation
        self.sim.reads[txn.xid] = {k: self.db.writer.get(k, 0) for k in keys}
        for k in keys:
            self.rows[k] = txn

    def lost(self, txn: Txn) -> None:
        """A certified local transaction's session ends without committing it (chorus_note_lost:
        its row locks are released uncommitted; it is applied from its writeset)."""
        self.lost_gid = max(self.lost_gid, txn.gid)

    def orphan(self, txn: Txn, rows: list[bytes]) -> None:
        """A certified local transaction whose coordinator ended: its backend holds its rows and
        commits at its turn, acknowledged, unless PostgreSQL goes first, or the next coordinator
        starts before its turn came (chorus.node_init() changes the epoch: chorus_wait_done fails
        with 08006). One whose turn had come when PostgreSQL stalled commits when it resumes."""
        token = next(self.sim.tokens)
        self.db.lock(token, rows)  # it held them since it wrote them
        self.sim.trace(self.name, f"GID {txn.gid}: its backend commits without its coordinator")
        self._orphan_commit(txn, token, self.db_generation, self.node_epoch, False)

    def _orphan_commit(self, txn: Txn, token: int, generation: int, epoch: int, turn: bool) -> None:
        db = self.db
        if generation != self.db_generation or not db.up or (not turn and epoch != self.node_epoch):
            txn.state = "unknown"  # its connection died with PostgreSQL, or the node was reset
            if generation == self.db_generation and db.up:
                self.lost(txn)  # its session ends at the epoch's change, before its row locks go
            db.release(token)
            return
        turn = turn or db.last >= txn.wait_for
        if db.frozen or not turn:
            self.sim.clock.after(0.002, self._orphan_commit, txn, token, generation, epoch, turn)
            return
        db.release(token)
        if db.last != txn.wait_for:
            raise Violation(f"{self.name}: GID {txn.gid} of a backend holding its rows found GID {db.last} "
                            f"committed at its turn (it waits for {txn.wait_for})")
        db.commit([(txn.gid, txn.xid)])
        db.flush()
        self.sim.checker.committed(self, [txn.gid])
        txn.state = "committed"
        self.sim.checker.ack(txn)

    @property
    def phase(self) -> str:
        if self.coord is None or not self.coord.alive:
            return "down"
        return self.coord.r.phase.value


# ---- the world --------------------------------------------------------------------------------


class Sim:
    def __init__(self, seed: int, n: int = 3, log_capacity: int = 400, trace: bool = False,
                 keep_trace: int = 400, record: bool = False) -> None:
        self.seed = seed
        # ``record``: every coordinator's core input and output goes to a trace (dataplane/trace.py),
        # one per coordinator started, in ``traces`` by "n<host>-<incarnation>"
        self.traces: dict[str, TraceWriter] = {}
        self.recorder: Optional[Callable[[Coord], TraceWriter]] = self._record if record else None
        self.rnd = random.Random(seed)
        self.clock = Clock()
        self.writes: dict[int, list[int]] = {}  # each client transaction's xid -> the rows it writes
        self.reads: dict[int, dict[int, int]] = {}  # xid -> the GID of each row's version it changed
        self.tracing = trace
        self.lines: deque[str] = deque(maxlen=None if trace else keep_trace)
        self.hosts: dict[str, Host] = {f"n{i}": Host(self, i, log_capacity) for i in range(1, n + 1)}
        self.bus = SimBus(self, n, "1" if n % 2 == 0 else "")
        self.streams = Streams(self)
        self.partition: Optional[list[list[int]]] = None  # host groups; None: one network
        from simchecks import Checker
        self.checker = Checker(self)
        self._xid = itertools.count(1)
        self.tokens = itertools.count(1)
        self.txns: list[Txn] = []
        self.answers: dict[str, Reconfigured] = {}  # `chorus node add`/`remove`: each request's outcome
        self.log_capacity = log_capacity
        _deterministic_uuids(self.rnd)

    def add_host(self) -> Host:
        """A new machine (`chorus node add`): an empty database, not started, in no view yet."""
        index = max(h.index for h in self.hosts.values()) + 1
        h = self.hosts[f"n{index}"] = Host(self, index, self.log_capacity)
        return h

    def _record(self, c: Coord) -> TraceWriter:
        from chorus.certifier import IMPL as certifier_impl
        from chorus.commit.scheduler import IMPL as scheduler_impl
        w = TraceWriter({"node": c.name, "member": c.member, "source": "tests/sim", "seed": self.seed,
                         "at": self.clock.now, "certifier": certifier_impl, "scheduler": scheduler_impl,
                         "bus_version": bp.VERSION, "writeset_version": wire.VERSION})
        self.traces[f"{c.name}-{c.member.partition(':')[2]}"] = w
        return w

    def trace(self, who: str, what: str) -> None:
        self.lines.append(f"{self.clock.now:9.3f} {who:>4} {what}")
        if self.tracing:
            print(self.lines[-1])

    def net_group(self, host: int) -> int:
        if self.partition is None:
            return 0
        for i, g in enumerate(self.partition):
            if host in g:
                return i
        return 1000 + host  # in no group: alone

    def reachable(self, a: Host, b: Host) -> bool:
        return a.powered and b.powered and self.net_group(a.index) == self.net_group(b.index)

    def coords(self) -> list[Coord]:
        return [h.coord for h in self.hosts.values() if h.coord is not None and h.coord.alive]

    # -- clients

    def client_txn(self, host: Host) -> None:
        c = host.coord
        txn = Txn(host.name, host.index * 10_000_000 + next(self._xid))
        if c is None or c.refusal() is not None:
            txn.state = "refused"
            return
        keys = self.rnd.sample(range(KEYS), self.rnd.choice((1, 1, 2)))
        self.writes[txn.xid] = keys
        if c.frozen:
            # its PostgreSQL is stopped too: only a COMMIT sent just before the freeze is waiting
            if len(c.socket) < 3 and not host.rows_busy(txn, keys):
                self.txns.append(txn)
                host.take_rows(txn, keys)
                c.socket.append((txn, keys))
            return
        self.txns.append(txn)
        self._when_rows_free(host, txn, keys)

    def _when_rows_free(self, host: Host, txn: Txn, keys: list[int]) -> None:
        """PostgreSQL's row locks between a node's own sessions: a transaction writing a row that
        another one of the node has written and not yet committed waits for it, and then sees its
        commit (writesets of one node do not conflict in certification: these locks order them)."""
        if host.rows_busy(txn, keys):
            self.clock.after(0.002, self._when_rows_free, host, txn, keys)
            return
        c = host.coord
        if c is None or c.refusal() is not None:
            txn.state = "refused"
            return
        host.take_rows(txn, keys)
        c.submit(txn, keys)


def _replicator_uuid4() -> uuid.UUID:
    """What the replicator draws its ids from (chorus.replicator._uuid4: the seed's, below)."""
    import chorus.replicator as replicator_module
    return replicator_module.uuid.uuid4()


def _deterministic_uuids(rnd: random.Random) -> None:
    """uuid4 (request ids, a new cluster's UUID) from the seed, so that a seed replays exactly."""
    import chorus.replicator as replicator_module

    class _Uuid:
        @staticmethod
        def uuid4() -> uuid.UUID:
            return uuid.UUID(int=rnd.getrandbits(128), version=4)

    replicator_module.uuid = _Uuid  # type: ignore[assignment]


logging.getLogger("chorus").setLevel(logging.ERROR)
