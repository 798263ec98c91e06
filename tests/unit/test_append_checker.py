"""The list-append checker (chorus/testkit/elle.py; issue 23, docs/CHECKER.md).

Hand-made histories hold one anomaly each, named as in Adya's thesis and the Elle paper
(Kingsbury & Alvaro, VLDB 2020); the checker must find it and name its transactions. Histories
produced by two tiny executors (serial, and snapshot isolation with first-committer-wins) are
always valid, and a corruption of one is always found.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.testkit.elle import Append, Edge, Key, Outcome, Read, Report, Txn, check


def T(id: int, *ops: tuple[str, str, Any], outcome: Outcome = "ok", final: bool = False) -> Txn:
    return Txn.of(id, ops, outcome, process=id, node="n1", final=final)


def A(k: str, v: int) -> tuple[str, str, Any]:
    return ("append", k, v)


def R(k: str, *vals: int) -> tuple[str, str, Any]:
    return ("r", k, list(vals))


def only(report: Report, kind: str) -> set[int]:
    """The transactions the checker names for ``kind``; it must be the only kind found."""
    assert report.kinds() == {kind}, report.as_dict()
    return {t for a in report.anomalies for t in a.txns}


# --- one anomaly each ---------------------------------------------------------------------


def test_g0_write_cycle() -> None:
    # x's order puts T1 before T2, y's puts T2 before T1: a ww-only cycle.
    h = [T(1, A("x", 1), A("y", 1)), T(2, A("x", 2), A("y", 2)),
         T(9, R("x", 1, 2), R("y", 2, 1), final=True)]
    r = check(h)
    assert only(r, "G0") == {1, 2} and not r.valid
    (g0,) = r.anomalies
    assert {(e.src, e.dst, e.kind) for e in g0.cycle} == {(1, 2, "ww"), (2, 1, "ww")}
    assert {e.key for e in g0.cycle} == {"x", "y"}


def test_g1a_aborted_read() -> None:
    h = [T(1, A("x", 1), outcome="fail"), T(2, R("x", 1))]
    assert only(check(h), "G1a") == {1, 2}


def test_g1b_intermediate_read() -> None:
    # T1 appended 1 then 2 to x; T2 saw x end at 1.
    h = [T(1, A("x", 1), A("x", 2)), T(2, R("x", 1)), T(9, R("x", 1, 2), final=True)]
    assert only(check(h), "G1b") == {1, 2}


def test_g1c_circular_information_flow() -> None:
    h = [T(1, A("x", 1), R("y", 2)), T(2, A("y", 2), R("x", 1))]
    r = check(h)
    assert only(r, "G1c") == {1, 2}
    assert {e.kind for e in r.anomalies[0].cycle} == {"wr"}


def test_g_single_read_skew() -> None:
    # T2 saw T1's append to y but not its append to x: one rw edge and one wr edge.
    h = [T(1, A("x", 1), A("y", 1)), T(2, R("x"), R("y", 1)),
         T(9, R("x", 1), R("y", 1), final=True)]
    r = check(h)
    assert only(r, "G-single") == {1, 2} and not r.valid
    assert sorted((e.src, e.dst, e.kind, e.key) for e in r.anomalies[0].cycle) == [
        (1, 2, "wr", "y"), (2, 1, "rw", "x")]


def test_lost_append() -> None:
    h = [T(1, A("x", 1)), T(2, A("x", 2)), T(9, R("x", 1), final=True)]
    assert only(check(h), "lost-append") == {2, 9}


def test_lost_append_against_final_reads_passed_apart() -> None:
    r = check([T(1, A("x", 1)), T(2, A("x", 2))], final=[T(9, R("x", 2))])
    assert "lost-append" in r.kinds() and {1, 9} in [set(a.txns) for a in r.anomalies]


def test_duplicate_append() -> None:
    h = [T(1, A("x", 1)), T(2, A("x", 1)), T(9, R("x", 1), final=True)]
    r = check(h)
    assert "duplicate-append" in r.kinds() and not r.valid
    assert [a.txns for a in r.anomalies if a.kind == "duplicate-append"] == [(1, 2)]


def test_duplicate_element() -> None:
    h = [T(1, A("x", 1)), T(2, R("x", 1, 1))]
    assert only(check(h), "duplicate-element") == {2}


def test_garbage_read() -> None:
    h = [T(1, A("x", 1)), T(2, R("x", 1, 7))]
    r = check(h)
    assert "garbage-read" in r.kinds() and not r.valid
    assert [a.txns for a in r.anomalies if a.kind == "garbage-read"] == [(2,)]


def test_incompatible_order() -> None:
    h = [T(1, A("x", 1)), T(2, A("x", 2)), T(3, R("x", 1, 2)), T(4, R("x", 2, 1))]
    assert only(check(h), "incompatible-order") == {3, 4}


def test_internal_inconsistency_own_append_not_seen() -> None:
    h = [T(1, A("x", 1), R("x"))]
    assert only(check(h), "internal") == {1}


def test_internal_inconsistency_earlier_read_not_repeated() -> None:
    h = [T(1, A("x", 1)), T(2, R("x"), R("x", 1)), T(9, R("x", 1), final=True)]
    r = check(h)
    assert "internal" in r.kinds()
    assert [a.txns for a in r.anomalies if a.kind == "internal"] == [(2,)]


# --- valid histories ----------------------------------------------------------------------


def test_write_skew_is_g2_allowed_under_snapshot_isolation() -> None:
    # Both read x and y empty; T1 appends to x, T2 to y: two rw edges.
    h = [T(1, R("x"), R("y"), A("x", 1)), T(2, R("x"), R("y"), A("y", 2)),
         T(9, R("x", 1), R("y", 2), final=True)]
    r = check(h)
    assert r.valid and r.kinds() == {"G2"}
    (g2,) = r.allowed
    assert not g2.forbidden and "allowed" in g2.description
    assert [e.kind for e in g2.cycle] == ["rw", "rw"] and set(g2.txns) == {1, 2}
    assert r.as_dict()["valid"] is True and r.as_dict()["anomalies"][0]["type"] == "G2"


def test_serial_history_is_valid_and_counted() -> None:
    h = [T(1, A("x", 1), R("x", 1)), T(2, R("x", 1), A("x", 2), R("y")),
         T(3, A("y", 3), outcome="fail"), T(4, A("y", 4), outcome="info"),
         T(9, R("x", 1, 2), R("y"), final=True)]
    r = check(h)
    assert r.valid and r.anomalies == ()
    c = r.counts
    assert (c.ok, c.fail, c.info, c.appends, c.reads, c.keys) == (3, 1, 1, 4, 5, 2)
    assert (c.ww, c.wr) == (1, 2)


def test_observed_info_txn_counts_as_committed() -> None:
    # T1's outcome is unknown, but T2 saw its append to x: T1 committed, and T2 missing its
    # append to y is read skew.
    h = [T(1, A("x", 1), A("y", 1), outcome="info"), T(2, R("x", 1), R("y")),
         T(9, R("x", 1), R("y", 1), final=True)]
    assert only(check(h), "G-single") == {1, 2}


def test_observed_info_txn_missing_from_final_read_is_lost() -> None:
    h = [T(1, A("x", 1), outcome="info"), T(2, R("x", 1)), T(9, R("x"), final=True)]
    assert only(check(h), "lost-append") == {1, 9}


def test_unobserved_info_and_failed_txns_may_have_aborted() -> None:
    h = [T(1, A("x", 1), outcome="info"), T(2, A("x", 2), outcome="fail"),
         T(3, A("x", 3)), T(4, R("x", 3)), T(9, R("x", 3), final=True)]
    r = check(h)
    assert r.valid and r.anomalies == ()


def test_reads_of_failed_txns_are_not_observations() -> None:
    h = [T(1, A("x", 1)), T(2, R("x", 5, 1), outcome="fail"), T(9, R("x", 1), final=True)]
    assert check(h).valid


# --- executors: real serial and snapshot-isolation runs are valid ---------------------------


@st.composite
def serial_history(draw: st.DrawFn) -> list[Txn]:
    """Transactions applied one after another to a dict of lists; ``fail`` ones are not
    applied, ``info`` ones may or may not be. Reads see the state at the start plus the
    transaction's own appends."""
    keys = [f"k{i}" for i in range(draw(st.integers(1, 3)))]
    state: dict[Key, list[int]] = {k: [] for k in keys}
    values = itertools.count(1)
    txns: list[Txn] = []
    for i in range(draw(st.integers(1, 25))):
        outcome: Outcome = draw(st.sampled_from(["ok", "ok", "ok", "fail", "info"]))
        local = {k: list(v) for k, v in state.items()}
        ops: list[Append | Read] = []
        for _ in range(draw(st.integers(1, 4))):
            k = draw(st.sampled_from(keys))
            if draw(st.booleans()):
                v = next(values)
                local[k].append(v)
                ops.append(Append(k, v))
            else:
                ops.append(Read(k, tuple(local[k]) if outcome == "ok" else None))
        if outcome == "ok" or (outcome == "info" and draw(st.booleans())):
            state = local
        txns.append(Txn(i, i % 4, f"n{i % 3}", tuple(ops), outcome))
    return txns + [_final(len(txns), state)]


