"""Deterministic certification (docs/ARCHITECTURE.md invariant 2; seed section 6).

A writeset W with snapshot watermark ``last_seen`` fails iff some certified W' with
``last_seen < GID(W') < GID(W)``, from another node, holds a key of W in a conflicting mode.
Writesets are certified in GID order, so every indexed entry has a smaller GID than W.

Per hashed key and mode the index keeps the newest GID and the newest GID from a *different*
origin than that one: together they answer "the newest GID from any origin other than X" in
O(1). Entries at or below the purge horizon are dropped; a writeset whose ``last_seen`` is below
the horizon fails as "snapshot too old" because the index can no longer prove it safe.

A schema change's keys are recorded under its origin like any writeset's: only other nodes'
schema changes count against a transaction (on its own node PostgreSQL's locks already order
them, issue 35). The index remembers which GIDs were schema changes, for the message.

Two implementations of one interface (:class:`CertificationIndex`): :class:`PyCertifier`, the
reference, and the compiled one in ``chorus/_ccert.pyx``. :data:`Certifier` is the one chosen at
import: the compiled one when it is built, unless ``CHORUS_IMPL=python`` (``CHORUS_IMPL=c``
insists on it); :data:`IMPL` says which. Both certify, purge and snapshot alike
(tests/unit/test_impl.py), so nodes running either agree.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Optional, Protocol

from chorus import impl
from chorus.wire import Key, KeyMode, modes_conflict

_MODES = (KeyMode.REFERENCE, KeyMode.UPDATE, KeyMode.EXCLUSIVE)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    conflict_gid: int = 0
    conflict_origin: str = ""
    key: Optional[Key] = None  # the key it conflicted on (none: snapshot too old)


OK = Verdict(True)


class _Slot:
    """Newest (gid, origin) for one key and mode, and the newest from another origin."""

    __slots__ = ("gid", "origin", "gid2", "origin2")

    def __init__(self) -> None:
        self.gid = 0
        self.origin = ""
        self.gid2 = 0
        self.origin2 = ""

    def add(self, gid: int, origin: str) -> None:
        if origin != self.origin:
            self.gid2, self.origin2 = self.gid, self.origin
        self.gid, self.origin = gid, origin

    def newest_not_from(self, origin: str) -> tuple[int, str]:
        if self.origin != origin:
            return self.gid, self.origin
        return self.gid2, self.origin2


class CertificationIndex(Protocol):
    """What the replicator asks of a certification index (either implementation)."""

    horizon: int

    def __len__(self) -> int: ...

    def certify(self, gid: int, origin: str, last_seen: int, keys: Iterable[Key]) -> Verdict: ...

    def record(self, gid: int, origin: str, keys: Iterable[Key]) -> None: ...

    def purge(self, horizon: int) -> int: ...

    def snapshot(self) -> bytes: ...


class CertifierClass(Protocol):
    """An implementation: made empty from a horizon, or restored from a snapshot."""

    def __call__(self, horizon: int = 0) -> CertificationIndex: ...

    def restore(self, data: bytes) -> CertificationIndex: ...


class PyCertifier:
    """The certification index. Pure: no I/O, same inputs give the same verdicts everywhere."""

    def __init__(self, horizon: int = 0) -> None:
        self.horizon = horizon
        self._index: dict[bytes, dict[KeyMode, _Slot]] = {}
        self._by_gid: deque[tuple[int, list[bytes]]] = deque()
        self._schema: set[int] = set()  # GIDs of recorded schema changes above the horizon

    def __len__(self) -> int:
        return len(self._index)

    def certify(self, gid: int, origin: str, last_seen: int, keys: Iterable[Key]) -> Verdict:
        """Certify writeset ``gid`` and, if it passes, index its keys."""
        keys = list(keys)
        if last_seen < self.horizon:
            return Verdict(False, f"snapshot too old: the transaction saw GID {last_seen}, "
                                  f"certification history starts at GID {self.horizon}")
        hashed = [(k, k.hashed()) for k in keys]
        for k, h in hashed:
            slots = self._index.get(h)
            if not slots:
                continue
            for mode, slot in slots.items():
                if not modes_conflict(k.mode, mode):
                    continue
                other_gid, other_origin = slot.newest_not_from(origin)
                if other_gid > last_seen:
                    by = (f"the schema change GID {other_gid} from node {other_origin} altered it"
                          if other_gid in self._schema else f"GID {other_gid} from node {other_origin} wrote it")
                    return Verdict(
                        False,
                        f"certification conflict on {k.describe()}: {by} after this "
                        f"transaction's snapshot (last seen GID {last_seen})",
                        other_gid,
                        other_origin,
                        k,
                    )
        for k, h in hashed:
            self._index.setdefault(h, {}).setdefault(k.mode, _Slot()).add(gid, origin)
        if hashed:
            self._by_gid.append((gid, [h for _, h in hashed]))
        return OK

    def record(self, gid: int, origin: str, keys: Iterable[Key]) -> None:
        """Index the keys of schema change ``gid`` from node ``origin`` without certifying it: a
        schema change runs in total order and never fails certification; instead, writesets from
        other nodes that did not see it and touch what it touched fail. On its own node
        PostgreSQL's locks order it with the node's other sessions, as on a single server, so its
        keys count against other nodes' writesets only (docs/ARCHITECTURE.md invariant 2). Recorded once its
        outcome is known (it ran), before any writeset ordered after it is certified
        (replicator.py)."""
        keys = list(keys)
        hashed = [k.hashed() for k in keys]
        for k, h in zip(keys, hashed):
            self._index.setdefault(h, {}).setdefault(k.mode, _Slot()).add(gid, origin)
        if hashed:
            self._by_gid.append((gid, hashed))
            self._schema.add(gid)

    def purge(self, horizon: int) -> int:
        """Forget entries with GID <= ``horizon``; returns how many keys were dropped."""
        if horizon <= self.horizon:
            return 0
        self.horizon = horizon
        self._schema = {g for g in self._schema if g > horizon}
        dropped = 0
        while self._by_gid and self._by_gid[0][0] <= horizon:
            _, hashes = self._by_gid.popleft()
            for h in hashes:
                slots = self._index.get(h)
                if slots is not None and all(s.gid <= horizon for s in slots.values()):
                    del self._index[h]
                    dropped += 1
        return dropped

    def snapshot(self) -> bytes:
        """The index as bytes, for a joining node (restored with :meth:`restore`)."""
        entries = []
        for gid, hashes in self._by_gid:
            entries.append([gid, [h.hex() for h in hashes]])
        index = {
            h.hex(): {str(int(m)): [s.gid, s.origin, s.gid2, s.origin2] for m, s in slots.items()}
            for h, slots in self._index.items()
        }
        return json.dumps({"horizon": self.horizon, "index": index, "by_gid": entries,
                           "schema": sorted(self._schema)}, separators=(",", ":")).encode()

    @classmethod
    def restore(cls, data: bytes) -> "PyCertifier":
        obj = json.loads(data)
        c = cls(int(obj["horizon"]))
        for h, slots in obj["index"].items():
            d: dict[KeyMode, _Slot] = {}
            for m, (g, o, g2, o2) in slots.items():
                s = _Slot()
                s.gid, s.origin, s.gid2, s.origin2 = int(g), str(o), int(g2), str(o2)
                d[KeyMode(int(m))] = s
            c._index[bytes.fromhex(h)] = d
        for gid, hashes in obj["by_gid"]:
            c._by_gid.append((int(gid), [bytes.fromhex(h) for h in hashes]))
        c._schema = {int(g) for g in obj.get("schema", ())}
        return c


_ccert = impl.compiled("_ccert")
if _ccert is not None:
    _ccert.bind(sys.modules[__name__])
IMPL = impl.chosen(_ccert)
Certifier: CertifierClass = _ccert.Certifier if IMPL == "c" and _ccert is not None else PyCertifier
