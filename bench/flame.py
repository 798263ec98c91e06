"""Where a coordinator's CPU goes per transaction: a flame graph and a table by segment of the path.

    .venv/bin/python bench/flame.py [--nodes 1] [--seconds 20] [--clients 8] [--impl c] [--out docs/flame]

Starts a local cluster (``--nodes``, coordinators on ``CHORUS_IMPL=--impl``), runs pgbench -N on
it (clients spread over every node), and samples node n1's coordinator with py-spy (``--native``:
Python frames and the C frames under them: uvloop, cffi, libcpg, libc). Two windows of the same
run: the first gives the collapsed stacks the table is made from, the second the SVG flame graph
(py-spy writes one format per recording). Written to ``OUT/<name>.txt`` (collapsed stacks),
``OUT/<name>.svg`` and ``OUT/<name>.md`` (the table), where name is ``coordinator-<nodes>n-<impl>``.

The table splits the coordinator's CPU per transaction (user and system time from /proc in the
sampled window, divided by the cluster's transactions in it) over the segments of a
transaction's path that docs/NATIVE.md section 1.2 estimated: each sample goes to the segment of
the innermost Chorus frame of its stack (a sample inside ``Scheduler.add`` called from
``CommitPipeline.admit`` is admission), or to the event loop's machinery when no Chorus frame is
on it. System time is the kernel's; py-spy sees it as the native frame that made the call, so
the segments include the system calls they make.

py-spy (PyPI, ``pip install '.[bench]'``) needs ptrace: run as root.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chorus.testkit.localcluster import PGBIN, LocalCluster, service_dir  # noqa: E402
from pgbench_compare import cluster_up, pgbench_init  # noqa: E402

PGBENCH = str(PGBIN / "pgbench")

# Segments of the path (docs/NATIVE.md 1.2), by the file of the innermost Chorus frame and, where
# one file serves two segments, its function. Checked in order; the first match names the segment.
SEGMENTS: tuple[tuple[str, str, Optional[str]], ...] = (
    ("(a)+(g) backend frames", "commit/backends.py", None),
    ("(a)+(g) backend frames", "commit/backendproto.py", None),
    ("(a)+(g) backend frames", "wire.py", None),
    ("(b) bus send", "bus/sender.py", None),
    ("(b) bus send", "bus/proto.py", r"^(encode|_encode|write_)"),
    ("(b) bus send", "bus/corosync.py", r"^(send|send_nowait|send_whole|_bytes|_mcast|whole_frame|_send)$"),
    ("(c) delivery", "bus/corosync.py", None),
    ("(c) delivery", "bus/fragment.py", None),
    ("(d) order and certification", "bus/proto.py", None),
    ("(d) order and certification", "replicator.py", None),
    ("(d) order and certification", "certifier.py", None),
    ("(d) order and certification", "outcomes.py", None),
    ("(d) order and certification", "membership.py", None),
    ("(f) log", "wslog/", None),
    ("(i) apply", "commit/applier.py", None),
    ("(e) admission, dispatch, commit book", "commit/pipeline.py", None),
    ("(e) admission, dispatch, commit book", "commit/book.py", None),
    ("(e) admission, dispatch, commit book", "commit/scheduler.py", None),
    ("(e) admission, dispatch, commit book", "_csched", None),
    ("(d) order and certification", "_ccert", None),
    ("(a)+(g) backend frames", "_cwire", None),
    ("(h) coordinator loop (_bus_loop, _act)", "chorus/coordinator.py", None),
    ("watchers: blockers, flow, lag, tick", "lockwatch.py", None),
    ("watchers: blockers, flow, lag, tick", "blockers.py", None),
    ("watchers: blockers, flow, lag, tick", "voting.py", None),
    ("watchers: blockers, flow, lag, tick", "nodedb.py", None),
    ("metrics and endpoints", "endpoints.py", None),
    ("metrics and endpoints", "nodestatus.py", None),
    ("metrics and endpoints", "prometheus_client", None),
)
LOOP = "(h) event loop machinery (no Chorus frame)"
# A sample whose innermost frame waits for the next event is the loop asleep, seen by py-spy
# (which cannot always tell a blocked thread from a running one): not counted in the shares.
WAITING = re.compile(r"^(epoll_wait|epoll_pwait|epoll_pwait2|poll|ppoll|select|pselect6?) ")

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::(?P<line>\d+))?\)$")


def segment(stack: Iterable[str]) -> str:
    """The segment a sample belongs to: that of its innermost Chorus frame (``stack`` runs from
    the outermost frame to the innermost, as py-spy's collapsed format writes it)."""
    for frame in reversed(list(stack)):
        m = FRAME.match(frame)
        func, file = (m.group("func"), m.group("file")) if m else (frame, "")
        if "psycopg" in file:
            return "(i) apply"
        method = func.rsplit(".", 1)[-1]  # "CorosyncBus._mcast" -> "_mcast"
        for name, where, funcs in SEGMENTS:
            if where in file and (funcs is None or re.search(funcs, method)):
                return name
    return LOOP


WAITING_KEY = "waiting for events"

# The kind of code a sample was running, by its innermost frame's file.
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("Python (interpreter)", re.compile(r"\.py$|^<string>$|^object\.h$|^(abstract|pyerrors|ceval)\w*\.[ch]$")),
    ("compiled Chorus parts (Cython, cffi core)", re.compile(r"chorus/_c\w+\.pyx$|_native")),
    ("uvloop and libuv", re.compile(r"^(loop\.c|core\.c|linux\.c|stream\.c|queue\.h|timer\.c|heap-inl\.h|"
                                    r"loop-watcher\.c|uv-common\.c|poll\.c|async\.c|idna\.c)$")),
    ("cffi, libcpg, libqb (Corosync's IPC)", re.compile(r"cffi|libcpg|libqb|libcorosync")),
    ("libc (system calls and their wrappers)", re.compile(r"libc\.so|libpthread")),
)


