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
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, cast

from chorus import confchange, wire
from chorus.actions import (Action, Apply, CatchUp, Joined, LinkPinned, LogOffered, LogQueried, Pause, Phase,
                            PhaseChange, Reconfigure, Reconfigured, Remember, Removed, Send, SyncReached, VoteDecided,
                            VoteOpened)
from chorus.bus import proto as bp
from chorus.bus import Delivery, View, Votes, bus_node
from chorus.certifier import CertificationIndex, Certifier, CertifierClass
from chorus.confchange import ClusterConfig
from chorus.dataplane import native
from chorus.dataplane.order import Conflict, OrderCore, Stats
from chorus.history import Decision, Epoch, MemberRecord
from chorus.link import position as link_position
from chorus.membership import Holding as Holding  # (its home is membership.py)
from chorus.membership import Membership, Place, view_quorum
from chorus.outcomes import OutcomeIndex

log = logging.getLogger("chorus.replicator")

REQUEST_RETRY_S = 2.0
BOOTSTRAP_WAIT_S = 3.0
# the bus protocol version of Configure and of the configured set in GID requests and answers
CONFIGURE_VERSION = 4

# phases in which the node follows the total order (certifies every writeset)
_FOLLOWING = (Phase.ONLINE, Phase.RECOVERING)


@dataclass
class _Ballot:
    voters: frozenset[str]  # the nodes online when the vote opened
    votes: dict[str, tuple[bool, str]] = field(default_factory=dict)
    schema: bool = False  # a schema change's reports: every voter must have applied it


def _unstable_action(gid: int, prev: int, origin: str, data: bytes, speaks: bp.RangeT = bp.SPEAKS) -> Action:
    """An entry of a GID answer's ``unstable`` as the joiner applies it (OrderCore.unstable_entries'
    inverse)."""
    if link_position.is_link_origin(origin):
        try:
            m = bp.decode(data, speaks)
        except bp.BusProtoError as e:
            raise wire.WireError(f"link writeset of GID {gid}: {e}") from None
        if not isinstance(m, bp.LinkWriteset):
            raise wire.WireError(f"GID {gid} of origin {origin} is not a link writeset")
        return Apply(gid, prev, origin, wire.scan(m.writeset), link=m)
    if data[:len(wire.MAGIC)] != wire.MAGIC:  # a writeset with its commit time, as its message
        try:
            w = bp.decode(data, speaks)
        except bp.BusProtoError as e:
            raise wire.WireError(f"writeset of GID {gid}: {e}") from None
        if not isinstance(w, bp.WritesetMsg) or w.origin != origin:
            raise wire.WireError(f"GID {gid} of origin {origin} is neither a writeset nor its message")
        return Apply(gid, prev, origin, wire.scan(w.writeset), commit_time=w.commit_time)
    return Apply(gid, prev, origin, wire.scan(data))


def _uuid4() -> uuid.UUID:
    return uuid.uuid4()  # looked up at each call: the simulation draws them from its seed


