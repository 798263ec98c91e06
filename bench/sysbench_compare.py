"""sysbench oltp_write_only and oltp_read_write: plain PostgreSQL vs a 1-node and a 3-node Chorus
cluster, in one run, so Chorus compares with published Galera and Group Replication figures
taken with the same tool.

    .venv/bin/python bench/sysbench_compare.py [--seconds 15] [--rounds 3] [--clients 8]

Debian's sysbench (1.0, its PostgreSQL driver). The tables are prepared once per configuration
(on node 1; the other nodes get them by replication); rounds are interleaved and the median of
each is reported with the ratio to plain PostgreSQL. The 3-node load is spread over all nodes
(threads divided between them). As in pgbench_compare.py, a second table says where the CPU
goes per transaction. sysbench retries a transaction that fails with a serialization failure
(a certification conflict, 40001) or a deadlock; their rate is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chorus.testkit.check import node_refs, wait_quiescent  # noqa: E402
from chorus.testkit.localcluster import LocalCluster  # noqa: E402
from pgbench_compare import CPU_CLASSES, Plain, bench_root, cpu_seconds  # noqa: E402

SYSBENCH = shutil.which("sysbench") or "/usr/bin/sysbench"
WORKLOADS = ("oltp_write_only", "oltp_read_write")


def _opts(port: int, tables: int, size: int) -> list[str]:
    return ["--db-driver=pgsql", "--pgsql-host=127.0.0.1", f"--pgsql-port={port}", "--pgsql-user=postgres",
            "--pgsql-db=postgres", f"--tables={tables}", f"--table-size={size}"]


def _env(passfile: Path) -> dict[str, str]:
    """sysbench gives libpq no password: libpq takes it from the password file (never a command line)."""
    return dict(os.environ, PGPASSFILE=str(passfile))


def prepare(port: int, passfile: Path, tables: int, size: int) -> None:
    subprocess.run([SYSBENCH, "oltp_common", *_opts(port, tables, size), "prepare"], check=True,
                   capture_output=True, text=True, env=_env(passfile))


def run(workload: str, ports: list[int], passfile: Path, threads: int, seconds: int, tables: int,
        size: int) -> dict[str, float]:
    """``workload`` on every port at once, ``threads`` in all: transactions and errors per
    second, latency (average and 95th percentile, of the slowest node's clients), CPU per class."""
    per = [threads // len(ports) + (1 if i < threads % len(ports) else 0) for i in range(len(ports))]
    procs = [subprocess.Popen([SYSBENCH, workload, *_opts(port, tables, size), f"--threads={n}", f"--time={seconds}",
                               "--percentile=95", "--report-interval=0", "run"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(passfile))
             for port, n in zip(ports, per)]
    margin = min(1.0, seconds / 4)
    time.sleep(margin)
    cpu0, t0 = cpu_seconds(), time.monotonic()
    time.sleep(max(0.1, seconds - 2 * margin))
    cpu1, window = cpu_seconds(), time.monotonic() - t0
    tps = errors = 0.0
    avg: list[float] = []
    p95: list[float] = []
    for p in procs:
        out = p.communicate(timeout=seconds + 120)[0]
        t = re.search(r"transactions:\s+\d+\s+\(([\d.]+) per sec", out)
        e = re.search(r"ignored errors:\s+\d+\s+\(([\d.]+) per sec", out)
        a = re.search(r"avg:\s+([\d.]+)", out)
        q = re.search(r"95th percentile:\s+([\d.]+)", out)
        if p.returncode != 0 or not t:
            raise RuntimeError(f"sysbench {workload} failed:\n{out}")
        tps += float(t.group(1))
        errors += float(e.group(1)) if e else 0.0
        avg.append(float(a.group(1)) if a else 0.0)
        p95.append(float(q.group(1)) if q else 0.0)
    res = {"tps": tps, "errors_per_s": errors, "avg_ms": max(avg), "p95_ms": max(p95)}
    for cls in CPU_CLASSES:
        res[f"cpu_us_{cls}"] = (cpu1[cls] - cpu0[cls]) / (tps * window) * 1e6 if tps else 0.0
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8, help="sysbench threads in all")
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--table-size", type=int, default=20000)
    ap.add_argument("--port-base", type=int, default=57433)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    root = bench_root("chorus-sysbench-")
    plain = Plain(root, args.port_base)
    one = LocalCluster(str(root / "c1"))
    three = LocalCluster(str(root / "c3"))
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        w: {"plain": [], "chorus-1": [], "chorus-3": []} for w in WORKLOADS}
    try:
        plain.start()
        n1 = one.up(1, args.port_base + 1)
        n3 = three.up(3, args.port_base + 2)
        configs = {"plain": ([plain.port], plain.passfile), "chorus-1": ([n["port"] for n in n1], one.passfile),
                   "chorus-3": ([n["port"] for n in n3], three.passfile)}
        for ports, passfile in configs.values():
            prepare(ports[0], passfile, args.tables, args.table_size)
        wait_quiescent(node_refs(n3), timeout=300)
        for r in range(args.rounds):
            for w in WORKLOADS:
                for name, (ports, passfile) in configs.items():
                    res = run(w, ports, passfile, args.clients, args.seconds, args.tables, args.table_size)
                    results[w][name].append(res)
                    print(f"round {r + 1} {w} {name}: {res['tps']:.0f} tps, {res['errors_per_s']:.1f} retries/s, "
                          f"p95 {res['p95_ms']:.2f} ms", file=sys.stderr, flush=True)
    finally:
        three.down()
        one.down()
        plain.stop()
    report(results, args)
    shutil.rmtree(root, ignore_errors=True)


def report(results: dict[str, dict[str, list[dict[str, float]]]], args: argparse.Namespace) -> None:
    metrics = ("tps", "errors_per_s", "avg_ms", "p95_ms", *(f"cpu_us_{c}" for c in CPU_CLASSES))
    med = {w: {k: {m: statistics.median(x[m] for x in v) for m in metrics} for k, v in by.items() if v}
           for w, by in results.items()}
    if args.json:
        print(json.dumps({"median": med, "rounds": results, "args": vars(args)}, indent=2))
        return
    for w, by in med.items():
        base = by["plain"]["tps"]
        print(f"sysbench {w}, {args.clients} threads, {args.tables} tables x {args.table_size} rows, "
              f"{args.seconds} s x {args.rounds} rounds (medians)")
        print(f"{'configuration':<14} {'tps':>8} {'retry/s':>8} {'avg ms':>8} {'p95 ms':>8} {'ratio':>6} "
              + " ".join(f"{'cpu ' + c:>15}" for c in CPU_CLASSES))
        for k, v in by.items():
            print(f"{k:<14} {v['tps']:>8.0f} {v['errors_per_s']:>8.1f} {v['avg_ms']:>8.2f} {v['p95_ms']:>8.2f} "
                  f"{v['tps'] / base:>6.2f} " + " ".join(f"{v[f'cpu_us_{c}']:>15.0f}" for c in CPU_CLASSES))
        print()


if __name__ == "__main__":
    main()
