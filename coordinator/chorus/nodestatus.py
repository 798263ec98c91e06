"""What a node reports about itself: counters kept while it runs, and the status it answers on
the admin socket (``chorus status``), an immutable value."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional


@dataclass
class Counters:
    local_commits: int = 0
    applied: int = 0
    replayed: int = 0
    apply_retries: int = 0
    malformed_frames: int = 0
    refused: int = 0
    local_aborts: int = 0
    max_workers_busy: int = 0  # the most apply sessions ever busy at once
    overlapped_applies: int = 0  # applies dispatched while another was still running
    already_committed: int = 0  # applies found their GID committed here already (nothing done)
    apply_transactions: int = 0  # transactions that applied remote writesets (a run is one)
    bus_messages_received: int = 0  # bus messages delivered to this node (its own included)
    bus_bytes_received: int = 0


@dataclass(frozen=True)
class NodeStatus:
    """One node's status at one moment (the admin socket's ``status``; docs/OPERATIONS.md)."""
    node: str
    state: str  # the phase, or "failed"
    reason: str
    accepts_writes: bool
    cluster_uuid: str
    bus_member: str
    members: list[str]
    # the online members' committed GIDs, as each last reported it (about once a second)
    member_committed_gid: dict[str, int]
    bus_members: list[str]
    # rolling upgrades (bus/versions.py): the cluster's bus protocol version (0 outside a primary
    # component), the versions this node speaks, and what each member speaks
    bus_version: int
    bus_versions: list[int]
    member_bus_versions: dict[str, list[int]]
    quorate: bool
    quorum_votes: int
    tie_breaker: str
    released_gid: int  # uniform commit (docs/MEMBERSHIP.md): certified and held by a quorum
    held_for_quorum: int
    committed_gid: int
    delivered_gid: int
    certified_gid: int
    lag_gids: int
    lag_ms: float
    local_commits: int
    certification_failures: int
    local_certification_failures: int
    certification_failures_by_table: dict[str, int]  # "schema.table" ("": snapshot too old)
    applied: int
    apply_transactions: int
    replayed: int
    apply_retries: int
    apply_queue: int
    send_queue: int
    flow_control: dict[str, Any]
    pending: int
    pending_head: list[dict[str, Any]]
    workers: int
    commit_lanes: int
    workers_busy: int
    max_workers_busy: int
    overlapped_applies: int
    already_committed: int
    last_apply_ms: float
    certification_index_keys: int
    certification_horizon: int
    refused: int
    local_aborts_for_appliers: int
    malformed_frames: int
    bus_batches: int
    bus_writesets: int
    bus_messages_sent: int
    bus_bytes_sent: int
    bus_messages_received: int
    bus_bytes_received: int
    uptime_s: float
    event_loop: str  # uvloop or asyncio (eventloop.py)
    impl: str  # the hot path: c (compiled) or python (coordinator.hot_path_impl)
    recovery: Optional[dict[str, Any]]
    concurrent_index_changes: dict[str, Any]
    writeset_log: dict[str, Any]
    # the members that are synced (the others in ``members`` are catching up)
    synced_members: list[str] = dataclasses.field(default_factory=list)
    # the epochs this node's data followed (chorus/history.py): [number, start GID, node], oldest first
    epochs: list[list[Any]] = dataclasses.field(default_factory=list)
    # outside the primary component, when nobody can re-form it yet: why, and which nodes it
    # waits for (docs/RECOVERY.md)
    reform: Optional[dict[str, Any]] = None
    # the configured nodes since the last `chorus node add`/`remove` (version 0, []: the nodes'
    # own configuration, ``configured_votes`` of them); docs/MEMBERSHIP.md
    config_version: int = 0
    configured_nodes: list[str] = dataclasses.field(default_factory=list)
    # each configured node's Corosync node id, as this node knows it: only these count toward a
    # view's quorum (a node whose id is not known yet counts zero until it is learned)
    configured_ids: dict[str, str] = dataclasses.field(default_factory=dict)
    configured_votes: int = 0
    # the links between sites this node has a part in (link/status.py): a row per link and direction
    links: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form, with the field names as keys."""
        return dataclasses.asdict(self)


# ---- the extension's views (chorus.node, chorus.members, chorus.conflicts) -----------------

INFO_BYTES = 60_000  # one answer's JSON, at most (it travels in a verdict frame's u16 message)
_TEXT_MAX = 200  # a conflict's key and reason, cut to this many characters


