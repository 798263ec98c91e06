"""The extension's writeset reader (extension/chorus_wsread.c, through extension/tools/wsdump.c)
reads what the coordinator's reader (chorus/wire.py, decode) reads, and refuses what it refuses.

The dumper is compiled with the system C compiler into a temporary directory; it prints each
writeset as JSON (names, values and key parts in hex), which is compared with the same description
made from ``wire.decode``. Writesets come from ``wire.encode`` across many shapes (every row op,
NULL, text and binary values, keys of every mode, schema change items, every header flag), then
truncated, with bytes changed or appended: for each, both readers accept it with the same
description or both refuse it. Golden writesets written by the C writer (tests/golden/*.ws, when
present) are read by both as well."""

from __future__ import annotations

import json
import random
import struct
import subprocess
from pathlib import Path
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chorus import wire

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"


def _hex(s: str) -> str:
    return wire.name_bytes(s).hex()


def _value(v: wire.Value) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, wire.Unchanged):
        return "u"
    return ("b:" if isinstance(v, wire.Binary) else "t:") + bytes(v).hex()


def describe(ws: wire.Writeset) -> dict[str, Any]:
    """The description wsdump prints, made from the coordinator's reading."""
    items: list[dict[str, Any]] = []
    for r in ws.rows:
        if isinstance(r, wire.Schema):
            items.append({"op": "S", "settings": [[_hex(k), _hex(v)] for k, v in r.settings],
                          "role": _hex(r.role), "statement": r.statement.hex()})
            continue
        item: dict[str, Any] = {"op": r.op, "table": r.table}
        if r.op == wire.OP_TRUNCATE:
            item["flags"] = r.flags
        if r.op in (wire.OP_UPDATE, wire.OP_DELETE):
            item["old"] = [_value(v) for v in r.old]
        if r.op in (wire.OP_INSERT, wire.OP_UPDATE):
            item["new"] = [_value(v) for v in r.new]
        items.append(item)
    return {
        "version": wire.VERSION, "flags": ws.flags, "xid": ws.xid, "pid": ws.pid,
        "last_seen": ws.last_seen, "encoding": ws.encoding,
        "tables": [{"nspname": _hex(t.nspname), "relname": _hex(t.relname),
                    "columns": [{"name": _hex(c.name), "type": _hex(c.typname), "flags": c.flags}
                                for c in t.columns],
                    "identity": list(t.identity),
                    "flags": (wire.TABLE_FULL_IDENTITY if t.full_identity else 0)
                    | (wire.TABLE_OLD_COLUMNS if t.old_columns else 0)} for t in ws.tables],
        "items": items,
        "keys": [{"mode": int(k.mode), "parts": [p.hex() for p in k.parts]} for k in ws.keys],
    }


def python_reading(buf: bytes) -> Optional[dict[str, Any]]:
    try:
        return describe(wire.decode(buf))
    except wire.WireError:
        return None


def c_readings(wsdump: Path, bufs: list[bytes], tmp: Path) -> list[Optional[dict[str, Any]]]:
    """wsdump's reading of each buffer: its description, or None where it refused it."""
    paths = []
    for i, b in enumerate(bufs):
        p = tmp / f"{i}.ws"
        p.write_bytes(b)
        paths.append(str(p))
    proc = subprocess.run([str(wsdump), *paths], capture_output=True)
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == len(bufs)
    out: list[Optional[dict[str, Any]]] = []
    for line in lines:
        d = json.loads(line)
        out.append(None if "error" in d else d)
    return out


def assert_same(wsdump: Path, bufs: list[bytes], tmp: Path) -> None:
    for buf, c in zip(bufs, c_readings(wsdump, bufs, tmp)):
        assert c == python_reading(buf), buf.hex()


# ---- writesets of every shape, from the Python encoder ----

_names = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
_values = st.one_of(st.none(), st.binary(max_size=12), st.binary(max_size=12).map(wire.Binary),
                    st.just(wire.UNCHANGED))


@st.composite
def tables(draw: st.DrawFn) -> wire.Table:
    cols = tuple(wire.Column(draw(_names), draw(_names), draw(st.sampled_from([0, 1, 2, 3])))
                 for _ in range(draw(st.integers(0, 4))))
    identity = tuple(draw(st.lists(st.integers(0, len(cols) - 1), max_size=len(cols)))) if cols else ()
    return wire.Table(draw(_names), draw(_names), cols, identity, draw(st.booleans()))


