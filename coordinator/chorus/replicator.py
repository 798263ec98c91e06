"""The replication core: bus events in, decisions out (no I/O).

It assigns GIDs in delivery order (seed 7.1), certifies (seed 6), runs the join handshake
(seed 8.1: a joiner multicasts a GID request and the lowest synced member answers with the GID at
the request's own position plus the certification index there), bootstraps when told (seed 8.2),
tracks which nodes are members of the primary component (synced, or recovering) and whether this
node is in it (seed 8.4), re-forms it when a quorate view has no synced member (history.py,
docs/RECOVERY.md), and purges the certification index below the cluster-wide committed minimum.

The coordinator feeds it :meth:`on_view`, :meth:`on_delivery` and :meth:`tick`, and carries out
the returned actions. Every node that sees the same event stream makes the same decisions.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from chorus import history, wire
from chorus.actions import (Action, Apply, CatchUp, DdlOutcome, Joined, LocalVerdict, LogOffered, LogQueried,
                            Pause, Phase, PhaseChange, Remember, Send, SyncReached, VoteDecided, VoteOpened)
from chorus.bus import proto as bp
from chorus.bus import Delivery, View, Votes, bus_node
from chorus.history import Decision, Epoch, MemberRecord
from chorus.certifier import OK, CertificationIndex, Certifier, Verdict
from chorus.outcomes import Outcome, OutcomeIndex

log = logging.getLogger("chorus.replicator")

REQUEST_RETRY_S = 2.0
BOOTSTRAP_WAIT_S = 3.0
CONFLICT_HISTORY = 1000  # certification failures kept (chorus.conflicts)

# phases in which the node follows the total order (certifies every writeset)
_FOLLOWING = (Phase.ONLINE, Phase.RECOVERING)


@dataclass
class _Ballot:
    voters: frozenset[str]  # the nodes online when the vote opened
    votes: dict[str, tuple[bool, str]] = field(default_factory=dict)
    schema: bool = False  # a schema change's reports: every voter must have applied it


@dataclass(frozen=True)
class Holding:
    """What this node's disk holds, for a GID request (the coordinator's ``holding``): the GID its
    database holds or will once what it admitted commits, and its writeset log's range."""
    gid: int
    log_after: int = 0
    log_high: int = 0


@dataclass
class Stats:
    delivered: int = 0
    certified: int = 0
    cert_failures: int = 0
    local_certified: int = 0
    local_failed: int = 0
    remote_certified: int = 0
    malformed: int = 0
    # certification failures by the table of the key they conflicted on ("schema.table"; ""
    # for a snapshot too old)
    failures_by_table: dict[str, int] = field(default_factory=dict)


def _unstable_entry(node: str, gid: int, a: Action) -> tuple[int, int, str, bytes]:
    """A held writeset as a GID answer carries it: (GID, the GID before it, origin, writeset);
    ``node`` is the answering node, the origin of its local ones."""
    if isinstance(a, LocalVerdict):
        assert a.writeset is not None
        return gid, a.prev, node, a.writeset.raw or wire.encode(a.writeset)
    assert isinstance(a, Apply)
    return gid, a.prev, a.origin, a.writeset.raw or wire.encode(a.writeset)


@dataclass(frozen=True)
class Conflict:
    """One certification failure, as every node saw it (they certify alike)."""
    at: float  # wall-clock time this node certified it
    gid: int  # the losing writeset's place in the total order
    loser_node: str
    loser_xid: int  # its transaction on its origin node
    loser_pid: int  # its origin backend's process
    schema: str  # the key's table ("" for a snapshot too old)
    table: str
    key: str  # the key's columns and values, "(id)=(5)", or "(table)" for a table key
    winner_gid: int  # the writeset that wrote it first (0 for a snapshot too old)
    winner_node: str  # its origin ("" for a schema change)
    reason: str

    @staticmethod
    def of(at: float, gid: int, origin: str, ws: wire.Writeset, v: Verdict) -> "Conflict":
        parts = [p.decode("utf-8", "replace") for p in v.key.parts] if v.key is not None else []
        if len(parts) >= 3:
            key = f"({parts[2]})=({', '.join(parts[3:])})"
        else:
            key = "(table)" if len(parts) == 2 else ""
        schema, table = (parts[0], parts[1]) if len(parts) >= 2 else ("", "")
        return Conflict(at, gid, origin, ws.xid, ws.pid, schema, table, key, v.conflict_gid, v.conflict_origin,
                        v.reason)

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "gid": self.gid, "loser_node": self.loser_node, "loser_xid": self.loser_xid,
                "loser_pid": self.loser_pid, "schema": self.schema, "table": self.table, "key": self.key,
                "winner_gid": self.winner_gid, "winner_node": self.winner_node, "reason": self.reason}


