"""The conflict policies (docs/LINKS.md section 7): each deterministic and symmetric, so both
sites, and every node of each, settle a conflict alike."""

from __future__ import annotations

from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus import wire
from chorus.link.events import Version
from chorus.link.policy import (DeltaApply, FunctionPolicy, LatestCommitWins, Outcome, Policy, PolicyError,
                                PrimaryWins, delta_values)

from linkmodel import TABLE


def _v(site: str, clock: int, time: int, v: Optional[str], n: int = 0,
       old_n: "Optional[int | wire.Unchanged]" = None) -> Version:
    values = None if v is None else (b"k", v.encode(), str(n).encode())
    old = None if old_n is None else (b"k", b"",
                                      old_n if isinstance(old_n, wire.Unchanged) else str(old_n).encode())
    return Version(site, clock, time, values, old)


def _concat(function: str, table: wire.Table, first: Version, second: Version) -> Optional[tuple[wire.Value, ...]]:
    if first.values is None or second.values is None:
        return first.values
    return (first.values[0], bytes(first.values[1] or b"") + b"+" + bytes(second.values[1] or b""), first.values[2])


POLICIES: list[Policy] = [LatestCommitWins(), PrimaryWins("A"), PrimaryWins("B"), FunctionPolicy("f", "A", _concat),
                          FunctionPolicy("f", "B", _concat)]
versions = st.builds(_v, st.just("A"), st.integers(0, 5), st.integers(0, 5), st.one_of(st.none(), st.sampled_from("pqr")))


@settings(max_examples=300, deadline=None)
@given(versions, versions.map(lambda v: Version("B", v.clock, v.commit_time, v.values)), st.sampled_from(POLICIES))
def test_every_policy_is_symmetric(a: Version, b: Version, policy: Policy) -> None:
    at_a, at_b = policy.decide(TABLE, a, b), policy.decide(TABLE, b, a)
    assert at_a.values == at_b.values
    assert at_a.winner == at_b.winner
    mirror = {Outcome.KEEP_LOCAL: Outcome.TAKE_REMOTE, Outcome.TAKE_REMOTE: Outcome.KEEP_LOCAL, Outcome.MERGED: Outcome.MERGED}
    if a.values != b.values:
        assert at_b.outcome == mirror[at_a.outcome]
    assert policy.decide(TABLE, a, b) == at_a  # deterministic


def test_latest_commit_wins_and_its_tie_break() -> None:
    p = LatestCommitWins()
    assert p.decide(TABLE, _v("A", 1, 10, "a"), _v("B", 9, 9, "b")).outcome == Outcome.KEEP_LOCAL
    assert p.decide(TABLE, _v("A", 1, 10, "a"), _v("B", 1, 11, "b")).outcome == Outcome.TAKE_REMOTE
    # equal times: the site that sorts last, on both sides
    assert p.decide(TABLE, _v("A", 5, 10, "a"), _v("B", 1, 10, "b")).winner.site == "B"
    assert p.decide(TABLE, _v("B", 1, 10, "b"), _v("A", 5, 10, "a")).winner.site == "B"
    # then the clock (two versions of one site meet only through a chain)
    assert p.decide(TABLE, _v("A", 5, 10, "a"), _v("A", 6, 10, "b")).winner.clock == 6
    with pytest.raises(PolicyError):
        p.decide(TABLE, _v("A", 5, 10, "a"), _v("A", 5, 10, "b"))


def test_primary_wins() -> None:
    p = PrimaryWins("A")
    d = p.decide(TABLE, _v("A", 1, 1, "a"), _v("B", 1, 99, "b"))
    assert d.outcome == Outcome.KEEP_LOCAL and d.values == (b"k", b"a", b"0")
    d = p.decide(TABLE, _v("B", 1, 99, None), _v("A", 1, 1, "a"))  # a delete on the secondary loses too
    assert d.outcome == Outcome.TAKE_REMOTE and d.values == (b"k", b"a", b"0")
    with pytest.raises(PolicyError):
        PrimaryWins("C").decide(TABLE, _v("A", 1, 1, "a"), _v("B", 1, 1, "b"))


