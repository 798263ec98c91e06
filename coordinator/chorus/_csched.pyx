# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled apply scheduler: the same dependency tracking as commit/scheduler.py's
``PyScheduler`` (the reference), compiled with Cython. commit/scheduler.py picks one at import
(``CHORUS_IMPL=python|c``); tests/unit/test_impl_scheduler.py checks with Hypothesis that both
dispatch the same runs in the same order for the same sequences of registrations, commits,
replays and failed attempts. This module imports no other module of Chorus.
"""

from collections import deque

cdef enum:
    UPDATE = 2  # wire.KeyMode
    EXCLUSIVE = 3


cdef class _KeyState:
    """The pending holders of one key (commit/scheduler.py's _KeyState)."""
    cdef readonly long long holders, last_exclusive, last_update
    cdef readonly list since_exclusive

    def __cinit__(self):
        self.holders = 0
        self.last_exclusive = 0
        self.last_update = 0
        self.since_exclusive = []


cdef class _Item:
    cdef long long gid, follows
    cdef bint local, dispatched, replay, barrier, alone
    cdef list keys
    cdef set deps

    def __cinit__(self, long long gid, bint local, list keys, bint barrier, long long follows):
        self.gid = gid
        self.local = local
        self.keys = keys
        self.deps = set()
        self.dispatched = False
        self.replay = False
        self.barrier = barrier
        self.follows = follows
        self.alone = False


def _always(run):
    return True


cdef class Scheduler:
    """Dependency tracking for apply (scheduler.PyScheduler's, compiled)."""
    cdef dict _items, _dependents
    cdef readonly dict _keys  # read by the white-box tests (tests/unit/test_scheduler.py)
    cdef object _remote  # deque of undispatched remote GIDs, in order
    cdef list _replays
    cdef long long _barrier, _last

    def __init__(self):
        self._items = {}
        self._keys = {}
        self._dependents = {}
        self._remote = deque()
        self._replays = []
        self._barrier = 0
        self._last = 0

    def __len__(self):
        return len(self._items)

    @property
    def queued(self):
        return len(self._remote) + len(self._replays)

    def add(self, long long gid, keys, bint local, bint barrier=False):
        """Register certified writeset ``gid`` (scheduler.PyScheduler.add)."""
        cdef _Item item = _Item(gid, local, list(keys), barrier, self._last)
        cdef _KeyState ks
        cdef long mode
        self._last = gid
        if barrier:
            for other in self._items:
                self._depend(item, other)
            self._barrier = gid
        else:
            self._depend(item, self._barrier)
        self._items[gid] = item
        for h, m in item.keys:
            mode = m
            k = self._keys.get(h)
            if k is None:
                ks = _KeyState()
                self._keys[h] = ks
            else:
                ks = <_KeyState>k
            self._depend(item, ks.last_exclusive)
            if mode == EXCLUSIVE:
                for other in ks.since_exclusive:
                    self._depend(item, other)
                ks.last_exclusive, ks.since_exclusive = gid, []
            else:
                if mode == UPDATE:
                    self._depend(item, ks.last_update)
                    ks.last_update = gid
                ks.since_exclusive.append(gid)
                if len(ks.since_exclusive) > 2 * ks.holders + 16:  # drop the committed ones
                    ks.since_exclusive = [g for g in ks.since_exclusive if g in self._items]
            ks.holders += 1
        if not local:
            self._remote.append(gid)

    cdef inline void _depend(self, _Item item, other):
        cdef set s
        if other != item.gid and other in self._items:
            item.deps.add(other)
            d = self._dependents.get(other)
            if d is None:
                s = set()
                self._dependents[other] = s
            else:
                s = <set>d
            s.add(item.gid)

    def replay(self, long long gid):
        """A local writeset's backend could not commit it: apply it from its writeset."""
        cdef _Item item
        it = self._items.get(gid)
        if it is not None:
            item = <_Item>it
            if item.local and not item.replay:
                item.replay = True
                self._replays.append(gid)

    def replay_all_from(self, long long gid):
        """After a database restart: every uncommitted writeset is (re)applied, in order."""
        cdef _Item item
        out = []
        for g in sorted(self._items):
            item = <_Item>self._items[g]
            item.dispatched = False
            if item.local:
                item.replay = True
            out.append(g)
        self._replays = [g for g in out if (<_Item>self._items[g]).local]
        self._remote = deque(g for g in out if not (<_Item>self._items[g]).local)
        return out

    def next_replay(self):
        """The next local writeset to replay, if any, once what it depends on has committed."""
        if not self._replays or (<_Item>self._items[self._replays[0]]).deps:
            return None
        gid = self._replays.pop(0)
        (<_Item>self._items[gid]).dispatched = True
        return gid

    def ready_remote(self, int limit):
        """Up to ``limit`` remote GIDs to dispatch now, in GID order (runs of one)."""
        return [run[0] for run in self.ready_runs(limit, 1)]

    def ready_runs(self, int limit, int max_run, fits=_always):
        """Up to ``limit`` runs of remote GIDs to dispatch now (scheduler.PyScheduler.ready_runs)."""
        cdef list out = []
        cdef list run
        cdef _Item head, nxt
        remote = self._remote
        while remote and len(out) < limit:
            head = <_Item>self._items[remote[0]]
            if head.deps:
                break
            remote.popleft()
            head.dispatched = True
            run = [head.gid]
            while not head.barrier and not head.alone and len(run) < max_run and remote:
                nxt = <_Item>self._items[remote[0]]
                if nxt.follows != run[len(run) - 1] or nxt.barrier or nxt.alone or not nxt.deps.issubset(run) \
                        or not fits(run + [nxt.gid]):
                    break
                remote.popleft()
                nxt.dispatched = True
                run.append(nxt.gid)
            out.append(run)
        return out

    def redispatch(self, long long gid):
        """An apply attempt failed transiently: ``gid`` goes back to the front, alone from now on."""
        cdef _Item item
        it = self._items.get(gid)
        if it is None:
            return
        item = <_Item>it
        item.dispatched = False
        item.alone = True
        if item.local:
            self._replays.insert(0, gid)
        else:
            self._remote.appendleft(gid)
            self._remote = deque(sorted(self._remote))

    def committed(self, long long gid):
        """``gid`` committed on this node: release what waited for it."""
        cdef _Item item, dep
        cdef _KeyState ks
        it = self._items.pop(gid, None)
        if it is None:
            return
        item = <_Item>it
        for h, _ in item.keys:
            k = self._keys.get(h)
            if k is not None:
                ks = <_KeyState>k
                ks.holders -= 1
                if ks.holders <= 0:
                    del self._keys[h]
        for d in self._dependents.pop(gid, ()):
            dp = self._items.get(d)
            if dp is not None:
                (<_Item>dp).deps.discard(gid)
        if item.replay and gid in self._replays:
            self._replays.remove(gid)
        if not item.local and not item.dispatched:  # committed without this node applying it
            try:
                self._remote.remove(gid)
            except ValueError:
                pass

    def committed_upto(self, long long gid):
        for g in [g for g in self._items if g <= gid]:
            self.committed(g)

    def describe(self, long long gid):
        cdef _Item item
        it = self._items.get(gid)
        if it is None:
            return {"scheduled": False}
        item = <_Item>it
        return {"scheduled": True, "local": item.local, "dispatched": item.dispatched,
                "replay": item.replay, "waits_for": sorted(item.deps)[:5]}

    def pending(self):
        return sorted(self._items)
