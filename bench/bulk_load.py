"""Bulk loads: ``pgbench -i -s N`` and a large COPY through one node of a 3-node Chorus cluster
vs plain PostgreSQL, in one run (issue: transactions of any size).

    .venv/bin/python bench/bulk_load.py [--scales 20] [--copy-mb 200] [--rounds 3] [--port-base 56433]

Each load is one large transaction (pgbench's client-side generation is one COPY per table;
the COPY is one statement). For Chorus the time runs until every node has committed it. Rounds
are interleaved; medians are reported with the ratio plain time / Chorus time (1.0: as fast as
one PostgreSQL). Peak memory is the most anonymous memory (RssAnon: what a process itself holds,
not the file pages it maps) each kind of process reached during the load: the origin backend
(the client's session), the apply backends of the other nodes, and the coordinators.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))

from chorus.testkit.check import node_refs, wait_quiescent  # noqa: E402
from chorus.testkit.localcluster import PGBIN, LocalCluster, PlainPostgres  # noqa: E402
from chorus.testkit.procmem import PeakMemory, children  # noqa: E402
from pgbench_compare import CPU_CLASSES, bench_root, cluster_up, cpu_seconds  # noqa: E402


def pgbench_init(dsn: str, scale: int) -> None:
    subprocess.run([str(PGBIN / "pgbench"), "-i", "-q", "-s", str(scale), dsn], check=True, capture_output=True,
                   timeout=3600)


def copy_file(path: Path, mb: int) -> None:
    """A CSV of about ``mb`` MB: an id and 100 bytes of text per row."""
    if path.exists():
        return
    with open(path, "w") as f:
        i, size = 0, 0
        while size < mb << 20:
            line = f"{i},{('%032x' % (i * 2654435761))[:32] * 3}xxxx\n"
            f.write(line)
            size += len(line)
            i += 1


def copy_load(dsn: str, path: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS bulk (id bigint PRIMARY KEY, pad text NOT NULL)")
        c.execute("TRUNCATE bulk")
    with psycopg.connect(dsn, autocommit=True) as c, c.cursor().copy("COPY bulk FROM STDIN (FORMAT csv)") as cp:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                cp.write(chunk)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", default="20", help="pgbench scales, comma-separated (100,000 rows each)")
    ap.add_argument("--copy-mb", type=int, default=200, help="size of the COPY load (0: none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port-base", type=int, default=56433)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    root = bench_root("chorus-bulk-")
    plain = PlainPostgres(root, args.port_base)
    cluster = LocalCluster(str(root / "chorus-3"))
    loads: list[tuple[str, Callable[[str], None]]] = [
        (f"pgbench -i -s {s}", lambda dsn, s=int(s): pgbench_init(dsn, s)) for s in args.scales.split(",") if s]
    if args.copy_mb:
        data = root / "bulk.csv"
        copy_file(data, args.copy_mb)
        loads.append((f"COPY {args.copy_mb} MB", lambda dsn: copy_load(dsn, data)))
    results: dict[str, dict[str, list[Any]]] = {name: {"plain": [], "chorus": [], "memory": [], "cpu": []}
                                                for name, _ in loads}
    try:
        plain.start()
        info = cluster_up(cluster, 3, args.port_base + 1, "c")
        refs = node_refs(info)
        origin_pm, others_pm = info[0]["pg_pid"], [n["pg_pid"] for n in info[1:]]
        groups: dict[str, Callable[[], list[int]]] = {
            "origin backend": lambda: children(origin_pm),
            "apply backends": lambda: [p for pm in others_pm for p in children(pm)],
            "coordinators": lambda: [n["coordinator_pid"] for n in info],
        }
        for r in range(args.rounds):
            for name, load in loads:
                t = time.monotonic()
                load(plain.dsn)
                results[name]["plain"].append(time.monotonic() - t)
                with PeakMemory(groups) as mem:
                    t, cpu = time.monotonic(), cpu_seconds()
                    load(info[0]["dsn"])
                    wait_quiescent(refs, 3600)
                    results[name]["chorus"].append(time.monotonic() - t)
                    used = cpu_seconds()
                results[name]["memory"].append(mem.mb())
                results[name]["cpu"].append({k: round(used[k] - cpu[k], 1) for k in CPU_CLASSES})
                print(f"round {r + 1}: {name}: plain {results[name]['plain'][-1]:.1f} s, "
                      f"chorus {results[name]['chorus'][-1]:.1f} s, peak MB {mem.mb()}, "
                      f"CPU s {results[name]['cpu'][-1]}", file=sys.stderr)
    finally:
        cluster.down()
        plain.stop()
    report(results, args.json)
    shutil.rmtree(root, ignore_errors=True)


def report(results: dict[str, dict[str, list[Any]]], as_json: bool) -> None:
    rows = []
    for name, r in results.items():
        if not r["chorus"]:
            continue
        p, c = statistics.median(r["plain"]), statistics.median(r["chorus"])
        peak = {k: max(m[k] for m in r["memory"]) for k in r["memory"][0]}
        cpu = {k: statistics.median(u[k] for u in r["cpu"]) for k in CPU_CLASSES}
        rows.append({"load": name, "plain_s": round(p, 2), "chorus_3_s": round(c, 2), "ratio": round(p / c, 2),
                     **{f"peak_mb_{k.replace(' ', '_')}": v for k, v in peak.items()},
                     **{f"cpu_s_{k}": v for k, v in cpu.items()}})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    head = ["load", "plain s", "chorus-3 s", "ratio", "origin backend MB", "apply backends MB", "coordinators MB",
            "CPU s: PostgreSQL", "coordinators", "Corosync", "client"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for x in rows:
        print(f"| {x['load']} | {x['plain_s']} | {x['chorus_3_s']} | {x['ratio']} | {x['peak_mb_origin_backend']} | "
              f"{x['peak_mb_apply_backends']} | {x['peak_mb_coordinators']} | {x['cpu_s_postgres']} | "
              f"{x['cpu_s_coordinator']} | {x['cpu_s_corosync']} | {x['cpu_s_client']} |")


if __name__ == "__main__":
    main()
