"""Dependency tracking for apply (seed streams-parallel-apply 4.5; docs/ARCHITECTURE.md invariant 4).

Every certified writeset, local or remote, is registered in GID order with its hashed keys. A
writeset depends on every earlier uncommitted one that shares a key in a conflicting mode. Remote
writesets are dispatched to apply sessions in GID order (head of line: an earlier remote
writeset is always dispatched before a later one, so a session waiting for its commit turn never
holds up one that comes before it), each once its dependencies have committed. Local writesets
are committed by their own backends; one whose backend could not commit it is *replayed*: it is
dispatched at once, ahead of everything (it is the earliest the others wait for).

Two implementations of one interface (:class:`ApplyScheduler`): :class:`PyScheduler`, the
reference, and the compiled one in ``chorus/_csched.pyx``; :data:`Scheduler` is the one chosen at
import, as certifier.py chooses (``CHORUS_IMPL``, :data:`IMPL`). tests/unit/test_impl_scheduler.py
holds them to the same dispatches.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Protocol

from chorus import impl
from chorus.wire import KeyMode


@dataclass
class _KeyState:
    """The pending holders of one key, kept so that registering a writeset costs O(its keys), not
    O(the holders): conflicts chain (each holder already waits for the conflicting holders before
    it), so waiting for the newest conflicting holder of each kind covers all earlier ones."""

    holders: int = 0  # pending writesets holding the key, any mode
    last_exclusive: int = 0
    last_update: int = 0
    since_exclusive: list[int] = field(default_factory=list)  # non-exclusive holders after it


@dataclass
class _Item:
    gid: int
    local: bool
    keys: list[tuple[bytes, KeyMode]]
    deps: set[int] = field(default_factory=set)
    dispatched: bool = False
    replay: bool = False
    barrier: bool = False
    follows: int = 0  # the GID registered just before this one (certified GIDs are consecutive)
    alone: bool = False  # an attempt failed: it may have committed, so it is never part of a run again


class ApplyScheduler(Protocol):
    """What the commit pipeline asks of a scheduler (either implementation)."""

    def __len__(self) -> int: ...

    @property
    def queued(self) -> int: ...

    def add(self, gid: int, keys: Iterable[tuple[bytes, KeyMode]], local: bool, barrier: bool = False) -> None: ...

    def replay(self, gid: int) -> None: ...

    def replay_all_from(self, gid: int) -> list[int]: ...

    def next_replay(self) -> Optional[int]: ...

    def ready_remote(self, limit: int) -> list[int]: ...

    def ready_runs(self, limit: int, max_run: int, fits: Callable[[list[int]], bool] = ...) -> list[list[int]]: ...

    def redispatch(self, gid: int) -> None: ...

    def committed(self, gid: int) -> None: ...

    def committed_upto(self, gid: int) -> None: ...

    def describe(self, gid: int) -> dict[str, object]: ...

    def pending(self) -> list[int]: ...


class PyScheduler:
    def __init__(self) -> None:
        self._items: dict[int, _Item] = {}
        self._keys: dict[bytes, _KeyState] = {}
        self._dependents: dict[int, set[int]] = {}
        self._remote: deque[int] = deque()  # undispatched remote GIDs, in order
        self._replays: list[int] = []
        self._barrier = 0  # the newest schema change registered
        self._last = 0  # the newest GID registered

    def __len__(self) -> int:
        return len(self._items)

    @property
    def queued(self) -> int:
        return len(self._remote) + len(self._replays)

    def add(self, gid: int, keys: Iterable[tuple[bytes, KeyMode]], local: bool,
            barrier: bool = False) -> None:
        """Register certified writeset ``gid`` (GIDs must arrive in increasing order). A
        ``barrier`` (a schema change) waits for every earlier writeset and every later one waits
        for it."""
        item = _Item(gid, local, list(keys), barrier=barrier, follows=self._last)
        self._last = gid
        if barrier:
            for other in self._items:
                self._depend(item, other)
            self._barrier = gid
        else:
            self._depend(item, self._barrier)
        self._items[gid] = item
        for h, mode in item.keys:
            ks = self._keys.get(h)
            if ks is None:
                ks = self._keys[h] = _KeyState()
            self._depend(item, ks.last_exclusive)
            if mode == KeyMode.EXCLUSIVE:
                for other in ks.since_exclusive:
                    self._depend(item, other)
                ks.last_exclusive, ks.since_exclusive = gid, []
            else:
                if mode == KeyMode.UPDATE:
                    self._depend(item, ks.last_update)
                    ks.last_update = gid
                ks.since_exclusive.append(gid)
                if len(ks.since_exclusive) > 2 * ks.holders + 16:  # drop the committed ones
                    ks.since_exclusive = [g for g in ks.since_exclusive if g in self._items]
            ks.holders += 1
        if not local:
            self._remote.append(gid)

    def _depend(self, item: _Item, other: int) -> None:
        if other != item.gid and other in self._items:
            item.deps.add(other)
            self._dependents.setdefault(other, set()).add(item.gid)

    def replay(self, gid: int) -> None:
        """A local writeset's backend could not commit it: apply it from its writeset."""
        item = self._items.get(gid)
        if item is not None and item.local and not item.replay:
            item.replay = True
            self._replays.append(gid)

    def replay_all_from(self, gid: int) -> list[int]:
        """After a database restart: every uncommitted writeset above ``gid`` must be (re)applied,
        local ones by replay. Returns the GIDs, in order."""
        out = []
        for g in sorted(self._items):
            item = self._items[g]
            item.dispatched = False
            if item.local:
                item.replay = True
            out.append(g)
        self._replays = [g for g in out if self._items[g].local]
        self._remote = deque(g for g in out if not self._items[g].local)
        return out

    def next_replay(self) -> int | None:
        """The next local writeset to replay, if any (replays use their own session), once what
        it depends on has committed: applied earlier, it would take rows an earlier writeset
        needs and then wait for that one's commit turn (a simulated node stalled so after its
        PostgreSQL restarted, replaying its own writesets beside the others')."""
        if not self._replays or self._items[self._replays[0]].deps:
            return None
        gid = self._replays.pop(0)
        self._items[gid].dispatched = True
        return gid

    def ready_remote(self, limit: int) -> list[int]:
        """Up to ``limit`` remote GIDs to dispatch now, in GID order (runs of one)."""
        return [run[0] for run in self.ready_runs(limit, 1)]

    def ready_runs(self, limit: int, max_run: int, fits: Callable[[list[int]], bool] = lambda run: True
                   ) -> list[list[int]]:
        """Up to ``limit`` runs of remote GIDs to dispatch now, in GID order. A run is a GID that is
        ready and the GIDs registered right after it (no other writeset between them) that depend
        on nothing but the run's earlier GIDs: applied in one transaction, in order, they need
        nothing else. At most ``max_run`` GIDs, and only while ``fits(run)``; a schema change,
        and a writeset whose earlier attempt failed, is alone."""
        out: list[list[int]] = []
        while self._remote and len(out) < limit:
            head = self._items[self._remote[0]]
            if head.deps:
                break
            self._remote.popleft()
            head.dispatched = True
            run = [head.gid]
            while not head.barrier and not head.alone and len(run) < max_run and self._remote:
                nxt = self._items[self._remote[0]]
                if nxt.follows != run[-1] or nxt.barrier or nxt.alone or not nxt.deps.issubset(run) \
                        or not fits(run + [nxt.gid]):
                    break
                self._remote.popleft()
                nxt.dispatched = True
                run.append(nxt.gid)
            out.append(run)
        return out

    def redispatch(self, gid: int) -> None:
        """An apply attempt failed transiently; put ``gid`` back at the front. The attempt may
        have committed before its connection broke, so from now on ``gid`` is applied alone: in
        a run with GIDs after it, a committed one would make the run partly committed (the
        extension refuses that), alone it is found committed (CH001) and done."""
        item = self._items.get(gid)
        if item is None:
            return
        item.dispatched = False
        item.alone = True
        if item.local:
            self._replays.insert(0, gid)
        else:
            self._remote.appendleft(gid)
            self._remote = deque(sorted(self._remote))

    def committed(self, gid: int) -> None:
        """``gid`` committed on this node: release what waited for it."""
        item = self._items.pop(gid, None)
        if item is None:
            return
        for h, _ in item.keys:
            ks = self._keys.get(h)
            if ks is not None:
                ks.holders -= 1
                if ks.holders <= 0:
                    del self._keys[h]
        for d in self._dependents.pop(gid, ()):
            dep = self._items.get(d)
            if dep is not None:
                dep.deps.discard(gid)
        if item.replay and gid in self._replays:
            self._replays.remove(gid)
        if not item.local and not item.dispatched:  # committed without this node applying it
            try:
                self._remote.remove(gid)
            except ValueError:
                pass

    def committed_upto(self, gid: int) -> None:
        for g in [g for g in self._items if g <= gid]:
            self.committed(g)

    def describe(self, gid: int) -> dict[str, object]:
        item = self._items.get(gid)
        if item is None:
            return {"scheduled": False}
        return {"scheduled": True, "local": item.local, "dispatched": item.dispatched,
                "replay": item.replay, "waits_for": sorted(item.deps)[:5]}

    def pending(self) -> list[int]:
        return sorted(self._items)


_csched = impl.compiled("_csched")
IMPL = impl.chosen(_csched)
Scheduler: Callable[[], ApplyScheduler] = _csched.Scheduler if IMPL == "c" and _csched is not None else PyScheduler
