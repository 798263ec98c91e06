"""The apply function on its own, against one PostgreSQL (pytest-postgresql's fixtures: a fresh
database per test, made from a template with the extension), without a cluster.

``chorus.apply_writeset`` applies rows through the executor's replication helpers
(``extension/chorus_apply_exec.c``) or, with ``chorus.apply_executor`` off and for tables the
executor cannot take, through prepared statements. Every test runs on both paths, and a random
workload checks that both leave the same rows. The test plays the coordinator's part: it starts
the node (``chorus.node_init``) and gives each writeset the next GID.
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import psycopg
import pytest
from psycopg import sql
from pytest_postgresql import factories

from chorus import wire
from chorus.testkit.localcluster import PlainPostgres
from chorus.nodedb import PIN_SEARCH_PATH
from conftest import CHORUS_PASSWORD, CHORUS_PORT, peak_anon_growth_kb

pytestmark = pytest.mark.integration

PORT, PASSWORD = CHORUS_PORT, CHORUS_PASSWORD  # conftest.chorus_postgres's

# the settings text values are printed and read under (chorus_values.c), as an apply session sets them
CANONICAL = ("SET datestyle = 'ISO'; SET intervalstyle = 'postgres'; SET timezone = 'UTC'; "
             "SET extra_float_digits = 3; SET bytea_output = 'hex'")


@pytest.fixture(scope="module", autouse=True)
def chorus_server(chorus_postgres: PlainPostgres) -> PlainPostgres:
    """The session's PostgreSQL with the extension (conftest.chorus_postgres), running before
    pytest-postgresql's databases are made on it."""
    return chorus_postgres


def _load(host: str, port: int, user: str, dbname: str, password: Optional[str] = None, **_: Any) -> None:
    with psycopg.connect(host=host, port=port, user=user, password=password, dbname=dbname, autocommit=True) as c:
        c.execute("CREATE EXTENSION chorus")


chorus_noproc = factories.postgresql_noproc(host="127.0.0.1", port=PORT, user="postgres", password=PASSWORD,
                                            dbname="chorus_apply", load=[_load])
postgresql = factories.postgresql("chorus_noproc")


@pytest.fixture
def db(postgresql: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The test database; the test's own statements stay on this node (neither captured nor
    replicated: the node is not online in any cluster)."""
    postgresql.autocommit = True
    postgresql.execute("SET chorus.capture = off")
    postgresql.execute("SET chorus.replicate_ddl = off")
    return postgresql


class Applier:
    """An apply session as the coordinator opens one: replica mode, no capture, canonical
    settings; each writeset (or run) commits as the next GID."""

    def __init__(self, conn: psycopg.Connection[Any], executor: bool) -> None:
        self.conn = conn
        conn.autocommit = True
        conn.execute("SET session_replication_role = replica")
        conn.execute("SET chorus.capture = off")
        conn.execute(CANONICAL)
        conn.execute(f"SET chorus.apply_executor = {'on' if executor else 'off'}")

    def apply(self, ws: wire.Writeset | bytes) -> int:
        data = ws if isinstance(ws, bytes) else wire.encode(ws)
        gid = int(self.conn.execute("SELECT chorus.committed_gid()").fetchone()[0])
        return self._call("SELECT chorus.apply_writeset(%s, %s, %s)", (gid + 1, gid, data))

    def apply_run(self, writesets: Sequence[wire.Writeset]) -> int:
        run = b"".join(struct.pack(">I", len(raw)) + raw for raw in (wire.encode(ws) for ws in writesets))
        gid = int(self.conn.execute("SELECT chorus.committed_gid()").fetchone()[0])
        n = len(writesets)
        return self._call("SELECT chorus.apply_run(%s, %s, %s)", (gid + n, gid, run))

    def _call(self, query: str, params: tuple[Any, ...]) -> int:
        """The call under the apply session's search_path (the test's own statements on this
        connection keep the test's)."""
        self.conn.execute(PIN_SEARCH_PATH)
        try:
            row = self.conn.execute(query, params).fetchone()
        finally:
            self.conn.execute("RESET search_path")
        return int(row[0])


def writeset(tables: Sequence[wire.Table], rows: Sequence[wire.Item], flags: int = 0) -> wire.Writeset:
    keys = tuple(wire.Key(wire.KeyMode.EXCLUSIVE, (t.nspname.encode(), t.relname.encode())) for t in tables)
    return wire.Writeset(1, 1, 0, tuple(tables), tuple(rows), keys, flags=flags)


def table(conn: psycopg.Connection[Any], name: str, identity: Sequence[str] = ("id",)) -> wire.Table:
    """The writeset's description of a table, as capture writes it (from the catalog)."""
    cols = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod), attgenerated <> '', attidentity <> '' "
        "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (name,)).fetchall()
    columns = tuple(wire.Column(n, t, (wire.COL_GENERATED if g else 0) | (wire.COL_IDENTITY if i else 0))
                    for n, t, g, i in cols)
    names = [c.name for c in columns]
    if identity:
        return wire.Table("public", name, columns, tuple(names.index(n) for n in identity))
    return wire.Table("public", name, columns, tuple(range(len(columns))), full_identity=True)


def rows_of(conn: psycopg.Connection[Any], name: str) -> list[tuple[Any, ...]]:
    """Every row as text, under the canonical settings, in a stable order."""
    conn.execute(CANONICAL)
    q = sql.SQL("SELECT t::text FROM {} t ORDER BY t::text").format(sql.Identifier(name))
    return [r[0] for r in conn.execute(q).fetchall()]


