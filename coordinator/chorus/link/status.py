"""What a node shows of its site's links (docs/LINKS.md section 9): ``chorus link status``, the
view ``chorus.link_status`` and the ``chorus_link_*`` metrics all show these rows. Pure: the
shell (link/site.py) gathers the facts, this module makes the rows.

One row per link and direction this node has a part in:

- ``in`` (the peer's changes applied here), on every node of a site that receives the link: its
  state here (``streaming``, ``reconnecting``, ``broken``, or ``elsewhere`` when another node of
  this site runs the receiver, ``idle`` when no node may run it now, ``copying`` while this node
  re-instantiates it, with the copy's progress), the node that runs the
  receiver and the peer address it streams from, the peer's latest GID the receiver knows (the
  last transaction or clock event of the peer's stream), the peer GID applied through, the lag
  between the two in GIDs and how long the oldest received transaction not yet applied has
  waited here, the link's durable row (``chorus.link_position``), and the conflicts this site's
  apply met (``chorus.link_exceptions``) by table and decision.
- ``out`` (this site's changes sent to the peer), on a node with the link's ``listen``: the
  sender's state on this node (``streaming`` while a receiver streams from it, ``idle``, or
  ``broken`` while its rules cannot route a transaction, or when the last stream ended because
  the log no longer held what it needed), the
  receivers streaming from it, this site's committed GID, the GID the stream has passed, the
  difference (what this node has still to send), and the records sent and filtered.

Lag in seconds is measured from when this site's receiver took a transaction in, not from its
commit on the peer: commit times are not in the stream yet (they are 0: docs/LINKS.md 5.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

STATES = ("streaming", "reconnecting", "broken", "idle", "elsewhere", "copying")


@dataclass(frozen=True)
class Durable:
    """What the node's database holds of a link this site receives: its row of
    ``chorus.link_position`` (None: nothing applied yet) and its conflicts, by (table, decision)."""

    applied_gid: Optional[int] = None
    peer_clock: Optional[int] = None
    max_replicated: Optional[int] = None
    updated_at: Optional[float] = None  # seconds since the Unix epoch
    conflicts: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Receiving:
    """This node's receiver of a link, at one moment (absent when it does not run one)."""

    running: bool  # its task runs (connected or trying to)
    broken: Optional[str]  # why it stopped: every peer address said the link is broken
    connected: Optional[str]  # the peer address it streams from now
    peer_clock: int  # the peer's clock value last seen: the peer's latest GID known here is one less
    max_replicated: int
    oldest_waiting: Optional[int]  # the peer GID of the oldest transaction received and not yet applied
    oldest_waited_s: float  # how long it has waited here
    received: int  # transactions received
    applied: int  # of them, applied here


@dataclass(frozen=True)
class Copying:
    """This node's last re-instantiation of a link (docs/LINKS.md section 10.1), at one moment."""

    running: bool
    state: str  # starting, connecting, copying, finishing, done, failed, refused
    peer_gid: Optional[int]  # the peer's GID the copy is as of (None: not known yet)
    tables: int  # tables copied whole
    rows: int  # rows received
    batches: int  # link writesets sent on
    applied: int  # of them, committed here
    seconds: float
    error: Optional[str]

    def row(self) -> dict[str, Any]:
        return {"state": self.state, "peer_gid": self.peer_gid, "tables": self.tables, "rows": self.rows,
                "batches": self.batches, "applied": self.applied, "seconds": self.seconds, "error": self.error}


@dataclass(frozen=True)
class Sending:
    """This node's sender of a link, at one moment."""

    streams: tuple[tuple[str, int], ...]  # each receiver streaming from it: (its address, the GID passed)
    broken: Optional[str]  # the last stream ended so: the log lost GIDs the receiver needed
    sent: int
    filtered: int  # not sent by the link's rules, schema changes that failed
    returned: int  # the peer's own changes, not sent back (only their clock reflection)
    ddl_skipped: int = 0  # schema changes not sent with ddl on (outside the lists, naming no table)
    ddl_skipped_last: Optional[str] = None  # the last of them: "GID g: why"


