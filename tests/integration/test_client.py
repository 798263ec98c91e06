"""The client helpers (chorus.client, docs/CLIENTS.md; their retry rules without a database are
tests/unit/test_client_retry.py) with psycopg and SQLAlchemy against one plain PostgreSQL (no Chorus: pytest-postgresql's fixtures, a
fresh database per test). Real 40001s and 40P01s come from PostgreSQL's own serialization
failures and deadlocks; the errors Chorus raises at COMMIT (40001 for a lost certification,
08007 when the node is cut off) are raised at COMMIT by a deferred constraint trigger; a
connection lost at COMMIT is a backend terminated before it.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import IsolationLevel
from pytest_postgresql import factories
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from chorus.client import CommitOutcomeUnknown, FailedTransaction, RetryStats, run_transaction
from chorus.client.sqlalchemy import enable_causal_reads, run_in_session, run_in_transaction, sqlstate_of
from chorus.testkit.fakeclock import Clock
from chorus.testkit.localcluster import PlainPostgres
from conftest import PLAIN_PASSWORD, PLAIN_PORT

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE accounts (id integer PRIMARY KEY, balance integer NOT NULL);
INSERT INTO accounts VALUES (1, 100), (2, 100);
CREATE TABLE oncall (doctor text PRIMARY KEY, on_call boolean NOT NULL);
INSERT INTO oncall VALUES ('alice', true), ('bob', true);
CREATE TABLE items (id integer PRIMARY KEY);
-- what a deferred constraint trigger raises at COMMIT, for how many commits: Chorus's errors at COMMIT
CREATE TABLE commit_fault (sqlstate text NOT NULL, failures integer NOT NULL);
CREATE SEQUENCE commits_tried;
CREATE FUNCTION fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE f commit_fault;
BEGIN
    SELECT * INTO f FROM commit_fault;
    IF f.sqlstate IS NOT NULL AND nextval('commits_tried') <= f.failures THEN
        RAISE EXCEPTION 'injected at COMMIT' USING ERRCODE = f.sqlstate;
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON items DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION fail_at_commit();
"""


def _load(host: str, port: int, user: str, dbname: str, password: Optional[str] = None, **_: Any) -> None:
    with psycopg.connect(host=host, port=port, user=user, password=password, dbname=dbname, autocommit=True) as c:
        c.execute(SCHEMA)


# a database of its own per test on the integration tests' plain PostgreSQL (conftest.plain)
client_noproc = factories.postgresql_noproc(host="127.0.0.1", port=PLAIN_PORT, user="postgres", password=PLAIN_PASSWORD,
                                            dbname="chorus_client", load=[_load])
postgresql = factories.postgresql("client_noproc")


@pytest.fixture
def dsn(plain: PlainPostgres, postgresql: psycopg.Connection[Any]) -> str:
    """The test database's DSN."""
    return psycopg.conninfo.make_conninfo(postgresql.info.dsn, password=PLAIN_PASSWORD)


