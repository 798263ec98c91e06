"""Adding and removing nodes online (issue 39; docs/MEMBERSHIP.md "Adding and removing nodes"):
a local cluster grows 3 -> 4 and shrinks 4 -> 3 under a small write load, with no restart of the
other nodes. Checked: nothing acknowledged is lost, every node ends identical, quorum counts from
the new membership at each step (two of four are not a quorum, two of three are), bad changes are
refused with nothing changed (invariants 7 and 8)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg

from chorus.testkit.check import NodeRef, compare, wait_quiescent
from chorus.testkit.localcluster import PGBIN
from conftest import Cluster, chorus, extra_cluster


def _status(c: Cluster) -> dict[str, dict[str, Any]]:
    """``chorus local status --json``: every node of the cluster now (the added ones too)."""
    r = chorus("local", "status", "--dir", c.dir, "--json")
    assert r.returncode == 0, r.stderr
    return {n["name"]: n for n in json.loads(r.stdout)["nodes"]}


def _refs(c: Cluster) -> list[NodeRef]:
    return [NodeRef(n["name"], n["dsn"], n["admin"]) for n in _status(c).values()]


def _node_status(ref: NodeRef) -> dict[str, Any]:
    from chorus.admin import admin_request

    return admin_request(ref.admin)["status"]


def _wait(what: str, check: Any, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"not in {timeout:.0f} s: {what}")


def _writable(ref: NodeRef) -> bool:
    try:
        return bool(_node_status(ref)["accepts_writes"])
    except OSError:
        return False


class Writers:
    """One writer per node of the first three: inserts rows, keeping those whose commit was
    acknowledged. Errors a client may get while nodes come and go (40001, 25006, 08007, a lost
    connection) are retried; anything else is kept and fails the test."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.stop = threading.Event()
        self.acked: list[int] = []
        self.unexpected: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(3)]

    def __enter__(self) -> "Writers":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _run(self, i: int) -> None:
        n = 0
        conn = None
        while not self.stop.is_set():
            n += 1
            key = i * 10_000_000 + n
            try:
                if conn is None:
                    conn = psycopg.connect(self.c.dsn(i), autocommit=True, connect_timeout=5)
                conn.execute("INSERT INTO ar_rows (id, node) VALUES (%s, %s)", (key, f"n{i + 1}"))
                with self.lock:
                    self.acked.append(key)
            except psycopg.Error as e:
                if e.sqlstate not in (None, "40001", "25006", "08007", "57P01"):
                    self.unexpected.append(f"{e.sqlstate}: {e}")
                if conn is not None and (conn.closed or e.sqlstate in (None, "57P01")):
                    conn = None
                time.sleep(0.2)
            time.sleep(0.02)
        if conn is not None:
            conn.close()

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


def acked_everywhere_and_identical(refs: list[NodeRef], w: Writers) -> None:
    """Once the nodes are quiet: every row whose insert was acknowledged is on every node, and
    every node is identical."""
    wait_quiescent(refs, 120)
    for ref in refs:
        with psycopg.connect(ref.dsn, autocommit=True) as conn:
            have = {row[0] for row in conn.execute("SELECT id FROM ar_rows")}
        missing = set(w.acked) - have
        assert not missing, f"{ref.name} lacks {len(missing)} acknowledged rows, e.g. {sorted(missing)[:5]}"
    diffs = compare(refs)
    assert not diffs, "\n".join(diffs)


def _removed_node_stays_out(c: Cluster) -> None:
    """n4's files put back and its PostgreSQL and coordinator started by hand, as an operator might:
    the cluster does not admit it (it asks to join and the answer says it is not configured), and
    its coordinator stops, with the reason in its state file."""
    (gone,) = glob.glob(f"{c.dir}/nodes/n4.removed-*")
    home = f"{c.dir}/nodes/n4"
    os.rename(gone, home)
    as_service = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    pg_ctl = [f"{PGBIN}/pg_ctl", "-D", f"{home}/pgdata", "-l", f"{home}/postgres.log", "-w", "-t", "60"]
    subprocess.run(as_service + pg_ctl + ["start"], check=True, capture_output=True, timeout=90)
    try:
        r = subprocess.run(as_service + [sys.executable, "-m", "chorus", "run", "--config", f"{home}/chorus.toml"],
                           capture_output=True, text=True, timeout=120, cwd=home)
        # it was running when the change reached it, so it recorded its removal itself (or, stopped
        # before it read the change, the answer to its GID request says it is not configured)
        said = ("was removed from cluster", "not one of")
        assert r.returncode == 2 and any(x in r.stderr for x in said) and "configured nodes" in r.stderr, \
            r.stderr[-2000:]
        with open(f"{home}/state.json") as f:
            removed = json.load(f)["removed"]
        assert any(x in removed for x in said), removed
        for name in ("n1", "n2", "n3"):
            assert "n4" not in _node_status(next(x for x in _refs(c) if x.name == name))["members"]
    finally:
        subprocess.run(as_service + pg_ctl + ["-m", "fast", "stop"], capture_output=True, timeout=90)
        os.rename(home, gone)


