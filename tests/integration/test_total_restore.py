"""Total recovery restores everything, not only rows (docs/RECOVERY.md, "Total recovery", step 3):
after it the joiner's ``pg_dump --schema-only`` (owners and privileges included) is the donor's,
the roles the schema needs exist, the extensions are there and its sequences stand past the
donor's. A node whose schema and roles were wiped, and a node whose schema drifted, are rebuilt."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import psycopg
import pytest

from conftest import Cluster, chorus

pytest.importorskip("pyspark")

OFF = "-c chorus.capture=off -c chorus.replicate_ddl=off -c chorus.replicate_roles=off"
ROLES = ("trs_owner", "trs_app", "trs_reader", "trs_fn")

SCHEMA = [
    "CREATE ROLE trs_owner LOGIN PASSWORD 'owner-pw'",
    "CREATE ROLE trs_app LOGIN",
    "CREATE ROLE trs_reader NOLOGIN",
    "CREATE ROLE trs_fn NOLOGIN",
    "GRANT trs_reader TO trs_app",
    "CREATE SCHEMA trs AUTHORIZATION trs_owner",
    "CREATE EXTENSION IF NOT EXISTS citext WITH SCHEMA trs",
    "CREATE EXTENSION IF NOT EXISTS pgcrypto WITH SCHEMA trs",
    "ALTER DEFAULT PRIVILEGES FOR ROLE trs_owner IN SCHEMA trs GRANT SELECT ON TABLES TO trs_reader",
    "ALTER DEFAULT PRIVILEGES FOR ROLE trs_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC",
    "SET ROLE trs_owner",
    "CREATE TYPE trs.mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN trs.posint AS integer CHECK (VALUE > 0)",
    """CREATE TABLE trs.everything (
        id bigserial PRIMARY KEY, small smallint, i integer, big bigint, num numeric(20, 6), r real,
        d double precision, money_ money, t text, vc varchar(40), ch char(3), name_ trs.citext, b boolean,
        bin bytea, day date, tm time, tmtz timetz, ts timestamp, tstz timestamptz, span interval,
        u uuid, j json, jb jsonb, x xml, ip inet, net cidr, mac macaddr, arr integer[], tarr text[],
        rng int4range, trng tstzrange, pt point, bits bit(4), vbits varbit(8), mood_ trs.mood,
        n trs.posint, tsv tsvector, gen bigint GENERATED ALWAYS AS (big * 2) STORED)""",
    "CREATE TABLE trs.ident (id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text NOT NULL DEFAULT '')",
    "CREATE SEQUENCE trs.standalone INCREMENT BY 5 START WITH 100",
    """CREATE TABLE trs.measure (id bigint NOT NULL, at date NOT NULL, v numeric, PRIMARY KEY (id, at))
       PARTITION BY RANGE (at)""",
    "CREATE TABLE trs.measure_2025 PARTITION OF trs.measure FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')",
    "CREATE TABLE trs.measure_2026 PARTITION OF trs.measure FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
    "CREATE INDEX measure_v ON trs.measure (v)",
    "CREATE INDEX everything_lower_t ON trs.everything (lower(t)) WHERE t IS NOT NULL",
    "CREATE TABLE trs.audit (id bigserial PRIMARY KEY, what text, at timestamptz DEFAULT now())",
    """CREATE FUNCTION trs.audit_it() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
       BEGIN INSERT INTO trs.audit (what) VALUES (TG_OP || ' ' || NEW.id); RETURN NEW; END $$""",
    "CREATE TRIGGER everything_audit AFTER INSERT ON trs.everything FOR EACH ROW EXECUTE FUNCTION trs.audit_it()",
    "CREATE FUNCTION trs.double(x integer) RETURNS integer LANGUAGE sql IMMUTABLE RETURN x * 2",
    "CREATE VIEW trs.happy AS SELECT id, t, trs.double(i) AS i2 FROM trs.everything WHERE mood_ = 'happy'",
    "CREATE MATERIALIZED VIEW trs.mood_count AS SELECT mood_, count(*) AS n FROM trs.everything GROUP BY mood_",
    "COMMENT ON TABLE trs.everything IS 'every common column type'",
    "RESET ROLE",
    "ALTER FUNCTION trs.double(integer) OWNER TO trs_fn",
    "GRANT USAGE ON SCHEMA trs TO trs_app, trs_reader",
    "GRANT SELECT, INSERT ON trs.everything TO trs_app",
    "GRANT SELECT (id), UPDATE (note) ON trs.ident TO trs_app",
    "GRANT EXECUTE ON FUNCTION trs.double(integer) TO trs_app",
    "GRANT USAGE ON SEQUENCE trs.standalone, trs.everything_id_seq TO trs_app",
    "REVOKE ALL ON trs.audit FROM trs_reader",
    "CREATE TABLE public.trs_plain (k text PRIMARY KEY, v integer)",
    "ALTER TABLE public.trs_plain OWNER TO trs_app",
]

FILL = [
    """INSERT INTO trs.everything (small, i, big, num, r, d, money_, t, vc, ch, name_, b, bin, day, tm, tmtz, ts,
         tstz, span, u, j, jb, x, ip, net, mac, arr, tarr, rng, trng, pt, bits, vbits, mood_, n, tsv)
       SELECT g % 100, g, g * 1000, g / 7.0, g / 3.0, g / 9.0, g, 'text ' || g, 'vc' || g, 'abc', 'Name' || g,
              g % 2 = 0, trs.digest(g::text, 'sha1'), DATE '2026-01-01' + g, TIME '10:00' + g * interval '1 s',
              TIMETZ '10:00+02', TIMESTAMP '2026-01-01' + g * interval '1 min', now(), g * interval '1 h',
              trs.gen_random_uuid(), json_build_object('g', g), jsonb_build_object('g', g), '<a>1</a>',
              '10.0.0.1', '10.0.0.0/8', '08:00:2b:01:02:03', ARRAY[g, g + 1], ARRAY['a', NULL],
              int4range(g, g + 10), tstzrange(now(), NULL), point(g, g), B'1010', B'101',
              (ARRAY['sad', 'ok', 'happy'])[g % 3 + 1]::trs.mood, g, to_tsvector('simple', 'row ' || g)
         FROM generate_series(1, 300) g""",
    "INSERT INTO trs.ident (note) SELECT 'n' || g FROM generate_series(1, 50) g",
    "INSERT INTO trs.measure SELECT g, DATE '2025-06-01' + (g % 400), g FROM generate_series(1, 400) g",
    "INSERT INTO trs_plain SELECT 'k' || g, g FROM generate_series(1, 100) g",
    "SELECT nextval('trs.standalone') FROM generate_series(1, 7)",
    "REFRESH MATERIALIZED VIEW trs.mood_count",
]


def _dump(cluster: Cluster, i: int) -> list[str]:
    """The node's schema, with owners and privileges. Each node's sequences start in its own
    class (``START WITH start + (node_number - 1) * increment``, docs/DDL.md "Sequences"), so
    the START WITH lines differ by design and are left out; comments and blank lines too, and
    psql's \\restrict and \\unrestrict lines (pg_dump 15.14+), whose key is new in every dump."""
    node = cluster.info["nodes"][i]
    out = subprocess.run(["/usr/lib/postgresql/15/bin/pg_dump", "--schema-only", f"--dbname={node['socket_dsn']}"],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines()
            if line.strip() and not line.startswith(("--", "\\restrict ", "\\unrestrict "))
            and not re.match(r"^\s+START WITH -?\d+$", line)]


