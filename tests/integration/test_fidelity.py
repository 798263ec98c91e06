"""Every node holds exactly the origin's data and schema, whatever the session does (issue 18).

Each case is SQL a client runs through node n1 with psql, under several combinations of session
settings; then the fidelity harness (chorus/testkit/fidelity.py) waits until the cluster is quiescent and
compares every node's schema (pg_dump, owners and privileges included), roles and the content of
every table read under fixed settings, failing with the first difference. Each case failed on the
writeset format 1 (values printed under the writer's settings, schema changes replayed as bare text).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time

import psycopg
import pytest

from chorus.testkit import fidelity
from conftest import Cluster, extra_cluster

pytestmark = pytest.mark.integration

# Session settings a client may have: each value case runs under every one.
SETTINGS = {
    "sql-dmy-kolkata": ("datestyle = 'SQL, DMY'", "timezone = 'Asia/Kolkata'", "intervalstyle = sql_standard",
                        "extra_float_digits = 0", "bytea_output = escape"),
    "postgres-la": ("datestyle = 'Postgres, MDY'", "timezone = 'America/Los_Angeles'",
                    "intervalstyle = postgres_verbose", "extra_float_digits = -3"),
    "german-chatham": ("datestyle = 'German'", "timezone = 'Pacific/Chatham'", "intervalstyle = iso_8601",
                       "lc_monetary = 'C'"),
}

# Values written under the session's settings: they must mean the same on every node.
VALUES = """
CREATE TABLE vals (id int PRIMARY KEY, d date, ts timestamp, tz timestamptz, iv interval, f8 float8, f4 real,
                   b bytea, m money, n numeric, t text, a date[], tr tstzrange, r regclass, j jsonb,
                   c_old timestamptz);
INSERT INTO vals VALUES (1, '03/04/2020', '03/04/2020 10:11:12', '2020-06-01 12:00:00', '-1 day -2 hours',
    0.1::float8 * 3, 1.1, '\\x00ff', 12.34, 1.50, E'tab\\there', '{03/04/2020}',
    '[2020-01-01 00:00, 2020-01-02 00:00)', 'vals', '{"k": [1, 2.0]}', '1850-01-01 00:00:00');
