"""A hostile tenant (docs/ARCHITECTURE.md invariant 10; docs/SECURITY.md): an ordinary LOGIN role with its
own schema tries, on the origin and through every path that runs code on the other nodes, to gain
a privilege, to read what it may not, or to make one node diverge or leave. After each attempt
every node has the same roles with the same attributes, every node is online, and the nodes hold
identical data.

The attacks come from issue 33 and from trying the change as such a role would: temporary
objects shadowing the catalogs the extension reads, operators and functions in the role's
search_path, SET ROLE from code that a replay or an apply runs, triggers and rules enabled to fire
on apply, index expressions, generated columns, domains, defaults, materialized views,
sequences and setval, nested writes and schema changes inside a replicated statement.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from conftest import Cluster, chorus

pytestmark = pytest.mark.integration

ROLE = "mallory"
PASSWORD = "mallory-password-1"
ATTRS = ("rolsuper", "rolinherit", "rolcreaterole", "rolcreatedb", "rolcanlogin", "rolreplication",
         "rolbypassrls")


def _as(cluster: Cluster, i: int, role: str = ROLE, password: str = PASSWORD, **kw: Any) -> psycopg.Connection[Any]:
    params = conninfo_to_dict(cluster.dsn(i))
    params.update(user=role, password=password)
    params.pop("passfile", None)
    kw.setdefault("autocommit", True)
    return psycopg.connect(make_conninfo(**params), **kw)


@pytest.fixture(scope="module", autouse=True)
def tenant(cluster: Cluster) -> Iterator[None]:
    """The tenant, its schema, and a table it may not read."""
    with cluster.connect(0) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS m CASCADE"))
        c.execute(sql.SQL("DO $$ BEGIN CREATE ROLE {} LOGIN; EXCEPTION WHEN duplicate_object THEN END $$").format(
            sql.Identifier(ROLE)))
        c.execute(sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(ROLE), sql.Literal(PASSWORD)))
        c.execute(sql.SQL("CREATE SCHEMA m AUTHORIZATION {}").format(sql.Identifier(ROLE)))
        c.execute("CREATE TABLE IF NOT EXISTS public.sec_secret (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO public.sec_secret VALUES (1, 'the secret') ON CONFLICT DO NOTHING")
        c.execute(sql.SQL("REVOKE ALL ON public.sec_secret FROM PUBLIC, {}").format(sql.Identifier(ROLE)))
    cluster.quiesce()
    yield
    assert_safe(cluster)
    # the tenant's objects go: they would make the nodes differ in later tests' eyes (the
    # CHECKs that fail on one node only are the origin's to check, not a later COPY's)
    with cluster.connect(0) as c:
        c.execute("DROP SCHEMA m CASCADE")
        c.execute("DROP TABLE public.sec_secret")
        for name in [ROLE, *_MADE]:
            c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
            c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
    cluster.quiesce()


_MADE: list[str] = []  # the roles test_names_of_every_kind_replicate made (dropped at the end)


def _role_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT r.rolname, " + ", ".join(f"r.{a}" for a in ATTRS) + ", coalesce(("
        "  SELECT array_agg(g.rolname ORDER BY g.rolname) FROM pg_auth_members am"
        "  JOIN pg_roles g ON g.oid = am.roleid WHERE am.member = r.oid), '{}')"
        " FROM pg_roles r WHERE r.rolname !~ '^pg_' ORDER BY r.rolname").fetchall()


def assert_safe(cluster: Cluster) -> None:
    """Every node online, the same roles with the same attributes and memberships everywhere,
    the tenant an ordinary role, and the same data on every node."""
    for i in range(len(cluster.nodes)):
        assert cluster.status(i)["state"] == "online", cluster.status(i)
    cluster.quiesce()
    roles = []
    for i in range(len(cluster.nodes)):
        with cluster.connect(i) as c:
            roles.append(_role_rows(c))
    assert roles[1:] == roles[:-1], roles
    tenant = [r for r in roles[0] if r[0] == ROLE]
    assert tenant == [(ROLE, False, True, False, False, True, False, False, [])]
    cluster.assert_identical()


def attempt(cluster: Cluster, statements: list[str], i: int = 0) -> list[str]:
    """Run the tenant's statements on node ``i`` in turn; the errors they met (SQLSTATE and
    message), one per failed statement."""
    errors = []
    with _as(cluster, i) as c:
        for s in statements:
            try:
                c.execute(s)
            except psycopg.Error as e:
                errors.append(f"{e.sqlstate} {str(e).splitlines()[0]}")
    return errors


# Code that escalates if it runs with anyone's rights but the tenant's own, and tries every way
# back to the session's user; it never fails (so that the attempt itself succeeds everywhere).
PWN = """
CREATE OR REPLACE FUNCTION m.pwn() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF current_user <> 'mallory' OR session_user <> 'mallory' THEN
    BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN others THEN NULL; END;
    BEGIN SET ROLE postgres; EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN others THEN NULL; END;
    BEGIN RESET ROLE; EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN others THEN NULL; END;
    BEGIN SET SESSION AUTHORIZATION postgres; EXECUTE 'ALTER ROLE mallory SUPERUSER';
    EXCEPTION WHEN others THEN NULL; END;
    BEGIN PERFORM pg_catalog.set_config('role', 'postgres', false); EXECUTE 'GRANT pg_read_all_data TO mallory';
    EXCEPTION WHEN others THEN NULL; END;
  END IF;
  RETURN true;
