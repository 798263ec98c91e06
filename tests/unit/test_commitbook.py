"""The commit bookkeeping (chorus/commit/book.py) against a simple reference model: random
admissions, commits, flushes and PostgreSQL restarts."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.commit.book import CommitBook, FlowControl, RunBatcher


@dataclass
class P:
    gid: int
    prev: int
    wait_for: int = -1


def test_one_lane_waits_for_the_previous_certified_gid() -> None:
    book: CommitBook[P] = CommitBook()
    book.start(1, 10)
    for gid, prev in ((11, 10), (13, 11), (14, 13)):
        book.admit(P(gid, prev))
    assert [(p.gid, p.wait_for) for p in book.pending.values()] == [(11, 10), (13, 11), (14, 13)]


def test_lanes_wait_for_their_own_previous_gid() -> None:
    book: CommitBook[P] = CommitBook()
    book.start(2, 10)
    for gid in (11, 12, 13, 15, 16):
        book.admit(P(gid, gid - 1))
    assert {p.gid: p.wait_for for p in book.pending.values()} == {11: 10, 12: 10, 13: 11, 15: 13, 16: 12}


def test_a_restart_gives_back_what_was_not_flushed() -> None:
    book: CommitBook[P] = CommitBook()
    book.start(1, 0)
    for g in range(1, 6):
        book.admit(P(g, g - 1))
    for g in (1, 2, 3):
        assert book.committed(g) is not None
    book.flushed(1)
    assert book.watermark == 3 and book.unflushed == 2
    book.start(1, 1)
    lost = book.restart(1)
    assert [p.gid for p in lost] == [2, 3]
    assert list(book.pending) == [2, 3, 4, 5] and book.watermark == 1 and book.unflushed == 0
    assert [p.wait_for for p in book.pending.values()] == [1, 2, 3, 4]
    assert book.committed(99) is None and book.watermark == 1


@settings(max_examples=300)
@given(st.integers(1, 3), st.lists(st.tuples(st.sampled_from("acfr"), st.integers(0, 5)), max_size=60))
def test_against_a_reference_model(lanes: int, ops: list[tuple[str, int]]) -> None:
    book: CommitBook[P] = CommitBook()
    book.start(lanes, 0)
    last_certified = 0
    lane_last = [0] * lanes  # the model's lanes
    pending: set[int] = set()
    committed: list[int] = []  # committed here, in GID order
    durable = 0

    def wait_of(gid: int, prev: int) -> int:
        if lanes == 1:
            return prev
        w, lane_last[gid % lanes] = lane_last[gid % lanes], gid
        return w

    for op, n in ops:
        if op == "a":  # the next certified GID (gaps: failed certifications)
            gid = last_certified + 1 + n % 2
            book.admit(P(gid, last_certified))
            assert book.pending[gid].wait_for == wait_of(gid, last_certified)
            last_certified = gid
            pending.add(gid)
        elif op == "c" and pending:  # commits come in GID order
            gid = min(pending)
            assert book.committed(gid) is not None
            pending.discard(gid)
            committed.append(gid)
            assert book.watermark == gid
        elif op == "f" and committed:  # the database flushed up to a committed GID
            durable = max(durable, committed[min(n, len(committed) - 1)])
            book.flushed(durable)
        elif op == "r":  # PostgreSQL restarts holding everything up to the durable GID
            lost_want = [g for g in committed if g > durable]
            book.start(lanes, durable)
            lost = book.restart(durable)
            assert [p.gid for p in lost] == lost_want
            committed = [g for g in committed if g <= durable]
            pending |= set(lost_want)
            assert book.watermark == durable and book.unflushed == 0
            lane_last = [durable] * lanes
            assert list(book.pending) == sorted(pending)  # pending again in GID order, lanes anew
            for g, p in book.pending.items():
                assert p.wait_for == wait_of(g, p.prev)
        assert set(book.pending) == pending
        assert book.unflushed == len([g for g in committed if g > durable])
    assert book.settled(min(pending) - 1 if pending else last_certified)
    assert not pending or not book.settled(max(pending))


def test_flow_control_pauses_at_the_high_mark_and_resumes_at_the_low_one() -> None:
    fc = FlowControl(pause_at=10, resume_at=3)
    assert [fc.check(n) for n in (0, 9, 10, 11, 10, 4)] == [None, None, True, None, None, None]
    assert fc.requested
    assert fc.check(3) is False and not fc.requested
    assert fc.check(9) is None


@given(st.lists(st.integers(0, 30), max_size=60))
def test_flow_control_requests_alternate_and_follow_the_backlog(backlogs: list[int]) -> None:
    fc = FlowControl(pause_at=20, resume_at=5)
    sent: list[bool] = []
    for n in backlogs:
        r = fc.check(n)
        if r is not None:
            sent.append(r)
            assert (r and n >= 20) or (not r and n <= 5)
        assert fc.requested == (sent[-1] if sent else False)
    assert all(a != b for a, b in zip(sent, sent[1:]))  # pause, resume, pause, ...


def test_flow_control_says_its_request_again_when_the_cluster_sees_otherwise() -> None:
    fc = FlowControl(pause_at=1, resume_at=0)
    assert fc.reassert(cluster_counts_it=False) is None
    assert fc.reassert(cluster_counts_it=True) is False  # a pause the node no longer wants
    fc.check(5)
    assert fc.reassert(cluster_counts_it=False) is True
    assert fc.reassert(cluster_counts_it=True) is None


@given(st.lists(st.tuples(st.integers(1, 5000), st.booleans()), max_size=80),
       st.integers(1, 6), st.integers(1, 20000))
def test_run_batcher_keeps_every_writeset_once_in_order_within_its_limits(
        sizes: list[tuple[int, bool]], max_count: int, max_bytes: int) -> None:
    """Against a reference: runs cover the writesets in order, each run starts after the GID
    before its first writeset, and a run is cut as soon as it has max_count writesets or more
    than max_bytes bytes (or where the caller flushes, as at a schema change)."""
    batcher: RunBatcher[int] = RunBatcher(max_count, max_bytes)
    runs: list[tuple[list[int], int]] = []
    prev = 0
    for gid, (size, flush_after) in enumerate(sizes, start=1):
        if batcher.add(gid, prev, size) or flush_after:
            got = batcher.take()
            assert got is not None
            runs.append(got)
        prev = gid
    rest = batcher.take()
    if rest is not None:
        runs.append(rest)
    assert batcher.take() is None
    assert [g for run, _ in runs for g in run] == list(range(1, len(sizes) + 1))
    for run, before in runs:
        assert before == run[0] - 1
        assert len(run) <= max_count
        full = [sizes[g - 1][0] for g in run]
        assert sum(full[:-1]) <= max_bytes  # cut once it went past the limit, not later


def test_a_book_started_at_a_committed_gid_counts_it_committed() -> None:
    """A coordinator that starts with its database at GID 49 has committed 49 from the start, not
    from its first tick: a vote opened in between on GID 31 must find it committed (a simulated
    node never voted on it, and the vote never closed)."""
    book: CommitBook[P] = CommitBook()
    book.start(1, 49)
    assert book.watermark == 49 and book.admitted == 49