@pytest.fixture
def admin(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """Another session on the test database, in autocommit: the concurrent transactions."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn) as c:
        yield c


def _inject_at_commit(admin: psycopg.Connection[Any], sqlstate: str, failures: int) -> None:
    admin.execute("INSERT INTO commit_fault VALUES (%s, %s)", (sqlstate, failures))


def _balances(admin: psycopg.Connection[Any]) -> list[int]:
    return [b for (b,) in admin.execute("SELECT balance FROM accounts ORDER BY id")]


def _terminate(admin: psycopg.Connection[Any], conn: psycopg.Connection[Any]) -> None:
    """End ``conn``'s backend, as a crash or a network fault would, and wait until it is gone."""
    pid = conn.info.backend_pid
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
        time.sleep(0.01)


def test_a_lost_update_under_repeatable_read_is_retried(conn: psycopg.Connection[Any],
                                                         admin: psycopg.Connection[Any]) -> None:
    conn.isolation_level = IsolationLevel.REPEATABLE_READ
    clock, stats = Clock(), RetryStats()

    def deposit(c: psycopg.Connection[Any]) -> int:
        row = c.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()
        assert row is not None
        if stats.attempts == 1:  # someone else changes the row after this snapshot
            admin.execute("UPDATE accounts SET balance = balance + 50 WHERE id = 1")
        c.execute("UPDATE accounts SET balance = %s WHERE id = 1", (row[0] + 1,))
        return int(row[0]) + 1

    assert run_transaction(conn, deposit, stats=stats, sleep=clock.sleep) == 151
    assert _balances(admin) == [151, 100]
    assert stats.retries_by_sqlstate == {"40001": 1} and len(clock.waits) == 1 and stats.committed == 1


def test_a_serialization_failure_at_commit_is_retried_and_the_retry_sees_the_winner(
        conn: psycopg.Connection[Any], dsn: str) -> None:
    """Write skew under SERIALIZABLE: PostgreSQL fails the second COMMIT; run again, the function
    sees the first one's change and decides otherwise."""
    conn.isolation_level = IsolationLevel.SERIALIZABLE
    other = psycopg.connect(dsn)
    other.isolation_level = IsolationLevel.SERIALIZABLE
    stats = RetryStats()

    def go_off_call(c: psycopg.Connection[Any]) -> bool:
        row = c.execute("SELECT count(*) FROM oncall WHERE on_call").fetchone()
        assert row is not None
        if stats.attempts == 1:  # alice goes off call at the same time, and commits first
            other.execute("SELECT count(*) FROM oncall WHERE on_call")
            other.execute("UPDATE oncall SET on_call = false WHERE doctor = 'alice'")
        if row[0] < 2:
            return False
        c.execute("UPDATE oncall SET on_call = false WHERE doctor = 'bob'")
        if stats.attempts == 1:
            other.commit()
        return True

    try:
        assert run_transaction(conn, go_off_call, stats=stats, sleep=Clock().sleep) is False
    finally:
        other.close()
    assert stats.retries_by_sqlstate == {"40001": 1}
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT doctor FROM oncall WHERE on_call").fetchall() == [("bob",)]


def test_a_deadlock_is_retried(conn: psycopg.Connection[Any], admin: psycopg.Connection[Any], dsn: str) -> None:
    conn.execute("SET deadlock_timeout = '20ms'")  # this session finds the deadlock, the other waits 1 s
    conn.commit()
    stats = RetryStats()
    errors: list[BaseException] = []

    def other_transfer() -> None:
        try:
            with psycopg.connect(dsn) as o:
                o.execute("UPDATE accounts SET balance = balance - 5 WHERE id = 2")
                o.execute("UPDATE accounts SET balance = balance + 5 WHERE id = 1")  # waits for conn
                o.commit()
        except BaseException as e:
            errors.append(e)

    def transfer(c: psycopg.Connection[Any]) -> None:
        if threads:  # the retry: once the other transfer, no longer blocked, has committed (if the
            threads[0].join()  # retry took row 1 first they could deadlock again: a CI run saw 3 retries)
        c.execute("UPDATE accounts SET balance = balance - 1 WHERE id = 1")
        if stats.attempts == 1:
            t = threading.Thread(target=other_transfer)
            t.start()
            while not admin.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                    "AND datname = current_database()").fetchone():
                time.sleep(0.005)
            threads.append(t)
        c.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")

    threads: list[threading.Thread] = []
    run_transaction(conn, transfer, stats=stats, sleep=Clock().sleep)
    threads[0].join()
    assert errors == []
    assert stats.retries_by_sqlstate == {"40P01": 1}
    assert _balances(admin) == [104, 96]


