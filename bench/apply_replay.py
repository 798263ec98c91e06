"""Apply throughput on a recorded writeset stream: serial vs parallel apply, and catch-up rate vs
the rate at which the cluster produced the stream.

    .venv/bin/python bench/apply_replay.py [--seconds 20] [--rounds 3] [--clients 4] [--scale 10]

A 2-node cluster. Node n2 is stopped; pgbench runs on n1 for --seconds (one mix after the
other), so n1's writeset log records the stream (the production rate is the GIDs n1 certified
per second). n2's stopped node directory (database, state, log) is saved. Then, per round and per
worker count, n2 is restored from that copy and started: it catches up from n1's log through
partial recovery, which is the real apply path (dependency scheduler, apply sessions, commits in
GID order, durable GIDs), so each run replays the very same stream. The rate is the catch-up's
own: writesets applied per second from its first record to the last one committed.

Mixes:
- low-conflict: pgbench -N (random accounts among scale x 100,000; history rows carry no key);
- high-conflict: every transaction also updates one of 4 branch rows, so most neighbouring
  writesets depend on each other.

Each stream is replayed three ways: serial and parallel apply one writeset per transaction (the
live apply path, issue 5's comparison); batched is partial recovery's default, runs of
consecutive writesets in one transaction (apply.catchup_batch). Medians over rounds; the ratios
are parallel / serial and batched catch-up / production.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from chorus.config import load_config, write_config  # noqa: E402
from chorus.admin import admin_request  # noqa: E402
from chorus.testkit.localcluster import LocalCluster, service_dir  # noqa: E402
from pgbench_compare import pgbench_init, pgbench_run  # noqa: E402

HOT_BRANCHES = """\\set aid random(1, 100000 * :scale)
\\set bid random(1, 4)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
END;
"""


def status(admin: str) -> dict[str, Any]:
    return admin_request(admin)["status"]  # type: ignore[no-any-return]


def fingerprint(dsn: str) -> tuple[Any, ...]:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT (SELECT sum(abalance) FROM pgbench_accounts),"
                        " (SELECT sum(bbalance) FROM pgbench_branches),"
                        " (SELECT count(*) FROM pgbench_history)").fetchone()
        assert row is not None
        return tuple(row)


def produce(cluster: LocalCluster, nodes: list[dict[str, Any]], workload: tuple[str, ...], clients: int,
            seconds: int, logdir: Path) -> dict[str, float]:
    """Stop n2, run the load on n1, save n2's directory. The stream is (before, after]."""
    cluster.stop("n2")
    before = status(nodes[0]["admin"])["committed_gid"]
    res = pgbench_run([nodes[0]["dsn"]], clients, seconds, logdir, workload)
    after = status(nodes[0]["admin"])["committed_gid"]
    return {"tps": res["tps"], "gids": after - before, "gids_per_s": (after - before) / seconds}


