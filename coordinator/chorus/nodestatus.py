"""What a node reports about itself: counters kept while it runs, and the status it answers on
the admin socket (``chorus status``), an immutable value."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional


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
    bus_members: list[str]
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
    uptime_s: float
    event_loop: str  # uvloop or asyncio (eventloop.py)
    impl: str  # the hot path: c (compiled) or python (coordinator.hot_path_impl)
    recovery: Optional[dict[str, Any]]
    concurrent_index_changes: dict[str, Any]
    writeset_log: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The JSON form, with the field names as keys."""
        return dataclasses.asdict(self)