def test_the_last_serialization_failure_is_raised_when_the_attempts_are_used_up(
        conn: psycopg.Connection[Any], admin: psycopg.Connection[Any]) -> None:
    conn.isolation_level = IsolationLevel.REPEATABLE_READ
    clock, stats = Clock(), RetryStats()

    def always_overtaken(c: psycopg.Connection[Any]) -> None:
        c.execute("SELECT balance FROM accounts WHERE id = 1")
        admin.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        c.execute("UPDATE accounts SET balance = 0 WHERE id = 1")

    with pytest.raises(psycopg.errors.SerializationFailure) as got:
        run_transaction(conn, always_overtaken, attempts=4, stats=stats, sleep=clock.sleep)
    assert "gave up after 4 attempts" in "".join(got.value.__notes__)
    assert (stats.attempts, stats.retries, stats.gave_up) == (4, 3, 1) and len(clock.waits) == 3
    assert _balances(admin) == [104, 100]
    assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection is still usable


def test_40001_at_commit_is_retried(conn: psycopg.Connection[Any], admin: psycopg.Connection[Any]) -> None:
    """A lost certification fails the COMMIT with 40001: nothing committed, run it again."""
    _inject_at_commit(admin, "40001", failures=2)
    stats = RetryStats()
    run_transaction(conn, lambda c: c.execute("INSERT INTO items VALUES (1)"), stats=stats, sleep=Clock().sleep)
    assert stats.retries_by_sqlstate == {"40001": 2} and stats.attempts == 3
    assert admin.execute("SELECT id FROM items").fetchall() == [(1,)]


@pytest.mark.parametrize("sqlstate", ["08007", "08006"])
def test_a_connection_exception_at_commit_is_in_doubt_and_not_retried(
        conn: psycopg.Connection[Any], admin: psycopg.Connection[Any], sqlstate: str) -> None:
    """The node was cut off while the transaction committed (Chorus's 08007), or lost its
    coordinator while it waited for the verdict (08006): it may have committed elsewhere."""
    _inject_at_commit(admin, sqlstate, failures=1)
    stats = RetryStats()
    with pytest.raises(CommitOutcomeUnknown) as got:
        run_transaction(conn, lambda c: c.execute("INSERT INTO items VALUES (1)"), stats=stats, sleep=Clock().sleep)
    assert got.value.sqlstate == sqlstate and isinstance(got.value.__cause__, psycopg.OperationalError)
    assert "committed on every node or on none" in str(got.value)
    assert (stats.attempts, stats.in_doubt, stats.retries) == (1, 1, 0)


def test_a_connection_exception_before_commit_is_raised_as_it_is(conn: psycopg.Connection[Any]) -> None:
    stats = RetryStats()

    def fn(c: psycopg.Connection[Any]) -> None:
        c.execute("DO $$ BEGIN RAISE EXCEPTION 'coordinator unreachable' USING ERRCODE = '08006'; END $$")

    with pytest.raises(psycopg.errors.ConnectionFailure):
        run_transaction(conn, fn, stats=stats, sleep=Clock().sleep)
    assert (stats.attempts, stats.failed, stats.in_doubt) == (1, 1, 0)


def test_a_connection_lost_at_commit_is_in_doubt_and_not_retried(
        conn: psycopg.Connection[Any], admin: psycopg.Connection[Any]) -> None:
    stats = RetryStats()

    def fn(c: psycopg.Connection[Any]) -> None:
        c.execute("INSERT INTO items VALUES (7)")
        _terminate(admin, c)  # the backend is gone before COMMIT reaches it

    with pytest.raises(CommitOutcomeUnknown) as got:
        run_transaction(conn, fn, stats=stats, sleep=Clock().sleep)
    assert isinstance(got.value.__cause__, psycopg.OperationalError) and conn.closed
    assert (stats.attempts, stats.in_doubt) == (1, 1)


def test_a_connection_lost_inside_the_function_is_not_in_doubt(
        conn: psycopg.Connection[Any], admin: psycopg.Connection[Any]) -> None:
    stats = RetryStats()

    def fn(c: psycopg.Connection[Any]) -> None:
        _terminate(admin, c)
        c.execute("INSERT INTO items VALUES (7)")

    with pytest.raises(psycopg.OperationalError) as got:
        run_transaction(conn, fn, stats=stats, sleep=Clock().sleep)
    assert not isinstance(got.value, CommitOutcomeUnknown)
    assert (stats.attempts, stats.failed, stats.in_doubt) == (1, 1, 0)