@dataclass
class Replicator:
    node: str
    cluster_uuid: str  # "" until the node has joined a cluster
    last_gid: int  # durable committed GID of the local database at start
    # the highest GID the database has committed: above last_gid only with several commit lanes,
    # where a crash can leave commits above the watermark (docs/APPLY.md)
    max_committed: int = 0
    bootstrap: bool = False  # told to start a new cluster if none answers
    # The database's encoding and PostgreSQL major version: a node whose data would be read
    # differently (another encoding, another binary format) does not join.
    compat: str = ""
    # Coordinators sharing one bus node (a local cluster): votes count them, not bus nodes, so
    # no node goes on alone after the others stopped. 0: one vote per bus node.
    member_votes: int = 0
    phase: Phase = Phase.CONNECTING
    gid: int = 0
    last_certified: int = 0
    quorate: bool = False
    local_member: str = ""
    certifier: CertificationIndex = field(default_factory=Certifier)
    # certification history kept below the cluster-wide committed minimum, in GIDs: a
    # transaction whose snapshot is older than this fails as "snapshot too old"
    history: int = 20000
    ddl_open: dict[int, str] = field(default_factory=dict)  # schema change GID -> origin node
    # Writesets delivered while a schema change's outcome is open: certified once it is known
    # (its content's keys recorded first), in GID order. Every node defers alike.
    _deferred: list[tuple[int, bp.WritesetMsg, wire.Writeset]] = field(default_factory=list)
    # inconsistency voting: open ballots by GID, and the outcomes decided (the last ones)
    ballots: dict[int, _Ballot] = field(default_factory=dict)
    decided: dict[int, bool] = field(default_factory=dict)
    # schema changes settled by every node's report (the last ones): committed, or undone
    settled: dict[int, bool] = field(default_factory=dict)
    online: dict[str, str] = field(default_factory=dict)  # node name -> bus member id
    progress: dict[str, int] = field(default_factory=dict)
    members: tuple[str, ...] = ()
    stats: Stats = field(default_factory=Stats)
    _request_id: str = ""
    _request_seen: bool = False
    _request_at: float = 0.0
    _joining_since: float = 0.0
    _buffer: list[Delivery] = field(default_factory=list)
    _requesters: dict[str, str] = field(default_factory=dict)  # GID request id -> bus member
    # local writesets the coordinator scanned (validated) when the backend sent them, by ticket
    _local_scanned: dict[int, wire.Writeset] = field(default_factory=dict)
    paused_by: set[str] = field(default_factory=set)  # nodes that asked the cluster to slow down
    _paused: bool = False  # the last Pause returned
    # Uniform commit. Corosync delivers in agreed order, not uniformly: a node may deliver a
    # message that no other node receives before a partition cuts it off. So a certified
    # writeset is released (to be committed, logged, or answered to its backend) only once bus
    # nodes with a quorum of votes have delivered it; any later primary component then holds
    # it. A node alone on its bus node (the local cluster: quorum 1) releases at once.
    votes: Votes = field(default_factory=Votes)
    released: int = 0  # the last GID released
    # the last certification failures, oldest first (chorus.conflicts; every node keeps the same
    # ones, but the time each saw them); ``clock`` gives their time
    conflicts: deque[Conflict] = field(default_factory=lambda: deque(maxlen=CONFLICT_HISTORY))
    # the outcome of each writeset certified here, for chorus.commit_outcome (outcomes.py)
    outcomes: OutcomeIndex = field(default_factory=OutcomeIndex)
    clock: Callable[[], float] = time.time
    received: dict[str, int] = field(default_factory=dict)  # bus node -> GID it reported delivered
    _unstable: list[tuple[int, Action]] = field(default_factory=list)  # certified, not yet released
    _reported: int = 0
    _report_on_bus: bool = False
    _report_last_tick: int = -1  # the report that was on the bus at the previous tick
    # re-forming a primary component that no member has: the GID requests of this view
    _requests: dict[str, bp.GidRequest] = field(default_factory=dict)  # bus member -> its latest request
    # A node that asked to join at GID g never delivered the GIDs up to g: until it is online
    # (caught up, it sends Progress) its reports vouch only for GIDs after g.
    # (the answer to its request says from which GID: the answering node gives it the writesets
    # it has not released yet, so it delivered every GID after the answerer's ``released``)
    _joined_at: dict[str, int] = field(default_factory=dict)  # bus node -> GID it vouches after
    _reform_sent: bool = False
    _reform_at: float = 0.0
    # The members of the primary component (``online``) that are synced: the others are catching
    # up. A quorate view whose members include none has no primary component (it re-forms).
    synced: set[str] = field(default_factory=set)
    # What the node knows of the history (history.py; its state file): the epochs it followed
    # and, for each node it was in the primary component with, whether it was a member or left.
    epochs: tuple[Epoch, ...] = ()
    records: dict[str, MemberRecord] = field(default_factory=dict)
    # what the node's disk holds, for its GID requests (the coordinator's; None: ``last_gid``)
    holding: Optional[Callable[[], Holding]] = None
    reform: Optional[Decision] = None  # the last re-form decision that named no winner (status)
    _request_join: bool = True  # the last request asks to join (else: stays out, takes part in a re-form)
    _requests_by_id: dict[str, bp.GidRequest] = field(default_factory=dict)  # this view's requests, by id
    # every node's latest GID request (request id, bus member): an answer to an earlier one is
    # stale (the node asked again meanwhile), and every node ignores it alike
    _latest_request: dict[str, tuple[str, str]] = field(default_factory=dict)
    _sync_sent: bool = False  # caught up: its Progress saying so is on the bus
    # Live writesets after a catch-up's range are held by the coordinator until the range is
    # applied; released ones are admitted (and so will be held by the database) only after that.
    _catching_up: bool = False
    _will_hold: int = 0  # the last GID released to be admitted when the node left the primary component
    _now: float = 0.0

    # ---- inputs ------------------------------------------------------------------------

    def expect_local(self, ticket: int, writeset: wire.Writeset) -> None:
        """A local backend's writeset, scanned, goes to the bus with ``ticket``: when it is
        delivered back it is not parsed again."""
        self._local_scanned[ticket] = writeset

    def forget_local(self, ticket: int) -> None:
        """The writeset of ``ticket`` never reached the bus."""
        self._local_scanned.pop(ticket, None)

    def on_view(self, view: View, now: float) -> list[Action]:
        out: list[Action] = []
        previous = set(self.members)
        self.members = view.members
        self.local_member = view.local
        nodes = {bus_node(m) for m in view.members}
        if self.member_votes:
            quorate = 2 * len(view.members) > self.member_votes
        elif view.expected:
            # The configured votes are known: decide from the view alone. Every member delivers
            # it at the same place in the total order, so all decide alike; votequorum's flag is
            # read asynchronously and can differ between nodes for a moment (a node that left
            # on a lagging flag while the others stayed was seen to stall the group).
            quorate = view.votes.holds(nodes)
        else:
            quorate = view.quorate and view.votes.holds(nodes)
        was_quorate, self.quorate = self.quorate, quorate
        # The members that come with this node from its previous view. If they are not a
        # quorum, this node was cut off (or frozen) and the others may have gone on without it,
        # even when the merged view is quorate again: it must leave and rejoin.
        carried = {bus_node(m) for m in view.members if m in previous and m not in view.joined}
        cut_off = bool(previous) and not view.votes.holds(carried)
        if self.member_votes:
            came = [m for m in view.members if m in previous and m not in view.joined]
            cut_off = bool(previous) and 2 * len(came) <= self.member_votes
        self.votes = view.votes
        self._now = now
        # reports count within one view: every following node reports afresh
        self.received.clear()
        self._requests.clear()
        self._requests_by_id.clear()
        self._reform_sent = False
        self._reported, self._report_on_bus = 0, False
        for rid, member in list(self._requesters.items()):
            if member not in view.members:
                del self._requesters[rid]
        for name, (rid, member) in list(self._latest_request.items()):
            if member not in view.members:
                del self._latest_request[name]
        # Members that left the view left the primary component here. Only a node that stays in
        # it records so: one that leaves it too cannot tell whether they went on elsewhere.
        stays = self.phase in _FOLLOWING and quorate and not cut_off
        out += self._forget([name for name, member in self.online.items() if member not in view.members], stays)
        if self.phase == Phase.CONNECTING:
            self._joining_since = now
            if self.bootstrap and view.members == (view.local,) and quorate:
                out.append(Send(self._bootstrap_message()))
                self.phase = Phase.JOINING
                self._request_at = now
            else:
                out += self._request(now)
        elif self.phase in _FOLLOWING and not quorate:
            out += self._leave_primary("this node is outside the quorate partition of the group")
        elif self.phase in _FOLLOWING and cut_off:
            out += self._leave_primary("this node was cut off from the primary component (it came back "
                                       "with fewer than a quorum of the nodes it was with)")
            out += self._request(now)
        elif self.phase in _FOLLOWING:
            out += self._dissolve_if_unsynced() or self._release()
        elif quorate and self.phase in (Phase.NON_PRIMARY, Phase.JOINING):
            if self.phase == Phase.JOINING and not was_quorate:
                self._joining_since = now  # a bootstrap waits as long again for an answer from a quorum
            # In every quorate view a node outside the primary component asks (again): members
            # that can answer may have arrived, and if none can, the nodes re-form it only once
            # every member of this view has asked in it.
            out += self._request(now)
        elif quorate and self.phase == Phase.NEEDS_RECOVERY and self.cluster_uuid:
            out += self._request(now, join=False)  # it stays out, but takes part in a re-form
        return self._pause_changed(out)

    def on_delivery(self, d: Delivery) -> list[Action]:
        try:
            msg = bp.decode(d.payload)
        except bp.BusProtoError as e:
            log.warning("dropping malformed bus message from %s: %s", d.sender, e)
            return []
        if isinstance(msg, bp.GidRequest) and d.sender in self.members:
            # every node keeps this view's requests, whatever its phase: they decide a re-form
            self._requests[d.sender] = msg
            self._requests_by_id[msg.request_id] = msg
            self._latest_request[msg.node] = (msg.request_id, d.sender)
        if isinstance(msg, bp.Bootstrap):
            self._requests.clear()  # a primary component exists from here: the requests before it are answered by it
            if self.phase not in _FOLLOWING:
                return self._pause_changed(self._bootstrap_seen(d, msg))
        if self.phase == Phase.JOINING:
            out = self._joining(d, msg)
        else:
            out = self._handle(d.sender, msg)
        if isinstance(msg, bp.GidRequest) and self.phase not in _FOLLOWING:
            out += self._reform()
        return self._pause_changed(out)

    def _pause_changed(self, out: list[Action]) -> list[Action]:
        """``out``, and a :class:`Pause` first if whether anyone asks to pause changed."""
        if bool(self.paused_by) != self._paused:
            self._paused = bool(self.paused_by)
            out.insert(0, Pause(self._paused))
        return out

    def tick(self, now: float) -> list[Action]:
        """Timers: re-ask for the GID; bootstrap if told to and nobody answered; report again
        what this node delivered if its last report has not come back (a send that failed)."""
        if self.phase in _FOLLOWING:
            if self._report_on_bus and self._reported == self._report_last_tick:
                # on the bus since the last tick at least: the send may have failed (a view
                # change resets this too); duplicates are harmless, reports only raise a maximum
                self._report_on_bus, self._reported = False, 0
            self._report_last_tick = self._reported if self._report_on_bus else -1
            return self._release()
        self._now = now
        if self._reform_sent and now - self._reform_at >= 5 * REQUEST_RETRY_S:
            self._reform_sent = False  # its bootstrap never came back (a send that failed): decide again
        if self.phase == Phase.NEEDS_RECOVERY:
            if self.quorate and self.cluster_uuid and now - self._request_at >= 5 * REQUEST_RETRY_S:
                return self._request(now, join=False)
            return []
        if self.phase != Phase.JOINING:
            return []
        # only with a quorum: a node that bootstrapped alone would count itself cut off when the
        # others arrive, and they would have no cluster to join (invariant 7)
        if self.bootstrap and self.quorate and now - self._joining_since >= BOOTSTRAP_WAIT_S:
            self._joining_since = now
            return [Send(self._bootstrap_message())]
        retry = REQUEST_RETRY_S if not self._request_seen else 5 * REQUEST_RETRY_S
        if now - self._request_at >= retry:
            return self._request(now)
        return []

    def progress_message(self, committed_gid: int) -> Optional[Send]:
        """What an online node reports every second; a recovering one that caught up says so
        again until the others count it synced."""
        if self.phase != Phase.ONLINE and not (self.phase == Phase.RECOVERING and self._sync_sent):
            return None
        return Send(bp.Progress(self.node, committed_gid))

    @property
    def accepts_writes(self) -> bool:
        return self.phase == Phase.ONLINE and self.quorate

    def held_released(self) -> None:
        """The coordinator applied a catch-up's range and admits the live stream from now on."""
        self._catching_up = False

    def recovered(self, committed_gid: int) -> list[Action]:
        """The coordinator caught up (committed everything up to the CatchUp's ``upto``, and
        ``committed_gid`` in all): it tells the members, and is online once that is delivered."""
        if self.phase != Phase.RECOVERING:
            return []
        self._catching_up = False
        self._sync_sent = True
        return [Send(bp.Progress(self.node, committed_gid))]

    def recovery_failed(self, reason: str) -> list[Action]:
        """Partial recovery cannot bring this node back (docs/RECOVERY.md says when): it leaves
        the primary component, says so in the total order so every node drops it at the same
        place, and stays out rather than serve stale data."""
        out: list[Action] = []
        if self.phase in _FOLLOWING:
            out += self._leave_primary(reason, Phase.NEEDS_RECOVERY)
            out.append(Send(bp.Leave(self.node, reason)))
        else:
            self.phase = Phase.NEEDS_RECOVERY
            out.append(PhaseChange(Phase.NEEDS_RECOVERY, reason))
        return out

    def rejoin(self, last_gid: int, now: float) -> list[Action]:
        """Ask to join again (``chorus node recover``), from the database's committed GID."""
        if self.phase in _FOLLOWING:
            return []
        self.last_gid = last_gid
        return self._request(now)

    # ---- internals -----------------------------------------------------------------------

    def _epoch_number(self) -> int:
        return self.epochs[-1].number if self.epochs else 0

    def _bootstrap_message(self) -> bp.Bootstrap:
        """``chorus bootstrap``: start the cluster (again) at this node's GID, in a new epoch."""
        gid = self._holding().gid
        return bp.Bootstrap(self.node, self.cluster_uuid or str(uuid.uuid4()), gid, self._epoch_number() + 1)

    def _holding(self) -> Holding:
        """What this node holds now (its disk, and what it will admit of what it released)."""
        h = self.holding() if self.holding is not None else Holding(self.last_gid)
        return Holding(max(h.gid, self._will_hold), h.log_after, h.log_high)

    def _remember(self) -> Remember:
        return Remember(self.epochs, tuple(sorted(self.records.items())))

    def _request(self, now: float, join: bool = True) -> list[Action]:
        """Ask to join (or, with ``join`` false, only take part in a re-form), saying what this
        node holds: the GID it announces is the most its database will hold until it is answered."""
        if join:
            self.phase = Phase.JOINING
        self._request_join = join
        self._request_id = uuid.uuid4().hex
        self._request_seen = False
        self._request_at = now
        out = self._drop_buffer()
        h = self._holding()
        self.last_gid = h.gid
        return out + [Send(bp.GidRequest(
            self.node, self._request_id, self.cluster_uuid, h.gid, join,
            tuple((e.number, e.start, e.node) for e in self.epochs), h.log_after, h.log_high,
            tuple((n, r.epoch, r.gid, r.member) for n, r in sorted(self.records.items()))))]

    def _forget(self, names: list[str], record: bool = True) -> list[Action]:
        """Nodes that are no longer members of the primary component (``record``: this node stays
        in it and remembers where they left); a schema change of theirs whose outcome they did
        not report is skipped everywhere."""
        out: list[Action] = []
        recorded = False
        for name in names:
            self.online.pop(name, None)
            self.progress.pop(name, None)
            self.paused_by.discard(name)
            self.synced.discard(name)
            if record and name != self.node:
                self.records[name] = MemberRecord(self._epoch_number(), self.gid, False)
                recorded = True
        if recorded:
            out.append(self._remember())
        for gid, origin in sorted(self.ddl_open.items()):
            if origin != self.node and origin not in self.online:
                out += self._ddl_settled(gid, False, f"its origin {origin} left the group before "
                                                     "reporting the outcome")
        for gid in sorted(self.ballots):
            out += self._count(gid)  # a voter that left no longer holds the count up
        return out

    def _dissolve_if_unsynced(self) -> list[Action]:
        """A quorate view in which no member of the primary component is synced has no primary
        component: nobody can answer a GID request or vouch for the history. Every node leaves
        it and asks to re-form it (history.decide)."""
        if self.phase not in _FOLLOWING or not self.quorate or self.synced & set(self.online):
            return []
        out = self._leave_primary(f"no member of the primary component is synced any more (members left: "
                                  f"{', '.join(sorted(self.online)) or 'none'}): the nodes re-form it from the one "
                                  "that holds the most")
        return out + self._request(self._now)

    def _leave_primary(self, reason: str, phase: Phase = Phase.NON_PRIMARY) -> list[Action]:
        # what it released and admits (all of it, unless a catch-up holds the live stream) will
        # commit here: its requests announce at least that
        self._will_hold = self.released if not self._catching_up else 0
        self._catching_up = False
        self._sync_sent = False
        self.phase = phase
        self.online.clear()
        self.synced.clear()
        self.paused_by.clear()
        self.progress.clear()
        out: list[Action] = [PhaseChange(phase, reason)]
        # Writesets not yet known to a quorum: the primary component may or may not have them.
        # None commits here; the node learns their fate when it rejoins (partial recovery
        # brings those the primary has). Their clients hear that the outcome is unknown.
        held, self._unstable = self._unstable, []
        held += [(gid, LocalVerdict(m.ticket, True, gid, 0, "", ws)) for gid, m, ws in self._deferred
                 if m.origin == self.node]
        self._deferred.clear()
        self.ddl_open.clear()
        for gid, a in held:
            if isinstance(a, LocalVerdict):
                self._local_scanned.pop(a.ticket, None)
                out.append(LocalVerdict(a.ticket, False, gid, 0,
                                        f"this node left the primary component before GID {gid} was known to a "
                                        "quorum of nodes: whether it committed will be known when the node rejoins",
                                        None, unknown=True))
        self.gid = self.last_certified = self.released
        return out

    # ---- uniform commit ---------------------------------------------------------------------

    @property
    def held_count(self) -> int:
        """Certified writesets waiting until a quorum of bus nodes is known to have them."""
        return len(self._unstable)

    def _covered(self, gid: int) -> bool:
        """Whether a quorum of bus nodes is known to have delivered GID ``gid``."""
        own = bus_node(self.local_member)
        nodes = {node for node, g in self.received.items() if g >= gid and self._joined_at.get(node, 0) < gid}
        if self.gid >= gid:
            nodes.add(own)
        return self.votes.holds(nodes)

    def _hold(self, gid: int, action: Action) -> list[Action]:
        if self.votes.quorum <= 1 and not self._unstable and not self.votes.tie_breaker:
            # this bus node alone is a quorum (one Corosync for all nodes): it has delivered it
            self.released = gid
            return [action]
        self._unstable.append((gid, action))
        return self._release()

    def _release(self) -> list[Action]:
        out: list[Action] = []
        if self.votes.quorum > 1 and self.phase in _FOLLOWING and not self._report_on_bus and self.gid > self._reported:
            self._reported, self._report_on_bus = self.gid, True
            out.append(Send(bp.Received(self.node, self.gid)))
        if not self._unstable:
            self.released = max(self.released, self.last_certified)
            return out
        n = 0
        while n < len(self._unstable) and self._covered(self._unstable[n][0]):
            out.append(self._unstable[n][1])
            n += 1
        if n:
            self.released = self._unstable[n - 1][0]
            del self._unstable[:n]
        return out

    def _received(self, sender: str, msg: bp.Received) -> list[Action]:
        if msg.node == self.node and sender == self.local_member:
            self._report_on_bus = False
        if sender in self.members:
            node = bus_node(sender)
            self.received[node] = max(self.received.get(node, 0), msg.gid)
        return self._release() if self.phase in _FOLLOWING else []

    def _refuse_own(self, msg: bp.Message) -> list[Action]:
        """This node's writesets in ``msg``, delivered where it was not a member: refused."""
        own = [msg] if isinstance(msg, bp.WritesetMsg) else (
            msg.messages() if isinstance(msg, bp.WritesetBatch) else [])
        mine = [m for m in own if m.origin == self.node]
        for m in mine:
            self._local_scanned.pop(m.ticket, None)
        return [LocalVerdict(m.ticket, False, 0, 0, "this node is not online", None) for m in mine]

    def _drop_buffer(self) -> list[Action]:
        """Forget what was delivered after a request that will not be answered (the node asks
        again): every node dropped this node's own writesets among it (it was no member there),
        so their backends are told they failed, rather than wait for good (found by the
        simulation: a writeset left after a freeze, buffered, then dropped with the buffer)."""
        out: list[Action] = []
        for b in self._buffer:
            out += self._refuse_own(bp.decode(b.payload))
        self._buffer.clear()
        return out

    def _joining(self, d: Delivery, msg: bp.Message) -> list[Action]:
        if isinstance(msg, bp.GidRequest) and msg.request_id == self._request_id:
            self._request_seen = True
            return self._drop_buffer()
        if not self._request_seen:
            return self._refuse_own(msg)
        if isinstance(msg, bp.GidReply) and msg.node == self.node and msg.request_id == self._request_id:
            return self._joined(d, msg)
        self._buffer.append(d)
        return []

    def _reform(self) -> list[Action]:
        """Re-form the primary component when no member has it: a quorate view in which every
        member has asked (none is in a primary component: a partition that left no quorate side
        healed, a majority restarted at once, or the last synced member left while the others
        caught up). Every node decides alike from the same requests (history.decide): the one
        that holds the most starts a new epoch at its GID once every node that may hold an
        acknowledged writeset the others lack is back; the others join it and catch up.

        Every acknowledged transaction committed on its origin before the client heard of it;
        the origin is here, or it left the primary component at a GID that the winner holds."""
        if self._reform_sent or not self.quorate or max(self.votes.expected, self.member_votes) < 2:
            return []
        if set(self._requests) != set(self.members):
            return []
        cands = [history.Candidate(r.node, r.cluster_uuid, r.last_gid, tuple(Epoch(*e) for e in r.epochs),
                                   r.log_after, r.log_high,
                                   {n: MemberRecord(e, g, m) for n, e, g, m in r.records})
                 for r in self._requests.values()]
        d = history.decide(cands)
        if d.winner is not None and not any(r.records for r in self._requests.values()):
            # nobody here remembers the members (state files from before records were kept): wait
            # for every configured node, as a missing one might hold the only copy of a commit
            nodes = {bus_node(m) for m in self.members}
            if (len(self.members) < self.member_votes if self.member_votes
                    else len(nodes) != len(self.members) or len(nodes) < self.votes.expected):
                d = Decision(None, cluster_uuid=d.cluster_uuid,
                                     reason="no member is synced; re-forming waits for every configured node "
                                            "(no node here remembers the primary component's members)")
        if d.winner is None:
            if self.reform is None or self.reform.reason != d.reason:
                log.warning("%s", d.reason)
            self.reform = d
            return []
        self.reform = None
        if d.winner != self.node:
            return []
        assert d.epoch is not None
        self._reform_sent, self._reform_at = True, self._now
        log.warning("%s", d.reason)
        return [Send(bp.Bootstrap(self.node, d.cluster_uuid, d.gid, d.epoch.number))]

    def _bootstrap_seen(self, d: Delivery, msg: bp.Bootstrap) -> list[Action]:
        """A Bootstrap delivered while this node is not in the primary component."""
        if msg.node == self.node and d.sender == self.local_member:
            if not self.quorate:
                # decided in a quorate view, delivered after a view change took the quorum away
                self._reform_sent = False
                log.warning("this node's bootstrap came back in a view that is not quorate: not started")
                return []
            return self._bootstrapped(d.sender, msg)
        if self.cluster_uuid and msg.cluster_uuid != self.cluster_uuid:
            return []
        # Another node (re-)started the cluster: ask it. A node that stays out tries once more,
        # as the new primary component may hold what it misses.
        return self._request(self._now) if self.quorate else []

    def _drop_rounds(self, above: int, why: str) -> list[Action]:
        """The schema changes still waiting for reports when the node (re)joins: those after GID
        ``above`` are undone here (no node of the cluster it joins committed them); those up to
        it are settled by the catch-up, from a member's log (its record says what became of it)."""
        out: list[Action] = []
        for gid in sorted(g for g, b in self.ballots.items() if b.schema):
            del self.ballots[gid]
            if gid > above:
                self._remember_settled(gid, False)
                out.append(VoteDecided(gid, False, why, schema=True, failure=f"{self.node}: {why}"))
        return out

    def _bootstrapped(self, sender: str, msg: bp.Bootstrap) -> list[Action]:
        undone = self._drop_rounds(msg.gid, "the cluster started again from this node, which had not committed it")
        self.cluster_uuid = msg.cluster_uuid
        self.gid = self.last_certified = self.released = msg.gid
        self._unstable.clear()
        self._deferred.clear()
        self.ddl_open.clear()
        self.certifier = Certifier(msg.gid)
        self.online = {self.node: sender}
        self.synced = {self.node}
        self.progress = {self.node: msg.gid}
        self.epochs = history.add_epoch(self.epochs, Epoch(msg.epoch, msg.gid, self.node))
        self.records[self.node] = MemberRecord(msg.epoch, msg.gid, True)
        self.phase = Phase.ONLINE
        self.bootstrap = False
        self.reform = None
        # what it delivered after its request, before the bootstrap, no node took (no primary
        # component there); its own writesets among it fail
        return [*undone, *self._drop_buffer(), self._remember(), Joined(self.cluster_uuid, self.gid, True),
                PhaseChange(Phase.ONLINE, f"bootstrapped cluster {self.cluster_uuid} at GID {self.gid} "
                                          f"(epoch {msg.epoch})")]

    def _stay_out(self, reason: str, admitted: bool) -> list[Action]:
        """Refuse the answer to this node's GID request; ``admitted``: the members counted it in
        (they could not tell), so it leaves at once, in the order."""
        self.phase = Phase.NEEDS_RECOVERY
        out: list[Action] = self._drop_buffer() + [PhaseChange(Phase.NEEDS_RECOVERY, reason)]
        if admitted:
            out.append(Send(bp.Leave(self.node, reason)))
        return out

    def _joined(self, d: Delivery, msg: bp.GidReply) -> list[Action]:
        admitted = self.node in dict(msg.online)
        if self.compat and msg.compat and self.compat != msg.compat:
            return self._stay_out(f"this node's database ({self.compat}) differs from the cluster's ({msg.compat}): "
                                  "its values would be read differently; create its database with the cluster's "
                                  "encoding, on the same PostgreSQL major version, then join it by total recovery",
                                  admitted)
        if self.cluster_uuid and self.cluster_uuid != msg.cluster_uuid:
            return self._stay_out(f"this node belongs to cluster {self.cluster_uuid}, the group runs "
                                  f"cluster {msg.cluster_uuid}: total recovery is needed", admitted)
        cluster_epochs = tuple(Epoch(*e) for e in msg.epochs)
        problem = history.prefix_problem(self.node, max(self.last_gid, self.max_committed), self.epochs,
                                         cluster_epochs, msg.certified)
        try:
            unstable: list[tuple[int, Action]] = [(g, Apply(g, prev, origin, wire.scan(ws)))
                                                  for g, prev, origin, ws in msg.unstable if g > self.last_gid]
        except wire.WireError as e:
            self.stats.malformed += 1
            return self._stay_out(f"the answer to this node's GID request holds a malformed writeset ({e}): "
                                  "it asks again", admitted) + self._request(self._now)
        if problem is not None:
            return self._stay_out(
                f"this node's data is not a prefix of cluster {msg.cluster_uuid}'s history: {problem}. It stays out "
                "and keeps them. If they must be kept, stop the cluster and restart it from this node (chorus "
                "bootstrap --force); to drop them, rebuild this node (chorus node join --total --force)", admitted)
        # it catches up to what the answer's node had released; the writesets certified after
        # that came with the answer: it holds them until a quorum has them, as every member does
        released = max(msg.released, self.last_gid)
        behind = self.last_gid < released
        undone = self._drop_rounds(msg.certified, "the cluster this node joined did not certify it")
        self.cluster_uuid = msg.cluster_uuid
        self.gid = msg.gid
        self.last_certified = msg.certified
        self.released = released
        self._unstable = unstable
        self._deferred.clear()
        self.ddl_open.clear()
        self.certifier = Certifier.restore(msg.certifier)
        # The state at the request's place: this node is not a member there (the answer admits it
        # at its own place, further on); what was delivered in between is replayed from there. Its
        # own writesets among it, which the members dropped, must not count here either (a lab run
        # diverged so: a node thawed from a freeze sent writesets after its request, counted them
        # here, and gave every later GID to another writeset than the others did).
        self.online = {n: m for n, m in msg.online if n != self.node}
        self.synced = set(msg.synced) - {self.node}
        self._latest_request = {n: (rid, m) for n, rid, m in msg.requests}
        self.progress = dict(msg.progress)
        self.paused_by = set(msg.paused)
        self.epochs = cluster_epochs or self.epochs
        self.records = history.merge(self.records, {n: MemberRecord(e, g, m) for n, e, g, m in msg.records})
        self.records[self.node] = MemberRecord(self._epoch_number(), msg.gid, True)
        self._sync_sent = False
        self.reform = None
        out: list[Action] = [*undone, self._remember(), Joined(self.cluster_uuid, self.gid, False)]
        if behind:
            # partial recovery: certify the live stream from here on (the coordinator holds what
            # it must apply) while the missing range comes from a member's writeset log
            self.phase = Phase.RECOVERING
            self._catching_up = True
            out.append(CatchUp(self.last_gid, released))
            out.append(PhaseChange(Phase.RECOVERING,
                                   f"joined cluster {self.cluster_uuid} at GID {msg.gid}; catching up "
                                   f"from GID {self.last_gid} to {released} from a member's writeset log"))
        else:
            self.phase = Phase.ONLINE
        buffered, self._buffer = self._buffer, []
        for b in buffered:
            m = bp.decode(b.payload)
            if isinstance(m, bp.GidRequest) and b.sender in self.members:
                self._latest_request[m.node] = (m.request_id, b.sender)  # after the answer's state
            out += self._handle(b.sender, m)
        out += self._handle(d.sender, msg)
        if not behind and self.phase == Phase.ONLINE:
            out.append(PhaseChange(Phase.ONLINE, f"joined cluster {self.cluster_uuid} at GID {msg.gid}"))
        return out

    def _handle(self, sender: str, msg: bp.Message) -> list[Action]:
        if isinstance(msg, bp.WritesetMsg):
            return self._writeset(msg)
        if isinstance(msg, bp.WritesetBatch):
            out: list[Action] = []
            for m in msg.messages():
                out += self._writeset(m)
            return out
        if isinstance(msg, bp.SyncMarker):
            if msg.node != self.node:
                return []
            return [SyncReached(msg.token, self.last_certified, self.accepts_writes)]
        if isinstance(msg, bp.LogInfo):
            return [LogOffered(msg)] if msg.node == self.node else []
        if isinstance(msg, bp.Received):
            return self._received(sender, msg)
        if self.phase not in _FOLLOWING:
            return []
        if isinstance(msg, bp.LogQuery):
            # every member answers, a recovering one too: it serves what it has committed
            return [LogQueried(msg.node, msg.request_id)]
        if isinstance(msg, bp.GidRequest):
            return self._gid_request(sender, msg)
        if isinstance(msg, bp.GidReply):
            return self._gid_reply(msg)
        if isinstance(msg, bp.Leave):
            if self.online.get(msg.node) == sender and msg.node != self.node:
                log.warning("node %s left the primary component: %s", msg.node, msg.reason)
                return self._forget([msg.node]) + self._dissolve_if_unsynced()
            return []
        if isinstance(msg, bp.Progress):
            out = []
            if msg.node != self.node:
                self._joined_at.pop(bus_node(sender), None)  # online: it holds everything up to its GID
            if msg.node in self.online:
                if msg.node not in self.synced and self.online[msg.node] == sender:
                    # a recovering member caught up: it is synced from here, for every node
                    self.synced.add(msg.node)
                    if msg.node == self.node and self.phase == Phase.RECOVERING:
                        self.phase = Phase.ONLINE
                        self._sync_sent = False
                        out.append(PhaseChange(Phase.ONLINE, f"caught up with cluster {self.cluster_uuid} at "
                                                             f"GID {msg.committed_gid}"))
                self.progress[msg.node] = max(self.progress.get(msg.node, 0), msg.committed_gid)
                if all(n in self.progress for n in self.online):
                    self.certifier.purge(min(self.progress[n] for n in self.online) - self.history)
            return out
        if isinstance(msg, bp.DdlResult):
            if self.ddl_open.get(msg.gid) == msg.node:
                content = None
                ok, error = msg.ok, msg.error
                if ok:
                    try:
                        content = wire.scan(msg.content)
                        if content.toi:
                            raise wire.WireError("it is an ordering request")
                    except wire.WireError as e:
                        ok, error = False, f"its content from {msg.node} is malformed: {e}"
                        self.stats.malformed += 1
                return self._ddl_settled(msg.gid, ok, error, content)
            return []
        if isinstance(msg, bp.Vote):
            return self._vote(msg)
        if isinstance(msg, bp.FlowControl):
            if msg.pause and msg.node in self.online:
                self.paused_by.add(msg.node)
            else:
                self.paused_by.discard(msg.node)
            return []
        if isinstance(msg, bp.Bootstrap):
            log.warning("node %s tried to bootstrap cluster %s while cluster %s is online; ignored",
                        msg.node, msg.cluster_uuid, self.cluster_uuid)
        return []

    def _gid_request(self, sender: str, msg: bp.GidRequest) -> list[Action]:
        """A node outside the primary component asks to join (or, ``join`` false, only says what
        it holds, for a re-form); the lowest synced member answers."""
        if msg.node == self.node and msg.request_id != self._request_id:
            # A GID request in this node's name that it did not make (a member's bug, or
            # worse): every other node forgets this node here, so this node must leave too,
            # or it would go on certifying writesets the others drop. It asks to join again.
            out = self._leave_primary(f"bus member {sender} asked to join in this node's name")
            return out + self._request(self._now)
        out = []
        if msg.node in self.online and msg.node != self.node:
            # it asks to join, so it is not a member any more (it left the primary component
            # without leaving the group's view): every node drops it here, in the same place
            out = self._forget([msg.node]) + self._dissolve_if_unsynced()
            if self.phase not in _FOLLOWING:
                return out
        if msg.node != self.node and msg.join:
            self._joined_at[bus_node(sender)] = self.gid
        self._requesters[msg.request_id] = sender
        # While a schema change's outcome is open, the state at this point is not final (the
        # writesets after it are not certified yet): the joiner asks again later.
        if msg.join and self.phase == Phase.ONLINE and self.synced and min(self.synced) == self.node \
                and not self.ddl_open and not self.settling:
            online, synced = dict(self.online), set(self.synced)
            records = dict(self.records)
            # admitted unless its data cannot follow this history (it refuses the answer alike)
            if msg.cluster_uuid in ("", self.cluster_uuid) and history.prefix_problem(
                    msg.node, msg.last_gid, tuple(Epoch(*e) for e in msg.epochs), self.epochs,
                    self.last_certified) is None:
                online[msg.node] = sender
                records[msg.node] = MemberRecord(self._epoch_number(), self.gid, True)
                if self.released <= msg.last_gid <= self.last_certified:
                    synced.add(msg.node)
            out.append(Send(bp.GidReply(
                msg.node, msg.request_id, sender, self.cluster_uuid, self.gid, self.last_certified,
                tuple(sorted(online.items())), tuple(sorted(self.progress.items())),
                self.certifier.snapshot(), tuple(sorted(self.paused_by)), self.compat, tuple(sorted(synced)),
                tuple((e.number, e.start, e.node) for e in self.epochs),
                tuple((n, r.epoch, r.gid, r.member) for n, r in sorted(records.items())),
                self.released, tuple(_unstable_entry(self.node, g, a) for g, a in self._unstable),
                tuple((n, rid, m) for n, (rid, m) in sorted(self._latest_request.items())))))
        return out

    def _gid_reply(self, msg: bp.GidReply) -> list[Action]:
        """A member answered a GID request: the joiner is a member from here (synced, or catching
        up), as the answer says, for every node."""
        self._requesters.pop(msg.request_id, None)
        if msg.cluster_uuid != self.cluster_uuid or msg.gid > self.gid or msg.member not in self.members:
            return []
        if self._latest_request.get(msg.node, ("", ""))[0] != msg.request_id:
            return []  # it asked again since: the answer to its latest request counts
        if dict(msg.online).get(msg.node) != msg.member:
            return []  # the answer counts it out: its data cannot follow this history
        self.online[msg.node] = msg.member
        self.progress[msg.node] = msg.gid
        if msg.node in msg.synced:
            self.synced.add(msg.node)
        # it delivered everything after what the answering node had released (the rest came
        # with the answer): its reports vouch for those GIDs
        self._joined_at[bus_node(msg.member)] = msg.released
        self._requests.pop(msg.member, None)
        self.records[msg.node] = MemberRecord(self._epoch_number(), msg.gid, True)
        return [self._remember()]

    def _writeset(self, msg: bp.WritesetMsg) -> list[Action]:
        local = msg.origin == self.node
        # A writeset counts only if its origin is online at its position in the total order,
        # a fact every node agrees on. A node cut off and back (frozen, say) may send one before
        # it learns it was out: the others drop it exactly as the origin refuses it.
        if self.phase not in _FOLLOWING or not self.quorate or msg.origin not in self.online:
            if local:
                self._local_scanned.pop(msg.ticket, None)
                return [LocalVerdict(msg.ticket, False, 0, 0, "this node left the primary component", None)]
            return []
        self.gid += 1
        gid = self.gid
        self.stats.delivered += 1
        self.outcomes.seen(gid)
        try:
            cached = self._local_scanned.pop(msg.ticket, None) if local else None
            ws = cached if cached is not None else wire.scan(msg.writeset)
        except wire.WireError as e:
            self.stats.malformed += 1
            self.stats.cert_failures += 1
            return [LocalVerdict(msg.ticket, False, gid, 0, f"malformed writeset: {e}", None)] if local else []
        if self.ddl_open or self._deferred:
            # A schema change before it has not reported its outcome: what it touched is not
            # known yet, so nothing after it can be certified yet (it could not commit before the
            # schema change anyway).
            self._deferred.append((gid, msg, ws))
            return []
        return self._certify(gid, msg, ws)

    def local_in_flight(self) -> list[wire.Writeset]:
        """This node's writesets sent for ordering and not delivered back yet."""
        return list(self._local_scanned.values())

    def _certify(self, gid: int, msg: bp.WritesetMsg, ws: wire.Writeset) -> list[Action]:
        local = msg.origin == self.node
        if ws.toi:
            # total order isolation: never fails, runs after all before it; its keys are
            # recorded with its content, once its origin reports it
            self.ddl_open[gid] = msg.origin
            v = OK
        else:
            v = self.certifier.certify(gid, msg.origin, ws.last_seen, ws.keys)
            self.outcomes.record(msg.origin, ws.xid, Outcome(gid, v.ok, v.reason))
        if not v.ok:
            self.stats.cert_failures += 1
            c = Conflict.of(self.clock(), gid, msg.origin, ws, v)
            self.conflicts.append(c)
            where = f"{c.schema}.{c.table}" if c.table else ""
            self.stats.failures_by_table[where] = self.stats.failures_by_table.get(where, 0) + 1
            if local:
                self.stats.local_failed += 1
                return [LocalVerdict(msg.ticket, False, gid, 0, v.reason, ws)]
            return []
        prev, self.last_certified = self.last_certified, gid
        self.stats.certified += 1
        settle = not ws.toi and ws.has_schema and not ws.concurrent and self._open_round(gid, msg.origin)
        if local:
            self.stats.local_certified += 1
            return self._hold(gid, LocalVerdict(msg.ticket, True, gid, prev, "", ws, settle=settle))
        self.stats.remote_certified += 1
        return self._hold(gid, Apply(gid, prev, msg.origin, ws, settle=settle))

    def _ddl_settled(self, gid: int, ok: bool, error: str,
                     content: Optional[wire.Writeset] = None) -> list[Action]:
        """Schema change ``gid``'s outcome is known: record what it touched (if it ran), then
        certify the writesets deferred behind it, up to the next open schema change."""
        origin = self.ddl_open.pop(gid)
        settle = False
        if ok and content is not None:
            self.certifier.record(gid, origin, content.keys)
            settle = self._open_round(gid, origin)
        out: list[Action] = [DdlOutcome(gid, ok, error, content if ok else None, settle)]
        while self._deferred and not self.ddl_open:
            g, m, ws = self._deferred.pop(0)
            out += self._certify(g, m, ws)
        return out

    @property
    def deferred_count(self) -> int:
        """Writesets waiting for a schema change's outcome before they are certified."""
        return len(self._deferred)

    # ---- inconsistency voting (Galera 4) ---------------------------------------------------

    def _vote(self, msg: bp.Vote) -> list[Action]:
        out: list[Action] = []
        b = self.ballots.get(msg.gid)
        if b is None:
            if msg.gid in self.decided or msg.gid in self.settled or msg.gid > self.last_certified:
                return []  # counted already, or not a certified GID here
            b = self.ballots[msg.gid] = _Ballot(frozenset(self.online) | {msg.node})
            out.append(VoteOpened(msg.gid))
        if msg.node in b.voters:
            b.votes.setdefault(msg.node, (msg.ok, msg.reason))
        return out + self._count(msg.gid)

    def _open_round(self, gid: int, origin: str) -> bool:
        """Schema change ``gid`` ran on its origin: every other node online now applies it and
        reports (a Vote) before it commits anywhere. False if no other node is there to."""
        voters = frozenset(self.online) | {origin}
        if voters == {origin}:
            return False
        self.ballots[gid] = _Ballot(voters, {origin: (True, "")}, schema=True)
        return True

    def _remember_settled(self, gid: int, ok: bool) -> None:
        self.settled[gid] = ok
        while len(self.settled) > 1000:
            del self.settled[min(self.settled)]

    @property
    def settling(self) -> bool:
        """A schema change waits for the nodes' reports."""
        return any(b.schema for b in self.ballots.values())

    def _count(self, gid: int) -> list[Action]:
        """Decide once an outcome has a majority of the voters, or every voter still online has
        voted (then the larger side; a tie keeps the writeset, which its origin's client was
        told committed). A schema change's reports need every voter still online, and one
        failure undoes it (docs/SECURITY.md). Every node counts the same votes in the same order;
        only in the primary component."""
        b = self.ballots[gid]
        ok = sorted(n for n, (v, _) in b.votes.items() if v)
        failed = sorted(n for n, (v, _) in b.votes.items() if not v)
        need = len(b.voters) // 2 + 1
        active = b.voters & set(self.online)
        if b.schema:
            if self.phase not in _FOLLOWING or not self.quorate:
                return []
            if not failed and not all(n in b.votes for n in active):
                return []
            del self.ballots[gid]
            self._remember_settled(gid, not failed)
            first = failed[0] if failed else ""
            detail = "; ".join([f"{n} applied it" for n in ok] + [f"{n} failed: {b.votes[n][1]}" for n in failed])
            return [VoteDecided(gid, not failed, detail, schema=True,
                                failure=f"{first}: {b.votes[first][1]}" if failed else "")]
        if len(ok) >= need:
            outcome = True
        elif len(failed) >= need:
            outcome = False
        elif all(n in b.votes for n in active):
            outcome = len(ok) >= len(failed)
        else:
            return []
        del self.ballots[gid]
        self.decided[gid] = outcome
        while len(self.decided) > 1000:
            del self.decided[min(self.decided)]
        detail = "; ".join([f"{n} applied it" for n in ok] +
                           [f"{n} failed: {b.votes[n][1]}" for n in failed] +
                           [f"{n} did not vote" for n in sorted(b.voters - set(b.votes))])
        out: list[Action] = [VoteDecided(gid, outcome, detail)]
        # The losing side leaves and stops: every node remembers where, now (a node that failed to
        # apply GID g committed nothing from g on; one that applied what the majority could not
        # commits nothing after this place), so that a later re-form does not wait for it.
        losers = [n for n in (failed if outcome else ok) if n != self.node and n in self.online]
        if losers and self.phase in _FOLLOWING:
            out += self._forget(losers, record=False)  # (its view change comes later)
            for n in losers:
                self.records[n] = MemberRecord(self._epoch_number(), gid - 1 if outcome else self.gid, False)
            out.append(self._remember())
            out += self._dissolve_if_unsynced()
        return out

