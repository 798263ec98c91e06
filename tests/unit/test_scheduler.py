"""Dependency scheduler (seed streams-parallel-apply 4.5): against a serial reference."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.commit.scheduler import PyScheduler, Scheduler
from chorus.wire import KeyMode


def k(n: int) -> bytes:
    return n.to_bytes(4, "big")


def test_independent_writesets_dispatch_together() -> None:
    s = Scheduler()
    for g in range(1, 5):
        s.add(g, [(k(g), KeyMode.EXCLUSIVE)], local=False)
    assert s.ready_remote(10) == [1, 2, 3, 4]


def test_dependent_writeset_waits_for_commit_and_head_of_line() -> None:
    s = Scheduler()
    s.add(1, [(k(1), KeyMode.UPDATE)], local=False)
    s.add(2, [(k(1), KeyMode.UPDATE)], local=False)
    s.add(3, [(k(3), KeyMode.UPDATE)], local=False)
    assert s.ready_remote(10) == [1]
    s.committed(1)
    assert s.ready_remote(10) == [2, 3]


def test_reference_keys_do_not_serialise() -> None:
    s = Scheduler()
    s.add(1, [(k(9), KeyMode.REFERENCE)], local=False)
    s.add(2, [(k(9), KeyMode.REFERENCE)], local=False)
    assert s.ready_remote(10) == [1, 2]


def test_local_writeset_blocks_dependents_until_committed_or_replayed() -> None:
    s = Scheduler()
    s.add(1, [(k(1), KeyMode.EXCLUSIVE)], local=True)
    s.add(2, [(k(1), KeyMode.EXCLUSIVE)], local=False)
    assert s.ready_remote(10) == []
    s.replay(1)
    assert s.next_replay() == 1
    s.committed(1)
    assert s.ready_remote(10) == [2]


def test_a_replay_waits_for_what_it_depends_on() -> None:
    """A local writeset to replay after an earlier remote one on the same row: replayed first,
    it would hold the row while it waits for its commit turn, and the earlier one could never
    take it (a simulated node stalled so after its PostgreSQL restarted)."""
    for impl in (PyScheduler, Scheduler):
        s = impl()
        s.add(1, [(k(1), KeyMode.UPDATE)], local=False)
        s.add(2, [(k(1), KeyMode.UPDATE)], local=True)
        s.replay(2)
        assert s.next_replay() is None
        assert s.ready_remote(10) == [1]
        s.committed(1)
        assert s.next_replay() == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=3), min_size=1, max_size=40), st.integers(0, 999))
def test_same_final_state_as_serial(keysets: list[list[int]], seed: int) -> None:
    """Run with random completion order: every key's writes land in GID order."""
    s = Scheduler()
    for g, ks in enumerate(keysets, start=1):
        s.add(g, [(k(x), KeyMode.UPDATE) for x in ks], local=False)
    rnd = random.Random(seed)
    running: list[int] = []
    final: dict[int, int] = {}
    order: list[int] = []
    while len(order) < len(keysets):
        running += s.ready_remote(4 - len(running))
        assert running, "scheduler stalled"
        g = running.pop(rnd.randrange(len(running)))
        for x in set(keysets[g - 1]):
            assert final.get(x, 0) < g
            final[x] = g
        order.append(g)
        s.committed(g)
    serial: dict[int, int] = {}
    for g, ks in enumerate(keysets, start=1):
        for x in ks:
            serial[x] = g
    assert final == serial


def test_schema_change_is_a_barrier() -> None:
    s = Scheduler()
    s.add(1, [(k(1), KeyMode.UPDATE)], local=False)
    s.add(2, [(k(2), KeyMode.UPDATE)], local=False)
    s.add(3, [], local=False, barrier=True)
    s.add(4, [(k(4), KeyMode.UPDATE)], local=False)
    assert s.ready_remote(8) == [1, 2]  # the barrier waits for both, and 4 waits behind it
    s.committed(1)
    assert s.ready_remote(8) == []
    s.committed(2)
    assert s.ready_remote(8) == [3]
    s.committed(3)
    assert s.ready_remote(8) == [4]


MODES = (KeyMode.REFERENCE, KeyMode.UPDATE, KeyMode.EXCLUSIVE)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 4), st.sampled_from(MODES)), min_size=1, max_size=3),
                min_size=1, max_size=40),
       st.lists(st.booleans(), min_size=40, max_size=40), st.integers(0, 999))
def test_conflicting_modes_never_overlap(keysets: list[list[tuple[int, KeyMode]]], local: list[bool],
                                         seed: int) -> None:
    """Mixed modes, local and remote writesets: a writeset is dispatched only once every earlier
    writeset it conflicts with (same key, conflicting modes) has committed; local ones commit in
    GID order (their backends take commit turns), remote ones in any order once dispatched."""
    s = Scheduler()
    for g, ks in enumerate(keysets, start=1):
        s.add(g, [(k(x), m) for x, m in ks], local=local[g - 1])
    rnd = random.Random(seed)
    done: set[int] = set()
    running: list[int] = []

    def conflicts(a: int, b: int) -> bool:
        return any(x == y and (KeyMode.EXCLUSIVE in (m, n) or m == n == KeyMode.UPDATE)
                   for x, m in keysets[a - 1] for y, n in keysets[b - 1])

    while len(done) < len(keysets):
        started = s.ready_remote(4 - len(running))
        for g in started:
            assert all(a in done for a in range(1, g) if conflicts(a, g)), g
        running += started
        # the lowest pending local writeset commits once everything it conflicts with has
        lowest_local = next((g for g in range(1, len(keysets) + 1) if local[g - 1] and g not in done), None)
        choices = list(running)
        if lowest_local is not None and all(a in done for a in range(1, lowest_local)
                                            if conflicts(a, lowest_local)):
            choices.append(lowest_local)
        assert choices, "scheduler stalled"
        g = choices[rnd.randrange(len(choices))]
        if g in running:
            running.remove(g)
        done.add(g)
        s.committed(g)
    assert len(s) == 0 and not s._keys


