"""The PostgreSQL evaluator of a link's rules (docs/LINKS.md section 8): the row filters,
computed columns and row functions of what a site sends, evaluated on one row at a time in a
session of the sending node's database that cannot write.

- **Read only.** The session has ``default_transaction_read_only = on`` and every evaluation is
  its own ``BEGIN READ ONLY`` transaction, with ``SET LOCAL search_path = pg_catalog, pg_temp``
  (a name a role created elsewhere cannot stand in for a built-in one: the rules' SQL names
  its own functions in full) and ``SET LOCAL statement_timeout``. An expression that tries to
  write (a volatile function doing an INSERT) fails with PostgreSQL's "cannot execute INSERT
  in a read-only transaction", and the link stops there (below).
- **As which role.** The session of ``rules_dsn`` when the operator configures one: its role
  must not be a superuser (checked at each connection: refused otherwise), and should hold no
  more than ``USAGE`` on the schemas and ``EXECUTE`` on the functions the rules call. Without
  ``rules_dsn`` it is the node's own ``[postgres] dsn`` (the coordinator's role), restricted as
  above only: the rules are the operator's, written in the node's configuration.
- **Values.** The row's values are parameters: text values in text form, values that travel in
  their type's binary send form (wire.Binary) in binary form, each cast to its column's type
  (``$1::integer``), so the predicate compares typed values; a column whose value the UPDATE did
  not send (an unchanged out-of-line value) is not among the columns, and SQL naming it fails.
  One prepared statement per (table shape, SQL): the statement's text holds both. The type
  each value is cast to is read from this database's catalog, schema-qualified
  (``public.mood``): the writeset's type names come from the origin session's
  ``format_type_be``, unqualified where that session's ``search_path`` saw the type, and such a
  name would not resolve under ``pg_catalog`` (a column the table lacks, a computed one, keeps
  the writeset's name).
- **Failures.** Anything that goes wrong (a bad predicate, a function raising, a timeout, the
  connection lost) raises :class:`RuleError` with PostgreSQL's message: the sender stops the
  stream at that transaction and says why (link/sender.py); nothing is dropped or sent, and
  the link resumes from the receiver's durable position when it works again (the
  configuration fixed and the coordinator restarted, or the database back).

The SqlEvaluator protocol is synchronous (the pure core stays so): the sender runs the routing
of a record that needs this evaluator in a worker thread (``asyncio.to_thread``), one
evaluation at a time per evaluator (a lock), so the coordinator's event loop never waits on it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional, Sequence

import psycopg
from psycopg import pq

from chorus import wire
from chorus.link.rules import RuleError

log = logging.getLogger("chorus.link.rules")

CONNECT_TIMEOUT_S = 10
_BEGIN = "BEGIN READ ONLY; SET LOCAL search_path = pg_catalog, pg_temp; SET LOCAL statement_timeout = {ms}"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# each column of a table, by its schema's name and its own, and the column's type as a cast names
# it (with its modifier: character varying(10)) and as format_type_be does (without); {0} and {1}
# the placeholders of the two names as the caller's driver writes them ("%s" or "$1")
COLUMN_TYPES_SQL = ("SELECT a.attname::pg_catalog.text, pg_catalog.format_type(a.atttypid, a.atttypmod), "
                    "pg_catalog.format_type(a.atttypid, NULL) FROM pg_catalog.pg_attribute a "
                    "JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) a.attrelid "
                    "JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace "
                    "WHERE n.nspname OPERATOR(pg_catalog.=) {0} AND c.relname OPERATOR(pg_catalog.=) {1} "
                    "AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped")

class PgEvaluator:
    """:class:`~chorus.link.rules.SqlEvaluator` in PostgreSQL (module docstring). ``strict``:
    the role of ``dsn`` must not be a superuser (the operator configured a dedicated one)."""

    def __init__(self, dsn: str, timeout_ms: int = 1000, strict: bool = False, name: str = "") -> None:
        self.dsn = dsn
        self.timeout_ms = timeout_ms
        self.strict = strict
        self.name = name
        self.conn: Optional[psycopg.Connection[Any]] = None
        self.statements: dict[str, bytes] = {}  # statement text -> its prepared name
        # (table, its columns as the writeset names them) -> each column's type, qualified
        self.types: dict[tuple[str, str, tuple[tuple[str, str], ...]], tuple[str, ...]] = {}
        self.lock = threading.Lock()
        self.evaluations = 0
        self.warned = False

    # ---- the protocol ---------------------------------------------------------------------

    def predicate(self, table: wire.Table, values: tuple[wire.Value, ...], predicate: str) -> bool:
        row = self._one(table, values, lambda: f"({predicate}) IS TRUE", f"row filter {predicate!r}")
        return row[0] == b"t"

    def expression(self, table: wire.Table, values: tuple[wire.Value, ...], expression: str) -> wire.Value:
        row = self._one(table, values, lambda: f"(({expression}))::pg_catalog.text", f"computed column {expression!r}")
        return row[0]

    def row_function(self, table: wire.Table, values: tuple[wire.Value, ...],
                     function: str) -> Optional[tuple[wire.Value, ...]]:
        """``function(to_jsonb(row))``: NULL (or JSON null) drops the row change; another
        answer must be an object that keeps the key's values (the receiver finds the row by
        them, and the writeset's keys name them), read back column by column as text (a column
        it lacks is NULL)."""
        present = [i for i, v in enumerate(values) if not isinstance(v, wire.Unchanged)]
        key = [table.columns[i].name for i in table.identity] or [c.name for c in table.columns]

        def select() -> str:
            same = " AND ".join(f"(r OPERATOR(pg_catalog.->) {_literal(k)}) OPERATOR(pg_catalog.=) "
                                f"(o OPERATOR(pg_catalog.->) {_literal(k)})" for k in key)
            out = "".join(f", r OPERATOR(pg_catalog.->>) {_literal(table.columns[i].name)}" for i in present)
            return (f"COALESCE(pg_catalog.jsonb_typeof(r), 'null'), ({same}) IS TRUE{out} "
                    f"FROM (SELECT {function}(o) AS r, o FROM (SELECT pg_catalog.to_jsonb(t) AS o")
        row = self._one(table, values, select, f"row function {function}", wrap=") u) s")
        what = row[0]
        if what == b"null":
            return None
        if what != b"object":
            raise RuleError(f"row function {function} on {table.qualified} returned a jsonb {what!r} "
                            "(an object, or NULL to drop the row change)")
        if row[1] != b"t":
            raise RuleError(f"row function {function} on {table.qualified} changed the row's key "
                            f"({', '.join(key)}): the peer finds the row by it")
        out: list[wire.Value] = list(values)
        for i, v in zip(present, row[2:]):
            if i not in table.identity:  # the key's values stay as they came (the same, checked)
                out[i] = v
        return tuple(out)

    # ---- the session ----------------------------------------------------------------------

    def close(self) -> None:
        with self.lock:
            self._drop()

    def _drop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg.Error:
                pass
        self.conn = None
        self.statements.clear()
        self.types.clear()

    def _connect(self) -> psycopg.Connection[Any]:
        if self.conn is not None and not self.conn.closed and self.conn.pgconn.status == pq.ConnStatus.OK:
            return self.conn
        self._drop()
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                   application_name=f"chorus link rules {self.name}"[:63])
        except psycopg.Error as e:
            raise RuleError(f"cannot connect to evaluate the link's rules: {str(e).strip()}") from e
        try:
            conn.execute("SET search_path = pg_catalog, pg_temp")
            conn.execute("SET default_transaction_read_only = on")
            # values pass in the database's encoding, as the writeset holds them
            conn.execute("SELECT pg_catalog.set_config('client_encoding', "
                         "pg_catalog.current_setting('server_encoding'), false)")
            row = conn.execute("SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user"
                               ).fetchone()
        except psycopg.Error as e:
            conn.close()
            raise RuleError(f"cannot prepare the session evaluating the link's rules: {str(e).strip()}") from e
        if row is not None and row[1] and self.strict:
            conn.close()
            raise RuleError(f"rules_dsn connects as {row[0]}, a superuser: the link's rules are evaluated as a role "
                            "with no more rights than they need")
        if row is not None and row[1] and not self.warned:
            self.warned = True
            log.warning("link %s: its rules are evaluated as %s, a superuser, restricted only by a read-only session; "
                        "rules_dsn can name a role with no more rights than the rules need", self.name, row[0])
        self.conn = conn
        return conn

    def _one(self, table: wire.Table, values: tuple[wire.Value, ...], select: Any, what: str,
             wrap: str = "") -> Sequence[Optional[bytes]]:
        """The one row of ``SELECT <select()> FROM (VALUES (the row)) AS t(columns)``, its values'
        text; RuleError naming ``what`` if it fails."""
        cols = [i for i, v in enumerate(values) if not isinstance(v, wire.Unchanged)]
        names = ", ".join(_ident(table.columns[i].name) for i in cols)
        params: Any = [None if (v := values[i]) is None else bytes(v) for i in cols]
        formats = [1 if isinstance(values[i], wire.Binary) else 0 for i in cols]
        with self.lock:
            conn = self._connect()
            pg = conn.pgconn
            try:
                types = self._types(pg, table, what)
                shape = ", ".join(f"${n}::{types[i]}" for n, i in enumerate(cols, 1))
                text = f"SELECT {select()} FROM (VALUES ({shape})) AS t({names})" + wrap
                res = pg.exec_(_BEGIN.format(ms=int(self.timeout_ms)).encode())
                self._ok(res, what, table)
                name = self.statements.get(text)
                if name is None:
                    name = f"chorus_rule_{len(self.statements) + 1}".encode()
                    self._ok(pg.prepare(name, text.encode("utf-8")), what, table)
                    self.statements[text] = name
                res = pg.exec_prepared(name, params, formats, 0)
                self._ok(res, what, table)
                if res.ntuples != 1:
                    raise RuleError(f"{what} on {table.qualified}: {res.ntuples} rows")
                row = [res.get_value(0, c) for c in range(res.nfields)]
                self._ok(pg.exec_(b"COMMIT"), what, table)
                self.evaluations += 1
                return row
            except (RuleError, psycopg.Error) as e:
                if pg.status == pq.ConnStatus.OK:
                    pg.exec_(b"ROLLBACK")
                else:
                    self._drop()
                if isinstance(e, RuleError):
                    raise
                raise RuleError(f"{what} on {table.qualified} failed: {str(e).strip()}") from e

    def _types(self, pg: pq.abc.PGconn, table: wire.Table, what: str) -> tuple[str, ...]:
        """Each column's type as this database names it under ``search_path = pg_catalog``
        (qualified unless built in), by the table's name and the column's; a column it does not
        find keeps the writeset's name. Read once per table shape (a type changed by ALTER TABLE
        changes the writeset's names too, and so the key)."""
        key = (table.nspname, table.relname, tuple((c.name, c.typname) for c in table.columns))
        got = self.types.get(key)
        if got is not None:
            return got
        res = pg.exec_params(COLUMN_TYPES_SQL.format("$1", "$2").encode(),
                             [wire.name_bytes(table.nspname), wire.name_bytes(table.relname)], None, [0, 0], 0)
        self._ok(res, what, table)
        found = {wire.name_str(bytes(res.get_value(r, 0) or b"")): wire.name_str(bytes(res.get_value(r, 2) or b""))
                 for r in range(res.ntuples)}
        got = tuple(found.get(c.name, c.typname) for c in table.columns)
        self.types[key] = got
        return got

    def _ok(self, res: pq.abc.PGresult, what: str, table: wire.Table) -> None:
        if res.status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            return
        message = bytes(res.error_message).decode("utf-8", "replace")
        raise RuleError(f"{what} on {table.qualified} failed: {message.strip()}")
