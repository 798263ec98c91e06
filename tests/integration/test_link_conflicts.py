"""Conflicts between two linked sites (docs/LINKS.md sections 4-7 and 9, issue 38): site "east"
(one node) and site "west" (two nodes) linked both ways. Concurrent updates of one row on both
sites are detected on both (NDB$EPOCH: the row's stamp at or above the clock the other site had
reflected), settled by the link's policy (latest-commit-wins: equal commit times go to the site
that sorts last, west) alike on every node, and recorded in ``chorus.link_exceptions``; changes
that are not concurrent (one site's change made after the other's came back) and concurrent
changes of different rows are not flagged.

To make two changes concurrent for certain, each direction of the link goes through a TCP relay
of the test's own, which it stops (cutting the connections) and starts again: while it is
stopped neither site hears of the other's change. Two real local clusters on one Corosync, each
started and stopped by :class:`LocalCluster`, which stops exactly the processes it started (by
pid); the relays are threads of this process. Every wait is bounded."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from chorus.testkit.localcluster import LocalCluster

from linksites import LISTEN_OFFSET, TABLE, Site, link_keys, link_table, print_logs, remove, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 200
EAST_PORT, WEST_PORT = BASE, BASE + 2  # east: one node; west: two
RELAY_OFFSET = 4000  # the relay in front of a site's sender


class Relay:
    """A TCP relay from 127.0.0.1:``port`` to ``target``: :meth:`cut` closes its connections and
    turns new ones away until :meth:`restore`."""

    def __init__(self, port: int, target: int) -> None:
        self.target = target
        self.open = True
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", port))
        self.server.listen(16)
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self.open = False
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self.stopping = True
        self.cut()
        self.server.close()


def _alike(east: Site, west: Site) -> Callable[[], bool]:
    def ok() -> bool:
        want = east.rows(0)
        return all(west.rows(i) == want for i in west.nodes())
    return ok


@pytest.fixture(scope="module")
def sites() -> Iterator[tuple[Site, Site, list[Relay]]]:
    east_dir = Path(tempfile.mkdtemp(prefix="chorus-ce-", dir="/tmp"))
    west_dir = Path(tempfile.mkdtemp(prefix="chorus-cw-", dir="/tmp"))
    link_keys(east_dir, west_dir)
    # east's receiver reaches west's first sender through one relay, west's receiver east's
    # sender through the other
    relays = [Relay(WEST_PORT + RELAY_OFFSET, WEST_PORT + LISTEN_OFFSET),
              Relay(EAST_PORT + RELAY_OFFSET, EAST_PORT + LISTEN_OFFSET)]

    def link(d: Path, site: str, peer: str, peer_port: int) -> dict[str, object]:
        return link_table(d, site, peer, listen_offset=LISTEN_OFFSET,
                          peers=[f"127.0.0.1:{peer_port + RELAY_OFFSET}"], window=8)

    east = LocalCluster(str(east_dir))
    west = LocalCluster(str(west_dir))
    started: list[LocalCluster] = []
    try:
        started.append(east)
        east_info = east.up(1, EAST_PORT, links=[link(east_dir, "east", "west", WEST_PORT)])
        started.append(west)
        west_info = west.up(2, WEST_PORT, links=[link(west_dir, "west", "east", EAST_PORT)])
        yield Site("east", east, east_info), Site("west", west, west_info), relays
    finally:
        for r in relays:
            r.close()
        print_logs(east_dir, west_dir)
        for c in reversed(started):  # west first: east's Corosync may be the one both use
            c.down()
        remove(east_dir, west_dir)


def test_concurrent_updates_are_detected_settled_alike_and_recorded(sites: tuple[Site, Site, list[Relay]]) -> None:
    east, west, relays = sites
    for site in (east, west):  # links carry no schema change: each site makes the table
        site.sql("CREATE SCHEMA app")
        site.sql(TABLE)
    # rows made on east reach west; west's changes of them, made after they arrived, reach east
    for i in range(1, 5):
        east.sql("INSERT INTO app.items VALUES (%s, 'east', 0)", (i,))
    wait("east's rows on west", _alike(east, west))
    west.sql("UPDATE app.items SET v = 'west after east', n = 1 WHERE id = 1", i=1)
    wait("west's change on east", lambda: (1, "west after east", 1) in east.rows(0))
    east.sql("UPDATE app.items SET v = 'east after west', n = 2 WHERE id = 1")
    wait("east's change on west", _alike(east, west))
    # not concurrent: nothing flagged anywhere
    assert east.exceptions(0) == [] and all(west.exceptions(i) == [] for i in west.nodes())

    # the link cut both ways: one row changed on both sites, two others each on one
    for r in relays:
        r.cut()
    east.sql("UPDATE app.items SET v = 'east, concurrent', n = 3 WHERE id = 2")
    west.sql("UPDATE app.items SET v = 'west, concurrent', n = 4 WHERE id = 2", i=1)
    east.sql("UPDATE app.items SET v = 'east alone' WHERE id = 3")
    west.sql("UPDATE app.items SET v = 'west alone' WHERE id = 4", i=0)
    time.sleep(1.0)
    for r in relays:
        r.restore()

    def settled() -> bool:
        return (_alike(east, west)() and len(east.exceptions(0)) == 1
                and all(len(west.exceptions(i)) == 1 for i in west.nodes()))
    try:
        wait("the conflict settled on every node", settled, timeout=120)
    except BaseException:
        for site in (east, west):  # what each node holds, for the failure's report
            for i in site.nodes():
                print(site.name, i, site.rows(i), site.exceptions(i), site.position(i), site.stamps(i))
        raise
    rows = east.rows(0)
    # latest-commit-wins, equal commit times: the site that sorts last (west) wins, on both sites
    assert (2, "west, concurrent", 4) in rows
    assert (3, "east alone", 0) in rows and (4, "west alone", 0) in rows
    (e,) = east.exceptions(0)
    assert e[:9] == ("\"app\".\"items\" (id)=(2)", "east", "west", "row", "latest-commit-wins", "took-remote",
                     "east, concurrent", "west, concurrent", "west, concurrent")
    (w,) = west.exceptions(0)
    assert w[:9] == ("\"app\".\"items\" (id)=(2)", "west", "east", "row", "latest-commit-wins", "kept-local",
                     "west, concurrent", "east, concurrent", "west, concurrent")
    # the window: the local change's clock at or above what the other site had reflected
    for x in (e, w):
        assert x[9] >= x[11]
    # every node of west recorded the same, and holds the same stamps
    assert west.exceptions(0) == west.exceptions(1)
    wait("west's stamps alike on both nodes", lambda: west.stamps(0) == west.stamps(1))
    assert west.stamps(0)  # west's own changes are stamped

    # after the conflict, changes go on without being flagged
    east.sql("UPDATE app.items SET n = 10 WHERE id = 2")
    wait("east's later change on west", lambda: all((2, "west, concurrent", 10) in west.rows(i)
                                                      for i in west.nodes()))
    assert len(east.exceptions(0)) == 1 and all(len(west.exceptions(i)) == 1 for i in west.nodes())
