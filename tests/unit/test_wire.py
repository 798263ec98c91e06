"""Writeset wire format v2 (docs/PROTOCOL.md section 2): round trip and rejection of bad input."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus import wire
from chorus.wire import (FLAG_CONCURRENT, FLAG_DDL, FLAG_TOI, Binary, Column, Key, KeyMode, Row, Schema, Table, WireError,
                         Writeset, decode, encode)

TABLE = Table("public", "accounts", (Column("id", "integer"), Column("owner", "text"),
                                     Column("total", "numeric", wire.COL_GENERATED)), (0,))


def sample() -> Writeset:
    return Writeset(
        xid=1234, pid=99, last_seen=41, tables=(TABLE,),
        rows=(Row("I", 0, (), (Binary(b"\0\0\0\1"), b"ann", None)),
              Row("U", 0, (Binary(b"\0\0\0\1"),), (Binary(b"\0\0\0\1"), b"bob", None)),
              Row("D", 0, (Binary(b"\0\0\0\1"),), ()), Row("T", 0, flags=wire.TRUNCATE_RESTART)),
        keys=(Key(KeyMode.EXCLUSIVE, (b"public", b"accounts", b"id", b"1")),
              Key(KeyMode.REFERENCE, (b"public", b"accounts"))),
    )


def test_round_trip() -> None:
    ws = sample()
    back = wire.decode(wire.encode(ws))
    assert back == ws
    # binary values stay binary, text stays text, both as bytes (no encoding assumed)
    assert isinstance(back.rows[0].new[0], Binary) and not isinstance(back.rows[0].new[1], Binary)


def test_text_in_any_encoding_and_names_round_trip() -> None:
    """LATIN1 text (not valid UTF-8) and a LATIN1 name travel unchanged (no UTF-8 anywhere)."""
    name = b"caf\xe9".decode("utf-8", "surrogateescape")
    t = Table("public", name, (Column(name, "text"),), (0,))
    ws = Writeset(1, 1, 0, (t,), (Row("I", 0, (), (b"\xe9t\xe9",)),), (), encoding=8)
    back = wire.decode(wire.encode(ws))
    assert back == ws and back.encoding == 8 and back.rows[0].new[0] == b"\xe9t\xe9"
    assert wire.encode(back) == wire.encode(ws)


values = st.one_of(st.none(), st.binary(max_size=20), st.binary(max_size=8).map(Binary), st.just(wire.UNCHANGED))


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from("IUDT"), st.lists(values, min_size=2, max_size=2)), max_size=20),
       st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))
def test_round_trip_random(rows: list[tuple[str, list[bytes | None]]], last_seen: int, xid: int) -> None:
    t = Table("s", "t\"odd", (Column("a", "text"), Column("b", "text")), (0,))
    out = []
    for op, vals in rows:
        old = (vals[0],) if op in "UD" else ()
        new = tuple(vals) if op in "IU" else ()
        out.append(Row(op, 0, old, new))
    ws = Writeset(xid, 1, last_seen, (t,), tuple(out), (Key(KeyMode.UPDATE, (b"x",)),))
    back = wire.decode(wire.encode(ws))
    assert back == ws
    assert [type(v) for r in back.rows for v in r.new] == [type(v) for r in ws.rows for v in r.new]


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b"XX" + b[2:], "bad magic"),
    (lambda b: b[:2] + b"\x01" + b[3:], "unsupported writeset version 1"),
    (lambda b: b[:3] + b"\x80" + b[4:], "unknown writeset flags"),
    (lambda b: b[:-1], "truncated"),
    (lambda b: b + b"\x00", "trailing bytes"),
])
def test_rejects_malformed(mutate, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(wire.WireError, match=message):
        wire.decode(mutate(wire.encode(sample())))


def test_rejects_unknown_value_kind_and_truncate_flags() -> None:
    raw = bytearray(wire.encode(Writeset(1, 1, 0, (TABLE,), (Row("I", 0, (), (b"1", b"a", None)),), ())))
    i = raw.index(b"t\x00\x00\x00\x01" + b"1")
    raw[i] = ord("x")
    with pytest.raises(WireError, match="unknown value kind"):
        decode(bytes(raw))
    raw = bytearray(wire.encode(Writeset(1, 1, 0, (TABLE,), (Row("T", 0),), ())))
    raw[-1] = 0x80
    with pytest.raises(WireError, match="TRUNCATE with unknown flags"):
        decode(bytes(raw))


def test_rejects_bad_table_index() -> None:
    ws = Writeset(1, 1, 0, (TABLE,), (Row("I", 0, (), (b"1", b"a", None)),), ())
    raw = bytearray(wire.encode(ws))
    # the row's table index follows the op byte 'I'
    i = raw.index(b"I\x00\x00")
    raw[i + 1:i + 3] = struct.pack(">H", 7)
    with pytest.raises(wire.WireError, match="row refers to table 7"):
        wire.decode(bytes(raw))


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_decoder_survives_garbage(data: bytes) -> None:
    try:
        wire.decode(data)
    except wire.WireError:
        pass


@settings(max_examples=300)
@given(st.data())
def test_decoder_survives_corrupted_writesets(data: st.DataObject) -> None:
    raw = bytearray(wire.encode(sample()))
    for _ in range(data.draw(st.integers(1, 5))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        wire.decode(bytes(raw))
    except wire.WireError:
        pass


def _same_reading(raw: bytes) -> None:
    """scan() accepts exactly what decode() accepts, and reads the same header, tables, schema
    change items, keys and changed tables: the live path relies on the one, catch-up and the
    tests on the other."""
    try:
        full = wire.decode(raw)
    except wire.WireError:
        with pytest.raises(wire.WireError):
            wire.scan(raw)
        return
    s = wire.scan(raw)
    assert s.scanned and not full.scanned
    assert (s.xid, s.pid, s.last_seen, s.flags, s.encoding, s.tables, s.keys, s.raw) == (
        full.xid, full.pid, full.last_seen, full.flags, full.encoding, full.tables, full.keys, full.raw)
    assert s.statements == full.statements and s.rows == tuple(full.statements)
    assert s.changed_tables == full.changed_tables
    assert [k.hashed() for k in s.keys] == [k.hashed() for k in full.keys]


@settings(max_examples=300)
@given(st.data())
def test_scan_reads_what_decode_reads(data: st.DataObject) -> None:
    other = Table("public", "log", (Column("id", "bigint"),), (), True)
    rows: list[wire.Item] = []
    for _ in range(data.draw(st.integers(0, 6))):
        op = data.draw(st.sampled_from("IUDTS"))
        if op == "S":
            rows.append(_schema())
        elif op == "T":
            rows.append(Row("T", data.draw(st.integers(0, 1))))
        elif data.draw(st.booleans()):
            rows.append(Row(op, 1, (data.draw(values),) if op in "UD" else (),
                            (data.draw(values),) if op in "IU" else ()))
        else:
            rows.append(Row(op, 0, (Binary(b"\0\0\0\1"),) if op in "UD" else (),
                            (Binary(b"\0\0\0\1"), data.draw(values), None) if op in "IU" else ()))
    ws = Writeset(7, 8, 9, (TABLE, other), tuple(rows), sample().keys)
    raw = bytearray(wire.encode(ws))
    _same_reading(bytes(raw))
    for _ in range(data.draw(st.integers(0, 4))):  # and corrupted: both refuse alike
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    _same_reading(bytes(raw))


def test_a_scanned_writeset_is_not_written_again() -> None:
    s = wire.scan(wire.encode(sample()))
    with pytest.raises(ValueError):
        wire.encode(s)


def test_key_describe() -> None:
    k = Key(KeyMode.EXCLUSIVE, (b"public", b"t", b"a,b", b"1", b"x"))
    assert k.describe() == '"public"."t" (a,b)=(1, x)'
    assert Key(KeyMode.EXCLUSIVE, (b"public", b"t")).describe() == '"public"."t" (table)'


def _schema(statement: str = "ALTER TABLE t ADD COLUMN \"x%\" text DEFAULT 'é'") -> Schema:
    return Schema((("search_path", '"$user", public'), ("DateStyle", "SQL, DMY")), "alice",
                  statement.encode("utf-8"))


def test_schema_change_round_trip() -> None:
    """A schema change item among rows, in order; the flag follows from the items."""
    ws = Writeset(0, 42, 17, (TABLE,), (_schema(), Row("I", 0, (), (b"1", b"a", None)), _schema("DROP TABLE x")),
                  (Key(KeyMode.EXCLUSIVE, (b"public", b"t")),))
    back = decode(encode(ws))
    assert back.rows == ws.rows and back.keys == ws.keys and back.flags & FLAG_DDL and back.has_schema
    assert back.statements[0].setting("DateStyle") == "SQL, DMY" and back.statements[1].statement == b"DROP TABLE x"
    with pytest.raises(WireError, match="truncated"):
        decode(encode(ws)[:-3])


def test_toi_request_holds_exactly_one_schema_change() -> None:
    ok = Writeset(0, 1, 0, (), (_schema(),), (), flags=FLAG_TOI)
    assert decode(encode(ok)).toi
    with pytest.raises(WireError, match="exactly one schema change"):
        decode(encode(Writeset(0, 1, 0, (), (_schema(), _schema()), (), flags=FLAG_TOI)))


def test_concurrent_index_change_holds_exactly_one_schema_change() -> None:
    """CREATE/DROP INDEX CONCURRENTLY: one statement, no rows, never an ordering request."""
    ok = Writeset(0, 1, 0, (), (_schema("CREATE INDEX CONCURRENTLY i ON t (v)"),), (), flags=FLAG_CONCURRENT)
    back = decode(encode(ok))
    assert back.concurrent and back.has_schema and not back.toi
    for bad in (Writeset(0, 1, 0, (), (_schema(), _schema()), (), flags=FLAG_CONCURRENT),
                Writeset(0, 1, 0, (TABLE,), (_schema(), Row("I", 0, (), (b"1", b"a", None))), (), flags=FLAG_CONCURRENT),
                Writeset(0, 1, 0, (), (_schema(),), (), flags=FLAG_CONCURRENT | FLAG_TOI)):
        with pytest.raises(WireError, match="concurrent index change"):
            decode(encode(bad))
    with pytest.raises(WireError):  # the flag without its statement
        decode(encode(Writeset(0, 1, 0, (), (), (), flags=FLAG_CONCURRENT)))


def test_concurrent_session_takes_the_origins_context_quoted() -> None:
    """The session that runs a concurrent index change on another node: the origin's settings as
    escape literals (standard_conforming_strings may be off among them) and its role as the
    extension's replay role (docs/SECURITY.md), never SET ROLE (which the role's code could undo)."""
    from chorus.concurrent import session_setup
    item = Schema((("standard_conforming_strings", "off"), ("search_path", "a'b\\c, \"$user\"")),
                  'role "x"', b"CREATE INDEX CONCURRENTLY i ON t (v)")
    out = session_setup(item)
    assert out[:3] == [b"SET search_path = pg_catalog, pg_temp", b"SET chorus.replicate_ddl = off",
                       b"SET chorus.replaying = on"]
    assert any(b"set_config(E'search_path', E'a''b\\\\c, \"$user\"', false)" in o for o in out)
    assert out[-1] == b"SELECT pg_catalog.set_config('chorus.replay_role', E'role \"x\"', false)"
    assert not any(o.startswith(b"SET ROLE") for o in out)


def test_old_columns_round_trip_in_both_readers() -> None:
    """TABLE_OLD_COLUMNS (a link's delta counters, chorus.link_old_columns): an UPDATE's and a
    DELETE's old image has a value per column, the identity's and the captured ones, the others
    not sent ('u'). Both readers read it alike; one of the identity's width is refused."""
    from chorus import _cwire  # type: ignore[attr-defined]
    t = Table("public", "counters", (Column("id", "integer"), Column("label", "text"), Column("hits", "bigint")),
              (0,), old_columns=True)
    old = (Binary(b"\0\0\0\1"), wire.UNCHANGED, Binary(b"\0" * 7 + b"\5"))
    ws = Writeset(1, 2, 3, (t, TABLE), (Row("U", 0, old, (Binary(b"\0\0\0\1"), b"a", Binary(b"\0" * 7 + b"\7"))),
                                        Row("D", 0, old), Row("U", 1, (Binary(b"\0\0\0\1"),), (Binary(b"\0\0\0\1"), b"b", None))),
                   sample().keys)
    raw = wire.encode(ws)
    assert raw[raw.index(b"counters"):].count(bytes([wire.TABLE_OLD_COLUMNS])) >= 1
    for read in (wire.read_python, _cwire.read):
        back = read(raw, True)
        assert back.tables[0].old_columns and not back.tables[1].old_columns
        assert back.rows == ws.rows and back.tables == ws.tables
        assert read(raw, False).changed_tables == frozenset({0, 1})
    _same_reading(raw)
    assert wire.describe(wire.decode(raw))["tables"][0]["old_columns"] is True
    narrow = wire.encode(replace(ws, rows=(Row("U", 0, (Binary(b"\0\0\0\1"),), ws.rows[0].new),)))
    for read in (wire.read_python, _cwire.read):
        with pytest.raises(WireError, match="old tuple has 1 values, expected 3"):
            read(narrow, True)
