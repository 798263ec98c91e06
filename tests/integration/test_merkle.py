"""The Merkle diff of total recovery (chorus_spark.merkle, docs/RECOVERY.md): its pure parts, then
the whole diff between two databases of one plain PostgreSQL (a donor at an exported snapshot, a
joiner that drifted): after the rows level and the merge the joiner holds exactly the donor's
rows, for integer, text and composite keys, every common column type, keys beyond either end,
and the copy path (TRUNCATE and COPY FREEZE, or DELETE when a foreign key points at the table)."""

from __future__ import annotations

from typing import Any, Iterator

import psycopg
import pytest

from chorus.testkit.localcluster import PlainPostgres
from chorus.total.recover import STAGE_SCHEMA, make_stages, merge
from chorus_spark import merkle
from chorus_spark.merkle import Cut, intervals, unescape
from conftest import plain_database

pytestmark = pytest.mark.integration



def test_leaf_runs_and_their_key_intervals() -> None:
    assert intervals([]) == []
    assert intervals([0, 1, 2, 5, 7, 8]) == [(0, 3), (5, 6), (7, 9)]
    cut = Cut("bigint", base=-10, width=4)
    assert cut.interval(0, 3) == ("-10", "2")
    bounds = Cut("text", bounds=("b", "d", "f"))
    assert bounds.interval(0, 1) == (None, "b")  # below the donor's first key
    assert bounds.interval(1, 3) == ("b", "f")
    assert bounds.interval(3, 4) == ("f", None)  # the last leaf is open
    assert Cut.from_dict(bounds.to_dict()) == bounds


def test_copy_text_escapes_are_undone() -> None:
    assert unescape("plain") == "plain"
    assert unescape("a\\tb\\nc\\\\d\\re") == "a\tb\nc\\d\re"


@pytest.fixture
def dbs(plain: PlainPostgres) -> Iterator[tuple[str, str]]:
    """A donor and a joiner database."""
    with plain_database(plain, "merkle_donor") as donor, plain_database(plain, "merkle_joiner") as joiner:
        yield donor, joiner


def _both(dbs: tuple[str, str], ddl: str) -> None:
    for dsn in dbs:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(ddl)


