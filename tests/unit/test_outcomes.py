"""Commit outcomes after a lost connection (chorus/outcomes.py): what a node remembers, and the
answer in each case (every node of a real cluster: tests/integration/test_commit_outcome.py)."""

from __future__ import annotations

from typing import Any

from chorus.outcomes import Outcome, OutcomeIndex, lookup


def ask(index: OutcomeIndex, origin: str, xid: int, began: int, **kw: Any) -> tuple[object, object]:
    args: dict[str, Any] = {"this_node": "n2", "phase": "online", "online": {"n1", "n2", "n3"},
                            "committed_here": 100}
    args.update(kw)
    a = lookup(index, origin, xid, began, **args)
    assert a["detail"]
    return a["outcome"], a["gid"]


def test_certified_and_failed_writesets_are_answered_from_the_index() -> None:
    ix = OutcomeIndex()
    for g in range(1, 11):
        ix.seen(g)
    ix.record("n1", 700, Outcome(5, True))
    ix.record("n3", 700, Outcome(6, False, "certification conflict on ..."))
    ix.record("n1", (1 << 32) + 701, Outcome(7, True))  # writesets carry the low 32 bits of the xid
    assert ask(ix, "n1", 700, 2) == ("committed", 5)
    assert ask(ix, "n3", 700, 2) == ("aborted", 6)
    assert ask(ix, "n1", 701, 2) == ("committed", 7)
    assert ask(ix, "n1", 700, 6)[0] != "committed"  # an older transaction with the same low xid
    # the answer does not depend on this node's phase once it is known
    assert ask(ix, "n1", 700, 2, phase="non-primary") == ("committed", 5)


def test_not_ordered_yet_or_never() -> None:
    ix = OutcomeIndex()
    for g in range(1, 11):
        ix.seen(g)
    # another node's transaction: in doubt while that node may still send it; aborted once it left
    assert ask(ix, "n1", 800, 3) == ("in doubt", None)
    assert ask(ix, "n1", 800, 3, online={"n2", "n3"}) == ("aborted", None)
    # this node's own: what its database says, unless its writeset is on its way
    assert ask(ix, "n2", 800, 3, origin_db_status="in progress") == ("in doubt", None)
    assert ask(ix, "n2", 800, 3, origin_db_status="aborted") == ("aborted", None)
    assert ask(ix, "n2", 800, 3, origin_db_status="aborted", in_flight=True) == ("in doubt", None)
    assert ask(ix, "n2", 800, 3, origin_db_status="committed") == ("committed", None)
    assert ask(ix, "n2", 800, 3, origin_db_status="unknown") == ("unknown", None)
    # outside the primary component nothing not seen is certain
    assert ask(ix, "n1", 800, 3, phase="non-primary", online={"n2"}) == ("in doubt", None)


def test_what_a_node_does_not_remember_is_unknown_not_aborted() -> None:
    ix = OutcomeIndex(size=5)
    for g in range(41, 61):  # joined at GID 40
        ix.seen(g)
        ix.record("n1", g, Outcome(g, True))
    assert ix.complete_after == 55 and len(ix) == 5  # the oldest forgotten
    assert ask(ix, "n1", 58, 50) == ("committed", 58)
    assert ask(ix, "n1", 45, 44) == ("unknown", None)
    assert ask(ix, "n3", 999, 50, online={"n2"}) == ("unknown", None)
    assert ask(ix, "n3", 999, 56, online={"n2"}) == ("aborted", None)
    ix.seen(70)  # GIDs 61-69 certified without this node (it was away): it starts again
    assert ix.complete_after == 69
    assert ask(ix, "n3", 999, 60, online={"n2"}) == ("unknown", None)
