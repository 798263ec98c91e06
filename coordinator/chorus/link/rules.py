"""What a link carries and how it is reshaped on the way (docs/LINKS.md section 8; [streams]
2.2 rules and transformations, 2.6 handlers).

A :class:`RuleSet` is plain data (it is configured, stored and compared). :func:`route` applies
it to one decoded writeset: tables chosen by include/exclude patterns, rows by a SQL predicate,
then the table's transformations in order. Whatever is SQL (a row filter, a computed column, a
row function) is evaluated by a :class:`SqlEvaluator`: PostgreSQL in the sender, a stand-in in
tests. Routing is deterministic given the evaluator's answers.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from typing import Optional, Protocol, Sequence, Union

from chorus import wire


class RuleError(ValueError):
    """A rule set that cannot work (a key column dropped, a name used twice)."""


class SqlEvaluator(Protocol):
    """Evaluates the SQL parts of rules on one row: the row's values in ``table``'s column
    order, text values in the database's encoding. Implementations must be read-only and
    deterministic (the sender evaluates them in a read-only session)."""

    def predicate(self, table: wire.Table, values: tuple[wire.Value, ...], predicate: str) -> bool:
        """``predicate`` (a WHERE clause over the columns) on the row; NULL counts as false."""
        ...

    def expression(self, table: wire.Table, values: tuple[wire.Value, ...], expression: str) -> wire.Value:
        """The value of ``expression`` over the row, in text form (None for NULL)."""
        ...

    def row_function(self, table: wire.Table, values: tuple[wire.Value, ...],
                     function: str) -> Optional[tuple[wire.Value, ...]]:
        """``function(row)``: the row reshaped (same columns), or None to drop the row change."""
        ...


@dataclass(frozen=True)
class RenameTable:
    schema: str
    table: str


@dataclass(frozen=True)
class RenameColumn:
    old: str
    new: str


@dataclass(frozen=True)
class DropColumn:
    column: str


@dataclass(frozen=True)
class ComputedColumn:
    column: str
    typname: str
    expression: str  # SQL over the row's columns (as they are at this step)


@dataclass(frozen=True)
class RowFunction:
    function: str  # f(jsonb) returns jsonb, later; here through the evaluator


Transformation = Union[RenameTable, RenameColumn, DropColumn, ComputedColumn, RowFunction]


@dataclass(frozen=True)
class TableRule:
    """For the tables matching ``pattern`` (``schema.table``, shell patterns): a row filter
    (a SQL predicate, None: every row) and transformations applied in order."""

    pattern: str
    row_filter: Optional[str] = None
    transformations: tuple[Transformation, ...] = ()


@dataclass(frozen=True)
class RuleSet:
    """One direction of a link. A table is carried if it matches an ``include`` pattern and no
    ``exclude`` pattern; the first :class:`TableRule` matching it applies. Schema changes are
    carried only with ``ddl``, as written (transformations do not rewrite statements), and only
    those :func:`ddl_refusal` lets through."""

    include: tuple[str, ...] = ("*.*",)
    exclude: tuple[str, ...] = ("chorus.*",)
    tables: tuple[TableRule, ...] = ()
    ddl: bool = False
    ddl_roles: tuple[str, ...] = ()  # the roles whose schema changes go (docs/LINKS.md section 8.1)

    @property
    def needs_sql(self) -> bool:
        """Whether routing may ask the evaluator (a row filter, a computed column, a row function)."""
        return any(r.row_filter is not None or any(isinstance(t, (ComputedColumn, RowFunction))
                                                   for t in r.transformations) for r in self.tables)

    def carries(self, schema: str, table: str) -> bool:
        name = f"{schema}.{table}"
        return (any(fnmatch.fnmatchcase(name, p) for p in self.include)
                and not any(fnmatch.fnmatchcase(name, p) for p in self.exclude))

    def rule_for(self, schema: str, table: str) -> Optional[TableRule]:
        name = f"{schema}.{table}"
        return next((r for r in self.tables if fnmatch.fnmatchcase(name, r.pattern)), None)


# The key every schema change holds (extension/chorus_wire.h CHORUS_SCHEMA_KEY_*): not a table.
SCHEMA_KEY = (b"chorus", b"schema changes")


def ddl_tables(ws: wire.Writeset) -> list[tuple[str, str]]:
    """The tables a writeset's schema changes name: its table keys (schema, table) in exclusive
    mode (extension/chorus_ddl_classify.c keys each table a statement makes or changes, an index
    standing for its table), without the key every schema change holds. A writeset is one
    transaction: the names of all its statements together (and of a TRUNCATE or a table keyed
    whole in it, which only makes the test stricter)."""
    out: list[tuple[str, str]] = []
    for k in ws.keys:
        if len(k.parts) == 2 and k.mode == wire.KeyMode.EXCLUSIVE and k.parts != SCHEMA_KEY:
            name = (k.parts[0].decode("utf-8", "surrogateescape"), k.parts[1].decode("utf-8", "surrogateescape"))
            if name not in out:
                out.append(name)
    return out


def foreign_roles(roles: Sequence[str], ws: wire.Writeset) -> list[str]:
    """The roles that made schema changes of ``ws`` and are not among ``roles`` (a link's
    ``ddl_roles``: those the operator says are the same, with the same rights, on both sites)."""
    out: list[str] = []
    for s in ws.statements:
        if s.role not in roles and s.role not in out:
            out.append(s.role)
    return out


def ddl_refusal(rules: RuleSet, ws: wire.Writeset) -> Optional[str]:
    """Why the schema changes of ``ws`` (one holding some) are not sent, or None: they are. Sent
    with ``ddl`` only, when they name at least one table and every table they name is carried by
    the lists, and every one was made by a role of ``ddl_roles``. Not sent: another role's, a
    statement that names no table (a function, a type, a schema, a role,
    a grant on a function...: the lists choose tables, and roles and code are each site's own;
    create them on each site), one naming a table outside the lists, a concurrent index change
    (it runs beside the total order, which a link writeset does not). The transaction's rows
    still go by the lists. One naming a table the link reshapes (renamed, a column renamed,
    dropped or computed) cannot be carried as written: RuleError, which stops the link at it
    (docs/LINKS.md section 8.1)."""
    if not rules.ddl:
        return "ddl is off for this link"
    if ws.toi:
        return "an ordering request, not a schema change's content"
    if ws.concurrent:
        return "a concurrent index change (CONCURRENTLY) is not carried by links"
    foreign = foreign_roles(rules.ddl_roles, ws)
    if foreign:
        return f"made by role(s) {', '.join(foreign)}, not in the link's ddl_roles"
    named = ddl_tables(ws)
    if not named:
        return "it names no table (functions, types, schemas, roles are each site's own)"
    outside = [f"{s}.{t}" for s, t in named if not rules.carries(s, t)]
    if outside:
        return f"it names {', '.join(outside)}, which the link does not carry"
    for s, t in named:
        rule = rules.rule_for(s, t)
        if rule is not None and any(not isinstance(x, RowFunction) for x in rule.transformations):
            raise RuleError(f"a schema change of {s}.{t}, which the link reshapes (renamed, or columns renamed, "
                            "dropped or computed): statements are sent as written, so it cannot be carried; "
                            "make it on the peer yourself and set ddl = false until the link passed it, or drop "
                            "the transformation")
    return None


def transform_table(table: wire.Table, steps: tuple[Transformation, ...]) -> wire.Table:
    """The table as the receiving site sees it after ``steps`` (checked: a key column is never
    dropped, names stay unique)."""
    for step in steps:
        table = _table_step(table, step)
    return table


def _table_step(table: wire.Table, step: Transformation) -> wire.Table:
    names = [c.name for c in table.columns]
    if isinstance(step, RenameTable):
        return replace(table, nspname=step.schema, relname=step.table)
    if isinstance(step, RenameColumn):
        if step.old not in names:
            raise RuleError(f"{table.qualified} has no column {step.old}")
        if step.new in names:
            raise RuleError(f"{table.qualified} already has a column {step.new}")
        cols = tuple(replace(c, name=step.new) if c.name == step.old else c for c in table.columns)
        return replace(table, columns=cols)
    if isinstance(step, DropColumn):
        if step.column not in names:
            raise RuleError(f"{table.qualified} has no column {step.column}")
        i = names.index(step.column)
        if i in table.identity or table.full_identity:
            raise RuleError(f"column {step.column} of {table.qualified} is part of its key: it cannot be dropped")
        cols = table.columns[:i] + table.columns[i + 1:]
        return replace(table, columns=cols, identity=tuple(j - (j > i) for j in table.identity))
    if isinstance(step, ComputedColumn):
        if step.column in names:
            raise RuleError(f"{table.qualified} already has a column {step.column}")
        return replace(table, columns=table.columns + (wire.Column(step.column, step.typname),))
    return table  # RowFunction keeps the shape


def _values_step(table: wire.Table, step: Transformation, values: tuple[wire.Value, ...],
                 ev: SqlEvaluator) -> Optional[tuple[wire.Value, ...]]:
    if isinstance(step, DropColumn):
        i = [c.name for c in table.columns].index(step.column)
        return values[:i] + values[i + 1:]
    if isinstance(step, ComputedColumn):
        return values + (ev.expression(table, values, step.expression),)
    if isinstance(step, RowFunction):
        out = ev.row_function(table, values, step.function)
        if out is not None and len(out) != len(values):
            raise RuleError(f"row function {step.function} returned {len(out)} values for {len(values)} columns")
        return out
    return values


def _transform_row(table: wire.Table, row: wire.Row, steps: tuple[Transformation, ...],
                   ev: SqlEvaluator) -> Optional[wire.Row]:
    """The row after ``steps``; None when a row function dropped it. A DELETE's old image holds
    only the key, which transformations keep (renamed at most); an old image with a value per
    column (``Table.old_columns``: the delta policy's captured counters) loses a dropped column's
    and has none ('u') for a computed one."""
    new: Optional[tuple[wire.Value, ...]] = row.new if row.op in (wire.OP_INSERT, wire.OP_UPDATE) else None
    old = row.old
    for step in steps:
        if new is not None:
            new = _values_step(table, step, new, ev)
            if new is None:
                return None
        if table.old_columns and isinstance(step, DropColumn):
            i = [c.name for c in table.columns].index(step.column)
            old = old[:i] + old[i + 1:]
        elif table.old_columns and isinstance(step, ComputedColumn):
            old = old + (wire.UNCHANGED,)
        table = _table_step(table, step)
    return row._replace(old=old, new=new if new is not None else ())


def route(rules: RuleSet, ws: wire.Writeset, ev: SqlEvaluator) -> Optional[wire.Writeset]:
    """What of ``ws`` the link carries, reshaped: None if nothing. Row migration as Streams'
    subset rules: an UPDATE whose new image fails the row filter is sent as a DELETE of its key
    (the old image holds only the key, so whether the row was in the subset is not known, and a
    delete is right either way); a failing INSERT is dropped; a DELETE is always sent. Keys
    follow their tables (renamed or dropped with them); keys naming a dropped column go."""
    tables: list[wire.Table] = []
    index: dict[int, int] = {}
    items: list[wire.Item] = []
    ddl = ws.has_schema and ddl_refusal(rules, ws) is None
    for item in ws.rows:
        if isinstance(item, wire.Schema):
            if ddl:
                items.append(item)
            continue
        source = ws.tables[item.table]
        if not rules.carries(source.nspname, source.relname):
            continue
        rule = rules.rule_for(source.nspname, source.relname)
        row = item
        if rule is not None and rule.row_filter is not None and row.op in (wire.OP_INSERT, wire.OP_UPDATE):
            if not ev.predicate(source, row.new, rule.row_filter):
                if row.op == wire.OP_INSERT:
                    continue
                row = wire.Row(wire.OP_DELETE, row.table, row.old)
        steps = rule.transformations if rule is not None else ()
        routed = _transform_row(source, row, steps, ev) if steps else row
        if routed is None:
            continue
        if item.table not in index:
            index[item.table] = len(tables)
            tables.append(transform_table(source, steps))
        items.append(routed._replace(table=index[item.table]))
    if not items:
        return None
    keys = tuple(k for k in (k if ddl and k.parts == SCHEMA_KEY else _route_key(rules, k) for k in ws.keys)
                 if k is not None)
    flags = ws.flags if any(isinstance(i, wire.Schema) for i in items) else ws.flags & ~(wire.FLAG_DDL | wire.FLAG_TOI)
    return wire.Writeset(ws.xid, ws.pid, ws.last_seen, tuple(tables), tuple(items), keys, flags, ws.encoding)


def _route_key(rules: RuleSet, key: wire.Key) -> Optional[wire.Key]:
    if len(key.parts) < 2:
        return key
    schema, table = (p.decode("utf-8", "surrogateescape") for p in key.parts[:2])
    if not rules.carries(schema, table):
        return None
    rule = rules.rule_for(schema, table)
    if rule is None:
        return key
    parts = list(key.parts)
    columns = parts[2].decode("utf-8", "surrogateescape").split(",") if len(parts) > 2 else []
    for step in rule.transformations:
        if isinstance(step, RenameTable):
            parts[0], parts[1] = wire.name_bytes(step.schema), wire.name_bytes(step.table)
        elif isinstance(step, RenameColumn):
            columns = [step.new if c == step.old else c for c in columns]
        elif isinstance(step, DropColumn) and step.column in columns:
            return None
    if len(parts) > 2:
        parts[2] = wire.name_bytes(",".join(columns))
    return wire.Key(key.mode, tuple(parts))
