"""The C outcome index (dataplane/native/outcomes.c, bound as native.NativeOutcomes) against
outcomes.OutcomeIndex, the reference: the same records and GIDs seen give the same outcomes, the
same length and the same ``complete_after``, at any size (eviction of the oldest, a transaction
recorded again keeping its place), and after the origins are renumbered, again and again (an order core given
another certification index). The order core's own use of it is held by test_dataplane_order.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.dataplane import native
from chorus.outcomes import Outcome, OutcomeIndex

pytestmark = pytest.mark.usefixtures("native_core")

ORIGINS = ("", "n1", "n2", "n3")

ops = st.lists(st.one_of(
    st.tuples(st.just("seen"), st.integers(0, 40)),
    st.tuples(st.just("record"), st.sampled_from(ORIGINS), st.sampled_from([0, 1, 2, 7, (1 << 32) + 1, (1 << 32) - 1]),
              st.integers(1, 40), st.booleans())), max_size=60)


def pair(size: int, ids: dict[str, int]) -> tuple[OutcomeIndex, native.NativeOutcomes]:
    return OutcomeIndex(size), native.NativeOutcomes(lambda: ids, size)


def same(py: OutcomeIndex, c: native.NativeOutcomes) -> None:
    assert (len(c), c.complete_after) == (len(py), py.complete_after)
    for o in ORIGINS + ("n9",):
        for x in (0, 1, 2, 7, 3):
            assert c.get(o, x) == py.get(o, x), (o, x)


@settings(max_examples=500, deadline=None)
@given(size=st.integers(0, 6), steps=ops, renumber_at=st.sets(st.integers(0, 60), max_size=8))
def test_same_outcomes(size: int, steps: list[tuple], renumber_at: set[int]) -> None:
    ids = {name: i for i, name in enumerate(ORIGINS)}
    py, c = pair(size, ids)
    for i, step in enumerate(steps):
        if i in renumber_at:  # another index numbers the origins its own way
            old = sorted(ids, key=ids.__getitem__)
            new = {name: n for n, name in enumerate(old[1:] + old[:1])}
            c.renumber(old, new)
            ids.clear()
            ids.update(new)
        if step[0] == "seen":
            py.seen(step[1])
            c.seen(step[1])
        else:
            _, origin, xid, gid, ok = step
            outcome = Outcome(gid, ok, "" if ok else f"conflict at {gid}")
            py.record(origin, xid, outcome)
            c.record(origin, xid, outcome)
        same(py, c)


def test_recorded_again_keeps_its_place() -> None:
    """OrderedDict assignment keeps a key's place: recording n1's xid 1 again does not save it
    from being the oldest."""
    ids = {"": 0, "n1": 1, "n2": 2}
    py, c = pair(2, ids)
    for ix in (py, c):
        ix.record("n1", 1, Outcome(1, True))
        ix.record("n2", 1, Outcome(2, False, "lost"))
        ix.record("n1", 1, Outcome(3, False, "lost again"))
        ix.record("n2", 2, Outcome(4, True))
    same(py, c)
    assert c.get("n1", 1) is None and c.get("n2", 1) == Outcome(2, False, "lost")
    assert c.complete_after == 3


def test_reasons_outlive_pruning() -> None:
    """The reasons of failures are kept in Python and pruned to what C still has: many failures,
    some recorded again, on a small index keep each present failure's reason."""
    import random

    rnd = random.Random(5)
    ids = {"": 0, "n1": 1, "n2": 2}
    py, c = pair(3, ids)
    for gid in range(1, 400):
        origin, xid = rnd.choice(("n1", "n2")), rnd.randrange(30)
        ok = rnd.random() < 0.2
        outcome = Outcome(gid, ok, "" if ok else f"conflict {gid}")
        py.record(origin, xid, outcome)
        c.record(origin, xid, outcome)
        assert all(c.get(o, x) == py.get(o, x) for o in ("n1", "n2") for x in range(30))
    assert len(c._reasons) <= 2 * 3 + 16 + 1
