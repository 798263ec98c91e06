"""The data plane's native core, bound with cffi (docs/NATIVE.md section 3). What exists of it so
far, the first piece of step 1: :class:`NativeCertifier` (``native/cert.c``) and
:class:`NativeScheduler` (``native/sched.c``). Each has the interface of its Python reference
(certifier.PyCertifier, commit/scheduler.PyScheduler) and gives the same outputs for the same
calls (tests/unit/test_dataplane_cert.py, test_dataplane_sched.py). Nothing on the coordinator's
path uses them yet. In the engine of the later steps they are reached from C, not through these
classes. The classes are here for the differential tests, the micro-benchmark
(bench/dataplane_micro.py), and Python callers that want the C index.

What stays on the Python side of the boundary:

- the node names: the C core knows origins as small integers, mapped here per object, with 0
  for ``""``;
- the reason texts of verdicts: C says which key, which GID and origin, and whether that GID was
  a schema change, and :meth:`NativeCertifier.certify` words it as PyCertifier does;
- the snapshot's JSON: C lists its keys, history and schema GIDs in PyCertifier's order, and the
  bytes are made here exactly as PyCertifier makes them.

The compiled module ``chorus.dataplane._native`` is optional (``dataplane/build.py``). Without it
:func:`available` is False and constructing a class raises ImportError. :func:`use` installs a
module built elsewhere (the tests and the micro-benchmark build one into a directory of their own).
"""

from __future__ import annotations

import hashlib
import json
from types import ModuleType
from typing import Any, Callable, Iterable, Optional

from chorus.certifier import OK, Verdict
from chorus.wire import Key, KeyMode

# Each object's byte budget (ch_core.h): past it an operation fails with MemoryError and changes
# nothing. Large enough not to bind in practice, bounded so a runaway backlog fails cleanly.
DEFAULT_BYTES = 8 << 30

_CH_EINVAL, _CH_EFULL, _CH_ENOMEM, _CH_ESTATE, _CH_ECALLBACK = -1, -2, -3, -4, -5
_CERT_OK, _CERT_TOO_OLD = 0, 1
_MAX_COUNT = 1 << 62  # limits beyond any queue, clamped to fit size_t

_mod: Any = None


def use(module: ModuleType) -> None:
    """Bind to ``module``, the compiled ``chorus.dataplane._native`` (from wherever it was built)."""
    global _mod
    if _mod is module:
        return

    @module.ffi.def_extern(name="ch_py_fits")  # type: ignore[untyped-decorator]
    def _fits(arg: Any, run: Any, n: int) -> int:
        call: _Fits = module.ffi.from_handle(arg)
        try:
            return 1 if call.fits(module.ffi.unpack(run, n)) else 0
        except BaseException as e:  # raised again by ready_runs, as PyScheduler would let it through
            call.error = e
            return -1

    _mod = module


def available() -> bool:
    """Whether the compiled core is loaded."""
    return _mod is not None


def module() -> Any:
    """The bound cffi module (its ``ffi`` and ``lib``), for a caller that packs its own
    arguments, as bench/dataplane_micro.py does to time the C core without this module's
    classes."""
    return _lib()


def _lib() -> Any:
    if _mod is None:
        raise ImportError("the data plane's native core is not built (python coordinator/chorus/dataplane/build.py)")
    return _mod


def _check(rc: int) -> None:
    if rc >= 0:
        return
    if rc == _CH_EINVAL:
        raise ValueError("the native core refused its arguments")
    if rc == _CH_EFULL:
        raise MemoryError("the native core's byte budget is spent")
    if rc == _CH_ENOMEM:
        raise MemoryError("the native core could not allocate")
    if rc == _CH_ESTATE:
        raise KeyError("a queue of the native scheduler names a GID that is not registered")
    raise RuntimeError(f"the native core failed ({rc})")


try:
    from chorus.dataplane import _native  # type: ignore[attr-defined]
except ImportError:
    pass
else:
    use(_native)