def test_delta_keeps_both_increments() -> None:
    p = DeltaApply(("n",))
    # A went 10 -> 13, B went 10 -> 15: each side adds the other's increment
    at_a = p.decide(TABLE, _v("A", 1, 1, "a", 13), _v("B", 1, 2, "b", 15, old_n=10))
    at_b = p.decide(TABLE, _v("B", 1, 2, "b", 15), _v("A", 1, 1, "a", 13, old_n=10))
    assert at_a.values == at_b.values == (b"k", b"b", b"18")  # v by the fallback (B committed later)
    assert at_a.outcome == Outcome.MERGED and at_a.winner.site == "B"
    # without concurrency the delta is the new value
    assert delta_values(TABLE, ("n",), (b"k", b"b", b"13"), (b"k", b"a", b"10"),
                        _v("B", 1, 1, "b", 13, old_n=10)) == (b"k", b"b", b"13")
    # a delete is settled by the fallback alone
    assert p.decide(TABLE, _v("A", 1, 1, None), _v("B", 1, 2, "b", 15, old_n=10)).values == (b"k", b"b", b"15")
    # the old value was not captured (a change from before the capture option): the fallback's
    # row, said so
    d = p.decide(TABLE, _v("A", 1, 1, "a", 13), _v("B", 1, 2, "b", 15))
    assert d.outcome == Outcome.TAKE_REMOTE and d.values == (b"k", b"b", b"15")
    assert d.note == "no old values of the delta columns: latest-commit-wins"
    # captured, but not this column ('u' in the old image): the same
    d = p.decide(TABLE, _v("A", 1, 1, "a", 13), _v("B", 1, 2, "b", 15, old_n=wire.UNCHANGED))
    assert d.values == (b"k", b"b", b"15") and d.note
    with pytest.raises(PolicyError):
        DeltaApply(("v",)).decide(TABLE, _v("A", 1, 1, "a", 13), _v("B", 1, 2, "b", 15, old_n=10))
    with pytest.raises(PolicyError):
        DeltaApply(("nope",)).decide(TABLE, _v("A", 1, 1, "a", 13), _v("B", 1, 2, "b", 15, old_n=10))


def test_function_gets_the_versions_in_canonical_order() -> None:
    calls: list[tuple[str, str]] = []

    def f(function: str, table: wire.Table, first: Version, second: Version) -> Optional[tuple[wire.Value, ...]]:
        calls.append((first.site, second.site))
        return _concat(function, table, first, second)

    p = FunctionPolicy("public.merge", "B", f)
    d1 = p.decide(TABLE, _v("A", 1, 1, "a"), _v("B", 1, 2, "b"))
    d2 = p.decide(TABLE, _v("B", 1, 2, "b"), _v("A", 1, 1, "a"))
    assert calls == [("B", "A"), ("B", "A")]
    assert d1.values == d2.values == (b"k", b"b+a", b"0") and d1.outcome == d2.outcome == Outcome.MERGED
    with pytest.raises(PolicyError):
        FunctionPolicy("f", "C", f).decide(TABLE, _v("A", 1, 1, "a"), _v("B", 1, 2, "b"))


def test_an_unknown_commit_time_is_compared_by_site_and_clock_alone() -> None:
    """A time of 0 is unknown (a change of a release before, a realignment): with it, the pair is
    compared by site then clock, whichever side holds the known time, so both sites pick alike."""
    p = LatestCommitWins()
    assert p.decide(TABLE, _v("A", 1, 10, "a"), _v("B", 1, 0, "b")).winner.site == "B"
    assert p.decide(TABLE, _v("B", 1, 0, "b"), _v("A", 1, 10, "a")).winner.site == "B"
    assert p.decide(TABLE, _v("A", 1, 0, "a"), _v("B", 1, 10, "b")).winner.site == "B"
    assert p.decide(TABLE, _v("B", 1, 10, "b"), _v("A", 1, 0, "a")).winner.site == "B"
    assert p.decide(TABLE, _v("A", 1, 11, "a"), _v("B", 1, 10, "b")).winner.site == "A"
