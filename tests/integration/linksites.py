"""Two local sites joined by a link, for the link tests (tests/integration/test_link_*.py) and
bench/link_bench.py: a site's nodes as the tests read them (each test on tables of its own, so
that the tests of several files can share one pair of sites: conftest.linked), the link's keys
and its [[link]] table, a relay that can cut or delay a link, two sites linked both ways through
relays, the test's table made on both sites, a bounded wait, and the coordinators' last lines
when done."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import psycopg
import pytest

from chorus.recovery import generate_keys
from chorus.testkit.localcluster import LocalCluster

LISTEN_OFFSET = 3000  # a node's link sender: its PostgreSQL port plus this
RELAY_OFFSET = 4000  # the relay in front of a site's sender
WAIT_S = 90.0
TABLE = "CREATE TABLE app.items (id int PRIMARY KEY, v text, n int)"
LINK = "east-west"


class Site:
    """One site: its cluster and its nodes' DSNs; :meth:`rows` and :meth:`exceptions` read the
    test's table (``table``, schema-qualified), so tests of several files can share a pair of
    sites, each with tables of its own (:meth:`on`)."""

    def __init__(self, name: str, cluster: LocalCluster, info: list[dict[str, Any]], table: str = "app.items") -> None:
        self.name = name
        self.cluster = cluster
        self.info = info  # each node's names, DSNs, admin socket, HTTP address (LocalCluster.info)
        self.dsns = [n["dsn"] for n in info]
        self.table = table

    def on(self, table: str) -> "Site":
        """This site, its rows and exceptions those of ``table``."""
        return Site(self.name, self.cluster, self.info, table)

    @property
    def quoted(self) -> str:
        """The table as the link names it (``"schema"."table"``, in exceptions and status)."""
        return ".".join(f'"{part}"' for part in self.table.split("."))

    def nodes(self) -> range:
        return range(len(self.dsns))

    def connect(self, i: int = 0) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsns[i], autocommit=True, connect_timeout=10)

    def sql(self, statement: str, params: Any = None, i: int = 0) -> None:
        with self.connect(i) as c:
            c.execute(statement, params)

    def rows(self, i: int, query: str = "", params: Any = None) -> list[tuple[Any, ...]]:
        with self.connect(i) as c:
            return c.execute(query or f"SELECT id, v, n FROM {self.table} ORDER BY id", params).fetchall()

    def position(self, i: int) -> list[tuple[Any, ...]]:
        return self.rows(i, "SELECT link, peer_site, applied_gid, peer_clock, max_replicated, updated_at "
                            "FROM chorus.link_position ORDER BY link")

    def exceptions(self, i: int) -> list[tuple[Any, ...]]:
        return self.rows(i, "SELECT row_key, local_site, remote_site, detection, policy, decision, "
                            "local_row->>'v', remote_row->>'v', result_row->>'v', local_clock, remote_clock, "
                            "max_replicated FROM chorus.link_exceptions WHERE table_name = %s ORDER BY gid, n",
                         (self.quoted,))

    def stamps(self, i: int) -> list[tuple[Any, ...]]:
        return self.rows(i, "SELECT key, site, clock FROM chorus.link_stamp ORDER BY key")

    def committed(self, i: int = 0) -> int:
        with self.connect(i) as c:
            row = c.execute("SELECT (chorus.status()).committed_gid").fetchone()
            assert row is not None
            return int(row[0])


@contextlib.contextmanager
def cut(relays: list["Relay"]) -> Iterator[None]:
    """Inside, neither site hears the other (``relays`` cut both ways): what each changes then is
    concurrent for certain; the relays restored a second after."""
    for r in relays:
        r.cut()
    try:
        yield
    finally:
        time.sleep(1.0)
        for r in relays:
            r.restore()


def make_tables(east: Site, west: Site, *first: str) -> None:
    """The statements ``first``, then the schema and the test's table (east's ``table``: id, v, n)
    on each site: links carry no schema change, each site makes its own."""
    for site in (east, west):
        for statement in first:
            site.sql(statement)
        site.sql("CREATE SCHEMA IF NOT EXISTS " + east.table.split(".")[0])
        site.sql(TABLE.replace("app.items", east.table))


def seed(east: Site, west: Site, count: int, v: str, *first: str) -> None:
    """The test's table on each site (:func:`make_tables`) and rows 1 to ``count`` (``v``, 0) made
    on east, once every node of west holds them."""
    make_tables(east, west, *first)
    with east.connect() as c:
        for i in range(1, count + 1):
            c.execute(f"INSERT INTO {east.table} VALUES (%s, %s, 0)", (i, v))
    wait("east's rows on west", alike(east, west))


def wait(what: str, ok: Callable[[], bool], timeout: float = WAIT_S) -> None:
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


def alike(east: Site, west: Site) -> Callable[[], bool]:
    """Every node of west holds east's rows."""
    def ok() -> bool:
        want = east.rows(0)
        return all(west.rows(i) == want for i in west.nodes())
    return ok


