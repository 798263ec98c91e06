# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled certification index: the same rule and the same index as certifier.py's
``PyCertifier`` (the reference), compiled with Cython. certifier.py picks one at import
(``CHORUS_IMPL=python|c``); tests/unit/test_impl.py checks with Hypothesis that both give the
same verdicts, the same purges and the same snapshots for the same sequences, and that a snapshot
of either restores into the other: every node must certify alike whichever it runs.

GIDs are unsigned 64-bit here, as on the wire: a value the bus carries always fits.

It makes certifier.py's own objects (``Verdict``, ``OK``), which certifier.py hands it
(:func:`bind`): this module imports no other module of Chorus.
"""

from collections import deque
import json

cdef object Verdict, OK, KeyMode


def bind(certifier) -> None:
    """Take the classes and constants of the certifier module (once, at its import)."""
    global Verdict, OK, KeyMode
    Verdict, OK, KeyMode = certifier.Verdict, certifier.OK, certifier.KeyMode


cdef inline bint conflict(long a, long b):
    """Exclusive conflicts with every mode; update with update; reference only with exclusive."""
    return a == 3 or b == 3 or (a == 2 and b == 2)


cdef class _Slot:
    """Newest (gid, origin) for one key and mode, and the newest from another origin."""
    cdef public unsigned long long gid, gid2
    cdef public str origin, origin2

    def __cinit__(self):
        self.gid = 0
        self.gid2 = 0
        self.origin = ""
        self.origin2 = ""

    cdef inline void add(self, unsigned long long gid, str origin):
        if origin != self.origin:
            self.gid2, self.origin2 = self.gid, self.origin
        self.gid, self.origin = gid, origin


cdef class Certifier:
    """The certification index (certifier.PyCertifier's, compiled). Pure: no I/O."""
    cdef public unsigned long long horizon
    cdef dict _index  # hashed key -> {KeyMode: _Slot}, modes in the order they were first indexed
    cdef object _by_gid  # deque of (gid, [hashed keys])
    cdef set _schema  # GIDs of recorded schema changes above the horizon

    def __init__(self, unsigned long long horizon=0):
        self.horizon = horizon
        self._index = {}
        self._by_gid = deque()
        self._schema = set()

    def __len__(self):
        return len(self._index)

    def certify(self, unsigned long long gid, str origin, unsigned long long last_seen, keys):
        """Certify writeset ``gid`` and, if it passes, index its keys."""
        cdef list ks = list(keys)
        cdef list hashes = []
        cdef dict slots
        cdef _Slot slot
        cdef unsigned long long other_gid
        cdef str other_origin, by
        cdef Py_ssize_t i, n = len(ks)
        cdef long kmode
        if last_seen < self.horizon:
            return Verdict(False, f"snapshot too old: the transaction saw GID {last_seen}, "
                                  f"certification history starts at GID {self.horizon}")
        for i in range(n):
            k = ks[i]
            h = k.digest or k.hashed()
            hashes.append(h)
            slots = self._index.get(h)
            if not slots:
                continue
            kmode = k.mode
            for mode, s in slots.items():
                if not conflict(kmode, mode):
                    continue
                slot = <_Slot>s
                if slot.origin != origin:
                    other_gid, other_origin = slot.gid, slot.origin
                else:
                    other_gid, other_origin = slot.gid2, slot.origin2
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
        self._index_keys(gid, origin, ks, hashes)
        return OK

    cdef void _index_keys(self, unsigned long long gid, str origin, list ks, list hashes):
        cdef Py_ssize_t i
        cdef dict slots
        cdef _Slot slot
        for i in range(len(ks)):
            h = hashes[i]
            mode = ks[i].mode
            slots = self._index.get(h)
            if slots is None:
                slots = {}
                self._index[h] = slots
            s = slots.get(mode)
            if s is None:
                slot = _Slot()
                slots[mode] = slot
            else:
                slot = <_Slot>s
            slot.add(gid, origin)
        if hashes:
            self._by_gid.append((gid, hashes))

    def record(self, unsigned long long gid, str origin, keys):
        """Index the keys of schema change ``gid`` from ``origin`` without certifying it
        (certifier.PyCertifier.record)."""
        cdef list ks = list(keys)
        self._index_keys(gid, origin, ks, [k.hashed() for k in ks])
        if ks:
            self._schema.add(gid)

    def purge(self, horizon_in):
        """Forget entries with GID <= ``horizon``; returns how many keys were dropped. (Any
        integer: one computed from a forged progress report may be negative.)"""
        cdef unsigned long long horizon, dropped = 0
        cdef dict slots
        if horizon_in <= self.horizon:
            return 0
        horizon = horizon_in
        self.horizon = horizon
        self._schema = {g for g in self._schema if g > horizon}
        while self._by_gid and self._by_gid[0][0] <= horizon:
            _, hashes = self._by_gid.popleft()
            for h in hashes:
                slots = self._index.get(h)
                if slots is not None and all((<_Slot>s).gid <= horizon for s in slots.values()):
                    del self._index[h]
                    dropped += 1
        return dropped

    def snapshot(self):
        """The index as bytes, for a joining node (the same bytes certifier.PyCertifier writes)."""
        entries = [[gid, [h.hex() for h in hashes]] for gid, hashes in self._by_gid]
        index = {
            h.hex(): {str(int(m)): [(<_Slot>s).gid, (<_Slot>s).origin, (<_Slot>s).gid2, (<_Slot>s).origin2]
                      for m, s in slots.items()}
            for h, slots in self._index.items()
        }
        return json.dumps({"horizon": self.horizon, "index": index, "by_gid": entries,
                           "schema": sorted(self._schema)}, separators=(",", ":")).encode()

    @classmethod
    def restore(cls, data):
        cdef Certifier c
        cdef _Slot s
        obj = json.loads(data)
        c = cls(int(obj["horizon"]))
        for h, slots in obj["index"].items():
            d = {}
            for m, (g, o, g2, o2) in slots.items():
                s = _Slot()
                s.gid, s.origin, s.gid2, s.origin2 = int(g), str(o), int(g2), str(o2)
                d[KeyMode(int(m))] = s
            c._index[bytes.fromhex(h)] = d
        for gid, hashes in obj["by_gid"]:
            c._by_gid.append((int(gid), [bytes.fromhex(h) for h in hashes]))
        c._schema = {int(g) for g in obj.get("schema", ())}
        return c
