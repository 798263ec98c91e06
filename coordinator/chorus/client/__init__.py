"""Client helpers for applications on Chorus (docs/CLIENTS.md): run a whole transaction again
when it loses certification (SQLSTATE 40001) or a deadlock (40P01), never when the outcome of
its COMMIT is unknown, and optionally read every write acknowledged anywhere in the cluster
first (causal reads).

- ``chorus.client.retry``: the rules and the retry loop, without a driver.
- ``chorus.client.psycopg``: :func:`run_transaction` for psycopg 3 connections and pools.
- ``chorus.client.sqlalchemy``: the same for SQLAlchemy 2.0 sessions and engines. It is imported
  only when named (SQLAlchemy is the optional dependency group ``clients``).
"""

from __future__ import annotations

from chorus.client.psycopg import ConnectionSource, FailedTransaction, commit_outcome, run_transaction
from chorus.client.retry import (RETRY_SQLSTATES, Backoff, CommitOutcomeUnknown, RetryStats, commit_in_doubt,
                                 retryable, run_attempts)

__all__ = ["Backoff", "CommitOutcomeUnknown", "ConnectionSource", "FailedTransaction", "RETRY_SQLSTATES",
           "RetryStats", "commit_in_doubt", "commit_outcome", "retryable", "run_attempts", "run_transaction"]