class Pool:
    """The part of psycopg_pool.ConnectionPool the helper uses: a connection per checkout."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.lent: list[psycopg.Connection[Any]] = []

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        c = psycopg.connect(self.dsn)
        self.lent.append(c)
        try:
            yield c
        finally:
            c.close()


def test_with_a_pool_each_attempt_takes_a_connection(dsn: str, admin: psycopg.Connection[Any]) -> None:
    _inject_at_commit(admin, "40001", failures=2)
    pool, stats = Pool(dsn), RetryStats()

    def fn(c: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        c.execute("INSERT INTO items VALUES (3)")
        return c

    assert run_transaction(pool, fn, stats=stats, sleep=Clock().sleep) is pool.lent[-1]
    assert stats.attempts == 3 and len(pool.lent) == 3
    assert admin.execute("SELECT id FROM items").fetchall() == [(3,)]


def test_an_autocommit_connection_gets_a_transaction(dsn: str, admin: psycopg.Connection[Any]) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        def fn(c: psycopg.Connection[Any]) -> None:
            c.execute("INSERT INTO items VALUES (1)")
            c.execute("INSERT INTO items VALUES (1)")  # the whole transaction rolls back

        with pytest.raises(psycopg.errors.UniqueViolation):
            run_transaction(c, fn)
        assert admin.execute("SELECT count(*) FROM items").fetchone() == (0,)
        assert run_transaction(c, lambda c: c.execute("INSERT INTO items VALUES (1)").rowcount) == 1


def test_a_function_that_swallows_an_error_is_not_reported_committed(
        conn: psycopg.Connection[Any], admin: psycopg.Connection[Any]) -> None:
    def fn(c: psycopg.Connection[Any]) -> None:
        c.execute("INSERT INTO items VALUES (1)")
        try:
            c.execute("SELECT 1 / 0")
        except psycopg.errors.DivisionByZero:
            pass

    with pytest.raises(FailedTransaction):
        run_transaction(conn, fn)
    assert admin.execute("SELECT count(*) FROM items").fetchone() == (0,)


def test_a_connection_inside_a_transaction_is_refused(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT 1")
    with pytest.raises(psycopg.ProgrammingError, match="outside any transaction"):
        run_transaction(conn, lambda c: None)


SYNC_WAIT_STUB = """
CREATE SCHEMA chorus;
CREATE TABLE sync_waits (at_txid bigint);
CREATE FUNCTION chorus.sync_wait(timeout_ms integer DEFAULT NULL) RETURNS void LANGUAGE sql
    AS 'INSERT INTO sync_waits VALUES (txid_current())';
"""


def test_causal_reads_wait_before_the_transaction_takes_its_snapshot(
        conn: psycopg.Connection[Any], admin: psycopg.Connection[Any]) -> None:
    """The helper calls chorus.sync_wait() (a stub here, which records its call) in a transaction
    of its own: a REPEATABLE READ transaction's snapshot comes after the wait."""
    admin.execute(SYNC_WAIT_STUB)
    conn.isolation_level = IsolationLevel.REPEATABLE_READ

    def fn(c: psycopg.Connection[Any]) -> tuple[Any, ...]:
        row = c.execute("SELECT count(*), bool_and(at_txid < txid_current()) FROM sync_waits").fetchone()
        assert row is not None
        return tuple(row)

    assert run_transaction(conn, fn, causal_reads=True) == (1, True)
    assert run_transaction(conn, fn) == (1, True)


# --- SQLAlchemy ---

class Base(DeclarativeBase):
    pass


class Account(Base):
    __tablename__ = "accounts"
    id: Mapped[int] = mapped_column(primary_key=True)
    balance: Mapped[int]


class Item(Base):
    __tablename__ = "items"
    id: Mapped[int] = mapped_column(primary_key=True)