INSERT INTO vals (id, f8, iv) VALUES (2, 1e300, '1 year 2 mons 3 days 04:05:06.789');
UPDATE vals SET tz = tz + '1 hour', iv = iv * 2 WHERE id = 1;
CREATE TABLE keyed (at timestamptz PRIMARY KEY, v int);
INSERT INTO keyed VALUES ('2021-03-04 05:06:07', 1);
UPDATE keyed SET v = 2 WHERE at = '2021-03-04 05:06:07';
"""

# Schema changes whose meaning depends on settings, time, randomness or the session.
SCHEMA_CASES = {
    "settings in a default": """
        CREATE TABLE defaults (id int PRIMARY KEY, d date DEFAULT '03/04/2020',
                               tz timestamptz DEFAULT '2020-01-01 10:00', iv interval DEFAULT '-1 day -2 hours');
        INSERT INTO defaults (id) VALUES (1);
        SET standard_conforming_strings = off;
        CREATE TABLE escapes (id int PRIMARY KEY, s text DEFAULT 'a\\\\b');
        INSERT INTO escapes (id) VALUES (1);
        RESET standard_conforming_strings;
    """,
    "a function over a missing table": """
        SET check_function_bodies = off;
        CREATE FUNCTION later_count() RETURNS int LANGUAGE sql AS 'SELECT count(*)::int FROM not_yet';
        RESET check_function_bodies;
        CREATE TABLE not_yet (x int);
        CREATE TABLE used (id int PRIMARY KEY, n int);
        INSERT INTO used VALUES (1, later_count());
    """,
    "volatile results": """
        CREATE TABLE ctas AS SELECT g AS id, random() AS r, 'now'::timestamptz AS t FROM generate_series(1, 20) g;
        SELECT g AS id, random() AS r INTO sel_into FROM generate_series(1, 5) g;
        PREPARE p AS SELECT g AS id, random() AS r FROM generate_series(1, 5) g;
        CREATE TABLE ctas_exec AS EXECUTE p;
        EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) CREATE TABLE ctas_explain AS SELECT random() AS r;
        INSERT INTO ctas_explain VALUES (0.5);
        CREATE TABLE grow (id int PRIMARY KEY);
        INSERT INTO grow SELECT generate_series(1, 50);
        ALTER TABLE grow ADD COLUMN r float8 DEFAULT random();
        ALTER TABLE grow ADD COLUMN t timestamptz DEFAULT now();
        ALTER TABLE grow ADD COLUMN s serial;
        ALTER TABLE grow ALTER COLUMN r TYPE numeric USING (r * random())::numeric;
        CREATE TABLE nopk_grow (x int);
        INSERT INTO nopk_grow SELECT generate_series(1, 5);
        ALTER TABLE nopk_grow ADD COLUMN r float8 DEFAULT random();
    """,
    "temporary and local objects": """
        CREATE TEMP TABLE scratch (a int);
        CREATE TABLE kept (a int);
        GRANT SELECT ON scratch, kept TO PUBLIC;
        CREATE TEMP TABLE scratch2 (a int);
        CREATE TABLE dropped_with_scratch (a int);
        DROP TABLE scratch2, dropped_with_scratch;
        CREATE VIEW over_scratch AS SELECT * FROM scratch;
        CREATE FUNCTION count_scratch() RETURNS bigint LANGUAGE sql BEGIN ATOMIC SELECT count(*) FROM scratch; END;
        CREATE FUNCTION pg_temp.helper() RETURNS int LANGUAGE sql AS 'SELECT 1';
        INSERT INTO kept VALUES (7);
        CREATE TEMP TABLE kept_copy (LIKE kept INCLUDING ALL);
        CREATE TEMP TABLE kept_child (extra text) INHERITS (kept);
        INSERT INTO kept_child VALUES (8, 'mine');
        CREATE TEMP TABLE kept_rows AS SELECT * FROM kept;
        CREATE TEMP VIEW kept_view AS SELECT a + 1 AS b FROM kept;
        CREATE INDEX ON kept_child (extra);
        ALTER TABLE kept_copy ADD COLUMN note text;
        CREATE TABLE from_scratch (LIKE scratch);
        CREATE TABLE catalog_copy AS SELECT relname, relkind, relpartbound FROM pg_class WHERE relkind = 'p';
        CREATE TABLE plans AS SELECT ev_class::regclass::text AS v, ev_action FROM pg_rewrite
          WHERE ev_class = 'pg_catalog.pg_tables'::regclass;
        UPDATE plans SET v = v || '!';
        DELETE FROM catalog_copy WHERE relname = 'no such relation';
        CREATE PUBLICATION local_pub;
        ALTER PUBLICATION local_pub RENAME TO local_pub2;
        COMMENT ON PUBLICATION local_pub2 IS 'here only';
        DROP PUBLICATION local_pub2;
        CREATE DATABASE other_db;
        ALTER DATABASE other_db RENAME TO other_db2;
        COMMENT ON DATABASE other_db2 IS 'here only';
        DROP DATABASE other_db2;
        CREATE TABLE after_local (a int PRIMARY KEY);
        INSERT INTO after_local VALUES (1);
    """,
    "partitions, inheritance and persistence": """
        CREATE TABLE parted (id int, k int, PRIMARY KEY (id, k)) PARTITION BY LIST (k);
        CREATE TABLE parted_1 PARTITION OF parted FOR VALUES IN (1);
        CREATE TABLE parted_2 (id int, k int, PRIMARY KEY (id, k));
        INSERT INTO parted_2 VALUES (5, 2);
        ALTER TABLE parted ATTACH PARTITION parted_2 FOR VALUES IN (2);
        INSERT INTO parted VALUES (1, 1), (2, 2);
        UPDATE parted SET k = 2 WHERE id = 1;
        ALTER TABLE parted DETACH PARTITION parted_2;
        INSERT INTO parted_2 VALUES (7, 2);
        CREATE TABLE parent (id serial PRIMARY KEY, v int);
        CREATE TABLE child (extra text) INHERITS (parent);
        INSERT INTO child (v, extra) VALUES (1, 'c');
        CREATE TABLE ref (id int PRIMARY KEY REFERENCES parted_2 (id, k) ON DELETE CASCADE);
        TRUNCATE parted;
        TRUNCATE parent RESTART IDENTITY;
        INSERT INTO parent (v) VALUES (9);
        CREATE UNLOGGED TABLE unlogged (id int PRIMARY KEY, v text);
        INSERT INTO unlogged VALUES (1, 'origin only until SET LOGGED');
        ALTER TABLE unlogged SET LOGGED;
        INSERT INTO unlogged VALUES (2, 'replicated');
    """,
    "session_replication_role and tables without a key": """
        CREATE TABLE roles_t (id int PRIMARY KEY, v text);
        SET session_replication_role = replica;
        INSERT INTO roles_t VALUES (1, 'written in replica mode');
        RESET session_replication_role;
        CREATE TABLE bag (a int, b text);
        INSERT INTO bag VALUES (1, 'x'), (1, 'x'), (2, 'y');
        UPDATE bag SET b = 'z' WHERE a = 2;
        DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE a = 1 LIMIT 1);
    """,
}

# Writesets applied in parallel on the other nodes: an UPDATE of rows a moment-old INSERT made in a
# table without a key must wait for it (it finds rows by their whole image); a table made inside
# CREATE SCHEMA replicates its rows; a materialized view is refreshed everywhere.
ORDER_CASES = "".join(f"""
        CREATE TABLE racet{i} (a numeric, b float8);
        INSERT INTO racet{i} SELECT g / 7.0, NULL FROM generate_series(1, 22) g;
        UPDATE racet{i} SET b = a::float8;
        DELETE FROM racet{i} WHERE a > 2;""" for i in range(12)) + """
        CREATE SCHEMA made_inside CREATE TABLE t (a int) CREATE SEQUENCE q;
        INSERT INTO made_inside.t VALUES (1), (nextval('made_inside.q'));
        CREATE TABLE mv_base (id int PRIMARY KEY, v int);
        INSERT INTO mv_base SELECT g, g FROM generate_series(1, 10) g;
        CREATE MATERIALIZED VIEW mv_sum AS SELECT sum(v) AS total FROM mv_base WITH NO DATA;
        REFRESH MATERIALIZED VIEW mv_sum;
        CREATE MATERIALIZED VIEW mv_on_mv AS SELECT total * 2 AS twice FROM mv_sum;
        INSERT INTO mv_base VALUES (11, 11);
        REFRESH MATERIALIZED VIEW mv_on_mv;
