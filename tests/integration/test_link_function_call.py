"""The call of a link's conflict function (docs/LINKS.md section 7.1, policy ``function``) against
one PostgreSQL with the extension, as the apply of a link writeset makes it
(link/funcall.py, ``chorus.link_conflict_call``): both versions in canonical form, whether they
came as text or binary; the answer read back through the table's row type; and a hostile
ordinary role's function: it runs as that role in a restricted security context, read-only,
with search_path pg_catalog, cannot SET ROLE or write (not even a table its owner may write),
and is refused unless IMMUTABLE, not SECURITY DEFINER, not a superuser's, with the signature."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator, Optional, Sequence

import psycopg
import pytest

from chorus import wire
from chorus.link.events import Version
from chorus.link.funcall import FunctionCall, FunctionCalls, FunctionError, decide_calls
from chorus.nodedb import PIN_SEARCH_PATH
from chorus.testkit.localcluster import PlainPostgres

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ITEMS = wire.Table("app", "items", (wire.Column("id", "integer"), wire.Column("v", "text"),
                                    wire.Column("n", "integer")), (0,))
SIG = "regclass, jsonb, text, jsonb, text, jsonb, jsonb"
ARGS = "t regclass, a jsonb, a_site text, b jsonb, b_site text, am jsonb, bm jsonb"


def _int4(n: int) -> wire.Binary:
    return wire.Binary(n.to_bytes(4, "big", signed=True))


@pytest.fixture(scope="module")
def server(chorus_postgres: PlainPostgres) -> PlainPostgres:
    """The session's PostgreSQL with the extension (conftest.chorus_postgres), this file's tables
    and functions in its schema app."""
    pg = chorus_postgres
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute("SET chorus.capture = off")  # no coordinator: nothing is replicated
        c.execute("CREATE ROLE merger NOLOGIN")
        c.execute("CREATE TABLE app.items (id int PRIMARY KEY, v text, n int)")
        c.execute("CREATE TABLE app.mine (x text)")  # a table the function's owner may write
        c.execute("CREATE TABLE app.secret (x text)")  # one it may not read or write
        c.execute("INSERT INTO app.secret VALUES ('s3cret')")
        c.execute("GRANT USAGE ON SCHEMA app TO merger")
        c.execute("GRANT INSERT, SELECT ON app.mine TO merger")
        # merge: v joined in canonical order, n added; whoever's row is absent gives the other
        fn(c, "merge", "sql", "SELECT CASE WHEN a IS NULL OR b IS NULL THEN COALESCE(a, b) ELSE "
           "a || jsonb_build_object('v', (a->>'v') || '+' || (b->>'v') || '@' || a_site, "
           "'n', (a->>'n')::int + (b->>'n')::int) END")
        fn(c, "first", "sql", "SELECT a")
        fn(c, "second", "sql", "SELECT b")
        fn(c, "gone", "sql", "SELECT NULL::jsonb")
        fn(c, "jnull", "sql", "SELECT 'null'::jsonb")
        fn(c, "arr", "sql", "SELECT '[1]'::jsonb")
        fn(c, "extra", "sql", "SELECT a || '{\"color\": \"red\"}'")
        fn(c, "lacking", "sql", "SELECT a - 'n'")
        fn(c, "badtype", "sql", "SELECT a || '{\"n\": \"many\"}'")
        fn(c, "whoami", "sql", "SELECT a || jsonb_build_object('v', current_user || ' ' || "
           "current_setting('search_path'))")
        fn(c, "boom", "plpgsql", "BEGIN RAISE EXCEPTION 'no merge for %', a->>'id'; END")
        # hostile: each tries to gain what its owner has not, or to write at all
        c.execute("CREATE FUNCTION app.put_mine(text) RETURNS int LANGUAGE sql VOLATILE AS "
                  "'INSERT INTO app.mine VALUES ($1) RETURNING 1'")
        c.execute("CREATE FUNCTION app.put_secret(text) RETURNS int LANGUAGE sql VOLATILE AS "
                  "'INSERT INTO app.secret VALUES ($1) RETURNING 1'")
        c.execute("CREATE FUNCTION app.peek() RETURNS text LANGUAGE sql VOLATILE AS "
                  "'SELECT pg_catalog.string_agg(x, '','') FROM app.secret'")
        c.execute("ALTER FUNCTION app.put_mine(text) OWNER TO merger")
        c.execute("ALTER FUNCTION app.put_secret(text) OWNER TO merger")
        c.execute("ALTER FUNCTION app.peek() OWNER TO merger")
        fn(c, "writes_own", "sql", "SELECT a || jsonb_build_object('n', app.put_mine('x'))")
        fn(c, "writes_secret", "sql", "SELECT a || jsonb_build_object('n', app.put_secret('x'))")
        fn(c, "reads_secret", "sql", "SELECT a || jsonb_build_object('v', app.peek())")
        fn(c, "setrole", "plpgsql", "BEGIN PERFORM pg_catalog.set_config('role', 'postgres', false); "
           "RETURN a; END")
        c.execute("CREATE FUNCTION app.become() RETURNS int LANGUAGE plpgsql VOLATILE AS "
                  "'BEGIN SET SESSION AUTHORIZATION postgres; RETURN 1; END'")
        c.execute("ALTER FUNCTION app.become() OWNER TO merger")
        fn(c, "sessauth", "sql", "SELECT a || jsonb_build_object('n', app.become())")
        c.execute("CREATE FUNCTION app.nap() RETURNS int LANGUAGE sql VOLATILE AS "
                  "'SELECT 1 FROM pg_catalog.pg_sleep(30)'")
        c.execute("ALTER FUNCTION app.nap() OWNER TO merger")
        fn(c, "sleeps", "sql", "SELECT a || jsonb_build_object('n', app.nap())")
        fn(c, "stable", "sql", "SELECT a", volatility="STABLE")
        fn(c, "definer", "sql", "SELECT a", extra="SECURITY DEFINER")
        fn(c, "su", "sql", "SELECT a", owner="postgres")
        c.execute("CREATE FUNCTION app.shape(t regclass, a jsonb) RETURNS jsonb LANGUAGE sql IMMUTABLE "
                  "AS 'SELECT a'")
        c.execute("ALTER FUNCTION app.shape(regclass, jsonb) OWNER TO merger")
    return pg


def fn(c: psycopg.Connection[Any], name: str, lang: str, body: str, volatility: str = "IMMUTABLE",
       extra: str = "", owner: str = "merger") -> None:
    c.execute(f"CREATE FUNCTION app.{name}({ARGS}) RETURNS jsonb LANGUAGE {lang} {volatility} {extra} "
              f"AS $f${body}$f$")
    c.execute(f"ALTER FUNCTION app.{name}({SIG}) OWNER TO {owner}")


@pytest.fixture
def apply(server: PlainPostgres) -> Iterator[psycopg.Connection[Any]]:
    """A session set as the coordinator's apply session is (commit/applier.py), a superuser's."""
    with psycopg.connect(server.dsn, autocommit=True) as c:
        c.execute(PIN_SEARCH_PATH)
        c.execute("SET chorus.capture = off")
        for setting in ("datestyle = 'ISO'", "intervalstyle = 'postgres'", "timezone = 'UTC'",
                        "extra_float_digits = 3", "bytea_output = 'hex'"):
            c.execute("SET " + setting)
        yield c


def call(c: psycopg.Connection[Any], name: str, a: Optional[Sequence[wire.Value]],
         b: Optional[Sequence[wire.Value]], timeout_ms: int = 2000) -> Optional[tuple[wire.Value, ...]]:
    """What the apply makes of function app.NAME for east's version ``a`` (first: the arbiter's)
    and west's ``b``, in a transaction, as the pipeline makes it (funcall.decide_calls)."""
    first = Version("east", 7, 0, None if a is None else tuple(a))
    second = Version("west", 9, 0, None if b is None else tuple(b))
    fc = FunctionCall(f"app.{name}", ITEMS, first, second)
    functions = FunctionCalls()

    async def query(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return c.execute(sql, params).fetchall()
    with c.transaction():
        assert asyncio.run(decide_calls(lambda: [] if fc in functions.answers else [fc], functions, query,
                                        timeout_ms)) == 1
        # the apply's own statements run under the session's statement_timeout again
        assert c.execute("SELECT current_setting('statement_timeout')").fetchone() == ("0",)
    return functions.answers[fc]


def test_versions_are_passed_canonically_and_the_answer_read_back(apply: psycopg.Connection[Any]) -> None:
    a = (_int4(1), b"east", _int4(1))  # as the peer's writeset carries them: integers in binary form
    b = (b"1", b"west", b"2")  # as the apply reads a local row: text
    assert call(apply, "merge", a, b) == (b"1", b"east+west@east", b"3")
    # the same versions from the other site's side: the same texts, the same merged row
    assert call(apply, "merge", (b"1", b"east", b"1"), (_int4(1), b"west", _int4(2))) == (b"1", b"east+west@east",
                                                                                          b"3")
    # an answer that is one of the versions is that version's own values, whatever form they came in
    assert call(apply, "first", a, b) is a
    assert call(apply, "second", a, b) is b
    assert call(apply, "merge", None, b) is b  # a side where the row is absent
    assert call(apply, "gone", a, b) is None
    assert call(apply, "jnull", a, b) is None


def test_the_function_runs_as_its_owner_with_search_path_pg_catalog(apply: psycopg.Connection[Any]) -> None:
    assert call(apply, "whoami", (b"1", b"x", b"1"), (b"1", b"y", b"2")) == (b"1", b"merger pg_catalog", b"1")
    # the session's own user and search_path are back afterwards
    assert apply.execute("SELECT current_user, current_setting('search_path')").fetchone() == (
        "postgres", "pg_catalog, pg_temp")


@pytest.mark.parametrize("name,error", [
    ("arr", "answered a JSON array"),
    ("extra", "column\\(s\\) the table lacks: color"),
    ("lacking", "without column\\(s\\) n"),
])
def test_an_unusable_answer_fails(apply: psycopg.Connection[Any], name: str, error: str) -> None:
    with pytest.raises(FunctionError, match=error):
        call(apply, name, (b"1", b"x", b"1"), (b"1", b"y", b"2"))


def test_a_value_of_the_wrong_type_or_a_function_raising_fails(apply: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        call(apply, "badtype", (b"1", b"x", b"1"), (b"1", b"y", b"2"))
    with pytest.raises(psycopg.errors.RaiseException, match="no merge for 1"):
        call(apply, "boom", (b"1", b"x", b"1"), (b"1", b"y", b"2"))
    with pytest.raises(psycopg.errors.UndefinedFunction):
        call(apply, "nosuch", (b"1", b"x", b"1"), (b"1", b"y", b"2"))


def test_a_function_that_does_not_return_is_cancelled_by_its_timeout(apply: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
        call(apply, "sleeps", (b"1", b"x", b"1"), (b"1", b"y", b"2"), timeout_ms=300)
    assert apply.execute("SELECT current_setting('statement_timeout')").fetchone() == ("0",)


def test_an_unchanged_value_that_was_not_sent_is_refused(apply: psycopg.Connection[Any]) -> None:
    with pytest.raises(FunctionError, match="lacks the value of column v"):
        call(apply, "merge", (b"1", wire.UNCHANGED, b"1"), (b"1", b"y", b"2"))


@pytest.mark.parametrize("name,error", [
    ("writes_own", "read-only transaction"),  # even a table its owner may write
    ("writes_secret", "read-only transaction"),
    ("reads_secret", "permission denied for table secret"),  # the owner's rights, not the session's
    ("setrole", "cannot set parameter \"role\" within security-"),
    ("sessauth", "cannot set parameter \"session_authorization\" within security-"),
    ("stable", "is not IMMUTABLE"),
    ("definer", "is SECURITY DEFINER"),
    ("su", "is owned by superuser"),
])
def test_a_hostile_function_gains_nothing(server: PlainPostgres, apply: psycopg.Connection[Any], name: str,
                                          error: str) -> None:
    with pytest.raises(psycopg.Error, match=error):
        call(apply, name, (b"1", b"x", b"1"), (b"1", b"y", b"2"))
    with psycopg.connect(server.dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM app.mine").fetchone() == (0,)
        assert c.execute("SELECT x FROM app.secret").fetchall() == [("s3cret",)]
        assert c.execute("SELECT current_user").fetchone() == ("postgres",)
    assert apply.execute("SELECT current_user, pg_catalog.current_setting('transaction_read_only')").fetchone() == (
        "postgres", "off")


def test_the_call_checks_the_signature_and_is_the_superusers_alone(server: PlainPostgres,
                                                                 apply: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.WrongObjectType, match="wrong signature"):
        apply.execute("SELECT chorus.link_conflict_call('app.shape(regclass, jsonb)'::regprocedure, "
                      "'app.items'::regclass, '{}', 'east', '{}', 'west', '{}', '{}')")
    with psycopg.connect(server.dsn, autocommit=True) as c:
        c.execute("SET chorus.capture = off")
        c.execute("CREATE ROLE caller LOGIN PASSWORD 'caller-pw-1234'")
        c.execute("GRANT merger TO caller")
    try:
        with psycopg.connect(server.dsn, user="caller", password="caller-pw-1234", autocommit=True) as c:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(f"SELECT chorus.link_conflict_call('app.merge({SIG})'::regprocedure, "
                          "'app.items'::regclass, '{}', 'east', '{}', 'west', '{}', '{}')")
    finally:
        with psycopg.connect(server.dsn, autocommit=True) as c:
            c.execute("SET chorus.capture = off")
            c.execute("DROP ROLE caller")


def test_a_types_code_a_role_wrote_runs_as_the_tables_owner_never_as_the_apply_session(
        apply: psycopg.Connection[Any]) -> None:
    """A domain's CHECK and a cast to json a role defined run while the call's arguments are
    built and its answer read back: as the table's owner (as the apply of the row would), in a
    restricted security context, read-only, never as the apply session's superuser. Code that
    tries to write, to become the superuser or to gain the superuser's rights fails the call,
    and the link stops there, visibly; harmless code of the same types lets the call decide."""
    c = apply
    c.execute("CREATE ROLE tabowner NOLOGIN")
    c.execute("GRANT USAGE, CREATE ON SCHEMA app TO tabowner")
    c.execute("CREATE TABLE app.ran (who text)")
    c.execute("GRANT INSERT ON app.ran TO tabowner")
    for body, name in (("BEGIN RETURN $1 >= 0; END", "fine"),
                       ("BEGIN INSERT INTO app.ran VALUES (current_user); RETURN true; END", "writes"),
                       ("BEGIN RESET ROLE; ALTER ROLE tabowner SUPERUSER; RETURN true; END", "escalates"),
                       ("BEGIN PERFORM pg_catalog.set_config('role', 'postgres', false); RETURN true; END", "setrole")):
        c.execute(f"CREATE FUNCTION app.check_{name}(int) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $f${body}$f$")
        c.execute(f"ALTER FUNCTION app.check_{name}(int) OWNER TO tabowner")
    c.execute("CREATE TYPE app.mood AS ENUM ('calm', 'angry')")
    c.execute("ALTER TYPE app.mood OWNER TO tabowner")
    # the value itself where it runs as the table's owner, else a text that is no mood (the call fails)
    c.execute("CREATE FUNCTION app.mood_json(app.mood) RETURNS json LANGUAGE plpgsql IMMUTABLE AS "
              "$f$BEGIN RETURN pg_catalog.to_json(CASE WHEN current_user = 'tabowner' THEN $1::text "
              "ELSE 'as ' || current_user END); END$f$")
    c.execute("ALTER FUNCTION app.mood_json(app.mood) OWNER TO tabowner")
    c.execute("SET ROLE tabowner")
    c.execute("CREATE CAST (app.mood AS json) WITH FUNCTION app.mood_json(app.mood)")
    c.execute("RESET ROLE")
    try:
        for name in ("fine", "writes", "escalates", "setrole"):
            c.execute(f"CREATE DOMAIN app.watched_{name} AS int CHECK (app.check_{name}(VALUE))")
            c.execute(f"ALTER DOMAIN app.watched_{name} OWNER TO tabowner")
            c.execute(f"CREATE TABLE app.counted_{name} (id int PRIMARY KEY, v app.mood, n app.watched_{name})")
            c.execute(f"ALTER TABLE app.counted_{name} OWNER TO tabowner")

        first = (b"1", b"calm", _int4(1))

        def decide(name: str) -> Optional[tuple[wire.Value, ...]]:
            table = wire.Table("app", f"counted_{name}", (wire.Column("id", "integer"), wire.Column("v", "app.mood"),
                                                          wire.Column("n", f"app.watched_{name}")), (0,))
            fc = FunctionCall("app.first", table, Version("east", 7, 0, first),
                              Version("west", 9, 0, (b"1", b"angry", b"2")))
            functions = FunctionCalls()

            async def query(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                return c.execute(sql, params).fetchall()
            with c.transaction():
                asyncio.run(decide_calls(lambda: [] if fc in functions.answers else [fc], functions, query, 2000))
            return functions.answers[fc]

        # the cast to json and the domain's CHECK ran as the table's owner: the first version came back
        assert decide("fine") is first
        for name, error in (("writes", "read-only transaction"),
                            ("escalates", "cannot set parameter \"role\" within security-restricted operation"
                                          "|RESET ROLE|cannot .* security-restricted"),
                            ("setrole", "cannot set parameter \"role\" within security-")):
            with pytest.raises(psycopg.Error, match=error):
                decide(name)
        assert c.execute("SELECT count(*) FROM app.ran").fetchone() == (0,)
        assert c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'tabowner'").fetchone() == (False,)
        assert c.execute("SELECT current_user, pg_catalog.current_setting('transaction_read_only')").fetchone() == (
            "postgres", "off")
    finally:
        for name in ("fine", "writes", "escalates", "setrole"):
            c.execute(f"DROP TABLE IF EXISTS app.counted_{name}")
            c.execute(f"DROP DOMAIN IF EXISTS app.watched_{name}")
            c.execute(f"DROP FUNCTION IF EXISTS app.check_{name}(int)")
        c.execute("DROP CAST IF EXISTS (app.mood AS json)")
        c.execute("DROP FUNCTION IF EXISTS app.mood_json(app.mood)")
        c.execute("DROP TYPE IF EXISTS app.mood")
        c.execute("DROP TABLE app.ran")
        c.execute("REVOKE ALL ON SCHEMA app FROM tabowner")
        c.execute("DROP ROLE tabowner")