END $$"""


def test_set_role_to_a_lesser_role_sticks(cluster: Cluster) -> None:
    """A superuser's session that SETs ROLE to the tenant keeps the tenant's rights for what
    follows (the extension's hooks must not undo it): what it creates is the tenant's, on every
    node, and it cannot do what the tenant cannot."""
    with cluster.connect(0) as c:
        c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(ROLE)))
        assert c.execute("SELECT current_user").fetchone() == (ROLE,)
        c.execute("CREATE TABLE m.made_as_role (id int PRIMARY KEY)")
        assert c.execute("SELECT current_user").fetchone() == (ROLE,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT * FROM public.sec_secret")
        c.execute("RESET ROLE")
    cluster.quiesce()
    for i in range(len(cluster.nodes)):
        with cluster.connect(i) as c:
            assert c.execute("SELECT tableowner FROM pg_tables WHERE schemaname = 'm' AND "
                             "tablename = 'made_as_role'").fetchone() == (ROLE,)
    assert_safe(cluster)


def test_temporary_objects_cannot_stand_in_for_the_catalogs(cluster: Cluster) -> None:
    """Issue 33, 1: the event trigger (SECURITY DEFINER) and the functions it calls read the
    catalogs by name; a temporary view of the tenant's named like one must not be what they read."""
    errors = attempt(cluster, [
        PWN,
        "CREATE FUNCTION pg_temp.pwn() RETURNS boolean LANGUAGE sql AS 'SELECT m.pwn()'",
        *(f"CREATE TEMP VIEW {cat} AS SELECT c.* FROM pg_catalog.{cat} c WHERE pg_temp.pwn()"
          for cat in ("pg_class", "pg_namespace", "pg_sequence", "pg_trigger", "pg_depend", "pg_proc",
                      "pg_replication_origin", "pg_event_trigger")),
        "CREATE TEMP TABLE sec_tmp (a int)",
        "CREATE TABLE m.shadowed (id serial PRIMARY KEY, v text)",
        "CREATE SEQUENCE m.shadowed_seq",
        "ALTER TABLE m.shadowed ADD COLUMN w int",
        "INSERT INTO m.shadowed (v) VALUES ('x')",
        "SELECT setval('m.shadowed_seq', 50)",
    ])
    assert errors == []
    assert_safe(cluster)


def test_the_tenants_search_path_redirects_nothing(cluster: Cluster) -> None:
    """Issue 33, 2: operators and functions of the tenant's, first in its search_path, named as
    the ones the extension uses (setval's arithmetic, equality, string functions)."""
    escalate = ("BEGIN IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) "
                "OR current_user <> 'mallory' THEN EXECUTE 'ALTER ROLE mallory SUPERUSER'; END IF; ")
    errors = attempt(cluster, [
        f"CREATE FUNCTION m.minus(bigint, int) RETURNS bigint LANGUAGE plpgsql AS $${escalate}RETURN $1 OPERATOR(pg_catalog.-) $2; END $$",
        "CREATE OPERATOR m.- (LEFTARG = bigint, RIGHTARG = int, FUNCTION = m.minus)",
        f"CREATE FUNCTION m.eq(name, text) RETURNS boolean LANGUAGE plpgsql AS $${escalate}RETURN $1::text OPERATOR(pg_catalog.=) $2; END $$",
        "CREATE OPERATOR m.= (LEFTARG = name, RIGHTARG = text, FUNCTION = m.eq)",
        f"CREATE FUNCTION m.replace(text, text, text) RETURNS text LANGUAGE plpgsql AS $${escalate}RETURN pg_catalog.replace($1, $2, $3); END $$",
        f"CREATE FUNCTION m.quote_literal(text) RETURNS text LANGUAGE plpgsql AS $${escalate}RETURN pg_catalog.quote_literal($1); END $$",
        "SET search_path = m, pg_catalog",
        "CREATE SEQUENCE m.s",
        "SELECT nextval('m.s')",
        "SELECT setval('m.s', 100)",
        "CREATE TABLE m.redirect (id int PRIMARY KEY)",
        "TRUNCATE m.redirect",
    ])
    assert errors == []
    assert_safe(cluster)
    # setval replicated: every node's next value is its own, beyond 100
    values = []
    for i in range(len(cluster.nodes)):
        with cluster.connect(i) as c:
            values.append(c.execute("SELECT nextval('m.s')").fetchone()[0])
    assert all(v > 100 for v in values) and len(set(values)) == len(values)


@pytest.mark.parametrize("block", [False, True], ids=["own", "in_block"])
def test_a_replayed_schema_change_runs_as_its_role(cluster: Cluster, block: bool) -> None:
    """Issue 33, 3: a function a schema change's replay runs (a CHECK validated against the rows,
    a default, a materialized view's query) tries to become the apply session's superuser."""
    suffix = "_b" if block else ""
    ddl = [f"CREATE TABLE m.r{suffix} (id int PRIMARY KEY)",
           f"ALTER TABLE m.r{suffix} ADD CONSTRAINT pwn CHECK (m.pwn())",
           f"ALTER TABLE m.r{suffix} ADD COLUMN d boolean DEFAULT m.pwn()",
           f"CREATE MATERIALIZED VIEW m.mv{suffix} AS SELECT id FROM m.r{suffix} WHERE m.pwn()",
           f"REFRESH MATERIALIZED VIEW m.mv{suffix}"]
    with _as(cluster, 0) as c:
        c.execute(PWN)
        c.execute(f"CREATE TABLE m.r{suffix}_rows (id int PRIMARY KEY)")
        if block:
            with c.transaction():
                for s in ddl:
                    c.execute(s)
        else:
            for s in ddl:
                c.execute(s)
        c.execute(f"INSERT INTO m.r{suffix} VALUES (1), (2)")
    assert_safe(cluster)


@pytest.mark.parametrize("mode", ["ALWAYS", "REPLICA"])
def test_triggers_that_fire_on_apply_must_be_trusted(cluster: Cluster, mode: str) -> None:
    """Issue 33, 4: a table owner's trigger enabled ALWAYS or REPLICA would fire where rows are
    applied; its function must be a superuser's. Once an administrator has taken the function
    over, it fires there with the table owner's rights, not the apply session's. (It notes whose
    rights it has in an unlogged table: each node's own.)"""
    t = f"m.trg_{mode.lower()}"
    errors = attempt(cluster, [
        PWN,
        f"CREATE TABLE {t} (id int PRIMARY KEY)",
        f"CREATE UNLOGGED TABLE {t}_log (cur text, sess text)",
        "CREATE OR REPLACE FUNCTION m.note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM m.pwn(); "
        "EXECUTE format('INSERT INTO %I.%I VALUES (current_user, session_user)', TG_TABLE_SCHEMA, TG_TABLE_NAME || '_log'); "
        "RETURN NULL; END $$",
        f"CREATE TRIGGER note AFTER INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION m.note()",
        f"ALTER TABLE {t} ENABLE {mode} TRIGGER note",
    ])
    assert len(errors) == 1 and errors[0].startswith("42501") and "m.note()" in errors[0], errors
    with cluster.connect(0) as c:
        c.execute("ALTER FUNCTION m.note() OWNER TO postgres")  # reviewed and taken over
    assert attempt(cluster, [f"ALTER TABLE {t} ENABLE {mode} TRIGGER note",
                             f"INSERT INTO {t} (id) VALUES (1)"]) == []
    cluster.quiesce()
    for i in range(1, len(cluster.nodes)):  # where the row was applied
        with cluster.connect(i) as c:
            assert c.execute(f"SELECT cur, sess FROM {t}_log").fetchall() == [(ROLE, "postgres")]
    assert_safe(cluster)
    with cluster.connect(0) as c:
        c.execute(f"ALTER TABLE {t} DISABLE TRIGGER note")
        c.execute("ALTER FUNCTION m.note() OWNER TO mallory")


def test_an_ordinary_trigger_never_fires_on_apply(cluster: Cluster) -> None:
    """A trigger left ENABLE ORIGIN (the default) with the tenant's own function: allowed, and it
    fires only where the tenant writes."""
    assert attempt(cluster, [
        PWN,
        "CREATE TABLE m.trg_origin (id int PRIMARY KEY)",
        "CREATE UNLOGGED TABLE m.trg_origin_log (cur text)",
        "CREATE FUNCTION m.note_origin() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM m.pwn(); "
        "INSERT INTO m.trg_origin_log VALUES (current_user); RETURN NULL; END $$",
        "CREATE TRIGGER note AFTER INSERT ON m.trg_origin FOR EACH ROW EXECUTE FUNCTION m.note_origin()",
        "INSERT INTO m.trg_origin VALUES (1)",
    ]) == []
    cluster.quiesce()
    for i in range(len(cluster.nodes)):
        with cluster.connect(i) as c:
            assert c.execute("SELECT count(*) FROM m.trg_origin_log").fetchone() == ((1,) if i == 0 else (0,))
    assert_safe(cluster)


def test_a_concurrent_index_build_is_replayed_as_its_role(cluster: Cluster) -> None:
    """CREATE INDEX CONCURRENTLY runs on every node in a session of its own: as the role that
    ran it on the origin, restricted (chorus.replay_role), and the index is valid everywhere."""
    assert attempt(cluster, [
        "CREATE TABLE m.cic (id int PRIMARY KEY, v text)",
        "INSERT INTO m.cic SELECT g, 'v' || g FROM generate_series(1, 100) g",
        "CREATE INDEX CONCURRENTLY cic_v ON m.cic (lower(v))",
    ]) == []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        valid = []
        for i in range(len(cluster.nodes)):
            with cluster.connect(i) as c:
                valid.append(c.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('m.cic_v')"
                                       ).fetchone())
        if valid == [(True,)] * len(cluster.nodes):
            break
        time.sleep(0.2)
    assert valid == [(True,)] * len(cluster.nodes)
    assert_safe(cluster)


