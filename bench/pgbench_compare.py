"""pgbench -N: plain PostgreSQL vs a 1-node and a 3-node Chorus cluster, in one run.

    .venv/bin/python bench/pgbench_compare.py [--seconds 15] [--rounds 3] [--clients 8] [--scale 10]

Every configuration runs on this machine with the same PostgreSQL settings; rounds are
interleaved and the median of each is reported, with latency p50/p95 from pgbench's
per-transaction log, and the ratio to plain PostgreSQL. The 3-node load is spread over all
nodes (clients divided between them). A second table says where the CPU goes: microseconds of
CPU per transaction used by PostgreSQL, the coordinators, Corosync and pgbench (all nodes of a
configuration together), sampled in the middle of each run. The coordinators run the compiled
hot path (CHORUS_IMPL=c) and, as ``chorus-1-python`` and ``chorus-3-python``, the pure-Python
one (``--impls c`` leaves those out). A third table gives the latency Chorus adds to a commit:
pgbench -N with one client on plain PostgreSQL and on the 1-node cluster.

A fourth table counts, per transaction and from each configuration's own processes only: its
coordinators' CPU, their context switches (voluntary: wake-ups; involuntary: preemptions),
Corosync's, and with ``--strace SECONDS`` the coordinators' system calls by name (docs/NATIVE.md,
"Step 5, first measures"). ``--variant NAME:VAR=VALUE`` adds clusters whose coordinators run
with those environment variables, for an A/B in one run.

``--visible-capture`` adds ``chorus-1-visible`` and ``chorus-3-visible``: the same clusters with
the capture as extension 0.1 made it (ordinary triggers named chorus_capture, enabled ALWAYS)
instead of internal triggers, to measure what the internal capture costs against it (issue 35).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))

from chorus.testkit.localcluster import PGBIN, LocalCluster, PlainPostgres as Plain, service_dir  # noqa: E402

PGBENCH = str(PGBIN / "pgbench")


def pgbench_init(dsn: str, scale: int) -> None:
    env = dict(os.environ, PGOPTIONS="-c chorus.capture=off")
    subprocess.run([PGBENCH, "-i", "-q", "-s", str(scale), dsn], env=env, check=True, capture_output=True)


# extension 0.1's capture, as its library attached it (for --visible-capture)
VISIBLE_CAPTURE = """
SELECT chorus.detach('{t}');
CREATE TRIGGER chorus_capture AFTER INSERT OR UPDATE OR DELETE ON {t} FOR EACH ROW EXECUTE FUNCTION chorus.capture();
CREATE TRIGGER chorus_capture_truncate AFTER TRUNCATE ON {t} FOR EACH STATEMENT EXECUTE FUNCTION chorus.capture_truncate();
ALTER TABLE {t} ENABLE ALWAYS TRIGGER chorus_capture;
ALTER TABLE {t} ENABLE ALWAYS TRIGGER chorus_capture_truncate;
"""


def visible_capture(dsn: str) -> None:
    """Give the pgbench tables of one node extension 0.1's visible capture triggers (that node
    only: capture and schema replication off; run it on every node of a cluster)."""
    env = dict(os.environ, PGOPTIONS="-c chorus.capture=off -c chorus.replicate_ddl=off")
    # (with the event trigger off: this library's chorus.attach, which it calls after an ALTER
    # TABLE, would make 0.1's triggers internal ones, as the upgrade does)
    script = ("ALTER EVENT TRIGGER chorus_on_ddl_end DISABLE;"
              + "".join(VISIBLE_CAPTURE.format(t=t) for t in
                        ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"))
              + "ALTER EVENT TRIGGER chorus_on_ddl_end ENABLE ALWAYS;")
    r = subprocess.run([str(PGBIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn], input=script,
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"could not give {dsn} extension 0.1's capture: {r.stderr}")


CPU_CLASSES = ("postgres", "coordinator", "corosync", "client")


def _cpu_class(cmdline: bytes) -> Optional[str]:
    args = cmdline.split(b"\0")
    prog = args[0]
    if prog.startswith(b"postgres") or prog.endswith(b"/postgres"):
        return "postgres"  # the postmaster, its backends and helpers (their titles start with "postgres:")
    if prog.endswith(b"corosync"):
        return "corosync"
    if prog.endswith(b"pgbench") or prog.endswith(b"sysbench"):
        return "client"
    if any(a.endswith(b"chorus") and b == b"run" for a, b in zip(args, args[1:])):
        return "coordinator"
    return None


def cpu_seconds() -> dict[str, float]:
    """CPU time used so far by the live processes of each class (PostgreSQL, coordinators,
    Corosync, the benchmark's client: pgbench or sysbench) on this machine."""
    hz = os.sysconf("SC_CLK_TCK")
    out = dict.fromkeys(CPU_CLASSES, 0.0)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cls = _cpu_class(f.read())
            if cls is None:
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[cls] += (int(fields[11]) + int(fields[12])) / hz
    return out


def class_pids(cls: str) -> list[int]:
    """The live processes of one class (``_cpu_class``) in this process's network namespace (the
    local clusters' Corosync serves the nodes of its namespace: other namespaces' are not ours)."""
    out = []
    here = os.readlink("/proc/self/ns/net")
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if _cpu_class(f.read()) == cls and os.readlink(f"/proc/{pid}/ns/net") == here:
                        out.append(int(pid))
            except OSError:
                continue
    return out


def proc_counts(pids: list[int]) -> dict[str, float]:
    """CPU seconds (user and system) and context switches so far of the processes ``pids``: their
    threads' voluntary (the thread slept: a wake-up) and involuntary (it was preempted) switches,
    from ``/proc/<pid>/task/<tid>/status``. A thread that ended is not counted."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {"cpu_s": 0.0, "vcsw": 0.0, "ivcsw": 0.0}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out["cpu_s"] += (int(fields[11]) + int(fields[12])) / hz
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            out["vcsw"] += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches:"):
                            out["ivcsw"] += int(line.split()[1])
            except OSError:
                continue
    return out


class Strace:
    """``strace -c -f`` attached to ``pids`` until ``stop()``: the system calls they made, by name."""

    def __init__(self, pids: list[int], out: Path) -> None:
        self.out = out
        args = ["strace", "-c", "-f", "-q", "-o", str(out)]
        for pid in pids:
            args += ["-p", str(pid)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> dict[str, int]:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=30)
        calls: dict[str, int] = {}
        for line in self.out.read_text().splitlines():
            parts = line.split()
            # "% time  seconds  usecs/call  calls  [errors]  syscall"
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                calls[parts[-1]] = int(parts[3])
        return calls


def transactions_between(logdir: Path, t0: float, t1: float) -> int:
    """Transactions pgbench logged (``-l``) as ending between the epoch times ``t0`` and ``t1``."""
    n = 0
    for f in glob.glob(str(logdir / "n*")):
        with open(f) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and parts[4].isdigit() and t0 <= int(parts[4]) + int(parts[5]) / 1e6 < t1:
                    n += 1
    return n


WATCHED = ("coordinator", "corosync")


def pgbench_run(dsns: list[str], clients: int, seconds: int, logdir: Path,
                workload: tuple[str, ...] = ("-N",), watch: Optional[list[int]] = None,
                strace: float = 0.0) -> dict[str, float]:
    """Run pgbench (``workload``: its script options, -N by default) on every DSN at once,
    ``clients`` in all; total TPS, latency percentiles, and the CPU each class of process used
    per transaction in the middle of the run (``cpu_us_<class>``: where the time goes).

    ``watch``: the pids of the configuration's own coordinators. Their CPU (``own_cpu_us_coordinator``)
    and context switches per transaction (``vcsw_coordinator``, ``ivcsw_coordinator``) in the same
    window, and those of Corosync (every corosync in this network namespace). ``strace``: that many seconds at
    the end of the run (after the CPU window, as tracing slows the traced) under ``strace -c -f``
    of the coordinators: ``syscalls_coordinator`` per transaction, and per call ``sys_<name>``."""
    shutil.rmtree(logdir, ignore_errors=True)
    logdir.mkdir(parents=True)
    per = [clients // len(dsns) + (1 if i < clients % len(dsns) else 0) for i in range(len(dsns))]
    procs = []
    for i, (dsn, c) in enumerate(zip(dsns, per)):
        procs.append(subprocess.Popen(
            [PGBENCH, *workload, "-n", "-c", str(c), "-j", str(min(c, 2)), "-T", str(seconds), "--max-tries", "50",
             "-l", "--log-prefix", str(logdir / f"n{i}"), dsn],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    margin = min(1.0, seconds / 4)
    time.sleep(margin)
    pids = {"coordinator": list(watch or ()), "corosync": class_pids("corosync") if watch else []}
    own0 = {c: proc_counts(p) for c, p in pids.items()}
    cpu0, t0 = cpu_seconds(), time.monotonic()
    time.sleep(max(0.1, seconds - 2 * margin - strace))
    cpu1, window = cpu_seconds(), time.monotonic() - t0
    own1 = {c: proc_counts(p) for c, p in pids.items()}
    calls: dict[str, int] = {}
    traced = 0
    if strace and watch:
        tracer = Strace(list(watch), logdir / "strace.txt")
        time.sleep(0.5)  # attached (strace -c counts from its attach on)
        s0 = time.time()
        time.sleep(strace)
        s1 = time.time()
        calls = tracer.stop()
    tps = 0.0
    for p in procs:
        text = p.communicate(timeout=seconds + 120)[0]
        m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", text)
        if p.returncode != 0 or not m:
            raise RuntimeError(f"pgbench failed:\n{text}")
        tps += float(m.group(1))
    lat: list[float] = []
    for f in glob.glob(str(logdir / "n*")):
        with open(f) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[2].isdigit():
                    lat.append(int(parts[2]) / 1000.0)
    lat.sort()
    out = {"tps": tps, "p50_ms": lat[len(lat) // 2] if lat else 0.0,
           "p95_ms": lat[int(len(lat) * 0.95)] if lat else 0.0}
    for cls in CPU_CLASSES:
        out[f"cpu_us_{cls}"] = (cpu1[cls] - cpu0[cls]) / (tps * window) * 1e6 if tps else 0.0
    if watch and tps:
        txs = tps * window
        for cls in WATCHED:
            out[f"vcsw_{cls}"] = (own1[cls]["vcsw"] - own0[cls]["vcsw"]) / txs
            out[f"ivcsw_{cls}"] = (own1[cls]["ivcsw"] - own0[cls]["ivcsw"]) / txs
        out["own_cpu_us_coordinator"] = (own1["coordinator"]["cpu_s"] - own0["coordinator"]["cpu_s"]) / txs * 1e6
    if calls:
        # the transactions that ended in the traced window, from pgbench's per-transaction log
        traced = transactions_between(logdir, s0, s1)
        if traced:
            out["syscalls_coordinator"] = sum(calls.values()) / traced
            for name, n in calls.items():
                out[f"sys_{name}"] = n / traced
    return out


def bench_args(doc: str, port_base: int) -> argparse.Namespace:
    """The options every pgbench comparison takes."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--port-base", type=int, default=port_base)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--impls", default="c,python",
                    help="the coordinator's implementations to run (CHORUS_IMPL), comma-separated")
    ap.add_argument("--visible-capture", action="store_true",
                    help="also 1- and 3-node clusters with extension 0.1's visible capture triggers")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                    help="also 1- and 3-node clusters (compiled path) named chorus-N-NAME whose coordinators have "
                         "these environment variables: an A/B comparison in one run, rounds interleaved; "
                         "CHORUS_BIN=PATH runs that chorus program instead (another checkout's venv)")
    ap.add_argument("--strace", type=float, default=0.0, metavar="SECONDS",
                    help="count the coordinators' system calls with strace -c -f for SECONDS at the end of each "
                         "run (0, the default: not at all)")
    return ap.parse_args()


