"""The apply scheduler in C (coordinator/chorus/dataplane/native/sched.c, bound by
dataplane/native.py) against the reference, commit/scheduler.PyScheduler (docs/NATIVE.md
section 4.3; seed streams-parallel-apply 4.5, invariants 3 and 4: a wrong dependency applies a
writeset before one it conflicts with, a lost one stalls the node).

A Hypothesis state machine drives both with the same random registrations (local and remote,
schema-change barriers, keys in every mode, repeated keys), commits in any order, runs with and
without a size rule, replays, failed attempts, restarts and commits up to a GID, as the commit
pipeline makes them, and requires after every step the same outputs, the same pending GIDs and
queue length and the same description of every GID (what it waits for). Then cases taken from
test_scheduler.py, run on both, and what only the C one has: its byte budget and its refusal of a
GID out of order."""

from __future__ import annotations

import os
from typing import Any, Optional

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from chorus.commit.scheduler import PyScheduler
from chorus.dataplane import native
from chorus.wire import KeyMode, key_hash

SCALE = int(os.environ.get("CHORUS_FUZZ_SCALE", "1"))

pytestmark = pytest.mark.usefixtures("native_core")

# short keys as test_impl_scheduler.py uses, and digests as order_keys() makes them
HASHES = [b"t:a", b"t:b", b"r:a1", b"r:a2", b"r:b1", key_hash([b"public", b"h"]), key_hash([b"public", b"h", b"1"])]
keysets = st.lists(st.tuples(st.sampled_from(HASHES), st.sampled_from(list(KeyMode))), max_size=4)
# a few writesets admitted together: keys, local (one in four), a barrier (one in ten), a key of
# its own (so that independent writesets, which make runs, are common too), GIDs skipped before it
writesets = st.lists(st.tuples(keysets, st.integers(0, 3).map(lambda n: n == 0), st.integers(0, 9).map(lambda n: n == 0),
                               st.booleans(), st.integers(0, 6).map(lambda n: max(0, n - 4))),
                     min_size=1, max_size=4)


class SchedulerPair(RuleBasedStateMachine):
    """One history of calls, fed to both schedulers, made as the commit pipeline makes them
    (commit/pipeline.py: admit, dispatch, an apply's success or transient failure, a local
    commit, a replay, reschedule after a restart)."""

    def __init__(self) -> None:
        super().__init__()
        self.py: Any = PyScheduler()
        self.c: Any = native.NativeScheduler()
        self.gid = 0
        self.dispatched: list[int] = []  # handed to sessions and not committed

    def both(self, call: str, *args: Any) -> Any:
        out = getattr(self.py, call)(*args)
        assert getattr(self.c, call)(*args) == out, call
        return out

    def nth_pending(self, n: int) -> Optional[int]:
        pending = self.py.pending()
        return pending[n % len(pending)] if pending else None

    @initialize(batch=writesets)
    def start(self, batch: list[tuple[list[tuple[bytes, KeyMode]], bool, bool, bool, int]]) -> None:
        self.admit(batch)

    @rule(batch=writesets)
    def admit(self, batch: list[tuple[list[tuple[bytes, KeyMode]], bool, bool, bool, int]]) -> None:
        for keys, local, barrier, own, skip in batch:
            self.gid += 1 + skip
            if own:
                keys = keys + [(self.gid.to_bytes(8, "big"), KeyMode.UPDATE)]
            self.both("add", self.gid, keys, local, barrier)

    @precondition(lambda self: self.py.queued > 0)
    @rule(limit=st.integers(0, 4), max_run=st.integers(0, 5), cap=st.integers(0, 3), replay=st.booleans())
    def dispatch(self, limit: int, max_run: int, cap: int, replay: bool) -> None:
        """A replay if the replay session is free, then runs for ``limit`` idle sessions; ``cap``
        > 0 bounds a run's size as RUN_BYTES does."""
        if replay:
            g = self.both("next_replay")
            if g is not None:
                self.dispatched.append(g)
        if cap == 0:
            runs = self.both("ready_runs", limit, max_run)
        else:
            seen: list[list[int]] = []
            runs = self.py.ready_runs(limit, max_run, lambda run: seen.append(list(run)) is None and len(run) <= cap)
            asked: list[list[int]] = []
            assert self.c.ready_runs(limit, max_run, lambda run: asked.append(list(run)) is None and len(run) <= cap) \
                == runs
            assert asked == seen  # the same runs considered, in the same order
        self.dispatched.extend(g for run in runs for g in run)

    @precondition(lambda self: bool(self.dispatched))
    @rule(n=st.integers(0, 12))
    def applied(self, n: int) -> None:
        """An apply handed to a session commits."""
        self.both("committed", self.dispatched.pop(n % len(self.dispatched)))

    @precondition(lambda self: bool(self.dispatched))
    @rule(n=st.integers(0, 12), restart=st.integers(-1, 12))
    def failed(self, n: int, restart: int) -> None:
        """An attempt failed transiently; with restart >= 0 it was PostgreSQL going away, which
        then comes back."""
        self.both("redispatch", self.dispatched.pop(n % len(self.dispatched)))
        if restart >= 0:
            self.restart(restart)

    @precondition(lambda self: len(self.py) > 0)
    @rule(n=st.integers(0, 12))
    def commit(self, n: int) -> None:
        """Any pending GID commits: a local one by its backend, a remote one found committed."""
        g = self.nth_pending(n)
        self.both("committed", g)
        if g in self.dispatched:
            self.dispatched.remove(g)

    @precondition(lambda self: len(self.py) > 0)
    @rule(n=st.integers(0, 12))
    def replay(self, n: int) -> None:
        """A backend could not commit its writeset (only a local one is replayed)."""
        self.both("replay", self.nth_pending(n))

    @rule(n=st.integers(0, 12))
    def restart(self, n: int) -> None:
        """PostgreSQL restarted, durable up to just below the n-th pending GID: what is at or
        below it committed, the rest re-applied (commit/pipeline.py reschedule)."""
        g = self.nth_pending(n)
        durable = self.gid if g is None else g - 1
        self.both("committed_upto", durable)
        self.both("replay_all_from", durable)
        self.dispatched.clear()

    @rule(back=st.integers(0, 12))
    def durable(self, back: int) -> None:
        """The database is durable up to a GID: what is at or below it is committed."""
        durable = max(0, self.gid - back)
        self.both("committed_upto", durable)
        self.dispatched = [g for g in self.dispatched if g > durable]

    @invariant()
    def same_state(self) -> None:
        assert (len(self.c), self.c.queued, self.c.pending()) == (len(self.py), self.py.queued, self.py.pending())
        for g in range(self.gid + 2):
            assert self.c.describe(g) == self.py.describe(g), g

    def teardown(self) -> None:
        assert self.c.ready_remote(100) == self.py.ready_remote(100)


