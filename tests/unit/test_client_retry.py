"""The client helpers' retry rules and loop (chorus.client, docs/CLIENTS.md), without a database;
tests/integration/test_client.py runs them against PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

import pytest

from chorus.client import Backoff, CommitOutcomeUnknown, RetryStats, commit_in_doubt, retryable, run_attempts
from chorus.testkit.fakeclock import Clock

class FakeError(Exception):
    def __init__(self, sqlstate: Optional[str]) -> None:
        super().__init__(f"fake {sqlstate}")
        self.sqlstate = sqlstate


def _fake_sqlstate(e: BaseException) -> Optional[str]:
    s = getattr(e, "sqlstate", None)
    return s if retryable(s) else None


def test_backoff_doubles_up_to_its_cap_and_jitters_below_it() -> None:
    b = Backoff(first=0.01, factor=2, cap=0.05)
    assert [b.ceiling(n) for n in range(1, 6)] == [0.01, 0.02, 0.04, 0.05, 0.05]
    assert b.delay(3, rand=lambda: 0.5) == pytest.approx(0.02)
    assert b.delay(3, rand=lambda: 0.0) == 0.0
    assert all(0 <= b.delay(n) < b.ceiling(n) for n in range(1, 20) for _ in range(20))
    with pytest.raises(ValueError):
        Backoff(factor=0.5)


def test_the_rules() -> None:
    assert retryable("40001") and retryable("40P01")
    assert not retryable("23505") and not retryable(None) and not retryable("08006")
    # at COMMIT: connection exceptions and lost connections leave the outcome unknown ...
    assert commit_in_doubt("08006", connection_lost=False)
    assert commit_in_doubt("08007", connection_lost=False)
    assert commit_in_doubt(None, connection_lost=True)
    assert commit_in_doubt("57P01", connection_lost=True)
    # ... a serialization failure is a rollback, even when the server closed the session after it
    assert not commit_in_doubt("40001", connection_lost=True)
    assert not commit_in_doubt("23505", connection_lost=False)


def test_a_retryable_error_runs_the_function_again_after_a_growing_backoff() -> None:
    clock, stats, seen = Clock(), RetryStats(), []

    def attempt(n: int) -> str:
        seen.append(n)
        if n <= 3:
            raise FakeError("40001" if n != 2 else "40P01")
        return "done"

    got = run_attempts(attempt, _fake_sqlstate, attempts=5, backoff=Backoff(first=0.1, factor=2, cap=10),
                       stats=stats, sleep=clock.sleep, rand=lambda: 1.0)
    assert got == "done" and seen == [1, 2, 3, 4]
    assert clock.waits == pytest.approx([0.1, 0.2, 0.4])
    assert (stats.transactions, stats.attempts, stats.retries, stats.committed) == (1, 4, 3, 1)
    assert stats.retries_by_sqlstate == {"40001": 2, "40P01": 1}
    assert stats.backoff_seconds == pytest.approx(0.7)


def test_after_the_last_attempt_the_last_error_is_raised_with_a_note() -> None:
    clock, stats = Clock(), RetryStats()
    errors = []

    def attempt(n: int) -> None:
        errors.append(FakeError("40001"))
        raise errors[-1]

    with pytest.raises(FakeError) as got:
        run_attempts(attempt, _fake_sqlstate, attempts=3, stats=stats, sleep=clock.sleep)
    assert got.value is errors[-1] and len(errors) == 3 and len(clock.waits) == 2
    assert "gave up after 3 attempts" in "".join(got.value.__notes__)
    assert (stats.retries, stats.gave_up, stats.committed) == (2, 1, 0)
    with pytest.raises(ValueError):
        run_attempts(attempt, _fake_sqlstate, attempts=0)


@pytest.mark.parametrize("error", [FakeError("23505"), FakeError(None), ValueError("a bug"),
                                   CommitOutcomeUnknown("08006", "gone")])
def test_other_errors_are_raised_at_once(error: Exception) -> None:
    clock, stats = Clock(), RetryStats()

    def attempt(n: int) -> None:
        raise error

    with pytest.raises(type(error)):
        run_attempts(attempt, _fake_sqlstate, stats=stats, sleep=clock.sleep)
    assert stats.attempts == 1 and clock.waits == []
    assert (stats.in_doubt, stats.failed) == ((1, 0) if isinstance(error, CommitOutcomeUnknown) else (0, 1))


def test_the_psycopg_helpers_do_not_import_sqlalchemy() -> None:
    code = "import sys, chorus.client; assert 'sqlalchemy' not in sys.modules, 'imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0, r.stderr
