"""The certification index in C (coordinator/chorus/dataplane/native/cert.c, bound by
dataplane/native.py) against the reference, certifier.PyCertifier (docs/NATIVE.md sections 4.3
and 7, invariant 2: any difference is a split brain in certification).

A Hypothesis state machine drives both with the same random certifications (keys in every mode
from a small pool, so they conflict often; origins including ""; snapshots seen before, at and
after the GID), schema-change records, purges, GID gaps and snapshot restores into the other
implementation, and requires after every step the same verdict (reason, conflicting GID, origin
and key), the same count of dropped keys and the same snapshot bytes. Then cases taken from
test_certifier.py and test_impl_certifier.py, run on both, and the C index's byte budget."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from chorus.certifier import PyCertifier
from chorus.dataplane import native
from chorus.wire import Key, KeyMode, key_hash

SCALE = int(os.environ.get("CHORUS_FUZZ_SCALE", "1"))

pytestmark = pytest.mark.usefixtures("native_core")

# tables and rows of two tables, a schema, and a part that is not UTF-8 (a LATIN1 database)
PARTS = [(b"public", b"a"), (b"public", b"b"), (b"public", b"a", b"id", b"1"), (b"public", b"a", b"id", b"2"),
         (b"public", b"b", b"k", b"x"), (b"s", b"a"), (b"public", b"b", b"k", b"\xe9t\xe9"), (b"x",)]
ORIGINS = ["n1", "n2", "n3", ""]
keys = st.builds(lambda mode, parts, pre: Key(mode, parts, key_hash(parts) if pre else b""),
                 st.sampled_from(list(KeyMode)), st.sampled_from(PARTS), st.booleans())


class CertifierPair(RuleBasedStateMachine):
    """One history of calls, fed to both indexes."""

    def __init__(self) -> None:
        super().__init__()
        self.py: Any = PyCertifier()
        self.c: Any = native.NativeCertifier()
        self.gid = 0

    @rule(batch=st.lists(st.tuples(st.sampled_from(ORIGINS), st.integers(-2, 8), st.lists(keys, max_size=5)),
                         min_size=1, max_size=3))
    def certify(self, batch: list[tuple[str, int, list[Key]]]) -> None:
        """A few writesets delivered one after the other."""
        for origin, back, ks in batch:
            self.gid += 1
            last_seen = max(0, self.gid - 1 - back)
            assert self.c.certify(self.gid, origin, last_seen, ks) == self.py.certify(self.gid, origin, last_seen, ks)

    @rule(origin=st.sampled_from(ORIGINS), ks=st.lists(keys, max_size=3))
    def record(self, origin: str, ks: list[Key]) -> None:
        self.gid += 1
        assert self.c.record(self.gid, origin, ks) == self.py.record(self.gid, origin, ks)

    @rule(back=st.integers(-1, 15))
    def purge(self, back: int) -> None:
        assert self.c.purge(self.gid - back) == self.py.purge(self.gid - back)

    @rule(gap=st.integers(1, 3))
    def skip(self, gap: int) -> None:
        """GIDs the certifier never sees (control messages, deferred writesets)."""
        self.gid += gap

    @rule()
    def restore_across(self) -> None:
        """Each side restored from the other's snapshot, as a joining node of either kind."""
        self.py, self.c = PyCertifier.restore(self.c.snapshot()), native.NativeCertifier.restore(self.py.snapshot())

    @invariant()
    def same_index(self) -> None:
        assert (len(self.c), self.c.horizon) == (len(self.py), self.py.horizon)
        assert self.c.snapshot() == self.py.snapshot()


def test_same_verdicts_purges_and_snapshots() -> None:
    run_state_machine_as_test(CertifierPair, settings=settings(max_examples=120 * SCALE, stateful_step_count=40,
                                                               deadline=None))


IMPLS = [PyCertifier, "native"]


def _impl(which: Any) -> Any:
    return native.NativeCertifier if which == "native" else which


@pytest.mark.parametrize("which", IMPLS)
def test_conflict_reason_and_horizon(which: Any) -> None:
    c = _impl(which)(5)
    assert c.certify(6, "n1", 4, [Key(KeyMode.UPDATE, PARTS[2])]).reason == (
        "snapshot too old: the transaction saw GID 4, certification history starts at GID 5")
    assert c.certify(6, "n1", 5, [Key(KeyMode.UPDATE, PARTS[2])]).ok
    v = c.certify(7, "n2", 5, [Key(KeyMode.UPDATE, PARTS[2])])
    assert (v.ok, v.conflict_gid, v.conflict_origin, v.key) == (False, 6, "n1", Key(KeyMode.UPDATE, PARTS[2]))
    assert v.reason == ('certification conflict on "public"."a" (id)=(1): GID 6 from node n1 wrote it after '
                        "this transaction's snapshot (last seen GID 5)")
    c.record(8, "n2", [Key(KeyMode.EXCLUSIVE, PARTS[0])])
    v = c.certify(9, "n1", 7, [Key(KeyMode.REFERENCE, PARTS[0])])
    assert "the schema change GID 8 from node n2 altered it" in v.reason
    assert c.certify(10, "n2", 7, [Key(KeyMode.REFERENCE, PARTS[0])]).ok  # its own node's


@pytest.mark.parametrize("which", IMPLS)
def test_own_earlier_writesets_do_not_fail(which: Any) -> None:
    c = _impl(which)()
    k = Key(KeyMode.EXCLUSIVE, (b"p", b"t", b"id", b"1"))
    assert c.certify(1, "n1", 0, [k]).ok
    assert c.certify(2, "n1", 0, [k]).ok
    assert not c.certify(3, "n2", 1, [k]).ok


