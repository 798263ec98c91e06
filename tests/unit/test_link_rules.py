"""Rules, row filters and transformations of a link (docs/LINKS.md section 8; Streams 2.2):
evaluated by the sender on decoded writesets; the result is a writeset again (wire format)."""

from __future__ import annotations

from typing import Optional

import pytest

from chorus import wire
from chorus.link.rules import (ComputedColumn, DropColumn, RenameColumn, RenameTable, RowFunction, RuleError, RuleSet,
                               TableRule, route, transform_table)

EMP = wire.Table("hr", "emp", (wire.Column("id", "int4"), wire.Column("region", "text"), wire.Column("ssn", "text"),
                               wire.Column("salary", "int4")), (0,))
LOG = wire.Table("chorus", "audit", (wire.Column("id", "int4"),), (0,))


class Evaluator:
    """A stand-in for PostgreSQL: predicates ``col = 'value'``, expressions ``col * k``, row
    functions by name."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _get(self, table: wire.Table, values: tuple[wire.Value, ...], col: str) -> wire.Value:
        return values[[c.name for c in table.columns].index(col)]

    def predicate(self, table: wire.Table, values: tuple[wire.Value, ...], predicate: str) -> bool:
        self.calls.append(predicate)
        col, _, lit = predicate.partition(" = ")
        return self._get(table, values, col) == lit.strip("'").encode()

    def expression(self, table: wire.Table, values: tuple[wire.Value, ...], expression: str) -> wire.Value:
        col, _, k = expression.partition(" * ")
        v = self._get(table, values, col)
        return None if v is None else str(int(bytes(v)) * int(k)).encode()

    def row_function(self, table: wire.Table, values: tuple[wire.Value, ...],
                     function: str) -> Optional[tuple[wire.Value, ...]]:
        if function == "drop_all":
            return None
        return tuple(v.upper() if isinstance(v, bytes) and not isinstance(v, wire.Binary) else v for v in values)


def _row(op: str, id: int, region: str = "eu", ssn: str = "123", salary: int = 10) -> wire.Row:
    new = (str(id).encode(), region.encode(), ssn.encode(), str(salary).encode())
    if op == wire.OP_INSERT:
        return wire.Row(op, 0, (), new)
    if op == wire.OP_UPDATE:
        return wire.Row(op, 0, (str(id).encode(),), new)
    return wire.Row(op, 0, (str(id).encode(),))


def _ws(*rows: wire.Row, audit: bool = False) -> wire.Writeset:
    items: tuple[wire.Item, ...] = rows + ((wire.Row(wire.OP_INSERT, 1, (), (b"1",)),) if audit else ())
    keys = (wire.Key(wire.KeyMode.EXCLUSIVE, (b"hr", b"emp", b"id", b"1")),
            wire.Key(wire.KeyMode.UPDATE, (b"hr", b"emp", b"ssn", b"123")),
            wire.Key(wire.KeyMode.EXCLUSIVE, (b"chorus", b"audit", b"id", b"1")))
    return wire.Writeset(1, 2, 3, (EMP, LOG), items, keys)


def test_include_and_exclude() -> None:
    rules = RuleSet()
    assert rules.carries("hr", "emp") and not rules.carries("chorus", "audit")  # Chorus's own tables stay
    rules = RuleSet(include=("hr.*", "sales.orders"), exclude=("hr.secret*",))
    assert rules.carries("hr", "emp") and rules.carries("sales", "orders")
    assert not rules.carries("hr", "secret_pay") and not rules.carries("sales", "leads")


def test_tables_not_carried_are_dropped_with_their_keys() -> None:
    out = route(RuleSet(), _ws(_row("I", 1), audit=True), Evaluator())
    assert out is not None
    assert [t.relname for t in out.tables] == ["emp"] and len(out.rows) == 1
    assert all(k.parts[0] != b"chorus" for k in out.keys)
    assert route(RuleSet(include=("sales.*",)), _ws(_row("I", 1)), Evaluator()) is None


def test_row_filter_and_row_migration() -> None:
    rules = RuleSet(tables=(TableRule("hr.emp", row_filter="region = 'eu'"),))
    ev = Evaluator()
    out = route(rules, _ws(_row("I", 1), _row("I", 2, "us"), _row("U", 3, "eu"), _row("U", 4, "us"), _row("D", 5)), ev)
    assert out is not None
    assert [(r.op, r.old, r.new[:1]) for r in out.rows if isinstance(r, wire.Row)] == [
        ("I", (), (b"1",)),  # passes
        ("U", (b"3",), (b"3",)),  # passes
        ("D", (b"4",), ()),  # left the subset (or never was in): a delete of its key
        ("D", (b"5",), ()),  # deletes always go
    ]
    assert ev.calls == ["region = 'eu'"] * 4  # inserts and updates only


def test_transformations_in_order() -> None:
    steps = (RenameTable("public", "staff"), DropColumn("ssn"), RenameColumn("salary", "pay"),
             ComputedColumn("pay_k", "int4", "pay * 1000"), RowFunction("upper"))
    rules = RuleSet(tables=(TableRule("hr.*", transformations=steps),))
    out = route(rules, _ws(_row("I", 1), _row("U", 2, salary=7), _row("D", 3)), Evaluator())
    assert out is not None
    t = out.tables[0]
    assert (t.nspname, t.relname) == ("public", "staff")
    assert [c.name for c in t.columns] == ["id", "region", "pay", "pay_k"] and t.identity == (0,)
    rows = [r for r in out.rows if isinstance(r, wire.Row)]
    assert rows[0].new == (b"1", b"EU", b"10", b"10000")
    assert rows[1].new == (b"2", b"EU", b"7", b"7000") and rows[1].old == (b"2",)
    assert rows[2] == wire.Row("D", 0, (b"3",))
    # keys follow: the table renamed, the key on a dropped column gone
    assert [k.parts for k in out.keys] == [(b"public", b"staff", b"id", b"1")]
    # and it is a writeset again: the wire format takes it
    assert wire.decode(wire.encode(out)) == out


def test_a_row_function_may_drop_a_row() -> None:
    rules = RuleSet(tables=(TableRule("hr.emp", transformations=(RowFunction("drop_all"),)),))
    assert route(rules, _ws(_row("I", 1)), Evaluator()) is None


def test_key_columns_cannot_be_dropped_and_names_stay_unique() -> None:
    with pytest.raises(RuleError):
        transform_table(EMP, (DropColumn("id"),))
    with pytest.raises(RuleError):
        transform_table(EMP, (RenameColumn("ssn", "region"),))
    with pytest.raises(RuleError):
        transform_table(EMP, (ComputedColumn("id", "int4", "1"),))
    with pytest.raises(RuleError):
        transform_table(EMP, (RenameColumn("nope", "x"),))


def test_schema_changes_only_with_ddl() -> None:
    ddl = wire.Schema((("search_path", "public"),), "alice", b"ALTER TABLE hr.emp ADD c int")
    w = wire.Writeset(1, 2, 3, (EMP,), (ddl,), (wire.Key(wire.KeyMode.EXCLUSIVE, (b"hr", b"emp")),), wire.FLAG_DDL)
    assert route(RuleSet(), w, Evaluator()) is None
    assert route(RuleSet(ddl=True), w, Evaluator()) is None  # alice is not among the roles it carries
    out = route(RuleSet(ddl=True, ddl_roles=("alice",)), w, Evaluator())
    assert out is not None and out.has_schema