def test_same_dependencies_runs_and_replays() -> None:
    run_state_machine_as_test(SchedulerPair, settings=settings(max_examples=120 * SCALE, stateful_step_count=40,
                                                               deadline=None))


def k(n: int) -> bytes:
    return n.to_bytes(4, "big")


IMPLS = [PyScheduler, "native"]


def _new(which: Any) -> Any:
    return native.NativeScheduler() if which == "native" else which()


@pytest.mark.parametrize("which", IMPLS)
def test_dependent_writeset_waits_for_commit_and_head_of_line(which: Any) -> None:
    s = _new(which)
    s.add(1, [(k(1), KeyMode.UPDATE)], local=False)
    s.add(2, [(k(1), KeyMode.UPDATE)], local=False)
    s.add(3, [(k(3), KeyMode.UPDATE)], local=False)
    assert s.ready_remote(10) == [1]
    s.committed(1)
    assert s.ready_remote(10) == [2, 3]


@pytest.mark.parametrize("which", IMPLS)
def test_a_replay_waits_for_what_it_depends_on(which: Any) -> None:
    s = _new(which)
    s.add(1, [(k(1), KeyMode.UPDATE)], local=False)
    s.add(2, [(k(1), KeyMode.UPDATE)], local=True)
    s.replay(2)
    assert s.next_replay() is None
    assert s.ready_remote(10) == [1]
    s.committed(1)
    assert s.next_replay() == 2


@pytest.mark.parametrize("which", IMPLS)
def test_schema_change_is_a_barrier(which: Any) -> None:
    s = _new(which)
    s.add(1, [(k(1), KeyMode.UPDATE)], local=False)
    s.add(2, [(k(2), KeyMode.UPDATE)], local=False)
    s.add(3, [], local=False, barrier=True)
    s.add(4, [(k(4), KeyMode.UPDATE)], local=False)
    assert s.ready_remote(8) == [1, 2]
    s.committed(1)
    assert s.ready_remote(8) == []
    s.committed(2)
    assert s.ready_remote(8) == [3]
    s.committed(3)
    assert s.ready_remote(8) == [4]


@pytest.mark.parametrize("which", IMPLS)
def test_runs_take_consecutive_writesets_that_need_only_each_other(which: Any) -> None:
    s = _new(which)
    s.add(1, [(k(1), KeyMode.UPDATE)], local=False)
    s.add(2, [(k(1), KeyMode.UPDATE)], local=False)
    s.add(3, [(k(3), KeyMode.UPDATE)], local=False)
    s.add(4, [(k(4), KeyMode.UPDATE)], local=True)
    s.add(5, [(k(5), KeyMode.UPDATE)], local=False)
    s.add(6, [(k(6), KeyMode.UPDATE)], local=False)
    s.add(7, [], local=False, barrier=True)
    s.add(8, [(k(8), KeyMode.UPDATE)], local=False)
    assert s.ready_runs(8, 8) == [[1, 2, 3], [5, 6]]
    for g in (1, 2, 3, 4, 5, 6):
        s.committed(g)
    assert s.ready_runs(8, 8) == [[7]]
    s.committed(7)
    assert s.ready_runs(8, 8) == [[8]]