@st.composite
def writesets(draw: st.DrawFn) -> wire.Writeset:
    ts = tuple(draw(st.lists(tables(), max_size=3)))
    items: list[wire.Item] = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["I", "U", "D", "T", "S"] if ts else ["S"]))
        if kind == "S":
            items.append(wire.Schema(tuple(draw(st.lists(st.tuples(_names, _names), max_size=3))),
                                     draw(_names), draw(st.binary(max_size=20))))
            continue
        ti = draw(st.integers(0, len(ts) - 1))
        t = ts[ti]
        old = tuple(draw(_values) for _ in t.identity) if kind in ("U", "D") else ()
        new = tuple(draw(_values) for _ in t.columns) if kind in ("I", "U") else ()
        flags = draw(st.sampled_from([0, wire.TRUNCATE_RESTART])) if kind == "T" else 0
        items.append(wire.Row(kind, ti, old, new, flags))
    keys = tuple(wire.Key(draw(st.sampled_from(list(wire.KeyMode))),
                          tuple(draw(st.lists(st.binary(max_size=8), min_size=1, max_size=5))))
                 for _ in range(draw(st.integers(0, 4))))
    # TOI and CONCURRENT are valid on one schema change item only: other shapes test refusal
    flags = draw(st.sampled_from([0, 0, wire.FLAG_TOI, wire.FLAG_CONCURRENT | wire.FLAG_DDL]))
    return wire.Writeset(draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1)),
                         draw(st.integers(0, 2**64 - 1)), ts, tuple(items), keys, flags,
                         draw(st.sampled_from([wire.UTF8, 0, 8, 34])))


def mutations(buf: bytes, rng: random.Random) -> list[bytes]:
    """Cut, changed and lengthened copies of buf."""
    out = [buf[:rng.randrange(len(buf) + 1)] for _ in range(3)]
    for _ in range(4):
        b = bytearray(buf)
        i = rng.randrange(len(b))
        b[i] = rng.choice([0, 1, 2, 3, 4, 0x7F, 0x80, 0xFF, b[i] ^ (1 << rng.randrange(8))])
        out.append(bytes(b))
    out.append(buf + bytes([rng.randrange(256)]))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ws=writesets(), seed=st.integers(0, 2**32 - 1))
def test_c_reader_agrees_with_python(wsdump: Path, tmp_path: Path, ws: wire.Writeset, seed: int) -> None:
    buf = wire.encode(ws)
    assert_same(wsdump, [buf, *mutations(buf, random.Random(seed))], tmp_path)


def test_every_shape_is_accepted(wsdump: Path, tmp_path: Path) -> None:
    """A writeset with each row op, value kind, key mode and schema change item, and the valid
    ordering request and concurrent index change, read alike (not refused) by both."""
    t = wire.Table("public", "t", (wire.Column("id", "integer", wire.COL_IDENTITY),
                                   wire.Column("v", "text"), wire.Column("g", "int", wire.COL_GENERATED)),
                   (0,))
    full = wire.Table("s", "nopk", (wire.Column("a", "int"),), (0,), True)
    rows = (wire.Row("I", 0, (), (wire.Binary(b"\0\0\0\1"), b"x", None)),
            wire.Row("U", 0, (b"1",), (None, wire.Binary(b""), b"")),
            wire.Row("D", 1, (b"\\N",)), wire.Row("T", 1, flags=wire.TRUNCATE_RESTART),
            wire.Row("T", 0))
    keys = tuple(wire.Key(m, (b"public", b"t", b"id", b"1")) for m in wire.KeyMode)
    schema = wire.Schema((("search_path", "public"), ("TimeZone", "UTC")), "alice",
                         b"ALTER TABLE t ADD c int")
    shapes = [
        wire.Writeset(1, 2, 3, (t, full), rows, keys),
        wire.Writeset(1, 2, 3, (t,), rows[:1] + (schema,) + rows[1:2], keys, wire.FLAG_DDL),
        wire.Writeset(0, 2, 3, (), (schema,), keys[2:], wire.FLAG_TOI | wire.FLAG_DDL),
        wire.Writeset(7, 2, 3, (), (schema,), keys[2:], wire.FLAG_CONCURRENT | wire.FLAG_DDL),
        wire.Writeset(0, 0, 0, (), (), ()),
    ]
    bufs = [wire.encode(ws) for ws in shapes]
    for buf, c in zip(bufs, c_readings(wsdump, bufs, tmp_path)):
        assert c is not None and c == python_reading(buf)