@pytest.mark.parametrize("which", IMPLS)
def test_purge_and_snapshot_too_old(which: Any) -> None:
    c = _impl(which)()
    for g in range(1, 101):
        assert c.certify(g, "n1", g - 1, [Key(KeyMode.EXCLUSIVE, (b"p", b"t", b"id", str(g).encode()))]).ok
    assert len(c) == 100
    assert c.purge(90) == 90 and len(c) == 10
    v = c.certify(101, "n2", 50, [Key(KeyMode.EXCLUSIVE, (b"x",))])
    assert not v.ok and "snapshot too old" in v.reason


@pytest.mark.parametrize("which", IMPLS)
def test_snapshot_restore_gives_same_verdicts(which: Any) -> None:
    impl = _impl(which)
    c = impl()
    k = Key(KeyMode.UPDATE, (b"p", b"t", b"id", b"1"))
    c.certify(1, "n1", 0, [k])
    c.certify(2, "n2", 1, [k])
    snap = c.snapshot()
    verdicts = []
    for origin in ("n1", "n2", "n3"):
        for ls in (0, 1, 2):
            a, b = PyCertifier.restore(snap), native.NativeCertifier.restore(snap)
            va, vb = a.certify(3, origin, ls, [k]), b.certify(3, origin, ls, [k])
            assert va == vb and a.snapshot() == b.snapshot()
            verdicts.append(va.ok)
    assert verdicts == [False, False, True, False, True, True, False, False, True]


@pytest.mark.parametrize("which", IMPLS)
def test_schema_change_fails_other_nodes_writers_that_did_not_see_it(which: Any) -> None:
    """Invariant 2, issue 35: only other nodes' schema changes count against a transaction."""
    def table(name: bytes, mode: KeyMode = KeyMode.EXCLUSIVE) -> Key:
        return Key(mode, (b"public", name))

    c = _impl(which)()
    assert c.certify(1, "a", 0, [table(b"t", KeyMode.REFERENCE)]).ok
    c.record(2, "a", [table(b"t"), table(b"schema changes")])
    v = c.certify(3, "b", 1, [table(b"t", KeyMode.REFERENCE)])
    assert not v.ok and "schema change GID 2 from node a altered it" in v.reason
    assert (v.conflict_gid, v.conflict_origin) == (2, "a")
    assert c.certify(4, "a", 1, [table(b"t", KeyMode.REFERENCE)]).ok
    assert c.certify(5, "a", 1, [table(b"schema changes")]).ok
    assert not c.certify(6, "b", 1, [table(b"schema changes")]).ok
    assert c.certify(7, "b", 2, [table(b"t", KeyMode.REFERENCE)]).ok
    assert c.certify(8, "b", 1, [table(b"u", KeyMode.REFERENCE)]).ok
    assert c.purge(2) == 0  # every key holds a newer GID in some mode


def test_any_value_the_bus_can_carry() -> None:
    """GIDs as large as a u64 holds, and a horizon computed below zero, are taken alike."""
    big = 2**64 - 1
    runs = []
    for impl in (PyCertifier, native.NativeCertifier):
        c = impl()
        runs.append([c.certify(5, "n1", big, [Key(KeyMode.UPDATE, PARTS[2])]),
                     c.certify(6, "n2", 0, [Key(KeyMode.UPDATE, PARTS[2])]),
                     c.purge(-3), c.purge(big - 1), c.certify(big, "n1", big - 1, []), c.snapshot(),
                     c.purge(big), c.snapshot()])
    assert runs[0] == runs[1]


def test_many_keys_grow_and_purge_alike() -> None:
    """Enough keys to grow and rehash the C index several times, then purge most, then again:
    slots freed by the purge are reused and the insertion order stays the reference's."""
    py, c = PyCertifier(), native.NativeCertifier()
    for g in range(1, 3001):
        ks = [Key(KeyMode.UPDATE, (b"p", b"t", b"id", str(g % 1700).encode())), Key(KeyMode.REFERENCE, PARTS[g % 3])]
        assert c.certify(g, ORIGINS[g % 3], g - 1, ks) == py.certify(g, ORIGINS[g % 3], g - 1, ks)
    assert c.purge(2500) == py.purge(2500)
    for g in range(3001, 3500):
        ks = [Key(KeyMode.EXCLUSIVE, (b"p", b"t", b"id", str(g % 900).encode()))]
        assert c.certify(g, "n2", g - 300, ks) == py.certify(g, "n2", g - 300, ks)
    assert c.snapshot() == py.snapshot()


def test_the_byte_budget_refuses_and_changes_nothing() -> None:
    """Past its budget the C index refuses with MemoryError and stays as it was."""
    c = native.NativeCertifier(max_bytes=64 << 10)
    g = 0
    with pytest.raises(MemoryError):
        while True:
            before = c.snapshot()
            g += 1
            c.certify(g, "n1", g - 1, [Key(KeyMode.UPDATE, (b"p", b"t", b"id", str(g).encode()))])
    assert c.snapshot() == before and 0 < c.nbytes <= 64 << 10
    assert c.purge(g) == g - 1 and len(c) == 0
    assert c.certify(g + 1, "n1", g, [Key(KeyMode.UPDATE, PARTS[2])]).ok  # room again


def test_a_snapshot_with_a_digest_not_16_bytes_is_refused() -> None:
    with pytest.raises(ValueError):
        native.NativeCertifier.restore(b'{"horizon":0,"index":{"abcd":{"2":[1,"n1",0,""]}},"by_gid":[],"schema":[]}')
