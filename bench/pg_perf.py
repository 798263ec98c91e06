"""Where the origin's PostgreSQL spends its CPU per transaction, for two builds of the extension:
``perf record -g`` on one PostgreSQL's process tree under pgbench -N (docs/NATIVE.md, "Step 5,
second measures").

    .venv/bin/python bench/pg_perf.py --a /opt/pg-a/usr/lib/postgresql/15/bin \\
        --b /opt/pg-b/usr/lib/postgresql/15/bin [--seconds 10] [--rounds 2] [--out DIR] \\
        [--symbols chorus_capture,chorus_take_origin,...]

Plain PostgreSQL (build B's binaries, no extension) and two 1-node clusters, one per build (as
extension_ab.py starts them), rounds interleaved. In each run pgbench -N with 2 clients runs
while ``perf record -F 1999 -g`` samples the postmaster and its children for ``--seconds``; the
transactions are pg_stat_database's over the window. Prints, per configuration and round, the
µs per transaction of all of PostgreSQL and of each symbol asked for (inclusive; ``NAME:self``
for its own samples). The perf data stay in ``--out``. Needs perf and root.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))

import psycopg  # noqa: E402

import pgbench_compare as pc  # noqa: E402
from chorus.testkit import localcluster  # noqa: E402

XACTS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"


def use(pgbin: str) -> None:
    localcluster.PGBIN = Path(pgbin)
    os.environ["CHORUS_PGBIN"] = pgbin


def process_tree(dsn: str) -> list[int]:
    """The postmaster of the server at ``dsn`` and its children."""
    with psycopg.connect(dsn) as c:
        row = c.execute("SHOW data_directory").fetchone()
    assert row is not None
    with open(os.path.join(row[0], "postmaster.pid")) as f:
        postmaster = int(f.readline())
    pids = [postmaster]
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                pids.append(int(p))
    return pids


def xacts(dsn: str) -> int:
    with psycopg.connect(dsn) as c:
        row = c.execute(XACTS).fetchone()
    assert row is not None
    return int(row[0])


def record(dsn: str, seconds: int, data: Path) -> int:
    """perf over the server's tree under pgbench -N: the transactions of the window."""
    bench = subprocess.Popen([pc.PGBENCH, "-N", "-c", "2", "-j", "2", "-T", str(seconds + 4), dsn],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.5)
        for _ in range(5):  # a child that ends while perf attaches fails the attempt
            x0 = xacts(dsn)
            r = subprocess.run(["perf", "record", "-q", "-F", "1999", "-g", "-o", str(data), "-p",
                                ",".join(map(str, process_tree(dsn))), "--", "sleep", str(seconds)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode == 0:
                return xacts(dsn) - x0
        raise RuntimeError("perf record failed five times")
    finally:
        bench.wait()


def per_transaction(data: Path, tx: int) -> tuple[float, dict[str, tuple[float, float]]]:
    """All samples and each symbol's (inclusive, self) in µs per transaction."""
    out = subprocess.run(["perf", "report", "-i", str(data), "--children", "--sort", "symbol", "--stdio",
                          "-g", "none", "--percent-limit", "0"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"Event count \(approx.\): (\d+)", out)
    assert m is not None, out[:500]
    total = float(m.group(1)) / 1000 / tx  # cpu-clock counts ns
    symbols = {}
    for line in out.splitlines():
        s = re.match(r"\s+([\d.]+)%\s+([\d.]+)%\s+\[.\]\s+(\S+)", line)
        if s:
            symbols[s.group(3)] = (float(s.group(1)) / 100 * total, float(s.group(2)) / 100 * total)
    return total, symbols


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="bin directory of build A (the baseline)")
    ap.add_argument("--b", required=True, help="bin directory of build B")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--port-base", type=int, default=57483)
    ap.add_argument("--out", type=Path, default=Path("/tmp/chorus-pg-perf"))
    ap.add_argument("--symbols", default="chorus_capture,chorus_keylimit_table_key,hash_create,chorus_take_origin,"
                    "chorus_lane_origin,chorus_setval_rewrite,chorus_setval_rewrite:self,chorus_certify,"
                    "chorus_send_done")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    root = pc.bench_root("chorus-perf-")
    use(args.b)
    plain = pc.Plain(root, args.port_base)
    clusters: list[localcluster.LocalCluster] = []
    configs = {"plain": plain.dsn}
    rows: dict[str, list[str]] = {}
    try:
        plain.start()
        for i, build in enumerate(("a", "b")):
            use(getattr(args, build))
            cluster = localcluster.LocalCluster(str(root / f"chorus-1-{build}"))
            clusters.append(cluster)
            configs[f"chorus-1-{build}"] = pc.cluster_up(cluster, 1, args.port_base + 1 + i, "c")[0]["dsn"]
        for dsn in configs.values():
            pc.pgbench_init(dsn, args.scale)
        wanted = args.symbols.split(",")
        for r in range(args.rounds):
            for name, dsn in configs.items():
                data = args.out / f"{name}-{r + 1}.data"
                tx = record(dsn, args.seconds, data)
                total, symbols = per_transaction(data, tx)
                column = [f"{total:.0f}"]
                for want in wanted:
                    sym, _, kind = want.partition(":")
                    column.append(f"{symbols.get(sym, (0.0, 0.0))[1 if kind == 'self' else 0]:.1f}")
                rows[f"{name} r{r + 1}"] = column
                print(f"{name} round {r + 1}: {tx} transactions, {total:.0f} µs per transaction", flush=True)
    finally:
        for cluster in reversed(clusters):
            cluster.down()
        plain.stop()
        shutil.rmtree(root, ignore_errors=True)
    names = list(rows)
    print("\n| µs per transaction | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for i, label in enumerate(["all of PostgreSQL"] + args.symbols.split(",")):
        print(f"| {label} | " + " | ".join(rows[n][i] for n in names) + " |")


if __name__ == "__main__":
    main()
