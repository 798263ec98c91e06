"""Changing a running cluster's configured nodes (``chorus node add`` / ``chorus node remove``),
without I/O (docs/MEMBERSHIP.md, "Adding and removing nodes").

The *configured set* is the list of nodes whose votes make a quorum. Until the first change it is
what each node's configuration says (``bus.members`` for a local cluster, Corosync's votes
otherwise); from the first change on it is a :class:`ClusterConfig` that every node switches to at
the same place of the total order: the place where a ``Configure`` message (bus type ``C``) is
delivered. A node that was not there learns it from the answer to its GID request, and every GID
request says which one its sender holds (a re-form counts from the newest of them).

What this module decides: whether a change may be made (:func:`change_problem`), and what the votes
of a configured set are (:func:`member_votes`, :func:`votes`). ``corosync_conf`` rewrites
Corosync's node list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Mapping, Optional

from chorus.bus import Votes, bus_node

NAME = re.compile(r"[A-Za-z0-9_.-]{1,63}\Z")


@dataclass(frozen=True)
class ClusterConfig:
    """The configured nodes from a change on: ``version`` counts the changes (1 for the first),
    ``nodes`` are the node names (sorted), ``tie_breaker`` the bus node (Corosync node id) whose
    half wins an even split ("" when ties are not broken, and in a local cluster). ``ids``: each
    configured node's bus node (Corosync node id), (name, id) sorted by name, for the nodes whose id
    is known: only those ids count toward a view's quorum (:func:`votes`). A set recorded before ids
    were kept has none, and learns them in the total order (:func:`learned`)."""

    version: int
    nodes: tuple[str, ...]
    tie_breaker: str = ""
    ids: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(sorted(self.nodes)))
        object.__setattr__(self, "ids", tuple(sorted((n, i) for n, i in dict(self.ids).items()
                                                     if i and n in self.nodes)))

    def as_fields(self) -> tuple[int, tuple[str, ...], str, tuple[tuple[str, str], ...]]:
        return self.version, self.nodes, self.tie_breaker, self.ids

    @staticmethod
    def from_fields(version: int, nodes: tuple[str, ...], tie_breaker: str,
                    ids: tuple[tuple[str, str], ...] = ()) -> Optional["ClusterConfig"]:
        """The configured set a message carries (None: version 0, none)."""
        return ClusterConfig(version, nodes, tie_breaker, ids) if version > 0 else None

    def id_of(self, name: str) -> str:
        """Node ``name``'s bus node ("" when not known)."""
        return dict(self.ids).get(name, "")

    @property
    def voters(self) -> frozenset[str]:
        """The bus nodes whose presence in a view counts: the configured nodes' known ids."""
        return frozenset(i for _, i in self.ids)


def learned(config: Optional[ClusterConfig], name: str, bus_id: str) -> Optional[ClusterConfig]:
    """``config`` knowing that configured node ``name`` runs on bus node ``bus_id`` (its GID request,
    its Bootstrap or its member id came from there): the same set with the id, or None when nothing
    is learned (no set, ``name`` not configured, its id known already, or ``bus_id`` another
    configured node's). A node's id, once known, changes only with a new configuration version."""
    if config is None or not bus_id or name not in config.nodes or config.id_of(name) or bus_id in config.voters:
        return None
    return replace(config, ids=config.ids + ((name, bus_id),))


def merged_ids(a: ClusterConfig, b: ClusterConfig) -> ClusterConfig:
    """``a`` with the ids ``b`` (the same version) knows and ``a`` does not (an id another node of
    ``a`` holds is not taken)."""
    out = a
    for name, i in b.ids:
        out = learned(out, name, i) or out
    return out
def newer(a: Optional[ClusterConfig], b: Optional[ClusterConfig]) -> Optional[ClusterConfig]:
    """The later of two configured sets (a higher version; among equals ``a``, with the ids only
    ``b`` knows: :func:`merged_ids`)."""
    if a is not None and b is not None and a.version == b.version:
        m = merged_ids(a, b)
        return a if m == a else m
    if b is None or (a is not None and a.version >= b.version):
        return a
    return b


def member_votes(config: Optional[ClusterConfig], configured: int) -> int:
    """A local cluster's votes (coordinators sharing one Corosync, ``configured`` from its
    configuration): the configured set's size once there is one. 0 stays 0 (one vote per bus node)."""
    if configured <= 0:
        return 0
    return len(config.nodes) if config is not None else configured