def _final(id: int, state: dict[Key, list[int]]) -> Txn:
    return Txn(id, 99, "n1", tuple(Read(k, tuple(v)) for k, v in state.items()), "ok",
               final=True)


@st.composite
def si_history(draw: st.DrawFn) -> list[Txn]:
    """Concurrent transactions under snapshot isolation: each reads the committed state at
    its start plus its own appends; at commit it aborts (first committer wins) if another
    transaction committed an append to a key it appended since its snapshot. Such runs hold
    write skew (G2) but never G0, G1 or G-single."""
    keys = [f"k{i}" for i in range(draw(st.integers(1, 3)))]
    n = draw(st.integers(1, 25))
    values = itertools.count(1)
    plans = [[(draw(st.sampled_from(keys)), draw(st.booleans()))
              for _ in range(draw(st.integers(1, 4)))] for _ in range(n)]
    ends = [i + draw(st.integers(0, 4)) for i in range(n)]
    unknown = [draw(st.integers(0, 5)) == 0 for _ in range(n)]
    state: dict[Key, list[int]] = {k: [] for k in keys}
    running: dict[int, tuple[dict[Key, int], list[Append | Read]]] = {}
    txns: dict[int, Txn] = {}
    for now in range(n + 5):
        for i in sorted(i for i in running if ends[i] < now):
            base, ops = running.pop(i)
            wrote = {op.key for op in ops if isinstance(op, Append)}
            outcome: Outcome = "ok"
            if any(len(state[k]) != base[k] for k in wrote):
                outcome = "fail"  # another append to k committed since the snapshot
            else:
                for op in ops:
                    if isinstance(op, Append):
                        state[op.key].append(op.value)
            if unknown[i]:
                outcome = "info"
            if outcome != "ok":
                ops = [Read(o.key, None) if isinstance(o, Read) else o for o in ops]
            txns[i] = Txn(i, i, f"n{i % 3}", tuple(ops), outcome)
        if now < n:
            snap = {k: list(v) for k, v in state.items()}
            ops = []
            for k, is_append in plans[now]:
                if is_append:
                    v = next(values)
                    snap[k].append(v)
                    ops.append(Append(k, v))
                else:
                    ops.append(Read(k, tuple(snap[k])))
            running[now] = ({k: len(v) for k, v in state.items()}, ops)
    return [txns[i] for i in range(n)] + [_final(n, state)]