@pytest.mark.parametrize("what", ["index", "partial_index", "generated", "partition_key", "rule",
                                  "domain_function", "domain_volatile"])
def test_code_that_runs_on_apply_must_be_trusted(cluster: Cluster, what: str) -> None:
    """Issue 33, 5: code the tenant wrote that would run on every node where rows are applied
    (and could behave differently on one of them: fail there alone, and make it leave) is
    refused where the schema change is made."""
    setup = ["CREATE OR REPLACE FUNCTION m.f(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS "
             "$$ BEGIN IF pg_catalog.current_setting('port') = '0' THEN RAISE 'here'; END IF; RETURN $1; END $$",
             f"CREATE TABLE m.code_{what} (id int PRIMARY KEY, v int)"]
    attempt(cluster, setup)
    statement = {
        "index": f"CREATE INDEX ON m.code_{what} (m.f(v))",
        "partial_index": f"CREATE INDEX ON m.code_{what} (v) WHERE m.f(v) > 0",
        "generated": f"ALTER TABLE m.code_{what} ADD COLUMN g int GENERATED ALWAYS AS (m.f(v)) STORED",
        "partition_key": f"CREATE TABLE m.code_{what}_p (id int, v int) PARTITION BY RANGE (m.f(v))",
        "rule": f"CREATE RULE r AS ON INSERT TO m.code_{what} DO ALSO SELECT m.f(NEW.v)",
        "domain_function": "CREATE DOMAIN m.dom_f AS int CHECK (m.f(VALUE) > 0)",
        "domain_volatile": "CREATE DOMAIN m.dom_v AS int CHECK (VALUE > 0 AND pg_catalog.current_setting('port') <> '0')",
    }[what]
    follow = [f"ALTER TABLE m.code_{what} ENABLE ALWAYS RULE r"] if what == "rule" else []
    errors = attempt(cluster, [statement, *follow])
    if what == "domain_volatile":
        assert len(errors) == 1 and errors[0].startswith("0A000") and "not immutable" in errors[0], errors
    elif what == "rule":  # an ordinary rule never fires on apply; enabled ALWAYS it would
        assert len(errors) == 1 and errors[0].startswith("42501"), errors
    else:
        assert len(errors) == 1 and errors[0].startswith("42501") and "not a superuser" in errors[0], errors
    assert attempt(cluster, [f"INSERT INTO m.code_{what} VALUES (1, 1)"]) == []
    assert_safe(cluster)


