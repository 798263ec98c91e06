"""Whole-transaction retries for psycopg 3: :func:`run_transaction` runs a function in a
transaction on a connection (or on one taken from a pool for each attempt), commits, and runs it
again after a serialization failure or a deadlock. The rules are in ``chorus.client.retry``;
docs/CLIENTS.md shows it in use.

    from chorus.client import run_transaction

    def transfer(conn: psycopg.Connection[Any]) -> None:
        conn.execute("UPDATE accounts SET balance = balance - 10 WHERE id = %s", (src,))
        conn.execute("UPDATE accounts SET balance = balance + 10 WHERE id = %s", (dst,))

    run_transaction(conn, transfer)
"""

from __future__ import annotations

import random
import time
from contextlib import AbstractContextManager
from typing import Any, Callable, Optional, Protocol, TypeVar, Union

import psycopg
from psycopg import pq

from chorus.client.retry import (DEFAULT_ATTEMPTS, Backoff, CommitOutcomeUnknown, RetryStats, commit_in_doubt,
                                 retryable, run_attempts)

T = TypeVar("T")
ConnT = TypeVar("ConnT", bound="psycopg.Connection[Any]")
ConnT_co = TypeVar("ConnT_co", bound="psycopg.Connection[Any]", covariant=True)

SYNC_WAIT = "SELECT chorus.sync_wait()"
TRANSACTION_ID = "SELECT chorus.transaction_id()"


class ConnectionSource(Protocol[ConnT_co]):
    """Anything that lends connections the way ``psycopg_pool.ConnectionPool`` does."""

    def connection(self) -> AbstractContextManager[ConnT_co]: ...


class FailedTransaction(psycopg.ProgrammingError):
    """The function returned while its transaction was in the failed state (it caught a database
    error and went on): the COMMIT would have rolled back. Nothing was committed."""


def run_transaction(conn_or_pool: Union[ConnT, ConnectionSource[ConnT]], fn: Callable[[ConnT], T], *,
                    attempts: int = DEFAULT_ATTEMPTS, backoff: Backoff = Backoff(), causal_reads: bool = False,
                    outcome_id: bool = False, stats: Optional[RetryStats] = None, sleep: Callable[[float], None] = time.sleep,
                    rand: Callable[[], float] = random.random) -> T:
    """Run ``fn(conn)`` in a transaction and commit it; return what ``fn`` returned.

    ``conn_or_pool``: a connection outside any transaction (in autocommit mode or not; its
    ``isolation_level`` is the transaction's), or a pool: each attempt then takes a connection of
    its own, so an attempt can follow one whose connection was closed.

    If ``fn`` or the COMMIT fails with SQLSTATE 40001 (serialization failure) or 40P01
    (deadlock), the transaction was rolled back and ``fn`` runs again from the start, after
    :meth:`Backoff.delay` seconds, at most ``attempts`` times in all; then the last error is
    raised, with a note. ``fn`` must therefore be safe to run more than once: keep its effects
    inside the transaction, or make them idempotent.

    If the connection is lost, or an error of class 08 comes back, while COMMIT runs, the
    transaction committed on every node or on none: :class:`CommitOutcomeUnknown` is raised and
    nothing is retried, since a second run could apply the change twice. A connection lost while
    ``fn`` runs is raised as it is: COMMIT was never sent, nothing committed.

    ``causal_reads``: before each attempt, wait until this node has committed every transaction
    the cluster had committed (``chorus.sync_wait()``, in a transaction of its own, so the wait
    comes before the snapshot at every isolation level): ``fn`` then reads every write
    acknowledged, on any node, before the call. ``outcome_id``: read ``chorus.transaction_id()``
    before COMMIT (one more round trip), so that a :class:`CommitOutcomeUnknown` carries it and
    :func:`commit_outcome` can tell what became of the transaction. ``stats`` counts attempts and retries;
    ``sleep`` and ``rand`` stand in for ``time.sleep`` and ``random.random`` in tests."""
    if isinstance(conn_or_pool, psycopg.Connection):
        single: Optional[ConnT] = conn_or_pool
        pool: Optional[ConnectionSource[ConnT]] = None
    else:
        single, pool = None, conn_or_pool

    def attempt(n: int) -> T:
        if single is not None:
            return _attempt(single, fn, causal_reads, outcome_id)
        assert pool is not None
        with pool.connection() as conn:
            return _attempt(conn, fn, causal_reads, outcome_id)

    def retry_sqlstate(e: BaseException) -> Optional[str]:
        sqlstate = e.sqlstate if isinstance(e, psycopg.Error) else None
        if not retryable(sqlstate):
            return None
        if single is not None and single.closed:
            e.add_note("chorus.client: not retried: the connection was closed; pass a pool to retry on another one")
            return None
        return sqlstate

    return run_attempts(attempt, retry_sqlstate, attempts=attempts, backoff=backoff, stats=stats, sleep=sleep,
                        rand=rand)


def commit_outcome(conn: psycopg.Connection[Any], transaction_id: str) -> tuple[str, Optional[int], str]:
    """What became of a transaction whose COMMIT was lost (``CommitOutcomeUnknown.transaction_id``):
    ("committed" | "aborted" | "in doubt" | "unknown", its GID or None, why), asked of the node
    ``conn`` is connected to (any node; its origin knows best whether it still runs)."""
    row = conn.execute("SELECT outcome, gid, detail FROM chorus.commit_outcome(%s)", (transaction_id,)).fetchone()
    if not conn.autocommit:
        conn.commit()
    assert row is not None
    return str(row[0]), row[1], str(row[2])


def _attempt(conn: ConnT, fn: Callable[[ConnT], T], causal_reads: bool, outcome_id: bool = False) -> T:
    """One attempt: the transaction, and the commit's errors sorted out."""
    if _status(conn) != pq.TransactionStatus.IDLE:
        raise psycopg.ProgrammingError(
            f"run_transaction needs a connection outside any transaction; this one is {_status(conn).name}")
    if causal_reads:
        with conn.transaction():
            conn.execute(SYNC_WAIT)
    committing = False
    tid: Optional[str] = None
    try:
        with conn.transaction():
            result = fn(conn)
            if _status(conn) == pq.TransactionStatus.INERROR:
                raise FailedTransaction("the function returned from a failed transaction (it caught a database "
                                        "error); nothing was committed")
            if outcome_id:
                row = conn.execute(TRANSACTION_ID).fetchone()
                tid = str(row[0]) if row is not None else None
            committing = True
    except psycopg.Error as e:
        if committing and commit_in_doubt(e.sqlstate, connection_lost=conn.closed):
            raise CommitOutcomeUnknown(e.sqlstate, str(e).strip(), tid) from e
        raise
    return result


def _status(conn: psycopg.Connection[Any]) -> pq.TransactionStatus:
    """The connection's transaction status, as libpq last saw it (no round trip)."""
    return conn.info.transaction_status