def kind(frame: str) -> str:
    """The kind of code of one py-spy frame ("func (file:line)")."""
    m = FRAME.match(frame)
    file = m.group("file") if m else ""
    for name, pattern in KINDS:
        if pattern.search(file):
            return name
    return "other native code"


def split(collapsed: str) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Samples per segment and per kind of code from py-spy's collapsed stacks ("f1;f2;f3 count"
    per line); samples asleep in the loop's wait count as :data:`WAITING_KEY` in both."""
    segments: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = stack.split(";")
            asleep = WAITING.match(frames[-1])
            segments[WAITING_KEY if asleep else segment(frames)] += int(count)
            kinds[WAITING_KEY if asleep else kind(frames[-1])] += int(count)
    return segments, kinds


def cpu_ticks(pid: int) -> tuple[int, int]:
    """User and system clock ticks used so far by process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def committed(dsn: str) -> int:
    """Cluster transactions committed so far, as node ``dsn`` holds them: pgbench -N inserts one
    row of pgbench_history per transaction, and every node holds every node's rows."""
    r = subprocess.run([str(PGBIN / "psql"), "-X", "-A", "-t", "-d", dsn, "-c", "SELECT count(*) FROM pgbench_history"],
                       capture_output=True, text=True, check=True)
    return int(r.stdout.strip())


