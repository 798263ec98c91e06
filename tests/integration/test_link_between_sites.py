"""A link between two sites (docs/LINKS.md section 3, issue 38): site "east" (one node) streams its
commits to site "west" (two nodes), whose receiver sends each transaction on through west's total
order, where every node applies it and moves ``chorus.link_position`` in the same transaction.

Two real local clusters on one Corosync (each its own group), each started and stopped by
:class:`LocalCluster`, which stops exactly the processes it started (by pid). Every wait is
bounded."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pytest

from chorus.recovery import generate_keys
from chorus.testkit.localcluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 100
EAST_PORT, WEST_PORT = BASE, BASE + 2  # east: one node; west: two
LISTEN_OFFSET = 3000  # a node's link sender: its PostgreSQL port plus this
WAIT_S = 90.0

TABLE = "CREATE TABLE app.items (id int PRIMARY KEY, v text, n int)"


class Site:
    def __init__(self, name: str, cluster: LocalCluster, info: list[dict[str, Any]]) -> None:
        self.name = name
        self.cluster = cluster
        self.dsns = [n["dsn"] for n in info]

    def connect(self, i: int = 0) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsns[i], autocommit=True, connect_timeout=10)

    def rows(self, i: int, query: str = "SELECT id, v, n FROM app.items ORDER BY id") -> list[tuple[Any, ...]]:
        with self.connect(i) as c:
            return c.execute(query).fetchall()

    def position(self, i: int) -> list[tuple[Any, ...]]:
        return self.rows(i, "SELECT link, peer_site, applied_gid, peer_clock, max_replicated, updated_at "
                            "FROM chorus.link_position ORDER BY link")

    def committed(self, i: int = 0) -> int:
        with self.connect(i) as c:
            row = c.execute("SELECT (chorus.status()).committed_gid").fetchone()
            assert row is not None
            return int(row[0])


def _wait(what: str, ok: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except psycopg.Error as e:  # a node restarting
            last = e
        time.sleep(0.3)
    pytest.fail(f"{what}: not within {timeout:.0f} s (last error: {last})")


def _keys(directory: Path) -> None:
    generate_keys(str(directory / "keys"))


@pytest.fixture(scope="module")
def sites() -> Iterator[tuple[Site, Site]]:
    east_dir = Path(tempfile.mkdtemp(prefix="chorus-east-", dir="/tmp"))
    west_dir = Path(tempfile.mkdtemp(prefix="chorus-west-", dir="/tmp"))
    for d in (east_dir, west_dir):
        os.chmod(d, 0o755)
        _keys(d)
    secret = os.urandom(32).hex() + "\n"
    for d, peer in ((east_dir, west_dir), (west_dir, east_dir)):
        (d / "keys" / "link.secret").write_text(secret)
        shutil.copy(peer / "keys" / "cluster.crt", d / "keys" / "peer.crt")
        for f in ("link.secret", "peer.crt"):
            os.chmod(d / "keys" / f, 0o600)

    def link(d: Path, site: str, peer: str, **kw: Any) -> dict[str, Any]:
        keys = d / "keys"
        return {"name": "east-west", "site": site, "peer_site": peer, "tls_cert": str(keys / "cluster.crt"),
                "tls_key": str(keys / "cluster.key"), "peer_cert": str(keys / "peer.crt"),
                "secret_file": str(keys / "link.secret"), **kw}

    east = LocalCluster(str(east_dir))
    west = LocalCluster(str(west_dir))
    started: list[LocalCluster] = []
    try:
        started.append(east)
        east_info = east.up(1, EAST_PORT, links=[link(east_dir, "east", "west", listen_offset=LISTEN_OFFSET)])
        started.append(west)
        west_info = west.up(2, WEST_PORT, links=[link(west_dir, "west", "east",
                                                      peers=[f"127.0.0.1:{EAST_PORT + LISTEN_OFFSET}"], window=8)])
        yield Site("east", east, east_info), Site("west", west, west_info)
    finally:
        for d in (east_dir, west_dir):
            for log in sorted((d / "nodes").glob("*/coordinator.log")):
                with open(log, errors="replace") as f:
                    tail = f.readlines()[-30:]
                print(f"\n--- the last lines of {log}\n" + "".join(tail))
        for c in reversed(started):  # west first: east's Corosync may be the one both use
            c.down()
        if not os.environ.get("CHORUS_KEEP_TEST_DIR"):
            for d in (east_dir, west_dir):
                shutil.rmtree(d, ignore_errors=True)


def _write(site: Site, first: int, count: int) -> None:
    """Transactions on ``site``: inserts, then an update and a delete among them."""
    with site.connect() as c:
        for i in range(first, first + count):
            c.execute("INSERT INTO app.items VALUES (%s, %s, 0)", (i, f"row {i}"))
        with c.transaction():
            c.execute("UPDATE app.items SET n = n + 1, v = v || ' updated' WHERE id BETWEEN %s AND %s",
                      (first, first + 2))
            c.execute("DELETE FROM app.items WHERE id = %s", (first + count - 1,))


def _arrived(east: Site, west: Site) -> Callable[[], bool]:
    def ok() -> bool:
        want = east.rows(0)
        return all(west.rows(i) == want for i in range(2))
    return ok


def test_link_applies_through_the_receiving_sites_order(sites: tuple[Site, Site]) -> None:
    east, west = sites
    for site in (east, west):  # links carry no schema change: each site makes the table
        with site.connect() as c:
            c.execute("CREATE SCHEMA app")
            c.execute(TABLE)
    _write(east, 1, 20)
    _wait("east's rows on both of west's nodes", _arrived(east, west))
    # the position moved, in the same transactions, alike on both nodes: at east's last GID
    _wait("west's position at east's committed GID",
          lambda: all(west.position(i) and west.position(i)[0][2] == east.committed() for i in range(2)))
    p0, p1 = west.position(0), west.position(1)
    assert p0 == p1
    assert p0[0][:2] == ("east-west", "east")
    # west's own writes go on beside the link
    with west.connect(1) as c:
        c.execute("INSERT INTO app.items VALUES (1000, 'west', 0)")
    _wait("west's own row on both west nodes", lambda: all(
        (1000, "west", 0) in west.rows(i) for i in range(2)))
    with west.connect(0) as c:
        c.execute("DELETE FROM app.items WHERE id = 1000")


def test_link_cut_and_restored_loses_nothing_and_applies_nothing_twice(sites: tuple[Site, Site]) -> None:
    east, west = sites
    _wait("caught up", _arrived(east, west))
    before = west.position(0)[0][2]

    # the receiver's node goes (its coordinator killed) while east writes; west has no quorum
    # without it, then both come back and the receiver resumes from the durable position
    west.cluster.kill("n1", "coordinator")
    _write(east, 100, 15)
    west.cluster.start("n1", wait=False)
    west.cluster.wait_online(west.cluster.load(), timeout=120)
    _wait("east's rows after the receiver came back", _arrived(east, west))
    mid = west.position(0)[0][2]
    assert mid > before

    # the sender goes (east's coordinator and PostgreSQL stopped and started again)
    _write(east, 200, 10)
    east.cluster.stop("n1")
    east.cluster.up(1, EAST_PORT)  # (a lone node comes back through up, which lets it bootstrap again)
    _write(east, 300, 10)
    _wait("east's rows after the sender came back", _arrived(east, west))
    _wait("west's position at east's committed GID",
          lambda: all(west.position(i)[0][2] == east.committed() for i in range(2)))
    assert west.position(0) == west.position(1)
    # nothing applied twice: every insert would have failed on a duplicate key (and the apply
    # with it); every node of west is online, and the link applied each transaction once
    for i in range(2):
        with west.connect(i) as c:
            row = c.execute("SELECT phase, accepts_writes FROM chorus.node").fetchone()
            assert row == ("online", True)
