"""The client helpers (chorus.client, docs/CLIENTS.md) on the 3-node cluster: applications that
write the same rows on every node at once, through SQLAlchemy's ORM and through psycopg, lose
certification often, retry, and end with every reported commit on every node exactly once;
and a causal read through the helper sees a write made on another node while its own lags.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Optional

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from chorus.client import Backoff, RetryStats, run_transaction
from chorus.client.sqlalchemy import run_in_session, sqlstate_of
from conftest import Cluster

pytestmark = pytest.mark.integration

ACCOUNTS = 4  # few accounts, many writers: hot rows
INITIAL = 1000
WORKERS_PER_NODE = 3
SECONDS = 8.0
ATTEMPTS = 50  # enough that a transfer practically never gives up, however hot the rows


class Base(DeclarativeBase):
    pass


class Account(Base):
    __tablename__ = "clients_accounts"
    id: Mapped[int] = mapped_column(primary_key=True)
    balance: Mapped[int]


class Transfer(Base):
    """The ledger. ``request`` is the client's id for the transfer, deliberately not unique: a
    transfer applied twice would show as two rows."""
    __tablename__ = "clients_transfers"
    id: Mapped[int] = mapped_column(primary_key=True)
    request: Mapped[uuid.UUID] = mapped_column(index=True)
    src: Mapped[int] = mapped_column(sa.ForeignKey("clients_accounts.id"))
    dst: Mapped[int] = mapped_column(sa.ForeignKey("clients_accounts.id"))
    amount: Mapped[int]
    node: Mapped[str]


def _engine(cluster: Cluster, i: int, **kw: Any) -> sa.Engine:
    p = conninfo_to_dict(cluster.dsn(i))
    url = sa.URL.create("postgresql+psycopg", username=str(p["user"]), host=str(p["host"]), port=int(str(p["port"])),
                        database=str(p["dbname"]), query={"passfile": str(p["passfile"])})
    return sa.create_engine(url, **kw)


@pytest.fixture
def engines(cluster: Cluster) -> Iterator[list[sa.Engine]]:
    """An engine per node, REPEATABLE READ (what read-modify-write ORM code needs)."""
    es = [_engine(cluster, i, isolation_level="REPEATABLE READ", pool_size=WORKERS_PER_NODE + 1)
          for i in range(len(cluster.nodes))]
    try:
        yield es
    finally:
        for e in es:
            e.dispose()


def test_an_orm_bank_on_every_node_retries_conflicts_and_loses_nothing(cluster: Cluster,
                                                                       engines: list[sa.Engine]) -> None:
    Base.metadata.drop_all(engines[0])
    Base.metadata.create_all(engines[0])
    with Session(engines[0]) as s, s.begin():
        s.add_all(Account(id=i, balance=INITIAL) for i in range(1, ACCOUNTS + 1))
    cluster.quiesce()

    stats = RetryStats()
    committed: list[uuid.UUID] = []
    refused: list[tuple[uuid.UUID, sa.exc.DBAPIError]] = []
    unexpected: list[BaseException] = []
    deadline = time.monotonic() + SECONDS

    def worker(node: int, seed: int) -> None:
        rnd = random.Random(seed)
        Sessions = sessionmaker(engines[node])
        name = cluster.nodes[node].name
        while time.monotonic() < deadline:
            src, dst = rnd.sample(range(1, ACCOUNTS + 1), 2)
            amount, request = rnd.randint(1, 50), uuid.uuid4()

            def transfer(session: Session) -> bool:
                a, b = session.get_one(Account, src), session.get_one(Account, dst)
                if a.balance < amount:
                    return False
                a.balance -= amount
                b.balance += amount
                session.add(Transfer(request=request, src=src, dst=dst, amount=amount, node=name))
                return True

            try:
                if run_in_session(Sessions, transfer, attempts=ATTEMPTS, backoff=Backoff(first=0.005, cap=0.2),
                                  stats=stats):
                    committed.append(request)
            except sa.exc.DBAPIError as e:  # gave up after ATTEMPTS serialization failures: not committed
                refused.append((request, e))
            except BaseException as e:
                unexpected.append(e)
                return

    threads = [threading.Thread(target=worker, args=(node, node * 100 + w))
               for node in range(len(cluster.nodes)) for w in range(WORKERS_PER_NODE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SECONDS + 60)
    assert unexpected == [], unexpected
    assert all(sqlstate_of(e) in ("40001", "40P01") for _, e in refused), refused
    assert stats.in_doubt == 0 and stats.failed == 0, stats
    assert stats.retries > 0 and stats.retries_by_sqlstate["40001"] > 0, stats
    assert len(committed) > 20, stats  # the workload did run

    cluster.assert_identical()
    reported = set(committed)
    for i in range(len(cluster.nodes)):
        with Session(engines[i]) as s:
            requests = s.execute(sa.select(Transfer.request, sa.func.count()).group_by(Transfer.request)).all()
            assert {r for r, _ in requests} == reported, f"node {i}: the ledger differs from the reported commits"
            assert all(n == 1 for _, n in requests), f"node {i}: a transfer was applied more than once"
            balances = {a: b for a, b in s.execute(sa.select(Account.id, Account.balance))}
            assert sum(balances.values()) == ACCOUNTS * INITIAL, balances
            flows = {a: INITIAL for a in balances}
            for tr in s.scalars(sa.select(Transfer)):
                flows[tr.src] -= tr.amount
                flows[tr.dst] += tr.amount
            assert flows == balances, f"node {i}: the balances do not follow from the ledger"
    print(f"\n{len(committed)} transfers committed, {len(refused)} gave up; {stats}")


def test_psycopg_counters_on_every_node_retry_conflicts_and_count_exactly(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("DROP TABLE IF EXISTS clients_log, clients_counters")
        c.execute("CREATE TABLE clients_counters (id integer PRIMARY KEY, n bigint NOT NULL)")
        c.execute("INSERT INTO clients_counters VALUES (1, 0), (2, 0)")
        c.execute("CREATE TABLE clients_log (id bigserial PRIMARY KEY, request uuid NOT NULL, counter integer)")
    cluster.quiesce()

    stats = RetryStats()
    committed: dict[uuid.UUID, int] = {}
    unexpected: list[BaseException] = []
    deadline = time.monotonic() + 4.0

    def worker(node: int, seed: int) -> None:
        rnd = random.Random(seed)
        with psycopg.connect(cluster.dsn(node)) as conn:  # READ COMMITTED, the default
            while time.monotonic() < deadline:
                counter, request = rnd.choice((1, 2)), uuid.uuid4()

                def increment(c: psycopg.Connection[Any]) -> None:
                    c.execute("UPDATE clients_counters SET n = n + 1 WHERE id = %s", (counter,))
                    c.execute("INSERT INTO clients_log (request, counter) VALUES (%s, %s)", (request, counter))

                try:
                    run_transaction(conn, increment, attempts=ATTEMPTS, backoff=Backoff(first=0.005, cap=0.2),
                                    stats=stats)
                except BaseException as e:
                    unexpected.append(e)
                    return
                committed[request] = counter

    threads = [threading.Thread(target=worker, args=(node, node * 10 + w))
               for node in range(len(cluster.nodes)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert unexpected == [], unexpected
    assert stats.retries > 0 and stats.in_doubt == 0, stats

    cluster.assert_identical()
    for i in range(len(cluster.nodes)):
        with cluster.connect(i) as c:
            log = c.execute("SELECT request, counter FROM clients_log").fetchall()
            assert len(log) == len(committed) and dict(log) == committed, f"node {i}"
            counts = dict(c.execute("SELECT id, n FROM clients_counters").fetchall())
            assert counts == {k: sum(1 for v in committed.values() if v == k) for k in (1, 2)}, f"node {i}"
    print(f"\n{len(committed)} increments committed; {stats}")


def test_a_causal_read_through_the_helper_sees_a_write_made_elsewhere(cluster: Cluster,
                                                                      engines: list[sa.Engine]) -> None:
    """Node 3 lags (a local session holds a lock its applier needs, as in test_causal_reads.py);
    a REPEATABLE READ transaction there, run with causal_reads=True, still sees a row written on
    node 1 just before: the wait comes before the transaction's snapshot."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS clients_causal (id integer PRIMARY KEY, v text)")
    cluster.quiesce()
    blocker = cluster.connect(2, autocommit=False)
    blocker.execute("LOCK TABLE clients_causal IN SHARE MODE")
    try:
        run_in_session(sessionmaker(engines[0]),
                       lambda s: s.execute(sa.text("INSERT INTO clients_causal VALUES (1, 'from n1')")))
        read: Callable[[Session], Optional[str]] = \
            lambda s: s.execute(sa.text("SELECT v FROM clients_causal WHERE id = 1")).scalar()
        assert run_in_session(sessionmaker(engines[2]), read) is None, "node 3 was expected to lag"
        assert run_in_session(sessionmaker(engines[2]), read, causal_reads=True) == "from n1"
    finally:
        blocker.close()
    cluster.quiesce()

