"""Schema changes in total order, sequences that never collide, what stays local (issue: DDL)."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from conftest import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def schema(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS ddl_kv (k integer PRIMARY KEY, v text)")
    cluster.quiesce()


def _schema(cluster: Cluster, i: int, table: str) -> list[tuple[Any, ...]]:
    with cluster.connect(i) as c:
        return c.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull"
            "  FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0"
            "   AND NOT a.attisdropped ORDER BY a.attnum", (table,)).fetchall()


def _indexes(cluster: Cluster, i: int, table: str) -> list[str]:
    with cluster.connect(i) as c:
        return [r[0] for r in c.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s ORDER BY indexname", (table,))]


def _retrying(cluster: Cluster, i: int, stmt: str, params: tuple[Any, ...] = ()) -> None:
    for _ in range(200):
        try:
            with cluster.connect(i) as c:
                c.execute(stmt, params)
            return
        except psycopg.errors.SerializationFailure:
            time.sleep(0.01)
    raise AssertionError(f"{stmt} kept failing certification")


def test_schema_changes_under_load_from_other_nodes(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE ddl_load (id integer PRIMARY KEY, n integer NOT NULL DEFAULT 0)")
        c.execute("INSERT INTO ddl_load SELECT g, 0 FROM generate_series(1, 200) g")
    cluster.quiesce()
    stop = threading.Event()
    counts = {1: 0, 2: 0}
    errors: list[BaseException] = []

    def load(i: int) -> None:  # nodes 1 and 2 update rows while node 0 changes the schema
        try:
            with cluster.connect(i) as c:
                k = 0
                while not stop.is_set():
                    k += 1
                    try:
                        c.execute("UPDATE ddl_load SET n = n + 1 WHERE id = %s", (1 + (k * 7 + i) % 200,))
                        counts[i] += 1
                    except psycopg.errors.SerializationFailure:
                        pass
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=load, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        with cluster.connect(0) as c:
            c.execute("CREATE TABLE ddl_new (id bigint PRIMARY KEY, note text)")
            c.execute("INSERT INTO ddl_new VALUES (1, 'made right after CREATE TABLE')")
            c.execute("ALTER TABLE ddl_load ADD COLUMN tag text DEFAULT 'x'")
            time.sleep(0.3)
            c.execute("CREATE INDEX ddl_load_n ON ddl_load (n)")
            time.sleep(0.3)
            c.execute("CREATE TABLE ddl_gone (id integer PRIMARY KEY)")
            c.execute("DROP TABLE ddl_gone")
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert counts[1] > 0 and counts[2] > 0, counts
    cluster.assert_identical()
    for i in range(3):
        assert _schema(cluster, i, "ddl_load") == _schema(cluster, 0, "ddl_load")
        assert [c for c, *_ in _schema(cluster, i, "ddl_load")] == ["id", "n", "tag"]
        assert _indexes(cluster, i, "ddl_load") == _indexes(cluster, 0, "ddl_load")
        assert any("ddl_load_n" in d for d in _indexes(cluster, i, "ddl_load"))
        with cluster.connect(i) as c:
            assert c.execute("SELECT to_regclass('ddl_gone')").fetchone() == (None,)
            assert c.execute("SELECT note FROM ddl_new").fetchall() == [("made right after CREATE TABLE",)]
    # every node still takes writes (none is stuck behind a schema change)
    for i in range(3):
        _retrying(cluster, i, "INSERT INTO ddl_new VALUES (%s, 'after')", (10 + i,))
    cluster.assert_identical()


def test_failed_schema_change_is_skipped_everywhere(cluster: Cluster) -> None:
    with cluster.connect(1) as c:
        c.execute("CREATE TABLE ddl_dup (id integer PRIMARY KEY)")
        with pytest.raises(psycopg.errors.DuplicateTable):
            c.execute("CREATE TABLE ddl_dup (id integer PRIMARY KEY)")
        c.execute("INSERT INTO ddl_dup VALUES (1)")
    cluster.assert_identical()
    for i in range(3):
        assert cluster.status(i)["state"] == "online"


def test_schema_change_inside_a_transaction_block_replicates_with_it(cluster: Cluster) -> None:
    """A schema change in a transaction block or a DO block replicates with its transaction
    (issue 19); CREATE INDEX CONCURRENTLY in a block is refused by PostgreSQL itself, and nothing
    of that transaction replicates."""
    with cluster.connect(0, autocommit=False) as c:
        c.execute("CREATE TABLE ddl_in_block (id integer PRIMARY KEY)")
        c.execute("INSERT INTO ddl_in_block VALUES (1)")
        c.commit()
        c.execute("INSERT INTO ddl_in_block VALUES (99)")
        with pytest.raises(psycopg.errors.ActiveSqlTransaction, match="CONCURRENTLY"):
            c.execute("CREATE INDEX CONCURRENTLY ON ddl_kv (v)")
        c.rollback()
    with cluster.connect(0) as c:
        c.execute("DO $$ BEGIN CREATE TABLE ddl_in_do (id integer); INSERT INTO ddl_in_do VALUES (2); END $$")
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT (SELECT id FROM ddl_in_block), (SELECT id FROM ddl_in_do)").fetchone() == (1, 2)


def test_a_session_captures_a_table_as_other_sessions_changed_it(cluster: Cluster) -> None:
    """A backend keeps each table's description across its transactions (chorus_table.c); a
    column added or renamed, or its schema renamed, by another session is in the next row it
    captures: kept stale, the other nodes would get the added column's default, or fail to
    apply the row."""
    with cluster.connect(0) as a, cluster.connect(0) as b:
        a.execute("CREATE SCHEMA ddl_shape_s")
        a.execute("CREATE TABLE ddl_shape_s.t (k integer PRIMARY KEY, v text)")
        a.execute("CREATE TABLE ddl_shape_p (k integer PRIMARY KEY)")
        a.execute("CREATE TABLE ddl_shape_c (k integer PRIMARY KEY, p integer REFERENCES ddl_shape_p)")
        a.execute("INSERT INTO ddl_shape_p VALUES (1), (2)")
        a.execute("INSERT INTO ddl_shape_c VALUES (1, 1)")
        a.execute("INSERT INTO ddl_shape_s.t VALUES (1, 'a')")  # described and kept by a's backend
        b.execute("ALTER TABLE ddl_shape_s.t ADD COLUMN w integer DEFAULT 7")
        a.execute("INSERT INTO ddl_shape_s.t VALUES (2, 'b', 8)")
        b.execute("ALTER TABLE ddl_shape_s.t RENAME COLUMN v TO v2")
        a.execute("INSERT INTO ddl_shape_s.t VALUES (3, 'c', 9)")
        b.execute("ALTER SCHEMA ddl_shape_s RENAME TO ddl_shape_s2")
        a.execute("UPDATE ddl_shape_s2.t SET w = w + 100 WHERE k = 3")
        b.execute("ALTER TABLE ddl_shape_p RENAME TO ddl_shape_p2")  # the child's key names its parent
        a.execute("INSERT INTO ddl_shape_c VALUES (2, 2)")
    cluster.assert_identical()
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT k, v2, w FROM ddl_shape_s2.t ORDER BY k").fetchall() == \
                [(1, "a", 7), (2, "b", 8), (3, "c", 109)]
            assert c.execute("SELECT k, p FROM ddl_shape_c ORDER BY k").fetchall() == [(1, 1), (2, 2)]


def test_local_statements_stay_local(cluster: Cluster) -> None:
    with cluster.connect(2) as c:
        gid = c.execute("SELECT chorus.committed_gid()").fetchone()
        c.execute("CREATE TEMP TABLE ddl_tmp (id integer PRIMARY KEY)")
        c.execute("INSERT INTO ddl_tmp VALUES (1)")
        c.execute("DROP TABLE ddl_tmp")
        c.execute("VACUUM ddl_kv")
        c.execute("ANALYZE ddl_kv")
        c.execute("SET chorus.replicate_ddl = off")
        c.execute("CREATE TABLE ddl_only_here (id integer PRIMARY KEY)")
        c.execute("DROP TABLE ddl_only_here")
        assert c.execute("SELECT chorus.committed_gid()").fetchone() == gid  # nothing was ordered
    assert cluster.status(2)["committed_gid"] == gid[0]


def test_roles_replicate(cluster: Cluster) -> None:
    with cluster.connect(1) as c:
        c.execute("CREATE ROLE chorus_test_reader")
        c.execute("GRANT SELECT ON ddl_kv TO chorus_test_reader")
    cluster.quiesce()
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT has_table_privilege('chorus_test_reader', 'ddl_kv', 'SELECT')"
                             ).fetchone() == (True,)
    with cluster.connect(2) as c:
        c.execute("REVOKE SELECT ON ddl_kv FROM chorus_test_reader")
        c.execute("DROP ROLE chorus_test_reader")
    cluster.quiesce()
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT count(*) FROM pg_roles WHERE rolname = 'chorus_test_reader'"
                             ).fetchone() == (0,)


def test_concurrent_bigserial_inserts_never_collide(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE seq_rows (id bigserial PRIMARY KEY, node integer, k integer)")
        c.execute("CREATE TABLE ident_rows (id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY, node integer)")
    cluster.quiesce()
    failures: list[Any] = []

    def insert(i: int) -> None:
        with cluster.connect(i) as c:
            for k in range(150):
                try:
                    c.execute("INSERT INTO seq_rows (node, k) VALUES (%s, %s)", (i, k))
                    c.execute("INSERT INTO ident_rows (node) VALUES (%s)", (i,))
                except psycopg.Error as e:
                    failures.append(e)

    threads = [threading.Thread(target=insert, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:3]
    cluster.assert_identical()
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT count(*), count(DISTINCT id) FROM seq_rows").fetchone() == (450, 450)
            assert c.execute("SELECT count(*) FROM ident_rows").fetchone() == (450,)
            # each node draws from its own residue class
            assert c.execute("SELECT count(DISTINCT id % 16) FROM seq_rows").fetchone() == (3,)
