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
from dataclasses import dataclass
from typing import Mapping, Optional

from chorus.bus import Votes, bus_node

NAME = re.compile(r"[A-Za-z0-9_.-]{1,63}\Z")


@dataclass(frozen=True)
class ClusterConfig:
    """The configured nodes from a change on: ``version`` counts the changes (1 for the first),
    ``nodes`` are the node names (sorted), ``tie_breaker`` the bus node (Corosync node id) whose
    half wins an even split ("" when ties are not broken, and in a local cluster)."""

    version: int
    nodes: tuple[str, ...]
    tie_breaker: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(sorted(self.nodes)))

    def as_fields(self) -> tuple[int, tuple[str, ...], str]:
        return self.version, self.nodes, self.tie_breaker

    @staticmethod
    def from_fields(version: int, nodes: tuple[str, ...], tie_breaker: str) -> Optional["ClusterConfig"]:
        """The configured set a message carries (None: version 0, none)."""
        return ClusterConfig(version, nodes, tie_breaker) if version > 0 else None


def newer(a: Optional[ClusterConfig], b: Optional[ClusterConfig]) -> Optional[ClusterConfig]:
    """The later of two configured sets (a higher version; ``a`` among equals)."""
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
    configured set's, one per node, a strict majority or half with the tie breaker. In a local
    cluster (``shared_bus``: one Corosync for all) the bus's own stay (one node, quorate alone:
    uniform commit releases at once there); :func:`member_votes` counts its coordinators."""
    if config is None or shared_bus:
        return from_bus
    n = len(config.nodes)
    return Votes(n // 2 + 1, n, config.tie_breaker)


def quorum_of(config: ClusterConfig, present: Mapping[str, str], shared_bus: bool) -> bool:
    """Whether the nodes ``present`` (name -> bus member id) hold a quorum of ``config``: in a
    local cluster a strict majority of its nodes, else of its bus nodes (the tie breaker's half
    of an even split too)."""
    here = [n for n in present if n in config.nodes]
    if shared_bus:
        return 2 * len(here) > len(config.nodes)
    return votes(config, Votes(), False).holds({bus_node(present[n]) for n in here})


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