def _patched(buf: bytes, at: int, fmt: str, value: int) -> bytes:
    b = bytearray(buf)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def test_each_refusal(wsdump: Path, tmp_path: Path) -> None:
    """Each thing the coordinator's reader refuses, the C reader refuses too: version, header,
    column, table and TRUNCATE flags, op, table index, width, value kind, key mode and parts,
    the shape of TOI and CONCURRENT writesets, the DDL flag, trailing bytes, a cut anywhere."""
    t = wire.Table("n", "t", (wire.Column("a", "int"),), (0,))
    ws = wire.Writeset(1, 2, 3, (t,), (wire.Row("T", 0), wire.Row("I", 0, (), (b"1",))),
                       (wire.Key(wire.KeyMode.UPDATE, (b"n", b"t")),))
    buf = wire.encode(ws)
    head = wire.HEAD_SIZE
    col_flags = head + 2 + 1 + 2 + 1 + 2 + 2 + 1 + 2 + 3
    table_flags = col_flags + 1 + 2 + 2
    first_item = table_flags + 1
    insert = first_item + 4
    key = len(buf) - (3 + 4 + 1 + 4 + 1)
    assert buf[first_item:first_item + 1] == b"T" and buf[insert:insert + 1] == b"I"
    bad = [
        _patched(buf, 2, ">B", 1), _patched(buf, 2, ">B", 3),
        _patched(buf, 3, ">B", 0x08), _patched(buf, 3, ">B", wire.FLAG_DDL),
        _patched(buf, 3, ">B", wire.FLAG_TOI), _patched(buf, 3, ">B", wire.FLAG_CONCURRENT),
        _patched(buf, head - 10, ">H", 2), _patched(buf, head - 8, ">I", 3),
        _patched(buf, head - 4, ">I", 2), _patched(buf, head - 8, ">I", 1 << 30),
        _patched(buf, col_flags, ">B", 4), _patched(buf, table_flags - 2, ">H", 1),
        _patched(buf, table_flags, ">B", 4), _patched(buf, first_item, ">B", ord("X")),
        _patched(buf, first_item + 1, ">H", 1), _patched(buf, first_item + 3, ">B", 2),
        _patched(buf, insert + 3, ">H", 2), _patched(buf, insert + 5, ">B", ord("x")),
        _patched(buf, key, ">B", 0), _patched(buf, key, ">B", 4),
        _patched(buf, key + 1, ">H", 0), _patched(buf, key + 1, ">H", wire.MAX_PARTS + 1),
        buf + b"\0", b"XW" + buf[2:],
        *(buf[:n] for n in range(len(buf))),
    ]
    for b in bad:
        assert python_reading(b) is None, b.hex()
    for b, c in zip(bad, c_readings(wsdump, bad, tmp_path)):
        assert c is None, b.hex()
    assert c_readings(wsdump, [buf], tmp_path) == [python_reading(buf)] != [None]


def test_golden_writesets(wsdump: Path, tmp_path: Path) -> None:
    """Writesets the C writer produced (tests/golden/*.ws, when present) read alike."""
    files = sorted(GOLDEN.glob("*.ws")) if GOLDEN.is_dir() else []
    if not files:
        pytest.skip("no golden writesets (tests/golden/*.ws)")
    bufs = [f.read_bytes() for f in files]
    for f, buf, c in zip(files, bufs, c_readings(wsdump, bufs, tmp_path)):
        assert c == python_reading(buf), f.name


def test_old_columns_read_alike(wsdump: Path, tmp_path: Path) -> None:
    """An old image with a value per column (TABLE_OLD_COLUMNS, a link's delta counters) is read
    by the C reader as by the coordinator's; one of the identity's width is refused by both."""
    t = wire.Table("n", "t", (wire.Column("a", "int"), wire.Column("b", "text"), wire.Column("c", "int")), (0,),
                   old_columns=True)
    old = (b"1", wire.UNCHANGED, b"5")
    keys = (wire.Key(wire.KeyMode.UPDATE, (b"n", b"t")),)
    ok = wire.encode(wire.Writeset(1, 2, 3, (t,), (wire.Row("U", 0, old, (b"1", b"x", b"7")), wire.Row("D", 0, old)),
                                   keys))
    narrow = wire.encode(wire.Writeset(1, 2, 3, (t,), (wire.Row("D", 0, (b"1",)),), keys))
    assert c_readings(wsdump, [ok, narrow], tmp_path) == [python_reading(ok), None]
    assert python_reading(ok) is not None and python_reading(narrow) is None
