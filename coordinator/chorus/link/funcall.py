"""The ``function`` conflict policy's calls (docs/LINKS.md section 7.1): a user's SQL function
``f(table regclass, a_row jsonb, a_site text, b_row jsonb, b_site text, a_meta jsonb, b_meta
jsonb) returns jsonb`` decides a row in conflict, called by the apply of the link writeset on
every node of the receiving site, in the apply's transaction, through
``chorus.link_conflict_call`` (extension/chorus_link_call.c: as the function's owner, in a
restricted security context, read-only, ``search_path = pg_catalog``; refused unless it is
IMMUTABLE, not SECURITY DEFINER and not owned by a superuser).

The pure part: :class:`FunctionCalls`, the evaluator ``policy.FunctionPolicy`` asks, which
answers from the calls made (and collects those not made yet), and what a call sends and reads
(:func:`call_sql`, :func:`answer`). The shell: :func:`decide_calls`, which makes the calls a
settlement needs with the apply's query.

Both versions are passed in the canonical order (the arbiter's first) and in a canonical form:
each version's values cast to its column's type here and turned into ``jsonb`` by PostgreSQL
(``jsonb_build_object``), whichever side's text or binary form they came in; the metadata is the
version's clock and commit time. So both sites pass the same arguments. The answer is read back
column by column through the table's row type (``jsonb_populate_record``), as text: a value of
the wrong type fails there. Whether it is one of the two versions is decided on the same texts,
so both sites classify it alike.

What fails (the function raises, is refused, is missing; the answer is not an object or NULL,
names a column the table lacks or lacks one, holds a value of the wrong type; a version has a
value that was not sent) fails the apply of the link writeset, alike on every node: the link
stops there, visibly, until the function or the settings are fixed (docs/LINKS.md section 7.1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Sequence

import psycopg.adapt
from psycopg.pq import Format

from chorus import wire
from chorus.link import position as lp
from chorus.link.events import Version
from chorus.link.sqleval import COLUMN_TYPES_SQL

ARGUMENTS = ("pg_catalog.regclass, pg_catalog.jsonb, pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, "
             "pg_catalog.jsonb, pg_catalog.jsonb")

# the columns of a table and their types, as casts name them (the first two of each row)
TYPES_SQL = COLUMN_TYPES_SQL.format("%s", "%s")

# the columns of a table whose type (or its arrays' element type) a database's role defined,
# outside pg_catalog: a domain's CHECK, a cast to json a role defined, would run user code as the
# apply session's superuser while the call's arguments are built (call_sql): refused
OWN_TYPES_SQL = (
    "SELECT a.attname::pg_catalog.text, pg_catalog.format_type(a.atttypid, NULL) FROM pg_catalog.pg_attribute a "
    "JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid "
    "LEFT JOIN pg_catalog.pg_type e ON e.oid OPERATOR(pg_catalog.=) t.typelem "
    "WHERE a.attrelid OPERATOR(pg_catalog.=) %s::pg_catalog.regclass AND a.attnum OPERATOR(pg_catalog.>) 0 "
    "AND NOT a.attisdropped AND (t.typnamespace OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.regnamespace "
    "OR e.typnamespace OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.regnamespace) ORDER BY a.attnum")


class FunctionError(ValueError):
    """A conflict function's call that cannot be made or whose answer cannot be used."""


class BinaryParam(bytes):
    """A parameter in its type's binary send form, of the type the statement casts it to."""

    __slots__ = ()


class _BinaryParamDumper(psycopg.adapt.Dumper):
    format = Format.BINARY
    oid = 0  # the server takes the type from the cast around the parameter

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


psycopg.adapters.register_dumper(BinaryParam, _BinaryParamDumper)


@dataclass(frozen=True)
class FunctionCall:
    """One call: the function, the table, the two versions in canonical order."""

    function: str
    table: wire.Table
    first: Version
    second: Version