def sample(pid: int, seconds: float, rate: int, fmt: str, out: Path) -> None:
    """Record coordinator ``pid`` with py-spy for ``seconds`` into ``out`` (format ``fmt``)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    r = subprocess.run([spy, "record", "--pid", str(pid), "--native", "--rate", str(rate),
                        "--duration", str(int(seconds)), "--format", fmt, "--output", str(out)],
                       capture_output=True, text=True)
    if r.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed ({r.returncode}): {r.stderr.strip()[-2000:]}")


def table(counts: collections.Counter[str], user_us: float, sys_us: float, what: str = "segment") -> str:
    """Samples by ``what`` as a markdown table: share of samples and µs of CPU per transaction."""
    waiting = counts.get(WAITING_KEY, 0)
    busy = collections.Counter({k: v for k, v in counts.items() if k != WAITING_KEY})
    total = sum(busy.values()) or 1
    cpu = user_us + sys_us
    rows = [f"| {what} | share of samples | µs/tx |", "| --- | --- | --- |"]
    for name, n in busy.most_common():
        rows.append(f"| {name} | {100 * n / total:.1f} % | {cpu * n / total:.0f} |")
    rows.append(f"| **all** ({total} samples, {waiting} more asleep in the loop's wait not counted; "
                f"CPU: user {user_us:.0f} + system {sys_us:.0f}) | 100 % | **{cpu:.0f}** |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--seconds", type=int, default=20, help="each of the two sampled windows")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--impl", default="c", help="CHORUS_IMPL of the coordinators")
    ap.add_argument("--port-base", type=int, default=57433)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "flame"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"coordinator-{args.nodes}n-{args.impl}"
    root = Path(tempfile.mkdtemp(prefix="chorus-flame-", dir="/tmp"))
    service_dir(root)
    cluster = LocalCluster(str(root / "cluster"))
    pgbench: list[subprocess.Popen[str]] = []
    try:
        nodes = cluster_up(cluster, args.nodes, args.port_base, args.impl)
        dsns = [n["dsn"] for n in nodes]
        pid = int(nodes[0]["coordinator_pid"])
        for dsn in dsns:
            pgbench_init(dsn, args.scale)
        run_s = 2 * args.seconds + 6
        per = [args.clients // len(dsns) + (1 if i < args.clients % len(dsns) else 0) for i in range(len(dsns))]
        for dsn, c in zip(dsns, per):
            pgbench.append(subprocess.Popen(
                [PGBENCH, "-N", "-n", "-c", str(c), "-j", str(min(c, 2)), "-T", str(run_s), "--max-tries", "50", dsn],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        time.sleep(2)
        (u0, s0), tx0, t0 = cpu_ticks(pid), committed(dsns[0]), time.monotonic()
        print(f"sampling {name} (pid {pid}) for {args.seconds} s ...", file=sys.stderr, flush=True)
        sample(pid, args.seconds, args.rate, "raw", out / f"{name}.txt")
        (u1, s1), tx1, t1 = cpu_ticks(pid), committed(dsns[0]), time.monotonic()
        print(f"flame graph for {args.seconds} s ...", file=sys.stderr, flush=True)
        sample(pid, args.seconds, args.rate, "flamegraph", out / f"{name}.svg")
        for p in pgbench:
            p.communicate(timeout=run_s + 120)
    finally:
        for p in pgbench:
            if p.poll() is None:
                p.kill()
                p.wait()
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)
    hz = os.sysconf("SC_CLK_TCK")
    tx = max(1, tx1 - tx0)
    user_us, sys_us = (u1 - u0) / hz / tx * 1e6, (s1 - s0) / hz / tx * 1e6
    segments, kinds = split((out / f"{name}.txt").read_text())
    text = (f"# Coordinator n1, {args.nodes} node(s), CHORUS_IMPL={args.impl}: pgbench -N, {args.clients} clients, "
            f"{tx / (t1 - t0):.0f} tps in the window (all nodes; sampling slows the coordinator)\n\n"
            f"`bench/flame.py --nodes {args.nodes} --seconds {args.seconds} --clients {args.clients} "
            f"--impl {args.impl}`; µs of n1's coordinator CPU per cluster transaction. Flame graph: {name}.svg\n\n"
            + table(segments, user_us, sys_us) + "\n\nBy the kind of code the sample was in (its innermost frame):\n\n"
            + table(kinds, user_us, sys_us, "kind of code") + "\n")
    (out / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
