"""The data plane's native core, bound with cffi (docs/NATIVE.md section 3). What exists of it so
far, step 1's first pieces: :class:`NativeCertifier` (``native/cert.c``), :class:`NativeScheduler`
(``native/sched.c``), :func:`scan` (``native/scan.c`` with the extension's reader) and
:class:`NativeOrderCore` (``native/order.c``). Each has the interface of its Python reference
(certifier.PyCertifier, commit/scheduler.PyScheduler, wire.scan's keys and header,
dataplane/order.OrderCore) and gives the same outputs for the same calls
(tests/unit/test_dataplane_cert.py, test_dataplane_sched.py, test_dataplane_scan.py,
test_dataplane_order.py). The coordinator runs :class:`NativeOrderCore` (with its index and
:class:`NativeOutcomes`) when the module is built and ``CHORUS_IMPL`` is not ``python``
(:data:`IMPL`; the Replicator's default). In the engine of the later steps they are reached from C, not through these
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
import logging
import time
from collections import deque
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Iterable, Optional, Sequence

from chorus import impl, wire
from chorus.actions import Action, Apply, DdlOutcome, LocalVerdict, Send
from chorus.bus import Votes, bus_node
from chorus.bus import proto as bp
from chorus.certifier import OK, Verdict
from chorus.dataplane.order import CONFLICT_HISTORY, Conflict, LocalWritesets, unstable_entry
from chorus.link import position as link_position
from chorus.outcomes import OUTCOME_HISTORY, Outcome, OutcomeIndex
from chorus.spool import SpooledBuffer
from chorus.wire import Key, KeyMode

# Each object's byte budget (ch_core.h): past it an operation fails with MemoryError and changes
# nothing. Large enough not to bind in practice, bounded so a runaway backlog fails cleanly.
DEFAULT_BYTES = 8 << 30

_CH_EINVAL, _CH_EFULL, _CH_ENOMEM, _CH_ESTATE, _CH_ECALLBACK, _CH_EWIRE = -1, -2, -3, -4, -5, -6
_CERT_OK, _CERT_TOO_OLD = 0, 1
_MAX_COUNT = 1 << 62  # limits beyond any queue, clamped to fit size_t

_mod: Any = None

log = logging.getLogger("chorus.replicator")  # the order core's log lines, as order.py writes them


def use(module: ModuleType) -> None:
    """Bind to ``module``, the compiled ``chorus.dataplane._native`` (from wherever it was built)."""
    global _mod
    if _mod is module:
        return

    @module.ffi.def_extern(name="ch_py_round")  # type: ignore[untyped-decorator]
    def _round(arg: Any, gid: int, origin: int) -> int:
        core: NativeOrderCore = module.ffi.from_handle(arg)
        try:
            return 1 if core.open_round(gid, core._cert._names[origin]) else 0
        except BaseException as e:  # raised again by the call, as OrderCore would let it through
            core._error = e
            return -1

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


def chosen() -> str:
    """Which order core the coordinator runs (``CHORUS_IMPL``, chorus/impl.py): "c" (this C one,
    :class:`NativeOrderCore` on :class:`NativeCertifier`) when it is built, unless
    ``CHORUS_IMPL=python`` (dataplane/order.py's OrderCore); ``CHORUS_IMPL=c`` insists on it."""
    want = impl.wanted()
    if want == "c" and not available():
        raise ImportError("CHORUS_IMPL=c: the data plane's native core is not built "
                          "(python coordinator/chorus/dataplane/build.py)")
    return "c" if available() and want != "python" else "python"


IMPL = chosen()  # fixed at import, as the other compiled parts' (chorus/impl.py)


def cpg_module() -> Any:
    """The module whose bus_cpg.c member the Corosync bus runs (``CorosyncBus(native=...)``)
    where the native core is chosen, else None (libcpg through cffi's ABI mode)."""
    if chosen() != "c":
        return None
    mod = module()
    if hasattr(mod.lib, "ch_cpg_new"):
        return mod
    if impl.wanted() == "c":
        raise ImportError("CHORUS_IMPL=c: the native core was built without bus_cpg.c "
                          "(python coordinator/chorus/dataplane/build.py)")
    return None


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
        return _verdict(self._v, ks, last_seen, self.horizon, self._names)

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


def _verdict(v: Any, keys: Sequence[Key], last_seen: int, horizon: int, names: list[str]) -> Verdict:
    """A ``ch_cert_verdict`` worded as PyCertifier.certify words its verdict."""
    if v.kind == _CERT_OK:
        return OK
    if v.kind == _CERT_TOO_OLD:
        return Verdict(False, f"snapshot too old: the transaction saw GID {last_seen}, "
                              f"certification history starts at GID {horizon}")
    k, other_gid, other_origin = keys[v.key], int(v.gid), names[v.origin]
    by = (f"the schema change GID {other_gid} from node {other_origin} altered it"
          if v.schema else f"GID {other_gid} from node {other_origin} wrote it")
    return Verdict(False, f"certification conflict on {k.describe()}: {by} after this "
                          f"transaction's snapshot (last seen GID {last_seen})", other_gid, other_origin, k)


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


# ---- the writeset scan (native/scan.c) -------------------------------------------------------------

@dataclass(frozen=True)
class Scanned:
    """What ``native/scan.c`` reads of a writeset: the header's fields, the counts, and the keys
    (mode, parts and digest, as wire.scan makes them)."""

    xid: int
    pid: int
    last_seen: int
    flags: int
    encoding: int
    ntables: int
    nrows: int
    nschema: int
    keys: tuple[Key, ...]


class ScanError(wire.WireError):
    """A writeset ``native/scan.c`` refused: ``rule`` names the rule of wire.RULES it breaks
    (the C reader's failure, extension/chorus_wsread.h), at byte ``pos``."""

    def __init__(self, rule: str, pos: int, value: int, expected: int) -> None:
        super().__init__(f"{rule} at byte {pos} (value {value}, expected {expected})")
        self.rule, self.pos, self.value, self.expected = rule, pos, value, expected


def _key_parts(buf: Any, off: int, nparts: int) -> tuple[bytes, ...]:
    parts, pos = [], off
    for _ in range(nparts):
        n = int.from_bytes(buf[pos:pos + 4], "big")
        parts.append(bytes(buf[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return tuple(parts)


def scan(buf: Any) -> Scanned:
    """Scan writeset bytes (or a buffer: a spooled writeset's view) with the C core; a
    :class:`ScanError` if they are malformed."""
    m = _lib()
    ffi, lib = m.ffi, m.lib
    view = memoryview(buf).cast("B")
    info = ffi.new("ch_scan_info *")
    data = ffi.from_buffer(view)
    cap = 16
    keys = ffi.new("ch_scan_key[]", cap)
    rc = lib.ch_scan(data, len(view), info, keys, cap)
    if rc == _CH_EFULL:
        cap = info.nkeys
        keys = ffi.new("ch_scan_key[]", cap)
        rc = lib.ch_scan(data, len(view), info, keys, cap)
    if rc == _CH_EWIRE:
        raise ScanError(wire.RULES[info.err - 1].name, int(info.err_pos), int(info.err_value), int(info.err_expected))
    _check(rc)
    ks = tuple(Key(wire.KeyMode(k.mode), _key_parts(view, k.off, k.nparts), ffi.buffer(k.digest)[:])
               for k in keys[0:info.nkeys])
    return Scanned(int(info.xid), int(info.pid), int(info.last_seen), int(info.flags), int(info.encoding),
                   int(info.ntables), int(info.nrows), int(info.nschema), ks)


def blake2b(data: bytes, size: int = 16) -> bytes:
    """BLAKE2b of ``data`` with a digest of ``size`` bytes (native/blake2b.c)."""
    m = _lib()
    out = m.ffi.new("uint8_t[]", size)
    m.lib.ch_blake2b(data, len(data), out, size)
    return bytes(m.ffi.buffer(out))


def describe_key(parts: Sequence[bytes]) -> str:
    """wire.Key.describe of a key with these parts, worded in C (native/text.c)."""
    m = _lib()
    encoded = b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    out = m.ffi.new("char[]", 256)
    n = m.lib.ch_key_describe(encoded, len(encoded), len(parts), out, 256)
    if n > 256:
        out = m.ffi.new("char[]", n)
        m.lib.ch_key_describe(encoded, len(encoded), len(parts), out, n)
    if n == 0:
        raise ValueError("a key has 1 part or more")
    return bytes(m.ffi.buffer(out, n)).decode("utf-8")


# ---- the order core (native/order.c) ----------------------------------------------------------------

_OUT_LEFT, _OUT_MALFORMED, _OUT_CERTIFIED, _OUT_RELEASE, _OUT_RECEIVED, _OUT_UNKNOWN, _OUT_DDL = range(1, 8)


class _Field:
    """A field of a C struct an object holds (``where``: the attribute holding it), read and
    written in place: a counter of ``ch_order_stats`` or a flag of ``ch_order_state``."""

    def __init__(self, where: str, flag: bool = False, field: str = "") -> None:
        self.where, self.flag, self.name = where, flag, field

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        value = getattr(getattr(obj, self.where), self.name)
        return bool(value) if self.flag else int(value)

    def __set__(self, obj: Any, value: int) -> None:
        setattr(getattr(obj, self.where), self.name, value)


class NativeStats:
    """order.Stats over the C order core's counters (the control plane adds to ``malformed``
    too); ``failures_by_table`` stays here, with the texts."""

    delivered = _Field("_s")
    certified = _Field("_s")
    cert_failures = _Field("_s")
    local_certified = _Field("_s")
    local_failed = _Field("_s")
    remote_certified = _Field("_s")
    malformed = _Field("_s")

    def __init__(self, s: Any) -> None:
        self._s = s
        self.failures_by_table: dict[str, int] = {}

    def as_dict(self) -> dict[str, Any]:
        """As dataclasses.asdict gives order.Stats."""
        return {"delivered": self.delivered, "certified": self.certified, "cert_failures": self.cert_failures,
                "local_certified": self.local_certified, "local_failed": self.local_failed,
                "remote_certified": self.remote_certified, "malformed": self.malformed,
                "failures_by_table": dict(self.failures_by_table)}


class _Ref:
    """A writeset the C order core holds by handle: its message, its scan (the backend's, for a
    local one; made when an action needs it, for a remote one), or the action it was installed as."""

    __slots__ = ("msg", "ws", "action")

    def __init__(self, msg: "bp.WritesetMsg | bp.LinkWriteset | None", ws: Optional[wire.Writeset],
                 action: Optional[Action] = None) -> None:
        self.msg, self.ws, self.action = msg, ws, action

    def writeset(self) -> wire.Writeset:
        if self.ws is None:
            assert self.msg is not None
            self.ws = wire.scan(self.msg.writeset)
        return self.ws


def _raw(ws: wire.Writeset) -> Any:
    return ws.raw if len(ws.raw) else wire.encode(ws)


class NativeOutcomes(OutcomeIndex):
    """outcomes.OutcomeIndex in C (native/outcomes.c), recorded into by the C order core as it
    certifies: no Python per writeset. Origins are the ids of the order core's certification
    index (``ids``: its name -> id map, read at each look-up); the reasons of the failed ones,
    texts, are kept here by GID (the order core's binding sets them)."""

    def __init__(self, ids: Callable[[], dict[str, int]], size: int = OUTCOME_HISTORY,
                 max_bytes: int = DEFAULT_BYTES) -> None:
        m = _lib()
        self._ffi, self._lib = m.ffi, m.lib
        self.size = size
        self._ids = ids
        self._mem = self._ffi.new("uint64_t[]", (self._lib.ch_outcomes_size() + 7) // 8)
        self._x = self._ffi.cast("ch_outcomes *", self._mem)
        _check(self._lib.ch_outcomes_init(self._x, size, max_bytes))
        self._live = True
        self._gid, self._ok = self._ffi.new("uint64_t *"), self._ffi.new("int *")
        # (origin, xid) -> (GID, why) of the failed ones, the last ``size`` of them (GIDs alone do not
        # name them: a node that left the primary component gives its GIDs again)
        self._reasons: dict[tuple[str, int], tuple[int, str]] = {}

    def __del__(self) -> None:
        if getattr(self, "_live", False):
            self._live = False
            self._lib.ch_outcomes_free(self._x)

    def failed(self, origin: str, xid: int, gid: int, reason: str) -> None:
        """The reason ``xid`` of ``origin`` failed certification at ``gid`` (its outcome is recorded
        in C)."""
        reasons = self._reasons
        reasons[(origin, xid & 0xFFFFFFFF)] = (gid, reason)
        if len(reasons) > 2 * self.size + 16:  # keep those C still has (amortized: every size failures)
            self._reasons = {k: (g, why) for k, (g, why) in reasons.items() if self._failed_at(k[0], k[1]) == g}

    def _failed_at(self, origin: str, xid: int) -> int:
        """The GID C records ``xid`` of ``origin`` as failed at, or -1."""
        oid = self._ids().get(origin)
        if oid is None or not self._lib.ch_outcomes_get(self._x, oid, xid, self._gid, self._ok) or self._ok[0]:
            return -1
        return int(self._gid[0])

    @property
    def complete_after(self) -> int:
        return int(self._lib.ch_outcomes_complete_after(self._x))

    @complete_after.setter
    def complete_after(self, value: int) -> None:
        raise AttributeError("the C outcome index keeps complete_after itself")

    def seen(self, gid: int) -> None:
        self._lib.ch_outcomes_seen(self._x, gid)

    def record(self, origin: str, xid: int, outcome: Outcome) -> None:
        oid = self._ids().get(origin)
        if oid is None:
            raise KeyError(f"no origin {origin!r} in the order core's index")
        self._lib.ch_outcomes_record(self._x, oid, xid & 0xFFFFFFFF, outcome.gid, outcome.committed)
        if not outcome.committed:
            self.failed(origin, xid, outcome.gid, outcome.reason)

    def get(self, origin: str, xid: int) -> Optional[Outcome]:
        oid = self._ids().get(origin)
        if oid is None or not self._lib.ch_outcomes_get(self._x, oid, xid & 0xFFFFFFFF, self._gid, self._ok):
            return None
        gid, ok = int(self._gid[0]), bool(self._ok[0])
        if ok:
            return Outcome(gid, True, "")
        at, why = self._reasons.get((origin, xid & 0xFFFFFFFF), (0, ""))
        return Outcome(gid, False, why if at == gid else "")

    def __len__(self) -> int:
        return int(self._lib.ch_outcomes_len(self._x))

    def renumber(self, old: list[str], ids: dict[str, int]) -> None:
        """The order core's index changed: the origins ``old`` (by their old ids) have the ids
        ``ids`` now."""
        self._lib.ch_outcomes_renumber(self._x, [ids[name] for name in old], len(old))


class NativeOrderCore(LocalWritesets):
    """dataplane/order.py's OrderCore with its state and decisions in C (native/order.c): GIDs,
    the scan, certification on the C index, the deferral behind an open schema change, uniform
    commit's hold, release and reports, the counters, leaving and installing. Same interface,
    same actions for the same calls (tests/unit/test_dataplane_order.py).

    Kept here, beside the Python objects the actions carry: the local writesets the backends
    scanned (``expect_local``: C scans them again from their bytes when they are delivered), the
    texts (reasons, ``conflicts``, the ``outcomes`` index), node names, and the control plane's
    facts read at each call (whether a writeset's origin is online; the members' join GIDs, pushed
    to C when they changed).

    ``certifier``
    must be a :class:`NativeCertifier` to be shared with C; another implementation's index is
    copied into one (through its snapshot) when given to the constructor or ``install``."""

    def __init__(self, node: str, membership: Any, certifier: Any, open_round: Callable[[int, str], bool],
                 clock: Callable[[], float] = time.time, max_bytes: int = DEFAULT_BYTES) -> None:
        m = _lib()
        self._ffi, self._lib = m.ffi, m.lib
        self.node = node
        self.membership = membership
        self.open_round = open_round
        self.clock = clock
        self._cert = self._adopt(certifier)
        self._mem = self._ffi.new("uint64_t[]", (self._lib.ch_order_size() + 7) // 8)
        self._o = self._ffi.cast("ch_order *", self._mem)
        _check(self._lib.ch_order_init(self._o, self._cert._c, max_bytes))
        self._live = True
        self._st = self._lib.ch_order_view(self._o)
        self._n = self._ffi.new("size_t *")
        self._handle = self._ffi.new_handle(self)
        self._error: Optional[BaseException] = None
        self._refs: dict[int, _Ref] = {}
        self._next_ref = 0
        self._local_scanned: dict[int, wire.Writeset] = {}
        self._buses = {"": 0}  # bus node -> id (0: "")
        self._bus_names = [""]
        self._joined: dict[str, int] = {}
        self._votes = Votes()
        self._local_member = ""
        self.stats = NativeStats(self._st.stats)
        self.conflicts: deque[Conflict] = deque(maxlen=CONFLICT_HISTORY)
        # recorded into by C as it certifies (the reasons of failures set here)
        self.outcomes = NativeOutcomes(lambda: self._cert._ids)
        self._lib.ch_order_set_outcomes(self._o, self.outcomes._x)
        self.catching_up = False
        self.will_hold = 0

    def __del__(self) -> None:
        if getattr(self, "_live", False):
            self._live = False
            self._lib.ch_order_free(self._o)

    @staticmethod
    def _adopt(certifier: Any) -> "NativeCertifier":
        if isinstance(certifier, NativeCertifier):
            return certifier
        return NativeCertifier.restore(certifier.snapshot())

    def _bus(self, name: str) -> int:
        i = self._buses.get(name)
        if i is None:
            i = self._buses[name] = len(self._bus_names)
            self._bus_names.append(name)
        return i

    def _sync(self) -> None:
        """The members' join GIDs, pushed to C when they changed (SET_STATE's part)."""
        joined = self.membership.joined_at
        if joined != self._joined:
            self._joined = dict(joined)
            nodes = [self._bus(n) for n in self._joined]
            _check(self._lib.ch_order_set_joined(self._o, nodes, list(self._joined.values()), len(nodes)))

    def _done(self, rc: int) -> None:
        if rc == _CH_ECALLBACK and self._error is not None:
            e, self._error = self._error, None
            raise e
        _check(rc)

    def _new_ref(self, ref: _Ref) -> int:
        self._next_ref += 1
        self._refs[self._next_ref] = ref
        return self._next_ref

    def _released(self, r: Any, ref: _Ref) -> Action:
        """The action of a held writeset, released or listed."""
        if ref.action is not None:
            return ref.action
        when = ref.msg.commit_time if isinstance(ref.msg, bp.WritesetMsg) else 0
        if r.local:
            return LocalVerdict(int(r.ticket), True, int(r.gid), int(r.prev), "", ref.writeset(), settle=bool(r.settle),
                                commit_time=when)
        link = ref.msg if r.link and isinstance(ref.msg, bp.LinkWriteset) else None
        return Apply(int(r.gid), int(r.prev), self._cert._names[r.origin], ref.writeset(), settle=bool(r.settle),
                     link=link, commit_time=when)

    def _actions(self, ddl: Optional[tuple[bool, str, Optional[wire.Writeset]]] = None) -> list[Action]:
        """The C core's outputs of the last call, as OrderCore's actions."""
        p = self._lib.ch_order_take(self._o, self._n)
        names = self._cert._names
        out: list[Action] = []
        for i in range(self._n[0]):
            r = p[i]
            kind = r.kind
            if kind == _OUT_RELEASE:
                out.append(self._released(r, self._refs.pop(r.ref)))
            elif kind == _OUT_CERTIFIED and r.link:
                if r.v.kind != _CERT_OK:  # nothing certified lies between gid - 1 and gid: only a bug gets here
                    ref = self._refs.pop(r.ref)
                    v = _verdict(r.v, ref.writeset().keys, int(r.last_seen), self._cert.horizon, names)
                    assert isinstance(ref.msg, bp.LinkWriteset)
                    log.error("link writeset GID %d of link %s failed certification: %s", r.gid, ref.msg.link,
                              v.reason)
            elif kind == _OUT_CERTIFIED:
                if r.v.kind == _CERT_OK:  # its outcome is recorded in C
                    continue
                origin = names[r.origin]
                ws = self._refs.pop(r.ref).writeset()
                v = _verdict(r.v, ws.keys, int(r.last_seen), self._cert.horizon, names)
                self.outcomes.failed(origin, ws.xid, int(r.gid), v.reason)
                c = Conflict.of(self.clock(), int(r.gid), origin, ws, v)
                self.conflicts.append(c)
                where = f"{c.schema}.{c.table}" if c.table else ""
                self.stats.failures_by_table[where] = self.stats.failures_by_table.get(where, 0) + 1
                if r.local:
                    out.append(LocalVerdict(int(r.ticket), False, int(r.gid), 0, v.reason, ws))
            elif kind == _OUT_LEFT:
                out.append(LocalVerdict(int(r.ticket), False, 0, 0, "this node left the primary component", None))
            elif kind == _OUT_MALFORMED:
                ref = self._refs.pop(r.ref)
                if r.link:
                    assert isinstance(ref.msg, bp.LinkWriteset)
                    why = "a link writeset carries no ordering request or concurrent index change"
                    try:
                        wire.scan(ref.msg.writeset)
                    except wire.WireError as e:
                        why = str(e)
                    log.warning("link writeset of link %s (peer GID %d) from %s refused: %s", ref.msg.link,
                                ref.msg.peer_gid, ref.msg.node, why)
                if not r.local:
                    continue
                if ref.ws is not None or ref.msg is None:
                    raise RuntimeError("the C scan refused a writeset the coordinator's reader accepted")
                try:
                    wire.scan(ref.msg.writeset)
                except wire.WireError as e:
                    out.append(LocalVerdict(int(r.ticket), False, int(r.gid), 0, f"malformed writeset: {e}", None))
                else:
                    raise RuntimeError(f"the C scan refused a writeset the coordinator's reader accepted "
                                       f"({wire.RULES[r.scan_err - 1].name})")
            elif kind == _OUT_RECEIVED:
                out.append(Send(bp.Received(self.node, int(r.gid))))
            elif kind == _OUT_UNKNOWN:
                gid = int(r.gid)
                self._local_scanned.pop(int(r.ticket), None)
                out.append(LocalVerdict(int(r.ticket), False, gid, 0,
                                        f"this node left the primary component before GID {gid} was known to a "
                                        "quorum of nodes: whether it committed will be known when the node rejoins",
                                        None, unknown=True))
            elif kind == _OUT_DDL:
                assert ddl is not None
                ok, error, content = ddl
                out.append(DdlOutcome(int(r.gid), ok, error, content if ok else None, bool(r.settle)))
        return out

    # ---- what the control plane sets and reads ------------------------------------------------

    following = _Field("_st", flag=True)  # the node follows the total order
    quorate = _Field("_st", flag=True)
    gid = _Field("_st")  # the last GID given
    last_certified = _Field("_st")
    released = _Field("_st")
    deferred_count = _Field("_st", field="deferred")  # waiting for a schema change's outcome
    held_count = _Field("_st", field="held")  # certified, waiting for a quorum

    @property
    def local_member(self) -> str:
        return self._local_member

    @local_member.setter
    def local_member(self, member: str) -> None:
        self._local_member = member
        self._st.own = self._bus(bus_node(member))

    @property
    def votes(self) -> Votes:
        return self._votes

    @votes.setter
    def votes(self, votes: Votes) -> None:
        self._votes = votes
        self._lib.ch_order_set_votes(self._o, votes.quorum, votes.expected, self._bus(votes.tie_breaker))

    @property
    def certifier(self) -> "NativeCertifier":
        return self._cert

    @property
    def ddl_open(self) -> dict[int, str]:
        n = int(self._st.ddl_open)
        gids, origins = self._ffi.new("uint64_t[]", n), self._ffi.new("uint32_t[]", n)
        self._lib.ch_order_ddl_open(self._o, gids, origins, n)
        return {int(gids[i]): self._cert._names[origins[i]] for i in range(n)}

    @property
    def received(self) -> dict[str, int]:
        n = self._lib.ch_order_received_nodes(self._o, self._ffi.NULL, self._ffi.NULL, 0)
        nodes, gids = self._ffi.new("uint32_t[]", n), self._ffi.new("uint64_t[]", n)
        self._lib.ch_order_received_nodes(self._o, nodes, gids, n)
        return {self._bus_names[nodes[i]]: int(gids[i]) for i in range(n)}

    @property
    def nbytes(self) -> int:
        """What the order core holds in C, in bytes (the index's apart)."""
        return int(self._lib.ch_order_bytes(self._o))

    # ---- the total order ------------------------------------------------------------------------

    def writeset(self, msg: bp.WritesetMsg) -> list[Action]:
        """A writeset delivered in total order (OrderCore.writeset)."""
        origin, ticket = msg.origin, msg.ticket
        local = origin == self.node
        cached = self._local_scanned.pop(ticket, None) if local else None
        membership = self.membership
        if membership.joined_at != self._joined:
            self._sync()
        buf = _raw(cached) if cached is not None else msg.writeset
        if isinstance(buf, SpooledBuffer):
            buf = buf.view
        st = self._st
        before = st.gid
        self._next_ref = ref = self._next_ref + 1
        refs = self._refs
        refs[ref] = _Ref(msg, cached)
        oid = self._cert._ids.get(origin)
        if oid is None:
            oid = self._cert._origin(origin)
        lib = self._lib
        # bytes go to C as they are; from_buffer (a buffer's view, a spooled writeset's mapping) costs
        # a few µs more per call
        data = buf if type(buf) is bytes else self._ffi.from_buffer(buf)
        rc = lib.ch_order_writeset(self._o, oid, local, origin in membership.online, ticket, ref,
                                   data, len(buf), lib.ch_py_round, self._handle)
        if st.gid == before:
            del refs[ref]
        if rc:
            self._done(rc)
        return self._actions()

    def link_writeset(self, msg: bp.LinkWriteset) -> list[Action]:
        """A peer site's transaction sent on by this site's receiver (OrderCore.link_writeset)."""
        online = msg.node in self.membership.online
        self._sync()
        buf = msg.writeset
        before = self._st.gid
        ref = self._new_ref(_Ref(msg, None))
        rc = self._lib.ch_order_link_writeset(self._o, self._cert._origin(link_position.origin(msg.link)), online,
                                              ref, self._ffi.from_buffer(buf), len(buf))
        if self._st.gid == before:
            del self._refs[ref]
        self._done(rc)
        return self._actions()

    def ddl_settled(self, gid: int, ok: bool, error: str, content: Optional[wire.Writeset] = None) -> list[Action]:
        """Schema change ``gid``'s outcome is known (OrderCore.ddl_settled)."""
        self._sync()
        keys = list(content.keys) if content is not None else []
        digests, modes = _packed(keys)
        rc = self._lib.ch_order_ddl_settled(self._o, gid, ok, content is not None, digests, modes, len(keys),
                                            self._lib.ch_py_round, self._handle)
        if rc == _CH_ESTATE:
            raise KeyError(gid)
        self._done(rc)
        return self._actions((ok, error, content))

    def purge(self, low: int, history: int) -> None:
        self._cert.purge(low - history)

    # ---- uniform commit -------------------------------------------------------------------------

    def release(self) -> list[Action]:
        self._sync()
        self._done(self._lib.ch_order_release(self._o))
        return self._actions()

    def received_report(self, sender: str, msg: bp.Received, in_view: bool) -> list[Action]:
        self._sync()
        own = msg.node == self.node and sender == self._local_member
        self._done(self._lib.ch_order_received(self._o, self._bus(bus_node(sender)), msg.gid, own, in_view))
        return self._actions()

    def tick(self) -> list[Action]:
        self._sync()
        self._done(self._lib.ch_order_tick(self._o))
        return self._actions()

    def view_changed(self, votes: Votes) -> None:
        self._votes = votes
        self._lib.ch_order_view_changed(self._o, votes.quorum, votes.expected, self._bus(votes.tie_breaker))

    # ---- the control plane's primitives --------------------------------------------------------

    def install(self, gid: int, certified: int, released: int, unstable: list[tuple[int, Action]],
                certifier: Any) -> None:
        cert = self._adopt(certifier)
        recs = self._ffi.new("ch_order_out[]", max(len(unstable), 1))
        refs: dict[int, _Ref] = {}
        for i, (g, a) in enumerate(unstable):
            r = recs[i]
            r.gid = g
            self._next_ref += 1
            refs[self._next_ref] = _Ref(None, None, a)
            r.ref = self._next_ref
            if isinstance(a, LocalVerdict):
                r.local, r.ticket, r.prev, r.settle = 1, a.ticket, a.prev, a.settle
            else:
                assert isinstance(a, Apply)
                r.origin, r.prev, r.settle, r.link = cert._origin(a.origin), a.prev, a.settle, a.link is not None
        _check(self._lib.ch_order_install(self._o, cert._c, gid, certified, released, recs, len(unstable)))
        if cert is not self._cert:  # the outcomes recorded name origins by the old index's ids
            old = list(self._cert._names)
            for name in old:
                cert._origin(name)
            self.outcomes.renumber(old, cert._ids)
        self._cert, self._refs = cert, refs

    def unstable_entries(self, version: int = bp.VERSION) -> tuple[tuple[int, int, str, bytes], ...]:
        n = self._lib.ch_order_unstable(self._o, self._ffi.NULL, 0)
        recs = self._ffi.new("ch_order_out[]", max(n, 1))
        self._lib.ch_order_unstable(self._o, recs, n)
        return tuple(unstable_entry(self.node, int(recs[i].gid), self._released(recs[i], self._refs[recs[i].ref]),
                                    version) for i in range(n))

    def leave(self) -> list[Action]:
        self.will_hold = self.released if not self.catching_up else 0
        self.catching_up = False
        self._done(self._lib.ch_order_leave(self._o))
        out = self._actions()
        self._refs.clear()
        return out