def test_a_check_that_differs_between_nodes_decides_nothing_on_apply(cluster: Cluster) -> None:
    """Issue 33, 5: rows are not checked again against CHECK constraints where they are
    applied (the origin checked them): a CHECK that fails on one node only cannot make it leave."""
    victim = conninfo_to_dict(cluster.dsn(2))["port"]
    errors = attempt(cluster, [
        "CREATE TABLE m.victim (id int PRIMARY KEY, v int)",
        f"CREATE FUNCTION m.not_there(int) RETURNS boolean LANGUAGE plpgsql AS "
        f"$$ BEGIN RETURN pg_catalog.current_setting('port') <> '{victim}'; END $$",
        "ALTER TABLE m.victim ADD CONSTRAINT picky CHECK (m.not_there(v)) NOT VALID",
        f"ALTER TABLE m.victim ADD CONSTRAINT inline CHECK (CASE WHEN pg_catalog.current_setting('port') = '{victim}' "
        "THEN 1 / (v - v) ELSE 1 END = 1) NOT VALID",
        "INSERT INTO m.victim SELECT g, g FROM generate_series(1, 50) g",
        "UPDATE m.victim SET v = v + 1",
    ])
    assert errors == []
    assert_safe(cluster)


@pytest.mark.parametrize("block", [False, True], ids=["own", "in_block"])
@pytest.mark.parametrize("where", ["victim", "every_other_node"])
def test_user_code_in_a_replay_cannot_choose_which_node_leaves(cluster: Cluster, block: bool, where: str) -> None:
    """Issue 33, 5: a function a schema change's replay runs fails on one chosen node (the
    victim's port) or on every node but the origin (session_user differs there). A schema change
    commits only where every node applied it: it is undone everywhere, its client gets the failing
    node's error with its SQLSTATE, and every node stays."""
    victim = conninfo_to_dict(cluster.dsn(2))["port"]
    suffix = f"{where}_{'b' if block else 'o'}"
    cond = (f"pg_catalog.current_setting('port') = '{victim}'" if where == "victim"
            else "session_user <> current_user")
    attempt(cluster, [
        f"CREATE TABLE m.evict_{suffix} (id int PRIMARY KEY, v int)",
        f"INSERT INTO m.evict_{suffix} SELECT g, g FROM generate_series(1, 10) g",
        f"CREATE FUNCTION m.evict_{suffix}(int) RETURNS boolean LANGUAGE plpgsql AS "
        f"$$ BEGIN IF {cond} THEN RAISE EXCEPTION 'chosen' USING ERRCODE = 'P0002'; END IF; RETURN true; END $$",
    ])
    with _as(cluster, 0) as c:
        with pytest.raises(psycopg.Error) as err:
            if block:
                with c.transaction():
                    c.execute(f"INSERT INTO m.evict_{suffix} VALUES (100, 100)")
                    c.execute(f"ALTER TABLE m.evict_{suffix} ADD CONSTRAINT chosen CHECK (m.evict_{suffix}(v))")
            else:
                c.execute(f"ALTER TABLE m.evict_{suffix} ADD CONSTRAINT chosen CHECK (m.evict_{suffix}(v))")
    assert err.value.sqlstate == "P0002", err.value
    assert "the schema change failed on node" in str(err.value) and "chosen" in str(err.value)
    assert_safe(cluster)
    for i in range(len(cluster.nodes)):
        with cluster.connect(i) as c:
            assert c.execute("SELECT count(*) FROM pg_constraint WHERE conname = 'chosen' "
                             f"AND conrelid = 'm.evict_{suffix}'::regclass").fetchone() == (0,)
            assert c.execute(f"SELECT count(*) FROM m.evict_{suffix}").fetchone() == (10,)