class Replicator:
    def __init__(self, node: str, cluster_uuid: str, last_gid: int, max_committed: int = 0, bootstrap: bool = False,
                 compat: str = "", member_votes: int = 0, *, epochs: tuple[Epoch, ...] = (),
                 records: Optional[dict[str, MemberRecord]] = None, holding: Optional[Callable[[], Holding]] = None,
                 history: int = 20000, clock: Callable[[], float] = time.time,
                 certifiers: Optional[CertifierClass] = None, speaks: bp.RangeT = bp.SPEAKS,
                 config: Optional[ClusterConfig] = None, orders: Optional[Callable[..., OrderCore]] = None) -> None:
        self.node = node
        self.cluster_uuid = cluster_uuid  # "" until the node has joined a cluster
        self.last_gid = last_gid  # durable committed GID of the local database at start
        # the highest GID the database has committed: above last_gid only with several commit lanes,
        # where a crash can leave commits above the watermark (docs/APPLY.md)
        self.max_committed = max_committed
        self.bootstrap = bootstrap  # told to start a new cluster if none answers
        # When this node last sent a Bootstrap (the operator's or a re-form's) that has not come
        # back yet: it asks for no GID meanwhile. Its Bootstrap may be delivered in a later view
        # (sent while the membership changed), and a request sent after it but before its
        # delivery would then arrive from a member: every node forgets a member asking to join
        # (below), so it would leave the cluster it had just started (simulation seed 11303).
        self._bootstrap_at: Optional[float] = None
        # The database's encoding and PostgreSQL major version: a node whose data would be read
        # differently (another encoding, another binary format) does not join.
        self.compat = compat
        # Coordinators sharing one bus node (a local cluster): votes count them, not bus nodes, so
        # no node goes on alone after the others stopped. 0: one vote per bus node. (Counted from
        # the configured set once `chorus node add`/`remove` changed it: member_votes.)
        self.configured_votes = member_votes
        # The primary component's members, what the node remembers of the history (its epochs and
        # member records: history.py, its state file) and the join handshake (membership.py).
        self.membership = Membership(node, epochs, dict(records or {}), own=speaks)
        self.membership.config = config  # the configured set its state file holds (confchange.py)
        self.membership.keeps_ids = member_votes <= 0  # (a local cluster counts coordinators, not Corosync ids)
        self._view: Optional[View] = None  # the last view (its votes recounted when the configured set changes)
        # what the node's disk holds, for its GID requests (the coordinator's; None: ``last_gid``)
        self.holding = holding
        # The total order's state and what every writeset goes through (dataplane/order.py): this
        # class decides the rest, and tells the order core what it decided. Told neither
        # (``orders``, ``certifiers``: the differential tests), the C order core on the C index
        # when it is built and CHORUS_IMPL allows (dataplane/native.py's IMPL), else OrderCore on
        # certifier.Certifier; told only ``certifiers``, OrderCore on them.
        native_core = orders is None and certifiers is None and native.IMPL == "c"
        self.certifiers: CertifierClass = (certifiers if certifiers is not None else
                                           cast(CertifierClass, native.NativeCertifier) if native_core else Certifier)
        # (the C one has OrderCore's interface: tests/unit/test_dataplane_order.py holds them alike)
        make = orders or (cast(Callable[..., OrderCore], native.NativeOrderCore) if native_core else OrderCore)
        self.order: OrderCore = make(node, self.membership, self.certifiers(), self._open_round, clock)
        self.phase = Phase.CONNECTING
        self.quorate = False
        self.local_member = ""
        self.members: tuple[str, ...] = ()
        # request ids and a new cluster's UUID (a replayed trace gives the recorded ones)
        self.new_id: Callable[[], uuid.UUID] = _uuid4
        # certification history kept below the cluster-wide committed minimum, in GIDs: a
        # transaction whose snapshot is older than this fails as "snapshot too old"
        self.history = history
        # inconsistency voting: open ballots by GID, and the outcomes decided (the last ones)
        self.ballots: dict[int, _Ballot] = {}
        self.decided: dict[int, bool] = {}
        # schema changes settled by every node's report (the last ones): committed, or undone
        self.settled: dict[int, bool] = {}
        self._buffer: list[Delivery] = []  # delivered after this node's request was, until its answer
        self.paused_by: set[str] = set()  # nodes that asked the cluster to slow down
        self._paused = False  # the last Pause returned
        self._sync_sent = False  # caught up: its Progress saying so is on the bus
        self._now = 0.0

    # ---- the configured set (confchange.py) ------------------------------------------------

    @property
    def config(self) -> Optional[ClusterConfig]:
        """The cluster's configured nodes from the first `chorus node add`/`remove` on (None: the
        node's own configuration says)."""
        return self.membership.config

    @property
    def shared_bus(self) -> bool:
        """All coordinators share one Corosync (a local cluster): votes count coordinators."""
        return self.configured_votes > 0

    @property
    def member_votes(self) -> int:
        """Coordinators sharing one bus node (a local cluster), counted from the configured set
        once there is one; 0: one vote per bus node."""
        return confchange.member_votes(self.config, self.configured_votes)

    def _counted(self, view: View) -> View:
        """``view`` with the votes this node counts: the configured set's once there is one."""
        votes = confchange.votes(self.config, view.votes, self.shared_bus)
        if votes == view.votes:
            return view
        return replace(view, quorum=votes.quorum, expected=votes.expected, tie_breaker=votes.tie_breaker,
                       voters=votes.voters)

    def _votes_in(self, member: str) -> bool:
        """Whether bus member ``member``'s node has a vote (a configured node's Corosync id, once
        there is a configured set): uniform commit counts the reports of those only."""
        voters = confchange.votes(self.config, Votes(), self.shared_bus).voters
        return voters is None or bus_node(member) in voters

    @staticmethod
    def _order_votes(votes: Votes) -> Votes:
        """The votes the order core counts reports against. The reports of bus nodes without a vote
        are not given to it (:meth:`_votes_in`), and this node is in the primary component only from
        its configured id (Membership.misplaced), so it needs no voters of its own: both order cores
        (dataplane/order.py, the C one) count alike."""
        return replace(votes, voters=None)

    # ---- what the order core reads, and reads through to it ----------------------------------

    @property
    def phase(self) -> Phase:
        return self._phase

    @phase.setter
    def phase(self, phase: Phase) -> None:
        self._phase = phase
        self.order.following = phase in _FOLLOWING

    @property
    def quorate(self) -> bool:
        return self.order.quorate

    @quorate.setter
    def quorate(self, quorate: bool) -> None:
        self.order.quorate = quorate

    @property
    def local_member(self) -> str:
        return self.order.local_member

    @local_member.setter
    def local_member(self, member: str) -> None:
        self.order.local_member = member

    @property
    def gid(self) -> int:
        """The last GID given (the order core's)."""
        return self.order.gid

    @property
    def last_certified(self) -> int:
        return self.order.last_certified

    @property
    def released(self) -> int:
        return self.order.released

    @property
    def votes(self) -> Votes:
        return self.order.votes

    @property
    def certifier(self) -> CertificationIndex:
        return self.order.certifier

    @property
    def ddl_open(self) -> dict[int, str]:
        return self.order.ddl_open

    @property
    def stats(self) -> Stats:
        return self.order.stats

    @property
    def conflicts(self) -> deque[Conflict]:
        return self.order.conflicts

    @property
    def outcomes(self) -> OutcomeIndex:
        return self.order.outcomes

    @property
    def held_count(self) -> int:
        """Certified writesets waiting until a quorum of bus nodes is known to have them."""
        return self.order.held_count

    @property
    def deferred_count(self) -> int:
        """Writesets waiting for a schema change's outcome before they are certified."""
        return self.order.deferred_count

    def expect_local(self, ticket: int, writeset: wire.Writeset) -> None:
        """A local backend's writeset, scanned, goes to the bus with ``ticket``: when it is
        delivered back it is not parsed again."""
        self.order.expect_local(ticket, writeset)

    def stale_local(self, last_seen: int) -> Optional[str]:
        """Why a local writeset whose snapshot saw GID ``last_seen`` is refused before it is
        ordered (a writeset of this node it did not see is applied, not committed by its session:
        OrderCore.stale_local), or None."""
        return self.order.stale_local(last_seen)

    def forget_local(self, ticket: int) -> None:
        """The writeset of ``ticket`` never reached the bus."""
        self.order.forget_local(ticket)

    def local_in_flight(self) -> list[wire.Writeset]:
        """This node's writesets sent for ordering and not delivered back yet."""
        return self.order.local_in_flight()

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

    def on_view(self, view: View, now: float) -> list[Action]:
        out: list[Action] = []
        m = self.membership
        previous = set(self.members)
        self._view = view
        learned = m.learn(self.node, view.local)  # its own Corosync id (a set recorded before ids were kept)
        view = self._counted(view)
        self.members = view.members
        self.local_member = view.local
        quorate, cut_off = view_quorum(view, previous, self.member_votes)
        was_quorate, self.quorate = self.quorate, quorate
        self._now = now
        self.order.view_changed(self._order_votes(view.votes))
        m.view_changed(view.members)
        if learned:
            assert self.config is not None
            out.append(Reconfigure(self.config))
        # Members that left the view left the primary component here. Only a node that stays in
        # it records so: one that leaves it too cannot tell whether they went on elsewhere.
        stays = self.phase in _FOLLOWING and quorate and not cut_off
        out += self._forget([name for name, member in m.online.items() if member not in view.members], stays)
        if self.phase == Phase.CONNECTING:
            m.joining_since = now
            if self.bootstrap and view.members == (view.local,) and quorate:
                out.append(self._send_bootstrap(self._bootstrap_message(), now))
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
            out += self._dissolve_if_unsynced() or self.order.release()
        elif quorate and self.phase in (Phase.NON_PRIMARY, Phase.JOINING):
            if self.phase == Phase.JOINING and not was_quorate:
                m.joining_since = now  # a bootstrap waits as long again for an answer from a quorum
            # In every quorate view a node outside the primary component asks (again): members
            # that can answer may have arrived, and if none can, the nodes re-form it only once
            # every member of this view has asked in it. Not while its own Bootstrap is on the way.
            if not self._bootstrap_pending(now):
                out += self._request(now)
        elif quorate and self.phase == Phase.NEEDS_RECOVERY and self.cluster_uuid:
            out += self._request(now, join=False)  # it stays out, but takes part in a re-form
        return self._pause_changed(out)

    def on_delivery(self, d: Delivery) -> list[Action]:
        try:
            msg = bp.decode(d.payload, self.membership.own)
        except bp.BusProtoError as e:
            log.warning("dropping malformed bus message from %s: %s", d.sender, e)
            return []
        adopted: list[Action] = []
        if isinstance(msg, bp.GidRequest) and d.sender in self.members:
            before = self.config
            self.membership.requested(d.sender, msg)  # every node keeps them, whatever its phase
            adopted = self._config_changed(before)
        if isinstance(msg, bp.Bootstrap):
            self.membership.forget_requests()  # a primary component exists from here
            if msg.node == self.node and d.sender == self.local_member:
                self._bootstrap_at = None  # it came back (started, or not in a view without quorum)
            if d.sender in self.members:
                before = self.config
                self.membership.learn(msg.node, d.sender)
                adopted += self._config_changed(before)
            if self.phase not in _FOLLOWING:
                return self._pause_changed(self._bootstrap_seen(d, msg))
        if self.phase == Phase.JOINING:
            out = self._joining(d, msg)
        else:
            out = self._handle(d.sender, msg)
        if isinstance(msg, bp.GidRequest) and self.phase not in _FOLLOWING:
            out += self._reform() or self._bootstrap_new()
        return self._pause_changed(adopted + out)

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
            return self.order.tick()
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
        if self._bootstrap_pending(now):
            return []
        if self.bootstrap and self.quorate and now - m.joining_since >= BOOTSTRAP_WAIT_S:
            m.joining_since = now
            return [self._send_bootstrap(self._bootstrap_message(), now)]
        retry = REQUEST_RETRY_S if not m.request_seen else 5 * REQUEST_RETRY_S
        if now - m.request_at >= retry:
            return self._request(now)
        return []

    def _bootstrap_new(self) -> list[Action]:
        """The node told to bootstrap starts a new cluster at once, rather than after
        BOOTSTRAP_WAIT_S, when every member of its quorate view has asked in this view and none
        of them ever joined a cluster: nobody can answer (only a member in a primary component
        does, and none is) and no node here holds a cluster's data. A member arriving later joins
        the new cluster as it would after the wait."""
        m = self.membership
        if not (self.bootstrap and self.quorate and self.phase == Phase.JOINING and m.request_seen) or \
                self.cluster_uuid or self._bootstrap_pending(self._now) or set(m.requests) != set(self.members) or \
                any(r.cluster_uuid for r in m.requests.values()):
            return []
        m.joining_since = self._now
        return [self._send_bootstrap(self._bootstrap_message(), self._now)]

    def _send_bootstrap(self, msg: bp.Bootstrap, now: float) -> Send:
        self._bootstrap_at = now
        return Send(msg)

    def _bootstrap_pending(self, now: float) -> bool:
        """Whether this node's Bootstrap is on the way (for at most as long as a re-form's waits:
        one that never comes back, a send that failed, holds nothing up for good)."""
        if self._bootstrap_at is not None and now - self._bootstrap_at >= 5 * REQUEST_RETRY_S:
            self._bootstrap_at = None
        return self._bootstrap_at is not None

    def progress_message(self, committed_gid: int) -> Optional[Send]:
        """What an online node reports every second; a recovering one that caught up says so
        again until the others count it synced."""
        if self.phase != Phase.ONLINE and not (self.phase == Phase.RECOVERING and self._sync_sent):
            return None
        return Send(bp.Progress(self.node, committed_gid))

    @property
    def send_version(self) -> int:
        """The bus protocol version this node writes: the cluster's (bus/versions.py), or, outside
        a primary component, the lowest it speaks, which every node that could answer reads; 4 at
        least once it holds a configured set (confchange.py). The nodes were changed only at
        version 4, so every configured node reads it, and only there do GID requests carry the
        set: a re-form counts from the newest set the requests carry, and at version 3 a winner
        that missed the last change (rebuilt by total recovery, or away when it was made) put the
        cluster back on its older set, leaving a node added since refused as not configured (the
        simulation's seed 44)."""
        if self.membership.version:
            return self.membership.version
        lo, hi = self.membership.own
        if self.config is not None and hi >= CONFIGURE_VERSION:
            return max(lo, CONFIGURE_VERSION)
        return lo

    @property
    def cluster_version(self) -> int:
        """The cluster's bus protocol version (0: not in a primary component)."""
        return self.membership.version

    @property
    def accepts_writes(self) -> bool:
        return self.phase == Phase.ONLINE and self.quorate

    def held_released(self) -> None:
        """The coordinator applied a catch-up's range and admits the live stream from now on."""
        self.order.catching_up = False

    def recovered(self, committed_gid: int) -> list[Action]:
        """The coordinator caught up (committed everything up to the CatchUp's ``upto``, and
        ``committed_gid`` in all): it tells the members, and is online once that is delivered."""
        if self.phase != Phase.RECOVERING:
            return []
        self.order.catching_up = False
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
        return Holding(max(h.gid, self.order.will_hold), h.log_after, h.log_high)

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
        self._sync_sent = False
        self.phase = phase
        self.membership.leave()
        self.paused_by.clear()
        return [PhaseChange(phase, reason), *self.order.leave()]

    def _drop_buffer(self) -> list[Action]:
        """Forget what was delivered after a request that will not be answered (the node asks
        again): every node dropped this node's own writesets among it (it was no member there),
        so their backends are told they failed, rather than wait for good (found by the
        simulation: a writeset left after a freeze, buffered, then dropped with the buffer)."""
        out: list[Action] = []
        for b in self._buffer:
            out += self.order.refuse_own(bp.decode(b.payload, self.membership.own))
        self._buffer.clear()
        return out

    def _joining(self, d: Delivery, msg: bp.Message) -> list[Action]:
        m = self.membership
        if isinstance(msg, bp.GidRequest) and msg.request_id == m.request_id:
            m.request_seen = True
            return self._drop_buffer()
        if not m.request_seen:
            return self.order.refuse_own(msg)
        if isinstance(msg, bp.GidReply) and msg.node == self.node and msg.request_id == m.request_id:
            return self._joined(d, msg)
        self._buffer.append(d)
        return []

    def _reform(self) -> list[Action]:
        """Re-form the primary component when no member has it (Membership.reform_decision): if
        this node is the one that holds the most, it starts a new epoch."""
        quorate, votes = self.quorate, self.votes
        if self._view is not None:  # counted again: a request may have brought a newer configured set
            view = self._counted(self._view)
            quorate, votes = view_quorum(view, set(), self.member_votes)[0], view.votes
        b = self.membership.reform_decision(quorate, self.members, votes, self.member_votes, self._now)
        return [self._send_bootstrap(b, self._now)] if b is not None else []

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
        self.order.install(msg.gid, msg.gid, msg.gid, [], self.certifiers(msg.gid))
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
            removed: list[Action] = [Removed(refusal)] if m.unconfigured(msg) is not None else []
            return self._stay_out(refusal, admitted) + removed
        try:
            unstable: list[tuple[int, Action]] = [(g, _unstable_action(g, prev, origin, ws, m.own))
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
        self.order.install(msg.gid, msg.certified, released, unstable, self.certifiers.restore(msg.certifier))
        # This node's own writesets the cluster certified while none of its sessions could commit
        # them (it was out, or their sessions heard "unknown"): those the answer holds, and any in
        # the range it catches up. They are applied from their writesets; a local transaction that
        # did not see them is refused before it is ordered (OrderCore.stale_local).
        for g, _prev, origin, _ws in msg.unstable:
            if origin == self.node and g > self.last_gid:
                self.order.lost_own(g)
        if behind:
            self.order.lost_own(released)
        before = self.config
        m.joined(msg)  # the members at the request's place (what was delivered since is replayed)
        self.paused_by = set(msg.paused)
        self._sync_sent = False
        out: list[Action] = [*undone, *self._config_changed(before, ask=False), self._remember(),
                             Joined(self.cluster_uuid, self.gid, False)]
        if behind:
            # partial recovery: certify the live stream from here on (the coordinator holds what
            # it must apply) while the missing range comes from a member's writeset log
            self.phase = Phase.RECOVERING
            self.order.catching_up = True
            out.append(CatchUp(self.last_gid, released))
            out.append(PhaseChange(Phase.RECOVERING,
                                   f"joined cluster {self.cluster_uuid} at GID {msg.gid}; catching up "
                                   f"from GID {self.last_gid} to {released} from a member's writeset log"))
        else:
            self.phase = Phase.ONLINE
        buffered, self._buffer = self._buffer, []
        for b in buffered:
            bm = bp.decode(b.payload, self.membership.own)
            if isinstance(bm, bp.GidRequest) and b.sender in self.members:
                m.latest(b.sender, bm)  # after the answer's state
            out += self._handle(b.sender, bm)
        out += self._handle(d.sender, msg)
        if not behind and self.phase == Phase.ONLINE:
            out.append(PhaseChange(Phase.ONLINE, f"joined cluster {self.cluster_uuid} at GID {msg.gid}"))
        return out

    def _handle(self, sender: str, msg: bp.Message) -> list[Action]:
        if isinstance(msg, bp.WritesetMsg):
            return self.order.writeset(msg)
        if isinstance(msg, bp.WritesetBatch):
            out: list[Action] = []
            for m in msg.messages():
                out += self.order.writeset(m)
            return out
        if isinstance(msg, bp.LinkWriteset):
            return self.order.link_writeset(msg)
        if isinstance(msg, bp.SyncMarker):
            if msg.node != self.node:
                return []
            return [SyncReached(msg.token, self.last_certified, self.accepts_writes)]
        if isinstance(msg, bp.LogInfo):
            return [LogOffered(msg)] if msg.node == self.node else []
        if isinstance(msg, bp.Received):
            return self.order.received_report(sender, msg, sender in self.members and self._votes_in(sender))
        if self.phase not in _FOLLOWING:
            return []
        if isinstance(msg, bp.LinkApplied):
            return [LinkPinned(msg.node, msg.link, msg.gid)] if msg.node in self.online else []
        if isinstance(msg, bp.LogQuery):
            # every member answers, a recovering one too: it serves what it has committed
            return [LogQueried(msg.node, msg.request_id)]
        if isinstance(msg, bp.GidRequest):
            return self._gid_request(sender, msg)
        if isinstance(msg, bp.GidReply):
            return self._gid_reply(msg)
        if isinstance(msg, bp.Configure):
            return self._configure(sender, msg)
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
                    self.order.purge(low, self.history)
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
        if isinstance(msg, bp.Speaks):
            if self.online.get(msg.node) == sender:
                self.membership.spoke(msg.node, msg.speaks)
            return []
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
        if msg.node == self.node:
            # A GID request in this node's name delivered while it is a member: every other node
            # forgets this node here (below), so this node must leave too, or it would go on
            # certifying writesets the others drop. It asks to join again. Either it did not make
            # the request (a member's bug, or worse), or it made it before it joined: a
            # Bootstrap, or the answer to an earlier request, came first in the order.
            why = (f"bus member {sender} asked to join in this node's name" if msg.request_id != m.request_id
                   else "its own request to join, made before it joined, came after it had joined: every node "
                        "forgets it there")
            out = self._leave_primary(why)
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
                          self.order.unstable_entries(self.send_version))
            reply = m.answer(sender, msg, place)
            readable = min(msg.speaks[1], bp.VERSION)
            if msg.speaks[0] <= m.version <= msg.speaks[1] or readable < max(msg.speaks[0], bp.MIN_VERSION):
                out.append(Send(reply))
            else:
                # refused for its protocol: written at a version it reads, so that it can say why
                # it stays out (a node of a release before 4 reads it in the answer's ``compat``);
                # members that cannot read it lose nothing (it admits no one)
                out.append(Send(reply, readable))
        return out

    def _gid_reply(self, msg: bp.GidReply) -> list[Action]:
        """A member answered a GID request: the joiner is a member from here (synced, or catching
        up), as the answer says, for every node."""
        m = self.membership
        if not m.answered(msg, self.members, self.cluster_uuid, self.gid):
            why = m.version_refusal(msg) if msg.node == self.node else None
            if why is not None:
                # this node's own answer, made when the cluster ran a version it speaks; the
                # others do not count it in here (Membership.answered): it stays out as they have it
                return self._leave_primary(why, Phase.NEEDS_RECOVERY)
            return []
        if not msg.speaks and m.own != bp.LEGACY:
            # answered by a node of a release before version 4: every node forgot the members'
            # versions there (Membership.answered); this one says its own again
            return [self._remember(), Send(bp.Speaks(self.node, m.own))]
        return [self._remember()]

    # ---- changing the configured nodes (confchange.py) ----------------------------------------

    def _config_changed(self, before: Optional[ClusterConfig], ask: bool = True) -> list[Action]:
        """The configured set changed from ``before`` (taken from a message of the order): it is
        written to the state file, and the view's votes are counted from it (``ask``: a node outside
        the primary component asks again if the view is quorate from here, :meth:`_recount`)."""
        if self.config is before:
            return []
        assert self.config is not None
        log.warning("configured nodes from here: %s (configuration version %d)", ", ".join(self.config.nodes),
                    self.config.version)
        out: list[Action] = [Reconfigure(self.config)]
        if self._view is not None:
            view = self._counted(self._view)
            self.order.votes = self._order_votes(view.votes)
            out += self._recount(view, ask)
        return out

    def _recount(self, view: View, ask: bool = True) -> list[Action]:
        """The configured set changed within a view: whether the view is quorate is counted again
        from it. A node that learned the ids of the nodes here (a set recorded before ids were kept:
        until then they count zero) may find a quorum, and asks as it would at a quorate view; a
        member that finds none leaves, as at a view that is not quorate. Every node that delivered
        the same messages counts alike."""
        quorate = view_quorum(view, set(), self.member_votes)[0]
        if quorate == self.quorate:
            return []
        self.quorate = quorate
        if not quorate:
            if self.phase in _FOLLOWING:
                return self._leave_primary("this node is outside the quorate partition of the group (counted "
                                           "from the configured nodes)")
            return []
        if not ask:
            return []
        if self.phase in (Phase.NON_PRIMARY, Phase.JOINING):
            if self.phase == Phase.JOINING:
                self.membership.joining_since = self._now  # (as at a view that is quorate again)
            return [] if self._bootstrap_pending(self._now) else self._request(self._now)
        if self.phase == Phase.NEEDS_RECOVERY and self.cluster_uuid:
            return self._request(self._now, join=False)
        return []

    def _configured_count(self) -> int:
        """How many nodes are configured before the first change: a local cluster's coordinators
        (its configuration, the same on every node). 0 with Corosync: votequorum's expected votes
        are read apart from the order and may differ between nodes for a moment, so they do not
        decide here (`chorus node add`/`remove` check the count against corosync.conf)."""
        return self.configured_votes

    def _configure(self, sender: str, msg: bp.Configure) -> list[Action]:
        """A member asks to change the configured nodes (``chorus node add``/``remove``): every
        member applies it here, or refuses it, alike (confchange.change_problem). Members that
        are not among the new nodes are dropped here; this node, if it is one, leaves and stops.
        Quorum counts from the new nodes from here on."""
        mine = msg.node == self.node and sender == self.local_member
        new, problem = confchange.with_ids(ClusterConfig(msg.version, msg.nodes, msg.tie_breaker, msg.ids),
                                           self.config, self.online, self.shared_bus)
        if problem is None:
            problem = (f"it was sent by bus member {sender}, not {msg.node}'s" if self.online.get(msg.node) != sender
                       else confchange.change_problem(self.config, self._configured_count(), new, self.online,
                                                      msg.node, self.shared_bus))
        if problem is not None:
            log.warning("configuration change to version %d (%s) refused: %s", new.version, ", ".join(new.nodes),
                        problem)
            return [Reconfigured(msg.request_id, False, problem)] if mine else []
        before = self.config
        self.membership.config = new
        out: list[Action] = self._config_changed(before)
        if mine:
            out.append(Reconfigured(msg.request_id, True, f"configured nodes from GID {self.gid}: "
                                                          f"{', '.join(new.nodes)} (version {new.version})"))
        if self.node not in new.nodes:
            reason = (f"this node was removed from cluster {self.cluster_uuid}'s configured nodes at GID {self.gid} "
                      f"(configuration version {new.version}); it is added back only by `chorus node add`")
            out += self._leave_primary(reason, Phase.NEEDS_RECOVERY)
            return out + [Removed(reason)]
        if self.phase not in _FOLLOWING:  # (not quorate from the new set: change_problem sees it cannot be)
            return out
        removed = sorted(n for n in self.online if n not in new.nodes)
        out += self._forget(removed)
        for name in list(self.records):  # a removed node is not waited for by a re-form
            if name not in new.nodes:
                del self.records[name]
        out.append(self._remember())
        return out + (self._dissolve_if_unsynced() or self.order.release())

    def _ddl_settled(self, gid: int, ok: bool, error: str,
                     content: Optional[wire.Writeset] = None) -> list[Action]:
        """Schema change ``gid``'s outcome is known (the order core records what it touched and
        certifies the writesets deferred behind it)."""
        return self.order.ddl_settled(gid, ok, error, content)

    # ---- inconsistency voting (Galera 4) ---------------------------------------------------

    def _vote(self, msg: bp.Vote) -> list[Action]:
        out: list[Action] = []
        b = self.ballots.get(msg.gid)
        if b is None:
            if (msg.gid in self.decided and not msg.ok and msg.node != self.node and self.phase == Phase.ONLINE
                    and msg.node not in self.membership.synced):
                # decided before the voter could hear it (it joined later and failed to apply the GID
                # catching up, or was cut off before the decision reached it, seeds 11691 and 13336):
                # it opened a ballot the members closed, so the synced members answer with the outcome
                # they hold, and it concludes as they did (leaves, or commits it empty). A synced
                # node's failure vote on a decided GID is such an answer: never answered in turn.
                return [Send(bp.Vote(self.node, msg.gid, self.decided[msg.gid],
                                     "" if self.decided[msg.gid] else "the majority could not apply it"))]
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