def test_shared_reference_key_stays_small() -> None:
    """Every writeset holds its table's reference key: the per-key list of holders since the last
    exclusive one is pruned as they commit, so a long backlog does not make registration slow."""
    s = Scheduler()
    table = k(999)
    s.add(1, [(table, KeyMode.REFERENCE)], local=True)  # a local writeset that stays pending
    for g in range(2, 5001):
        s.add(g, [(table, KeyMode.REFERENCE), (k(g), KeyMode.UPDATE)], local=False)
        if g > 10:
            for d in s.ready_remote(8):
                s.committed(d)
    ks = s._keys[table]
    assert ks.holders == len(s) and len(ks.since_exclusive) <= 2 * ks.holders + 16


def test_runs_take_consecutive_writesets_that_need_only_each_other() -> None:
    """Live apply: a ready writeset and the ones registered right after it that depend only on
    the run's earlier ones go in one transaction; a local writeset between them, a schema
    change, the run limit or the size limit end the run."""
    s = Scheduler()
    s.add(1, [(k(1), KeyMode.UPDATE)], local=False)
    s.add(2, [(k(1), KeyMode.UPDATE)], local=False)  # depends on 1: same run
    s.add(3, [(k(3), KeyMode.UPDATE)], local=False)
    s.add(4, [(k(4), KeyMode.UPDATE)], local=True)  # a local writeset ends the run
    s.add(5, [(k(5), KeyMode.UPDATE)], local=False)
    s.add(6, [(k(6), KeyMode.UPDATE)], local=False)
    s.add(7, [], local=False, barrier=True)
    s.add(8, [(k(8), KeyMode.UPDATE)], local=False)
    assert s.ready_runs(8, 8) == [[1, 2, 3], [5, 6]]  # the schema change waits for all before it
    for g in (1, 2, 3, 4, 5, 6):
        s.committed(g)
    assert s.ready_runs(8, 8) == [[7]]  # alone
    s.committed(7)
    assert s.ready_runs(8, 8) == [[8]]


def test_run_limits() -> None:
    s = Scheduler()
    for g in range(1, 8):
        s.add(g, [(k(g), KeyMode.UPDATE)], local=False)
    assert s.ready_runs(2, 3) == [[1, 2, 3], [4, 5, 6]]  # two sessions free: two runs
    assert s.ready_runs(8, 3, fits=lambda run: len(run) < 2) == [[7]]


def test_run_stops_at_a_writeset_that_waits_for_something_outside_it() -> None:
    s = Scheduler()
    s.add(1, [(k(1), KeyMode.UPDATE)], local=False)
    s.add(2, [(k(2), KeyMode.UPDATE)], local=False)
    s.add(3, [(k(1), KeyMode.UPDATE)], local=False)
    assert s.ready_runs(1, 1) == [[1]]  # 1 is out: 3 now waits for a writeset outside any run
    assert s.ready_runs(8, 8) == [[2]]
    s.committed(1)
    assert s.ready_runs(8, 8) == [[3]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 4), st.sampled_from(MODES)), min_size=1, max_size=3),
                min_size=1, max_size=40), st.integers(1, 5), st.integers(0, 999))
def test_runs_never_overlap_conflicting_writesets(keysets: list[list[tuple[int, KeyMode]]], max_run: int,
                                                  seed: int) -> None:
    """Runs applied as single transactions in random completion order: every writeset of a run
    starts only once each earlier writeset it conflicts with has committed or is earlier in the
    same run, and a run's writesets are consecutive."""
    s = Scheduler()
    for g, ks in enumerate(keysets, start=1):
        s.add(g, [(k(x), m) for x, m in ks], local=False)
    rnd = random.Random(seed)
    done: set[int] = set()
    running: list[list[int]] = []

    def conflicts(a: int, b: int) -> bool:
        return any(x == y and (KeyMode.EXCLUSIVE in (m, n) or m == n == KeyMode.UPDATE)
                   for x, m in keysets[a - 1] for y, n in keysets[b - 1])

    while len(done) < len(keysets):
        for run in s.ready_runs(3 - len(running), max_run):
            assert 1 <= len(run) <= max_run and run == list(range(run[0], run[0] + len(run)))
            for g in run:
                assert all(a in done or a in run for a in range(1, g) if conflicts(a, g)), (run, g)
            running.append(run)
        assert running, "scheduler stalled"
        run = running.pop(rnd.randrange(len(running)))
        for g in run:
            done.add(g)
            s.committed(g)
    assert len(s) == 0 and not s._keys


def test_a_writeset_whose_attempt_failed_is_applied_alone() -> None:
    """A run whose connection broke may have committed: retried, its writesets go one by one
    (each found committed, or applied), never in a larger run that would be partly committed."""
    s = Scheduler()
    for g in range(1, 4):
        s.add(g, [(k(g), KeyMode.UPDATE)], local=False)
    assert s.ready_runs(1, 8) == [[1, 2, 3]]
    s.add(4, [(k(4), KeyMode.UPDATE)], local=False)
    for g in (1, 2, 3):
        s.redispatch(g)
    assert s.ready_runs(8, 8) == [[1], [2], [3], [4]]