def in_row(link: str, site: str, peer: str, own_gid: int, receiver_node: Optional[str], this_node: str,
           here: Optional[Receiving], durable: Durable, copy: Optional[Copying] = None) -> dict[str, Any]:
    """The ``in`` row of ``link`` on ``this_node``; ``receiver_node`` the node of this site that
    runs its receiver by the membership this node sees (None: none may now); ``copy`` this
    node's last re-instantiation of it, shown (``copy``) until the receiver runs again, and the
    state ``copying`` while it runs."""
    if copy is not None and copy.running:
        state = "copying"
    elif here is not None and here.broken is not None:
        state = "broken"
    elif here is not None and here.running:
        state = "streaming" if here.connected else "reconnecting"
    elif receiver_node is not None and receiver_node != this_node:
        state = "elsewhere"
    else:
        state = "idle"
    peer_gid: Optional[int] = None
    applied: Optional[int] = durable.applied_gid
    lag_gids: Optional[int] = None
    lag_s: Optional[float] = None
    if here is not None and here.running:
        peer_gid = max(here.peer_clock - 1, durable.applied_gid or 0)
        applied = here.oldest_waiting - 1 if here.oldest_waiting is not None else peer_gid
        lag_gids = max(0, peer_gid - applied)
        lag_s = round(here.oldest_waited_s, 3) if here.oldest_waiting is not None else 0.0
    conflicts = sorted(durable.conflicts.items())
    shown = copy if copy is not None and (copy.running or here is None or not here.running) else None
    return {
        "link": link, "direction": "in", "site": site, "peer_site": peer, "state": state,
        "receiver_node": receiver_node, "sender": here.connected if here is not None else None,
        "peer_gid": peer_gid, "applied_gid": applied, "lag_gids": lag_gids, "lag_seconds": lag_s,
        "own_clock": own_gid,
        "peer_clock": here.peer_clock if here is not None and here.running else durable.peer_clock,
        "max_replicated": _max(here.max_replicated if here is not None else None, durable.max_replicated),
        "position_gid": durable.applied_gid, "position_updated_at": durable.updated_at,
        "received": here.received if here is not None else 0, "applied": here.applied if here is not None else 0,
        "sent": None, "filtered": None, "returned": None, "ddl_skipped": None, "ddl_skipped_last": None,
        "conflicts": sum(n for _k, n in conflicts),
        "conflicts_by": [{"table": t, "decision": d, "count": n} for (t, d), n in conflicts],
        "why": (here.broken if here is not None else None) or (shown.error if shown is not None else None),
        "copy": shown.row() if shown is not None else None,
    }


def out_row(link: str, site: str, peer: str, own_gid: int, this_node: str, sending: Sending) -> dict[str, Any]:
    """The ``out`` row of ``link`` on ``this_node``, which serves its sender."""
    if sending.broken is not None:  # cleared when a stream passes what broke it
        state = "broken"
    elif sending.streams:
        state = "streaming"
    else:
        state = "idle"
    passed = max((g for _a, g in sending.streams), default=None)
    return {
        "link": link, "direction": "out", "site": site, "peer_site": peer, "state": state,
        "receiver_node": None, "sender": this_node, "receivers": [a for a, _g in sending.streams],
        "peer_gid": None, "applied_gid": passed, "lag_gids": max(0, own_gid - passed) if passed is not None else None,
        "lag_seconds": None, "own_clock": own_gid, "peer_clock": None, "max_replicated": None,
        "position_gid": None, "position_updated_at": None, "received": None, "applied": None,
        "sent": sending.sent, "filtered": sending.filtered, "returned": sending.returned,
        "ddl_skipped": sending.ddl_skipped, "ddl_skipped_last": sending.ddl_skipped_last,
        "conflicts": None, "conflicts_by": [],
        "why": sending.broken, "copy": None,
    }


def _max(a: Optional[int], b: Optional[int]) -> Optional[int]:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)
