"""The PostgreSQL evaluator of a link's rules (link/sqleval.py, docs/LINKS.md section 8) against
one real PostgreSQL: typed values (text and binary send forms) as parameters, NULL predicates
false, computed columns and row functions, and a session that cannot write, resolves names in
pg_catalog only, times out, and refuses a superuser where the operator named a role."""

from __future__ import annotations

from typing import Iterator

import psycopg
import pytest

from chorus import wire
from chorus.link.rules import RuleError, RuleSet, TableRule, ComputedColumn, RowFunction, route
from chorus.link.sqleval import PgEvaluator
from chorus.testkit.localcluster import PlainPostgres

from conftest import plain_database

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EMP = wire.Table("hr", "emp", (wire.Column("id", "integer"), wire.Column("region", "text"),
                               wire.Column("salary", "numeric"), wire.Column("note", "text")), (0,))


def _int4(n: int) -> wire.Binary:
    return wire.Binary(n.to_bytes(4, "big", signed=True))


def _row(id: int, region: wire.Value, salary: bytes = b"10.5", note: wire.Value = b"x") -> tuple[wire.Value, ...]:
    return (_int4(id), region, salary, note)


@pytest.fixture(scope="module")
def db(plain: PlainPostgres) -> Iterator[str]:
    with plain_database(plain, "link_rules") as dsn:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE SCHEMA hr")
            c.execute("CREATE TABLE hr.victim (x int)")
            c.execute("CREATE FUNCTION hr.evil(int) RETURNS boolean LANGUAGE sql VOLATILE AS "
                      "'INSERT INTO hr.victim VALUES ($1) RETURNING true'")
            c.execute("CREATE FUNCTION hr.mask(r jsonb) RETURNS jsonb LANGUAGE sql IMMUTABLE AS "
                      "$$ SELECT CASE WHEN r->>'region' = 'gone' THEN NULL "
                      "ELSE r || jsonb_build_object('note', upper(r->>'note')) END $$")
            c.execute("CREATE FUNCTION hr.odd(r jsonb) RETURNS jsonb LANGUAGE sql IMMUTABLE AS "
                      "$$ SELECT CASE r->>'region' WHEN 'array' THEN '[1]'::jsonb WHEN 'null' THEN 'null'::jsonb "
                      "ELSE r || jsonb_build_object('id', (r->>'id')::int + 1) END $$")
            c.execute("CREATE FUNCTION public.lookalike(text) RETURNS boolean LANGUAGE sql AS 'SELECT true'")
            c.execute("CREATE TYPE public.mood AS ENUM ('sad', 'ok', 'happy')")
            c.execute("CREATE TABLE hr.feel (id int PRIMARY KEY, m public.mood)")
            with psycopg.connect(plain.dsn, autocommit=True) as p:  # a role a failed run left
                if p.execute("SELECT 1 FROM pg_roles WHERE rolname = 'link_rules_reader'").fetchone():
                    c.execute("DROP OWNED BY link_rules_reader")
                    p.execute("DROP ROLE link_rules_reader")
            c.execute("CREATE ROLE link_rules_reader LOGIN PASSWORD 'rules-reader-pw'")
            c.execute("GRANT USAGE ON SCHEMA hr TO link_rules_reader")
        try:
            yield dsn
        finally:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("DROP OWNED BY link_rules_reader")
                c.execute("DROP ROLE link_rules_reader")


@pytest.fixture
def ev(db: str) -> Iterator[PgEvaluator]:
    e = PgEvaluator(db, timeout_ms=500)
    yield e
    e.close()


def test_predicates_over_typed_values(ev: PgEvaluator) -> None:
    assert ev.predicate(EMP, _row(1, b"eu"), "region = 'eu'")
    assert not ev.predicate(EMP, _row(1, b"us"), "region = 'eu'")
    assert not ev.predicate(EMP, _row(1, None), "region = 'eu'")  # NULL: false
    assert ev.predicate(EMP, _row(7, b"us"), "id > 5 AND salary > 10")  # a binary int4, a numeric
    assert not ev.predicate(EMP, _row(3, b"us"), "id > 5")
    # an unchanged out-of-line value is not a column: a predicate on the others still works
    assert ev.predicate(EMP, (_int4(1), b"eu", b"1", wire.UNCHANGED), "region = 'eu'")
    with pytest.raises(RuleError, match="note"):
        ev.predicate(EMP, (_int4(1), b"eu", b"1", wire.UNCHANGED), "note = 'x'")
    # one prepared statement per (shape, SQL)
    assert len(ev.statements) == 4


