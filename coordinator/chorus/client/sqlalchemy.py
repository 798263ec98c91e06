"""Whole-transaction retries for SQLAlchemy 2.0 (the optional dependency group ``clients``):
:func:`run_in_session` for the ORM, :func:`run_in_transaction` for Core, and
:func:`enable_causal_reads` to make every connection of an engine read causally. The rules are in
``chorus.client.retry``; docs/CLIENTS.md shows them in use.

    Session = sessionmaker(create_engine("postgresql+psycopg://...", isolation_level="REPEATABLE READ"))

    def transfer(session: Session) -> None:
        src, dst = session.get(Account, 1), session.get(Account, 2)
        src.balance -= 10
        dst.balance += 10

    run_in_session(Session, transfer)

SQLAlchemy wraps the driver's error in ``sqlalchemy.exc.DBAPIError`` (``OperationalError``,
``InternalError``, ...); the SQLSTATE is that of the driver's error, ``.orig`` (psycopg's
``sqlstate``, psycopg2's ``pgcode``).
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Optional, TypeVar

from sqlalchemy import event, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from chorus.client.retry import (DEFAULT_ATTEMPTS, Backoff, CommitOutcomeUnknown, RetryStats, commit_in_doubt,
                                 retryable, run_attempts)

T = TypeVar("T")
SessionT = TypeVar("SessionT", bound=Session)

SYNC_WAIT = text("SELECT chorus.sync_wait()")


def sqlstate_of(e: BaseException) -> Optional[str]:
    """The SQLSTATE of a database error SQLAlchemy raised (or of the driver's own error)."""
    orig = e.orig if isinstance(e, DBAPIError) else e
    for name in ("sqlstate", "pgcode"):
        value = getattr(orig, name, None)
        if isinstance(value, str):
            return value
    return None


def _retry_sqlstate(e: BaseException) -> Optional[str]:
    sqlstate = sqlstate_of(e) if isinstance(e, DBAPIError) else None
    return sqlstate if retryable(sqlstate) else None


def _commit_failed(e: DBAPIError) -> None:
    """An error raised while COMMIT ran: raise :class:`CommitOutcomeUnknown` if the outcome is
    unknown (SQLAlchemy marks a lost connection ``connection_invalidated``)."""
    sqlstate = sqlstate_of(e)
    if commit_in_doubt(sqlstate, connection_lost=e.connection_invalidated):
        raise CommitOutcomeUnknown(sqlstate, str(e.orig if e.orig is not None else e).strip()) from e


def _attempt_on(target: Any, fn: Callable[[Any], T], causal_reads: bool) -> T:
    """One attempt on a Session or a Connection (both begin() and execute() alike): the causal
    wait, the transaction (a session's changes flushed before COMMIT), and COMMIT's errors sorted
    out."""
    if causal_reads:
        with target.begin():
            target.execute(SYNC_WAIT)
    committing = False
    try:
        with target.begin():
            result = fn(target)
            if isinstance(target, Session):
                target.flush()
            committing = True
    except DBAPIError as e:
        if committing:
            _commit_failed(e)
        raise
    return result


def run_in_session(session_factory: Callable[[], SessionT], fn: Callable[[SessionT], T], *,
                   attempts: int = DEFAULT_ATTEMPTS, backoff: Backoff = Backoff(), causal_reads: bool = False,
                   stats: Optional[RetryStats] = None, sleep: Callable[[float], None] = time.sleep,
                   rand: Callable[[], float] = random.random) -> T:
    """Run ``fn(session)`` in a new session's transaction, flush and commit; return what ``fn``
    returned. ``session_factory`` is a ``sessionmaker`` (the engine's ``isolation_level`` is the
    transaction's; ``REPEATABLE READ`` is what read-modify-write ORM code needs, docs/CLIENTS.md).

    Each attempt has a session of its own: after a 40001 or a 40P01, in ``fn``, in the flush or
    at COMMIT, ``fn`` runs again in a new session, after :meth:`Backoff.delay` seconds, at most
    ``attempts`` times in all; then the last error is raised, with a note. ``fn`` must be safe to
    run more than once, and should return plain values rather than ORM objects (they are
    detached and expired once the session closes).

    A connection lost, or an error of class 08, while COMMIT runs leaves the outcome unknown:
    :class:`CommitOutcomeUnknown` is raised and nothing is retried. ``causal_reads``: before each
    attempt, wait until the node has committed every transaction the cluster had committed
    (``chorus.sync_wait()`` in a transaction of its own, before the attempt's snapshot).
    ``stats``, ``sleep`` and ``rand`` as for ``chorus.client.psycopg.run_transaction``."""

    def attempt(n: int) -> T:
        with session_factory() as session:
            return _attempt_on(session, fn, causal_reads)

    return run_attempts(attempt, _retry_sqlstate, attempts=attempts, backoff=backoff, stats=stats, sleep=sleep,
                        rand=rand)


def run_in_transaction(engine: Engine, fn: Callable[[Connection], T], *, attempts: int = DEFAULT_ATTEMPTS,
                       backoff: Backoff = Backoff(), causal_reads: bool = False, stats: Optional[RetryStats] = None,
                       sleep: Callable[[float], None] = time.sleep, rand: Callable[[], float] = random.random) -> T:
    """Core's counterpart of :func:`run_in_session`: run ``fn(connection)`` in a transaction on a
    connection of ``engine`` (a new one for each attempt) and commit, with the same retries, the
    same :class:`CommitOutcomeUnknown` and the same ``causal_reads``."""

    def attempt(n: int) -> T:
        with engine.connect() as conn:
            return _attempt_on(conn, fn, causal_reads)

    return run_attempts(attempt, _retry_sqlstate, attempts=attempts, backoff=backoff, stats=stats, sleep=sleep,
                        rand=rand)


def enable_causal_reads(engine: Engine, timeout_ms: Optional[int] = None) -> None:
    """Turn causal reads on for every connection ``engine`` opens from now on (an event listener
    on ``connect`` sets ``chorus.causal_reads = on``, and ``chorus.causal_reads_timeout`` if
    ``timeout_ms`` is given; call it right after ``create_engine``). Every ``READ COMMITTED``
    statement then first waits until the node has committed what the cluster had committed when
    it began (docs/ISOLATION.md). ``REPEATABLE READ`` and ``SERIALIZABLE`` transactions take their
    snapshot before such a wait could help: use ``causal_reads=True`` of :func:`run_in_session`
    or :func:`run_in_transaction` for them."""
    settings = ["SET chorus.causal_reads = on"]
    if timeout_ms is not None:
        settings.append(f"SET chorus.causal_reads_timeout = {int(timeout_ms)}")

    def on_connect(dbapi_connection: Any, connection_record: Any) -> None:
        # a new DBAPI connection, outside SQLAlchemy's transactions: commit, or the settings
        # would be rolled back with the driver's implicit transaction
        cursor = dbapi_connection.cursor()
        try:
            for statement in settings:
                cursor.execute(statement)
        finally:
            cursor.close()
        dbapi_connection.commit()

    event.listen(engine, "connect", on_connect)
