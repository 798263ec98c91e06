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


def pgbench_run(dsns: list[str], clients: int, seconds: int, logdir: Path,
                workload: tuple[str, ...] = ("-N",)) -> dict[str, float]:
    """Run pgbench (``workload``: its script options, -N by default) on every DSN at once,
    ``clients`` in all; total TPS, latency percentiles, and the CPU each class of process used
    per transaction in the middle of the run (``cpu_us_<class>``: where the time goes)."""
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
    cpu0, t0 = cpu_seconds(), time.monotonic()
    time.sleep(max(0.1, seconds - 2 * margin))
    cpu1, window = cpu_seconds(), time.monotonic() - t0
    tps = 0.0
    for p in procs:
        out = p.communicate(timeout=seconds + 120)[0]
        m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
        if p.returncode != 0 or not m:
            raise RuntimeError(f"pgbench failed:\n{out}")
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
    return ap.parse_args()


def cluster_up(cluster: LocalCluster, nodes: int, port_base: int, impl: str) -> list[dict[str, Any]]:
    """Start ``cluster`` with its coordinators on implementation ``impl`` (CHORUS_IMPL)."""
    saved = os.environ.get("CHORUS_IMPL")
    os.environ["CHORUS_IMPL"] = impl
    try:
        return cluster.up(nodes, port_base)
    finally:
        if saved is None:
            del os.environ["CHORUS_IMPL"]
        else:
            os.environ["CHORUS_IMPL"] = saved


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
    try:
        plain.start()
        port = args.port_base + 1
        for impl in args.impls.split(","):
            for nodes in (1, 3):
                name = f"chorus-{nodes}" + ("" if impl == "c" else f"-{impl}")
                cluster = LocalCluster(str(root / name))
                clusters.append(cluster)
                configs[name] = [n["dsn"] for n in cluster_up(cluster, nodes, port, impl)]
                port += nodes
        visible: list[str] = []
        for nodes in ((1, 3) if args.visible_capture else ()):
            name = f"chorus-{nodes}-visible"
            cluster = LocalCluster(str(root / name))
            clusters.append(cluster)
            configs[name] = [n["dsn"] for n in cluster_up(cluster, nodes, port, "c")]
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
                record(results, name, r + 1, pgbench_run(dsns, args.clients, args.seconds, root / "logs" / name))
            for name, dsns in single.items():
                record(latency, name, r + 1, pgbench_run(dsns, 1, args.seconds, root / "logs" / f"1-{name}"))
    finally:
        for cluster in reversed(clusters):
            cluster.down()
        plain.stop()
    report(results, args, "")
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
    med = {k: {m: statistics.median(x.get(m, 0.0) for x in v) for m in metrics} for k, v in results.items() if v}
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


def record(results: dict[str, list[dict[str, float]]], name: str, round_no: int, res: dict[str, float]) -> None:
    results[name].append(res)
    print(f"round {round_no} {name}: {res['tps']:.0f} tps, p50 {res['p50_ms']:.2f} ms, "
          f"p95 {res['p95_ms']:.2f} ms", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