def votes(config: Optional[ClusterConfig], from_bus: Votes, shared_bus: bool) -> Votes:
    """The votes a view counts against: Corosync's (``from_bus``) until the first change, then the
    configured set's, one per node, a strict majority or half with the tie breaker. Only the
    configured nodes' ids count (``Votes.voters``): a bus node in a view that is not one of them (a
    node left in corosync.conf by a failed `chorus node add`, its Corosync started anyway) counts
    zero, and so does a configured node whose id is not known yet (a set recorded before ids were
    kept: :func:`learned`). So two disjoint views never both count a majority. In a local
    cluster (``shared_bus``: one Corosync for all) the bus's own stay (one node, quorate alone:
    uniform commit releases at once there); :func:`member_votes` counts its coordinators."""
    if config is None or shared_bus:
        return from_bus
    n = len(config.nodes)
    return Votes(n // 2 + 1, n, config.tie_breaker, config.voters)


def with_ids(new: ClusterConfig, current: Optional[ClusterConfig], online: Mapping[str, str],
             shared_bus: bool) -> tuple[ClusterConfig, Optional[str]]:
    """The set ``new`` a Configure asks for, with every id known at its place: those it carries
    (the operator's corosync.conf: a node added is not online yet), the current set's for the nodes
    it keeps, the online members' own (``online``: name -> bus member id). Every member holds the
    same at that place, so all make the same set. Or why the change cannot be made: an id it
    carries is not the node's, or two nodes would have one id. In a local cluster (one Corosync
    for all) no ids are kept: votes count coordinators there."""
    if shared_bus:
        return replace(new, ids=()), None
    ids = dict(new.ids)
    known = dict(current.ids) if current is not None else {}
    for name in new.nodes:
        for source, i in (("in the configured set", known.get(name, "")),
                          ("its Corosync node, online", bus_node(online[name]) if name in online else "")):
            if not i:
                continue
            if ids.get(name, i) != i:
                return new, (f"it gives node {name} Corosync node id {ids[name]}, but its id is {i} ({source}): "
                             "correct corosync.conf's node list")
            ids[name] = i
    taken: dict[str, str] = {}
    for name, i in sorted(ids.items()):
        if i in taken:
            return new, f"nodes {taken[i]} and {name} would have one Corosync node id, {i}"
        taken[i] = name
    return replace(new, ids=tuple(ids.items())), None


def quorum_of(config: ClusterConfig, present: Mapping[str, str], shared_bus: bool) -> bool:
    """Whether the nodes ``present`` (name -> bus member id) hold a quorum of ``config``: in a
    local cluster a strict majority of its nodes, else of its bus nodes (the tie breaker's half
    of an even split too)."""
    here = [n for n in present if n in config.nodes]
    if shared_bus:
        return 2 * len(here) > len(config.nodes)
    # (named members: each is on its own id, with_ids and Membership.misplaced see to it)
    return replace(votes(config, Votes(), False), voters=None).holds({bus_node(present[n]) for n in here})


def change_problem(current: Optional[ClusterConfig], current_count: int, new: ClusterConfig,
                   online: Mapping[str, str], sender: str, shared_bus: bool) -> Optional[str]:
    """Why the change to ``new`` cannot be made at this place of the order (None: it can).
    ``current_count``: how many nodes are configured before the first change (the nodes' own
    configuration: a local cluster's ``bus.members``, Corosync's expected votes; 0 when not
    known); ``online``: the primary component's members (name -> bus member id); ``sender``: the
    node that asked, which must be one of them. (That it adds or removes what the operator meant
    is the CLI's check, against the set it read: the version says nothing came between.)

    Every node decides it from the same state at the same place, so all apply it or none does.

    A change adds or removes one node, and counts a strict majority (no tie breaker): then any
    quorum of the set before and any quorum of the set after share a node (two majorities of
    n and n + 1 nodes drawn from n + 1), so a partition that cuts the cluster while some nodes
    have switched and others have not still leaves at most one side quorate. It must leave a
    quorum of the new set online, so the primary component goes on writing."""
    version = current.version if current is not None else 0
    if new.version != version + 1:
        return (f"the change is to configuration version {new.version}, the cluster is at version {version} "
                "(another change came first): look at `chorus status` and try again")
    if sender not in online:
        return f"it was asked by {sender}, which is not a member of the primary component"
    if not new.nodes:
        return "it leaves no configured node"
    if len(set(new.nodes)) != len(new.nodes):
        return "it names a node twice"
    bad = [n for n in new.nodes if not NAME.match(n)]
    if bad:
        return f"node names must be 1 to 63 of [A-Za-z0-9_.-]: {', '.join(bad)}"
    if new.tie_breaker:
        return "a changed configuration breaks no ties (it counts a strict majority)"
    if current is not None:
        if len(set(current.nodes) ^ set(new.nodes)) != 1:
            return (f"it changes more than one node ({', '.join(current.nodes)} to {', '.join(new.nodes)}): "
                    "add or remove one node at a time")
    elif current_count:
        # before the first change only the count is known, and the members online among them
        dropped = [n for n in online if n not in new.nodes]
        if abs(current_count - len(new.nodes)) != 1 or len(dropped) > (len(new.nodes) < current_count):
            return (f"it changes {current_count} configured nodes to {len(new.nodes)} "
                    f"({', '.join(new.nodes)}; members online: {', '.join(sorted(online))}): "
                    "add or remove one node at a time")
    if not quorum_of(new, online, shared_bus):
        here = sorted(n for n in online if n in new.nodes)
        return (f"the members online among the new nodes ({', '.join(here) or 'none'}) are not a quorum of "
                f"{len(new.nodes)} configured nodes: the cluster would stop writing")
    return None