def test_a_replay_that_needs_what_a_restricted_context_refuses_is_undone_everywhere(cluster: Cluster) -> None:
    """A function a replayed CHECK runs creates a temporary table: allowed on the origin, refused
    in the restricted context of a replay (it would outlive the replay in the apply session and
    shadow names there): undone everywhere, with that error."""
    attempt(cluster, ["CREATE TABLE m.tmp_user (id int PRIMARY KEY)", "INSERT INTO m.tmp_user VALUES (1)",
                      "CREATE FUNCTION m.scratch(int) RETURNS boolean LANGUAGE plpgsql AS "
                      "$$ BEGIN CREATE TEMP TABLE IF NOT EXISTS scratch (a int); RETURN true; END $$"])
    errors = attempt(cluster, ["ALTER TABLE m.tmp_user ADD CONSTRAINT s CHECK (m.scratch(id))"])
    assert len(errors) == 1 and errors[0].startswith("42501") and "temporary table" in errors[0], errors
    assert_safe(cluster)


def test_a_check_that_fails_on_one_node_does_not_stop_its_rebuild(cluster: Cluster) -> None:
    """Total recovery loads the donor's rows without running the joiner's CHECK constraints (the
    rows passed them): a tenant's CHECK that fails only on the joiner cannot keep it out."""
    victim = conninfo_to_dict(cluster.dsn(2))["port"]
    assert attempt(cluster, [
        "CREATE TABLE m.rebuilt (id int PRIMARY KEY, v int)",
        "CREATE FUNCTION m.not_here(int) RETURNS boolean LANGUAGE plpgsql AS "
        f"$$ BEGIN IF pg_catalog.current_setting('port') = '{victim}' THEN RAISE 'not here'; END IF; "
        "RETURN true; END $$",
        "ALTER TABLE m.rebuilt ADD CONSTRAINT not_here CHECK (m.not_here(v)) NOT VALID",
        "INSERT INTO m.rebuilt SELECT g, g FROM generate_series(1, 3000) g",
    ]) == []
    cluster.quiesce()
    with psycopg.connect(cluster.dsn(2), autocommit=True,
                         options="-c chorus.capture=off -c chorus.replicate_ddl=off") as c:
        c.execute("TRUNCATE m.rebuilt")  # the node lost the rows, behind Chorus's back
    r = chorus("node", "join", "--total", "--dir", cluster.dir, cluster.nodes[2].name, "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_safe(cluster)
    with cluster.connect(2) as c:
        assert c.execute("SELECT count(*) FROM m.rebuilt").fetchone() == (3000,)
        assert c.execute("SELECT convalidated FROM pg_constraint WHERE conname = 'not_here'").fetchone() == (False,)


def test_code_inside_a_schema_change_may_not_write_or_change_the_schema(cluster: Cluster) -> None:
    """Code that a replicated schema change runs (a CHECK validated against the rows) writing
    rows or making schema changes of its own would do it again on every node replaying the
    change, and may decide differently there: refused on the origin."""
    errors = attempt(cluster, [
        "CREATE TABLE m.inner_t (id int PRIMARY KEY)",
        "INSERT INTO m.inner_t VALUES (1)",
        "CREATE TABLE m.inner_log (x text)",
        "CREATE FUNCTION m.writes(int) RETURNS boolean LANGUAGE plpgsql AS "
        "$$ BEGIN INSERT INTO m.inner_log VALUES (pg_catalog.current_setting('port')); RETURN true; END $$",
        "ALTER TABLE m.inner_t ADD CONSTRAINT w CHECK (m.writes(id))",
        "CREATE FUNCTION m.creates(int) RETURNS boolean LANGUAGE plpgsql AS "
        "$$ BEGIN EXECUTE 'CREATE TABLE m.inner_' || pg_catalog.current_setting('port') || ' ()'; RETURN true; END $$",
        "ALTER TABLE m.inner_t ADD CONSTRAINT c CHECK (m.creates(id))",
        "ALTER TABLE m.inner_t ADD CONSTRAINT s CHECK (id > 0)",
    ])
    assert len(errors) == 2, errors
    assert errors[0].startswith("0A000") and "may not write rows" in errors[0]
    assert errors[1].startswith("0A000") and "may not make a schema change" in errors[1]
    assert_safe(cluster)
    with cluster.connect(2) as c:
        assert c.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'm.inner_t'::regclass "
                         "AND contype = 'c'").fetchall() == [("s",)]