def values_of(conn: psycopg.Connection[Any], name: str, where: str, binary: bool) -> tuple[wire.Value, ...]:
    """One row's values as a writeset carries them: text (under the canonical settings) or the
    type's binary send form; None for NULL and for generated columns."""
    conn.execute(CANONICAL)
    cols = conn.execute(
        "SELECT a.attname, t.typsend::text, a.attgenerated <> '' FROM pg_attribute a "
        "JOIN pg_type t ON t.oid = a.atttypid WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum", (name,)).fetchall()
    exprs = [sql.SQL("{}::text").format(sql.Identifier(n)) if not binary
             else sql.SQL("{}({})").format(sql.SQL(send), sql.Identifier(n)) for n, send, _ in cols]
    q = sql.SQL("SELECT {} FROM {} WHERE {}").format(sql.SQL(", ").join(exprs), sql.Identifier(name), sql.SQL(where))
    found = conn.execute(q).fetchone()
    assert found is not None
    out: list[wire.Value] = []
    for (_, _, generated), v in zip(cols, found):
        if generated or v is None:
            out.append(None)
        elif binary:
            out.append(wire.Binary(bytes(v)))
        else:
            out.append(v.encode())
    return tuple(out)


PATHS = pytest.mark.parametrize("executor", [True, False], ids=["executor", "spi"])

