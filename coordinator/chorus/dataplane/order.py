"""The order core: the part of the replicator every writeset goes through (docs/NATIVE.md 2.6).

It numbers the writesets delivered in total order (GIDs, seed 7.1), certifies them (seed 6),
defers those behind a schema change whose outcome is open, and holds the certified ones until a
quorum of bus nodes has delivered them (uniform commit), then releases them as
:class:`LocalVerdict` and :class:`Apply` actions. It keeps the certification index, the
outcome index, the conflicts and the counters.

It reads what the control plane (:class:`chorus.replicator.Replicator`) decided, and only that:
whether the node follows the total order and is quorate, its bus member, the members of the
primary component (the :class:`Membership` it is given), the votes of the current view. The
replicator sets those as it decides them (``SET_STATE`` in NATIVE.md 2.5), and calls the
primitives below where its decisions change the order's state: a view (``view_changed``), a
join or bootstrap (``install``), leaving the primary component (``leave``), a schema change's
outcome (``ddl_settled``), the members' progress (``purge``). This is the boundary the C order
core (step 1) implements; no I/O, no clock but the one given.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from chorus import wire
from chorus.actions import Action, Apply, DdlOutcome, LocalVerdict, Send
from chorus.bus import Votes, bus_node
from chorus.bus import proto as bp
from chorus.certifier import OK, CertificationIndex, Verdict
from chorus.link import position as link_position
from chorus.membership import Membership
from chorus.outcomes import Outcome, OutcomeIndex

log = logging.getLogger("chorus.replicator")

CONFLICT_HISTORY = 1000  # certification failures kept (chorus.conflicts)


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


def unstable_entry(node: str, gid: int, a: Action, version: int = bp.VERSION) -> tuple[int, int, str, bytes]:
    """A held writeset as a GID answer carries it: (GID, the GID before it, origin, writeset);
    ``node`` is the answering node, the origin of its local ones; a link writeset travels as its
    message (its origin says so), written at bus protocol ``version`` (the answer's); from version
    5 a writeset with a commit time travels as its message too (``WritesetMsg``, ticket 0), so the
    joiner stamps it as the others did (a writeset itself begins with ``wire.MAGIC``, a message
    with its version)."""
    if isinstance(a, LocalVerdict):
        assert a.writeset is not None
        origin, raw = node, a.writeset.raw or wire.encode(a.writeset)
    else:
        assert isinstance(a, Apply)
        if a.link is not None:
            return gid, a.prev, a.origin, bp.encode(a.link, version)
        origin, raw = a.origin, a.writeset.raw or wire.encode(a.writeset)
    if a.commit_time and version >= bp.TIMED and isinstance(raw, bytes):
        return gid, a.prev, origin, bp.encode(bp.WritesetMsg(origin, 0, raw, a.commit_time), version)
    return gid, a.prev, origin, raw


# A schema change's report round: opened by the control plane for schema changes that every node
# must apply before any commits them (Replicator._open_round); False when nobody else is there.
OpenRound = Callable[[int, str], bool]


class LocalWritesets:
    """The local writesets the backends scanned, by ticket, until they are delivered back: the
    order core's, in both implementations (the C one keeps them beside its Python objects)."""

    node: str
    _local_scanned: dict[int, wire.Writeset]
    lost_own_gid: int = 0  # (OrderCore.__init__ says what it is)

    def expect_local(self, ticket: int, writeset: wire.Writeset) -> None:
        """A local backend's writeset, scanned, goes to the bus with ``ticket``: when it is
        delivered back it is not parsed again."""
        self._local_scanned[ticket] = writeset

    def forget_local(self, ticket: int) -> None:
        """The writeset of ``ticket`` never reached the bus."""
        self._local_scanned.pop(ticket, None)

    def lost_own(self, gid: int) -> None:
        """GID ``gid`` may be a writeset of this node that none of its sessions commits: it is
        applied from its writeset, if the cluster certified it (``lost_own_gid``)."""
        self.lost_own_gid = max(self.lost_own_gid, gid)

    def stale_local(self, last_seen: int) -> Optional[str]:
        """Why a local writeset whose snapshot saw GID ``last_seen`` must not be ordered, or None.
        It did not see a writeset of this node that its session did not commit (``lost_own_gid``):
        it may have read and changed that writeset's rows as they were before it, after its
        session released their row locks uncommitted. Certification would not catch it (it does
        not compare writesets of one node), so the origin refuses it here, before any node sees
        it: a serialization failure, which a retry, with a newer snapshot, does not meet."""
        if last_seen >= self.lost_own_gid:
            return None
        return (f"could not serialize access: GID {self.lost_own_gid}, a transaction of this node whose "
                f"session did not commit it, is applied from its writeset; this transaction did not see it "
                f"(it saw GID {last_seen}) and may have changed its rows as they were before it: retry it")

    def local_in_flight(self) -> list[wire.Writeset]:
        """This node's writesets sent for ordering and not delivered back yet."""
        return list(self._local_scanned.values())

    def refuse_own(self, msg: bp.Message) -> list[Action]:
        """This node's writesets in ``msg``, delivered where it was not a member: refused."""
        own = [msg] if isinstance(msg, bp.WritesetMsg) else (
            msg.messages() if isinstance(msg, bp.WritesetBatch) else [])
        mine = [m for m in own if m.origin == self.node]
        for m in mine:
            self._local_scanned.pop(m.ticket, None)
        return [LocalVerdict(m.ticket, False, 0, 0, "this node is not online", None) for m in mine]


class OrderCore(LocalWritesets):
    def __init__(self, node: str, membership: Membership, certifier: CertificationIndex, open_round: OpenRound,
                 clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.membership = membership  # read only: the members online and where each joined
        self.open_round = open_round
        self.clock = clock  # the time a conflict is recorded with
        # what the control plane decided (it sets these as it decides them)
        self.following = False  # the node follows the total order (online, or recovering)
        self.quorate = False
        self.local_member = ""
        self.votes = Votes()
        self.gid = 0  # the last GID given
        self.last_certified = 0
        self.released = 0  # the last GID released
        self.certifier = certifier
        self.ddl_open: dict[int, str] = {}  # schema change GID -> origin node
        # Writesets delivered while a schema change's outcome is open: certified once it is known
        # (its content's keys recorded first), in GID order. Every node defers alike.
        self._deferred: list[tuple[int, bp.WritesetMsg | bp.LinkWriteset, wire.Writeset]] = []
        # local writesets the coordinator scanned (validated) when the backend sent them, by ticket
        self._local_scanned: dict[int, wire.Writeset] = {}
        self.stats = Stats()
        # the last certification failures, oldest first (chorus.conflicts; every node keeps the same
        # ones, but the time each saw them)
        self.conflicts: deque[Conflict] = deque(maxlen=CONFLICT_HISTORY)
        # the outcome of each writeset certified here, for chorus.commit_outcome (outcomes.py)
        self.outcomes = OutcomeIndex()
        # Uniform commit. Corosync delivers in agreed order, not uniformly: a node may deliver a
        # message that no other node receives before a partition cuts it off. So a certified
        # writeset is released (to be committed, logged, or answered to its backend) only once bus
        # nodes with a quorum of votes have delivered it; any later primary component then holds
        # it. A node alone on its bus node (the local cluster: quorum 1) releases at once.
        self.received: dict[str, int] = {}  # bus node -> GID it reported delivered
        self._unstable: list[tuple[int, Action]] = []  # certified, not yet released
        self._reported = 0
        self._report_on_bus = False
        self._report_last_tick = -1  # the report that was on the bus at the previous tick
        # Live writesets after a catch-up's range are held by the coordinator until the range is
        # applied; released ones are admitted (and so will be held by the database) only after that.
        self.catching_up = False
        self.will_hold = 0  # the last GID released to be admitted when the node left the primary component
        # The newest GID of a writeset of this node, certified by the cluster, that no session of
        # this node commits: the node left the primary component while it was held (its session
        # heard "unknown" and released its row locks uncommitted) or its coordinator ended, and
        # the GID answer or the catch-up range that brings the node back holds it (:meth:`lost_own`,
        # Replicator._joined). It is applied from its writeset. A local transaction whose snapshot
        # did not see it may have changed its rows as they were before it, and certification does
        # not compare writesets of one node (their sessions' row locks order them): such a
        # transaction is refused before it is ordered (:meth:`stale_local`). Only ever raised, to
        # GIDs the node will commit, so its watermark passes it.
        self.lost_own_gid = 0

    # ---- the total order -----------------------------------------------------------------------

    def _next_gid(self) -> int:
        """The next GID, for a writeset every node takes at this place."""
        self.gid += 1
        self.stats.delivered += 1
        self.outcomes.seen(self.gid)
        return self.gid

    def _defer_or_certify(self, gid: int, msg: "bp.WritesetMsg | bp.LinkWriteset", ws: wire.Writeset) -> list[Action]:
        if self.ddl_open or self._deferred:
            # A schema change before it has not reported its outcome: what it touched is not
            # known yet, so nothing after it can be certified yet (it could not commit before the
            # schema change anyway).
            self._deferred.append((gid, msg, ws))
            return []
        return self._certify(gid, msg, ws)

    def writeset(self, msg: bp.WritesetMsg) -> list[Action]:
        """A writeset delivered in total order: its GID, then certified (or deferred)."""
        local = msg.origin == self.node
        # A writeset counts only if its origin is online at its position in the total order,
        # a fact every node agrees on. A node cut off and back (frozen, say) may send one before
        # it learns it was out: the others drop it exactly as the origin refuses it.
        if not self.following or not self.quorate or msg.origin not in self.membership.online:
            if local:
                self._local_scanned.pop(msg.ticket, None)
                return [LocalVerdict(msg.ticket, False, 0, 0, "this node left the primary component", None)]
            return []
        gid = self._next_gid()
        try:
            cached = self._local_scanned.pop(msg.ticket, None) if local else None
            ws = cached if cached is not None else wire.scan(msg.writeset)
        except wire.WireError as e:
            self.stats.malformed += 1
            self.stats.cert_failures += 1
            return [LocalVerdict(msg.ticket, False, gid, 0, f"malformed writeset: {e}", None)] if local else []
        return self._defer_or_certify(gid, msg, ws)

    def link_writeset(self, msg: bp.LinkWriteset) -> list[Action]:
        """A transaction of a peer site, sent on by this site's receiver of ``msg.link``
        (docs/LINKS.md section 3): it takes a GID like any writeset, if its sender is a member
        at this place; malformed, or a schema change's ordering request or a concurrent index
        change (a link carries a schema change as its content, applied at its GID: docs/LINKS.md
        section 8.1), it fails here as everywhere, and its receiver, which waits for it, sends it
        again from the link's durable position."""
        if not self.following or not self.quorate or msg.node not in self.membership.online:
            return []
        gid = self._next_gid()
        try:
            ws = wire.scan(msg.writeset)
            if ws.toi or ws.concurrent:
                raise wire.WireError("a link writeset carries no ordering request or concurrent index change")
        except wire.WireError as e:
            log.warning("link writeset of link %s (peer GID %d) from %s refused: %s", msg.link, msg.peer_gid,
                        msg.node, e)
            self.stats.malformed += 1
            self.stats.cert_failures += 1
            return []
        return self._defer_or_certify(gid, msg, ws)

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
        settle = not ws.toi and ws.has_schema and not ws.concurrent and self.open_round(gid, msg.origin)
        if local:
            self.stats.local_certified += 1
            return self._hold(gid, LocalVerdict(msg.ticket, True, gid, prev, "", ws, settle=settle,
                                                commit_time=msg.commit_time))
        self.stats.remote_certified += 1
        return self._hold(gid, Apply(gid, prev, msg.origin, ws, settle=settle, commit_time=msg.commit_time))

    def ddl_settled(self, gid: int, ok: bool, error: str, content: Optional[wire.Writeset] = None) -> list[Action]:
        """Schema change ``gid``'s outcome is known: record what it touched (if it ran), then
        certify the writesets deferred behind it, up to the next open schema change."""
        origin = self.ddl_open.pop(gid)
        settle = False
        if ok and content is not None:
            self.certifier.record(gid, origin, content.keys)
            settle = self.open_round(gid, origin)
        out: list[Action] = [DdlOutcome(gid, ok, error, content if ok else None, settle)]
        while self._deferred and not self.ddl_open:
            g, m, ws = self._deferred.pop(0)
            out += self._certify(g, m, ws)
        return out

    @property
    def deferred_count(self) -> int:
        """Writesets waiting for a schema change's outcome before they are certified."""
        return len(self._deferred)

    def purge(self, low: int, history: int) -> None:
        """Every member committed up to ``low``: keep ``history`` GIDs of certification below it."""
        self.certifier.purge(low - history)

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
        return self.release()

    def release(self) -> list[Action]:
        """Report what this node delivered (once per report on the bus), and release the held
        writesets a quorum is now known to have."""
        out: list[Action] = []
        if self.votes.quorum > 1 and self.following and not self._report_on_bus and self.gid > self._reported:
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

    def received_report(self, sender: str, msg: bp.Received, in_view: bool) -> list[Action]:
        """A bus node's report of what it delivered (``in_view``: its sender is in the view)."""
        if msg.node == self.node and sender == self.local_member:
            self._report_on_bus = False
        if in_view:
            node = bus_node(sender)
            self.received[node] = max(self.received.get(node, 0), msg.gid)
        return self.release() if self.following else []

    def tick(self) -> list[Action]:
        """The timer, while following: a report on the bus since the last tick at least may have
        failed to send (a view change resets this too); report again. Duplicates are harmless:
        reports only raise a maximum."""
        if self._report_on_bus and self._reported == self._report_last_tick:
            self._report_on_bus, self._reported = False, 0
        self._report_last_tick = self._reported if self._report_on_bus else -1
        return self.release()

    def view_changed(self, votes: Votes) -> None:
        """A new view: its votes; reports count within one view (every following node reports
        afresh)."""
        self.votes = votes
        self.received.clear()
        self._reported, self._report_on_bus = 0, False

    # ---- the control plane's primitives -----------------------------------------------------

    def install(self, gid: int, certified: int, released: int, unstable: list[tuple[int, Action]],
                certifier: CertificationIndex) -> None:
        """The node joins (or bootstraps) the primary component at ``gid``, with what was
        certified and released there, the certified writesets not yet released, and the
        certification index there."""
        self.gid = gid
        self.last_certified = certified
        self.released = released
        self._unstable = unstable
        self._deferred.clear()
        self.ddl_open.clear()
        self.certifier = certifier

    def unstable_entries(self, version: int = bp.VERSION) -> tuple[tuple[int, int, str, bytes], ...]:
        """The held writesets as a GID answer at bus protocol ``version`` carries them
        (:func:`unstable_entry`)."""
        return tuple(unstable_entry(self.node, gid, a, version) for gid, a in self._unstable)

    def leave(self) -> list[Action]:
        """The node leaves the primary component. Writesets not yet known to a quorum: the
        primary component may or may not have them. None commits here; the node learns their
        fate when it rejoins (partial recovery brings those the primary has). Their clients hear
        that the outcome is unknown."""
        # what it released and admits (all of it, unless a catch-up holds the live stream) will
        # commit here: its requests announce at least that
        self.will_hold = self.released if not self.catching_up else 0
        self.catching_up = False
        out: list[Action] = []
        held, self._unstable = self._unstable, []
        held += [(gid, LocalVerdict(m.ticket, True, gid, 0, "", ws)) for gid, m, ws in self._deferred
                 if isinstance(m, bp.WritesetMsg) and m.origin == self.node]
        self._deferred.clear()
        self.ddl_open.clear()
        for gid, a in held:
            if isinstance(a, LocalVerdict):
                # its session ends uncommitted and releases its row locks; if the primary
                # component has it, the node learns so when it rejoins (Replicator._joined: the
                # answer's unstable writesets, or the catch-up range), and applies it. Not counted
                # here: the node takes no writes until then, and a GID the primary component
                # never had would hold this node's writes back until the cluster passes it.
                self._local_scanned.pop(a.ticket, None)
                out.append(LocalVerdict(a.ticket, False, gid, 0,
                                        f"this node left the primary component before GID {gid} was known to a "
                                        "quorum of nodes: whether it committed will be known when the node rejoins",
                                        None, unknown=True))
        self.gid = self.last_certified = self.released
        return out
