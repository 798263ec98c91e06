"""What the commit time in the apply statement costs the apply backend (docs/NATIVE.md, "Step 5,
second measures").

    .venv/bin/python bench/apply_timed.py [--writesets 5000] [--rounds 5] [--port 56533]

One PostgreSQL with the extension of ``CHORUS_PGBIN`` and no coordinator (apply_cost.py's), one
table of 10,000 rows; an ``ApplySession`` applies one-row pgbench-like writesets, a fresh session
per round, rounds alternating between the plain statement (``stamps=False``) and the timed one
that sets ``chorus.commit_time`` (``stamps=True``). Prints the apply backend's CPU per writeset
(user + system from /proc), each round and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))

import apply_cost as ac  # noqa: E402
from chorus import wire  # noqa: E402
from chorus.commit.applier import ApplySession  # noqa: E402

TIME0 = 1_790_000_000_000_000  # µs since the Unix epoch: the commit times given


async def one_round(dsn: str, stream: list[bytes], stamps: bool) -> float:
    """Apply the stream in a fresh session: the backend's CPU µs per writeset."""
    s = ApplySession(dsn, "timed", stamps=stamps)
    await s.connect()
    try:
        assert s.conn is not None and s.timed == stamps
        cur = await s.conn.execute("SELECT chorus.committed_gid()")
        row = await cur.fetchone()
        assert row is not None
        gid = int(row[0])
        for i, ws in enumerate(stream):
            if i == 200:  # after warming the caches (plans, the table's description)
                cpu0 = ac.cpu_seconds(s.pid)
            gid += 1
            await s.apply_run(gid, gid - 1, [wire.scan(ws)], commit_time=TIME0 + gid)
        return (ac.cpu_seconds(s.pid) - cpu0) / (len(stream) - 200) * 1e6
    finally:
        await s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writesets", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--port", type=int, default=56533)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="chorus-timed-", dir="/tmp"))
    root.chmod(0o755)  # the postgres user makes its directory inside
    server = ac.Server(Path(os.environ.get("CHORUS_PGBIN", "/usr/lib/postgresql/15/bin")), root / "pg", args.port)
    stream = [ac.writeset(1 + i % ac.ROWS, i) for i in range(args.writesets + 200)]
    server.start()
    try:
        results: dict[str, list[float]] = {"plain": [], "timed": []}
        for r in range(args.rounds):
            for name in results:
                results[name].append(asyncio.run(one_round(server.dsn, stream, name == "timed")))
                print(f"round {r + 1} {name}: {results[name][-1]:.1f} µs per writeset", flush=True)
        for name, v in results.items():
            print(f"{name}: median {statistics.median(v):.1f} µs per writeset ({', '.join(f'{x:.0f}' for x in v)})")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
