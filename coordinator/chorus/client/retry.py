"""Retrying whole transactions, without a driver: which errors call for a retry, which leave the
outcome of a commit unknown, how long to wait between attempts, and the loop that runs the
attempts. The drivers' helpers (``chorus.client.psycopg``, ``chorus.client.sqlalchemy``) run one
attempt each and tell this module what went wrong; docs/CLIENTS.md says why the rules are these.

- ``40001`` (serialization failure: a lost certification, or a local transaction aborted for a
  certified remote one) and ``40P01`` (deadlock): the transaction was rolled back everywhere and
  changed nothing. Run the whole function again, after a jittered exponential backoff.
- An error of class ``08`` (connection exception: ``08006`` connection failure, ``08007``
  transaction resolution unknown), or the connection lost, *while COMMIT ran*: the transaction
  may have committed on every node or on none. It is never retried (a retry could apply it
  twice); :class:`CommitOutcomeUnknown` says so.
- Anything else, and anything once the attempts are used up: raised as it is (the last one with
  a note saying how many attempts were made).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

log = logging.getLogger("chorus.client")

T = TypeVar("T")

#: the SQLSTATEs after which the whole transaction is run again: nothing of it committed
RETRY_SQLSTATES = frozenset({"40001", "40P01"})

DEFAULT_ATTEMPTS = 8


class CommitOutcomeUnknown(Exception):
    """The connection was lost, or the node was cut off from the cluster, while COMMIT ran: the
    transaction committed on every node or on none, and this client cannot tell which. It was not
    retried. The driver's error is the ``__cause__``; ``sqlstate`` is its SQLSTATE, if any.

    Find out before running it again: with ``transaction_id`` (the helper read it before COMMIT
    when asked to), ``chorus.commit_outcome(transaction_id)`` on any node says what became of it;
    or from the data (a row the transaction wrote, or a unique request id it stored);
    docs/CLIENTS.md."""

    def __init__(self, sqlstate: Optional[str], detail: str, transaction_id: Optional[str] = None) -> None:
        self.sqlstate = sqlstate
        self.transaction_id = transaction_id
        super().__init__(
            f"the outcome of COMMIT is unknown ({'SQLSTATE ' + sqlstate if sqlstate else 'connection lost'}: "
            f"{detail}): the transaction committed on every node or on none; it was not retried")


def retryable(sqlstate: Optional[str]) -> bool:
    """Does an error with this SQLSTATE mean "rolled back, run it again"?"""
    return sqlstate in RETRY_SQLSTATES


def commit_in_doubt(sqlstate: Optional[str], connection_lost: bool) -> bool:
    """For an error raised while COMMIT ran: is the outcome unknown? A server's answer of
    40001 or 40P01 is a rollback even if the connection closed after it (a session closed for a
    certified remote transaction gets 40001 and then loses its connection)."""
    if retryable(sqlstate):
        return False
    return connection_lost or (sqlstate or "").startswith("08")


@dataclass(frozen=True)
class Backoff:
    """How long to wait before retry number ``n`` (1 for the first): a uniformly random time
    between 0 and ``min(cap, first * factor ** (n - 1))`` seconds ("full jitter": clients that
    lost to the same transaction do not come back together)."""

    first: float = 0.01
    factor: float = 2.0
    cap: float = 1.0

    def __post_init__(self) -> None:
        if self.first < 0 or self.cap < 0 or self.factor < 1:
            raise ValueError(f"Backoff needs first >= 0, cap >= 0, factor >= 1: {self}")

    def ceiling(self, n: int) -> float:
        """The longest wait before retry ``n``."""
        return float(min(self.cap, self.first * self.factor ** (n - 1)))

    def delay(self, n: int, rand: Callable[[], float] = random.random) -> float:
        """The wait before retry ``n``; ``rand`` returns a number in [0, 1)."""
        return self.ceiling(n) * rand()


class RetryStats:
    """Counters of what the helpers did, safe to share between threads: ``transactions`` (calls),
    ``committed``, ``attempts``, ``retries`` (by SQLSTATE in ``retries_by_sqlstate``),
    ``gave_up`` (retryable errors raised once the attempts were used up), ``in_doubt``
    (:class:`CommitOutcomeUnknown` raised), ``failed`` (other errors raised) and
    ``backoff_seconds`` (the time spent waiting)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.transactions = 0
        self.committed = 0
        self.attempts = 0
        self.retries = 0
        self.retries_by_sqlstate: Counter[str] = Counter()
        self.gave_up = 0
        self.in_doubt = 0
        self.failed = 0
        self.backoff_seconds = 0.0

    def _add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def _retry(self, sqlstate: str, delay: float) -> None:
        with self._lock:
            self.retries += 1
            self.retries_by_sqlstate[sqlstate] += 1
            self.backoff_seconds += delay

    def as_dict(self) -> dict[str, object]:
        """The counters at this moment."""
        with self._lock:
            return {"transactions": self.transactions, "committed": self.committed, "attempts": self.attempts,
                    "retries": self.retries, "retries_by_sqlstate": dict(self.retries_by_sqlstate),
                    "gave_up": self.gave_up, "in_doubt": self.in_doubt, "failed": self.failed,
                    "backoff_seconds": self.backoff_seconds}

    def __repr__(self) -> str:
        return f"RetryStats({self.as_dict()})"


def run_attempts(attempt: Callable[[int], T], retry_sqlstate: Callable[[BaseException], Optional[str]], *,
                 attempts: int = DEFAULT_ATTEMPTS, backoff: Backoff = Backoff(),
                 stats: Optional[RetryStats] = None, sleep: Callable[[float], None] = time.sleep,
                 rand: Callable[[], float] = random.random) -> T:
    """Call ``attempt(n)`` for n = 1, 2, ... until it returns, and return what it returned.

    An exception for which ``retry_sqlstate`` gives a SQLSTATE (the driver's helper decides:
    40001 or 40P01, and the attempt can be run again) is followed by a backoff wait and the next
    attempt, at most ``attempts`` attempts in all; the last one is raised with a note. Every other
    exception, :class:`CommitOutcomeUnknown` included, is raised at once."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    stats = stats if stats is not None else RetryStats()
    stats._add(transactions=1)
    n = 1
    while True:
        stats._add(attempts=1)
        try:
            result = attempt(n)
        except CommitOutcomeUnknown:
            stats._add(in_doubt=1)
            raise
        except Exception as e:
            sqlstate = retry_sqlstate(e)
            if sqlstate is None:
                stats._add(failed=1)
                raise
            if n >= attempts:
                stats._add(gave_up=1)
                e.add_note(f"chorus.client: gave up after {n} attempt{'s' if n > 1 else ''}; "
                           f"each failed with a retryable error, the last with SQLSTATE {sqlstate}")
                raise
            delay = backoff.delay(n, rand)
            stats._retry(sqlstate, delay)
            log.debug("attempt %d failed with SQLSTATE %s; retrying in %.3f s", n, sqlstate, delay)
            sleep(delay)
            n += 1
            continue
        stats._add(committed=1)
        return result