def test_the_tenant_reads_nothing_it_may_not(cluster: Cluster) -> None:
    """Reading the conflicts (whose keys are rows' values) needs pg_read_all_stats; a function
    a replay runs reads with the tenant's rights, not the apply session's."""
    errors = attempt(cluster, [
        "SELECT * FROM chorus.conflicts",
        "SELECT chorus.cluster_info('conflicts 0')",
        "SELECT * FROM public.sec_secret",
        "CREATE TABLE m.peek (id int PRIMARY KEY)",
        "CREATE FUNCTION m.peek_secret() RETURNS boolean LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM v FROM public.sec_secret; RETURN true; EXCEPTION WHEN insufficient_privilege THEN RETURN true; END $$",
        "CREATE MATERIALIZED VIEW m.peek_mv AS SELECT (SELECT count(*) FROM public.sec_secret) AS n",
        "SELECT chorus.apply_writeset(1, 0, '\\x00'::bytea)",
        "SELECT chorus.restart_sequence('m.s'::regclass, 1)",
        "SELECT chorus.spread_sequence('m.s'::regclass)",
        "SELECT chorus.attach('public.sec_secret'::regclass)",
    ])
    assert [e[:5] for e in errors] == ["42501"] * 8, errors
    assert_safe(cluster)


# ---- names as the tenant may choose them, through capture, replay and the views ---------------

