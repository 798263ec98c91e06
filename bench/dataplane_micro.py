"""The data plane's C core against its Python references, per operation (docs/NATIVE.md step 1).

    .venv/bin/python bench/dataplane_micro.py [--count 20000] [--repeat 3] [--accounts 100000]

Feeds the same pgbench -N key stream to each implementation of the certification index
(certifier.PyCertifier, the Cython one in chorus/_ccert.pyx when built, the C one in
dataplane/native/cert.c) and of the apply scheduler (PyScheduler, chorus/_csched.pyx, native/
sched.c). It prints the µs per writeset of each and the ratio Python / C.

The stream: each writeset is one pgbench -N transaction from one of three nodes in turn. It
carries the table keys of pgbench_accounts and pgbench_history (reference) and one account row
(update), with a uniform random aid; its snapshot is 0 to 8 GIDs old. The scheduler gets these keys
and pgbench_history's order key (it has no primary key), as commit/pipeline.order_keys makes them.

- **certify**: `certify` (which indexes the keys of a writeset that passes), and a purge every
  1,000 GIDs to 2,000 below, as the replicator's history keeps it.
- **schedule**: per writeset, `add` (local for one node in three), and per batch of 8 delivered
  together `ready_runs(4, 8)`, then `committed` for every GID dispatched and every local one, in
  order.

- **order**: the order core's whole per-writeset work on the same stream as writeset bytes (as
  wire.encode writes them), this node being n1: ``writeset`` (the GID, the scan, certification,
  the release as quorum 1 gives it at once, the outcome), with ``expect_local`` first for n1's own
  writesets (scanned beforehand, as its backend scanned them), and ``purge`` as above. Python is
  dataplane/order.py's OrderCore with the certifier ``CHORUS_IMPL`` chose, c NativeOrderCore
  (native/order.c), which also makes the actions' Python objects (it scans each released remote
  writeset again in Python for its Apply), c raw the C functions (ch_order_writeset) with the
  outputs counted, not made into objects.

Both operations run through the Python call boundary, as the coordinator calls them today: the C
figures include cffi and packing the keys into bytes. The C core without that boundary, called
from the C engine of later steps, is not measured here. The same verdicts and dispatches are
checked across implementations. A benchmark, not a test: nothing is asserted about time.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))

from chorus.certifier import PyCertifier  # noqa: E402
from chorus.commit.scheduler import PyScheduler  # noqa: E402
from chorus.dataplane import native  # noqa: E402
from chorus.wire import Key, KeyMode, key_hash  # noqa: E402

ORIGINS = ("n1", "n2", "n3")


def load_native() -> None:
    """The C core: built in place, else compiled into a temporary directory for this run."""
    if native.available():
        return
    import importlib.util

    from chorus.dataplane import build

    path = build.compile_into(Path(tempfile.mkdtemp(prefix="chorus-native-")))
    spec = importlib.util.spec_from_file_location("chorus.dataplane._native", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    native.use(module)


def stream(count: int, accounts: int, seed: int) -> list[tuple[int, str, int, list[Key], list[tuple[bytes, KeyMode]]]]:
    """(gid, origin, last_seen, certification keys, scheduler keys) per writeset, digests made
    beforehand as wire.scan makes them."""
    rnd = random.Random(seed)

    def key(mode: KeyMode, *parts: bytes) -> Key:
        return Key(mode, parts, key_hash(parts))

    accounts_t = key(KeyMode.REFERENCE, b"public", b"pgbench_accounts")
    history_t = key(KeyMode.REFERENCE, b"public", b"pgbench_history")
    history_order = (key_hash((b"", b"public", b"pgbench_history")), KeyMode.REFERENCE)
    out = []
    for gid in range(1, count + 1):
        row = key(KeyMode.UPDATE, b"public", b"pgbench_accounts", b"aid", str(rnd.randrange(1, accounts + 1)).encode())
        keys = [accounts_t, row, history_t]
        out.append((gid, ORIGINS[gid % 3], max(0, gid - 1 - rnd.randrange(0, 9)), keys,
                    [(k.digest, k.mode) for k in keys] + [history_order]))
    return out


def run_certify(make: Callable[[], Any], ws: list[Any]) -> tuple[float, list[int]]:
    c = make()
    failed = []
    t0 = time.perf_counter()
    for gid, origin, last_seen, keys, _ in ws:
        if not c.certify(gid, origin, last_seen, keys).ok:
            failed.append(gid)
        if gid % 1000 == 0:
            c.purge(gid - 2000)
    return time.perf_counter() - t0, failed


def run_schedule(make: Callable[[], Any], ws: list[Any]) -> tuple[float, list[list[int]]]:
    s = make()
    dispatched: list[list[int]] = []
    local: list[int] = []
    t0 = time.perf_counter()
    for i, (gid, origin, _, _, okeys) in enumerate(ws):
        is_local = origin == "n1"
        s.add(gid, okeys, is_local)
        if is_local:
            local.append(gid)
        if i % 8 == 7:
            runs = s.ready_runs(4, 8)
            dispatched.extend(runs)
            for g in local:
                s.committed(g)
            for run in runs:
                for g in run:
                    s.committed(g)
            local.clear()
    return time.perf_counter() - t0, dispatched


def run_certify_raw(ws: list[Any]) -> tuple[float, list[int]]:
    """run_certify on the C core's functions, the keys packed beforehand: the cost of the core
    and of one cffi call per operation, without NativeCertifier's packing and Verdict."""
    m = native.module()
    ffi, lib = m.ffi, m.lib
    mem = ffi.new("uint64_t[]", (lib.ch_cert_size() + 7) // 8)
    c = ffi.cast("ch_cert *", mem)
    lib.ch_cert_init(c, 0, native.DEFAULT_BYTES)
    v, dropped = ffi.new("ch_cert_verdict *"), ffi.new("size_t *")
    packed = [(gid, ORIGINS.index(origin) + 1, last_seen, b"".join(k.digest for k in keys), bytes(k.mode for k in keys),
               len(keys)) for gid, origin, last_seen, keys, _ in ws]
    certify, purge = lib.ch_cert_certify, lib.ch_cert_purge
    failed = []
    t0 = time.perf_counter()
    for gid, origin, last_seen, digests, modes, n in packed:
        certify(c, gid, origin, last_seen, digests, modes, n, v)
        if v.kind:
            failed.append(gid)
        if gid % 1000 == 0 and gid > 2000:
            purge(c, gid - 2000, dropped)
    elapsed = time.perf_counter() - t0
    lib.ch_cert_free(c)
    return elapsed, failed


def run_schedule_raw(ws: list[Any]) -> tuple[float, list[list[int]]]:
    """run_schedule on the C core's functions, the keys packed beforehand."""
    m = native.module()
    ffi, lib = m.ffi, m.lib
    mem = ffi.new("uint64_t[]", (lib.ch_sched_size() + 7) // 8)
    s = ffi.cast("ch_sched *", mem)
    lib.ch_sched_init(s, native.DEFAULT_BYTES)
    out, lens, nruns = ffi.new("uint64_t[]", 32), ffi.new("uint32_t[]", 32), ffi.new("size_t *")
    packed = [(gid, origin == "n1", b"".join(h for h, _ in okeys), bytes(mode for _, mode in okeys), len(okeys))
              for gid, origin, _, _, okeys in ws]
    add, ready, committed = lib.ch_sched_add, lib.ch_sched_ready_runs, lib.ch_sched_committed
    dispatched: list[list[int]] = []
    local: list[int] = []
    t0 = time.perf_counter()
    for i, (gid, is_local, digests, modes, n) in enumerate(packed):
        add(s, gid, digests, modes, n, is_local, 0)
        if is_local:
            local.append(gid)
        if i % 8 == 7:
            ready(s, 4, 8, ffi.NULL, ffi.NULL, out, 32, lens, nruns)
            for g in local:
                committed(s, g)
            pos = 0
            for r in range(nruns[0]):
                run = ffi.unpack(out + pos, lens[r])
                pos += lens[r]
                dispatched.append(run)
                for g in run:
                    committed(s, g)
            local.clear()
    elapsed = time.perf_counter() - t0
    lib.ch_sched_free(s)
    return elapsed, dispatched


class _Online:
    online = {o: o for o in ORIGINS}
    joined_at: dict[str, int] = {}


def order_stream(ws: list[Any]) -> list[tuple[Any, Any]]:
    """The stream as bus messages of writeset bytes, and n1's writesets scanned by its backend."""
    from chorus import wire
    from chorus.bus import proto as bp

    out = []
    for gid, origin, last_seen, keys, _ in ws:
        buf = wire.encode(wire.Writeset(gid, 4000 + gid % 8, last_seen, (), (), tuple(keys)))
        out.append((bp.WritesetMsg(origin, gid, buf), wire.scan(buf) if origin == "n1" else None))
    return out


def run_order(make: Callable[[], Any], msgs: list[tuple[Any, Any]]) -> tuple[float, list[int]]:
    core = make()
    core.following = core.quorate = True
    core.local_member = "1:n1"
    applied = []
    t0 = time.perf_counter()
    for msg, scanned in msgs:
        if scanned is not None:
            core.expect_local(msg.ticket, scanned)
        applied.append(len(core.writeset(msg)))
        if core.gid % 1000 == 0:
            core.purge(core.gid, 2000)
    return time.perf_counter() - t0, applied


def run_order_raw(msgs: list[tuple[Any, Any]]) -> tuple[float, list[int]]:
    """run_order on the C functions: the bytes and origins given as they are, the outputs counted."""
    m = native.module()
    ffi, lib = m.ffi, m.lib
    cert = native.NativeCertifier()
    mem = ffi.new("uint64_t[]", (lib.ch_order_size() + 7) // 8)
    o = ffi.cast("ch_order *", mem)
    lib.ch_order_init(o, cert._c, native.DEFAULT_BYTES)
    st = lib.ch_order_view(o)
    st.following = st.quorate = 1
    n = ffi.new("size_t *")
    packed = [(cert._origin(msg.origin), msg.origin == "n1", msg.ticket, msg.writeset) for msg, _ in msgs]
    writeset, take, purge, dropped = lib.ch_order_writeset, lib.ch_order_take, lib.ch_cert_purge, ffi.new("size_t *")
    applied = []
    t0 = time.perf_counter()
    for origin, local, ticket, buf in packed:
        writeset(o, origin, local, 1, ticket, ticket, buf, len(buf), ffi.NULL, ffi.NULL)
        out = take(o, n)
        applied.append(sum(1 for i in range(n[0]) if out[i].kind == 4))
        if st.gid % 1000 == 0 and st.gid > 2000:
            purge(cert._c, st.gid - 2000, dropped)
    elapsed = time.perf_counter() - t0
    lib.ch_order_free(o)
    return elapsed, applied


def best(repeat: int, f: Callable[[], tuple[float, Any]]) -> tuple[float, Any]:
    results = [f() for _ in range(repeat)]
    return min(r[0] for r in results), results[0][1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=20000, help="writesets in the stream")
    ap.add_argument("--repeat", type=int, default=3, help="runs per implementation; the fastest counts")
    ap.add_argument("--accounts", type=int, default=100000, help="pgbench_accounts rows (scale 1: 100,000)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    load_native()
    ws = stream(args.count, args.accounts, args.seed)

    certifiers: dict[str, Callable[[], Any]] = {"python": PyCertifier}
    schedulers: dict[str, Callable[[], Any]] = {"python": PyScheduler}
    try:
        from chorus import _ccert, _csched  # type: ignore[attr-defined]

        certifiers["cython"], schedulers["cython"] = _ccert.Certifier, _csched.Scheduler
    except ImportError:
        pass
    certifiers["c"], schedulers["c"] = native.NativeCertifier, native.NativeScheduler
    raw = {"certify": run_certify_raw, "schedule": run_schedule_raw}

    print(f"{args.count} pgbench -N writesets from {len(ORIGINS)} nodes, {args.accounts} accounts, "
          f"best of {args.repeat}; µs per writeset")
    print("c: through NativeCertifier / NativeScheduler; c raw: the C functions with keys packed beforehand")
    names = [*certifiers, "c raw"]
    print(f"{'':<10}" + "".join(f"{name:>10}" for name in names) + f"{'python/c':>10}{'python/raw':>12}")
    for op, impls, run in (("certify", certifiers, run_certify), ("schedule", schedulers, run_schedule)):
        times, outputs = {}, {}
        for name, make in impls.items():
            times[name], outputs[name] = best(args.repeat, lambda: run(make, ws))
        times["c raw"], outputs["c raw"] = best(args.repeat, lambda: raw[op](ws))
        if len({repr(o) for o in outputs.values()}) != 1:
            print(f"{op}: the implementations disagree", file=sys.stderr)
            return 1
        us = {name: t / args.count * 1e6 for name, t in times.items()}
        print(f"{op:<10}" + "".join(f"{us[name]:>10.2f}" for name in names)
              + f"{us['python'] / us['c']:>9.1f}x{us['python'] / us['c raw']:>11.1f}x")
    from chorus.certifier import Certifier
    from chorus.dataplane.order import OrderCore

    msgs = order_stream(ws)
    cores: dict[str, Callable[[], Any]] = {
        "python": lambda: OrderCore("n1", _Online(), Certifier(), lambda g, o: False),
        "c": lambda: native.NativeOrderCore("n1", _Online(), native.NativeCertifier(), lambda g, o: False)}
    times, outputs = {}, {}
    for name, make in cores.items():
        times[name], outputs[name] = best(args.repeat, lambda: run_order(make, msgs))
    times["c raw"], outputs["c raw"] = best(args.repeat, lambda: run_order_raw(msgs))
    if len({repr(o) for o in outputs.values()}) != 1:
        print("order: the implementations disagree", file=sys.stderr)
        return 1
    us = {name: t / args.count * 1e6 for name, t in times.items()}
    print(f"{'order':<10}{us['python']:>10.2f}{'':>10}{us['c']:>10.2f}{us['c raw']:>10.2f}"
          f"{us['python'] / us['c']:>9.1f}x{us['python'] / us['c raw']:>11.1f}x   (python: OrderCore with the "
          f"{'Cython' if Certifier.__module__.endswith('_ccert') else 'Python'} certifier)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
