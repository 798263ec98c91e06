"""What one applied writeset costs the apply backend, for two builds of the extension side by side.

    .venv/bin/python bench/apply_cost.py --before /opt/old/usr/lib/postgresql/15/bin \\
        [--after /usr/lib/postgresql/15/bin] [--writesets 20000] [--rounds 5]

Each build runs in a PostgreSQL of its own (binaries from the directory given, each a copy of
Debian's with its own extension directory; see CHORUS_PGBIN in chorus/testkit/localcluster.py), started
here with the extension preloaded and no coordinator. In each, a table of 10,000 rows owned by an
ordinary role (so the apply switches to its owner, restricted, as it does for a table of an
application) receives pgbench-like writesets: one row updated each, through
``chorus.apply_writeset`` in an apply session (replica mode, capture off), one transaction per
writeset committed as the next GID. Rounds alternate between the builds; the figures are the
medians of the apply backend's CPU time per writeset (user + system, from /proc) and of the wall
time, and the ratio after / before. CPU time of one backend is steadier than throughput on a
shared machine, but still moves with the machine's load: compare the ratio, not the numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))

import psycopg  # noqa: E402

from chorus import wire  # noqa: E402

ROWS = 10_000
CANONICAL = ("SET datestyle = 'ISO'; SET intervalstyle = 'postgres'; SET timezone = 'UTC'; "
             "SET extra_float_digits = 3; SET bytea_output = 'hex'")
TABLE = wire.Table("public", "acct", (wire.Column("id", "integer"), wire.Column("v", "integer"),
                                      wire.Column("filler", "text")), (0,))
TICK = os.sysconf("SC_CLK_TCK")


def _as_postgres(cmd: list[str]) -> None:
    extra = {"user": "postgres", "group": "postgres", "extra_groups": []} if os.geteuid() == 0 else {}
    subprocess.run(cmd, check=True, capture_output=True, text=True, **extra)  # type: ignore[arg-type]


class Server:
    """A PostgreSQL of one build, with the extension, in a directory of its own."""

    def __init__(self, pgbin: Path, root: Path, port: int) -> None:
        self.pgbin, self.dir, self.port = pgbin, root, port
        self.dsn = f"host={root / 'run'} port={port} dbname=postgres user=postgres"

    def start(self) -> None:
        (self.dir / "run").mkdir(parents=True)
        if os.geteuid() == 0:
            for p in (self.dir, self.dir / "run"):
                shutil.chown(p, "postgres", "postgres")
        pgdata = self.dir / "pgdata"
        _as_postgres([str(self.pgbin / "initdb"), "-D", str(pgdata), "-U", "postgres", "--auth=peer",
                      "-E", "UTF8", "--locale=C.UTF-8"])
        with open(pgdata / "postgresql.conf", "a") as f:
            f.write(f"port = {self.port}\nlisten_addresses = ''\nunix_socket_directories = '{self.dir / 'run'}'\n"
                    "shared_preload_libraries = 'chorus'\nfsync = off\nsynchronous_commit = off\n"
                    "shared_buffers = 128MB\n")
        with open(pgdata / "pg_ident.conf", "a") as f:
            f.write(f"root root postgres\nroot postgres postgres\n")
        with open(pgdata / "pg_hba.conf", "w") as f:
            f.write("local all all peer map=root\n")
        _as_postgres([str(self.pgbin / "pg_ctl"), "-D", str(pgdata), "-l", str(self.dir / "log"), "-w", "start"])
        with psycopg.connect(self.dsn, autocommit=True) as c:
            c.execute("CREATE EXTENSION chorus")
            c.execute("SELECT chorus.node_init(0)")
            c.execute("SET chorus.capture = off")
            c.execute("SET chorus.replicate_ddl = off")
            c.execute("CREATE ROLE app NOLOGIN")
            c.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL, filler text)")
            c.execute("INSERT INTO acct SELECT g, 0, repeat('x', 84) FROM generate_series(1, %s) g", (ROWS,))
            c.execute("ALTER TABLE acct OWNER TO app")
            c.execute("VACUUM ANALYZE acct")

    def stop(self) -> None:
        _as_postgres([str(self.pgbin / "pg_ctl"), "-D", str(self.dir / "pgdata"), "-m", "fast", "-w", "stop"])


def writeset(key: int, v: int) -> bytes:
    k = str(key).encode()
    return wire.encode(wire.Writeset(
        1, 1, 0, (TABLE,), (wire.Row("U", 0, (k,), (k, str(v).encode(), b"x" * 84)),),
        (wire.Key(wire.KeyMode.REFERENCE, (b"public", b"acct")),
         wire.Key(wire.KeyMode.UPDATE, (b"public", b"acct", b"id", k)))))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def one_round(server: Server, stream: list[bytes]) -> tuple[float, float]:
    """Apply the stream in a fresh apply session: (CPU µs, wall µs) per writeset."""
    with psycopg.connect(server.dsn, autocommit=True, prepare_threshold=0) as c:
        c.execute("SET search_path = pg_catalog, pg_temp")
        c.execute("SET session_replication_role = replica")
        c.execute("SET chorus.capture = off")
        c.execute("SET synchronous_commit = off")
        for setting in CANONICAL.split("; "):
            c.execute(setting)
        pid = c.info.backend_pid
        gid = int(c.execute("SELECT chorus.committed_gid()").fetchone()[0])
        for ws in stream[:200]:  # warm the caches (plans, the table's description)
            gid += 1
            c.execute("SELECT chorus.apply_writeset(%s, %s, %s)", (gid, gid - 1, ws))
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        for ws in stream:
            gid += 1
            c.execute("SELECT chorus.apply_writeset(%s, %s, %s)", (gid, gid - 1, ws))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    return cpu / len(stream) * 1e6, wall / len(stream) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="the binaries of the build to compare against")
    ap.add_argument("--after", type=Path, default=Path(os.environ.get("CHORUS_PGBIN", "/usr/lib/postgresql/15/bin")))
    ap.add_argument("--writesets", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--port", type=int, default=13533)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="chorus-apply-cost-", dir="/tmp"))
    os.chmod(root, 0o755)
    servers = {"before": Server(args.before, root / "before", args.port),
               "after": Server(args.after, root / "after", args.port + 1)}
    stream = [writeset(1 + (i * 7919) % ROWS, i) for i in range(args.writesets)]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
    try:
        for s in servers.values():
            s.start()
        for r in range(args.rounds):
            for name, s in servers.items():
                cpu, wall = one_round(s, stream)
                results[name].append((cpu, wall))
                print(f"round {r + 1} {name}: {cpu:.1f} us CPU, {wall:.1f} us wall per writeset", flush=True)
    finally:
        for s in servers.values():
            try:
                s.stop()
            except subprocess.CalledProcessError:
                pass
        shutil.rmtree(root, ignore_errors=True)
    med = {name: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for name, v in results.items()}
    print(f"\napply backend per writeset, medians of {args.rounds} rounds of {args.writesets}")
    print(f"{'build':8} {'CPU us':>8} {'wall us':>8}")
    for name, (cpu, wall) in med.items():
        print(f"{name:8} {cpu:8.1f} {wall:8.1f}")
    print(f"after / before: CPU {med['after'][0] / med['before'][0]:.2f}, wall {med['after'][1] / med['before'][1]:.2f}")


if __name__ == "__main__":
    main()