NAMES = ['quo"te', "sp ace", "semi;colon", "ünïcödé", "日本語", "a" * 63, "x" * 62 + "é",
         "Mixed Case", "'single'", "back\\slash", "select", "$1", "percent%s"]


def _as_stored(name: str) -> str:
    """The name as PostgreSQL keeps it: at most 63 bytes, cut at a character's boundary."""
    while len(name.encode()) > 63:
        name = name[:-1]
    return name


def _random_names(n: int) -> list[str]:
    rnd = random.Random(33)
    alphabet = "abcXYZ \"';%$\\_-é日"
    out = []
    for _ in range(n):
        name = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 40)))
        while len(name.encode()) > 63:
            name = name[:-1]
        if name.strip():
            out.append(name)
    return out


def test_names_of_every_kind_replicate(cluster: Cluster) -> None:
    """Role, schema, table, column, sequence and index names with quotes, spaces, unicode and
    63-byte limits, through capture, the replay of schema changes (as the role of that name),
    setval and the views."""
    names = list(dict.fromkeys(_as_stored(n) for n in NAMES + _random_names(8)))
    made: list[str] = []
    with cluster.connect(0) as c:
        for k, name in enumerate(names):
            role = sql.Identifier(name)
            c.execute(sql.SQL("DO $$ BEGIN CREATE ROLE {} LOGIN PASSWORD {}; "
                              "EXCEPTION WHEN duplicate_object THEN END $$").format(role, sql.Literal(PASSWORD)))
            c.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(role, role))
            made.append(name)
            _MADE.append(name)
    cluster.quiesce()
    for k, name in enumerate(made):
        ident = sql.Identifier(name)
        tab = sql.Identifier(name, name)
        with _as(cluster, k % len(cluster.nodes), role=name) as c:
            c.execute(sql.SQL("CREATE TABLE {} ({} serial PRIMARY KEY, v text UNIQUE)").format(tab, ident))
            c.execute(sql.SQL("INSERT INTO {} VALUES (DEFAULT, {})").format(tab, sql.Literal(name)))
            c.execute(sql.SQL("CREATE INDEX ON {} (lower(v))").format(tab))
            c.execute(sql.SQL("SELECT setval(pg_get_serial_sequence({}, {}), 1000)").format(
                sql.Literal(sql.Identifier(name, name).as_string(c)), sql.Literal(name)))
            c.execute(sql.SQL("INSERT INTO {} VALUES (DEFAULT, {})").format(tab, sql.Literal(name + "!")))
            assert c.execute("SELECT count(*) FROM chorus.members").fetchone()[0] == len(cluster.nodes)
            assert c.execute("SELECT phase FROM chorus.node").fetchone() == ("online",)
    assert_safe(cluster)
    with cluster.connect(1) as c:
        for name in made:
            assert c.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name, name))).fetchone() == (2,)
