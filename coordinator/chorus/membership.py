"""Membership of the primary component and the join handshake (seed 8.1, 8.2, 8.4;
docs/MEMBERSHIP.md, docs/RECOVERY.md), without I/O.

What it keeps: which nodes are members of the primary component (``online``, by bus member) and
which of them are synced (the others catch up), what each reported committing (``progress``),
what the node remembers of the history (its epochs and a record per member: history.py, the
state file), this node's latest GID request, the GID requests delivered in this view, and the
re-form of a primary component that no member has (history.decide).

What it decides: whether a view is quorate and whether this node was cut off, what a GID request
says, the answer the lowest synced member gives, whether an answer counts, whether this node may
take the answer to its own request, who re-forms. The replicator (replicator.py) is the one entry
point for bus events: it asks this part, changes its phase and its total order's state, and
returns the actions. Random request ids and cluster UUIDs come in from the replicator.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

from chorus import confchange, history
from chorus.actions import Remember
from chorus.bus import View, Votes, bus_node
from chorus.bus import proto as bp
from chorus.bus import versions
from chorus.confchange import ClusterConfig
from chorus.history import Decision, Epoch, MemberRecord

log = logging.getLogger("chorus.replicator")


@dataclass(frozen=True)
class Holding:
    """What this node's disk holds, for a GID request (the coordinator's ``holding``): the GID its
    database holds or will once what it admitted commits, and its writeset log's range."""
    gid: int
    log_after: int = 0
    log_high: int = 0


@dataclass(frozen=True)
class Place:
    """The total order at a GID request's place, as the answering node holds it: what its answer
    carries besides the members."""
    cluster_uuid: str
    gid: int  # the GID counter there
    certified: int  # the last certified GID
    released: int  # the last GID released (uniform commit)
    certifier: bytes  # the certification index (Certifier.snapshot)
    paused: tuple[str, ...]  # the nodes holding flow control
    compat: str  # the answering node's database encoding and PostgreSQL major version
    # the writesets certified and not released yet: (GID, the GID before it, origin, writeset)
    unstable: tuple[tuple[int, int, str, bytes], ...]


def view_quorum(view: View, previous: set[str], member_votes: int) -> tuple[bool, bool]:
    """Whether ``view`` is quorate, and whether this node was cut off: the members that come with
    it from its ``previous`` view are not a quorum, so the others may have gone on without it,
    even when the merged view is quorate again (it must leave and rejoin). ``member_votes``:
    coordinators sharing one bus node count, not bus nodes (0: one vote per bus node)."""
    nodes = {bus_node(m) for m in view.members}
    if member_votes:
        quorate = 2 * len(view.members) > member_votes
    elif view.expected:
        # The configured votes are known: decide from the view alone. Every member delivers
        # it at the same place in the total order, so all decide alike; votequorum's flag is
        # read asynchronously and can differ between nodes for a moment (a node that left
        # on a lagging flag while the others stayed was seen to stall the group).
        quorate = view.votes.holds(nodes)
    else:
        quorate = view.quorate and view.votes.holds(nodes)
    carried = {bus_node(m) for m in view.members if m in previous and m not in view.joined}
    cut_off = bool(previous) and not view.votes.holds(carried)
    if member_votes:
        came = [m for m in view.members if m in previous and m not in view.joined]
        cut_off = bool(previous) and 2 * len(came) <= member_votes
    return quorate, cut_off


