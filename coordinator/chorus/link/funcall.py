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

Everything of a call that can run a role's code runs as the table's owner, in a restricted
security context, read-only, ``search_path = pg_catalog`` (``chorus.link_conflict_eval``, as the
apply of the row runs as that owner): the values' input and receive functions, a domain's
``CHECK``, a cast to ``json`` a role defined, the answer read back through the row type. The
apply session, a superuser, builds nothing of it itself (docs/LINKS.md section 7.1).

Both versions are passed in the canonical order (the arbiter's first) and in a canonical form:
each version's values made values of its column's type and turned into ``jsonb`` by PostgreSQL
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

from chorus import wire
from chorus.link import position as lp
from chorus.link.events import Version
from chorus.link.sqleval import COLUMN_TYPES_SQL

ARGUMENTS = ("pg_catalog.regclass, pg_catalog.jsonb, pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, "
             "pg_catalog.jsonb, pg_catalog.jsonb")

# the columns of a table and their types, as casts name them (the first two of each row)
TYPES_SQL = COLUMN_TYPES_SQL.format("%s", "%s")


class FunctionError(ValueError):
    """A conflict function's call that cannot be made or whose answer cannot be used."""


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
    (:data:`TYPES_SQL`): ``chorus.link_conflict_eval`` of two statements, each run as the table's
    owner, restricted, read-only (everything of them that can run a role's code, the values'
    types, their casts to json, a domain's CHECK, runs with that owner's rights, as the apply of
    the row would): one builds the function's arguments (the two versions as jsonb from the
    values, in their text or binary form, the sites, the metadata); after the call the other
    reads the answer back. It returns the answer's ``jsonb_typeof``, its keys (a JSON array),
    then the text of each column of the first version, the second, and the answer (through the
    table's row type)."""
    table = call.table
    typ = {str(n): str(t) for n, t in types}
    for c in table.columns:
        if c.name not in typ:
            raise FunctionError(f"conflict function {call.function}: column {c.name} of the peer's "
                                f"{table.qualified} is not a column of the table here")
    names: list[str] = []  # each parameter's type, args and binary its value and form
    args: list[Optional[bytes]] = []
    binary: list[bool] = []

    def param(type_name: str, value: Optional[bytes], is_binary: bool = False) -> str:
        names.append(type_name)
        args.append(value)
        binary.append(is_binary)
        return f"${len(args)}"

    def text(v: str) -> str:
        return param("pg_catalog.text", v.encode("utf-8", "surrogateescape"))

    def row(v: Version) -> str:
        _check(call, v)
        present = param("pg_catalog.bool", b"t" if v.values is not None else b"f")
        parts = []
        for i, c in enumerate(table.columns):
            x = None if v.values is None else v.values[i]
            name = text(c.name)
            value = param(typ[c.name], None if x is None else bytes(x), isinstance(x, wire.Binary))
            parts.append(f"{name}, {value}")
        return f"CASE WHEN {present} THEN pg_catalog.jsonb_build_object({', '.join(parts)}) END"

    a, b = row(call.first), row(call.second)
    build = (f"SELECT {a}, {text(call.first.site)}, {b}, {text(call.second.site)}, "
             f"{param('pg_catalog.jsonb', _meta(call.first).encode())}, "
             f"{param('pg_catalog.jsonb', _meta(call.second).encode())}")
    cols = [wire.quote_ident(c.name) for c in table.columns]
    is_object = "pg_catalog.jsonb_typeof($3) OPERATOR(pg_catalog.=) 'object'"
    outs = ", ".join(wire.text_of(f"{alias}.{c}") for alias in ("pa", "pb", "pr") for c in cols)
    read = (f"SELECT pg_catalog.jsonb_typeof($3), CASE WHEN {is_object} THEN "
            "(SELECT pg_catalog.jsonb_agg(k) FROM pg_catalog.jsonb_object_keys($3) AS k)::pg_catalog.text END, "
            + outs + " FROM "
            f"pg_catalog.jsonb_populate_record(NULL::{table.qualified}, $1) AS pa, "
            f"pg_catalog.jsonb_populate_record(NULL::{table.qualified}, $2) AS pb, "
            f"pg_catalog.jsonb_populate_record(NULL::{table.qualified}, CASE WHEN {is_object} THEN $3 END) AS pr")
    sql = ("SELECT chorus.link_conflict_eval(%s::pg_catalog.regprocedure, %s::pg_catalog.regclass, %s::pg_catalog.text, "
           "%s::pg_catalog.text, %s::pg_catalog.text[]::pg_catalog.regtype[], %s::pg_catalog.bytea[], "
           "%s::pg_catalog.bool[])")
    return sql, [f"{call.function}({ARGUMENTS})", table.qualified, build, read, names, args, binary]


def result_row(result: Sequence[Optional[str]]) -> list[Any]:
    """The row :func:`answer` reads, from ``chorus.link_conflict_eval``'s texts."""
    keys = result[1]
    return [result[0], None if keys is None else json.loads(keys), *result[2:]]


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
                types[name] = [r[:2] for r in await query(TYPES_SQL, (call.table.nspname, call.table.relname))]
            sql, params = call_sql(call, types[name])
            rows = await query(sql, params)
            functions.answers[call] = answer(call, result_row(rows[0][0]))
            made += 1
