"""A local cluster keeps other local OS users out (issue 33; docs/OPERATIONS.md, "Local clusters:
access"): no file under its directory is readable by group or others but the two directories
the service user passes through; PostgreSQL takes a SCRAM password over TCP and peer
authentication on its socket. Tried as a hostile local user would (``nobody``, through
``runuser``): it can neither connect, nor read the password file, a log or a key. A cluster made
before clusters had passwords is migrated by ``chorus local up``, running or stopped."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from conftest import Cluster, chorus, extra_cluster

pytestmark = pytest.mark.integration

PSQL = "/usr/lib/postgresql/15/bin/psql"
INTRUDER = "nobody"

# What may be readable by the group or others, and why. Everything else is 0600 / 0700.
SHARED = {
    ".": "the cluster directory: the service user (group postgres) passes through it to its node's; "
         "it is the invoking user's, so the service user cannot replace cluster.json or pgpass",
    "nodes": "the same, for the node directories",
}


def _needs_intruder() -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to act as another local user")
    try:
        pwd.getpwnam(INTRUDER)
    except KeyError:
        pytest.skip(f"no {INTRUDER} user")


def _as_intruder(*cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``cmd`` as the unprivileged local user, with a clean environment (no password in it)."""
    base = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **(env or {})}
    return subprocess.run(["runuser", "-u", INTRUDER, "--", "env", "-i", *(f"{k}={v}" for k, v in base.items()),
                           *cmd], capture_output=True, text=True, timeout=60)


def _private_files_problems(directory: str) -> list[str]:
    """Every entry under ``directory`` (not following links) that group or others can read,
    write or enter, except those of :data:`SHARED`; and any not owned by root or postgres."""
    problems = []
    owners = {0, pwd.getpwnam("postgres").pw_uid}
    for root, dirs, files in os.walk(directory):
        for name in [".", *dirs, *files]:
            path = os.path.join(root, name)
            rel = os.path.normpath(os.path.relpath(path, directory))
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # removed since it was listed (the cluster runs: a dropped table's files)
            if stat.S_ISLNK(st.st_mode):
                continue  # a link's own mode means nothing; what it points at is checked where it is
            mode = stat.S_IMODE(st.st_mode)
            if st.st_uid not in owners:
                problems.append(f"{rel}: owned by uid {st.st_uid}")
            if rel in SHARED:
                if mode != 0o750:
                    problems.append(f"{rel}: {mode:o} (0750 expected: {SHARED[rel]})")
            elif mode & 0o077:
                problems.append(f"{rel}: {mode:o}")
    return problems


def test_no_file_of_a_running_cluster_is_readable_by_others(cluster: Cluster) -> None:
    with cluster.connect(0) as c:  # a failed statement: its text goes to the logs
        with pytest.raises(psycopg.errors.UndefinedTable):
            c.execute("SELECT 'secret text' FROM no_such_table_here")
    problems = _private_files_problems(cluster.dir)
    assert not problems, "\n".join(problems)
    names = {os.path.relpath(os.path.join(r, f), cluster.dir) for r, _, fs in os.walk(cluster.dir) for f in fs}
    for must in ("pgpass", "cluster.json", "keys/cluster.key", "nodes/n1/coordinator.log", "nodes/n1/postgres.log",
                 "nodes/n1/state.json", "nodes/n1/run/admin.sock", "nodes/n1/run/chorus.sock"):
        assert must in names, f"{must} not found: the walk saw {sorted(names)[:20]}..."
    assert any(n.startswith("nodes/n1/wslog/") for n in names)


