"""What the replicator decides: the node's phase and the actions :class:`chorus.replicator.Replicator`
returns for the coordinator to carry out (etcd's ``Ready``: values, not the state machine).

The pipeline, the backend socket, voting and causal reads take these values; none of them needs
the replicator itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Union

from chorus import wire
from chorus.bus import proto as bp
from chorus.confchange import ClusterConfig
from chorus.history import Epoch, MemberRecord


class Phase(enum.Enum):
    CONNECTING = "connecting"  # not yet in a view of the group
    JOINING = "joining"  # asked for the GID, waiting for the answer
    ONLINE = "online"  # synced and in the primary component: takes writes
    RECOVERING = "recovering"  # joined and certifying the live stream, catching up from a log
    NON_PRIMARY = "non-primary"  # outside the quorate partition: reads only
    NEEDS_RECOVERY = "needs-recovery"  # cannot join without recovery; stays out


@dataclass(frozen=True)
class Send:
    message: bp.Message
    version: int = 0  # the bus protocol version to write it at (0: the node's, Replicator.send_version)


@dataclass(frozen=True)
class LocalVerdict:
    """Answer the backend that sent local writeset ``ticket``."""

    ticket: int
    ok: bool
    gid: int
    prev: int  # the GID certified before it
    reason: str
    writeset: Optional[wire.Writeset]
    unknown: bool = False  # certified, but the node left the primary component before it was stable
    # a schema change: it commits once every node has reported applying it (VoteDecided, schema)
    settle: bool = False
    commit_time: int = 0  # its message's origin commit time (bus/proto.py WritesetMsg; 0: unknown)


@dataclass(frozen=True)
class Apply:
    """Apply a certified remote writeset; ``prev``: the GID certified before it. ``settle``: a
    schema change, applied and then reported (a Vote); it commits, or is undone, once every
    node has reported (VoteDecided, schema)."""

    gid: int
    prev: int
    origin: str
    writeset: wire.Writeset
    settle: bool = False
    # a link writeset (docs/LINKS.md section 3): the message, whose writeset is ``writeset``;
    # ``origin`` is then the link's (link.position.origin), and every node applies it, its
    # receiving node too
    link: Optional[bp.LinkWriteset] = None
    commit_time: int = 0  # its message's origin commit time (bus/proto.py WritesetMsg; 0: unknown)


@dataclass(frozen=True)
class PhaseChange:
    phase: Phase
    reason: str


@dataclass(frozen=True)
class Joined:
    """The node joined (or bootstrapped) cluster ``cluster_uuid`` at ``gid``."""

    cluster_uuid: str
    gid: int
    bootstrapped: bool


@dataclass(frozen=True)
class DdlOutcome:
    """Schema change ``gid`` ran on its origin (every node applies ``content`` at its GID) or
    not (every node skips it). Decided by the origin's DdlResult, or by the origin leaving the
    group first."""

    gid: int
    ok: bool
    error: str
    content: Optional[wire.Writeset] = None
    settle: bool = False  # it ran: every other node applies and reports it (as Apply's settle)


@dataclass(frozen=True)
class VoteOpened:
    """A node failed to apply certified writeset ``gid``: every node reports its own outcome
    for it (a Vote), now if it has committed it, else once it has applied it or failed to."""
    gid: int


@dataclass(frozen=True)
class VoteDecided:
    """The members' outcomes for ``gid`` are counted: the majority applied it (``ok``) or
    failed to. A node on the other side, the origin too, leaves and stops (Galera 4's
    inconsistency voting); where the majority failed, the others commit the GID empty.

    For a schema change (``schema``) every node reported: ``ok`` if every one of them applied
    it, and it commits everywhere; else it is undone everywhere (the GID commits empty, its
    origin's client hears why) and no node leaves: user code a replay runs cannot choose which
    node goes (docs/SECURITY.md)."""
    gid: int
    ok: bool
    detail: str
    schema: bool = False
    failure: str = ""  # schema: the first failure reported, "node: SQLSTATE message"


@dataclass(frozen=True)
class SyncReached:
    """This node's causal-read marker was delivered: readers wait for ``gid`` (the last GID
    certified before it) to commit here. ``ok`` false: the node is not in the primary component."""
    token: int
    gid: int
    ok: bool


@dataclass(frozen=True)
class CatchUp:
    """Partial recovery (seed 8.1, 9.3): the database is at ``after``; every certified writeset
    up to ``upto`` must come from a member's writeset log before the live stream (everything
    after ``upto``, certified meanwhile) can be applied."""
    after: int
    upto: int


@dataclass(frozen=True)
class LogQueried:
    """A recovering node asks which GID ranges this node's log holds: answer with a LogInfo."""
    node: str
    request_id: str


@dataclass(frozen=True)
class LogOffered:
    """A member answered this node's LogQuery."""
    info: bp.LogInfo


@dataclass(frozen=True)
class Pause:
    """Flow control: new write statements on this node wait (``paused``) because some node asked
    the cluster to slow down, or go on again because none does any more."""
    paused: bool


@dataclass(frozen=True)
class Remember:
    """Write what this node knows of the history to its state file before it goes on: the epochs
    it followed and its member records (history.py)."""
    epochs: tuple[Epoch, ...]
    records: tuple[tuple[str, MemberRecord], ...]


@dataclass(frozen=True)
class Reconfigure:
    """The cluster's configured nodes changed (``chorus node add``/``remove``, confchange.py):
    write them to the state file before going on, so a restart counts votes from them."""
    config: ClusterConfig


@dataclass(frozen=True)
class Reconfigured:
    """This node's Configure (``request_id``) was delivered: applied everywhere (``ok``), or
    refused everywhere and why; the operator who asked is told."""
    request_id: str
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class Removed:
    """This node is not one of the cluster's configured nodes (removed by ``chorus node remove``,
    or never added): it stops, and does not start again until it is added and rebuilt."""
    reason: str


@dataclass(frozen=True)
class LinkPinned:
    """A member said how far the peer site of ``link`` applied this site's GIDs (``bp.LinkApplied``):
    this node's writeset log keeps what comes after ``gid`` (docs/LINKS.md section 2)."""
    node: str
    link: str
    gid: int


Action = Union[Send, LocalVerdict, Apply, PhaseChange, Joined, DdlOutcome, SyncReached, CatchUp,
               LogQueried, LogOffered, VoteOpened, VoteDecided, Pause, Remember, Reconfigure, Reconfigured,
               Removed, LinkPinned]
