"""The replication core: bus events in, decisions out (no I/O).

It assigns GIDs in delivery order (seed 7.1), certifies (seed 6), holds certified writesets until
a quorum of bus nodes has delivered them (uniform commit), defers what follows a schema change
until its outcome is known, counts inconsistency votes, runs the join handshake (seed 8.1: a
joiner multicasts a GID request and the lowest synced member answers with the GID at the
request's own position plus the certification index there), bootstraps when told (seed 8.2),
tracks whether this node is in the primary component (seed 8.4), re-forms it when a quorate view
has no synced member (history.py, docs/RECOVERY.md), and purges the certification index below the
cluster-wide committed minimum.

Membership and the join handshake's decisions are :class:`chorus.membership.Membership`'s (which
nodes are members, what a request says, the answer, whether an answer counts, who re-forms); this
module changes the node's phase and the total order's state and returns the actions.

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

from chorus import wire
from chorus.actions import (Action, Apply, CatchUp, DdlOutcome, Joined, LocalVerdict, LogOffered, LogQueried,
                            Pause, Phase, PhaseChange, Remember, Send, SyncReached, VoteDecided, VoteOpened)
from chorus.bus import proto as bp
from chorus.bus import Delivery, View, Votes, bus_node
from chorus.history import Decision, Epoch, MemberRecord
from chorus.certifier import OK, CertificationIndex, Certifier, CertifierClass, Verdict
from chorus.membership import Holding as Holding  # (its home is membership.py)
from chorus.membership import Membership, Place, view_quorum
from chorus.link import position as link_position
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
    if a.link is not None:  # a link writeset travels as its message (its origin says so)
        return gid, a.prev, a.origin, bp.encode(a.link)
    return gid, a.prev, a.origin, a.writeset.raw or wire.encode(a.writeset)


def _unstable_action(gid: int, prev: int, origin: str, data: bytes) -> Action:
    """An entry of a GID answer's ``unstable`` as the joiner applies it (_unstable_entry's inverse)."""
    if link_position.is_link_origin(origin):
        try:
            m = bp.decode(data)
        except bp.BusProtoError as e:
            raise wire.WireError(f"link writeset of GID {gid}: {e}") from None
        if not isinstance(m, bp.LinkWriteset):
            raise wire.WireError(f"GID {gid} of origin {origin} is not a link writeset")
        return Apply(gid, prev, origin, wire.scan(m.writeset), link=m)
    return Apply(gid, prev, origin, wire.scan(data))


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


def _uuid4() -> uuid.UUID:
    return uuid.uuid4()  # looked up at each call: the simulation draws them from its seed


class Replicator:
    def __init__(self, node: str, cluster_uuid: str, last_gid: int, max_committed: int = 0, bootstrap: bool = False,
                 compat: str = "", member_votes: int = 0, *, epochs: tuple[Epoch, ...] = (),
                 records: Optional[dict[str, MemberRecord]] = None, holding: Optional[Callable[[], Holding]] = None,
                 history: int = 20000, clock: Callable[[], float] = time.time,
                 certifiers: Optional[CertifierClass] = None) -> None:
        self.node = node
        self.cluster_uuid = cluster_uuid  # "" until the node has joined a cluster
        self.last_gid = last_gid  # durable committed GID of the local database at start
        # the highest GID the database has committed: above last_gid only with several commit lanes,
        # where a crash can leave commits above the watermark (docs/APPLY.md)
        self.max_committed = max_committed
        self.bootstrap = bootstrap  # told to start a new cluster if none answers
        # The database's encoding and PostgreSQL major version: a node whose data would be read
        # differently (another encoding, another binary format) does not join.
        self.compat = compat
        # Coordinators sharing one bus node (a local cluster): votes count them, not bus nodes, so
        # no node goes on alone after the others stopped. 0: one vote per bus node.
        self.member_votes = member_votes
        # The primary component's members, what the node remembers of the history (its epochs and
        # member records: history.py, its state file) and the join handshake (membership.py).
        self.membership = Membership(node, epochs, dict(records or {}))
        # what the node's disk holds, for its GID requests (the coordinator's; None: ``last_gid``)
        self.holding = holding
        self.phase = Phase.CONNECTING
        self.gid = 0
        self.last_certified = 0
        self.quorate = False
        self.local_member = ""
        self.members: tuple[str, ...] = ()
        # the certifier implementation (certifier.Certifier unless told: the differential tests)
        self.certifiers: CertifierClass = certifiers if certifiers is not None else Certifier
        self.certifier: CertificationIndex = self.certifiers()
        # request ids and a new cluster's UUID (a replayed trace gives the recorded ones)
        self.new_id: Callable[[], uuid.UUID] = _uuid4
        # certification history kept below the cluster-wide committed minimum, in GIDs: a
        # transaction whose snapshot is older than this fails as "snapshot too old"
        self.history = history
        self.ddl_open: dict[int, str] = {}  # schema change GID -> origin node
        # Writesets delivered while a schema change's outcome is open: certified once it is known
        # (its content's keys recorded first), in GID order. Every node defers alike.
        self._deferred: list[tuple[int, bp.WritesetMsg | bp.LinkWriteset, wire.Writeset]] = []
        # inconsistency voting: open ballots by GID, and the outcomes decided (the last ones)
        self.ballots: dict[int, _Ballot] = {}
        self.decided: dict[int, bool] = {}
        # schema changes settled by every node's report (the last ones): committed, or undone
        self.settled: dict[int, bool] = {}
        self.stats = Stats()
        self._buffer: list[Delivery] = []  # delivered after this node's request was, until its answer
        # local writesets the coordinator scanned (validated) when the backend sent them, by ticket
        self._local_scanned: dict[int, wire.Writeset] = {}
        self.paused_by: set[str] = set()  # nodes that asked the cluster to slow down
        self._paused = False  # the last Pause returned
        # Uniform commit. Corosync delivers in agreed order, not uniformly: a node may deliver a
        # message that no other node receives before a partition cuts it off. So a certified
        # writeset is released (to be committed, logged, or answered to its backend) only once bus
        # nodes with a quorum of votes have delivered it; any later primary component then holds
        # it. A node alone on its bus node (the local cluster: quorum 1) releases at once.
        self.votes = Votes()
        self.released = 0  # the last GID released
        # the last certification failures, oldest first (chorus.conflicts; every node keeps the same
        # ones, but the time each saw them); ``clock`` gives their time
        self.conflicts: deque[Conflict] = deque(maxlen=CONFLICT_HISTORY)
        # the outcome of each writeset certified here, for chorus.commit_outcome (outcomes.py)
        self.outcomes = OutcomeIndex()
        self.clock = clock
        self.received: dict[str, int] = {}  # bus node -> GID it reported delivered
        self._unstable: list[tuple[int, Action]] = []  # certified, not yet released
        self._reported = 0
        self._report_on_bus = False
        self._report_last_tick = -1  # the report that was on the bus at the previous tick
        self._sync_sent = False  # caught up: its Progress saying so is on the bus
        # Live writesets after a catch-up's range are held by the coordinator until the range is
        # applied; released ones are admitted (and so will be held by the database) only after that.
        self._catching_up = False
        self._will_hold = 0  # the last GID released to be admitted when the node left the primary component
        self._now = 0.0

    # ---- the members (membership.py) ---------------------------------------------------------

    @property
    def online(self) -> dict[str, str]:
        """The members of the primary component: node name -> bus member id."""
        return self.membership.online

    @online.setter
    def online(self, online: dict[str, str]) -> None:
        self.membership.online = online

    @property
    def synced(self) -> set[str]:
        """The members that are synced (the others catch up)."""
        return self.membership.synced

    @synced.setter
    def synced(self, synced: set[str]) -> None:
        self.membership.synced = synced

    @property
    def progress(self) -> dict[str, int]:
        return self.membership.progress

    @property
    def epochs(self) -> tuple[Epoch, ...]:
        return self.membership.epochs

    @property
    def records(self) -> dict[str, MemberRecord]:
        return self.membership.records

    @property
    def reform(self) -> Optional[Decision]:
        return self.membership.reform

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
        m = self.membership
        previous = set(self.members)
        self.members = view.members
        self.local_member = view.local
        quorate, cut_off = view_quorum(view, previous, self.member_votes)
        was_quorate, self.quorate = self.quorate, quorate
        self.votes = view.votes
        self._now = now
        # reports count within one view: every following node reports afresh
        self.received.clear()
        m.view_changed(view.members)
        self._reported, self._report_on_bus = 0, False
        # Members that left the view left the primary component here. Only a node that stays in
        # it records so: one that leaves it too cannot tell whether they went on elsewhere.
        stays = self.phase in _FOLLOWING and quorate and not cut_off
        out += self._forget([name for name, member in m.online.items() if member not in view.members], stays)
        if self.phase == Phase.CONNECTING:
            m.joining_since = now
            if self.bootstrap and view.members == (view.local,) and quorate:
                out.append(Send(self._bootstrap_message()))
                self.phase = Phase.JOINING
                m.request_at = now
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
                m.joining_since = now  # a bootstrap waits as long again for an answer from a quorum
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
            self.membership.requested(d.sender, msg)  # every node keeps them, whatever its phase
        if isinstance(msg, bp.Bootstrap):
            self.membership.forget_requests()  # a primary component exists from here
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
        m = self.membership
        if m.reform_sent and now - m.reform_at >= 5 * REQUEST_RETRY_S:
            m.reform_sent = False  # its bootstrap never came back (a send that failed): decide again
        if self.phase == Phase.NEEDS_RECOVERY:
            if self.quorate and self.cluster_uuid and now - m.request_at >= 5 * REQUEST_RETRY_S:
                return self._request(now, join=False)
            return []
        if self.phase != Phase.JOINING:
            return []
        # only with a quorum: a node that bootstrapped alone would count itself cut off when the
        # others arrive, and they would have no cluster to join (invariant 7)
        if self.bootstrap and self.quorate and now - m.joining_since >= BOOTSTRAP_WAIT_S:
            m.joining_since = now
            return [Send(self._bootstrap_message())]
        retry = REQUEST_RETRY_S if not m.request_seen else 5 * REQUEST_RETRY_S
        if now - m.request_at >= retry:
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

    def _bootstrap_message(self) -> bp.Bootstrap:
        """``chorus bootstrap``: start the cluster (again) at this node's GID, in a new epoch."""
        gid = self._holding().gid
        return self.membership.bootstrap_message(self.cluster_uuid or str(self.new_id()), gid)

    def _holding(self) -> Holding:
        """What this node holds now (its disk, and what it will admit of what it released)."""
        h = self.holding() if self.holding is not None else Holding(self.last_gid)
        return Holding(max(h.gid, self._will_hold), h.log_after, h.log_high)

    def _remember(self) -> Remember:
        return self.membership.remember()

    def _request(self, now: float, join: bool = True) -> list[Action]:
        """Ask to join (or, with ``join`` false, only take part in a re-form), saying what this
        node holds: the GID it announces is the most its database will hold until it is answered."""
        if join:
            self.phase = Phase.JOINING
        request_id = self.new_id().hex
        out = self._drop_buffer()
        h = self._holding()
        self.last_gid = h.gid
        return out + [Send(self.membership.request(request_id, self.cluster_uuid, h, join, now))]

    def _forget(self, names: list[str], record: bool = True) -> list[Action]:
        """Nodes that are no longer members of the primary component (``record``: this node stays
        in it and remembers where they left); a schema change of theirs whose outcome they did
        not report is skipped everywhere."""
        out: list[Action] = []
        for name in names:
            self.paused_by.discard(name)
        if self.membership.forget(names, self.gid if record else None):
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
        if self.phase not in _FOLLOWING or not self.quorate or self.membership.has_synced_member:
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
        self.membership.leave()
        self.paused_by.clear()
        out: list[Action] = [PhaseChange(phase, reason)]
        # Writesets not yet known to a quorum: the primary component may or may not have them.
        # None commits here; the node learns their fate when it rejoins (partial recovery
        # brings those the primary has). Their clients hear that the outcome is unknown.
        held, self._unstable = self._unstable, []
        held += [(gid, LocalVerdict(m.ticket, True, gid, 0, "", ws)) for gid, m, ws in self._deferred
                 if isinstance(m, bp.WritesetMsg) and m.origin == self.node]
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
        joined_at = self.membership.joined_at
        nodes = {node for node, g in self.received.items() if g >= gid and joined_at.get(node, 0) < gid}
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
        m = self.membership
        if isinstance(msg, bp.GidRequest) and msg.request_id == m.request_id:
            m.request_seen = True
            return self._drop_buffer()
        if not m.request_seen:
            return self._refuse_own(msg)
        if isinstance(msg, bp.GidReply) and msg.node == self.node and msg.request_id == m.request_id:
            return self._joined(d, msg)
        self._buffer.append(d)
        return []

    def _reform(self) -> list[Action]:
        """Re-form the primary component when no member has it (Membership.reform_decision): if
        this node is the one that holds the most, it starts a new epoch."""
        b = self.membership.reform_decision(self.quorate, self.members, self.votes, self.member_votes, self._now)
        return [Send(b)] if b is not None else []

    def _bootstrap_seen(self, d: Delivery, msg: bp.Bootstrap) -> list[Action]:
        """A Bootstrap delivered while this node is not in the primary component."""
        if msg.node == self.node and d.sender == self.local_member:
            if not self.quorate:
                # decided in a quorate view, delivered after a view change took the quorum away
                self.membership.reform_sent = False
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
        self.certifier = self.certifiers(msg.gid)
        self.membership.bootstrapped(sender, msg)
        self.phase = Phase.ONLINE
        self.bootstrap = False
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
        m = self.membership
        admitted = self.node in dict(msg.online)
        refusal = m.refusal(msg, self.cluster_uuid, self.compat)
        if refusal is not None:
            return self._stay_out(refusal, admitted)
        try:
            unstable: list[tuple[int, Action]] = [(g, _unstable_action(g, prev, origin, ws))
                                                  for g, prev, origin, ws in msg.unstable if g > self.last_gid]
        except wire.WireError as e:
            self.stats.malformed += 1
            return self._stay_out(f"the answer to this node's GID request holds a malformed writeset ({e}): "
                                  "it asks again", admitted) + self._request(self._now)
        refusal = m.history_refusal(msg, max(self.last_gid, self.max_committed))
        if refusal is not None:
            return self._stay_out(refusal, admitted)
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
        self.certifier = self.certifiers.restore(msg.certifier)
        m.joined(msg)  # the members at the request's place (what was delivered since is replayed)
        self.paused_by = set(msg.paused)
        self._sync_sent = False
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
            bm = bp.decode(b.payload)
            if isinstance(bm, bp.GidRequest) and b.sender in self.members:
                m.latest(b.sender, bm)  # after the answer's state
            out += self._handle(b.sender, bm)
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
        if isinstance(msg, bp.LinkWriteset):
            return self._link_writeset(msg)
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
            # a recovering member that caught up is synced from here, for every node
            if self.membership.progressed(sender, msg) and msg.node == self.node and self.phase == Phase.RECOVERING:
                self.phase = Phase.ONLINE
                self._sync_sent = False
                out.append(PhaseChange(Phase.ONLINE, f"caught up with cluster {self.cluster_uuid} at "
                                                     f"GID {msg.committed_gid}"))
            if msg.node in self.online:
                low = self.membership.committed_by_all()
                if low is not None:
                    self.certifier.purge(low - self.history)
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
        m = self.membership
        if msg.node == self.node and msg.request_id != m.request_id:
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
        m.asked(sender, msg, self.gid)
        # While a schema change's outcome is open, the state at this point is not final (the
        # writesets after it are not certified yet): the joiner asks again later.
        if msg.join and self.phase == Phase.ONLINE and m.answers and not self.ddl_open and not self.settling:
            place = Place(self.cluster_uuid, self.gid, self.last_certified, self.released, self.certifier.snapshot(),
                          tuple(sorted(self.paused_by)), self.compat,
                          tuple(_unstable_entry(self.node, g, a) for g, a in self._unstable))
            out.append(Send(m.answer(sender, msg, place)))
        return out

    def _gid_reply(self, msg: bp.GidReply) -> list[Action]:
        """A member answered a GID request: the joiner is a member from here (synced, or catching
        up), as the answer says, for every node."""
        if not self.membership.answered(msg, self.members, self.cluster_uuid, self.gid):
            return []
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

    def _link_writeset(self, msg: bp.LinkWriteset) -> list[Action]:
        """A transaction of a peer site, sent on by this site's receiver of ``msg.link``
        (docs/LINKS.md section 3): it takes a GID like any writeset, if its sender is a member
        at this place; malformed, or with a schema change (links do not carry them yet), it
        fails here as everywhere, and its receiver, which waits for it, sends it again from the
        link's durable position."""
        if self.phase not in _FOLLOWING or not self.quorate or msg.node not in self.online:
            return []
        self.gid += 1
        gid = self.gid
        self.stats.delivered += 1
        self.outcomes.seen(gid)
        try:
            ws = wire.scan(msg.writeset)
            if ws.has_schema:
                raise wire.WireError("a link writeset carries no schema change")
        except wire.WireError as e:
            log.warning("link writeset of link %s (peer GID %d) from %s refused: %s", msg.link, msg.peer_gid,
                        msg.node, e)
            self.stats.malformed += 1
            self.stats.cert_failures += 1
            return []
        if self.ddl_open or self._deferred:
            self._deferred.append((gid, msg, ws))
            return []
        return self._certify(gid, msg, ws)

    def _certify_link(self, gid: int, msg: bp.LinkWriteset, ws: wire.Writeset) -> list[Action]:
        """Certify a link writeset by the same rule as any writeset (invariant 2), under its
        link's origin and as a blind write ordered at its GID: it saw everything before it (it
        read nothing of this site), so it never fails, while a local transaction that overlaps
        it and is certified after it without having seen it fails (40001), on every node."""
        origin = link_position.origin(msg.link)
        v = self.certifier.certify(gid, origin, gid - 1, ws.keys)
        if not v.ok:  # nothing certified lies between gid - 1 and gid: only a bug gets here
            log.error("link writeset GID %d of link %s failed certification: %s", gid, msg.link, v.reason)
            self.stats.cert_failures += 1
            return []
        prev, self.last_certified = self.last_certified, gid
        self.stats.certified += 1
        self.stats.remote_certified += 1
        return self._hold(gid, Apply(gid, prev, origin, ws, link=msg))

    def local_in_flight(self) -> list[wire.Writeset]:
        """This node's writesets sent for ordering and not delivered back yet."""
        return list(self._local_scanned.values())

    def _certify(self, gid: int, msg: "bp.WritesetMsg | bp.LinkWriteset", ws: wire.Writeset) -> list[Action]:
        if isinstance(msg, bp.LinkWriteset):
            return self._certify_link(gid, msg, ws)
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
                self.membership.record_left(n, gid - 1 if outcome else self.gid)
            out.append(self._remember())
            out += self._dissolve_if_unsynced()
        return out

