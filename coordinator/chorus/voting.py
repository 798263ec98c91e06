"""Inconsistency voting (Galera 4; docs/MEMBERSHIP.md): a node that fails to apply a certified
writeset asks the members whether they applied it. If the majority did, the failing node leaves
the cluster and stops; if the majority failed too, the GID commits empty everywhere and the
nodes that applied it leave."""

from __future__ import annotations

import logging
from typing import Callable, Optional

from chorus.bus import proto as bp
from chorus.actions import VoteDecided

log = logging.getLogger("chorus.coordinator")


class InconsistencyVoting:
    """``decided(gid)`` is the cluster's decision on a GID if there is one (the replicator's);
    ``watermark()`` how far this node has committed; ``commit_skipped(gid)`` starts committing a
    GID without its changes; ``leave(why)`` takes the node out of the cluster. No I/O and no
    waiting: the decisions come as calls (the daemon's, or the simulation's, tests/sim)."""

    def __init__(self, node: str, send: Callable[[bp.Message], None],
                 decided: Callable[[int], Optional[bool]], watermark: Callable[[], int],
                 commit_skipped: Callable[[int], None], leave: Callable[[str], None]) -> None:
        self.node = node
        self._send = send
        self._decided = decided
        self._watermark = watermark
        self._commit_skipped = commit_skipped
        self._leave = leave
        self._failures: dict[int, str] = {}  # GIDs this node failed to apply -> why
        self._waiting: set[int] = set()  # ... waiting for the decision
        self._due: set[int] = set()  # votes open on GIDs not committed here yet

    def apply_failed(self, gid: int, reason: str) -> None:
        """This node failed to apply certified writeset ``gid`` (it succeeded on its origin)."""
        decided = self._decided(gid)
        if decided is None:
            if gid not in self._waiting:
                self._failures[gid] = reason
                self._waiting.add(gid)
                log.error("GID %d could not be applied here (%s): the nodes vote on it", gid, reason)
                self._send(bp.Vote(self.node, gid, False, reason))
            return
        self._conclude(gid, decided, reason)

    def rejoined(self) -> None:
        """This node is in the primary component again: ask again on the GIDs it still waits for.
        A vote sent while it was cut off reached no node that counts (simulation seed 13336: the
        node failed a GID after PostgreSQL came back, was isolated before its vote got out, and
        waited for that ballot for good once it rejoined); the members open it now, or, if they
        decided it meanwhile, answer with the outcome."""
        for gid in sorted(self._waiting):
            decided = self._decided(gid)
            if decided is not None:
                self._waiting.discard(gid)
                self._conclude(gid, decided, self._failures.get(gid, ""))
            else:
                log.warning("GID %d: asking the members again for their outcome", gid)
                self._send(bp.Vote(self.node, gid, False, self._failures.get(gid, "")))

    def opened(self, gid: int) -> None:
        """A node failed to apply ``gid``: say whether this one did, now or once it has."""
        if gid in self._failures:
            return  # voted already
        if self._watermark() >= gid:
            self._send(bp.Vote(self.node, gid, True))
        else:
            self._due.add(gid)

    def check_due(self) -> None:
        """Vote on the open ballots whose GID this node has committed meanwhile, however it
        learnt so (every tick: a commit the database shows that no apply reported)."""
        for gid in sorted(g for g in self._due if g <= self._watermark()):
            self._due.discard(gid)
            self._send(bp.Vote(self.node, gid, True))

    def committed_here(self, gid: int) -> None:
        """GID ``gid`` committed here (applied, or committed by its local backend)."""
        if gid in self._due:
            self._due.discard(gid)
            self._send(bp.Vote(self.node, gid, True))
        if self._decided(gid) is False:
            self._leave_inconsistent(gid, "the majority could not apply it and this node did")

    def decided(self, d: VoteDecided) -> None:
        log.warning("inconsistency vote on GID %d: %s (%s)", d.gid,
                    "the majority applied it" if d.ok else "the majority could not apply it", d.detail)
        if d.gid in self._waiting:
            self._waiting.discard(d.gid)
            self._conclude(d.gid, d.ok, self._failures.get(d.gid, ""))
        elif not d.ok and self._watermark() >= d.gid and d.gid not in self._due:
            self._leave_inconsistent(d.gid, "the majority could not apply it and this node did")

    def _conclude(self, gid: int, majority_applied: bool, reason: str) -> None:
        """This node could not apply ``gid``: it leaves if the majority did, else commits it empty."""
        if majority_applied:
            self._leave_inconsistent(gid, f"the majority applied it and this node could not ({reason})")
        else:
            self._commit_skipped(gid)

    def _leave_inconsistent(self, gid: int, why: str) -> None:
        self._leave(f"inconsistency vote on GID {gid}: {why}; this node leaves the cluster and stops "
                    "(rebuild it with chorus node join --total)")
