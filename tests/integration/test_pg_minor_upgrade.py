"""A PostgreSQL minor upgrade of one node at a time (issue 39; docs/DEPLOY.md, "PostgreSQL minor
upgrades"): under a write load on a 3-node local cluster, one node's coordinator and PostgreSQL
stop, its PostgreSQL binaries are replaced, it starts again and partial recovery catches it up
while the others go on writing.

Debian carries one PostgreSQL 15 release at a time, so the "new" binaries here are the same
version in another place: a copy of the tree the cluster runs (CHORUS_PGBIN's, with its chorus
extension) in a directory of its own. What is tested is the procedure: a server stopped, started
from other binaries over the same data directory, caught up by partial recovery, nothing
acknowledged lost, every node identical, and the node provably running the new binaries (its
postmaster's executable, its server's BINDIR and server_version)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from chorus.testkit.check import wait_quiescent
from chorus.testkit.localcluster import PGBIN
from conftest import chorus, extra_cluster
from test_node_add_remove import Writers, _status, _wait, acked_everywhere_and_identical


@pytest.fixture
def other_binaries() -> Iterator[Path]:
    """A second installation of the PostgreSQL 15 binaries the cluster runs, with their library
    and share directories (PostgreSQL finds those relative to its binary): the bin directory."""
    usr = PGBIN.resolve().parents[3]  # .../usr/lib/postgresql/15/bin
    top = tempfile.mkdtemp(prefix="chorus-pgnew-", dir="/tmp")
    os.chmod(top, 0o755)  # the service user runs them
    try:
        for part in ("lib/postgresql/15", "share/postgresql/15"):
            shutil.copytree(usr / part, Path(top) / "usr" / part, symlinks=True)
        yield Path(top) / "usr/lib/postgresql/15/bin"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _version(pgbin: Path) -> str:
    """``postgres --version``'s number: "15.x" of "postgres (PostgreSQL) 15.x (Debian ...)"."""
    out = subprocess.run([str(pgbin / "postgres"), "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("(PostgreSQL)")[1].split()[0]


def test_one_node_is_upgraded_to_other_postgresql_binaries_and_caught_up_under_writes(
        other_binaries: Path) -> None:
    new_bin = other_binaries
    with extra_cluster("chorus-pgminor-", 175) as c:
        with c.connect(0) as conn:
            conn.execute("CREATE TABLE ar_rows (id bigint PRIMARY KEY, node text, at timestamptz DEFAULT now())")
        wait_quiescent(c.nodes)
        with Writers(c) as w:
            _wait("writes acknowledged", lambda: w.count() > 30)

            # the procedure: stop the node (its coordinator, then PostgreSQL) ...
            r = chorus("local", "stop", "--dir", c.dir, "n3")
            assert r.returncode == 0, r.stderr
            assert _status(c)["n3"]["pg_pid"] == 0
            # ... the others go on writing meanwhile (two of three are a quorum) ...
            down = w.count()
            _wait("n1 and n2 write on while n3 is down", lambda: w.count() > down + 50)
            # ... start it from the new binaries: partial recovery brings it up to date while the
            # writes go on
            r = chorus("local", "start", "--dir", c.dir, "n3", "--pgbin", str(new_bin), timeout=300)
            assert r.returncode == 0, r.stderr
            st = c.status(2)
            assert st["state"] == "online", st
            rec = st["recovery"]
            assert rec and rec["state"] == "done" and rec["records"] > 0, rec  # partial recovery, from the logs
            up = w.count()
            _wait("writes go on with n3 back", lambda: w.count() > up + 30)
        assert not w.unexpected, w.unexpected[:5]

        # nothing acknowledged is lost, every node identical (and so says `chorus verify`)
        refs = c.nodes
        acked_everywhere_and_identical(refs, w)
        r = chorus("verify", "--dir", c.dir, "--spark-master", "none", timeout=600)
        assert r.returncode == 0, r.stderr + r.stdout

        # n3 runs the new binaries over its old data directory; n1 the old ones
        nodes = _status(c)
        assert nodes["n3"]["pgbin"] == str(new_bin) and nodes["n1"]["pgbin"] == str(PGBIN)
        for name, binaries in (("n3", new_bin), ("n1", PGBIN)):
            pid = nodes[name]["pg_pid"]
            assert os.path.realpath(f"/proc/{pid}/exe") == str((binaries / "postgres").resolve())
            with psycopg.connect(next(x.dsn for x in refs if x.name == name), autocommit=True) as conn:
                version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
                bindir = conn.execute("SELECT setting FROM pg_catalog.pg_config WHERE name = 'BINDIR'"
                                      ).fetchone()[0]  # type: ignore[index]
                data = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
            assert version.split()[0] == _version(binaries)
            assert Path(bindir).resolve() == binaries.resolve(), bindir
            assert data == f"{c.dir}/nodes/{name}/pgdata"
            with open(f"{data}/postmaster.pid") as f:
                assert int(f.readline()) == pid

        # refused: new binaries under a running server, and a directory without them
        r = chorus("local", "start", "--dir", c.dir, "n2", "--pgbin", str(new_bin))
        assert r.returncode != 0 and "stop the node first" in r.stderr, r.stderr
        assert chorus("local", "stop", "--dir", c.dir, "n2").returncode == 0
        r = chorus("local", "start", "--dir", c.dir, "n2", "--pgbin", str(new_bin.parent))
        assert r.returncode != 0 and "no PostgreSQL binaries there" in r.stderr, r.stderr
        assert chorus("local", "start", "--dir", c.dir, "n2", timeout=300).returncode == 0
        assert _status(c)["n2"]["pgbin"] == str(PGBIN)