def cluster_up(cluster: LocalCluster, nodes: int, port_base: int, impl: str,
               env: Optional[dict[str, str]] = None) -> list[dict[str, Any]]:
    """Start ``cluster`` with its coordinators on implementation ``impl`` (CHORUS_IMPL), and the
    environment variables ``env`` set for them."""
    env = {"CHORUS_IMPL": impl, **(env or {})}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return cluster.up(nodes, port_base)
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def bench_root(prefix: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    service_dir(root)  # the postgres user reaches the clusters inside (0750, group postgres)
    return root


def main() -> None:
    args = bench_args(__doc__ or "", 56433)
    root = bench_root("chorus-bench-")
    plain = Plain(root, args.port_base)
    clusters: list[LocalCluster] = []
    configs: dict[str, list[str]] = {"plain": [plain.dsn]}
    watch: dict[str, list[int]] = {"plain": []}  # each configuration's coordinators
    try:
        plain.start()
        port = args.port_base + 1
        for impl in args.impls.split(","):
            for nodes in (1, 3):
                name = f"chorus-{nodes}" + ("" if impl == "c" else f"-{impl}")
                cluster = LocalCluster(str(root / name))
                clusters.append(cluster)
                nodes_up = cluster_up(cluster, nodes, port, impl)
                configs[name] = [n["dsn"] for n in nodes_up]
                watch[name] = [n["coordinator_pid"] for n in nodes_up]
                port += nodes
        for spec in args.variant:
            vname, _, assigns = spec.partition(":")
            env = dict(a.split("=", 1) for a in assigns.split(",") if a)
            program = env.pop("CHORUS_BIN", "")
            for nodes in (1, 3):
                name = f"chorus-{nodes}-{vname}"
                cluster = LocalCluster(str(root / name))
                if program:  # another build's coordinator (a "before" from another checkout)
                    cluster.venv_chorus = program
                clusters.append(cluster)
                nodes_up = cluster_up(cluster, nodes, port, "c", env)
                configs[name] = [n["dsn"] for n in nodes_up]
                watch[name] = [n["coordinator_pid"] for n in nodes_up]
                port += nodes
        visible: list[str] = []
        for nodes in ((1, 3) if args.visible_capture else ()):
            name = f"chorus-{nodes}-visible"
            cluster = LocalCluster(str(root / name))
            clusters.append(cluster)
            nodes_up = cluster_up(cluster, nodes, port, "c")
            configs[name] = [n["dsn"] for n in nodes_up]
            watch[name] = [n["coordinator_pid"] for n in nodes_up]
            visible.append(name)
            port += nodes
        for dsns in configs.values():
            for dsn in dsns:
                pgbench_init(dsn, args.scale)
        for name in visible:
            for dsn in configs[name]:
                visible_capture(dsn)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
        single = {"plain": configs["plain"], "chorus-1": configs[next(k for k in configs if k.startswith("chorus-1"))]}
        latency: dict[str, list[dict[str, float]]] = {name: [] for name in single}
        for r in range(args.rounds):
            for name, dsns in configs.items():
                record(results, name, r + 1, pgbench_run(dsns, args.clients, args.seconds, root / "logs" / name,
                                                         watch=watch[name], strace=args.strace))
            for name, dsns in single.items():
                record(latency, name, r + 1, pgbench_run(dsns, 1, args.seconds, root / "logs" / f"1-{name}"))
    finally:
        for cluster in reversed(clusters):
            cluster.down()
        plain.stop()
    report(results, args, "")
    report_counts(results, args)
    report_latency(latency, args)
    shutil.rmtree(root, ignore_errors=True)


def report_latency(latency: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    """What Chorus adds to one commit: median p50 with one client, plain vs 1 node."""
    p50 = {k: statistics.median(x["p50_ms"] for x in v) for k, v in latency.items() if v}
    names = list(p50)
    added = p50[names[1]] - p50[names[0]]
    if args.json:
        print(json.dumps({"latency_one_client_p50_ms": p50, "added_p50_ms": added}))
        return
    print(f"\nLatency with one client (pgbench -N -c 1, medians of {args.rounds} rounds)")
    for k, v in p50.items():
        print(f"{k:<13} p50 {v:6.3f} ms")
    print(f"added by Chorus on 1 node: {added:.3f} ms per commit")


def report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace, note: str) -> None:
    """Medians of the rounds per configuration and the TPS ratio to "plain", as a table or JSON."""
    metrics = ("tps", "p50_ms", "p95_ms", *(f"cpu_us_{c}" for c in CPU_CLASSES))
    med = {k: {m: statistics.median(x.get(m, 0.0) for x in v) for m in (*metrics, *(m for m in v[0] if m not in metrics))}
           for k, v in results.items() if v}
    base = med["plain"]["tps"]
    if args.json:
        print(json.dumps({"median": med, "ratio_to_plain": {k: v["tps"] / base for k, v in med.items()},
                          "rounds": results, "args": vars(args)}, indent=2))
        return
    print(f"pgbench -N, {args.clients} clients, scale {args.scale}, {args.seconds} s x {args.rounds} rounds "
          f"(medians){note}")
    width = max(len(k) for k in med)
    print(f"{'configuration':<{width}} {'tps':>8} {'p50 ms':>8} {'p95 ms':>8} {'ratio':>6}")
    for k, v in med.items():
        print(f"{k:<{width}} {v['tps']:>8.0f} {v['p50_ms']:>8.2f} {v['p95_ms']:>8.2f} {v['tps'] / base:>6.2f}")
    print(f"\nCPU per transaction, microseconds (2 cores: {2e6 / base:.0f} us per transaction at the plain rate)")
    print(f"{'configuration':<{width}} " + " ".join(f"{c:>11}" for c in CPU_CLASSES) + f" {'total':>8}")
    for k, v in med.items():
        cells = [v[f"cpu_us_{c}"] for c in CPU_CLASSES]
        print(f"{k:<{width}} " + " ".join(f"{x:>11.0f}" for x in cells) + f" {sum(cells):>8.0f}")


def report_counts(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    """Per transaction, each configuration's own processes: its coordinators' CPU, their context
    switches (voluntary: wake-ups; involuntary: preemptions), Corosync's, and with ``--strace``
    the coordinators' system calls (the most frequent named)."""
    rows = {k: v for k, v in results.items() if v and "vcsw_coordinator" in v[0]}
    if not rows or args.json:
        return
    def med(v: list[dict[str, float]], m: str) -> float:
        return statistics.median(x.get(m, 0.0) for x in v)
    width = max(len(k) for k in rows)
    print(f"\nPer transaction, the configuration's own coordinators (medians of {args.rounds} rounds; "
          "csw: context switches, vol/invol)")
    print(f"{'configuration':<{width}} {'coord us':>9} {'coord csw':>13} {'corosync csw':>13} {'syscalls':>9}")
    for k, v in rows.items():
        sc = med(v, "syscalls_coordinator")
        print(f"{k:<{width}} {med(v, 'own_cpu_us_coordinator'):>9.0f} "
              f"{med(v, 'vcsw_coordinator'):>6.2f}/{med(v, 'ivcsw_coordinator'):<6.2f} "
              f"{med(v, 'vcsw_corosync'):>6.2f}/{med(v, 'ivcsw_corosync'):<6.2f} "
              + (f"{sc:>9.2f}" if sc else f"{'-':>9}"))
        names = sorted({m for x in v for m in x if m.startswith("sys_")}, key=lambda m: -med(v, m))
        if names:
            print(f"{'':<{width}}   " + ", ".join(f"{m[4:]} {med(v, m):.2f}" for m in names[:8]))


def record(results: dict[str, list[dict[str, float]]], name: str, round_no: int, res: dict[str, float]) -> None:
    results[name].append(res)
    print(f"round {round_no} {name}: {res['tps']:.0f} tps, p50 {res['p50_ms']:.2f} ms, "
          f"p95 {res['p95_ms']:.2f} ms", file=sys.stderr, flush=True)
    # every figure of the round, so that a run that fails later (a shared Corosync stopped by
    # another session's cluster) still leaves what it measured
    print(f"round {round_no} {name} {json.dumps(res)}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