"""

# An application role that owns its schema, with no other right (least privilege).
APP_ROLE = """
CREATE ROLE app_owner LOGIN PASSWORD 'app-owner-pw';
CREATE SCHEMA app AUTHORIZATION app_owner;
"""
APP_WORK = """
SET search_path = app;
DROP TABLE vals, keyed;
CREATE TABLE items (id serial PRIMARY KEY, name text, created timestamptz DEFAULT '2020-01-01');
CREATE SEQUENCE counter;
CREATE TEMP TABLE t_tmp (a int);
INSERT INTO items (name) VALUES ('a'), ('b');
CREATE INDEX ON items (name);
ALTER TABLE items ADD COLUMN qty int DEFAULT 0;
CREATE VIEW v_items AS SELECT * FROM items;
CREATE TABLE items_copy AS SELECT * FROM items;
GRANT SELECT ON items TO PUBLIC;
UPDATE items SET qty = nextval('counter') WHERE name = 'a';
"""


def _run(c: Cluster, schema: str, script: str, settings: tuple[str, ...] = (), user: str = "postgres") -> str:
    """Run script in schema ``schema`` through node n1 as ``user``; psql's stderr."""
    dsn = c.dsn(0) if user == "postgres" else c.dsn_as(0, user, "app-owner-pw")
    pre = f"CREATE SCHEMA IF NOT EXISTS {schema};\n" if user == "postgres" else ""
    r = fidelity.run_sql(dsn, pre + f"SET search_path = {schema}, public;\n" + script, settings=settings)
    assert r.returncode == 0, r.stderr
    return r.stderr


def _check(c: Cluster) -> None:
    diff = fidelity.check(c.nodes)
    assert diff is None, str(diff)


@pytest.mark.parametrize("combo", sorted(SETTINGS))
def test_values_mean_the_same_on_every_node(schema_cluster: Cluster, combo: str) -> None:
    err = _run(schema_cluster, f"v_{combo.replace('-', '_')}", VALUES, SETTINGS[combo])
    assert "ERROR" not in err, err
    _check(schema_cluster)