def _meta(v: Version) -> str:
    return json.dumps({"clock": v.clock, "commit_time": lp.timestamp_text(v.commit_time).decode("ascii")},
                      separators=(",", ":"))


def _check(call: FunctionCall, v: Version) -> None:
    for c, x in zip(call.table.columns, v.values or ()):
        if isinstance(x, wire.Unchanged):
            raise FunctionError(f"conflict function {call.function} on {call.table.qualified}: the version of site "
                                f"{v.site} lacks the value of column {c.name} (an UPDATE that left an out-of-line "
                                "value unchanged did not send it): the two sites would not pass the same row")


def call_sql(call: FunctionCall, types: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
    """The statement making ``call`` and its parameters, given the table's columns and types
    (:data:`TYPES_SQL`). It returns the answer's ``jsonb_typeof``, its keys, then the text of each
    column of the first version, the second, and the answer (through the table's row type)."""
    table = call.table
    typ = {str(n): str(t).replace("%", "%%") for n, t in types}  # (a % is psycopg's)
    for c in table.columns:
        if c.name not in typ:
            raise FunctionError(f"conflict function {call.function}: column {c.name} of the peer's "
                                f"{table.qualified} is not a column of the table here")
    params: list[Any] = []

    def row(v: Version) -> str:
        _check(call, v)
        params.append(v.values is not None)
        parts = []
        for i, c in enumerate(table.columns):
            x = None if v.values is None else v.values[i]
            params.append(c.name)
            params.append(BinaryParam(x) if isinstance(x, wire.Binary) else None if x is None else bytes(x).decode(
                "utf-8", "surrogateescape"))
            parts.append(f"%s::pg_catalog.text, %{'b' if isinstance(x, wire.Binary) else 's'}::{typ[c.name]}")
        return f"CASE WHEN %s THEN pg_catalog.jsonb_build_object({', '.join(parts)}) END"

    a, b = row(call.first), row(call.second)
    params += [f"{call.function}({ARGUMENTS})", table.qualified, call.first.site, call.second.site,
               _meta(call.first), _meta(call.second)]
    cols = [wire.quote_ident(c.name).replace("%", "%%") for c in table.columns]
    qualified = table.qualified.replace("%", "%%")
    is_object = "pg_catalog.jsonb_typeof(c.r) OPERATOR(pg_catalog.=) 'object'"
    outs = ", ".join(wire.text_of(f"{alias}.{c}") for alias in ("pa", "pb", "pr") for c in cols)
    sql = (f"WITH v AS (SELECT {a} AS a, {b} AS b), "
           "c AS (SELECT v.a, v.b, chorus.link_conflict_call(%s::pg_catalog.regprocedure, %s::pg_catalog.regclass, "
           "v.a, %s::pg_catalog.text, v.b, %s::pg_catalog.text, %s::pg_catalog.jsonb, %s::pg_catalog.jsonb) AS r "
           "FROM v) "
           f"SELECT pg_catalog.jsonb_typeof(c.r), CASE WHEN {is_object} THEN "
           "ARRAY(SELECT pg_catalog.jsonb_object_keys(c.r)) END, " + outs + " FROM c, "
           f"LATERAL pg_catalog.jsonb_populate_record(NULL::{qualified}, c.a) AS pa, "
           f"LATERAL pg_catalog.jsonb_populate_record(NULL::{qualified}, c.b) AS pb, "
           f"LATERAL pg_catalog.jsonb_populate_record(NULL::{qualified}, CASE WHEN {is_object} THEN c.r END) "
           "AS pr")
    return sql, params


def _texts(row: Sequence[Any]) -> tuple[wire.Value, ...]:
    return tuple(None if v is None else str(v).encode("utf-8", "surrogateescape") for v in row)


def answer(call: FunctionCall, row: Sequence[Any]) -> Optional[tuple[wire.Value, ...]]:
    """The row ``call``'s function left (None: absent), from the row :func:`call_sql` returned:
    the first version's own values if the answer is that version, the second's if it is that
    one, else the answer's values as text."""
    n = len(call.table.columns)
    kind, keys = row[0], row[1]
    a, b, r = _texts(row[2:2 + n]), _texts(row[2 + n:2 + 2 * n]), _texts(row[2 + 2 * n:2 + 3 * n])
    if kind is None or kind == "null":
        return None
    where = f"conflict function {call.function} on {call.table.qualified}"
    if kind != "object":
        raise FunctionError(f"{where} answered a JSON {kind}, not an object (a row) or NULL")
    names = [c.name for c in call.table.columns]
    unknown = sorted(set(keys) - set(names))
    if unknown:
        raise FunctionError(f"{where} answered a row with column(s) the table lacks: {', '.join(unknown)}")
    missing = [c for c in names if c not in keys]
    if missing:
        raise FunctionError(f"{where} answered a row without column(s) {', '.join(missing)}: it must name "
                            "every column")
    if call.first.values is not None and r == a:
        return call.first.values
    if call.second.values is not None and r == b:
        return call.second.values
    return r


class FunctionCalls:
    """The evaluator of ``FunctionPolicy`` for one settlement: answers from the calls made; a
    call not made yet is collected (while :attr:`collecting`, answering with the first version
    for now) or is an error (the settlement decides only once every call it needs is answered)."""

    def __init__(self) -> None:
        self.answers: dict[FunctionCall, Optional[tuple[wire.Value, ...]]] = {}
        self.missing: list[FunctionCall] = []
        self.collecting = False

    def __call__(self, function: str, table: wire.Table, first: Version,
                 second: Version) -> Optional[tuple[wire.Value, ...]]:
        call = FunctionCall(function, table, first, second)
        if call in self.answers:
            return self.answers[call]
        if not self.collecting:
            raise FunctionError(f"conflict function {function} on {table.qualified}: not called yet")
        if call not in self.missing:
            self.missing.append(call)
        return first.values


Query = Callable[[str, Sequence[Any]], Awaitable[list[tuple[Any, ...]]]]


TIMEOUT_SQL = "SELECT pg_catalog.set_config('statement_timeout', %s, true)"


async def decide_calls(calls: Callable[[], list[FunctionCall]], functions: FunctionCalls, query: Query,
                       timeout_ms: int = 1000) -> int:
    """Make every call a settlement needs (``calls``: those it still misses, given the answers so
    far) with the apply's ``query``, each under ``statement_timeout = timeout_ms`` (a function
    that does not return would hold every later GID of the site; the apply's own statements
    get the session's setting back); returns how many were made."""
    types: dict[str, list[tuple[Any, ...]]] = {}
    made = 0
    old: Optional[str] = None
    while True:
        todo = calls()
        if not todo:
            if old is not None:
                await query(TIMEOUT_SQL, (old,))
            return made
        if old is None:
            old = str((await query("SELECT pg_catalog.current_setting('statement_timeout')", ()))[0][0])
            await query(TIMEOUT_SQL, (f"{int(timeout_ms)}ms",))
        for call in todo:
            name = call.table.qualified
            if name not in types:
                own = await query(OWN_TYPES_SQL, (name,))
                if own:
                    raise FunctionError(
                        f"conflict function {call.function} on {name}: column {own[0][0]} is of type {own[0][1]}, "
                        "defined in this database: the call's arguments are built by the apply session, a superuser, "
                        "where that type's code (a domain's CHECK, a cast to json) would run with its rights; "
                        "the function policy takes tables of pg_catalog's types only")
                types[name] = [r[:2] for r in await query(TYPES_SQL, (call.table.nspname, call.table.relname))]
            sql, params = call_sql(call, types[name])
            rows = await query(sql, params)
            functions.answers[call] = answer(call, rows[0])
            made += 1