@pytest.fixture
def engine(dsn: str, postgresql: psycopg.Connection[Any]) -> Iterator[sa.Engine]:
    i = postgresql.info
    e = sa.create_engine(f"postgresql+psycopg://{i.user}:{PLAIN_PASSWORD}@{i.host}:{i.port}/{i.dbname}",
                         isolation_level="REPEATABLE READ")
    try:
        yield e
    finally:
        e.dispose()


def test_an_orm_conflict_is_retried_in_a_new_session(engine: sa.Engine, admin: psycopg.Connection[Any]) -> None:
    Sessions = sessionmaker(engine)
    stats, sessions = RetryStats(), []

    def transfer(session: Session) -> int:
        sessions.append(session)
        src, dst = session.get_one(Account, 1), session.get_one(Account, 2)
        if stats.attempts == 1:
            admin.execute("UPDATE accounts SET balance = balance + 50 WHERE id = 1")
        src.balance -= 10
        dst.balance += 10
        return int(src.balance)

    assert run_in_session(Sessions, transfer, stats=stats, sleep=Clock().sleep) == 140
    assert stats.retries_by_sqlstate == {"40001": 1} and sessions[0] is not sessions[1]
    assert _balances(admin) == [140, 110]


def test_an_orm_40001_at_commit_is_retried_and_08007_is_in_doubt(engine: sa.Engine,
                                                                 admin: psycopg.Connection[Any]) -> None:
    Sessions = sessionmaker(engine)
    _inject_at_commit(admin, "40001", failures=1)
    stats = RetryStats()
    run_in_session(Sessions, lambda s: s.add(Item(id=1)), stats=stats, sleep=Clock().sleep)
    assert stats.retries_by_sqlstate == {"40001": 1}
    admin.execute("UPDATE commit_fault SET sqlstate = '08007', failures = (SELECT last_value + 1 FROM commits_tried)")
    with pytest.raises(CommitOutcomeUnknown) as got:
        run_in_session(Sessions, lambda s: s.add(Item(id=2)), stats=stats, sleep=Clock().sleep)
    assert got.value.sqlstate == "08007" and isinstance(got.value.__cause__, sa.exc.OperationalError)
    assert sqlstate_of(got.value.__cause__) == "08007"
    assert stats.in_doubt == 1 and stats.attempts == 3


def test_an_orm_connection_lost_at_commit_is_in_doubt(engine: sa.Engine, admin: psycopg.Connection[Any]) -> None:
    Sessions = sessionmaker(engine)

    def fn(session: Session) -> None:
        session.add(Item(id=5))
        session.flush()
        pid = session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            time.sleep(0.01)

    stats = RetryStats()
    with pytest.raises(CommitOutcomeUnknown):
        run_in_session(Sessions, fn, stats=stats, sleep=Clock().sleep)
    assert stats.attempts == 1
    assert run_in_session(Sessions, lambda s: s.get(Item, 5)) is None  # the pool left the dead connection


def test_core_transactions_are_retried_and_read_causally(engine: sa.Engine, admin: psycopg.Connection[Any]) -> None:
    admin.execute(SYNC_WAIT_STUB)
    _inject_at_commit(admin, "40001", failures=1)
    stats = RetryStats()

    def fn(c: sa.Connection) -> Any:
        c.execute(sa.text("INSERT INTO items VALUES (9)"))
        return c.execute(sa.text("SELECT count(*) FROM sync_waits")).scalar_one()

    assert run_in_transaction(engine, fn, causal_reads=True, stats=stats, sleep=Clock().sleep) == 2
    assert stats.retries_by_sqlstate == {"40001": 1}


def test_an_engine_can_read_causally_on_every_connection(engine: sa.Engine) -> None:
    enable_causal_reads(engine, timeout_ms=2500)
    with engine.connect() as c:
        assert c.execute(sa.text("SHOW chorus.causal_reads")).scalar_one() == "on"
        assert c.execute(sa.text("SHOW chorus.causal_reads_timeout")).scalar_one() == "2500"
        c.rollback()  # the pool's reset on return: the settings stay
    assert run_in_session(sessionmaker(engine), lambda s: s.execute(sa.text("SHOW chorus.causal_reads")).scalar_one()) \
        == "on"