TYPES = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TYPE pair AS (a int, b text);
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
"""

TYPED_TABLE = """
CREATE TABLE {name} (
  id integer PRIMARY KEY,
  i2 smallint, i8 bigint, num numeric(12, 4), f4 real, f8 double precision, b boolean,
  t text, vc varchar(10), ch char(3), by bytea, d date, tm time, tmz timetz, ts timestamp,
  tsz timestamptz, iv interval, u uuid, j json, jb jsonb, ip inet, net cidr, mac macaddr,
  ia integer[], ta text[], bits bit(4), vb varbit, rng int4range, tsv tsvector, m mood,
  p pair, dom posint, pt point, x xml, mn money, oid_ oid,
  g bigint GENERATED ALWAYS AS (id * 10) STORED
);
"""

FULL_ROW = """INSERT INTO {name} VALUES (
  1, -3, 9000000000, 1234.5678, 1.5, 2.25e100, true, 'text ''quoted'' ✓', 'short', 'abc',
  '\\x00ff10', '2024-02-29', '12:34:56.789', '12:34:56+02', '2024-02-29 12:34:56.123456',
  '2024-02-29 12:34:56.123456+05:30', '1 year 2 mons 3 days 04:05:06.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '{{"a": [1, 2]}}', '{{"b": {{"c": null}}}}', '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03',
  '{{1,NULL,3}}', '{{"x","y z"}}', B'1010', B'101', '[1,5)', 'a fat cat', 'happy', ROW(1, 'one'), 7,
  '(1.5,2)', '<a>b</a>', 12.34, 42)"""


@PATHS
def test_every_column_type(db: psycopg.Connection[Any], executor: bool) -> None:
    db.autocommit = True
    db.execute(TYPES)
    for name in ("ref", "typed"):
        db.execute(TYPED_TABLE.format(name=name))
    db.execute(FULL_ROW.format(name="ref"))
    db.execute("INSERT INTO ref (id) VALUES (2)")  # every other column NULL
    a = Applier(db, executor)
    t = table(db, "typed")
    text1, bin1 = values_of(db, "ref", "id = 1", False), values_of(db, "ref", "id = 1", True)
    text2 = values_of(db, "ref", "id = 2", False)
    # inserted as text (1) and as binary (3, the same values under another key), and the NULLs (2)
    bin3 = (wire.Binary(struct.pack(">i", 3)),) + bin1[1:]
    assert a.apply(writeset([t], [wire.Row("I", 0, (), text1), wire.Row("I", 0, (), text2),
                                  wire.Row("I", 0, (), bin3)])) == 3
    db.execute("INSERT INTO ref SELECT 3, i2, i8, num, f4, f8, b, t, vc, ch, by, d, tm, tmz, ts, tsz, iv, u, j, jb, "
               "ip, net, mac, ia, ta, bits, vb, rng, tsv, m, p, dom, pt, x, mn, oid_ FROM ref WHERE id = 1")
    assert rows_of(db, "typed") == rows_of(db, "ref")
    # row 2 takes row 1's values (binary), row 1 becomes all NULL (text); row 3 goes
    one = (wire.Binary(struct.pack(">i", 1)),)
    two = (wire.Binary(struct.pack(">i", 2)),)
    assert a.apply(writeset([t], [wire.Row("U", 0, two, two + bin1[1:]),
                                  wire.Row("U", 0, one, (b"1",) + text2[1:]),
                                  wire.Row("D", 0, (b"3",), ())])) == 3
    db.execute("DELETE FROM ref; INSERT INTO ref (id) VALUES (1)")
    db.execute(FULL_ROW.replace("1, -3,", "2, -3,").format(name="ref"))
    assert rows_of(db, "typed") == rows_of(db, "ref")


@PATHS
def test_generated_identity_and_defaults(db: psycopg.Connection[Any], executor: bool) -> None:
    db.autocommit = True
    db.execute("CREATE TABLE gen (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
               "a int NOT NULL, b int GENERATED ALWAYS AS (a + 1) STORED)")
    a = Applier(db, executor)
    t = table(db, "gen")
    # the origin's identity value is kept (OVERRIDING SYSTEM VALUE); b is computed here
    a.apply(writeset([t], [wire.Row("I", 0, (), (b"100", b"5", None))]))
    a.apply(writeset([t], [wire.Row("U", 0, (b"100",), (b"100", b"7", None))]))
    assert db.execute("SELECT id, a, b FROM gen").fetchall() == [(100, 7, 8)]
    # UPDATE gen SET id = DEFAULT on the origin: the executor sets it; a statement cannot
    changed = writeset([t], [wire.Row("U", 0, (b"100",), (b"101", b"7", None))])
    if executor:
        a.apply(changed)
        assert db.execute("SELECT id, a, b FROM gen").fetchall() == [(101, 7, 8)]
    else:
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="GENERATED ALWAYS identity"):
            a.apply(changed)


@PATHS
def test_partitions(db: psycopg.Connection[Any], executor: bool) -> None:
    db.autocommit = True
    db.execute("CREATE TABLE part (id int, k text, v int, PRIMARY KEY (id, k)) PARTITION BY LIST (k)")
    db.execute("CREATE TABLE part_a PARTITION OF part FOR VALUES IN ('a')")
    db.execute("CREATE TABLE part_b PARTITION OF part FOR VALUES IN ('b')")
    a = Applier(db, executor)
    pa, pb = table(db, "part_a", ("id", "k")), table(db, "part_b", ("id", "k"))
    root = table(db, "part", ("id", "k"))
    # capture writes a partition's rows as its own; a row named for the root is routed
    a.apply(writeset([pa, pb, root], [wire.Row("I", 0, (), (b"1", b"a", b"10")),
                                      wire.Row("I", 1, (), (b"2", b"b", b"20")),
                                      wire.Row("I", 2, (), (b"3", b"a", b"30"))]))
    a.apply(writeset([pa, pb], [wire.Row("U", 0, (b"1", b"a"), (b"1", b"a", b"11")),
                                wire.Row("D", 1, (b"2", b"b"), ())]))
    assert db.execute("SELECT tableoid::regclass::text, id, k, v FROM part ORDER BY id").fetchall() == [
        ("part_a", 1, "a", 11), ("part_a", 3, "a", 30)]
    # a row that does not belong to the partition named is refused, as in logical replication
    with pytest.raises(psycopg.errors.CheckViolation):
        a.apply(writeset([pb], [wire.Row("I", 0, (), (b"4", b"a", b"40"))]))


@PATHS
def test_triggers_in_replica_mode(db: psycopg.Connection[Any], executor: bool) -> None:
    db.autocommit = True
    db.execute("""
      CREATE TABLE trig (id int PRIMARY KEY, v text);
      CREATE TABLE trig_log (what text);
      CREATE FUNCTION trig_upper() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN NEW.v := upper(NEW.v); RETURN NEW; END $$;
      CREATE FUNCTION trig_note() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN INSERT INTO public.trig_log VALUES (TG_NAME || ' ' || TG_OP || ' ' || coalesce(NEW.v, OLD.v)); RETURN NULL; END $$;
      CREATE TRIGGER before_replica BEFORE INSERT OR UPDATE ON trig FOR EACH ROW EXECUTE FUNCTION trig_upper();
      ALTER TABLE trig ENABLE REPLICA TRIGGER before_replica;
      CREATE TRIGGER after_replica AFTER INSERT OR UPDATE OR DELETE ON trig FOR EACH ROW EXECUTE FUNCTION trig_note();
      ALTER TABLE trig ENABLE REPLICA TRIGGER after_replica;
      CREATE TRIGGER after_origin AFTER INSERT ON trig FOR EACH ROW EXECUTE FUNCTION trig_note();
    """)
    a = Applier(db, executor)
    t = table(db, "trig")
    a.apply(writeset([t], [wire.Row("I", 0, (), (b"1", b"x")), wire.Row("U", 0, (b"1",), (b"1", b"y")),
                           wire.Row("I", 0, (), (b"2", b"z")), wire.Row("D", 0, (b"2",), ())]))
    assert db.execute("SELECT id, v FROM trig").fetchall() == [(1, "Y")]
    # replica triggers fire, in row order; the origin-only one does not
    assert [r[0] for r in db.execute("SELECT what FROM trig_log").fetchall()] == [
        "after_replica INSERT X", "after_replica UPDATE Y", "after_replica INSERT Z", "after_replica DELETE Z"]


@PATHS
def test_constraints(db: psycopg.Connection[Any], executor: bool) -> None:
    db.autocommit = True
    db.execute("""
      CREATE TABLE parent (id int PRIMARY KEY);
      CREATE TABLE con (id int PRIMARY KEY, u int UNIQUE, c int CHECK (c > 0), n text NOT NULL,
                        p int REFERENCES parent);
    """)
    a = Applier(db, executor)
    t = table(db, "con")
    a.apply(writeset([t], [wire.Row("I", 0, (), (b"1", b"1", b"1", b"a", None))]))
    with pytest.raises(psycopg.errors.UniqueViolation):
        a.apply(writeset([t], [wire.Row("I", 0, (), (b"2", b"1", b"1", b"a", None))]))
    with pytest.raises(psycopg.errors.UniqueViolation):
        a.apply(writeset([t], [wire.Row("I", 0, (), (b"1", b"9", b"1", b"a", None))]))
    with pytest.raises(psycopg.errors.NotNullViolation):
        a.apply(writeset([t], [wire.Row("U", 0, (b"1",), (b"1", b"1", b"1", None, None))]))
    # foreign keys are the origin's to check (replica mode), as in logical replication; so are
    # CHECK constraints (docs/ARCHITECTURE.md invariant 10, docs/SECURITY.md): a check that reads the node's
    # settings or the clock would otherwise let its author pick the node that fails
    a.apply(writeset([t], [wire.Row("I", 0, (), (b"4", b"4", b"4", b"d", b"99"))]))
    a.apply(writeset([t], [wire.Row("I", 0, (), (b"3", b"3", b"0", b"a", None))]))
    assert db.execute("SELECT id FROM con ORDER BY id").fetchall() == [(1,), (3,), (4,)]
    # a failed writeset left nothing behind, and its GID did not commit
    assert a.apply(writeset([t], [wire.Row("D", 0, (b"4",), ())])) == 1


@PATHS
def test_missing_row_stops_with_a_clear_error(db: psycopg.Connection[Any], executor: bool) -> None:
    db.autocommit = True
    db.execute("CREATE TABLE miss (id int PRIMARY KEY, v text)")
    a = Applier(db, executor)
    t = table(db, "miss")
    for op in ("U", "D"):
        with pytest.raises(psycopg.errors.DataCorrupted, match=r"matched 0 rows: this node's data differs"):
            a.apply(writeset([t], [wire.Row(op, 0, (b"7",), (b"7", b"x") if op == "U" else ())]))


@PATHS
def test_same_row_twice_and_truncate(db: psycopg.Connection[Any], executor: bool) -> None:
    db.autocommit = True
    db.execute("CREATE TABLE twice (id int PRIMARY KEY, v int)")
    a = Applier(db, executor)
    t = table(db, "twice")
    a.apply(writeset([t], [wire.Row("I", 0, (), (b"1", b"1")), wire.Row("U", 0, (b"1",), (b"1", b"2")),
                           wire.Row("U", 0, (b"1",), (b"5", b"3")), wire.Row("I", 0, (), (b"1", b"4")),
                           wire.Row("T", 0), wire.Row("I", 0, (), (b"9", b"9")),
                           wire.Row("U", 0, (b"9",), (b"9", b"10"))]))
    assert db.execute("SELECT id, v FROM twice").fetchall() == [(9, 10)]


@PATHS
def test_tables_change_between_writesets(db: psycopg.Connection[Any], executor: bool) -> None:
    """What the apply keeps of a table across writesets follows the table's changes."""
    db.autocommit = True
    db.execute("CREATE TABLE chg (id int PRIMARY KEY, v text)")
    a = Applier(db, executor)
    a.apply(writeset([table(db, "chg")], [wire.Row("I", 0, (), (b"1", b"a"))]))
    db.execute("ALTER TABLE chg ADD COLUMN w int")
    a.apply(writeset([table(db, "chg")], [wire.Row("I", 0, (), (b"2", b"b", b"2"))]))
    db.execute("ALTER TABLE chg DROP COLUMN v, ALTER COLUMN w TYPE bigint")
    a.apply(writeset([table(db, "chg")], [wire.Row("U", 0, (b"2",), (b"2", b"20")),
                                          wire.Row("I", 0, (), (b"3", b"30"))]))
    # dropped and made again: another table of the same name
    db.execute("DROP TABLE chg; CREATE TABLE chg (w bigint, id int PRIMARY KEY)")
    a.apply(writeset([table(db, "chg")], [wire.Row("I", 0, (), (b"40", b"4"))]))
    assert db.execute("SELECT id, w FROM chg").fetchall() == [(4, 40)]
    # a column this node has and the writeset does not give takes its default
    db.execute("ALTER TABLE chg ADD COLUMN extra text DEFAULT 'here'")
    db.execute("UPDATE chg SET extra = 'before'")
    a.apply(writeset([wire.Table("public", "chg", (wire.Column("w", "bigint"), wire.Column("id", "integer")), (1,))],
                     [wire.Row("I", 0, (), (b"50", b"5")), wire.Row("U", 0, (b"4",), (b"41", b"4"))]))
    assert db.execute("SELECT id, w, extra FROM chg ORDER BY id").fetchall() == [(4, 41, "before"), (5, 50, "here")]
    # a column the writeset names and this node lacks stops the apply, naming it
    with pytest.raises(psycopg.errors.UndefinedColumn, match='column "gone"'):
        a.apply(writeset([wire.Table("public", "chg", (wire.Column("gone", "int"), wire.Column("id", "integer")),
                                     (1,))], [wire.Row("I", 0, (), (b"1", b"6"))]))


