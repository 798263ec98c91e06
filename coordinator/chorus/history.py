"""Which node holds what of the cluster's one history, without I/O (docs/RECOVERY.md, "The
cluster comes back by itself").

Every node's database holds a prefix of one history of certified writesets, numbered by GID.
Three things let the nodes reason about it when no member of the primary component is left to
say how far it goes:

- **Epochs.** The history is cut into epochs: a node that starts the cluster (``chorus
  bootstrap``) or re-forms it opens a new one at its GID. A node remembers the epochs it followed
  (:class:`Epoch`, oldest first). Two nodes' data agree up to the GID where their epoch lists
  part (:func:`shared_upto`): a node is a prefix of the cluster's history iff its GID is not past
  that point.
- **Member records.** Each node remembers, for every node it was in the primary component with,
  whether that node was a member at a given place of the history or left it there
  (:class:`MemberRecord`, written to the state file before the node goes on). A node updates
  them only while it is itself in the primary component, so the newest record of a node is the
  truth about it: any later primary component had a quorum, which shares a node with any later
  quorum, and that node recorded it.
- **The re-form decision** (:func:`decide`): when a quorate view has no synced member, every
  node asks to re-form with the GID its database holds, its log range and its records. The one
  holding most re-forms the cluster, but only once every node that may hold an acknowledged
  writeset the others lack is back: a node whose newest record says it is a member (it may have
  committed up to the moment everything stopped) or that it left after the GID the present
  nodes hold. A node that left the primary component at GID L committed nothing after L, and a
  present node holding L holds everything it did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

EPOCHS_KEPT = 64  # the newest epochs a node remembers


@dataclass(frozen=True, order=True)
class Epoch:
    """A stretch of the history: opened by ``node`` (bootstrap or re-form) at GID ``start``."""
    number: int
    start: int
    node: str


@dataclass(frozen=True)
class MemberRecord:
    """What a node remembers of another: it was in the primary component since (``epoch``,
    ``gid``) (``member``), or it left it there."""
    epoch: int
    gid: int
    member: bool

    def key(self) -> tuple[int, int, int]:
        # at one place, leaving is after joining (a node can join and leave at the same GID)
        return (self.epoch, self.gid, 0 if self.member else 1)


Records = Mapping[str, MemberRecord]


def merge(*records: Records) -> dict[str, MemberRecord]:
    """The newest record of every node named in any of ``records``."""
    out: dict[str, MemberRecord] = {}
    for recs in records:
        for name, rec in recs.items():
            have = out.get(name)
            if have is None or rec.key() > have.key():
                out[name] = rec
    return out


def add_epoch(epochs: Sequence[Epoch], e: Epoch) -> tuple[Epoch, ...]:
    """``epochs`` and ``e`` after them, at most EPOCHS_KEPT."""
    return (*[x for x in epochs if x.number < e.number], e)[-EPOCHS_KEPT:]


def shared_upto(mine: Sequence[Epoch], my_gid: int, theirs: Sequence[Epoch], their_gid: int) -> Optional[int]:
    """The last GID two histories hold alike: a node's (its epochs ``mine``, up to ``my_gid``) and
    another's (``theirs``, up to ``their_gid``). Epoch e holds the GIDs from its start up to the
    start of the next epoch its list names (or up to the history's GID). None when the lists name
    no common epoch (different clusters, or one list is older than the other remembers)."""
    theirs_set = set(theirs)
    i = next((k for k, e in enumerate(mine) if e in theirs_set), None)
    if i is None:
        return None
    j = list(theirs).index(mine[i])
    k = 0
    while i + k < len(mine) and j + k < len(theirs) and mine[i + k] == theirs[j + k]:
        k += 1
    mine_next = mine[i + k].start if i + k < len(mine) else my_gid
    theirs_next = theirs[j + k].start if j + k < len(theirs) else their_gid
    return min(mine_next, theirs_next)


def prefix_problem(node: str, gid: int, epochs: Sequence[Epoch], cluster_epochs: Sequence[Epoch],
                   cluster_gid: int) -> Optional[str]:
    """Why the data of ``node`` (at ``gid``, having followed ``epochs``) is not a prefix of the
    cluster's history (``cluster_epochs``, up to ``cluster_gid``); None if it is."""
    if gid == 0:
        return None  # holds nothing
    if gid > cluster_gid:
        return (f"its database is at GID {gid}, past the cluster's GID {cluster_gid}: it holds GIDs "
                f"{cluster_gid + 1}..{gid} that the cluster does not have")
    if not epochs or not cluster_epochs:
        return None  # a node or cluster from before epochs were kept: the GIDs are all we know
    upto = shared_upto(epochs, gid, cluster_epochs, cluster_gid)
    if upto is None:
        return (f"its history (epoch {epochs[-1].number} from GID {epochs[-1].start}) shares no epoch with the "
                f"cluster's (epochs {cluster_epochs[0].number}..{cluster_epochs[-1].number})")
    if gid > upto:
        cut = next((e for e in cluster_epochs if e.start == upto and e not in epochs), None)
        where = (f"the cluster opened epoch {cut.number} at GID {upto} on {cut.node}" if cut is not None
                 else f"the histories part at GID {upto}")
        return (f"it committed GIDs {upto + 1}..{gid} in epoch {epochs[-1].number}, but {where}: those GIDs "
                "name other writesets in the cluster's history")
    return None


@dataclass(frozen=True)
class Candidate:
    """A node asking to re-form (its GID request), as the decision needs it."""
    node: str
    cluster_uuid: str  # "" for a node that never joined a cluster (it holds nothing of it)
    gid: int  # the GID its database holds, or will once what it admitted commits
    epochs: tuple[Epoch, ...]
    log_after: int  # its writeset log holds every GID after this one ...
    log_high: int  # ... up to this one
    records: Mapping[str, MemberRecord]


@dataclass(frozen=True)
class Decision:
    """Who re-forms the cluster (``winner``, at ``gid`` as ``epoch``), or why nobody can yet
    (``waiting_for``: the nodes that must come back, each with why)."""
    winner: Optional[str]
    gid: int = 0
    epoch: Optional[Epoch] = None
    cluster_uuid: str = ""
    waiting_for: tuple[tuple[str, str], ...] = ()
    reason: str = ""


def rank(c: Candidate) -> tuple[int, int, str]:
    """Most advanced first: the highest GID, then the log that reaches furthest back (the others
    catch up from it), then the lowest name."""
    return (-c.gid, c.log_after if c.log_high >= c.gid else c.gid, c.node)


def decide(cands: Iterable[Candidate]) -> Decision:
    """The re-form decision every node makes alike from the same requests (those of one view,
    in which every member asked). See the module's docstring."""
    cands = list(cands)
    uuids = {c.cluster_uuid for c in cands if c.cluster_uuid}
    if not uuids:
        return Decision(None, reason="no node here has joined a cluster: start one with `chorus bootstrap`")
    if len(uuids) > 1:
        return Decision(None, reason=f"the nodes here belong to different clusters ({', '.join(sorted(uuids))}): "
                                     "none re-forms; rebuild the odd one by total recovery")
    cluster = uuids.pop()
    ours = [c for c in cands if c.cluster_uuid == cluster]
    present = {c.node for c in cands}
    best = min(ours, key=rank)
    records = merge(*(c.records for c in ours))
    waiting: list[tuple[str, str]] = []
    for name, rec in sorted(records.items()):
        if name in present:
            continue
        if rec.member:
            waiting.append((name, f"it was in the primary component (since GID {rec.gid} of epoch {rec.epoch}) and "
                                  "may hold acknowledged writesets no node here has"))
        elif rec.gid > best.gid:
            waiting.append((name, f"it left the primary component at GID {rec.gid}, past the GID the nodes here "
                                  f"hold ({best.gid}): it may hold acknowledged writesets they lack"))
    if waiting:
        names = ", ".join(n for n, _ in waiting)
        return Decision(None, cluster_uuid=cluster, waiting_for=tuple(waiting),
                        reason=f"no member of cluster {cluster} is synced; re-forming it waits for {names}")
    number = max((e.number for c in ours for e in c.epochs), default=0) + 1
    return Decision(best.node, best.gid, Epoch(number, best.gid, best.node), cluster,
                    reason=f"no member of cluster {cluster} is synced and every node that may hold acknowledged "
                           f"writesets is here: {best.node} holds the most (GID {best.gid}) and re-forms it")


def donor_problem(joiner: str, joiner_gid: int, donor: str, donor_gid: int) -> Optional[str]:
    """Why rebuilding ``joiner`` (its database at ``joiner_gid``) from ``donor`` (at
    ``donor_gid``) would lose committed work; None if it would not."""
    if joiner_gid <= donor_gid:
        return None
    return (f"{joiner} has committed up to GID {joiner_gid} and the donor {donor} only up to GID {donor_gid}: "
            f"rebuilding {joiner} from it would drop GIDs {donor_gid + 1}..{joiner_gid}, which no other node may "
            "hold (acknowledged transactions among them)")
