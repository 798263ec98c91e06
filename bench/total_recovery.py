"""Total recovery (Spark snapshot diff) vs a full copy (pg_dump | pg_restore), in one run.

    .venv/bin/python bench/total_recovery.py [--scale 10] [--drift 0.1,1,10] [--rounds 1]

A 2-node cluster with pgbench's tables (scale 10: pgbench_accounts has 1,000,000 rows). Per
drift level: n2 leaves; on n1 that share of pgbench_accounts changes (half updated, a quarter
deleted, a quarter inserted); then

- diff: ``chorus node join --total`` rebuilds n2 (Spark in local[*]) and it goes online;
- full copy: ``pg_dump -Fc -t pgbench_accounts`` of n1 piped into ``pg_restore`` into an empty
  database on n2's server (what a rebuild by copying costs for that table).

Reports both times (median of --rounds) and the ratio full copy / diff.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

from chorus.localcluster import PGBIN, LocalCluster  # noqa: E402
from pgbench_compare import pgbench_init  # noqa: E402

CHORUS = str(Path(sys.executable).parent / "chorus")


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


def full_copy(src: dict[str, Any], dst_port: int) -> float:
    dst = f"host=127.0.0.1 port={dst_port} dbname=postgres user=postgres"
    with psycopg.connect(dst, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS bench_copy")
        c.execute("CREATE DATABASE bench_copy")
    with psycopg.connect(dst.replace("dbname=postgres", "dbname=bench_copy"), autocommit=True) as c:
        c.execute("CREATE EXTENSION chorus")  # the dump's capture triggers need its functions
        c.execute("ALTER EVENT TRIGGER chorus_on_ddl_end DISABLE")  # the dump brings the triggers itself
    started = time.monotonic()
    dump = subprocess.Popen([str(PGBIN / "pg_dump"), "-Fc", "-t", "pgbench_accounts", "-h", "127.0.0.1",
                             "-p", str(src["port"]), "-U", "postgres", "postgres"], stdout=subprocess.PIPE)
    subprocess.run([str(PGBIN / "pg_restore"), "--no-owner", "-h", "127.0.0.1", "-p", str(dst_port),
                    "-U", "postgres", "-d", "bench_copy"], stdin=dump.stdout, check=True,
                   env=dict(os.environ, PGOPTIONS="-c chorus.capture=off -c chorus.replicate_ddl=off"))
    dump.wait()
    elapsed = time.monotonic() - started
    with psycopg.connect(dst, autocommit=True) as c:
        c.execute("DROP DATABASE bench_copy")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--drift", default="0.1,1,10", help="percentages of the table that change")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--port-base", type=int, default=56733)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="chorus-total-bench-", dir="/tmp"))
    os.chmod(root, 0o755)
    cluster = LocalCluster(str(root / "c2"))
    rows = args.scale * 100_000
    results: dict[str, dict[str, Any]] = {}
    try:
        nodes = cluster.up(2, args.port_base)
        for n in nodes:
            pgbench_init(n["dsn"], args.scale)
        for pct in [float(x) for x in args.drift.split(",")]:
            diffs, copies = [], []
            for r in range(args.rounds):
                cluster.stop("n2")
                changed = drift(nodes[0]["dsn"], rows, pct)
                started = time.monotonic()
                p = subprocess.run([CHORUS, "node", "join", "--total", "--dir", str(root / "c2"), "n2"],
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    raise RuntimeError(f"total recovery failed:\n{p.stderr[-3000:]}")
                diffs.append(time.monotonic() - started)
                copies.append(full_copy(nodes[0], nodes[1]["port"]))
                print(f"drift {pct}% ({changed} rows): diff {diffs[-1]:.1f} s, full copy {copies[-1]:.1f} s",
                      file=sys.stderr, flush=True)
            results[str(pct)] = {"rows_changed": changed, "diff_s": statistics.median(diffs),
                                 "full_copy_s": statistics.median(copies),
                                 "copy_over_diff": statistics.median(copies) / statistics.median(diffs)}
    finally:
        cluster.down()
    if args.json:
        print(json.dumps({"rows": rows, "drift": results, "args": vars(args)}, indent=2))
    else:
        print(f"pgbench_accounts, {rows} rows; diff = chorus node join --total until online, "
              f"full copy = pg_dump | pg_restore of the table ({args.rounds} round(s), medians)")
        print(f"{'drift %':>8} {'rows':>8} {'diff s':>8} {'copy s':>8} {'copy/diff':>10}")
        for pct, r in results.items():
            print(f"{pct:>8} {r['rows_changed']:>8} {r['diff_s']:>8.1f} {r['full_copy_s']:>8.1f} "
                  f"{r['copy_over_diff']:>10.2f}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