@PATHS
def test_schema_change_inside_a_writeset(db: psycopg.Connection[Any], executor: bool) -> None:
    db.autocommit = True
    db.execute("CREATE TABLE mig (id int PRIMARY KEY, v text)")
    a = Applier(db, executor)
    before = table(db, "mig")
    after = wire.Table("public", "mig", before.columns + (wire.Column("w", "integer"),), (0,))
    ddl = wire.Schema((("search_path", "public"),), "postgres", b"ALTER TABLE mig ADD COLUMN w int DEFAULT 0")
    a.apply(writeset([before, after], [wire.Row("I", 0, (), (b"1", b"a")), ddl,
                                       wire.Row("I", 1, (), (b"2", b"b", b"2")),
                                       wire.Row("U", 1, (b"1",), (b"1", b"a", b"1"))], flags=wire.FLAG_DDL))
    assert db.execute("SELECT id, v, w FROM mig ORDER BY id").fetchall() == [(1, "a", 1), (2, "b", 2)]


@PATHS
def test_unchanged_values_are_kept(db: psycopg.Connection[Any], executor: bool) -> None:
    """An UPDATE's unchanged (out-of-line) value is not sent: the row keeps the value it has."""
    db.autocommit = True
    db.execute("CREATE TABLE keep (id int PRIMARY KEY, n int, big text, nokey text)")
    db.execute("INSERT INTO keep VALUES (1, 0, repeat('x', 100000), 'a')")
    a = Applier(db, executor)
    t = table(db, "keep")
    a.apply(writeset([t], [wire.Row("U", 0, (b"1",), (b"1", b"5", wire.UNCHANGED, b"b"))]))
    assert db.execute("SELECT n, length(big), nokey FROM keep").fetchone() == (5, 100000, "b")
    # where there is no value to keep, it is refused
    with pytest.raises(psycopg.errors.DataCorrupted, match="unchanged value in an inserted row"):
        a.apply(writeset([t], [wire.Row("I", 0, (), (b"2", b"5", wire.UNCHANGED, b"b"))]))
    with pytest.raises(psycopg.errors.DataCorrupted, match="unchanged value in an old image"):
        a.apply(writeset([t], [wire.Row("D", 0, (wire.UNCHANGED,), ())]))


