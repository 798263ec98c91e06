"""Commit latency and throughput of the 3-host lab under network delay, vs plain PostgreSQL.

    .venv/bin/python bench/lab_latency.py [--seconds 15] [--rounds 3] [--clients 8] [--scale 10]

The lab (chorus.testkit.lab: each host a network namespace with its own Corosync over knet with crypto,
PostgreSQL and coordinator, on the lab's user-space switch) runs pgbench -N on every host at
once, the clients divided between them, with 0, 1 and 5 ms of delay added to every frame
between hosts. A plain PostgreSQL with the same settings runs the same pgbench in the same
rounds. Medians of the rounds; latency percentiles from pgbench's per-transaction log.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pgbench_compare import Plain, bench_args, bench_root, pgbench_init, pgbench_run, record, report  # noqa: E402

from chorus.testkit.lab.rig import Lab  # noqa: E402

DELAYS = (0, 1, 5)


def main() -> None:
    args = bench_args(__doc__ or "", 57433)
    root = bench_root("chorus-labbench-")
    plain = Plain(root, args.port_base)
    lab = Lab(str(root / "lab"), log=lambda s: print(s, file=sys.stderr))
    names = ["plain"] + [f"lab, {d} ms delay" for d in DELAYS]
    results: dict[str, list[dict[str, float]]] = {k: [] for k in names}
    try:
        plain.start()
        hosts = lab.create(3, args.port_base + 1)
        dsns = [h["socket_dsn"] for h in hosts]
        pgbench_init(plain.dsn, args.scale)
        for dsn in dsns:
            pgbench_init(dsn, args.scale)
        for r in range(args.rounds):
            record(results, "plain", r + 1, pgbench_run([plain.dsn], args.clients, args.seconds,
                                                        root / "logs" / "plain"))
            for d in DELAYS:
                lab.netem(f"delay {d}ms" if d else "")
                record(results, f"lab, {d} ms delay", r + 1,
                       pgbench_run(dsns, args.clients, args.seconds, root / "logs" / f"lab{d}"))
            lab.netem("")
    finally:
        lab.down()
        plain.stop()
    report(results, args, "; the lab's clients are spread over its 3 hosts")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