@settings(max_examples=300, deadline=None)
@given(serial_history())
def test_serial_executions_are_valid(h: list[Txn]) -> None:
    r = check(h)
    assert r.valid and r.anomalies == (), r.as_dict()


@settings(max_examples=300, deadline=None)
@given(si_history())
def test_snapshot_isolation_executions_are_valid(h: list[Txn]) -> None:
    r = check(h)
    assert r.valid and r.kinds() <= {"G2"}, r.as_dict()


# --- corruptions are always found ---------------------------------------------------------


def _drop_from_final(h: list[Txn], data: st.DataObject) -> tuple[list[Txn], str]:
    *rest, fin = h
    acked = [op for t in rest if t.outcome == "ok" for op in t.ops if isinstance(op, Append)]
    if not acked:
        return h, ""
    gone = data.draw(st.sampled_from(acked))
    ops = tuple(Read(o.key, tuple(v for v in o.seen if v != gone.value))
                if o.key == gone.key else o for o in fin.ops if isinstance(o, Read))
    return rest + [replace(fin, ops=ops)], "lost-append"


def _duplicate_append(h: list[Txn], data: st.DataObject) -> tuple[list[Txn], str]:
    spots = [(i, j) for i, t in enumerate(h) for j, o in enumerate(t.ops)
             if isinstance(o, Append)]
    if len(spots) < 2:
        return h, ""
    (i1, j1), (i2, j2) = data.draw(st.permutations(spots))[:2]
    first = h[i1].ops[j1]
    t = h[i2]
    h = list(h)
    h[i2] = replace(t, ops=t.ops[:j2] + (first,) + t.ops[j2 + 1:])
    return h, "duplicate-append"