@PATHS
def test_no_primary_key(db: psycopg.Connection[Any], executor: bool) -> None:
    """Without an identity index the whole old row finds the row (prepared statements, always)."""
    db.autocommit = True
    db.execute("CREATE TABLE nokey (a int, b numeric)")
    a = Applier(db, executor)
    t = table(db, "nokey", identity=())
    a.apply(writeset([t], [wire.Row("I", 0, (), (b"1", b"1.0")), wire.Row("I", 0, (), (b"1", b"1.00"))]))
    # 1.00 is not 1.0: the row whose image is identical changes
    a.apply(writeset([t], [wire.Row("U", 0, (b"1", b"1.00"), (b"2", b"2"))]))
    assert db.execute("SELECT a, b::text FROM nokey ORDER BY a").fetchall() == [(1, "1.0"), (2, "2")]


@PATHS
def test_wide_tables_without_a_key(db: psycopg.Connection[Any], executor: bool) -> None:
    """A statement too long for the plan cache (a wide table without a key) is prepared for each
    writeset, never remembered past it: the next writeset of the run prepares it again."""
    db.autocommit = True
    names = [f"a_rather_long_column_name_number_{i:02d}" for i in range(40)]
    db.execute(sql.SQL("CREATE TABLE wide ({})").format(
        sql.SQL(", ").join(sql.SQL("{} int").format(sql.Identifier(n)) for n in names)))
    a = Applier(db, executor)
    t = table(db, "wide", identity=())
    row = tuple(b"%d" % i for i in range(40))
    a.apply(writeset([t], [wire.Row("I", 0, (), row)]))
    bumped = [tuple(b"%d" % (i + k) for i in range(40)) for k in range(4)]
    a.apply_run([writeset([t], [wire.Row("U", 0, bumped[k], bumped[k + 1])]) for k in range(3)])
    a.apply(writeset([t], [wire.Row("U", 0, bumped[3], row)]))
    assert db.execute(sql.SQL("SELECT {} FROM wide").format(sql.Identifier(names[39]))).fetchall() == [(39,)]


def test_an_identity_wider_than_its_table(db: psycopg.Connection[Any]) -> None:
    """A (damaged) table description whose identity has more columns than the table is read
    within bounds: the apply errs or applies, and the backend lives on."""
    db.autocommit = True
    db.execute("CREATE TABLE narrow (id int PRIMARY KEY)")
    db.execute("INSERT INTO narrow VALUES (1)")
    a = Applier(db, True)
    t = wire.Table("public", "narrow", (wire.Column("id", "integer"),), (0,) * 300)
    try:
        a.apply(writeset([t], [wire.Row("D", 0, (b"1",) * 300, ())]))
    except psycopg.Error as e:
        assert not isinstance(e, psycopg.OperationalError), e
    assert db.execute("SELECT 1").fetchone() == (1,)


def test_both_paths_agree_on_a_random_workload(db: psycopg.Connection[Any]) -> None:
    """The same random writesets (runs among them) leave the same rows on both paths, and the rows
    a model of them says."""
    db.autocommit = True
    for name in ("w_exec", "w_spi"):
        db.execute(sql.SQL("CREATE TABLE {} (k1 int, k2 text, v numeric, tags text[], note text, "
                           "PRIMARY KEY (k2, k1))").format(sql.Identifier(name)))
    rnd = random.Random(int(os.environ.get("CHORUS_FUZZ_SEED", "11")))
    model: dict[tuple[int, str], tuple[bytes, bytes, Optional[bytes]]] = {}
    plan: list[list[tuple[str, tuple[int, str], Any]]] = []
    for _ in range(120):
        ops = []
        for _ in range(rnd.randint(1, 6)):
            key = (rnd.randint(1, 25), rnd.choice("abc"))
            new = (str(rnd.randint(-999, 999) / 7)[:12].encode(), b"{%d,x}" % rnd.randint(0, 9),
                   None if rnd.random() < 0.3 else rnd.choice([b"", b"n", b"\xc3\xa9t\xc3\xa9"]))
            if key not in model:
                ops.append(("I", key, new))
                model[key] = new
            elif rnd.random() < 0.3:
                ops.append(("D", key, None))
                del model[key]
            else:
                moved = (key[0] + 100, key[1]) if rnd.random() < 0.1 and (key[0] + 100, key[1]) not in model else key
                ops.append(("U", key, (moved, new)))
                del model[key]
                model[moved] = new
        plan.append(ops)

    def rows(t: wire.Table, ops: list[tuple[str, tuple[int, str], Any]]) -> list[wire.Item]:
        out: list[wire.Item] = []
        for op, key, data in ops:
            k = (b"%d" % key[0], key[1].encode())
            if op == "I":
                out.append(wire.Row("I", 0, (), k + data))
            elif op == "D":
                out.append(wire.Row("D", 0, (k[1], k[0]), ()))
            else:
                moved, new = data
                out.append(wire.Row("U", 0, (k[1], k[0]), (b"%d" % moved[0], moved[1].encode()) + new))
        return out

    for name, executor in (("w_exec", True), ("w_spi", False)):
        a = Applier(db, executor)
        t = table(db, name, identity=("k2", "k1"))
        i = 0
        while i < len(plan):
            n = rnd.choice([1, 1, 3])
            chunk = [writeset([t], rows(t, ops)) for ops in plan[i:i + n]]
            if len(chunk) == 1:
                a.apply(chunk[0])
            else:
                a.apply_run(chunk)
            i += n
    assert rows_of(db, "w_exec") == rows_of(db, "w_spi")
    got = db.execute("SELECT k1, k2, v::text, tags::text, note FROM w_exec ORDER BY k1, k2").fetchall()
    want = sorted((k[0], k[1], float(v.decode()), t.decode(), None if n is None else n.decode())
                  for k, (v, t, n) in model.items())
    assert [(k1, k2, float(v), tags, note) for k1, k2, v, tags, note in got] == want


