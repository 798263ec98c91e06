"""Certification (docs/ARCHITECTURE.md invariant 2) against a direct reference model of the rule."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.certifier import Certifier
from chorus.wire import Key, KeyMode, modes_conflict


@dataclass
class WS:
    origin: str
    last_seen: int
    keys: list[Key]


def reference(history: list[tuple[int, WS]], gid: int, w: WS) -> bool:
    """W fails iff a certified W' from another node with last_seen(W) < GID(W') < GID(W) holds a
    key of W in a conflicting mode."""
    for g2, w2 in history:
        if not (w.last_seen < g2 < gid) or w2.origin == w.origin:
            continue
        for k in w.keys:
            for k2 in w2.keys:
                if k.parts == k2.parts and modes_conflict(k.mode, k2.mode):
                    return False
    return True


keys = st.builds(lambda m, n: Key(KeyMode(m), (b"public", b"t", b"id", str(n).encode())),
                 st.integers(1, 3), st.integers(0, 4))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.integers(0, 30),
                          st.lists(keys, min_size=1, max_size=3)), max_size=40))
def test_matches_reference(stream: list[tuple[str, int, list[Key]]]) -> None:
    c = Certifier()
    history: list[tuple[int, WS]] = []
    for gid, (origin, back, ks) in enumerate(stream, start=1):
        w = WS(origin, max(0, gid - 1 - back), ks)
        expected = reference(history, gid, w)
        assert c.certify(gid, w.origin, w.last_seen, w.keys).ok == expected
        if expected:
            history.append((gid, w))


def test_mode_matrix() -> None:
    E, U, R = KeyMode.EXCLUSIVE, KeyMode.UPDATE, KeyMode.REFERENCE
    assert modes_conflict(E, R) and modes_conflict(R, E) and modes_conflict(E, E) and modes_conflict(E, U)
    assert modes_conflict(U, U)
    assert not modes_conflict(U, R) and not modes_conflict(R, U) and not modes_conflict(R, R)


def test_conflict_message_names_table_and_key() -> None:
    c = Certifier()
    k = Key(KeyMode.UPDATE, (b"public", b"acc", b"id", b"7"))
    assert c.certify(1, "n1", 0, [k]).ok
    v = c.certify(2, "n2", 0, [k])
    assert not v.ok
    assert '"public"."acc" (id)=(7)' in v.reason and "GID 1" in v.reason and "n1" in v.reason


def test_own_earlier_writesets_do_not_fail() -> None:
    c = Certifier()
    k = Key(KeyMode.EXCLUSIVE, (b"p", b"t", b"id", b"1"))
    assert c.certify(1, "n1", 0, [k]).ok
    assert c.certify(2, "n1", 0, [k]).ok
    assert not c.certify(3, "n2", 1, [k]).ok


def test_purge_and_snapshot_too_old() -> None:
    c = Certifier()
    for g in range(1, 101):
        assert c.certify(g, "n1", g - 1, [Key(KeyMode.EXCLUSIVE, (b"p", b"t", b"id", str(g).encode()))]).ok
    assert len(c) == 100
    c.purge(90)
    assert len(c) == 10
    v = c.certify(101, "n2", 50, [Key(KeyMode.EXCLUSIVE, (b"x",))])
    assert not v.ok and "snapshot too old" in v.reason


def test_snapshot_restore_gives_same_verdicts() -> None:
    c = Certifier()
    k = Key(KeyMode.UPDATE, (b"p", b"t", b"id", b"1"))
    c.certify(1, "n1", 0, [k])
    c.certify(2, "n2", 1, [k])
    snap = c.snapshot()
    verdicts = []
    for origin in ("n1", "n2", "n3"):
        for ls in (0, 1, 2):
            a, b = Certifier.restore(snap), Certifier.restore(snap)
            verdicts.append(a.certify(3, origin, ls, [k]).ok)
            assert b.certify(3, origin, ls, [k]).ok == verdicts[-1]
    assert verdicts == [False, False, True, False, True, True, False, False, True]


def _table(name: bytes, mode: KeyMode = KeyMode.EXCLUSIVE) -> Key:
    return Key(mode, (b"public", name))


def test_schema_change_fails_other_nodes_writers_that_did_not_see_it() -> None:
    """docs/ARCHITECTURE.md invariant 2: only writesets from other nodes count, schema changes included
    (issue 35: on its own node PostgreSQL's locks order a schema change with the node's other
    sessions, so certification must not fail them against each other)."""
    c = Certifier()
    assert c.certify(1, "a", 0, [_table(b"t", KeyMode.REFERENCE)]).ok
    c.record(2, "a", [_table(b"t"), _table(b"schema changes")])  # a schema change never fails itself
    v = c.certify(3, "b", 1, [_table(b"t", KeyMode.REFERENCE)])
    assert not v.ok and "schema change GID 2 from node a altered it" in v.reason
    assert (v.conflict_gid, v.conflict_origin) == (2, "a")
    assert c.certify(4, "a", 1, [_table(b"t", KeyMode.REFERENCE)]).ok  # its origin's own session
    assert c.certify(5, "a", 1, [_table(b"schema changes")]).ok  # nor a schema change of its origin
    assert not c.certify(6, "b", 1, [_table(b"schema changes")]).ok  # another node's does
    assert c.certify(7, "b", 2, [_table(b"t", KeyMode.REFERENCE)]).ok  # saw it
    assert c.certify(8, "b", 1, [_table(b"u", KeyMode.REFERENCE)]).ok  # other table


def test_schema_change_keys_travel_to_a_joining_node() -> None:
    """A schema change's keys are recorded only once it ran (replicator.py defers what comes
    after it until then); a joining node's copy of the index holds them too."""
    c = Certifier()
    assert c.certify(1, "a", 0, [_table(b"t", KeyMode.REFERENCE)]).ok
    c.record(2, "a", [_table(b"t"), _table(b"new")])
    d = Certifier.restore(c.snapshot())
    for idx in (c, d):
        assert not idx.certify(3, "b", 1, [_table(b"t", KeyMode.REFERENCE)]).ok
        assert not idx.certify(3, "b", 0, [_table(b"new", KeyMode.REFERENCE)]).ok
        assert idx.certify(3, "b", 2, [_table(b"new", KeyMode.REFERENCE)]).ok
