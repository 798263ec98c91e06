"""Total recovery (Merkle diff or copy, per table) vs a full copy (pg_dump | pg_restore), in one run.

    .venv/bin/python bench/total_recovery.py [--scales 10,100] [--drift 0.1,1,10] [--rounds 1]

Per scale, a 3-node cluster with pgbench's tables (scale 10: pgbench_accounts has 1,000,000
rows; 100: 10,000,000). Per drift level: n3 stops; on n1 that share of pgbench_accounts changes
(half updated, a quarter deleted, a quarter inserted); then

- total recovery: ``chorus node join --total`` rebuilds n3 and it goes online (node stopped to
  online); the bytes it read from the donor are reported beside the tables' size;
- full copy: ``pg_dump -Fc`` of n1's pgbench tables piped into ``pg_restore`` into an empty
  database on n3's server (what a rebuild by copying costs for the same tables).

Reports both times (median of --rounds) and the ratio full copy / total recovery (above 1:
total recovery is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

from chorus.testkit.localcluster import PGBIN, LocalCluster, service_dir  # noqa: E402

CHORUS = str(Path(sys.executable).parent / "chorus")
OFF = "-c chorus.capture=off -c chorus.replicate_ddl=off"


def drift(dsn: str, rows: int, share: float) -> int:
    n = max(4, int(rows * share / 100))
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 "
                  "WHERE aid IN (SELECT (random() * %s)::int + 1 FROM generate_series(1, %s))", (rows - 1, n // 2))
        c.execute("DELETE FROM pgbench_accounts WHERE aid IN "
                  "(SELECT (random() * %s)::int + 1 FROM generate_series(1, %s))", (rows - 1, n // 4))
        top = c.execute("SELECT max(aid) FROM pgbench_accounts").fetchone()[0]  # type: ignore[index]
        c.execute("INSERT INTO pgbench_accounts (aid, bid, abalance, filler) "
                  "SELECT %s + g, 1, 0, 'new' FROM generate_series(1, %s) g", (top, n // 4))
    return n


def full_copy(src: dict[str, Any], dst_node: dict[str, Any]) -> float:
    dst = dst_node["dsn"]  # over TCP, the password from the cluster's password file
    with psycopg.connect(dst, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS bench_copy")
        c.execute("CREATE DATABASE bench_copy")
    with psycopg.connect(dst.replace("dbname=postgres", "dbname=bench_copy"), autocommit=True) as c:
        c.execute("CREATE EXTENSION chorus")  # the dump's capture triggers need its functions
        c.execute("ALTER EVENT TRIGGER chorus_on_ddl_end DISABLE")  # the dump brings the triggers itself
    started = time.monotonic()
    dump = subprocess.Popen([str(PGBIN / "pg_dump"), "-Fc", "-t", "pgbench_*", src["dsn"]], stdout=subprocess.PIPE)
    subprocess.run([str(PGBIN / "pg_restore"), "--no-owner", "-d", dst.replace("dbname=postgres", "dbname=bench_copy")],
                   stdin=dump.stdout, check=True, env=dict(os.environ, PGOPTIONS=OFF))
    dump.wait()
    elapsed = time.monotonic() - started
    with psycopg.connect(dst, autocommit=True) as c:
        c.execute("DROP DATABASE bench_copy")
    return elapsed


def recover(directory: Path, extra: list[str]) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    p = subprocess.run([CHORUS, "node", "join", "--total", "--dir", str(directory), "n3", "--json", *extra],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"total recovery failed:\n{p.stderr[-3000:]}")
    elapsed = time.monotonic() - started
    rebuilt: dict[str, Any] = json.loads(p.stdout)["total_recovery"]
    return elapsed, rebuilt


def run_scale(root: Path, scale: int, drifts: list[float], rounds: int, port_base: int,
              extra: list[str], events: Optional[Path]) -> list[dict[str, Any]]:
    cluster = LocalCluster(str(root / f"s{scale}"))
    rows = scale * 100_000
    out: list[dict[str, Any]] = []
    try:
        nodes = cluster.up(3, port_base)
        for n in nodes:  # the same rows on every node, loaded beside Chorus (pgbench -i is deterministic)
            subprocess.run([str(PGBIN / "pgbench"), "-i", "-q", "-s", str(scale), n["dsn"]], check=True,
                           capture_output=True, env=dict(os.environ, PGOPTIONS=OFF))
        for pct in drifts:
            diffs, copies, read = [], [], []
            changed, size, modes = 0, 0, ""
            for _ in range(rounds):
                cluster.stop("n3")
                changed = drift(nodes[0]["dsn"], rows, pct)
                elapsed, rebuilt = recover(root / f"s{scale}", extra)
                if events is not None:  # where each phase ended, per run
                    with events.open("a") as f:
                        f.write(json.dumps({"rows": rows, "drift_pct": pct, "elapsed_s": elapsed,
                                            "events": rebuilt["events"]}) + "\n")
                diffs.append(elapsed)
                read.append(rebuilt["bytes_donor"])
                size = rebuilt["table_bytes"]
                modes = ", ".join(f"{t['table'].split('.')[-1]}: {t['mode']}" for t in rebuilt["tables"]
                                  if t["table"].endswith("accounts"))
                copies.append(full_copy(nodes[0], nodes[2]))
                print(f"rows {rows} drift {pct}% ({changed} rows): total recovery {diffs[-1]:.1f} s ({modes}, "
                      f"{read[-1] / 1e6:.1f} MB read), full copy {copies[-1]:.1f} s", file=sys.stderr, flush=True)
            out.append({"rows": rows, "drift_pct": pct, "rows_changed": changed, "recovery_s": statistics.median(diffs),
                        "full_copy_s": statistics.median(copies), "bytes_read": statistics.median(read),
                        "table_bytes": size, "accounts": modes,
                        "copy_over_recovery": statistics.median(copies) / statistics.median(diffs)})
    finally:
        cluster.down()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", default="10,100", help="pgbench scales (100,000 accounts each)")
    ap.add_argument("--drift", default="0.1,1,10", help="percentages of the table that change")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--port-base", type=int, default=56733)
    ap.add_argument("--spark-master", default=None, help="passed to chorus node join (default: its own)")
    ap.add_argument("--events", type=Path, default=None, help="append each run's progress events to this JSONL file")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="chorus-total-bench-", dir="/tmp"))
    service_dir(root)  # the postgres user reaches the clusters inside
    extra = ["--spark-master", args.spark_master] if args.spark_master else []
    results: list[dict[str, Any]] = []
    for scale in [int(x) for x in args.scales.split(",")]:
        results += run_scale(root, scale, [float(x) for x in args.drift.split(",")], args.rounds, args.port_base,
                             extra, args.events)
    if args.json:
        print(json.dumps({"results": results, "args": vars(args)}, indent=2))
    else:
        print(f"total recovery = chorus node join --total until online; full copy = pg_dump | pg_restore of the "
              f"pgbench tables ({args.rounds} round(s), medians)")
        print(f"{'rows':>9} {'drift %':>8} {'changed':>8} {'recovery s':>11} {'copy s':>8} {'copy/rec':>9} "
              f"{'read MB':>8} {'table MB':>9}  pgbench_accounts")
        for r in results:
            print(f"{r['rows']:>9} {r['drift_pct']:>8} {r['rows_changed']:>8} {r['recovery_s']:>11.1f} "
                  f"{r['full_copy_s']:>8.1f} {r['copy_over_recovery']:>9.2f} {r['bytes_read'] / 1e6:>8.1f} "
                  f"{r['table_bytes'] / 1e6:>9.1f}  {r['accounts']}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
