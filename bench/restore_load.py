"""Bringing a database into a 3-node cluster: pg_restore -j 4 of one dump into plain PostgreSQL,
replicated through one node, and the fast way (``chorus load --fast``: into one node alone, the
others rebuilt by total recovery), in one run (issue 35, docs/MIGRATION.md).

    .venv/bin/python bench/restore_load.py [--scale 20] [--rounds 3] [--jobs 4] [--port-base 56633]

The dump is ``pgbench -i -s SCALE`` plus a second copy of its accounts with two more indexes and a
foreign key (so pg_restore has indexes and constraints to build in parallel), made once on the
plain PostgreSQL and dumped with ``pg_dump -Fc``. Each round restores it, from an empty
database, into the plain server, into the cluster through node n1 with every node online
(timed until every node has committed everything), and into the cluster the fast way (timed
until every node is online again). Rounds are interleaved; medians and the ratios plain time /
Chorus time (1.0: as fast as one PostgreSQL) are reported.
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
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))

from chorus.testkit.check import node_refs, wait_quiescent  # noqa: E402
from chorus.testkit.localcluster import PGBIN, LocalCluster, PlainPostgres  # noqa: E402
from chorus.migrate import load as loading  # noqa: E402
from pgbench_compare import bench_root, cluster_up  # noqa: E402

EXTRA = """
CREATE TABLE accounts_copy (LIKE pgbench_accounts INCLUDING ALL);
INSERT INTO accounts_copy SELECT * FROM pgbench_accounts;
CREATE INDEX accounts_copy_bid ON accounts_copy (bid);
CREATE INDEX accounts_copy_filler ON accounts_copy (abalance, aid);
ALTER TABLE accounts_copy ADD FOREIGN KEY (bid) REFERENCES pgbench_branches (bid);
CREATE FUNCTION balance_of(a int) RETURNS int LANGUAGE sql STABLE
  BEGIN ATOMIC SELECT abalance FROM pgbench_accounts WHERE aid = a; END;
CREATE ROLE bench_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO bench_reader;
"""

# what a restore leaves, emptied before the next one (on a cluster: replicated)
DROP = ("DROP TABLE IF EXISTS accounts_copy, pgbench_accounts, pgbench_branches, pgbench_history, "
        "pgbench_tellers CASCADE; DROP FUNCTION IF EXISTS balance_of(int)")


def make_dump(dsn: str, scale: int, path: Path) -> None:
    subprocess.run([str(PGBIN / "pgbench"), "-i", "-q", "-s", str(scale), dsn], check=True, capture_output=True)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(EXTRA)
    subprocess.run([str(PGBIN / "pg_dump"), "-Fc", "-f", str(path), dsn], check=True, capture_output=True)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(DROP)


def empty(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(DROP)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=20, help="pgbench scale of the dump (100,000 accounts each)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--port-base", type=int, default=56633)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    root = bench_root("chorus-restore-")
    plain = PlainPostgres(root, args.port_base)
    cluster = LocalCluster(str(root / "chorus-3"))
    dump = root / "app.dump"
    times: dict[str, list[float]] = {"plain": [], "replicated": [], "fast": []}
    steps: list[dict[str, Any]] = []
    try:
        plain.start()
        make_dump(plain.dsn, args.scale, dump)
        info = cluster_up(cluster, 3, args.port_base + 1, "c")
        refs = node_refs(info)
        with psycopg.connect(info[0]["dsn"], autocommit=True) as c:
            c.execute("CREATE ROLE bench_reader")
        for r in range(args.rounds):
            times["plain"].append(loading.pg_restore(plain.dsn, str(dump), args.jobs))
            empty(plain.dsn)

            t = time.monotonic()
            loading.pg_restore(info[0]["dsn"], str(dump), args.jobs)
            wait_quiescent(refs, 3600)
            times["replicated"].append(time.monotonic() - t)
            empty(info[0]["dsn"])
            wait_quiescent(refs, 600)

            t = time.monotonic()
            steps.append(loading.through_one_node(str(cluster.dir), str(dump), "n1", lambda s: None, args.jobs))
            times["fast"].append(time.monotonic() - t)
            wait_quiescent(refs, 600)
            empty(info[0]["dsn"])
            wait_quiescent(refs, 600)
            print(f"round {r + 1}: plain {times['plain'][-1]:.1f} s, replicated {times['replicated'][-1]:.1f} s, "
                  f"fast {times['fast'][-1]:.1f} s ({steps[-1]})", file=sys.stderr)
    finally:
        cluster.down()
        plain.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"dump_mb": round(dump.stat().st_size / 1e6, 1), "scale": args.scale, "jobs": args.jobs,
           "median_s": {k: round(v, 2) for k, v in med.items()},
           "ratio_to_plain": {k: round(med["plain"] / v, 2) for k, v in med.items() if k != "plain"},
           "fast_over_replicated": round(med["replicated"] / med["fast"], 2), "rounds": times, "fast_steps": steps}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"pg_restore -j {args.jobs} of pgbench -i -s {args.scale} and more ({out['dump_mb']} MB dump), "
              f"medians of {args.rounds} rounds")
        print("| load | s | ratio to plain |")
        print("|---|---|---|")
        for k in ("plain", "replicated", "fast"):
            print(f"| {k} | {out['median_s'][k]} | {out['ratio_to_plain'].get(k, 1.0)} |")
        print(f"the fast way is {out['fast_over_replicated']}x the replicated restore")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