def test_computed_columns_and_row_functions(ev: PgEvaluator) -> None:
    assert ev.expression(EMP, _row(4, b"eu", b"2.5"), "salary * id") == b"10.0"
    assert ev.expression(EMP, _row(4, None), "region || 'x'") is None
    assert ev.row_function(EMP, _row(4, b"eu"), "hr.mask") == (_int4(4), b"eu", b"10.5", b"X")
    assert ev.row_function(EMP, _row(4, b"gone"), "hr.mask") is None
    assert ev.row_function(EMP, _row(4, b"null"), "hr.odd") is None  # JSON null drops it too
    with pytest.raises(RuleError, match="returned a jsonb b'array'"):
        ev.row_function(EMP, _row(4, b"array"), "hr.odd")
    with pytest.raises(RuleError, match="changed the row's key"):
        ev.row_function(EMP, _row(4, b"eu"), "hr.odd")
    # the key's values stay as they came (here a binary int4); an unchanged value stays unchanged
    out = ev.row_function(EMP, (_int4(4), b"eu", b"1", wire.UNCHANGED), "hr.mask")
    assert out is not None and out[0] == _int4(4) and isinstance(out[0], wire.Binary) and out[3] is wire.UNCHANGED
    # through route: the pure core with this evaluator
    rules = RuleSet(tables=(TableRule("hr.emp", "region = 'eu'",
                                      (ComputedColumn("k", "numeric", "salary * 2"), RowFunction("hr.mask"))),))
    ws = wire.Writeset(1, 2, 3, (EMP,), (wire.Row("I", 0, (), _row(1, b"eu")), wire.Row("I", 0, (), _row(2, b"us"))),
                       ())
    out = route(rules, ws, ev)
    assert out is not None and [r.new for r in out.rows if isinstance(r, wire.Row)] == [
        (_int4(1), b"eu", b"10.5", b"X", b"21.0")]


def test_a_type_the_origin_named_unqualified(ev: PgEvaluator) -> None:
    """The origin's session had public in its search_path, so its writeset names the enum
    ``mood``: the evaluator casts to ``public.mood``, read from its own catalog (under
    ``search_path = pg_catalog``, ``mood`` alone names nothing)."""
    feel = wire.Table("hr", "feel", (wire.Column("id", "integer"), wire.Column("m", "mood")), (0,))
    assert ev.predicate(feel, (_int4(1), b"happy"), "m > 'sad'")
    assert not ev.predicate(feel, (_int4(2), b"sad"), "m > 'sad'")
    assert ev.expression(feel, (_int4(1), b"ok"), "m::text || '!'") == b"ok!"
    with pytest.raises(RuleError, match="invalid input value for enum"):
        ev.predicate(feel, (_int4(3), b"angry"), "m > 'sad'")
    # a column the table lacks (a computed one) keeps the writeset's type name
    wider = wire.Table("hr", "feel", feel.columns + (wire.Column("k", "integer"),), (0,))
    assert ev.predicate(wider, (_int4(1), b"ok", b"7"), "k = 7")


def test_the_session_cannot_write(ev: PgEvaluator, db: str) -> None:
    with pytest.raises(RuleError, match="read-only transaction"):
        ev.predicate(EMP, _row(1, b"eu"), "hr.evil(id)")
    with pytest.raises(RuleError, match="read-only transaction"):
        ev.expression(EMP, _row(1, b"eu"), "hr.evil(id)::text")
    # a hostile predicate cannot turn the session read-write for the next evaluation either
    with pytest.raises(RuleError):
        ev.predicate(EMP, _row(1, b"eu"), "pg_catalog.set_config('transaction_read_only', 'off', true) = 'off'"
                                          " AND hr.evil(id)")
    ev.predicate(EMP, _row(1, b"eu"), "pg_catalog.set_config('default_transaction_read_only', 'off', false) = 'x'")
    with pytest.raises(RuleError, match="read-only transaction"):
        ev.predicate(EMP, _row(1, b"eu"), "hr.evil(id)")
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM hr.victim").fetchone() == (0,)
    # still usable after the failures
    assert ev.predicate(EMP, _row(1, b"eu"), "region = 'eu'")


