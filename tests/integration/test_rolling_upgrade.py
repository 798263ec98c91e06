"""A rolling upgrade on a local cluster (issue 39, docs/DEPLOY.md section 8): every node starts on
the release before (bus protocol 3 only, no negotiation), then each in turn is stopped and started
on this tree's coordinator while the others take writes. Nothing acknowledged is lost, the
cluster runs at version 3 while one old node is a member and at 4 once the last is gone, and all
nodes end identical.

The release before is a coordinator built beside this tree: ``CHORUS_PREV_CHORUS`` names its
``chorus`` executable (for instance one made by ``git worktree add /tmp/chorus-prev b2fa3c9``, a
venv there and ``pip install -e .``). Without it, the test takes the coordinator of commit
:data:`PREVIOUS_RELEASE` out of this repository's history (``git archive``) and runs it with this
tree's Python environment on its pure-Python path (its compiled parts are not built); without
that history (a shallow clone) it is skipped. Its extension is the same as this tree's (the
writeset format did not change), so one PostgreSQL install serves both.

It found that answers written by this release echoed a request id without the versions that rode
in it, so the release before never counted those joiners in and gave other GIDs than the rest
(its last node then came back with rows above the GID it announced and was voted out).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from chorus.bus import proto as bp
from chorus.testkit.localcluster import LocalCluster
from conftest import Cluster

pytestmark = pytest.mark.integration

PREVIOUS_RELEASE = "b2fa3c9"  # main before bus versions 3..4: it speaks version 3 only
PREV = os.environ.get("CHORUS_PREV_CHORUS", "")
PORT = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 140


class Writer(threading.Thread):
    """Inserts rows with distinct ids through one node, reconnecting when it is down; keeps the
    ids whose COMMIT succeeded (acknowledged)."""

    def __init__(self, dsn: str, first: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.next = dsn, first
        self.acked: list[int] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        conn = None
        while not self.stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
                conn.execute("INSERT INTO upg_rows (id, at) VALUES (%s, clock_timestamp())", (self.next,))
                self.acked.append(self.next)
            except psycopg.Error as e:
                # the node going down, refusing writes while it rejoins, or a lost outcome
                if e.sqlstate not in (None, "25006", "08006", "08007", "57P01", "57P03", "40001"):
                    self.errors.append(f"{e.sqlstate}: {str(e).strip()[:200]}")
                if conn is not None:
                    conn.close()
                time.sleep(0.1)
            self.next += 1
            time.sleep(0.01)
        if conn is not None:
            conn.close()


def _status(c: Cluster, i: int) -> dict[str, Any]:
    try:
        return c.status(i)
    except OSError:
        return {}


def _wait_version(c: Cluster, names: list[str], version: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        seen = {c.nodes[i].name: _status(c, i).get("bus_version") for i in range(3) if c.nodes[i].name in names}
        if set(seen.values()) == {version}:
            return
        time.sleep(0.3)
    raise AssertionError(f"bus_version is not {version} on {names}: {seen}")


@pytest.fixture(scope="module")
def previous() -> Iterator[str]:
    """The ``chorus`` executable of the release before (this module's docstring)."""
    if PREV:
        if not os.access(PREV, os.X_OK):
            pytest.fail(f"CHORUS_PREV_CHORUS={PREV} is not an executable")
        yield PREV
        return
    repo = Path(__file__).resolve().parents[2]
    where = Path(tempfile.mkdtemp(prefix="chorus-prev-", dir="/tmp"))
    try:
        os.chmod(where, 0o755)  # the coordinators run as the service user
        archive = subprocess.run(["git", "-C", str(repo), "archive", PREVIOUS_RELEASE, "coordinator"],
                                 capture_output=True)
        if archive.returncode != 0:
            pytest.skip(f"commit {PREVIOUS_RELEASE} is not in this clone's history: "
                        f"{archive.stderr.decode(errors='replace').strip()[:200]}")
        subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
        # its compiled parts are not built: a module that says so, where this tree's editable install
        # would otherwise lend it this tree's (pure-Python path, as CHORUS_IMPL=python)
        for pyx in (where / "coordinator" / "chorus").glob("_c*.pyx"):
            pyx.with_suffix(".py").write_text("raise ImportError('not built in the release before here')\n")
        run = where / "chorus"
        run.write_text(f"#!/bin/sh\nPYTHONPATH={where / 'coordinator'} CHORUS_IMPL=python "
                       f"exec {sys.executable} -m chorus \"$@\"\n")
        run.chmod(0o755)
        version = subprocess.run([str(run), "--version"], capture_output=True, text=True)
        assert "0.3.0" in version.stdout + version.stderr, version
        yield str(run)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_a_cluster_of_the_release_before_is_upgraded_one_node_at_a_time_under_writes(previous: str) -> None:
    PREV = previous
    directory = tempfile.mkdtemp(prefix="chorus-upg-", dir="/tmp")
    os.chmod(directory, 0o755)
    lc = LocalCluster(directory, log=lambda s: print(s, file=sys.stderr))
    current = lc.venv_chorus
    lc.venv_chorus = PREV
    writers: list[Writer] = []
    ok = False
    try:
        c = Cluster(directory, {"nodes": lc.up(3, PORT), "passfile": str(lc.passfile)})
        names = [n.name for n in c.nodes]
        with c.connect(0) as conn:
            conn.execute("CREATE TABLE upg_rows (id bigint PRIMARY KEY, at timestamptz)")
        c.quiesce()
        assert all("bus_version" not in _status(c, i) for i in range(3))  # the release before says nothing
        writers = [Writer(c.dsn(i), 1 + i * 10_000_000) for i in range(3)]
        for w in writers:
            w.start()
        time.sleep(2)
        for k, name in enumerate(names):
            before = [len(w.acked) for w in writers]
            lc.stop(name)
            lc.venv_chorus = current
            lc.start(name)
            c.nodes = Cluster(directory, {"nodes": lc.describe(lc.load()), "passfile": str(lc.passfile)}).nodes
            st = c.status(k)
            assert st["bus_versions"] == [bp.MIN_VERSION, bp.VERSION], st
            upgraded = names[:k + 1]
            # one old node still a member: the cluster runs at 3; none: at this release's, on every new node
            _wait_version(c, upgraded, 3 if k < 2 else bp.VERSION)
            time.sleep(2)
            assert all(len(w.acked) > b for w, b in zip(writers, before) if w is not writers[k]), \
                "the other nodes took no writes during the restart"
            lc.venv_chorus = PREV
        lc.venv_chorus = current
        assert {tuple(v) for v in c.status(0)["member_bus_versions"].values()} == {bp.SPEAKS}
        time.sleep(2)
        for w in writers:
            w.stop.set()
        for w in writers:
            w.join(timeout=30)
        assert not [e for w in writers for e in w.errors], [e for w in writers for e in w.errors]
        c.assert_identical()
        acked = sorted(i for w in writers for i in w.acked)
        assert len(acked) > 100
        for i in range(3):
            with c.connect(i) as conn:
                have = {r[0] for r in conn.execute("SELECT id FROM upg_rows")}
            missing = [a for a in acked if a not in have]
            assert not missing, f"{names[i]} lost acknowledged rows: {missing[:10]}"
        ok = True
    finally:
        for w in writers:
            w.stop.set()
        try:
            lc.down()
        finally:
            if ok:
                shutil.rmtree(directory, ignore_errors=True)
            else:
                for log in sorted(Path(directory).glob("nodes/*/coordinator.log")):
                    print(f"\n--- {log}\n" + "".join(log.read_text(errors="replace").splitlines(True)[-30:]),
                          file=sys.stderr)