@pytest.mark.parametrize("which", IMPLS)
def test_run_limits_and_failed_attempts(which: Any) -> None:
    s = _new(which)
    for g in range(1, 8):
        s.add(g, [(k(g), KeyMode.UPDATE)], local=False)
    assert s.ready_runs(2, 3) == [[1, 2, 3], [4, 5, 6]]
    assert s.ready_runs(8, 3, lambda run: len(run) < 2) == [[7]]
    for g in (1, 2, 3):
        s.redispatch(g)
    s.add(8, [(k(8), KeyMode.UPDATE)], local=False)
    assert s.ready_runs(8, 8) == [[1], [2], [3], [8]]


@pytest.mark.parametrize("which", IMPLS)
def test_a_failed_gid_stays_alone_behind_a_fresh_head(which: Any) -> None:
    """After a restart a GID whose attempt failed is queued again behind GIDs that never failed:
    the run of the one before it stops there, and it goes alone."""
    s = _new(which)
    for g in range(1, 4):
        s.add(g, [(k(g), KeyMode.UPDATE)], local=False)
    assert s.ready_runs(1, 8) == [[1, 2, 3]]
    s.redispatch(2)
    assert s.replay_all_from(0) == [1, 2, 3]
    assert s.ready_runs(8, 8) == [[1], [2], [3]]


@pytest.mark.parametrize("which", IMPLS)
def test_shared_reference_key_stays_small(which: Any) -> None:
    """A long backlog behind one pending local writeset, every writeset holding its table's
    reference key: registering stays cheap and dispatch goes on."""
    s = _new(which)
    table = k(999)
    s.add(1, [(table, KeyMode.REFERENCE)], local=True)
    done = []
    for g in range(2, 3001):
        s.add(g, [(table, KeyMode.REFERENCE), (k(g), KeyMode.UPDATE)], local=False)
        if g > 10:
            for d in s.ready_remote(8):
                s.committed(d)
                done.append(d)
    assert len(done) > 2900 and s.pending()[0] == 1
    s.add(3001, [(table, KeyMode.EXCLUSIVE)], local=False)
    assert s.describe(3001)["waits_for"][0] == 1


@pytest.mark.parametrize("which", IMPLS)
def test_an_exception_from_fits_comes_through(which: Any) -> None:
    s = _new(which)
    for g in range(1, 4):
        s.add(g, [(k(g), KeyMode.UPDATE)], local=False)

    def fits(run: list[int]) -> bool:
        raise ZeroDivisionError("fits")

    with pytest.raises(ZeroDivisionError):
        s.ready_runs(8, 8, fits)
    assert s.describe(1)["dispatched"] and not s.describe(2)["dispatched"]  # as far as it got


@pytest.mark.parametrize("which", IMPLS)
def test_a_queue_naming_a_committed_gid_raises_keyerror(which: Any) -> None:
    """A remote GID put back while still queued is queued twice; committed, one stays behind and
    the next dispatch finds nothing registered under it (a misuse: the pipeline puts back only
    what it dispatched). Both raise KeyError."""
    s = _new(which)
    s.add(1, [(k(1), KeyMode.UPDATE)], local=False)
    s.redispatch(1)
    s.committed(1)
    assert s.queued == 1
    with pytest.raises(KeyError):
        s.ready_runs(1, 1)


def test_only_increasing_gids() -> None:
    """Where PyScheduler has only its docstring, the C one refuses a GID not above the last."""
    s = native.NativeScheduler()
    s.add(5, [(k(1), KeyMode.UPDATE)], local=False)
    for g in (5, 4, 0):
        with pytest.raises(ValueError):
            s.add(g, [], local=False)
    assert s.pending() == [5]


def test_the_byte_budget_refuses_and_changes_nothing() -> None:
    """Past its budget the C scheduler refuses with MemoryError and stays as it was; committing
    makes room again."""
    s = native.NativeScheduler(max_bytes=96 << 10)
    g = 0
    with pytest.raises(MemoryError):
        while True:
            before = (s.pending(), s.queued, s.describe(g))
            g += 1
            s.add(g, [(k(g % 50), KeyMode.UPDATE), (k(1000 + g), KeyMode.EXCLUSIVE)], local=g % 3 == 0)
    assert (s.pending(), s.queued, s.describe(g - 1)) == before and s.describe(g) == {"scheduled": False}
    assert 0 < s.nbytes <= 96 << 10
    s.committed_upto(g - 1)
    assert len(s) == 0 and s.queued == 0
    s.add(g, [(k(1), KeyMode.UPDATE)], local=False)
    assert s.ready_remote(1) == [g]
