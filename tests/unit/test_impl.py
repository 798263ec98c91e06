"""The compiled reader (chorus/_cwire.pyx) against the pure-Python reference (wire.read_python):
on every writeset, and on damaged ones, both give the same reading (tables, rows, keys and their
digests, what a scan reports) or both refuse. Certification is deterministic across nodes only if
they read alike, whichever implementation each node runs (CHORUS_IMPL)."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus import wire
from chorus.wire import Binary, Column, Key, KeyMode, Row, Table, Writeset

# CHORUS_FUZZ_SCALE=100 runs a hundred times as many examples (a longer run from the command line)
SCALE = int(os.environ.get("CHORUS_FUZZ_SCALE", "1"))

_cwire = pytest.importorskip("chorus._cwire", reason="the compiled reader is not built (scripts/setup.sh builds it)")

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _outcome(read: Callable[[bytes, bool], Writeset], raw: bytes, full: bool) -> Any:
    try:
        ws = read(raw, full)
    except (wire.WireError, struct.error, IndexError):
        return "refused"
    return (ws, ws.scanned, ws.changed_tables, [k.hashed() for k in ws.keys], ws.raw,
            [type(v) for r in ws.rows if isinstance(r, Row) for v in (*r.old, *r.new)])


def _same(raw: bytes) -> None:
    for full in (True, False):
        assert _outcome(_cwire.read, raw, full) == _outcome(wire.read_python, raw, full)


values = st.one_of(st.none(), st.binary(max_size=12), st.binary(max_size=8).map(Binary), st.just(wire.UNCHANGED))
names = st.text(min_size=0, max_size=6)


@st.composite
def writesets(draw: st.DrawFn) -> Writeset:
    tables = []
    for _ in range(draw(st.integers(0, 3))):
        ncols = draw(st.integers(1, 4))
        cols = tuple(Column(draw(names), draw(names), draw(st.sampled_from([0, 1, 2]))) for _ in range(ncols))
        full = draw(st.booleans())
        ident = tuple(range(ncols)) if full else tuple(sorted(set(draw(st.lists(st.integers(0, ncols - 1),
                                                                                 min_size=1, max_size=2)))))
        tables.append(Table(draw(names), draw(names), cols, ident, full))
    rows: list[wire.Item] = []
    schema = draw(st.booleans()) and not tables
    if schema:
        rows.append(wire.Schema(((draw(names), draw(names)),), draw(names), draw(st.binary(max_size=30))))
    for _ in range(draw(st.integers(0, 6)) if tables else 0):
        ti = draw(st.integers(0, len(tables) - 1))
        t = tables[ti]
        op = draw(st.sampled_from("IUDT"))
        if op == "T":
            rows.append(Row("T", ti, (), (), draw(st.sampled_from([0, 1]))))
            continue
        old = tuple(draw(values) for _ in t.identity) if op in "UD" else ()
        new = tuple(draw(values) for _ in t.columns) if op in "IU" else ()
        rows.append(Row(op, ti, old, new))
    keys = tuple(Key(draw(st.sampled_from(list(KeyMode))), tuple(draw(st.lists(st.binary(max_size=6), min_size=1,
                                                                                   max_size=4))))
                 for _ in range(draw(st.integers(0, 4))))
    flags = wire.FLAG_DDL if schema else 0
    return Writeset(draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1)),
                    draw(st.integers(0, 2**64 - 1)), tuple(tables), tuple(rows), keys, flags,
                    draw(st.sampled_from([6, 8])))


@settings(max_examples=400 * SCALE)
@given(writesets())
def test_both_read_every_writeset_alike(ws: Writeset) -> None:
    raw = wire.encode(ws)
    _same(raw)
    assert _cwire.read(raw, True) == ws


@settings(max_examples=400 * SCALE)
@given(writesets(), st.data())
def test_both_refuse_the_same_damaged_writesets(ws: Writeset, data: st.DataObject) -> None:
    raw = bytearray(wire.encode(ws))
    how = data.draw(st.sampled_from(["cut", "flip", "grow"]))
    if how == "cut":
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    else:
        raw += data.draw(st.binary(min_size=1, max_size=4))
    _same(bytes(raw))


@settings(max_examples=300 * SCALE)
@given(st.binary(max_size=200))
def test_both_refuse_garbage_alike(raw: bytes) -> None:
    _same(b"CW\x02" + raw)
    _same(raw)


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.ws")), ids=lambda p: p.stem)
def test_both_read_the_golden_writesets_alike(path: Path) -> None:
    _same(path.read_bytes())


def test_the_implementation_in_use_is_said() -> None:
    assert wire.IMPL in ("c", "python")