def _setup(cluster: Cluster) -> None:
    _cleanup(cluster)
    with cluster.connect(0) as c:
        for stmt in SCHEMA + FILL:
            c.execute(stmt)
    cluster.quiesce()


def _cleanup(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("DROP SCHEMA IF EXISTS trs CASCADE")
        c.execute("DROP TABLE IF EXISTS public.trs_plain")
        for r in ROLES:
            if c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (r,)).fetchone():
                c.execute(f"DROP OWNED BY {r} CASCADE")
        for r in reversed(ROLES):
            c.execute(f"DROP ROLE IF EXISTS {r}")
    cluster.quiesce()


def _rebuild(cluster: Cluster, i: int) -> str:
    r = chorus("node", "join", "--total", "--dir", cluster.dir, cluster.nodes[i].name, "--range-rows", "100",
               "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert json.loads(r.stdout)["state"] == "online"
    return r.stderr


def _sequences(c: psycopg.Connection[Any]) -> dict[str, int]:
    return {f"{s}.{n}": v for s, n, v in c.execute(
        "SELECT schemaname, sequencename, last_value FROM pg_sequences WHERE schemaname = 'trs' "
        "AND last_value IS NOT NULL").fetchall()}


def _assert_restored(cluster: Cluster, donor: int, joiner: int, donor_seqs: dict[str, int]) -> None:
    cluster.assert_identical()
    assert _dump(cluster, joiner) == _dump(cluster, donor)
    with cluster.connect(joiner) as c:
        roles = dict(c.execute("SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'trs\\_%'").fetchall())
        assert roles == {"trs_owner": True, "trs_app": True, "trs_reader": False, "trs_fn": False}
        assert c.execute("SELECT pg_has_role('trs_app', 'trs_reader', 'MEMBER')").fetchone() == (True,)
        assert c.execute("SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid "
                         "WHERE rolname = 'trs_owner'").fetchone() == (True,)
        exts = {r[0] for r in c.execute("SELECT extname FROM pg_extension").fetchall()}
        assert {"citext", "pgcrypto", "chorus"} <= exts
        assert c.execute("SELECT count(*) FROM trs.mood_count").fetchone() == (3,)  # populated again
        assert c.execute("SELECT count(*) FROM trs.measure").fetchone() == (400,)
        # sequences continue past the donor's position, in this node's class
        for name, v in donor_seqs.items():
            nxt = c.execute("SELECT nextval(%s)", (name,)).fetchone()
            assert nxt is not None and nxt[0] > v, (name, nxt, v)
        # privileges work as on the donor: the role can insert, and the trigger fires as its owner
        c.execute("SET ROLE trs_app")
        c.execute("INSERT INTO trs.everything (t, mood_) VALUES ('by trs_app', 'ok')")
        c.execute("UPDATE trs.ident SET note = note WHERE id = 1")  # its column grant
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT what FROM trs.audit")  # revoked from trs_reader, its role
        c.execute("RESET ROLE")
    cluster.quiesce()


def test_wiped_node_gets_schema_roles_extensions_and_sequences_back(cluster: Cluster) -> None:
    _setup(cluster)
    joiner = 2
    with cluster.connect(0) as c:
        donor_seqs = _sequences(c)
    # the node loses its schema, the extensions and the roles (behind Chorus's back)
    with psycopg.connect(cluster.dsn(joiner), autocommit=True, options=OFF) as c:
        c.execute("DROP SCHEMA trs CASCADE")
        c.execute("DROP TABLE public.trs_plain")
        for r in ROLES:
            c.execute(f"DROP OWNED BY {r} CASCADE")
        for r in reversed(ROLES):
            c.execute(f"DROP ROLE {r}")
    err = _rebuild(cluster, joiner)
    assert "created the roles trs_app, trs_fn, trs_owner, trs_reader" in err, err[-3000:]
    assert "rebuilt the schema" in err and "WARNING" not in err, err[-3000:]
    _assert_restored(cluster, 0, joiner, donor_seqs)


def test_drifted_node_gets_the_donor_schema_and_keeps_its_rows(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        present = c.execute("SELECT to_regclass('trs.everything') IS NOT NULL").fetchone() == (True,)
    if not present:
        _setup(cluster)
    joiner = 1
    with cluster.connect(0) as c:
        donor_seqs = _sequences(c)
    with psycopg.connect(cluster.dsn(joiner), autocommit=True, options=OFF) as c:  # drift
        c.execute("CREATE OR REPLACE VIEW trs.happy AS SELECT id, t, i AS i2 FROM trs.everything")
        c.execute("DROP INDEX trs.measure_v")
        c.execute("REVOKE SELECT ON trs.everything FROM trs_app")
        c.execute("GRANT ALL ON trs.audit TO PUBLIC")
        c.execute("CREATE TABLE trs.only_here (id int PRIMARY KEY)")
        c.execute("CREATE FUNCTION trs.extra() RETURNS int LANGUAGE sql RETURN 1")
        c.execute("ALTER TABLE trs.ident OWNER TO trs_app")
        c.execute("DROP EXTENSION citext CASCADE")  # and with it the column of that type
        c.execute("DROP OWNED BY trs_fn CASCADE")
        c.execute("DROP ROLE trs_fn")
        c.execute("UPDATE trs.measure SET v = -1 WHERE id <= 3")
    err = _rebuild(cluster, joiner)
    assert "created the roles trs_fn" in err and "rebuilt the schema" in err, err[-3000:]
    assert "WARNING" not in err, err[-3000:]
    kept = re.search(r"kept the (\d+) rows of (\d+) tables", err)
    assert kept and int(kept[1]) >= 400, err[-3000:]  # measure's partitions, at least, were kept
    _assert_restored(cluster, 0, joiner, donor_seqs)
    with cluster.connect(joiner) as c:
        assert c.execute("SELECT count(*) FROM trs.measure WHERE v = -1").fetchone() == (0,)


def test_a_node_whose_schema_agrees_is_left_as_it_is(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        present = c.execute("SELECT to_regclass('trs.everything') IS NOT NULL").fetchone() == (True,)
    if not present:
        _setup(cluster)
    err = _rebuild(cluster, 1)
    assert "the schema is the donor's already" in err, err[-3000:]
    assert _dump(cluster, 1) == _dump(cluster, 0)
    _cleanup(cluster)
