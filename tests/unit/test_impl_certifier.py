"""The compiled certification index (chorus/_ccert.pyx) against the pure-Python reference
(certifier.PyCertifier): for the same sequence of certifications, schema-change records, purges
and snapshot restores, both give the same verdicts (reasons and conflicting GIDs included), drop
the same keys and write the same snapshot bytes, and a snapshot of either restores into the
other. Nodes certify alike only if this holds, whichever implementation each runs (CHORUS_IMPL)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus import certifier
from chorus.wire import Key, KeyMode

SCALE = int(os.environ.get("CHORUS_FUZZ_SCALE", "1"))

_ccert = pytest.importorskip("chorus._ccert", reason="the compiled certifier is not built (scripts/setup.sh builds it)")

# a small pool of keys, so that sequences conflict often: tables and rows of two tables
PARTS = [(b"public", b"a"), (b"public", b"b"), (b"public", b"a", b"id", b"1"), (b"public", b"a", b"id", b"2"),
         (b"public", b"b", b"k", b"x"), (b"s", b"a")]
keys = st.builds(Key, st.sampled_from(list(KeyMode)), st.sampled_from(PARTS))
ops = st.lists(st.one_of(
    st.tuples(st.just("certify"), st.sampled_from(["n1", "n2", "n3"]), st.integers(0, 6),
              st.lists(keys, max_size=4)),
    st.tuples(st.just("record"), st.sampled_from(["n1", "n2", "n3"]), st.lists(keys, max_size=3)),
    st.tuples(st.just("purge"), st.integers(0, 4)),
    st.tuples(st.just("restore"), st.booleans()),
), max_size=60)


def _run(index: Any, other: type[Any], steps: list[tuple[Any, ...]]) -> list[Any]:
    """Apply ``steps`` to ``index`` (GIDs consecutive); what each step returned, and the snapshot
    after it. "restore" swaps the index for one of the ``other`` implementation restored from
    its snapshot (or of its own, with False), as a joining node would."""
    out: list[Any] = []
    gid = 0
    for step in steps:
        kind = step[0]
        if kind == "certify":
            gid += 1
            _, origin, back, ks = step
            out.append(index.certify(gid, origin, max(0, gid - 1 - back), ks))
        elif kind == "record":
            gid += 1
            out.append(index.record(gid, step[1], step[2]))
        elif kind == "purge":
            out.append(index.purge(max(0, gid - step[1])))
        else:
            snap = index.snapshot()
            index = (other if step[1] else type(index)).restore(snap)
            out.append(index.snapshot() == snap)
        out.append((len(index), index.horizon, index.snapshot()))
    return out


@settings(max_examples=300 * SCALE, deadline=None)
@given(ops)
def test_both_certify_alike(steps: list[tuple[Any, ...]]) -> None:
    assert _run(certifier.PyCertifier(), _ccert.Certifier, steps) == _run(_ccert.Certifier(), certifier.PyCertifier,
                                                                         steps)


def test_conflict_reason_and_horizon() -> None:
    for impl in (certifier.PyCertifier, _ccert.Certifier):
        c = impl(5)
        assert c.certify(6, "n1", 4, [Key(KeyMode.UPDATE, PARTS[2])]).reason.startswith("snapshot too old")
        assert c.certify(6, "n1", 5, [Key(KeyMode.UPDATE, PARTS[2])]).ok
        v = c.certify(7, "n2", 5, [Key(KeyMode.UPDATE, PARTS[2])])
        assert (v.ok, v.conflict_gid, v.conflict_origin) == (False, 6, "n1")
        assert 'certification conflict on "public"."a" (id)=(1): GID 6 from node n1 wrote it' in v.reason
        c.record(8, "n2", [Key(KeyMode.EXCLUSIVE, PARTS[0])])
        v = c.certify(9, "n1", 7, [Key(KeyMode.REFERENCE, PARTS[0])])
        assert "the schema change GID 8 from node n2 altered it" in v.reason
        assert c.certify(10, "n2", 7, [Key(KeyMode.REFERENCE, PARTS[0])]).ok  # its own node's


def test_the_chosen_one_is_named() -> None:
    want = os.environ.get("CHORUS_IMPL", "c") or "c"
    assert certifier.IMPL == want
    assert certifier.Certifier is (certifier.PyCertifier if want == "python" else _ccert.Certifier)


def test_any_value_the_bus_can_carry() -> None:
    """GIDs and snapshots as large as a u64 holds (a damaged or forged message), and a horizon
    computed below zero, are taken alike."""
    big = 2**64 - 1
    runs = []
    for impl in (certifier.PyCertifier, _ccert.Certifier):
        c = impl()
        runs.append([c.certify(5, "n1", big, [Key(KeyMode.UPDATE, PARTS[2])]),
                     c.certify(6, "n2", 0, [Key(KeyMode.UPDATE, PARTS[2])]),
                     c.purge(-3), c.purge(big - 1), c.certify(big, "n1", big - 1, []), c.snapshot()])
    assert runs[0] == runs[1]
