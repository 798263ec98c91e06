"""Certification state over a long run: does it stay flat?

    .venv/bin/python bench/cert_memory.py [--minutes 10] [--sample 30] [--json]

Starts a 3-node local cluster, runs transactions that each insert a new row (an ever-growing key
space, the worst case for the index) and move money between two accounts, from every node (two
clients each) for ``--minutes``, and samples on every node: the number of keys in the certification index, the
purge horizon, the committed GID and the coordinator's resident memory. Prints the first sample
(after a short warm-up) and the last, with the change; the whole series with --json. A bounded
index shows the same order of keys at the end as at the start while the GID keeps growing.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))

import psycopg  # noqa: E402

from chorus.testkit import check  # noqa: E402
from chorus.testkit import workload as wl  # noqa: E402
from chorus.testkit.localcluster import LocalCluster, service_dir  # noqa: E402

ACCOUNTS = 1000
LOG_SCHEMA = "CREATE TABLE IF NOT EXISTS certmem_log (id bigserial PRIMARY KEY, node text, amount integer)"


def transfer_and_log(conn: psycopg.Connection[Any], rnd: random.Random, node: str) -> Any:
    a, b = rnd.sample(range(ACCOUNTS), 2)
    amount = rnd.randint(1, 10)
    conn.execute("UPDATE bank_accounts SET balance = balance - %s WHERE id = %s", (amount, a))
    conn.execute("UPDATE bank_accounts SET balance = balance + %s WHERE id = %s", (amount, b))
    conn.execute("INSERT INTO certmem_log (node, amount) VALUES (%s, %s)", (node, amount))
    return None


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def sample(nodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for n in nodes:
        st = check.admin_request(n["admin"])["status"]
        out[n["name"]] = {"index_keys": st["certification_index_keys"],
                          "horizon": st["certification_horizon"],
                          "committed_gid": st["committed_gid"],
                          "rss_mib": round(rss_mib(n["coordinator_pid"]), 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--sample", type=float, default=30, help="seconds between samples")
    ap.add_argument("--port-base", type=int, default=57433)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="chorus-certmem-", dir="/tmp"))
    service_dir(root)  # the postgres user reaches the clusters inside
    cluster = LocalCluster(str(root / "c3"))
    series: list[dict[str, Any]] = []
    commits = 0
    try:
        nodes = cluster.up(3, args.port_base)
        refs = [check.NodeRef(n["name"], n["dsn"], n["admin"]) for n in nodes]
        with psycopg.connect(nodes[0]["dsn"], autocommit=True) as c:
            c.execute(wl.BANK_SCHEMA)
            c.execute(LOG_SCHEMA)
        check.wait_quiescent(refs)
        wl.bank_setup(nodes[0]["dsn"], ACCOUNTS, 1000)
        check.wait_quiescent(refs)
        seconds = args.minutes * 60
        results: list[wl.WorkerResult] = []
        load = threading.Thread(target=lambda: results.extend(
            wl.run_workload([(n["name"], n["dsn"]) for n in nodes], transfer_and_log, seconds)))
        t0 = time.monotonic()
        load.start()
        time.sleep(min(15.0, seconds / 4))  # warm-up: the index fills up to its window
        while load.is_alive():
            s = {"t_s": round(time.monotonic() - t0), "nodes": sample(nodes)}
            series.append(s)
            total = {k: sum(v[k] for v in s["nodes"].values()) for k in ("index_keys", "rss_mib")}
            print(f"{s['t_s']:>5} s  GID {max(v['committed_gid'] for v in s['nodes'].values()):>8}  "
                  f"index keys (all nodes) {total['index_keys']:>8}  coordinators RSS {total['rss_mib']:.0f} MiB",
                  file=sys.stderr, flush=True)
            load.join(args.sample)
        commits = sum(r.commits for r in results)
        check.wait_quiescent(refs)
        series.append({"t_s": round(time.monotonic() - t0), "nodes": sample(nodes)})
    finally:
        cluster.down()
    shutil.rmtree(root, ignore_errors=True)

    first, last = series[0], series[-1]
    if args.json:
        print(json.dumps({"minutes": args.minutes, "commits": commits, "series": series}, indent=2))
        return
    print(f"transfers + inserts from 3 nodes for {args.minutes:g} min: {commits} commits")
    print(f"{'node':<5} {'GID start':>10} {'GID end':>10} {'keys start':>11} {'keys end':>9} "
          f"{'RSS start MiB':>14} {'RSS end MiB':>12}")
    for name in first["nodes"]:
        a, b = first["nodes"][name], last["nodes"][name]
        print(f"{name:<5} {a['committed_gid']:>10} {b['committed_gid']:>10} {a['index_keys']:>11} "
              f"{b['index_keys']:>9} {a['rss_mib']:>14.1f} {b['rss_mib']:>12.1f}")
    keys = [sum(v["index_keys"] for v in s["nodes"].values()) for s in series[:-1]] or [0]
    print(f"index keys over the run (all nodes): median {statistics.median(keys):.0f}, max {max(keys)}")


if __name__ == "__main__":
    main()