@dataclass
class Membership:
    node: str
    # What the node knows of the history (history.py; its state file): the epochs it followed
    # and, for each node it was in the primary component with, whether it was a member or left.
    epochs: tuple[Epoch, ...] = ()
    records: dict[str, MemberRecord] = field(default_factory=dict)
    online: dict[str, str] = field(default_factory=dict)  # node name -> bus member id
    # The members of the primary component (``online``) that are synced: the others are catching
    # up. A quorate view whose members include none has no primary component (it re-forms).
    synced: set[str] = field(default_factory=set)
    progress: dict[str, int] = field(default_factory=dict)  # member -> the GID it reported committed
    reform: Optional[Decision] = None  # the last re-form decision that named no winner (status)
    # this node's latest GID request
    request_id: str = ""
    request_seen: bool = False  # delivered back: what follows it is buffered until the answer
    request_at: float = 0.0
    joining_since: float = 0.0
    # re-forming a primary component that no member has: the GID requests of this view
    requests: dict[str, bp.GidRequest] = field(default_factory=dict)  # bus member -> its latest request
    # every node's latest GID request (request id, bus member): an answer to an earlier one is
    # stale (the node asked again meanwhile), and every node ignores it alike
    latest_request: dict[str, tuple[str, str]] = field(default_factory=dict)
    # A node that asked to join at GID g never delivered the GIDs up to g: until it is online
    # (caught up, it sends Progress) its reports vouch only for GIDs after g.
    # (the answer to its request says from which GID: the answering node gives it the writesets
    # it has not released yet, so it delivered every GID after the answerer's ``released``)
    joined_at: dict[str, int] = field(default_factory=dict)  # bus node -> GID it vouches after
    reform_sent: bool = False
    reform_at: float = 0.0
    # Bus protocol versions (bus/versions.py): what this node speaks, what each member of the
    # primary component speaks, and the cluster version (0: not in a primary component).
    own: bp.RangeT = bp.SPEAKS
    speaks: dict[str, bp.RangeT] = field(default_factory=dict)
    version: int = 0
    opening: int = 0  # the version a bootstrap this node sent opens at

    def spoke(self, name: str, speaks: bp.RangeT) -> None:
        """Member ``name`` says which versions it speaks (a Speaks message)."""
        self.speaks[name] = speaks
        self._versions_changed()

    def _versions_changed(self) -> None:
        """The members changed: the cluster version may move up (bus/versions.py)."""
        if not self.version:
            return
        v = versions.moved(self.version, {n: self.speaks.get(n, bp.LEGACY) for n in self.online})
        if v != self.version:
            log.warning("the cluster's bus protocol version moves from %d to %d (members: %s)", self.version, v,
                        versions.describe({n: self.speaks.get(n, bp.LEGACY) for n in self.online}))
            self.version = v
    # The configured nodes from the first `chorus node add`/`remove` on (confchange.py; None:
    # each node's own configuration). It changes at a Configure in the total order, or with a
    # newer one a GID request or its answer carries (a node that missed the change).
    config: Optional[ClusterConfig] = None
    # Whether the configured set keeps its nodes' Corosync ids (False in a local cluster, where
    # every coordinator runs on one Corosync node and votes count coordinators)
    keeps_ids: bool = True

    def adopt(self, version: int, nodes: tuple[str, ...], tie: str, ids: tuple[tuple[str, str], ...] = ()) -> bool:
        """A configured set a message of the order carries: taken if newer than this node's (of
        the same version, the ids it knows that this node's does not). Returns whether it was."""
        got = confchange.newer(self.config, ClusterConfig.from_fields(version, nodes, tie,
                                                                      ids if self.keeps_ids else ()))
        if got is self.config:
            return False
        self.config = got
        return True

    def learn(self, name: str, member: str) -> bool:
        """Configured node ``name`` runs on ``member``'s bus node (a message it sent, or its member
        id in an answer): the set keeps that id if it did not know it (confchange.learned). Every
        node that delivers the message learns alike. Returns whether it was learned."""
        got = confchange.learned(self.config, name, bus_node(member)) if self.keeps_ids else None
        if got is None:
            return False
        log.warning("node %s's Corosync node id is %s (learned)", name, bus_node(member))
        self.config = got
        return True

    def configured(self, name: str) -> bool:
        """Whether ``name`` is one of the configured nodes (any node, before the first change)."""
        return self.config is None or name in self.config.nodes

    def misplaced(self, name: str, member: str) -> Optional[str]:
        """Why configured node ``name`` may not be a member from bus member ``member``: the set knows
        another Corosync node id for it (None: it may)."""
        if self.config is None or not self.keeps_ids or name not in self.config.nodes:
            return None
        known = self.config.id_of(name)
        if known == bus_node(member):
            return None
        return (f"node {name} runs on Corosync node {bus_node(member)}, but cluster's configured set gives it "
                + (f"Corosync node id {known}" if known else "none (another node has that id)")
                + ": give each node the Corosync node id its `chorus node add` wrote to corosync.conf")

    def _config_fields(self) -> tuple[int, tuple[str, ...], str, tuple[tuple[str, str], ...]]:
        return self.config.as_fields() if self.config is not None else (0, (), "", ())

    # ---- what the node remembers --------------------------------------------------------

    @property
    def epoch_number(self) -> int:
        return self.epochs[-1].number if self.epochs else 0

    def remember(self) -> Remember:
        return Remember(self.epochs, tuple(sorted(self.records.items())))

    def record_left(self, name: str, gid: int) -> None:
        """``name`` left the primary component at GID ``gid`` (in this epoch)."""
        self.records[name] = MemberRecord(self.epoch_number, gid, False)

    # ---- views and members ----------------------------------------------------------------

    def view_changed(self, members: tuple[str, ...]) -> None:
        """A new view: GID requests count within one view; the latest ones of members that left
        it are forgotten."""
        self.requests.clear()
        self.reform_sent = False
        for name, (rid, member) in list(self.latest_request.items()):
            if member not in members:
                del self.latest_request[name]

    def forget(self, names: list[str], at_gid: Optional[int]) -> bool:
        """Nodes that are no longer members of the primary component; ``at_gid``: this node stays
        in it and remembers that they left at this GID. Returns whether a record changed."""
        recorded = False
        for name in names:
            self.online.pop(name, None)
            self.progress.pop(name, None)
            self.synced.discard(name)
            self.speaks.pop(name, None)
            if at_gid is not None and name != self.node:
                self.records[name] = MemberRecord(self.epoch_number, at_gid, False)
                recorded = True
        self._versions_changed()
        return recorded

    def leave(self) -> None:
        """This node left the primary component: it knows no members."""
        self.online.clear()
        self.synced.clear()
        self.progress.clear()
        self.speaks.clear()
        self.version = 0

    @property
    def has_synced_member(self) -> bool:
        return bool(self.synced & set(self.online))

    def progressed(self, sender: str, msg: bp.Progress) -> bool:
        """A member reports what it committed (``sender``: its bus member). Returns whether it is
        synced from here: a recovering member that caught up, for every node."""
        if msg.node != self.node:
            self.joined_at.pop(bus_node(sender), None)  # online: it holds everything up to its GID
        if msg.node not in self.online:
            return False
        now_synced = msg.node not in self.synced and self.online[msg.node] == sender
        if now_synced:
            self.synced.add(msg.node)
        self.progress[msg.node] = max(self.progress.get(msg.node, 0), msg.committed_gid)
        return now_synced

    def committed_by_all(self) -> Optional[int]:
        """The GID every member reported committing, once every member has reported."""
        if all(n in self.progress for n in self.online):
            return min(self.progress[n] for n in self.online)
        return None

    # ---- this node's GID requests ---------------------------------------------------------

    def request(self, request_id: str, cluster_uuid: str, h: Holding, join: bool, now: float) -> bp.GidRequest:
        """This node asks to join (or, with ``join`` false, only takes part in a re-form), saying
        what it holds (``h``), its epochs and its records. The request id carries the versions it
        speaks (bus/proto.py): every node, of whatever release, then reads, keeps and echoes the
        same id."""
        if self.own != bp.LEGACY:
            request_id = f"{request_id}~v{self.own[0]}-{self.own[1]}"
        self.request_id, self.request_seen, self.request_at = request_id, False, now
        return bp.GidRequest(
            self.node, request_id, cluster_uuid, h.gid, join,
            tuple((e.number, e.start, e.node) for e in self.epochs), h.log_after, h.log_high,
            tuple((n, r.epoch, r.gid, r.member) for n, r in sorted(self.records.items())), self.own,
            *self._config_fields())

    def _opens(self) -> None:
        """Decide the bus protocol version a cluster this node starts opens at (kept until its
        Bootstrap comes back, by when the requests are forgotten): the highest every node that
        asked in this view speaks, this one too (so the nodes of an older release among them can
        join it); the highest it speaks if nothing is common."""
        common = versions.agreed([self.own] + [r.speaks for r in self.requests.values()])
        self.opening = common if common is not None else self.own[1]

    def bootstrap_message(self, cluster_uuid: str, gid: int) -> bp.Bootstrap:
        """``chorus bootstrap``: start the cluster (again) at GID ``gid``, in a new epoch."""
        self._opens()
        return bp.Bootstrap(self.node, cluster_uuid, gid, self.epoch_number + 1)

    def refusal(self, msg: bp.GidReply, cluster_uuid: str, compat: str) -> Optional[str]:
        """Why this node cannot take the answer to its request: it does not speak the cluster's
        bus protocol version, its database reads values differently, or it belongs to another
        cluster (None: it can, as far as these go)."""
        why = versions.refusal(self.node, self.own, msg.version,
                               {n: (lo, hi) for n, lo, hi in msg.speaks if n != self.node})
        if why is not None:
            return why
        if compat and msg.compat and compat != msg.compat:
            return (f"this node's database ({compat}) differs from the cluster's ({msg.compat}): "
                    "its values would be read differently; create its database with the cluster's "
                    "encoding, on the same PostgreSQL major version, then join it by total recovery")
        if cluster_uuid and cluster_uuid != msg.cluster_uuid:
            return (f"this node belongs to cluster {cluster_uuid}, the group runs "
                    f"cluster {msg.cluster_uuid}: total recovery is needed")
        return self.unconfigured(msg) or self.misplaced_refusal(msg)

    def unconfigured(self, msg: bp.GidReply) -> Optional[str]:
        """Why the cluster does not admit this node: it is not one of its configured nodes (it was
        removed, or not added yet). None: it is."""
        if msg.config_version and self.node not in msg.config_nodes:
            return (f"this node is not one of cluster {msg.cluster_uuid}'s configured nodes "
                    f"({', '.join(msg.config_nodes)}, configuration version {msg.config_version}): it was "
                    "removed, or was not added yet; `chorus node add` it first")
        return None

    def misplaced_refusal(self, msg: bp.GidReply) -> Optional[str]:
        """Why the cluster does not admit this node although it is configured: it runs on another
        Corosync node than the configured set gives it (None: it does not)."""
        if not msg.config_version or self.node not in msg.config_nodes or not self.keeps_ids:
            return None
        known = dict(msg.config_ids).get(self.node, "")
        if known == bus_node(msg.member):
            return None
        return (f"this node runs on Corosync node {bus_node(msg.member)}, but cluster {msg.cluster_uuid}'s "
                f"configured set gives it " + (f"Corosync node id {known}" if known else "none")
                + ": only a configured node's own Corosync node counts toward quorum; run it there, or remove "
                "and add it again with its Corosync node id")

    def history_refusal(self, msg: bp.GidReply, holds: int) -> Optional[str]:
        """Why this node, holding up to GID ``holds``, cannot follow the history the answer
        describes (None: it can)."""
        problem = history.prefix_problem(self.node, holds, self.epochs, tuple(Epoch(*e) for e in msg.epochs),
                                         msg.certified)
        if problem is None:
            return None
        return (f"this node's data is not a prefix of cluster {msg.cluster_uuid}'s history: {problem}. It stays out "
                "and keeps them. If they must be kept, stop the cluster and restart it from this node (chorus "
                "bootstrap --force); to drop them, rebuild this node (chorus node join --total --force)")

    def joined(self, msg: bp.GidReply) -> None:
        """The members as the answer to this node's request says they were at the request's
        place: this node is not a member there (the answer admits it at its own place, further
        on); what was delivered in between is replayed from there. Its own writesets among it,
        which the members dropped, must not count here either (a lab run diverged so: a node
        thawed from a freeze sent writesets after its request, counted them here, and gave every
        later GID to another writeset than the others did)."""
        self.online = {n: m for n, m in msg.online if n != self.node}
        self.speaks = {n: (lo, hi) for n, lo, hi in msg.speaks if n in self.online}
        self.version = msg.version
        self.synced = set(msg.synced) - {self.node}
        self.latest_request = {n: (rid, m) for n, rid, m in msg.requests}
        self.progress = dict(msg.progress)
        self.epochs = tuple(Epoch(*e) for e in msg.epochs) or self.epochs
        self.records = history.merge(self.records, {n: MemberRecord(e, g, m) for n, e, g, m in msg.records})
        self.records[self.node] = MemberRecord(self.epoch_number, msg.gid, True)
        self.reform = None
        self.adopt(msg.config_version, msg.config_nodes, msg.config_tie, msg.config_ids)
        for n, member in msg.online:
            self.learn(n, member)

    def bootstrapped(self, sender: str, msg: bp.Bootstrap) -> None:
        """This node's bootstrap came back (``sender``: its bus member): it alone is the primary
        component, in a new epoch."""
        self.online = {self.node: sender}
        self.speaks = {self.node: self.own}
        self.version = self.opening or self.own[1]
        self.synced = {self.node}
        self.progress = {self.node: msg.gid}
        self.epochs = history.add_epoch(self.epochs, Epoch(msg.epoch, msg.gid, self.node))
        self.records[self.node] = MemberRecord(msg.epoch, msg.gid, True)
        self.reform = None
        self.learn(self.node, sender)

    # ---- other nodes' GID requests --------------------------------------------------------

    def requested(self, sender: str, msg: bp.GidRequest) -> None:
        """A member of this view asked (every node keeps this view's requests, whatever its
        phase: they decide a re-form)."""
        self.requests[sender] = msg
        self.latest(sender, msg)
        self.adopt(msg.config_version, msg.config_nodes, msg.config_tie, msg.config_ids)
        self.learn(msg.node, sender)

    def latest(self, sender: str, msg: bp.GidRequest) -> None:
        self.latest_request[msg.node] = (msg.request_id, sender)

    def forget_requests(self) -> None:
        """A primary component exists from here: the requests before it are answered by it."""
        self.requests.clear()

    def asked(self, sender: str, msg: bp.GidRequest, gid: int) -> None:
        """A node asks at GID ``gid`` of the order (in the primary component): if it asks to
        join, its reports vouch only for what comes after."""
        if msg.node != self.node and msg.join:
            self.joined_at[bus_node(sender)] = gid

    @property
    def answers(self) -> bool:
        """This node answers GID requests: it is the lowest synced member."""
        return bool(self.synced) and min(self.synced) == self.node

    def answer(self, sender: str, msg: bp.GidRequest, place: Place) -> bp.GidReply:
        """The answer to ``msg`` (from bus member ``sender``) at ``place``: the state there, the
        requester admitted unless its data cannot follow this history (it refuses the answer
        alike), synced if it holds every GID released there."""
        online, synced = dict(self.online), set(self.synced)
        records = dict(self.records)
        speaks = {n: self.speaks.get(n, bp.LEGACY) for n in online}
        compat = place.compat
        why = versions.refusal(msg.node, msg.speaks, self.version, speaks) if self.version else None
        if why is not None:
            # not admitted, for every node (Membership.answered); a node of a release before
            # version 4 reads no version in the answer, but refuses one whose ``compat`` differs
            log.warning("%s", why)
            compat = f"{compat} (bus protocol: {why})"
        elif msg.cluster_uuid in ("", place.cluster_uuid) and self.configured(msg.node) and \
                self.misplaced(msg.node, sender) is None and history.prefix_problem(
                msg.node, msg.last_gid, tuple(Epoch(*e) for e in msg.epochs), self.epochs,
                place.certified) is None:
            online[msg.node] = sender
            speaks[msg.node] = msg.speaks
            records[msg.node] = MemberRecord(self.epoch_number, place.gid, True)
            if place.released <= msg.last_gid <= place.certified:
                synced.add(msg.node)
        return bp.GidReply(
            msg.node, msg.request_id, sender, place.cluster_uuid, place.gid, place.certified,
            tuple(sorted(online.items())), tuple(sorted(self.progress.items())),
            place.certifier, place.paused, compat, tuple(sorted(synced)),
            tuple((e.number, e.start, e.node) for e in self.epochs),
            tuple((n, r.epoch, r.gid, r.member) for n, r in sorted(records.items())),
            place.released, place.unstable,
            tuple((n, rid, m) for n, (rid, m) in sorted(self.latest_request.items())),
            self.version, tuple((n, lo, hi) for n, (lo, hi) in sorted(speaks.items())),
            *self._config_fields())

    def version_refusal(self, msg: bp.GidReply) -> Optional[str]:
        """Why the node an answer admits cannot be admitted here after all: the answer was made at
        its request's place, and the cluster version moved up since (another member was admitted
        or left in between) to one it does not speak. Every node decides so alike (None: it
        can). An answer of a release before version 4 says nothing of versions: its cluster
        runs at 3, which every node speaks."""
        if not msg.speaks or not self.version:
            return None
        speaks = next(((lo, hi) for n, lo, hi in msg.speaks if n == msg.node), bp.LEGACY)
        return versions.refusal(msg.node, speaks, self.version,
                                {n: self.speaks.get(n, bp.LEGACY) for n in self.online if n != msg.node})

    def answered(self, msg: bp.GidReply, members: tuple[str, ...], cluster_uuid: str, gid: int) -> bool:
        """A member answered a GID request: the joiner is a member from here (synced, or catching
        up), as the answer says, for every node. False if the answer does not count: another
        cluster's, from a later place, to a requester no longer in the view, to a request it made
        again since, or counting it out (its data cannot follow this history)."""
        if msg.cluster_uuid != cluster_uuid or msg.gid > gid or msg.member not in members:
            return False
        if self.latest_request.get(msg.node, ("", ""))[0] != msg.request_id:
            return False
        if dict(msg.online).get(msg.node) != msg.member:
            return False
        if self.version_refusal(msg) is not None:
            return False
        self.online[msg.node] = msg.member
        if msg.speaks:
            self.speaks[msg.node] = next(((lo, hi) for n, lo, hi in msg.speaks if n == msg.node), bp.LEGACY)
        else:
            # a node of a release before version 4 answered: it says nothing of versions, so
            # every node forgets what the members speak here and learns it again from their
            # Speaks messages (the joiner could not know what the others knew)
            self.speaks.clear()
        self._versions_changed()
        self.progress[msg.node] = msg.gid
        if msg.node in msg.synced:
            self.synced.add(msg.node)
        # it delivered everything after what the answering node had released (the rest came
        # with the answer): its reports vouch for those GIDs
        self.joined_at[bus_node(msg.member)] = msg.released
        self.requests.pop(msg.member, None)
        self.records[msg.node] = MemberRecord(self.epoch_number, msg.gid, True)
        return True

    # ---- re-forming -------------------------------------------------------------------------

    def reform_decision(self, quorate: bool, members: tuple[str, ...], votes: Votes, member_votes: int,
                        now: float) -> Optional[bp.Bootstrap]:
        """Re-form the primary component when no member has it: a quorate view in which every
        member has asked (none is in a primary component: a partition that left no quorate side
        healed, a majority restarted at once, or the last synced member left while the others
        caught up). Every node decides alike from the same requests (history.decide): the one
        that holds the most starts a new epoch at its GID once every node that may hold an
        acknowledged writeset the others lack is back; the others join it and catch up. Returns
        the Bootstrap this node sends if it is that one.

        Every acknowledged transaction committed on its origin before the client heard of it;
        the origin is here, or it left the primary component at a GID that the winner holds."""
        # One expected vote re-forms nothing (a lone node whose Corosync says expected_votes 1 may
        # be a misconfigured node of a larger cluster), unless the configured set, changed in the
        # total order, is this node alone: a cluster shrunk to one by `chorus node remove`.
        alone = self.config is not None and tuple(self.config.nodes) == (self.node,)
        if self.reform_sent or not quorate or (max(votes.expected, member_votes) < 2 and not alone):
            return None
        if set(self.requests) != set(members):
            return None
        # Only configured nodes count: a removed node's coordinator started again is in the view
        # until it is refused, and with no primary component nobody refuses it. (With one Corosync
        # for all, its coordinator would otherwise count as a vote.)
        counted = [m for m, r in self.requests.items() if self.configured(r.node) and self.misplaced(r.node, m) is None]
        if not (2 * len(counted) > member_votes if member_votes else votes.holds({bus_node(m) for m in counted})):
            return None
        # a node removed from the configured set is not waited for (confchange.py)
        cands = [history.Candidate(r.node, r.cluster_uuid, r.last_gid, tuple(Epoch(*e) for e in r.epochs),
                                   r.log_after, r.log_high,
                                   {n: MemberRecord(e, g, m) for n, e, g, m in r.records if self.configured(n)})
                 for m, r in self.requests.items() if self.configured(r.node) and self.misplaced(r.node, m) is None]
        if not cands:
            return None
        d = history.decide(cands)
        if d.winner is not None and not any(r.records for r in self.requests.values()):
            # nobody here remembers the members (state files from before records were kept): wait
            # for every configured node, as a missing one might hold the only copy of a commit
            nodes = {bus_node(m) for m in members}
            if (len(members) < member_votes if member_votes
                    else len(nodes) != len(members) or len(nodes) < votes.expected):
                d = Decision(None, cluster_uuid=d.cluster_uuid,
                             reason="no member is synced; re-forming waits for every configured node "
                                    "(no node here remembers the primary component's members)")
        if d.winner is None:
            if self.reform is None or self.reform.reason != d.reason:
                log.warning("%s", d.reason)
            self.reform = d
            return None
        self.reform = None
        if d.winner != self.node:
            return None
        assert d.epoch is not None
        self.reform_sent, self.reform_at = True, now
        self._opens()
        log.warning("%s", d.reason)
        return bp.Bootstrap(self.node, d.cluster_uuid, d.gid, d.epoch.number)