# -- large writesets: from a spool file, with bounded memory ---------------------------------


@pytest.fixture
def spool_dir() -> Iterator[Path]:
    """A directory the server may read (pytest's own are root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="chorus-spool-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _spool(d: Path, data: bytes, mode: int = 0o600, owner: str = "postgres") -> str:
    """A spool file as the coordinator (run as the server's user) makes one."""
    path = d / f"ws-{len(list(d.iterdir()))}.ws"
    path.write_bytes(data)
    os.chmod(path, mode)
    pw = pwd.getpwnam(owner)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    return str(path)


def _apply_file(conn: psycopg.Connection[Any], path: str) -> int:
    gid = int(conn.execute("SELECT chorus.committed_gid()").fetchone()[0])
    return int(conn.execute("SELECT chorus.apply_writeset_file(%s, %s, %s, -1)", (gid + 1, gid, path)).fetchone()[0])


@PATHS
def test_a_writeset_from_a_spool_file(db: psycopg.Connection[Any], executor: bool, spool_dir: Path) -> None:
    """A large writeset reaches the apply function as a file the coordinator wrote (mapped, never
    a bytea): the same rows; a file that is not a private spool file of the server's user is
    refused, and nothing is applied."""
    db.execute("CREATE TABLE spooled (id int PRIMARY KEY, v text)")
    a = Applier(db, executor)
    t = table(db, "spooled")
    ws = wire.encode(writeset([t], [wire.Row("I", 0, (), (b"%d" % i, b"v%d" % i)) for i in range(1, 2001)]
                              + [wire.Row("U", 0, (b"5",), (b"5", b"five")), wire.Row("D", 0, (b"6",), ())]))
    assert _apply_file(a.conn, _spool(spool_dir, ws)) == 2002
    assert db.execute("SELECT count(*), min(v), max(id) FROM spooled").fetchone() == (1999, "five", 2000)
    before = db.execute("SELECT chorus.committed_gid()").fetchone()
    for path, sqlstate in ((_spool(spool_dir, ws, mode=0o644), "42501"), (_spool(spool_dir, ws, owner="root"), "42501"),
                           (str(spool_dir / "missing.ws"), "58P01"), (_spool(spool_dir, b""), "XX001")):
        with pytest.raises(psycopg.Error) as e:
            _apply_file(a.conn, path)
        assert e.value.sqlstate == sqlstate, (path, e.value)
    assert db.execute("SELECT chorus.committed_gid()").fetchone() == before
    assert db.execute("SELECT count(*) FROM spooled").fetchone() == (1999,)


def test_a_large_writeset_of_a_table_without_a_key_takes_bounded_memory(db: psycopg.Connection[Any],
                                                                        spool_dir: Path) -> None:
    """Rows applied through prepared statements (a table without a key) free what each row took:
    300,000 rows (a 20 MB writeset) from a spool file raise the apply backend's memory by a few MB."""
    db.execute("CREATE TABLE nokey_big (a int, b text)")
    a = Applier(db, False)
    t = table(db, "nokey_big", identity=())
    ws = wire.encode(writeset([t], [wire.Row("I", 0, (), (b"%d" % i, b"%050d" % i)) for i in range(300_000)]))
    path = _spool(spool_dir, ws)
    pid = int(a.conn.execute("SELECT pg_backend_pid()").fetchone()[0])
    grew = peak_anon_growth_kb(pid, lambda: _apply_file(a.conn, path))
    assert db.execute("SELECT count(*) FROM nokey_big").fetchone() == (300_000,)
    print(f"apply backend: anonymous memory rose {grew} kB for a {len(ws) >> 20} MB writeset")
    assert grew < 12_000, grew


def test_after_triggers_of_a_large_writeset_fire_in_order(db: psycopg.Connection[Any]) -> None:
    """Past 10,000 rows the executor fires the queued AFTER ROW triggers and goes on (so the queue
    stays small): every row's trigger fires once, in row order."""
    db.execute("""
      CREATE TABLE trig_big (id int PRIMARY KEY);
      CREATE TABLE trig_big_log (n bigserial, id int);
      CREATE FUNCTION trig_big_note() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN INSERT INTO public.trig_big_log (id) VALUES (NEW.id); RETURN NULL; END $$;
      CREATE TRIGGER after_big AFTER INSERT ON trig_big FOR EACH ROW EXECUTE FUNCTION trig_big_note();
      ALTER TABLE trig_big ENABLE REPLICA TRIGGER after_big;
    """)
    a = Applier(db, True)
    t = table(db, "trig_big")
    ids = list(range(25_000, 0, -1))
    a.apply(writeset([t], [wire.Row("I", 0, (), (b"%d" % i,)) for i in ids]))
    assert [r[0] for r in db.execute("SELECT id FROM trig_big_log ORDER BY n").fetchall()] == ids


def test_a_run_partly_committed_here_says_up_to_where(db: psycopg.Connection[Any]) -> None:
    """The first GIDs of a run committed here already (by local backends, while the coordinator
    caught up): SQLSTATE CH002 and the GID in DETAIL, for the coordinator to apply the rest."""
    db.execute("CREATE TABLE partly (id int PRIMARY KEY)")
    a = Applier(db, True)
    t = table(db, "partly")
    w = [writeset([t], [wire.Row("I", 0, (), (b"%d" % i,))]) for i in range(3)]
    gid = int(db.execute("SELECT chorus.committed_gid()").fetchone()[0])
    a.apply(w[0])  # GID gid + 1, as a local backend would have committed it
    run = b"".join(struct.pack(">I", len(raw)) + raw for raw in (wire.encode(x) for x in w))
    with pytest.raises(psycopg.Error) as e:
        a.conn.execute("SELECT chorus.apply_run(%s, %s, %s)", (gid + 3, gid, run))
    assert e.value.sqlstate == "CH002" and e.value.diag.message_detail == f"committed up to GID {gid + 1}"
    rest = b"".join(struct.pack(">I", len(raw)) + raw for raw in (wire.encode(x) for x in w[1:]))
    a.conn.execute("SELECT chorus.apply_run(%s, %s, %s)", (gid + 3, gid + 1, rest))
    assert db.execute("SELECT count(*) FROM partly").fetchone() == (3,)


def test_a_table_without_a_key_takes_inserts_through_the_executor_and_triggers_keep_row_order(
        db: psycopg.Connection[Any]) -> None:
    """Its INSERTs need no identity (the executor), its UPDATEs and DELETEs find the row by the
    whole old row (a statement): AFTER ROW triggers still fire in row order across both."""
    db.execute("""
      CREATE TABLE nk_trig (a int, b text);
      CREATE TABLE nk_trig_log (n bigserial, what text);
      CREATE FUNCTION nk_note() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN INSERT INTO public.nk_trig_log (what) VALUES (TG_OP || ' ' || coalesce(NEW.b, OLD.b)); RETURN NULL; END $$;
      CREATE TRIGGER nk_after AFTER INSERT OR UPDATE OR DELETE ON nk_trig FOR EACH ROW EXECUTE FUNCTION nk_note();
      ALTER TABLE nk_trig ENABLE REPLICA TRIGGER nk_after;
    """)
    a = Applier(db, True)
    t = table(db, "nk_trig", identity=())
    a.apply(writeset([t], [wire.Row("I", 0, (), (b"1", b"a")), wire.Row("U", 0, (b"1", b"a"), (b"1", b"b")),
                           wire.Row("I", 0, (), (b"2", b"c")), wire.Row("D", 0, (b"2", b"c"), ()),
                           wire.Row("I", 0, (), (b"3", b"d"))]))
    assert db.execute("SELECT a, b FROM nk_trig ORDER BY a").fetchall() == [(1, "b"), (3, "d")]
    assert [r[0] for r in db.execute("SELECT what FROM nk_trig_log ORDER BY n").fetchall()] == [
        "INSERT a", "UPDATE b", "INSERT c", "DELETE c", "INSERT d"]


# ---- whose rights an apply runs with (docs/ARCHITECTURE.md invariant 10, docs/SECURITY.md) ------------------

def _owned_table(db: psycopg.Connection[Any], name: str, key: bool) -> None:
    """A table owned by an ordinary role, with what a hostile owner could arrange: a CHECK and
    a domain that reject the row, row security forced on it with a policy that hides every row,
    its own privileges revoked, and a trigger enabled REPLICA (its function a superuser's, as
    Chorus requires of code that fires on apply) that notes whose rights it runs with and tries
    to become the apply session's superuser and to change the session's settings."""
    db.execute("DO $$ BEGIN CREATE ROLE app_owner NOLOGIN; EXCEPTION WHEN duplicate_object THEN END $$")
    db.execute("DROP DOMAIN IF EXISTS positive CASCADE")
    db.execute("CREATE DOMAIN positive AS int CHECK (VALUE > 0)")
    db.execute(sql.SQL("CREATE TABLE {} (id int {}, c int CHECK (c > 0), d positive, v text)").format(
        sql.Identifier(name), sql.SQL("PRIMARY KEY" if key else "")))
    db.execute(sql.SQL("""
      CREATE TABLE IF NOT EXISTS public.who_log (t text, cur text, sess text, set_role text);
      GRANT INSERT ON public.who_log TO app_owner;
      CREATE OR REPLACE FUNCTION public.who() RETURNS trigger LANGUAGE plpgsql AS $$
      DECLARE err text := 'allowed';
      BEGIN
        BEGIN
          SET ROLE postgres;
        EXCEPTION WHEN others THEN err := SQLERRM;
        END;
        PERFORM pg_catalog.set_config('statement_timeout', '1', false);
        INSERT INTO public.who_log VALUES (TG_TABLE_NAME, current_user, session_user, err);
        RETURN NEW;
      END $$;
      CREATE TRIGGER who BEFORE INSERT OR UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION public.who();
      ALTER TABLE {t} ENABLE REPLICA TRIGGER who;
      ALTER TABLE {t} ENABLE ROW LEVEL SECURITY;
      ALTER TABLE {t} FORCE ROW LEVEL SECURITY;
      CREATE POLICY nothing ON {t} USING (false) WITH CHECK (false);
      ALTER TABLE {t} OWNER TO app_owner;
      REVOKE ALL ON {t} FROM app_owner;
    """).format(t=sql.Identifier(name)))


@PATHS
def test_rows_are_applied_as_the_table_owner_restricted(db: psycopg.Connection[Any], executor: bool) -> None:
    """Rows are applied with the table owner's rights, in a restricted security context, as
    PostgreSQL 16's subscriptions apply them (run_as_owner off): a trigger that fires on apply runs
    as the owner and cannot SET ROLE to the apply session's superuser; what it sets of the session
    is undone; the origin's checks (CHECK, domain, row security, privileges) are not made again."""
    _owned_table(db, "owned", key=True)
    a = Applier(db, executor)
    t = table(db, "owned")
    timeout = db.execute("SHOW statement_timeout").fetchone()[0]
    a.apply(writeset([t], [wire.Row("I", 0, (), (b"1", b"-1", b"-1", b"x"))]))
    a.apply(writeset([t], [wire.Row("U", 0, (b"1",), (b"1", b"-2", b"-2", b"y"))]))
    assert db.execute("SELECT id, c, d, v FROM owned").fetchall() == [(1, -2, -2, "y")]
    log = db.execute("SELECT cur, sess, set_role FROM public.who_log").fetchall()
    assert len(log) == 2
    for cur, sess, set_role in log:
        assert (cur, sess) == ("app_owner", "postgres")
        assert 'cannot set parameter "role"' in set_role
    assert db.execute("SHOW statement_timeout").fetchone()[0] == timeout
    assert db.execute("SELECT current_user").fetchone()[0] == "postgres"


@PATHS
def test_a_table_without_a_key_is_applied_as_its_owner_too(db: psycopg.Connection[Any], executor: bool) -> None:
    """The statement path (a table without a key): the same rights, and the same checks left to
    the origin, whatever the owner revoked from itself."""
    _owned_table(db, "owned_nk", key=False)
    a = Applier(db, executor)
    t = table(db, "owned_nk", ())
    a.apply(writeset([t], [wire.Row("I", 0, (), (b"1", b"-1", b"-1", b"x"))]))
    a.apply(writeset([t], [wire.Row("U", 0, (b"1", b"-1", b"-1", b"x"), (b"1", b"-3", b"-3", b"z"))]))
    a.apply(writeset([t], [wire.Row("D", 0, (b"1", b"-3", b"-3", b"z"), ())]))
    assert db.execute("SELECT count(*) FROM owned_nk").fetchone() == (0,)
    log = db.execute("SELECT cur, set_role FROM public.who_log").fetchall()
    assert log and all(cur == "app_owner" and 'cannot set parameter "role"' in err for cur, err in log)


@PATHS
def test_the_statement_path_resolves_nothing_by_search_path(db: psycopg.Connection[Any], executor: bool) -> None:
    """A table without a key whose key type's equality lives outside pg_catalog (citext): the
    apply session's search_path names pg_catalog only, and the statement names the operator in
    full; an operator a role put in public for the same types is not used."""
    db.execute("CREATE EXTENSION IF NOT EXISTS citext")
    db.execute("CREATE TABLE ci (id citext PRIMARY KEY, v int)")
    db.execute("""CREATE FUNCTION public.hijack(int, int) RETURNS boolean LANGUAGE sql
                  AS 'SELECT pg_catalog.int4eq($1, $2) AND pg_catalog.pg_sleep(0) IS NOT NULL AND false'""")
    db.execute("CREATE OPERATOR public.= (LEFTARG = int, RIGHTARG = int, FUNCTION = public.hijack)")
    db.execute("CREATE TABLE plain_nk (a int, b int)")
    a = Applier(db, executor)
    db.execute("SET chorus.apply_executor = off")  # the statement path whatever the fixture says
    ci = table(db, "ci")
    a.apply(writeset([ci], [wire.Row("I", 0, (), (b"Key", b"1"))]))
    a.apply(writeset([ci], [wire.Row("U", 0, (b"KEY",), (b"Key", b"2"))]))
    assert db.execute("SELECT id::text, v FROM ci").fetchall() == [("Key", 2)]
    nk = table(db, "plain_nk", ())
    a.apply(writeset([nk], [wire.Row("I", 0, (), (b"1", b"1"))]))
    a.apply(writeset([nk], [wire.Row("U", 0, (b"1", b"1"), (b"1", b"2"))]))
    assert db.execute("SELECT a, b FROM plain_nk").fetchall() == [(1, 2)]


def test_a_replayed_schema_change_runs_as_its_role_restricted(db: psycopg.Connection[Any]) -> None:
    """A schema change item runs as the role that ran it on its origin, in a restricted security
    context: it cannot SET ROLE (or RESET ROLE, or SET SESSION AUTHORIZATION) to the apply
    session's superuser; a role this node lacks is an error, never a reason to run it as the
    apply session's user."""
    db.execute("DO $$ BEGIN CREATE ROLE app_ddl NOLOGIN; EXCEPTION WHEN duplicate_object THEN END $$")
    db.execute("GRANT CREATE ON SCHEMA public TO app_ddl")
    a = Applier(db, True)
    path = (("search_path", "public"),)
    made = wire.Schema(path, "app_ddl", b"CREATE TABLE by_app (id int)")
    a.apply(writeset([], [made], flags=wire.FLAG_DDL))
    assert db.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'by_app'").fetchone() == ("app_ddl",)
    for statement in (b"SET ROLE postgres", b"RESET ROLE", b"SET SESSION AUTHORIZATION postgres",
                      b"SELECT pg_catalog.set_config('role', 'postgres', false)"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="cannot set parameter"):
            a.apply(writeset([], [wire.Schema(path, "app_ddl", statement)], flags=wire.FLAG_DDL))
    with pytest.raises(psycopg.errors.UndefinedObject, match='role "nobody here" does not exist on this node'):
        a.apply(writeset([], [wire.Schema(path, "nobody here", b"CREATE TABLE never (id int)")], flags=wire.FLAG_DDL))
    assert db.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'never'").fetchone() == (0,)
    assert db.execute("SELECT current_user").fetchone()[0] == "postgres"
