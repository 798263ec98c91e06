"""The outcome of a transaction whose client lost its connection at COMMIT (SQLSTATE 08006 or
08007): committed, aborted, or in doubt, from replicated state (docs/CLIENTS.md, "Lost
connections").

Before COMMIT a client reads ``chorus.transaction_id()``: its origin node, its transaction ID
there and the GID its node had committed then. Every writeset is ordered after that GID. Each
node keeps the outcome of every writeset it certified (:class:`OutcomeIndex`, bounded): a
certified one commits on every node, a failed one on none. Every node certifies alike, so any
node of the primary component answers alike (:func:`lookup`). A transaction this node did not
see certified is still in doubt while its origin may send its writeset; it was aborted once
that cannot happen any more (its origin left the primary component, or its origin's database
says it ended and no writeset of it is in flight there).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

OUTCOME_HISTORY = 100_000  # writesets whose outcome a node remembers (about 15 MB)


@dataclass(frozen=True)
class Outcome:
    gid: int
    committed: bool
    reason: str = ""


class OutcomeIndex:
    """The outcomes of the last certified (or failed) writesets, by origin and transaction ID
    (its low 32 bits, as writesets carry it), and the GIDs they cover without a gap."""

    def __init__(self, size: int = OUTCOME_HISTORY) -> None:
        self.size = size
        self._by_txn: OrderedDict[tuple[str, int], Outcome] = OrderedDict()
        self.complete_after = -1  # every writeset ordered after this GID is here (-1: none yet)
        self._last = -1  # the last GID seen

    def seen(self, gid: int) -> None:
        """GID ``gid`` was delivered and certified here (whatever it held): a GID skipped means
        this node did not certify some (it was away), so what it remembers starts again here."""
        if gid != self._last + 1 or self.complete_after < 0:
            self.complete_after = gid - 1
        self._last = gid

    def record(self, origin: str, xid: int, outcome: Outcome) -> None:
        by = self._by_txn
        by[(origin, xid & 0xFFFFFFFF)] = outcome
        if len(by) > self.size:
            _, oldest = by.popitem(last=False)
            self.complete_after = max(self.complete_after, oldest.gid)

    def get(self, origin: str, xid: int) -> Optional[Outcome]:
        return self._by_txn.get((origin, xid & 0xFFFFFFFF))

    def __len__(self) -> int:
        return len(self._by_txn)


def lookup(index: OutcomeIndex, origin: str, xid: int, began_gid: int, *, this_node: str, phase: str,
           online: set[str], committed_here: int, origin_db_status: str = "",
           in_flight: bool = False) -> dict[str, object]:
    """The answer for transaction ``xid`` of node ``origin``, begun when that node had committed
    ``began_gid``: ``{"outcome": "committed" | "aborted" | "in doubt" | "unknown", "gid", "detail"}``.

    ``origin_db_status``: when this node is the origin, what its PostgreSQL says of the
    transaction (``pg_xact_status``: "committed", "aborted", "in progress"; "" otherwise);
    ``in_flight``: a writeset of it is on its way to the bus from this node."""
    found = index.get(origin, xid)
    if found is not None and found.gid > began_gid:
        if found.committed:
            here = "committed on this node" if committed_here >= found.gid else \
                f"certified; this node has committed up to GID {committed_here} and commits it in turn"
            return {"outcome": "committed", "gid": found.gid,
                    "detail": f"certified at GID {found.gid}: it commits on every node ({here})"}
        return {"outcome": "aborted", "gid": found.gid,
                "detail": f"it failed certification at GID {found.gid} and committed nowhere: {found.reason}"}
    if phase != "online":
        return {"outcome": "in doubt", "gid": None,
                "detail": f"this node is {phase}, not in the primary component: ask a node that is online"}
    if began_gid < index.complete_after:
        return {"outcome": "unknown", "gid": None,
                "detail": f"this node remembers outcomes from GID {index.complete_after + 1} on, and the transaction "
                          f"began at GID {began_gid}: ask a node that has been online longer"}
    if origin == this_node:
        if in_flight:
            return {"outcome": "in doubt", "gid": None,
                    "detail": "its writeset is on its way to being ordered: ask again in a moment"}
        if origin_db_status == "in progress":
            return {"outcome": "in doubt", "gid": None,
                    "detail": "the transaction is still running on this node (it has not asked to commit yet, or "
                              "waits for its turn)"}
        if origin_db_status == "aborted":
            return {"outcome": "aborted", "gid": None,
                    "detail": "it rolled back on this node, its origin, before its writeset was ordered"}
        if origin_db_status == "committed":
            return {"outcome": "committed", "gid": None,
                    "detail": "it committed on this node and wrote nothing that Chorus replicates"}
        return {"outcome": "unknown", "gid": None,
                "detail": "this node's PostgreSQL no longer knows the transaction (older than its commit log)"}
    if origin not in online:
        return {"outcome": "aborted", "gid": None,
                "detail": f"its node {origin} left the primary component before its writeset was ordered; "
                          "a writeset its node had not sent by then is never ordered"}
    return {"outcome": "in doubt", "gid": None,
            "detail": f"not ordered yet, and its node {origin} is online and may still send it: ask {origin}, "
                      "which knows whether the transaction still runs"}
