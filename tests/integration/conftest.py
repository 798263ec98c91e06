"""Fixtures for integration tests: a real 3-node local cluster (PostgreSQL 15 + Corosync).

The cluster is started once per test session with ``chorus local up`` and stopped with
``chorus local down`` (which stops exactly the processes it started).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

import psycopg
import pytest

from psycopg import sql

from chorus import recovery as rc
from chorus.localauth import new_password
from chorus.testkit.check import NodeRef, compare, node_refs, wait_quiescent
from chorus.config import load_config
from chorus.testkit.localcluster import PlainPostgres, temporary_postgres
from chorus.testkit.procmem import PeakMemory
from chorus.wslog import LogRecord

from linksites import Relay, Site, linked_both_ways


PLAIN_PORT = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 80
PLAIN_PASSWORD = new_password()  # its postgres role's (for clients that take a password, pytest-postgresql's)


@pytest.fixture(scope="session")
def plain() -> Iterator[PlainPostgres]:
    """The one plain PostgreSQL (no Chorus) of the integration tests: the reference a test holds a
    node to, a dump's source or target, the database of the client helpers' tests. Each test
    takes databases of its own (:func:`plain_database`)."""
    with temporary_postgres("chorus-plain-", PLAIN_PORT, password=PLAIN_PASSWORD) as pg:
        yield pg


CHORUS_PORT = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 90
CHORUS_PASSWORD = new_password()  # its postgres role's (it takes SCRAM passwords over TCP: pytest-postgresql's)


@pytest.fixture(scope="session")
def chorus_postgres() -> Iterator[PlainPostgres]:
    """One PostgreSQL with the chorus extension preloaded (node 0) and no coordinator, started as a
    node would be, shared by the tests of the apply and of the extension's link functions
    (test_apply_function.py: databases of its own; test_link_stamps.py, test_link_function_call.py:
    tables of their own in schema app)."""
    with temporary_postgres("chorus-ext-", CHORUS_PORT, extension=True, password=CHORUS_PASSWORD) as pg:
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            c.execute("SET chorus.capture = off")  # no coordinator: nothing is replicated
            c.execute("SET chorus.replicate_ddl = off")
            c.execute("CREATE EXTENSION IF NOT EXISTS chorus")
            c.execute("SELECT chorus.node_init(0)")
            c.execute("CREATE SCHEMA app")
        yield pg


LINKED = contextlib.ExitStack()  # the shared linked sites, closed after the last test that uses them


@pytest.fixture(scope="session")
def linked() -> Iterator[tuple[Site, Site, list[Relay]]]:
    """Sites "east" (one node) and "west" (two) linked both ways through relays (linksites.py),
    shared by the link tests of several files, each with tables of its own: latest-commit-wins,
    but ``app.counters`` (its counter ``n``) by the delta policy and ``app.merged`` by the
    function ``app.merge`` (each site makes it). Stopped after the last test that uses them."""
    port = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 200
    with LINKED:
        yield LINKED.enter_context(linked_both_ways(
            "chorus-l", port, 1, port + 2, 2, window=8, conflict_function="app.merge",
            table_policy={"app.counters": "delta", "app.merged": "function"}, delta_columns={"app.counters": ["n"]}))


SCHEMA_CLUSTER = contextlib.ExitStack()  # the shared schema-change cluster, closed after its last test


@pytest.fixture(scope="session")
def schema_cluster() -> Iterator[Cluster]:
    """A 3-node cluster of its own (not the session's :func:`cluster`, whose tests kill nodes and
    leave pgbench's tables) for the schema-change tests of test_fidelity.py and
    test_migrations.py, which hold every node's whole schema and data to the first's
    (chorus.testkit.fidelity.check): each test works in schemas or tables of its own and drops
    what it makes outside them (event triggers, tablespaces, databases, publications), but for
    test_fidelity's role app_owner. Stopped after the last test that uses it."""
    with SCHEMA_CLUSTER:
        yield SCHEMA_CLUSTER.enter_context(extra_cluster("chorus-schema-", 30))


# session fixtures stopped after the last test that uses them (kept, they would run idle through
# the rest of the run)
STOPPED_AFTER_LAST_USER = {"linked": LINKED, "schema_cluster": SCHEMA_CLUSTER}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test that uses one of STOPPED_AFTER_LAST_USER: stop it."""
    yield
    for name, stack in STOPPED_AFTER_LAST_USER.items():
        if name in getattr(item, "fixturenames", ()):
            later = item.session.items[item.session.items.index(item) + 1:]
            if not any(name in getattr(i, "fixturenames", ()) for i in later):
                stack.close()


@contextlib.contextmanager
def plain_database(pg: PlainPostgres, name: str) -> Iterator[str]:
    """A new database ``name`` on ``pg`` (one a failed run left is dropped first) and its DSN;
    dropped at the end."""
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute(drop)
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(pg.dsn, dbname=name)
    finally:
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            c.execute(drop)


def peak_anon_growth_kb(pid: int, during: Callable[[], object]) -> int:
    """How far process ``pid``'s anonymous memory rose above where it stood while ``during``
    ran (chorus/testkit/procmem.py)."""
    with PeakMemory({"p": lambda: [pid]}, every=0.001) as mem:
        during()
    return mem.growth_kb["p"]


def chorus(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chorus", *args], capture_output=True, text=True,
                          timeout=timeout)


class Cluster:
    def __init__(self, directory: str, info: dict[str, Any]) -> None:
        self.dir = directory
        self.info = info
        self.nodes: list[NodeRef] = node_refs(info["nodes"])

    def dsn(self, i: int) -> str:
        """Node ``i`` over TCP as postgres, the password from the cluster's password file."""
        return self.nodes[i].dsn

    @property
    def passfile(self) -> str:
        """The cluster's password file (the postgres role's password, for TCP)."""
        return str(self.info["passfile"])

    @property
    def password(self) -> str:
        """The postgres role's password, for a client that cannot use the password file (one that
        connects through a proxy on another port)."""
        from chorus.localauth import password_in

        with open(self.passfile) as f:
            found = password_in(f.read())
        assert found is not None
        return found

    def dsn_as(self, i: int, user: str, password: str) -> str:
        """Node ``i`` over TCP as another role (TCP takes SCRAM passwords: give the role one)."""
        return psycopg.conninfo.make_conninfo(self.dsn(i), user=user, password=password)

    def connect(self, i: int, **kw: Any) -> psycopg.Connection[Any]:
        kw.setdefault("autocommit", True)
        return psycopg.connect(self.dsn(i), **kw)

    def sql_all(self, statement: str) -> None:
        r = chorus("sql", "--dir", self.dir, "--all", statement)
        assert r.returncode == 0, r.stderr

    def quiesce(self, timeout: float = 60) -> dict[str, dict[str, Any]]:
        return wait_quiescent(self.nodes, timeout)

    def assert_identical(self) -> None:
        self.quiesce()
        diffs = compare(self.nodes)
        assert not diffs, "\n".join(diffs)

    def status(self, i: int) -> dict[str, Any]:
        from chorus.admin import admin_request
        return admin_request(self.nodes[i].admin)["status"]

    def log_records(self, after: int, upto: int, i: int = 0) -> list[LogRecord]:
        """The writeset log records of GIDs after..upto, from node ``i``'s log through the partial
        recovery stream, byte for byte as their origins sent them."""
        cfg = load_config(f"{self.dir}/nodes/{self.nodes[i].name}/chorus.toml")
        keys = rc.ClusterKeys(cfg.tls_cert, cfg.tls_key, cfg.secret_file)
        got: list[LogRecord] = []

        async def take(r: LogRecord) -> None:
            got.append(r)

        async def fetch() -> None:
            stop = after
            while stop < upto:
                stop = await rc.fetch(cfg.recovery_listen, keys, self.status(i)["cluster_uuid"], "tests", stop, upto,
                                      take)

        asyncio.run(fetch())
        return got

    def wait_online(self, i: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        st: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                st = self.status(i)
                if st["state"] == "online":
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"node {self.nodes[i].name} not online: {st}")


def _print_logs_if_failed(request: pytest.FixtureRequest, directory: str) -> bool:
    """After a failed test: the tail of every node's coordinator log (CI keeps no files), and
    True (the directory stays for a look)."""
    if not request.session.testsfailed:
        return False
    for log in sorted(glob.glob(f"{directory}/nodes/*/coordinator.log")):
        with open(log, errors="replace") as f:
            tail = f.readlines()[-40:]
        print(f"\n--- the last lines of {log}\n" + "".join(tail), file=sys.__stderr__)
    return True


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    directory = tempfile.mkdtemp(prefix="chorus-it-", dir="/tmp")
    os.chmod(directory, 0o755)
    port = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433"))
    r = chorus("local", "up", "--nodes", "3", "--dir", directory, "--port-base", str(port), "--json")
    if r.returncode != 0:
        chorus("local", "down", "--dir", directory)
        pytest.fail(f"chorus local up failed:\n{r.stderr}\n{r.stdout}")
    c = Cluster(directory, json.loads(r.stdout))
    try:
        yield c
    finally:
        if os.environ.get("CHORUS_KEEP_CLUSTER"):  # debugging: leave it running
            print(f"\ncluster left running in {directory}")
            return
        failed = _print_logs_if_failed(request, directory)
        d = chorus("local", "down", "--dir", directory)
        if d.returncode == 0 and not failed and not os.environ.get("CHORUS_KEEP_TEST_DIR"):
            shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def extra_cluster(prefix: str, port_offset: int, *options: str, nodes: int = 3) -> Iterator[Cluster]:
    """A second cluster (3 nodes unless said), beside the session's, started with ``chorus local
    up`` and ``options`` on ports from the test port base plus ``port_offset``, and removed afterwards."""
    directory = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(directory, 0o755)
    port = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + port_offset
    r = chorus("local", "up", "--nodes", str(nodes), "--dir", directory, "--port-base", str(port), *options, "--json")
    if r.returncode != 0:
        chorus("local", "down", "--dir", directory)
        pytest.fail(f"chorus local up failed:\n{r.stderr}")
    try:
        yield Cluster(directory, json.loads(r.stdout))
    finally:
        chorus("local", "down", "--dir", directory)
        shutil.rmtree(directory, ignore_errors=True)


def commit_all(conns: list[psycopg.Connection[Any]]) -> list[str]:
    """Commit each open transaction in turn and close its connection: the outcomes ("ok" or the
    SQLSTATE), in commit order."""
    out = []
    for c in conns:
        try:
            c.commit()
            out.append("ok")
        except psycopg.Error as e:
            out.append(e.sqlstate or "?")
        c.close()
    return out