def test_the_printed_psql_lines_work_as_printed(cluster: Cluster) -> None:
    r = chorus("local", "status", "--dir", cluster.dir)
    assert r.returncode == 0, r.stderr
    lines = [ln.split(": ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("n") and ": PGPASSFILE=" in ln]
    assert len(lines) == 3, r.stdout
    for line in lines:
        out = subprocess.run(["sh", "-c", f"{line} -X -tA -w -c 'SELECT current_user'"], capture_output=True,
                             text=True, timeout=60, env={"PATH": f"{os.path.dirname(PSQL)}:/usr/bin:/bin"})
        assert out.returncode == 0 and out.stdout.strip() == "postgres", (line, out.stderr)


def test_a_local_user_cannot_connect_or_read_anything(cluster: Cluster) -> None:
    _needs_intruder()
    d = Path(cluster.dir)
    port = cluster.info["nodes"][0]["port"]
    tcp = f"host=127.0.0.1 port={port} dbname=postgres user=postgres"
    # TCP: a password is asked; none given, a wrong one, or the password file it cannot read: refused
    for env, reason in (({}, "no password supplied"), ({"PGPASSWORD": "guess"}, "password authentication failed"),
                        ({"PGPASSFILE": cluster.passfile}, "no password supplied")):
        r = _as_intruder(PSQL, "-X", "-w", "-c", "SELECT 1", tcp, env=env)
        assert r.returncode != 0 and reason in r.stderr, (env, r.stdout, r.stderr)
    # the socket: its directory is closed to it (and peer authentication would not map it)
    run = d / "nodes" / "n1" / "run"
    r = _as_intruder(PSQL, "-X", "-w", "-c", "SELECT 1", f"host={run} port={port} dbname=postgres user=postgres")
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
    # nothing of the cluster can be read: not the password, a log, the keys, the state, a listing
    for path in (cluster.passfile, d / "cluster.json", d / "keys" / "cluster.key", d / "keys" / "cluster.secret",
                 d / "nodes" / "n1" / "coordinator.log", d / "nodes" / "n1" / "postgres.log",
                 d / "nodes" / "n1" / "state.json", d / "nodes" / "n1" / "pgdata" / "pg_hba.conf"):
        r = _as_intruder("cat", str(path))
        assert r.returncode != 0 and "Permission denied" in r.stderr and not r.stdout, (path, r.stdout)
    r = _as_intruder("ls", cluster.dir)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stdout
    # the admin socket (it could make the node leave) is out of reach
    admin = cluster.info["nodes"][0]["admin"]
    code = f"import socket; socket.socket(socket.AF_UNIX).connect({admin!r})"
    r = _as_intruder("/usr/bin/python3", "-c", code)
    assert r.returncode != 0 and "PermissionError" in r.stderr, r.stderr


def test_the_socket_admits_only_the_mapped_os_users_as_postgres(cluster: Cluster) -> None:
    """Peer authentication with the map ``chorus``: root (who runs ``chorus local``) and the
    service user connect as postgres; as any other role, not even root."""
    sock = cluster.info["nodes"][0]["socket_dsn"]
    with psycopg.connect(sock, autocommit=True) as c:
        assert c.execute("SELECT current_user").fetchone() == ("postgres",)
        c.execute("DROP ROLE IF EXISTS local_peer_probe")
        c.execute("CREATE ROLE local_peer_probe LOGIN PASSWORD 'probe-pw'")
    cluster.quiesce()
    try:
        with pytest.raises(psycopg.OperationalError, match="Peer authentication failed"):
            psycopg.connect(psycopg.conninfo.make_conninfo(sock, user="local_peer_probe")).close()
        with psycopg.connect(cluster.dsn_as(0, "local_peer_probe", "probe-pw")) as c:  # over TCP, its password
            assert c.execute("SELECT current_user").fetchone() == ("local_peer_probe",)
    finally:
        with cluster.connect(0) as c:
            c.execute("DROP ROLE local_peer_probe")
        cluster.quiesce()


@pytest.fixture(scope="module")
def small() -> Iterator[Cluster]:
    with extra_cluster("chorus-access-", 65, nodes=2) as c:
        yield c


def _make_legacy(c: Cluster, running: bool) -> None:
    """Turn ``c`` into what `chorus local up` made before clusters had passwords: initdb's
    ``trust`` rules, no password file, logs and directories readable by all."""
    d = Path(c.dir)
    for n in c.info["nodes"]:
        nd = d / "nodes" / n["name"]
        pgdata = nd / "pgdata"
        (pgdata / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n"
                                            "host all all ::1/128 trust\nlocal replication all trust\n")
        (pgdata / "pg_ident.conf").write_text("")
        conf = pgdata / "postgresql.conf"
        conf.write_text(conf.read_text().split("\n# --- chorus local cluster: access ---")[0])
        for log in ("coordinator.log", "postgres.log"):
            os.chmod(nd / log, 0o644)
        os.chmod(nd, 0o755)
        if running:
            subprocess.run(["runuser", "-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "-D", str(pgdata),
                            "reload"], check=True, capture_output=True)
    os.unlink(c.passfile)
    os.chmod(d, 0o755)
    os.chmod(d / "nodes", 0o755)


def _assert_private_and_passworded(c: Cluster) -> None:
    problems = _private_files_problems(c.dir)
    assert not problems, "\n".join(problems)
    port = c.info["nodes"][0]["port"]
    r = subprocess.run([PSQL, "-X", "-w", "-c", "SELECT 1", f"host=127.0.0.1 port={port} user=postgres"],
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin", "HOME": "/nonexistent"})
    assert r.returncode != 0 and "no password supplied" in r.stderr, r.stderr
    for i in range(len(c.nodes)):
        with c.connect(i) as conn:
            assert conn.execute("SELECT count(*) FROM access_kept").fetchone() == (3,)


@pytest.mark.parametrize("running", [True, False], ids=["running", "stopped"])
def test_a_cluster_made_with_trust_is_migrated_by_local_up(small: Cluster, running: bool) -> None:
    _needs_intruder()
    with small.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS access_kept (id int PRIMARY KEY)")
        c.execute("INSERT INTO access_kept VALUES (1), (2), (3) ON CONFLICT DO NOTHING")
    small.quiesce()
    if not running:
        assert chorus("local", "down", "--dir", small.dir).returncode == 0
    _make_legacy(small, running)
    if running:  # what the change is about: any local user was superuser
        port = small.info["nodes"][0]["port"]
        r = _as_intruder(PSQL, "-X", "-w", "-tA", "-c", "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
                         f"host=127.0.0.1 port={port} dbname=postgres user=postgres")
        assert r.returncode == 0 and r.stdout.strip() == "t", r.stderr
    r = chorus("local", "up", "--dir", small.dir, "--json")
    assert r.returncode == 0, r.stderr
    _assert_private_and_passworded(small)
    r = _as_intruder(PSQL, "-X", "-w", "-c", "SELECT 1", f"host=127.0.0.1 port={small.info['nodes'][0]['port']} "
                     "dbname=postgres user=postgres")
    assert r.returncode != 0 and "no password supplied" in r.stderr, r.stderr
    # and what the cluster printed works (the password file it now has)
    line = next(ln.split(": ", 1)[1] for ln in chorus("local", "status", "--dir", small.dir).stdout.splitlines()
                if ln.startswith("n2: PGPASSFILE="))
    out = subprocess.run(["sh", "-c", f"{line} -X -tA -w -c 'SELECT count(*) FROM access_kept'"], capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/lib/postgresql/15/bin:/usr/bin:/bin"})
    assert out.stdout.strip() == "3", (line, out.stderr)


def _verifier(c: Cluster, i: int) -> str:
    with psycopg.connect(c.info["nodes"][i]["socket_dsn"]) as conn:
        row = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'").fetchone()
        assert row is not None
        return str(row[0])


def test_the_password_is_kept_across_restarts_and_not_set_again(small: Cluster) -> None:
    """A restart writes nothing: the node's verifier is one of the file's password already."""
    before, verifier = Path(small.passfile).read_text(), _verifier(small, 1)
    assert chorus("local", "stop", "--dir", small.dir, "n2").returncode == 0
    r = chorus("local", "start", "--dir", small.dir, "n2")
    assert r.returncode == 0, r.stderr
    assert Path(small.passfile).read_text() == before and _verifier(small, 1) == verifier
    with psycopg.connect(small.dsn(1)) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