def _describe(dsn: str, name: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as c:
        cols = c.execute("SELECT attname, format_type(atttypid, atttypmod), attgenerated <> '' FROM pg_attribute "
                         "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                         (name,)).fetchall()
        key = c.execute("SELECT a.attname FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY "
                        "k(n, o) JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n "
                        "WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY k.o", (name,)).fetchall()
    return {"schema": "public", "name": name, "columns": [{"name": n, "type": t, "generated": g} for n, t, g in cols],
            "key": [k[0] for k in key]}


def _rows(dsn: str, name: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as c:
        return c.execute(f"SELECT t::text FROM {name} t ORDER BY 1").fetchall()


def _recover(dbs: tuple[str, str], name: str) -> dict[str, Any]:
    """What total recovery does for one keyed table, without Chorus: analyse at a snapshot of the
    donor, run the rows level's tasks, merge the staged delta (or copy the table)."""
    donor_dsn, joiner_dsn = dbs
    t = _describe(donor_dsn, name)
    with psycopg.connect(donor_dsn, autocommit=True) as snap:
        snap.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        snapshot = snap.execute("SELECT pg_export_snapshot()").fetchone()[0]  # type: ignore[index]
        rows = snap.execute(f"SELECT count(*) FROM {name}").fetchone()[0]  # type: ignore[index]
        with psycopg.connect(donor_dsn, autocommit=True) as w:  # written after the snapshot: not copied
            w.execute(f"DELETE FROM {name} WHERE ctid = (SELECT min(ctid) FROM {name})")
        plan = merkle.analyse(donor_dsn, snapshot, joiner_dsn, t, rows, 1 << 30, small_bytes=0)
        results: list[dict[str, Any]] = []
        with psycopg.connect(joiner_dsn, autocommit=True) as j:
            if plan["mode"] == "diff":
                stage = make_stages(j, [t])[f"public.{name}"]
                base = {"donor_dsn": donor_dsn, "snapshot": snapshot, "joiner_dsn": joiner_dsn, "stage": stage}
                results = [merkle.run_task({**task, **base}) for task in plan["tasks"]]
                merge(j, t, 1)
                j.execute(f"DROP SCHEMA {STAGE_SCHEMA} CASCADE")
            else:
                results = [merkle.copy_table({"donor_dsn": donor_dsn, "snapshot": snapshot, "joiner_dsn": joiner_dsn,
                                              "table": t})]
        expected = _snapshot_rows(donor_dsn, snapshot, name)
    assert _rows(joiner_dsn, name) == expected
    return {**plan, "results": results}


def _snapshot_rows(dsn: str, snapshot: str, name: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as c:
        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        c.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
        return c.execute(f"SELECT t::text FROM {name} t ORDER BY 1").fetchall()


def _sum(plan: dict[str, Any], k: str) -> int:
    return sum(r.get(k, 0) for r in plan["results"])


def test_integer_key_drift_is_found_and_only_it_is_read(dbs: tuple[str, str]) -> None:
    _both(dbs, "CREATE TABLE acc (id bigint PRIMARY KEY, v integer, pad text)")
    _both(dbs, "INSERT INTO acc SELECT g, g % 97, repeat('x', 80) FROM generate_series(1, 40000) g")
    with psycopg.connect(dbs[1], autocommit=True) as j:  # the joiner drifted: about 0.5 % of the rows
        j.execute("UPDATE acc SET v = -1 WHERE id % 997 = 3")
        j.execute("DELETE FROM acc WHERE id % 1499 = 7")
        j.execute("INSERT INTO acc VALUES (-50, 1, 'only on the joiner, below'), (90000, 1, 'beyond')")
    with psycopg.connect(dbs[0], autocommit=True) as d:
        d.execute("INSERT INTO acc VALUES (40001, 2, 'only on the donor, above'), (-7, 2, 'below')")
    plan = _recover(dbs, "acc")
    assert plan["mode"] == "diff", plan
    # 41 ids are 3 mod 997, 27 are 7 mod 1499 (none both); 2 rows only on either side
    assert (_sum(plan, "updates"), _sum(plan, "inserts"), _sum(plan, "deletes")) == (41, 27 + 2, 2)
    assert plan["leaves_differing"] < plan["leaves"] / 5
    read = plan["bytes_donor"] + _sum(plan, "bytes_donor")
    assert read < 0.1 * 40000 * 100, read  # a small part of the table's text


def test_text_keys_with_escapes_and_every_common_type(dbs: tuple[str, str]) -> None:
    _both(dbs, """CREATE TABLE doc (k text PRIMARY KEY, amount numeric, at timestamptz, j jsonb, b bytea,
                  tags text[], f double precision, d date, span interval, u uuid, flag boolean,
                  gen int GENERATED ALWAYS AS (length(k)) STORED)""")
    _both(dbs, r"""INSERT INTO doc (k, amount, at, j, b, tags, f, d, span, u, flag)
        SELECT 'key ' || g || CASE g % 5 WHEN 0 THEN E'\t tab' WHEN 1 THEN E'\n line' WHEN 2 THEN E' back\\slash'
                                         WHEN 3 THEN ' é "q"' ELSE '' END,
               g * 1.5, '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 min', jsonb_build_object('g', g),
               decode(lpad(to_hex(g), 8, '0'), 'hex'), ARRAY['a', NULL, g::text], g / 7.0, DATE '2026-01-01' + g % 400,
               make_interval(secs => g), md5(g::text)::uuid, g % 2 = 0
          FROM generate_series(1, 20000) g""")
    with psycopg.connect(dbs[1], autocommit=True) as j:
        j.execute(r"UPDATE doc SET amount = amount::numeric(20, 4) WHERE k = 'key 104'")  # 156 -> 156.0000
        j.execute(r"UPDATE doc SET tags = ARRAY['a', '', '7'] WHERE k = E'key 11\n line'")  # NULL -> ''
        j.execute(r"DELETE FROM doc WHERE k = E'key 10\t tab'")
        j.execute(r"INSERT INTO doc (k) VALUES (E'\\ zz only here\t!'), ('   before everything')")
    plan = _recover(dbs, "doc")
    assert plan["mode"] == "diff"
    assert (_sum(plan, "updates"), _sum(plan, "inserts"), _sum(plan, "deletes")) == (2, 1, 2)


def test_composite_key(dbs: tuple[str, str]) -> None:
    _both(dbs, "CREATE TABLE ev (tenant int, seq text, payload text, PRIMARY KEY (tenant, seq))")
    _both(dbs, "INSERT INTO ev SELECT g % 3, 's' || g, 'p' || g FROM generate_series(1, 30000) g")
    with psycopg.connect(dbs[1], autocommit=True) as j:
        j.execute("UPDATE ev SET payload = 'changed' WHERE seq IN ('s5', 's29999')")
        j.execute("INSERT INTO ev VALUES (1, 's5', 'a second row of one first-key value')")
    plan = _recover(dbs, "ev")
    assert plan["mode"] == "diff"
    assert (_sum(plan, "updates"), _sum(plan, "deletes")) == (2, 1)


def test_a_table_mostly_different_is_copied(dbs: tuple[str, str]) -> None:
    _both(dbs, "CREATE TABLE parent (id int PRIMARY KEY, v text)")
    _both(dbs, "CREATE TABLE child (id int PRIMARY KEY, parent int REFERENCES parent)")
    _both(dbs, "INSERT INTO parent SELECT g, 'v' FROM generate_series(1, 5000) g")
    with psycopg.connect(dbs[1], autocommit=True) as j:
        j.execute("UPDATE parent SET v = 'drifted' WHERE id % 3 = 0")
    plan = _recover(dbs, "parent")  # referenced by child: DELETE, not TRUNCATE
    assert plan["mode"] == "copy" and plan["results"][0]["copied"] == 5000  # at the snapshot
    with psycopg.connect(dbs[1], autocommit=True) as j:
        j.execute("DROP TABLE child")
        j.execute("DELETE FROM parent")
    plan = _recover(dbs, "parent")  # an empty joiner: TRUNCATE and COPY FREEZE
    assert plan["mode"] == "copy" and plan["results"][0]["copied"] == 4999


def test_identical_tables_read_only_range_summaries(dbs: tuple[str, str]) -> None:
    _both(dbs, "CREATE TABLE same (id int PRIMARY KEY, v text)")
    _both(dbs, "INSERT INTO same SELECT g, md5(g::text) FROM generate_series(1, 50000) g")
    _both(dbs, "DELETE FROM same WHERE id = 1")  # what _recover deletes after its snapshot, already gone
    plan = _recover(dbs, "same")
    assert plan["mode"] == "diff" and plan["ranges_differing"] == 0 and plan["tasks"] == []
    assert plan["bytes_donor"] < 100_000, plan


def test_a_sparse_integer_key_is_cut_by_bounds(dbs: tuple[str, str]) -> None:
    """Keys 1..20000 and a few past ten million: equal widths would put nearly every row in one
    leaf; the donor's keys cut it instead, and only the changed rows are compared."""
    _both(dbs, "CREATE TABLE sparse (id bigint PRIMARY KEY, v text)")
    _both(dbs, "INSERT INTO sparse SELECT g, 'v' || g FROM generate_series(1, 20000) g")
    _both(dbs, "INSERT INTO sparse SELECT 10000000 + g, 'far' FROM generate_series(1, 50) g")
    with psycopg.connect(dbs[1], autocommit=True) as j:
        j.execute("UPDATE sparse SET v = 'drifted' WHERE id IN (17, 9000, 10000007)")
    plan = _recover(dbs, "sparse")
    assert plan["mode"] == "diff" and plan["leaves_differing"] <= 4, plan
    assert _sum(plan, "updates") == 3


def test_a_large_copy_builds_the_indexes_after_the_load(dbs: tuple[str, str]) -> None:
    """The indexes and the constraints they serve are dropped before a large table's COPY and
    built again after it, under the same names and definitions; not where that could not be
    undone exactly (here: a clustered index)."""
    ddl = """CREATE TABLE big (id int PRIMARY KEY, code text UNIQUE, v int);
             CREATE INDEX big_v ON big (v) WHERE v > 10;
             CREATE TABLE held (id int PRIMARY KEY, v int);
             CREATE INDEX held_v ON held (v);
             ALTER TABLE held CLUSTER ON held_v"""
    _both(dbs, ddl)
    with psycopg.connect(dbs[0], autocommit=True) as d:
        d.execute("INSERT INTO big SELECT g, 'c' || g, g % 50 FROM generate_series(1, 3000) g")
        d.execute("INSERT INTO held SELECT g, g FROM generate_series(1, 100) g")
    query = ("SELECT indexname, indexdef FROM pg_indexes WHERE tablename IN ('big', 'held') ORDER BY 1")
    with psycopg.connect(dbs[1]) as j:
        before = j.execute(query).fetchall()
    with psycopg.connect(dbs[0], autocommit=True) as snap:
        snap.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        snapshot = snap.execute("SELECT pg_export_snapshot()").fetchone()[0]  # type: ignore[index]
        done = {name: merkle.copy_table({"donor_dsn": dbs[0], "snapshot": snapshot, "joiner_dsn": dbs[1],
                                         "bytes": merkle.REBUILD_BYTES, "table": _describe(dbs[0], name)})
                for name in ("big", "held")}
    assert done["big"]["indexes_rebuilt"] == 3 and done["held"]["indexes_rebuilt"] == 0, done
    with psycopg.connect(dbs[1]) as j:
        assert j.execute(query).fetchall() == before
        assert j.execute("SELECT count(*), count(DISTINCT code) FROM big").fetchone() == (3000, 3000)
        assert j.execute("SELECT indisclustered FROM pg_index WHERE indexrelid = 'held_v'::regclass").fetchone() == (True,)
        assert j.execute("SELECT contype FROM pg_constraint WHERE conrelid = 'big'::regclass ORDER BY 1").fetchall() \
            == [("p",), ("u",)]
    assert _rows(dbs[1], "big") == _rows(dbs[0], "big")


def test_key_columns_named_like_the_diffs_own(dbs: tuple[str, str]) -> None:
    _both(dbs, 'CREATE TABLE named (h int, b text, n int, "_chorus_h" int, PRIMARY KEY (h, b))')
    _both(dbs, "INSERT INTO named SELECT g, 'b' || g, g, g FROM generate_series(1, 20000) g")
    with psycopg.connect(dbs[1], autocommit=True) as j:
        j.execute("UPDATE named SET n = -1 WHERE h IN (5, 15000)")
    plan = _recover(dbs, "named")
    assert plan["mode"] == "diff" and _sum(plan, "updates") == 2
