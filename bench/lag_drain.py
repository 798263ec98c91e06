"""Does apply keep up with the origin? pgbench -N on one node of a 3-node cluster; the others'
lag is sampled while the load runs, and the time it takes to drain once it stops.

    .venv/bin/python bench/lag_drain.py [--seconds 15] [--rounds 3] [--clients 4] [--scale 10]

Per round: the origin's TPS, the replicas' lag (GIDs and milliseconds: how long the oldest
certified writeset not yet committed there has waited) as median and maximum of samples taken
every 50 ms, and the drain time: from pgbench's end until both replicas have committed
everything certified. Medians over rounds. The claim checked (Streams paper): lag stays bounded
and drains within a second.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chorus.admin import admin_request  # noqa: E402
from chorus.testkit.localcluster import LocalCluster, service_dir  # noqa: E402
from pgbench_compare import pgbench_init, pgbench_run  # noqa: E402

SAMPLE_S = 0.05


def lag(admin: str) -> tuple[int, float]:
    st = admin_request(admin)["status"]
    return int(st["lag_gids"]), float(st["lag_ms"])


def one_round(nodes: list[dict[str, Any]], clients: int, seconds: int, logdir: Path) -> dict[str, float]:
    replicas = [n["admin"] for n in nodes[1:]]
    samples: list[tuple[int, float]] = []
    running = threading.Event()
    running.set()

    def sampler() -> None:
        while running.is_set():
            samples.extend(lag(a) for a in replicas)
            time.sleep(SAMPLE_S)

    t = threading.Thread(target=sampler)
    t.start()
    try:
        res = pgbench_run([nodes[0]["dsn"]], clients, seconds, logdir)
    finally:
        stopped = time.monotonic()
        running.clear()
        t.join()
    while any(lag(a)[0] for a in replicas):
        if time.monotonic() - stopped > 120:
            raise RuntimeError("replicas did not drain within 120 s")
        time.sleep(0.01)
    drain = time.monotonic() - stopped
    gids = sorted(s[0] for s in samples)
    ms = sorted(s[1] for s in samples)
    return {"tps": res["tps"], "lag_gids_median": float(statistics.median(gids)),
            "lag_gids_max": float(gids[-1]), "lag_ms_median": statistics.median(ms), "lag_ms_max": ms[-1],
            "drain_s": drain}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--port-base", type=int, default=56533)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="chorus-lag-", dir="/tmp"))
    service_dir(root)  # the postgres user reaches the clusters inside
    cluster = LocalCluster(str(root / "c3"))
    rounds: list[dict[str, float]] = []
    try:
        nodes = cluster.up(3, args.port_base)
        pgbench_init(nodes[0]["dsn"], args.scale)
        for n in nodes[1:]:
            pgbench_init(n["dsn"], args.scale)
        for r in range(args.rounds):
            res = one_round(nodes, args.clients, args.seconds, root / "logs")
            rounds.append(res)
            print(f"round {r + 1}: origin {res['tps']:.0f} tps; replica lag median {res['lag_gids_median']:.0f} "
                  f"GIDs / {res['lag_ms_median']:.1f} ms, max {res['lag_gids_max']:.0f} GIDs / "
                  f"{res['lag_ms_max']:.1f} ms; drained {res['drain_s'] * 1000:.0f} ms after the load stopped",
                  file=sys.stderr, flush=True)
    finally:
        cluster.down()
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    if args.json:
        print(json.dumps({"median": med, "rounds": rounds, "args": vars(args)}, indent=2))
    else:
        print(f"pgbench -N on node 1 of 3, {args.clients} clients, scale {args.scale}, "
              f"{args.seconds} s x {args.rounds} rounds (medians)")
        print(f"origin tps {med['tps']:.0f}")
        print(f"replica lag: median {med['lag_gids_median']:.0f} GIDs, {med['lag_ms_median']:.1f} ms; "
              f"max {med['lag_gids_max']:.0f} GIDs, {med['lag_ms_max']:.1f} ms")
        verdict = "within" if med["drain_s"] <= 1.0 else "NOT within"
        print(f"drain after the load stops: {med['drain_s'] * 1000:.0f} ms ({verdict} 1 s)")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
