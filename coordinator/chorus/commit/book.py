"""The commit bookkeeping of one node, without I/O: which certified writesets are not committed
here yet (the pending set), how far the node has committed (the watermark, docs/ARCHITECTURE.md invariant
5), what each commit waits for (commit lanes, docs/APPLY.md), and which committed ones are not
flushed yet (kept to apply again if PostgreSQL loses them in a crash, docs/RECOVERY.md).

The coordinator admits certified writesets in GID order, tells the book what committed and what
is durable, and after a PostgreSQL restart asks it what to apply again. Names follow the
extension's: ``prev`` is the GID certified before an entry, ``wait_for`` what its commit waits
for (``prev`` with one lane, the previous GID of its lane with several).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Optional, Protocol, TypeVar


class Entry(Protocol):
    gid: int
    prev: int
    wait_for: int


E = TypeVar("E", bound=Entry)


class CommitBook(Generic[E]):
    """Pending certified writesets, the watermark, the commit lanes and the unflushed commits."""

    def __init__(self) -> None:
        self.pending: dict[int, E] = {}
        self.watermark = 0  # every GID up to it is committed here
        self.admitted = 0  # the newest GID admitted (or committed when the database started)
        self.lanes = 1
        self._lane_last: list[int] = [0]  # the last GID admitted per lane
        self._unflushed: deque[E] = deque()  # committed here, in GID order, not known durable yet

    def start(self, lanes: int, committed: int) -> None:
        """The database runs ``lanes`` commit lanes and has committed up to ``committed``."""
        self.lanes, self._lane_last = lanes, [committed] * lanes
        self.admitted = max(self.admitted, committed)
        self.watermark = max(self.watermark, committed)

    def admit(self, e: E) -> None:
        """A certified writeset, in GID order: pending, its commit's wait assigned. A GID not
        after every one admitted before is a bug of the caller (ValueError): its commit would wait
        for GIDs admitted after it, and the log and the apply order would not be the total order."""
        if e.gid <= self.admitted:
            raise ValueError(f"GID {e.gid} admitted after GID {self.admitted}: certified writesets "
                             "must be admitted in GID order")
        self.assign_lane(e)
        self.pending[e.gid] = e
        self.admitted = e.gid

    def assign_lane(self, e: E) -> None:
        if self.lanes > 1:
            lane = e.gid % self.lanes
            e.wait_for = self._lane_last[lane]
            self._lane_last[lane] = e.gid
        else:
            e.wait_for = e.prev

    def committed(self, gid: int) -> Optional[E]:
        """Pending ``gid`` committed here (commits are in GID order: so did everything before it).
        Its entry, or None if it was not pending."""
        e = self.pending.pop(gid, None)
        if e is not None:
            self._unflushed.append(e)
            self.advance(gid)
        return e

    def advance(self, gid: int) -> None:
        """The database says it has committed up to ``gid``."""
        if gid > self.watermark:
            self.watermark = gid

    def flushed(self, durable: int) -> None:
        """Everything up to GID ``durable`` is on disk: forget what was kept for a crash."""
        while self._unflushed and self._unflushed[0].gid <= durable:
            self._unflushed.popleft()

    @property
    def unflushed(self) -> int:
        return len(self._unflushed)

    def restart(self, durable: int) -> list[E]:
        """PostgreSQL came back holding everything up to ``durable`` and nothing after it. Return
        the commits it lost (committed, not flushed), in GID order: they are pending again, ahead
        of the rest, and every pending commit waits anew (the lanes start again at ``durable``;
        ``start`` was called)."""
        lost = [e for e in self._unflushed if e.gid > durable]
        self._unflushed.clear()
        self.watermark = durable
        for g in [g for g in self.pending if g <= durable]:
            del self.pending[g]
        for e in lost:
            self.pending.setdefault(e.gid, e)
        self.pending = dict(sorted(self.pending.items()))
        for e in self.pending.values():
            self.assign_lane(e)
        return lost

    def settled(self, upto: int) -> bool:
        """Nothing certified up to ``upto`` waits to commit here."""
        return not any(g <= upto for g in self.pending)


class FlowControl:
    """Whether this node asks the cluster to pause its writes (flow control, docs/APPLY.md): it
    asks once its backlog of certified writesets not committed here reaches ``pause_at``, and
    lets go once it is down to ``resume_at``."""

    def __init__(self, pause_at: int, resume_at: int) -> None:
        self.pause_at = pause_at
        self.resume_at = resume_at
        self.requested = False

    def check(self, backlog: int) -> Optional[bool]:
        """The request to send now (True: pause, False: resume), or None."""
        if not self.requested and backlog >= self.pause_at:
            self.requested = True
            return True
        if self.requested and backlog <= self.resume_at:
            self.requested = False
            return False
        return None

    def reassert(self, cluster_counts_it: bool) -> Optional[bool]:
        """Flow control is a state, not an event: if the cluster's view of this node's request
        (as delivered back to it) differs from what it wants, say it again. Covers a request sent
        while the node was not yet counted online, or lost to a failed send."""
        return self.requested if cluster_counts_it != self.requested else None


R = TypeVar("R")


class RunBatcher(Generic[R]):
    """Catch-up batching: consecutive row writesets from a partner's log are applied as one
    transaction (the commit of the run's last GID covers the GIDs before it), at most
    ``max_count`` writesets and about ``max_bytes`` bytes in a run: the per-transaction cost (a
    round trip, a commit, the commit turn) is paid once per run, not per writeset."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._items: list[R] = []
        self._bytes = 0
        self._prev = 0

    def add(self, item: R, prev: int, size: int) -> bool:
        """Add the writeset certified after GID ``prev``; True once the run is full."""
        if not self._items:
            self._prev = prev
        self._items.append(item)
        self._bytes += size
        return len(self._items) >= self.max_count or self._bytes > self.max_bytes

    def take(self) -> Optional[tuple[list[R], int]]:
        """The run so far and the GID certified before it (None if empty); the batcher empties."""
        if not self._items:
            return None
        run, self._items, self._bytes = self._items, [], 0
        return run, self._prev