def node_view(s: NodeStatus) -> dict[str, Any]:
    """chorus.node: this node, one row."""
    wl = s.writeset_log
    return {"name": s.node, "phase": s.state, "reason": s.reason, "accepts_writes": s.accepts_writes,
            "quorate": s.quorate, "cluster_uuid": s.cluster_uuid, "members_online": len(s.members),
            "committed_gid": s.committed_gid, "certified_gid": s.certified_gid, "lag_gids": s.lag_gids,
            "lag_ms": s.lag_ms, "local_commits": s.local_commits,
            "certification_failures": s.certification_failures,
            "local_certification_failures": s.local_certification_failures, "applied": s.applied,
            "flow_control_paused_by": s.flow_control.get("paused_by", []),
            "wslog_low_gid": wl.get("low_gid", 0), "wslog_high_gid": wl.get("high_gid", 0),
            "uptime_s": s.uptime_s}


def members_view(s: NodeStatus) -> list[dict[str, Any]]:
    """chorus.members: the members this node sees online, with the GID each has committed (as it
    last reported it, about once a second; this node's own is current) and how far that is
    behind what this node certified."""
    rows = []
    for name in sorted(set(s.members) | {s.node}):
        own = name == s.node
        committed = s.committed_gid if own else s.member_committed_gid.get(name)
        phase = s.state if own else "online" if name in s.synced_members else "recovering"
        rows.append({"name": name, "this_node": own, "phase": phase,
                     "committed_gid": committed,
                     "lag_gids": max(0, s.certified_gid - committed) if committed is not None else None})
    return rows


LINK_VIEW_FIELDS = ("link", "direction", "site", "peer_site", "state", "receiver_node", "sender", "peer_gid",
                    "applied_gid", "lag_gids", "lag_seconds", "own_clock", "peer_clock", "max_replicated",
                    "position_gid", "received", "applied", "sent", "filtered", "returned", "why")


def links_view(s: NodeStatus) -> list[dict[str, Any]]:
    """chorus.link_status: what the coordinator knows of this node's links (the conflicts the
    view counts itself, from chorus.link_exceptions)."""
    return [{k: r.get(k) for k in LINK_VIEW_FIELDS} for r in s.links]


def _cut(text: str) -> str:
    return text if len(text) <= _TEXT_MAX else text[:_TEXT_MAX - 1] + "…"


def conflicts_page(conflicts: Iterable[dict[str, Any]], after_gid: int) -> dict[str, Any]:
    """chorus.conflicts, a page at a time: the conflicts after GID ``after_gid``, oldest first,
    as many as fit in INFO_BYTES; ``more`` if others follow (ask again after the last GID)."""
    rows: list[dict[str, Any]] = []
    size = 100
    more = False
    for c in conflicts:
        if c["gid"] <= after_gid:
            continue
        row = dict(c, key=_cut(c["key"]), reason=_cut(c["reason"]))
        n = len(json.dumps(row, ensure_ascii=False).encode()) + 2
        if rows and size + n > INFO_BYTES:
            more = True
            break
        rows.append(row)
        size += n
    return {"rows": rows, "more": more}


def info(what: str, s: Callable[[], NodeStatus], conflicts: Callable[[], Iterable[dict[str, Any]]],
         outcome: Optional[Callable[[int, int, str, str], dict[str, Any]]] = None) -> str:
    """The answer to an extension's request for one of its views (backend frame ``I``): JSON.
    ``what``: "node", "members", "links", "conflicts AFTER_GID", or "outcome XID BEGAN_GID STATUS NODE"
    (chorus.commit_outcome: STATUS is what the origin's database says of the transaction, or
    "-"). Raises ValueError for anything else."""
    kind, _, arg = what.partition(" ")
    if kind == "outcome" and outcome is not None:
        xid, began, status, node = (arg.split(" ", 3) + ["", "", "", ""])[:4]
        if not (xid.isdigit() and began.isdigit() and len(xid) <= 20 and len(began) <= 20 and node
                and status in ("-", "committed", "aborted", "in_progress", "unknown")):
            raise ValueError(f"bad outcome request {arg[:60]!r}")
        return json.dumps(outcome(int(xid), int(began), "" if status == "-" else status.replace("_", " "), node))
    if kind == "node" and not arg:
        doc: Any = node_view(s())
    elif kind == "members" and not arg:
        doc = members_view(s())
    elif kind == "links" and not arg:
        doc = links_view(s())
    elif kind == "conflicts" and (arg == "" or arg.isdigit()) and len(arg) < 20:
        doc = conflicts_page(conflicts(), int(arg or 0))
    else:
        raise ValueError(f"unknown view {what[:40]!r}")
    return json.dumps(doc, ensure_ascii=False)