class NativeCertifier:
    """certifier.PyCertifier's index in C (native/cert.c). Pure: no I/O."""

    def __init__(self, horizon: int = 0, max_bytes: int = DEFAULT_BYTES) -> None:
        m = _lib()
        self._ffi, self._lib = m.ffi, m.lib
        # the caller's memory for the context (ch_core.h), aligned for uint64_t
        self._mem = self._ffi.new("uint64_t[]", (self._lib.ch_cert_size() + 7) // 8)
        self._c = self._ffi.cast("ch_cert *", self._mem)
        _check(self._lib.ch_cert_init(self._c, horizon, max_bytes))
        self._live = True
        self._v = self._ffi.new("ch_cert_verdict *")
        self._dropped = self._ffi.new("size_t *")
        self._names = [""]  # origin id -> node name
        self._ids = {"": 0}

    def __del__(self) -> None:
        if getattr(self, "_live", False):
            self._live = False
            self._lib.ch_cert_free(self._c)

    def _origin(self, name: str) -> int:
        oid = self._ids.get(name)
        if oid is None:
            oid = self._ids[name] = len(self._names)
            self._names.append(name)
        return oid

    @property
    def horizon(self) -> int:
        return int(self._lib.ch_cert_horizon(self._c))

    def __len__(self) -> int:
        return int(self._lib.ch_cert_len(self._c))

    @property
    def nbytes(self) -> int:
        """What the index holds in C, in bytes."""
        return int(self._lib.ch_cert_bytes(self._c))

    def certify(self, gid: int, origin: str, last_seen: int, keys: Iterable[Key]) -> Verdict:
        """Certify writeset ``gid`` and, if it passes, index its keys (PyCertifier.certify)."""
        ks = list(keys)
        digests, modes = _packed(ks)
        _check(self._lib.ch_cert_certify(self._c, gid, self._origin(origin), last_seen, digests, modes, len(ks),
                                         self._v))
        v = self._v
        if v.kind == _CERT_OK:
            return OK
        if v.kind == _CERT_TOO_OLD:
            return Verdict(False, f"snapshot too old: the transaction saw GID {last_seen}, "
                                  f"certification history starts at GID {self.horizon}")
        k, other_gid, other_origin = ks[v.key], int(v.gid), self._names[v.origin]
        by = (f"the schema change GID {other_gid} from node {other_origin} altered it"
              if v.schema else f"GID {other_gid} from node {other_origin} wrote it")
        return Verdict(False, f"certification conflict on {k.describe()}: {by} after this "
                              f"transaction's snapshot (last seen GID {last_seen})", other_gid, other_origin, k)

    def record(self, gid: int, origin: str, keys: Iterable[Key]) -> None:
        """Index the keys of schema change ``gid`` without certifying it (PyCertifier.record)."""
        ks = list(keys)
        digests, modes = _packed(ks)
        _check(self._lib.ch_cert_record(self._c, gid, self._origin(origin), digests, modes, len(ks)))

    def purge(self, horizon: int) -> int:
        """Forget entries with GID <= ``horizon``; returns how many keys were dropped. (Any
        integer: one computed from a forged progress report may be negative.)"""
        if horizon <= self.horizon:
            return 0
        _check(self._lib.ch_cert_purge(self._c, horizon, self._dropped))
        return int(self._dropped[0])

    def snapshot(self) -> bytes:
        """The index as bytes, for a joining node: the bytes PyCertifier.snapshot writes."""
        ffi, lib, c = self._ffi, self._lib, self._c
        n = lib.ch_cert_len(c)
        keys = ffi.new("ch_cert_key[]", n)
        lib.ch_cert_dump_keys(c, keys, n)
        names = self._names
        index = {}
        for i in range(n):
            e = keys[i]
            index[ffi.buffer(e.digest)[:].hex()] = {
                str(e.modes[j]): [e.slots[j].gid, names[e.slots[j].origin], e.slots[j].gid2, names[e.slots[j].origin2]]
                for j in range(e.nmodes)}
        entries, total = lib.ch_cert_history_len(c), lib.ch_cert_history_keys(c)
        gids, counts = ffi.new("uint64_t[]", entries), ffi.new("uint32_t[]", entries)
        digests = ffi.new("uint8_t[]", total * 16)
        lib.ch_cert_dump_history(c, gids, counts, digests)
        raw = ffi.buffer(digests)[:]
        by_gid, pos = [], 0
        for i in range(entries):
            by_gid.append([gids[i], [raw[16 * j:16 * j + 16].hex() for j in range(pos, pos + counts[i])]])
            pos += counts[i]
        schema = ffi.new("uint64_t[]", lib.ch_cert_schema_len(c))
        lib.ch_cert_dump_schema(c, schema)
        return json.dumps({"horizon": self.horizon, "index": index, "by_gid": by_gid,
                           "schema": list(schema)}, separators=(",", ":")).encode()

    @classmethod
    def restore(cls, data: bytes) -> "NativeCertifier":
        """An index from a snapshot of either implementation (PyCertifier.restore). Its digests
        must be 16 bytes, as every snapshot's are."""
        obj = json.loads(data)
        c = cls(int(obj["horizon"]))
        slot = c._ffi.new("ch_cert_slot *")
        for h, slots in obj["index"].items():
            digest = _digest16(bytes.fromhex(h))
            _check(c._lib.ch_cert_load_key(c._c, digest))
            for m, (g, o, g2, o2) in slots.items():
                slot.gid, slot.origin, slot.gid2, slot.origin2 = int(g), c._origin(str(o)), int(g2), c._origin(str(o2))
                _check(c._lib.ch_cert_load_slot(c._c, digest, KeyMode(int(m)), slot))
        for gid, hashes in obj["by_gid"]:
            _check(c._lib.ch_cert_load_history(c._c, int(gid), b"".join(_digest16(bytes.fromhex(h)) for h in hashes),
                                               len(hashes)))
        for g in obj.get("schema", ()):
            _check(c._lib.ch_cert_load_schema(c._c, int(g)))
        return c


def _digest16(d: bytes) -> bytes:
    if len(d) != 16:
        raise ValueError(f"a key digest of {len(d)} bytes (16 expected)")
    return d


def _packed(keys: list[Key]) -> tuple[bytes, bytes]:
    """Keys as the C core takes them: their digests end to end, and their modes."""
    digests = b"".join([k.digest or k.hashed() for k in keys])
    if len(digests) != 16 * len(keys):
        raise ValueError("a key digest that is not 16 bytes")
    return digests, bytes([k.mode for k in keys])


class _Fits:
    """A ``fits`` function on its way through C (ch_py_fits), and what it raised."""

    __slots__ = ("fits", "error")

    def __init__(self, fits: Callable[[list[int]], bool]) -> None:
        self.fits = fits
        self.error: Optional[BaseException] = None


class NativeScheduler:
    """commit/scheduler.PyScheduler in C (native/sched.c). GIDs must be registered in increasing
    order (a ValueError otherwise, where PyScheduler has no check). Keys are digests: the 16-byte
    ones every caller passes (wire.key_hash) go through as they are; any other bytes are hashed to
    16 with BLAKE2b first, where a collision could only add a false dependency."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES) -> None:
        m = _lib()
        self._ffi, self._lib = m.ffi, m.lib
        self._mem = self._ffi.new("uint64_t[]", (self._lib.ch_sched_size() + 7) // 8)
        self._s = self._ffi.cast("ch_sched *", self._mem)
        _check(self._lib.ch_sched_init(self._s, max_bytes))
        self._live = True
        self._cap = 0
        self._grow(64)
        self._info = self._ffi.new("ch_sched_info *")
        self._one = self._ffi.new("uint64_t *")
        self._nruns = self._ffi.new("size_t *")

    def __del__(self) -> None:
        if getattr(self, "_live", False):
            self._live = False
            self._lib.ch_sched_free(self._s)

    def _grow(self, need: int) -> None:
        """Output buffers of at least ``need`` entries."""
        if need > self._cap:
            self._cap = max(need, 2 * self._cap)
            self._out = self._ffi.new("uint64_t[]", self._cap)
            self._lens = self._ffi.new("uint32_t[]", self._cap)

    def __len__(self) -> int:
        return int(self._lib.ch_sched_len(self._s))

    @property
    def queued(self) -> int:
        return int(self._lib.ch_sched_queued(self._s))

    @property
    def nbytes(self) -> int:
        """What the scheduler holds in C, in bytes."""
        return int(self._lib.ch_sched_bytes(self._s))

    def add(self, gid: int, keys: Iterable[tuple[bytes, KeyMode]], local: bool, barrier: bool = False) -> None:
        """Register certified writeset ``gid`` (PyScheduler.add)."""
        digests, modes = [], []
        for h, mode in keys:
            digests.append(h if len(h) == 16 else hashlib.blake2b(h, digest_size=16).digest())
            modes.append(mode)
        _check(self._lib.ch_sched_add(self._s, gid, b"".join(digests), bytes(modes), len(modes), local, barrier))

    def replay(self, gid: int) -> None:
        """A local writeset's backend could not commit it: apply it from its writeset."""
        _check(self._lib.ch_sched_replay(self._s, gid))

    def replay_all_from(self, gid: int) -> list[int]:
        """After a database restart: every registered writeset is (re)applied, local ones by replay.
        Returns the GIDs, in order. (``gid`` is not read, as in PyScheduler.)"""
        n = len(self)
        self._grow(n)
        _check(self._lib.ch_sched_replay_all(self._s, self._out, self._cap))
        return list(self._ffi.unpack(self._out, n))

    def next_replay(self) -> Optional[int]:
        """The next local writeset to replay, once what it depends on has committed."""
        rc = self._lib.ch_sched_next_replay(self._s, self._one)
        _check(rc)
        return int(self._one[0]) if rc == 1 else None

    def ready_remote(self, limit: int) -> list[int]:
        """Up to ``limit`` remote GIDs to dispatch now, in GID order (runs of one)."""
        return [run[0] for run in self.ready_runs(limit, 1)]

    def ready_runs(self, limit: int, max_run: int, fits: Optional[Callable[[list[int]], bool]] = None
                   ) -> list[list[int]]:
        """Up to ``limit`` runs of remote GIDs to dispatch now (PyScheduler.ready_runs). ``fits``
        (default: every run fits) is called from C for each longer run considered; it must not
        call this scheduler."""
        limit, max_run = min(max(limit, 0), _MAX_COUNT), min(max(max_run, 0), _MAX_COUNT)
        self._grow(min(self._lib.ch_sched_remote_len(self._s), limit * max(max_run, 1)))
        if fits is None:
            rc = self._lib.ch_sched_ready_runs(self._s, limit, max_run, self._ffi.NULL, self._ffi.NULL,
                                               self._out, self._cap, self._lens, self._nruns)
        else:
            call = _Fits(fits)
            rc = self._lib.ch_sched_ready_runs(self._s, limit, max_run, self._lib.ch_py_fits,
                                               self._ffi.new_handle(call), self._out, self._cap, self._lens,
                                               self._nruns)
            if rc == _CH_ECALLBACK and call.error is not None:
                raise call.error
        _check(rc)
        runs, pos = [], 0
        for i in range(self._nruns[0]):
            n = self._lens[i]
            runs.append(self._ffi.unpack(self._out + pos, n))
            pos += n
        return runs

    def redispatch(self, gid: int) -> None:
        """An apply attempt failed transiently: ``gid`` goes back to the front, alone from now on."""
        _check(self._lib.ch_sched_redispatch(self._s, gid))

    def committed(self, gid: int) -> None:
        """``gid`` committed on this node: release what waited for it."""
        _check(self._lib.ch_sched_committed(self._s, gid))

    def committed_upto(self, gid: int) -> None:
        _check(self._lib.ch_sched_committed_upto(self._s, gid))

    def describe(self, gid: int) -> dict[str, object]:
        i = self._info
        self._lib.ch_sched_describe(self._s, gid, i)
        if not i.scheduled:
            return {"scheduled": False}
        return {"scheduled": True, "local": bool(i.local), "dispatched": bool(i.dispatched),
                "replay": bool(i.replay), "waits_for": list(i.waits_for)[:i.nwaits]}

    def pending(self) -> list[int]:
        n = len(self)
        self._grow(n)
        self._lib.ch_sched_pending(self._s, self._out, self._cap)
        return list(self._ffi.unpack(self._out, n))
