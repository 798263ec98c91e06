"""NDB$EPOCH_TRANS (docs/LINKS.md section 6): a transaction with a row in conflict is in
conflict whole, and so are the later transactions of the batch that depend on a rejected one,
transitively; dependency is the certifier's key relation where the earlier one wrote."""

from __future__ import annotations

from typing import Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from chorus import wire
from chorus.link.clock import LinkWindow
from chorus.link.conflict import Detection, Reason, dependency_closure, depends, settle
from chorus.link.events import RemoteTransaction, Stamp
from chorus.link.policy import PrimaryWins

from linkmodel import TABLE, khash, upsert, ws

X, R = wire.KeyMode.EXCLUSIVE, wire.KeyMode.REFERENCE


def _txn(clock: int, *keys: tuple[str, wire.KeyMode]) -> RemoteTransaction:
    w = wire.Writeset(0, 0, 0, (), (), tuple(wire.Key(m, (b"public", b"p", b"id", k.encode())) for k, m in keys))
    return RemoteTransaction("B", clock, clock, w)


def test_closure_follows_dependencies_transitively() -> None:
    batch = [_txn(1, ("x", X)), _txn(2, ("y", X)), _txn(3, ("x", X), ("z", X)), _txn(4, ("z", X)), _txn(5, ("y", R))]
    assert dependency_closure(batch, {0}) == {0: 0, 2: 0, 3: 2}
    assert dependency_closure(batch, {1}) == {1: 1, 4: 1}  # a reference to a row it wrote
    assert dependency_closure(batch, set()) == {}


def test_a_write_after_a_mere_reference_is_no_dependency() -> None:
    ref, write = {b"p": R}, {b"p": X}
    assert not depends(ref, write)
    assert depends(write, ref)
    assert not depends({b"p": wire.KeyMode.UPDATE}, {b"p": R})  # an update leaves the row's existence alone
    assert depends({b"p": wire.KeyMode.UPDATE}, {b"p": wire.KeyMode.UPDATE})


key_sets = st.lists(st.dictionaries(st.sampled_from("abcdef"), st.sampled_from([R, wire.KeyMode.UPDATE, X]),
                                    max_size=3), max_size=12)


@settings(max_examples=300, deadline=None)
@given(key_sets, st.sets(st.integers(0, 11)))
def test_closure_is_exactly_the_dependents(keysets: list[dict[str, wire.KeyMode]], seeds: set[int]) -> None:
    batch = [_txn(i + 1, *ks.items()) for i, ks in enumerate(keysets)]
    seeds = {s for s in seeds if s < len(batch)}
    out = dependency_closure(batch, seeds)
    keys = [{wire.Key(m, (b"public", b"p", b"id", k.encode())).hashed(): m for k, m in ks.items()} for ks in keysets]
    for i in range(len(batch)):
        hit = [j for j in range(i) if j in out and depends(keys[j], keys[i])]
        if i in seeds:
            assert out[i] == i
        elif hit:
            assert out[i] == hit[0]  # the first it depends on
        else:
            assert i not in out  # closed: nothing outside depends on anything inside


class Rows:
    def __init__(self, stamps: dict[bytes, Stamp]) -> None:
        self.stamps = stamps

    def stamp(self, key: bytes) -> Optional[Stamp]:
        return self.stamps.get(key)

    def values(self, table: wire.Table, key: wire.Key) -> Optional[tuple[wire.Value, ...]]:
        return (key.parts[3], b"local", b"0") if key.hashed() in self.stamps else None


def _remote(clock: int, *keys: str) -> RemoteTransaction:
    return RemoteTransaction("B", clock, clock, ws(*(upsert(k, "b") for k in keys)))


def test_epoch_trans_rejects_the_transaction_and_its_dependents_on_the_primary() -> None:
    window = LinkWindow("A", "B", max_replicated=10)
    rows = Rows({khash("x"): Stamp("A", 12, 1)})  # x: A's change still in its window
    batch = [_remote(1, "x", "w"), _remote(2, "w", "v"), _remote(3, "u"), _remote(4, "v")]
    out = settle(window, batch, rows, lambda t: PrimaryWins("A"), Detection.TRANSACTION, "A")
    assert [t.rejected for t in out] == [True, True, False, True]
    assert [t.depends_on for t in out] == [None, 0, None, 1]  # v: through the rejected T1
    assert [r.reason for r in out[0].rows] == [Reason.ROW, Reason.TRANSACTION]
    assert [r.reason for r in out[1].rows] == [Reason.DEPENDENT, Reason.DEPENDENT]
    assert not any(r.applied for t in out if t.rejected for r in t.rows)
    assert all(r.realign for t in out if t.rejected for r in t.rows)  # the primary realigns them all
    assert out[2].rows[0].applied and out[2].rows[0].stamp_after == Stamp("B", 3, 3)
    # per row (NDB$EPOCH) only x is kept; the rest is applied
    out = settle(window, batch, rows, lambda t: PrimaryWins("A"), Detection.ROW, "A")
    assert [[r.applied for r in t.rows] for t in out] == [[False, True], [True, True], [True], [True]]


def test_epoch_trans_on_the_secondary_takes_the_primary_s_transactions() -> None:
    window = LinkWindow("B", "A", max_replicated=10)
    rows = Rows({khash("x"): Stamp("B", 11, 1)})
    batch = [RemoteTransaction("A", 5, 5, ws(upsert("x", "a"), upsert("y", "a")))]
    out = settle(window, batch, rows, lambda t: PrimaryWins("A"), Detection.TRANSACTION, "A")
    assert not out[0].rejected and out[0].in_conflict and all(r.applied for r in out[0].rows)
    assert not any(r.realign for r in out[0].rows)  # only the arbiter realigns


def test_rows_applied_earlier_in_the_batch_count_with_their_new_stamps() -> None:
    window = LinkWindow("A", "B", max_replicated=10)
    rows = Rows({khash("x"): Stamp("A", 9, 1)})  # closed
    out = settle(window, [_remote(1, "x"), _remote(2, "x")], rows, lambda t: PrimaryWins("A"), Detection.ROW, "A")
    assert [t.in_conflict for t in out] == [False, False]
    assert out[1].rows[0].stamp == Stamp("B", 1, 1)
    assert TABLE.relname == "t"
