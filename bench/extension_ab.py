"""pgbench -N on two builds of the extension side by side: plain PostgreSQL, and 1- and 3-node
clusters whose PostgreSQL loads build A or build B, rounds interleaved, medians and ratios.

    .venv/bin/python bench/extension_ab.py --a /opt/pg-a/usr/lib/postgresql/15/bin \\
        --b /opt/pg-b/usr/lib/postgresql/15/bin [--seconds 10] [--rounds 3] [--clients 8]

Each of --a and --b is a copy of PostgreSQL 15's bin directory with a build of the extension
installed beside it (``make -C extension install DESTDIR=...``); plain PostgreSQL runs build B's
copy without the extension. The CPU columns say where the time goes (pgbench_compare.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))

import pgbench_compare as pc  # noqa: E402
from chorus.testkit import localcluster  # noqa: E402


def use(pgbin: str) -> None:
    """Start what follows with the binaries (and the extension) of ``pgbin``."""
    localcluster.PGBIN = Path(pgbin)
    os.environ["CHORUS_PGBIN"] = pgbin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="bin directory of build A (the baseline)")
    ap.add_argument("--b", required=True, help="bin directory of build B")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--nodes", default="1,3")
    ap.add_argument("--port-base", type=int, default=57433)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    root = pc.bench_root("chorus-ab-")
    use(args.b)
    plain = pc.Plain(root, args.port_base)
    clusters: list[localcluster.LocalCluster] = []
    configs: dict[str, list[str]] = {"plain": [plain.dsn]}
    try:
        plain.start()
        port = args.port_base + 1
        for nodes in (int(n) for n in args.nodes.split(",")):
            for build in ("a", "b"):
                use(getattr(args, build))
                cluster = localcluster.LocalCluster(str(root / f"chorus-{nodes}-{build}"))
                clusters.append(cluster)
                configs[f"chorus-{nodes}-{build}"] = [n["dsn"] for n in pc.cluster_up(cluster, nodes, port, "c")]
                port += nodes
        for dsns in configs.values():
            for dsn in dsns:
                pc.pgbench_init(dsn, args.scale)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
        for r in range(args.rounds):
            for name, dsns in configs.items():
                pc.record(results, name, r + 1, pc.pgbench_run(dsns, args.clients, args.seconds, root / "logs" / name))
    finally:
        for cluster in reversed(clusters):
            cluster.down()
        plain.stop()
    pc.report(results, args, f" — A: {args.a}, B: {args.b}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