@pytest.mark.parametrize("case, combo", list(itertools.product(sorted(SCHEMA_CASES), ["sql-dmy-kolkata"]))
                         + [("settings in a default", "german-chatham")])
def test_schema_changes_replay_in_their_origins_context(schema_cluster: Cluster, case: str, combo: str) -> None:
    schema = "s_" + "".join(ch if ch.isalnum() else "_" for ch in case)[:30] + "_" + combo.split("-")[0]
    err = _run(schema_cluster, schema, SCHEMA_CASES[case], SETTINGS[combo])
    if case == "temporary and local objects":
        # refused before they run, with the reason: nothing of them reaches any node; temporary
        # objects made from permanent ones (LIKE, INHERITS, AS, views, their indexes) run here; a
        # DROP of both kinds drops the permanent ones everywhere (_check: the nodes agree)
        assert err.count("names both temporary and permanent objects") == 1, err
        assert err.count("depend on a temporary one") == 1, err
        assert err.count("a permanent object from temporary ones") == 1, err
        assert err.count("ERROR") == 3, err
        with schema_cluster.connect(2) as c:
            assert c.execute("SELECT to_regclass(%s)", (f"{schema}.dropped_with_scratch",)).fetchone() == (None,)
    _check(schema_cluster)


def test_apply_order_created_schemas_and_materialized_views(schema_cluster: Cluster) -> None:
    err = _run(schema_cluster, "order_cases", ORDER_CASES)
    assert "ERROR" not in err, err
    _check(schema_cluster)
    with schema_cluster.connect(2) as c:
        assert c.execute("SELECT count(*) FROM made_inside.t").fetchone() == (2,)
        assert c.execute("SELECT twice FROM order_cases.mv_on_mv").fetchone() == (110,)


def test_an_application_role_runs_ddl_and_writes(schema_cluster: Cluster) -> None:
    _run(schema_cluster, "public", APP_ROLE)
    # the value cases, as this role, in its schema
    err = _run(schema_cluster, "app", VALUES, SETTINGS["sql-dmy-kolkata"], user="app_owner")
    assert "ERROR" not in err, err
    err = _run(schema_cluster, "app", APP_WORK, SETTINGS["postgres-la"], user="app_owner")
    assert "ERROR" not in err, err
    _check(schema_cluster)
    with schema_cluster.connect(2) as c:
        assert c.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'items_copy'").fetchone() == ("app_owner",)


def test_a_tablespace_only_the_origin_has(schema_cluster: Cluster) -> None:
    """Tablespaces are per node: a table created in one the others lack goes to their default."""
    path = os.path.join(schema_cluster.dir, "ts_n1")
    os.makedirs(path, exist_ok=True)
    subprocess.run(["chown", "postgres:postgres", path], check=True)
    with schema_cluster.connect(0) as c:
        c.execute(f"CREATE TABLESPACE only_n1 LOCATION '{path}'")
    err = _run(schema_cluster, "ts", "CREATE TABLE in_ts (id int PRIMARY KEY) TABLESPACE only_n1;\n"
                               "INSERT INTO in_ts VALUES (1);\n"
                               "CREATE INDEX in_ts_idx ON in_ts (id) TABLESPACE only_n1;\n"
                               "CREATE INDEX CONCURRENTLY in_ts_cidx ON in_ts (id) TABLESPACE only_n1;\n"
                               "REINDEX (TABLESPACE only_n1, CONCURRENTLY) TABLE in_ts;\n")
    assert "ERROR" not in err, err
    _wait_valid(schema_cluster, "in_ts_cidx")
    _check(schema_cluster)
    for i in (1, 2):
        assert schema_cluster.status(i)["state"] == "online"
    with schema_cluster.connect(0) as c:
        c.execute("DROP TABLE ts.in_ts")
        c.execute("DROP TABLESPACE only_n1")


def _wait_valid(c: Cluster, index: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for i in range(len(c.nodes)):
            with c.connect(i) as conn:
                states.append(conn.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid "
                                           "WHERE x.relname = %s", (index,)).fetchone())
        if states == [(True,)] * len(c.nodes):
            return
        assert time.monotonic() < deadline, f"{index}: {states}"
        time.sleep(0.2)


