"""The blocker watch's policy (chorus/blockers.py): which local sessions lose to certified
writesets, and how, round after round."""

from __future__ import annotations

from chorus.blockers import Abort, Blocking, BlockerWatch

APPLIER, LOCAL, CERTIFIED = 100, 200, 300
WAITING = {APPLIER: 10}  # the apply session of GID 10 waits


def hows(aborts: list[Abort]) -> list[tuple[int, str, bool]]:
    return [(a.pid, a.how, a.counts) for a in aborts]


def test_a_busy_local_statement_is_cancelled_at_once_then_interrupted_after_the_grace() -> None:
    w = BlockerWatch(grace=1.0)
    row = Blocking(APPLIER, LOCAL, "active", "t0")
    first = w.decide([row], WAITING, {APPLIER}, {}, now=5.0)
    assert hows(first) == [(LOCAL, "cancel", True)] and first[0].note and not first[0].warning
    assert hows(w.decide([row], WAITING, {APPLIER}, {}, now=5.5)) == [(LOCAL, "cancel", False)]
    assert hows(w.decide([row], WAITING, {APPLIER}, {}, now=6.0)) == [(LOCAL, "interrupt", False)]


def test_an_idle_session_is_flagged_then_closed_after_the_grace() -> None:
    w = BlockerWatch(grace=2.0)
    row = Blocking(APPLIER, LOCAL, "idle in transaction", "t0")
    assert hows(w.decide([row], WAITING, {APPLIER}, {}, now=1.0)) == [(LOCAL, "flag", True)]
    assert w.decide([row], WAITING, {APPLIER}, {}, now=2.0) == []  # flagged already: it waits
    closed = w.decide([row], WAITING, {APPLIER}, {}, now=3.0)
    assert hows(closed) == [(LOCAL, "close", False)] and "closing the session" in closed[0].note


def test_a_new_transaction_of_the_same_session_is_a_new_blocker() -> None:
    w = BlockerWatch(grace=2.0)
    w.decide([Blocking(APPLIER, LOCAL, "idle in transaction", "t0")], WAITING, {APPLIER}, {}, now=1.0)
    again = w.decide([Blocking(APPLIER, LOCAL, "idle in transaction", "t1")], WAITING, {APPLIER}, {}, now=1.5)
    assert hows(again) == [(LOCAL, "flag", True)]


def test_appliers_are_never_touched() -> None:
    w = BlockerWatch(grace=0.0)
    assert w.decide([Blocking(APPLIER, 101, "active", "t0")], WAITING, {APPLIER, 101}, {}, now=9.0) == []


def test_a_certified_backend_is_ended_only_if_it_comes_later_and_only_once() -> None:
    w = BlockerWatch(grace=1.0)
    earlier = Blocking(APPLIER, CERTIFIED, "active", "t0")
    assert w.decide([earlier], WAITING, {APPLIER}, {CERTIFIED: 9}, now=0.0) == []
    assert w.decide([earlier], WAITING, {APPLIER}, {CERTIFIED: 9}, now=5.0) == []  # it commits first
    w = BlockerWatch(grace=1.0)
    later = Blocking(APPLIER, CERTIFIED, "idle in transaction", "t0")
    assert w.decide([later], WAITING, {APPLIER}, {CERTIFIED: 11}, now=0.0) == []  # within the grace
    ended = w.decide([later], WAITING, {APPLIER}, {CERTIFIED: 11}, now=1.0)
    assert hows(ended) == [(CERTIFIED, "terminate", False)] and ended[0].warning
    assert w.decide([later], WAITING, {APPLIER}, {CERTIFIED: 11}, now=2.0) == []


def test_forget_drops_what_concerns_gids_no_longer_waiting() -> None:
    w = BlockerWatch(grace=1.0)
    w.decide([Blocking(APPLIER, LOCAL, "active", "t0")], WAITING, {APPLIER}, {}, now=0.0)
    w.forget([11])
    assert w.first_seen == {}
    assert hows(w.decide([Blocking(APPLIER, LOCAL, "active", "t0")], WAITING, {APPLIER}, {}, now=5.0)) == [
        (LOCAL, "cancel", True)]