def settle(east: Site, west: Site, what: str, exceptions: tuple[int, int], timeout: float = 120) -> None:
    """Wait until every node of west holds east's rows and east and each node of west have
    recorded ``exceptions`` conflicts; on failure, print what each node holds."""
    def ok() -> bool:
        return (alike(east, west)() and len(east.exceptions(0)) == exceptions[0]
                and all(len(west.exceptions(i)) == exceptions[1] for i in west.nodes()))
    try:
        wait(what, ok, timeout=timeout)
    except BaseException:
        for site in (east, west):
            for i in site.nodes():
                print(site.name, i, site.rows(i), site.exceptions(i), site.position(i), site.stamps(i))
        raise


def link_keys(east_dir: Path, west_dir: Path) -> None:
    """Each site's cluster keys, the link's shared secret and each site's copy of the other's
    certificate."""
    for d in (east_dir, west_dir):
        os.chmod(d, 0o755)
        generate_keys(str(d / "keys"))
    secret = os.urandom(32).hex() + "\n"
    for d, peer in ((east_dir, west_dir), (west_dir, east_dir)):
        (d / "keys" / "link.secret").write_text(secret)
        shutil.copy(peer / "keys" / "cluster.crt", d / "keys" / "peer.crt")
        for f in ("link.secret", "peer.crt"):
            os.chmod(d / "keys" / f, 0o600)


@contextlib.contextmanager
def ordinary_role(site: Site, *grants: str) -> Iterator[psycopg.Connection[Any]]:
    """A session of a new ordinary role "hostile" on the site's first node, given ``grants``
    (statements, run as the superuser); the role is dropped afterwards, its privileges first."""
    site.sql("DROP ROLE IF EXISTS hostile")
    site.sql("CREATE ROLE hostile LOGIN PASSWORD 'hostile-pw'")
    try:
        for g in grants:
            site.sql(g)
        dsn = psycopg.conninfo.make_conninfo(site.dsns[0], user="hostile", password="hostile-pw", passfile="")
        with psycopg.connect(dsn, autocommit=True) as c:
            yield c
    finally:
        site.sql("DROP OWNED BY hostile")
        site.sql("DROP ROLE hostile")


def link_table(d: Path, site: str, peer: str, **kw: Any) -> dict[str, Any]:
    """The [[link]] table of site ``site`` (its keys in ``d``)."""
    keys = d / "keys"
    return {"name": LINK, "site": site, "peer_site": peer, "tls_cert": str(keys / "cluster.crt"),
            "tls_key": str(keys / "cluster.key"), "peer_cert": str(keys / "peer.crt"),
            "secret_file": str(keys / "link.secret"), **kw}


def print_logs(*dirs: Path) -> None:
    """The last lines of every coordinator's log (pytest shows them with a failure)."""
    for d in dirs:
        for log in sorted((d / "nodes").glob("*/coordinator.log")):
            with open(log, errors="replace") as f:
                tail = f.readlines()[-30:]
            print(f"\n--- the last lines of {log}\n" + "".join(tail))


def remove(*dirs: Path) -> None:
    if not os.environ.get("CHORUS_KEEP_TEST_DIR"):
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def two_sites(east: tuple[int, int, Callable[[Path], dict[str, Any]]], west: tuple[int, int, Callable[[Path], dict[str, Any]]],
              prefix: str = "chorus-", **up: Any) -> Iterator[tuple[Site, Site, Path, Path]]:
    """Sites east and west, each ``(nodes, port, its [[link]] table given its directory)``, with
    the link's keys (``up``: more of LocalCluster.up's arguments, for both); both stopped (west
    first: east's Corosync may be the one both use) and removed at the end, the coordinators'
    last lines printed."""
    east_dir = Path(tempfile.mkdtemp(prefix=f"{prefix}east-", dir="/tmp"))
    west_dir = Path(tempfile.mkdtemp(prefix=f"{prefix}west-", dir="/tmp"))
    link_keys(east_dir, west_dir)
    clusters = [LocalCluster(str(east_dir)), LocalCluster(str(west_dir))]
    started: list[LocalCluster] = []
    try:
        info = []
        for cluster, d, (nodes, port, link) in zip(clusters, (east_dir, west_dir), (east, west)):
            started.append(cluster)
            info.append(cluster.up(nodes, port, links=[link(d)], **up))
        yield Site("east", clusters[0], info[0]), Site("west", clusters[1], info[1]), east_dir, west_dir
    finally:
        print_logs(east_dir, west_dir)
        for c in reversed(started):
            c.down()
        remove(east_dir, west_dir)