def test_partition_bounds_and_concurrent_detach(schema_cluster: Cluster) -> None:
    """A partition bound evaluated when it runs (current_timestamp, an expression) replicates as
    the value it took on the origin: replayed as written it would be another bound on each node
    (issue 35: the regression suite's create_table makes such partitions). DETACH PARTITION
    CONCURRENTLY replicates beside the total order, like CREATE INDEX CONCURRENTLY."""
    with schema_cluster.connect(0) as c:
        c.execute("SET datestyle = 'SQL, DMY'; SET timezone = 'Asia/Kolkata'")
        c.execute("CREATE TABLE bounded (at timestamptz, v int) PARTITION BY RANGE (at)")
        c.execute("CREATE TABLE bounded_now PARTITION OF bounded /* (a comment) */ FOR VALUES FROM (MINVALUE) "
                  "TO (current_timestamp - interval '100 years')")
        c.execute("CREATE TABLE bounded_old PARTITION OF bounded FOR VALUES FROM (current_timestamp - interval "
                  "'100 years') TO ('2020-01-01 00:00+00')")
        c.execute("CREATE TABLE bounded_new (at timestamptz, v int)")
        c.execute("ALTER TABLE bounded ATTACH PARTITION bounded_new FOR VALUES FROM ('2020-01-01 00:00+00') "
                  "TO ((now() + interval '1 day')::text::timestamptz)")
        c.execute("CREATE TABLE lists (k int) PARTITION BY LIST (k)")
        c.execute("CREATE TABLE lists_3 PARTITION OF lists FOR VALUES IN ((2+1), length('four'))")
        c.execute("INSERT INTO bounded VALUES ('2019-05-05 00:00+00', 1), ('2021-05-05 00:00+00', 2)")
        c.execute("INSERT INTO lists VALUES (3), (4)")
        bounds = c.execute("SELECT relname, pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname IN "
                           "('bounded_now', 'bounded_old', 'bounded_new', 'lists_3') ORDER BY 1").fetchall()
    _check(schema_cluster)
    for i in (1, 2):
        with schema_cluster.connect(i) as c:
            c.execute("SET datestyle = 'SQL, DMY'; SET timezone = 'Asia/Kolkata'")
            assert c.execute("SELECT relname, pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname IN "
                             "('bounded_now', 'bounded_old', 'bounded_new', 'lists_3') ORDER BY 1").fetchall() == bounds
    with schema_cluster.connect(0) as c:
        c.execute("ALTER TABLE bounded DETACH PARTITION bounded_old CONCURRENTLY")
        c.execute("DROP TABLE bounded, lists")
        c.execute("INSERT INTO bounded_old VALUES ('2018-01-01 00:00+00', 3)")
    _check(schema_cluster)
    with schema_cluster.connect(2) as c:
        assert c.execute("SELECT v FROM bounded_old ORDER BY v").fetchall() == [(1,), (3,)]
        assert c.execute("SELECT to_regclass('bounded_new')").fetchone() == (None,)


def test_latin1_database() -> None:
    """A database in LATIN1: text that is not UTF-8 travels as bytes, names too."""
    with extra_cluster("chorus-latin1-", 40, "--encoding", "LATIN1") as c:
        script = (VALUES + "CREATE TABLE caf\xe9 (id int PRIMARY KEY, nom text, \xe9t\xe9 date);\n"
                  "INSERT INTO caf\xe9 VALUES (1, 'cr\xe8me br\xfbl\xe9e', '03/04/2020');\n"
                  "UPDATE caf\xe9 SET nom = nom || ' \xa7' WHERE id = 1;\n")
        dsn = c.dsn(0)
        r = subprocess.run([f"{fidelity.PGBIN}/psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "-"],
                           input=("SET datestyle = 'SQL, DMY';\n" + script).encode("latin-1"), capture_output=True,
                           env={**os.environ, "PGCLIENTENCODING": "LATIN1"}, timeout=60)
        assert r.returncode == 0, r.stderr
        _check(c)
        with psycopg.connect(c.dsn(2)) as conn:
            assert conn.execute("SELECT nom, \xe9t\xe9::text FROM caf\xe9").fetchone() == (
                "cr\xe8me br\xfbl\xe9e \xa7", "2020-04-03")