def replay(cluster: LocalCluster, node: dict[str, Any], saved: Path, workers: int, batch: int) -> dict[str, float]:
    """Restore n2 from ``saved``, set its apply workers and catch-up batch, start it and time its
    catch-up."""
    cluster.stop("n2")
    ndir = cluster.node_dir("n2")
    shutil.rmtree(ndir)
    subprocess.run(["cp", "-a", str(saved), str(ndir)], check=True)
    toml = str(ndir / "chorus.toml")
    write_config(dataclasses.replace(load_config(toml), apply_workers=workers, catchup_batch=batch), toml)
    cluster.start("n2", wait=False)
    deadline = time.monotonic() + 600
    while True:
        try:
            st = status(node["admin"])
        except OSError:
            st = {}
        rec = st.get("recovery") or {}
        if st.get("state") == "online" and rec.get("state") == "done":
            break
        if st.get("state") in ("needs_recovery", "failed") or rec.get("state") == "failed":
            raise RuntimeError(f"n2 did not catch up: {st.get('state')}: {st.get('reason')}")
        if time.monotonic() > deadline:
            raise RuntimeError("n2 did not catch up within 600 s")
        time.sleep(0.1)
    return {"records": rec["records"], "elapsed_s": rec["elapsed_s"],
            "gids_per_s": rec["records"] / rec["elapsed_s"], "mb_per_s": rec["rate_mb_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=20, help="how long each mix is produced")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4, help="apply workers of the parallel runs")
    ap.add_argument("--batch", type=int, default=32, help="apply.catchup_batch of the batched runs")
    ap.add_argument("--port-base", type=int, default=56633)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="chorus-replay-", dir="/tmp"))
    service_dir(root)  # the postgres user reaches the clusters inside
    script = root / "hot_branches.sql"
    script.write_text(HOT_BRANCHES)
    os.chmod(script, 0o644)
    mixes = {"low-conflict": ("-N",), "high-conflict": ("-f", str(script))}
    cluster = LocalCluster(str(root / "c2"))
    results: dict[str, dict[str, Any]] = {}
    try:
        nodes = cluster.up(2, args.port_base)
        for n in nodes:
            pgbench_init(n["dsn"], args.scale)
        for mix, workload in mixes.items():
            cluster.start("n2")
            saved = root / f"n2-before-{mix}"
            prod = produce(cluster, nodes, workload, args.clients, args.seconds, root / "logs")
            subprocess.run(["cp", "-a", str(cluster.node_dir("n2")), str(saved)], check=True)
            print(f"{mix}: n1 produced {prod['gids']} GIDs at {prod['gids_per_s']:.0f}/s "
                  f"({prod['tps']:.0f} tps)", file=sys.stderr, flush=True)
            runs: dict[str, list[dict[str, float]]] = {"serial": [], "parallel": [], "batched": []}
            for r in range(args.rounds):
                for kind, workers, batch in (("serial", 1, 1), ("parallel", args.workers, 1),
                                             ("batched", args.workers, args.batch)):
                    res = replay(cluster, nodes[1], saved, workers, batch)
                    runs[kind].append(res)
                    print(f"  round {r + 1} {kind} ({workers} worker{'s' if workers > 1 else ''}, batch {batch}): "
                          f"{res['records']} writesets in {res['elapsed_s']:.1f} s = "
                          f"{res['gids_per_s']:.0f}/s, {res['mb_per_s']:.2f} MB/s", file=sys.stderr, flush=True)
                    if fingerprint(nodes[1]["dsn"]) != fingerprint(nodes[0]["dsn"]):
                        raise RuntimeError(f"n2 differs from n1 after the {kind} replay")
            shutil.rmtree(saved)
            med = {k: {m: statistics.median(x[m] for x in v) for m in ("gids_per_s", "mb_per_s", "elapsed_s")}
                   for k, v in runs.items()}
            results[mix] = {"production": prod, "median": med, "runs": runs,
                            "parallel_over_serial": med["parallel"]["gids_per_s"] / med["serial"]["gids_per_s"],
                            "catchup_over_production": med["batched"]["gids_per_s"] / prod["gids_per_s"]}
    finally:
        cluster.down()
    if args.json:
        print(json.dumps({"mixes": results, "args": vars(args)}, indent=2))
    else:
        print(f"recorded stream replayed by partial recovery, {args.rounds} rounds (medians); "
              f"serial = 1 apply worker, parallel = {args.workers}, one writeset per transaction; "
              f"batched = {args.workers} workers, runs of {args.batch} per transaction (catch-up's default)")
        print(f"{'mix':<14} {'produced/s':>10} {'serial/s':>9} {'parallel/s':>10} {'batched/s':>9} {'MB/s':>6} "
              f"{'par/ser':>8} {'catch-up/prod':>13}")
        for mix, r in results.items():
            m = r["median"]
            print(f"{mix:<14} {r['production']['gids_per_s']:>10.0f} {m['serial']['gids_per_s']:>9.0f} "
                  f"{m['parallel']['gids_per_s']:>10.0f} {m['batched']['gids_per_s']:>9.0f} "
                  f"{m['batched']['mb_per_s']:>6.2f} "
                  f"{r['parallel_over_serial']:>8.2f} {r['catchup_over_production']:>13.2f}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