def test_names_resolve_in_pg_catalog_and_statements_time_out(ev: PgEvaluator) -> None:
    with pytest.raises(RuleError, match="lookalike"):
        ev.predicate(EMP, _row(1, b"eu"), "lookalike(region)")  # public is not searched
    assert ev.predicate(EMP, _row(1, b"eu"), "public.lookalike(region)")
    with pytest.raises(RuleError, match="statement timeout"):
        ev.predicate(EMP, _row(1, b"eu"), "pg_catalog.pg_sleep(5) IS NOT NULL")


def test_a_configured_role_must_not_be_a_superuser(db: str) -> None:
    superuser = PgEvaluator(db, strict=True)
    with pytest.raises(RuleError, match="superuser"):
        superuser.predicate(EMP, _row(1, b"eu"), "region = 'eu'")
    reader = PgEvaluator(psycopg.conninfo.make_conninfo(db, user="link_rules_reader", password="rules-reader-pw"),
                         strict=True)
    try:
        assert reader.predicate(EMP, _row(1, b"eu"), "region = 'eu'")
        assert reader.row_function(EMP, _row(4, b"eu"), "hr.mask") == (_int4(4), b"eu", b"10.5", b"X")
        with pytest.raises(RuleError, match="read-only transaction|permission denied"):
            reader.predicate(EMP, _row(1, b"eu"), "hr.evil(id)")
    finally:
        reader.close()




def test_the_link_reads_a_rows_values_by_output_function_never_by_a_cast_a_user_defined(db: str) -> None:
    """The apply session (a superuser) reads a row's values for a conflict (settle.row_sql) and a
    copy's range (link.copy.range_sql) as text: through the types' output functions, as the
    capture writes them, never through a cast to text that a role owning a type may define (it
    would run as the superuser)."""
    from chorus.link import copy as lc
    from chorus.link.settle import row_sql
    owner = "link_cast_owner"
    with psycopg.connect(db, autocommit=True) as c:
        if c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (owner,)).fetchone():
            c.execute(f"DROP OWNED BY {owner}")
            c.execute(f"DROP ROLE {owner}")
        c.execute(f"CREATE ROLE {owner}")
        c.execute(f"CREATE SCHEMA castx AUTHORIZATION {owner}")
        c.execute("CREATE TABLE public.cast_ran (who text)")
        c.execute(f"GRANT INSERT ON public.cast_ran TO {owner}")
        c.execute(f"SET ROLE {owner}")
        c.execute("CREATE TYPE castx.pair AS (a int, b int)")
        c.execute("CREATE TYPE castx.color AS ENUM ('red', 'green')")
        for typ in ("pair", "color"):
            c.execute(f"CREATE FUNCTION castx.grab_{typ}(castx.{typ}) RETURNS text LANGUAGE plpgsql AS $$ BEGIN "
                      "BEGIN RESET ROLE; EXCEPTION WHEN OTHERS THEN NULL; END; "
                      "INSERT INTO public.cast_ran VALUES (current_user); RETURN 'x'; END $$")
            c.execute(f"CREATE CAST (castx.{typ} AS text) WITH FUNCTION castx.grab_{typ}(castx.{typ})")
        c.execute("CREATE TABLE castx.t (k castx.color PRIMARY KEY, flag boolean, c char(4), p castx.pair, n int)")
        c.execute("INSERT INTO castx.t VALUES ('red', true, 'ab', ROW(1, NULL), NULL), ('green', false, NULL, NULL, 2)")
        c.execute("RESET ROLE")
        t = wire.Table("castx", "t", (wire.Column("k", "castx.color"), wire.Column("flag", "boolean"),
                                      wire.Column("c", "character(4)"), wire.Column("p", "castx.pair"),
                                      wire.Column("n", "integer")), (0,))
        try:
            assert c.execute(row_sql(t), ("red",)).fetchall() == [("red", "t", "ab  ", "(1,)", None)]
            sql, params = lc.range_sql(t, None, (b"red",))
            assert c.execute(sql, params).fetchall() == [("green", "f", None, None, "2"), ("red", "t", "ab  ", "(1,)", None)]
            assert c.execute("SELECT count(*) FROM public.cast_ran").fetchone() == (0,)
            # the cast is there, and a cast to text would have run it as the superuser
            assert c.execute("SELECT p::text FROM castx.t WHERE n IS NULL").fetchone() == ("x",)
            assert c.execute("SELECT who FROM public.cast_ran").fetchall() == [("postgres",)]
        finally:
            c.execute("DROP TABLE public.cast_ran")
            c.execute("DROP SCHEMA castx CASCADE")
            c.execute(f"DROP ROLE {owner}")