def test_a_cluster_grows_to_four_and_shrinks_back_to_three_under_writes() -> None:
    with extra_cluster("chorus-addrm-", 140) as c:
        with c.connect(0) as conn:
            conn.execute("CREATE TABLE ar_rows (id bigint PRIMARY KEY, node text, at timestamptz DEFAULT now())")
        wait_quiescent(c.nodes)
        with Writers(c) as w:
            _wait("writes acknowledged", lambda: w.count() > 30)

            # ---- 3 -> 4 -------------------------------------------------------------------
            r = chorus("node", "add", "--dir", c.dir, "--json", "--spark-master", "none", timeout=600)
            assert r.returncode == 0, r.stderr + r.stdout
            assert json.loads(r.stdout)["state"] == "online"
            refs = _refs(c)
            assert [x.name for x in refs] == ["n1", "n2", "n3", "n4"]
            for ref in refs:
                st = _node_status(ref)
                assert st["config_version"] == 1 and st["configured_nodes"] == ["n1", "n2", "n3", "n4"], st
                assert st["configured_votes"] == 4 and st["state"] == "online"
            before = w.count()
            _wait("writes go on with four nodes", lambda: w.count() > before + 20)

            # bad input: nothing changes
            r = chorus("node", "add", "--dir", c.dir, "n2")
            assert r.returncode != 0 and "in the cluster already" in r.stderr, r.stderr
            r = chorus("node", "remove", "--dir", c.dir, "n9")
            assert r.returncode != 0 and "no node 'n9'" in r.stderr, r.stderr

            # ---- quorum from the new membership: 3 of 4 write, 2 of 4 do not ----------------
            n1, n2, n3, n4 = refs
            assert chorus("local", "stop", "--dir", c.dir, "n4").returncode == 0
            time.sleep(3)
            assert _writable(n1) and _writable(n2) and _writable(n3)
            assert chorus("local", "stop", "--dir", c.dir, "n3").returncode == 0
            _wait("n1 and n2 (2 of 4) leave the primary component", lambda: not _writable(n1) and not _writable(n2))
            # n4 stopped while n1..n3 went on: three of the four re-form without it
            assert chorus("local", "start", "--dir", c.dir, "n3", timeout=300).returncode == 0
            _wait("n1..n3 (3 of 4) write again", lambda: all(_writable(x) for x in (n1, n2, n3)), 120)
            assert chorus("local", "start", "--dir", c.dir, "n4", timeout=300).returncode == 0
            _wait("n4 online again", lambda: _writable(n4), 120)

            # ---- 4 -> 3 -------------------------------------------------------------------
            before = w.count()
            r = chorus("node", "remove", "--dir", c.dir, "n4", "--json")
            assert r.returncode == 0, r.stderr + r.stdout
            refs = _refs(c)
            assert [x.name for x in refs] == ["n1", "n2", "n3"]
            for ref in refs:
                st = _node_status(ref)
                assert st["config_version"] == 2 and st["configured_nodes"] == ["n1", "n2", "n3"], st
                assert st["configured_votes"] == 3 and "n4" not in st["members"]
            _wait("writes go on with three nodes", lambda: w.count() > before + 20)

            _removed_node_stays_out(c)

            # two of three are a quorum again (they were not of four)
            assert chorus("local", "stop", "--dir", c.dir, "n3").returncode == 0
            time.sleep(3)
            assert _writable(n1) and _writable(n2)
            # removing n2 now would leave n1 alone of {n1, n3}: refused, nothing changed
            r = chorus("node", "remove", "--dir", c.dir, "n2")
            assert r.returncode != 0 and "not a quorum" in r.stderr, r.stderr
            assert _node_status(n1)["config_version"] == 2
            assert chorus("local", "start", "--dir", c.dir, "n3", timeout=300).returncode == 0
            before = w.count()
            _wait("writes go on", lambda: w.count() > before + 20)
        assert not w.unexpected, w.unexpected[:5]

        acked_everywhere_and_identical(refs, w)


def test_two_nodes_shrink_to_one_which_restarts_alone() -> None:
    """The change goes through the total order while the removed node still runs (it stops
    after): a 2-node cluster shrinks to one, which writes, and restarts alone as a cluster of one
    (stopped first, the node took its vote with it and 1 of 2 could not change anything). Growing
    back needs the new node to count at once, and 1 of 2 is no majority: refused, with why."""
    with extra_cluster("chorus-shrink1-", 160, nodes=2) as c:
        with c.connect(0) as conn:
            conn.execute("CREATE TABLE s1_rows (id int PRIMARY KEY)")
            conn.execute("INSERT INTO s1_rows VALUES (1)")
        r = chorus("node", "remove", "--dir", c.dir, "n2", "--json")
        assert r.returncode == 0, r.stderr + r.stdout
        (n1,) = _refs(c)
        st = _node_status(n1)
        assert st["configured_nodes"] == ["n1"] and st["configured_votes"] == 1 and st["members"] == ["n1"], st
        with psycopg.connect(n1.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO s1_rows VALUES (2)")
        assert chorus("local", "down", "--dir", c.dir).returncode == 0
        r = chorus("local", "up", "--dir", c.dir, timeout=300)
        assert r.returncode == 0, r.stderr
        _wait("n1 writes alone after its restart", lambda: _writable(n1), 120)
        with psycopg.connect(n1.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO s1_rows VALUES (3)")
            assert conn.execute("SELECT count(*) FROM s1_rows").fetchone() == (3,)
        r = chorus("node", "add", "--dir", c.dir, "--spark-master", "none")
        assert r.returncode != 0 and "not a quorum of 2 configured nodes" in r.stderr, r.stderr
        assert _node_status(n1)["config_version"] == 1 and _writable(n1)
