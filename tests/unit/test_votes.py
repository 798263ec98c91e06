"""Which sets of bus nodes count as a quorum (chorus.bus.Votes)."""

from __future__ import annotations

from itertools import combinations

import pytest

from chorus.bus import Votes


def subsets(nodes: list[str]) -> list[frozenset[str]]:
    return [frozenset(c) for k in range(len(nodes) + 1) for c in combinations(nodes, k)]


@pytest.mark.parametrize("expected", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("tie_breaker", ["", "1", "2"])
def test_any_two_quorums_share_a_node(expected: int, tie_breaker: str) -> None:
    nodes = [str(i) for i in range(1, expected + 1)]
    votes = Votes(expected // 2 + 1, expected, tie_breaker)
    quorums = [s for s in subsets(nodes) if votes.holds(s)]
    assert frozenset(nodes) in quorums
    for a, b in combinations(quorums, 2):
        assert a & b, (a, b)


def test_even_split() -> None:
    votes = Votes(3, 4, "1")
    assert votes.holds({"1", "2"}) and votes.holds({"1", "4"})
    assert not votes.holds({"2", "3"}) and not votes.holds({"1"})
    assert votes.holds({"2", "3", "4"})
    assert not Votes(3, 4, "").holds({"1", "2"})  # without a tie breaker an even split has no quorum


def test_local_cluster_single_vote() -> None:
    assert Votes().holds({"1"})