Chunk = Optional[tuple[float, bytes]]


class Relay:
    """A TCP relay from 127.0.0.1:``port`` to 127.0.0.1:``target``: every chunk of bytes is held
    ``delay`` seconds each way before it is passed on, in order (changeable while it runs: the
    delay between two sites, on the link alone); :meth:`cut` closes its connections and turns
    new ones away until :meth:`restore`."""

    def __init__(self, port: int, target: int) -> None:
        self.target = target
        self.delay = 0.0
        self.open = True
        self.stopping = False
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", port))
        self.server.listen(16)
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
            for c in (client, upstream):
                c.settimeout(None)
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                q: "queue.Queue[Chunk]" = queue.Queue()
                threading.Thread(target=self._read, args=(a, q), daemon=True).start()
                threading.Thread(target=self._write, args=(b, q), daemon=True).start()

    def _read(self, src: socket.socket, q: "queue.Queue[Chunk]") -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                q.put((time.monotonic() + self.delay, data))
        except OSError:
            pass
        q.put(None)

    @staticmethod
    def _write(dst: socket.socket, q: "queue.Queue[Chunk]") -> None:
        try:
            while True:
                item = q.get()
                if item is None:
                    break
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def cut(self) -> None:
        self.open = False
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self.stopping = True
        self.cut()
        self.server.close()


@contextlib.contextmanager
def linked_both_ways(prefix: str, east_port: int, east_nodes: int, west_port: int, west_nodes: int,
                     logs: bool = True, **link: Any) -> Iterator[tuple[Site, Site, list[Relay]]]:
    """Sites "east" and "west" linked both ways, each receiver reaching the other site's first
    sender through a :class:`Relay` (``relays[0]`` in front of west's, ``relays[1]`` of east's);
    ``link``: more of each [[link]] table. Both stopped at the end (each stops exactly the
    processes it started), their coordinators' last lines printed (``logs``)."""
    east_dir = Path(tempfile.mkdtemp(prefix=f"{prefix}e-", dir="/tmp"))
    west_dir = Path(tempfile.mkdtemp(prefix=f"{prefix}w-", dir="/tmp"))
    link_keys(east_dir, west_dir)
    relays = [Relay(west_port + RELAY_OFFSET, west_port + LISTEN_OFFSET),
              Relay(east_port + RELAY_OFFSET, east_port + LISTEN_OFFSET)]

    def table(d: Path, site: str, peer: str, peer_port: int) -> dict[str, Any]:
        return link_table(d, site, peer, listen_offset=LISTEN_OFFSET,
                          peers=[f"127.0.0.1:{peer_port + RELAY_OFFSET}"], **link)

    east = LocalCluster(str(east_dir))
    west = LocalCluster(str(west_dir))
    started: list[LocalCluster] = []
    try:
        started.append(east)
        east_info = east.up(east_nodes, east_port, links=[table(east_dir, "east", "west", west_port)])
        started.append(west)
        west_info = west.up(west_nodes, west_port, links=[table(west_dir, "west", "east", east_port)])
        yield Site("east", east, east_info), Site("west", west, west_info), relays
    finally:
        for r in relays:
            r.close()
        if logs:
            print_logs(east_dir, west_dir)
        for c in reversed(started):  # west first: east's Corosync may be the one both use
            c.down()
        remove(east_dir, west_dir)


@contextlib.contextmanager
def pinned_sites(east_port: int, west_port: int, max_retain_mb: int, west_nodes: int = 1, prefix: str = "chorus-pin-",
                 tables: tuple[str, ...] = (TABLE,)) -> Iterator[tuple[Site, Site, Relay]]:
    """East (one node, a log ring of two 1 MiB segments, its link's log pinned within
    ``max_retain_mb``) streaming to west (``west_nodes``) through a :class:`Relay` the test cuts;
    schema ``app`` and ``tables`` made on both (links carry no schema change)."""
    relay = Relay(east_port + RELAY_OFFSET, east_port + LISTEN_OFFSET)
    try:
        with two_sites((1, east_port, lambda d: link_table(d, "east", "west", listen_offset=LISTEN_OFFSET,
                                                           max_retain_mb=max_retain_mb)),
                       (west_nodes, west_port, lambda d: link_table(d, "west", "east",
                                                                    peers=[f"127.0.0.1:{east_port + RELAY_OFFSET}"])),
                       prefix=prefix, log_segment_mb=1, log_total_mb=2) as (east, west, _, _):
            for site in (east, west):
                site.sql("CREATE SCHEMA app")
                for table in tables:
                    site.sql(table)
            yield east, west, relay
    finally:
        relay.close()
