"""The commit bookkeeping of one node, without I/O: which certified writesets are not committed
here yet (the pending set), how far the node has committed (the watermark, DESIGN.md invariant
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
        self.lanes = 1
        self._lane_last: list[int] = [0]  # the last GID admitted per lane
        self._unflushed: deque[E] = deque()  # committed here, in GID order, not known durable yet

    def start(self, lanes: int, committed: int) -> None:
        """The database runs ``lanes`` commit lanes and has committed up to ``committed``."""
        self.lanes, self._lane_last = lanes, [committed] * lanes

    def admit(self, e: E) -> None:
        """A certified writeset, in GID order: pending, its commit's wait assigned."""
        self.assign_lane(e)
        self.pending[e.gid] = e

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