def _swap_in_read(h: list[Txn], data: st.DataObject) -> tuple[list[Txn], str]:
    spots = [(i, j) for i, t in enumerate(h[:-1]) if t.outcome == "ok"
             for j, o in enumerate(t.ops) if isinstance(o, Read) and len(o.seen) >= 2]
    if not spots:
        return h, ""
    i, j = data.draw(st.sampled_from(spots))
    read = h[i].ops[j]
    assert isinstance(read, Read)
    a, b = sorted(data.draw(st.permutations(range(len(read.seen))))[:2])
    seen = list(read.seen)
    seen[a], seen[b] = seen[b], seen[a]
    h = list(h)
    h[i] = replace(h[i], ops=h[i].ops[:j] + (Read(read.key, tuple(seen)),) + h[i].ops[j + 1:])
    return h, "incompatible-order"


CORRUPTIONS: list[Callable[[list[Txn], st.DataObject], tuple[list[Txn], str]]] = [
    _drop_from_final, _duplicate_append, _swap_in_read]


@settings(max_examples=400, deadline=None)
@given(st.one_of(serial_history(), si_history()), st.sampled_from(CORRUPTIONS), st.data())
def test_a_corrupted_history_is_always_caught(
        h: list[Txn], corrupt: Callable[[list[Txn], st.DataObject], tuple[list[Txn], str]],
        data: st.DataObject) -> None:
    bad, expected = corrupt(h, data)
    if not expected:
        return  # nothing this corruption could change in this history
    r = check(bad)
    assert not r.valid and expected in r.kinds(), r.as_dict()


# --- size ------------------------------------------------------------------------------------


def test_cycle_search_handles_a_long_chain_without_recursion() -> None:
    # 5,000 transactions in one G0 cycle through two keys: an SCC deeper than Python's
    # recursion limit.
    n = 5000
    h = [T(i, A("x", i), A("y", i)) for i in range(n)]
    h.append(T(n, R("x", *range(n)), R("y", *range(1, n), 0), final=True))
    r = check(h)
    assert r.kinds() == {"G0"} and not r.valid


def test_a_long_read_skew_cycle_is_found() -> None:
    # T0 appends to x and y; T1..T299 each read y and append to it, so T0 reaches T299 over
    # wr/ww edges; T299 misses T0's append to x: one rw edge closes a 300-transaction cycle.
    n = 300
    h = [T(0, A("x", 0), A("y", 0))]
    h += [T(i, R("y", *range(i)), A("y", i)) for i in range(1, n - 1)]
    h.append(T(n - 1, R("y", *range(n - 1)), A("y", n - 1), R("x")))
    h.append(T(n, R("x", 0), R("y", *range(n)), final=True))
    r = check(h)
    assert r.kinds() == {"G-single"}
    (g,) = r.anomalies
    assert sum(e.kind == "rw" for e in g.cycle) == 1
    assert g.cycle[0] == Edge(n - 1, 0, "rw", "x") and len(g.cycle) == n
