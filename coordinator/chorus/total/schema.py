"""Total recovery, step 3: the joiner's schema made the donor's (docs/RECOVERY.md).

Everything ``pg_dump --schema-only`` shows, owners and privileges included, except the chorus
extension's own objects: tables, partitions, indexes, constraints, views, materialized views,
functions, triggers, sequences, types, extensions, grants (column grants too) and default
privileges. Roles are global to a PostgreSQL instance; the roles the donor has and the joiner
lacks are created first (:func:`copy_roles`), existing roles are never altered or dropped.

The decision is made on the two dumps, compared as text (:func:`normalise`: comments, ``SET``
lines and a sequence's ``START WITH`` are left out; the start is each node's own sequence class,
set by ``move_sequences`` after the data):
- identical: nothing is touched, and the diff compares rows only;
- different: the joiner's user objects are dropped and the donor's dump (taken at the snapshot)
  is restored whole, owners and privileges included. Rows of tables whose definition is the same
  on both sides are kept (copied aside as text and back, on the joiner, not over the network),
  so a node with a drifted view or function still takes only its changed rows from the donor.
  Afterwards the joiner is dumped again; anything still different is reported.

Nothing here is replicated: the session runs with ``chorus.capture``, ``chorus.replicate_ddl``
and ``chorus.replicate_roles`` off and the ``chorus_on_ddl_end`` event trigger disabled (the dump
carries the sequences as the donor has them). The capture triggers are internal, so no dump
carries them: :func:`sync_capture` captures on the joiner exactly the tables the donor captures.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import psycopg
from psycopg import sql

from chorus.total.conn import Endpoint

PGBIN = Path("/usr/lib/postgresql/15/bin")
OFF = "-c chorus.capture=off -c chorus.replicate_ddl=off -c chorus.replicate_roles=off"
KEEP_SCHEMA = "chorus_recovery_keep"
# schemas that are not the application's: the extension's, the staging schemas, the system's
OWN_SCHEMAS = ("chorus", "chorus_recovery", KEEP_SCHEMA)


class SchemaSyncError(Exception):
    pass


# ---- the dumps: pure text ----------------------------------------------------------------------

_HEADER = re.compile(r"^-- Name: (?P<name>.*); Type: (?P<type>.*); Schema: (?P<schema>.*); Owner: (?P<owner>.*)$")


@dataclass(frozen=True)
class Entry:
    """One object of a plain ``pg_dump`` (the text under its ``-- Name: ...`` header)."""

    type: str
    schema: str
    name: str
    owner: str
    text: str

    @property
    def chorus_own(self) -> bool:
        """The chorus extension, its schema and what is in it, and the staging schemas."""
        if self.schema in OWN_SCHEMAS:
            return True
        if self.type == "EXTENSION" and self.name == "chorus":
            return True
        if self.type == "SCHEMA" and self.name in OWN_SCHEMAS:
            return True
        return self.type in ("COMMENT", "ACL") and self.name in (
            "EXTENSION chorus", *(f"SCHEMA {s}" for s in OWN_SCHEMAS))


def entries(dump: str) -> list[Entry]:
    """The dump's objects in its order (the text before the first header is left out)."""
    out: list[Entry] = []
    head: Optional[re.Match[str]] = None
    lines: list[str] = []
    for line in dump.splitlines():
        m = _HEADER.match(line)
        if m:
            if head:
                out.append(_entry(head, lines))
            head, lines = m, []
        elif head:
            lines.append(line)
    if head:
        out.append(_entry(head, lines))
    return out


def _entry(m: re.Match[str], lines: list[str]) -> Entry:
    # the header's own "--" frame lines around it are comments: dropped by normalise
    return Entry(m["type"], m["schema"], m["name"], m["owner"], "\n".join(lines))


_START = re.compile(r"^\s+START WITH -?\d+$")


def _significant(text: str) -> list[str]:
    # \restrict and \unrestrict (pg_dump 15.14 and later) carry a key drawn afresh for each dump
    return [line for line in text.splitlines()
            if line.strip() and not line.startswith(("--", "SET ", "\\restrict ", "\\unrestrict "))
            and not line.startswith("SELECT pg_catalog.set_config('search_path'") and not _START.match(line)]


def restorable(dump: str) -> str:
    """The dump without the chorus extension's objects (the joiner has its own)."""
    keep: list[str] = []
    preamble, _, _ = dump.partition("\n--\n-- Name: ")
    keep.append(preamble)
    for e in entries(dump):
        if not e.chorus_own:
            keep.append(f"--\n-- Name: {e.name}; Type: {e.type}; Schema: {e.schema}; Owner: {e.owner}\n{e.text}")
    return "\n".join(keep) + "\n"


def normalise(dump: str) -> list[str]:
    """What must be equal on donor and joiner: every statement of every object but the chorus
    extension's, without comments, ``SET`` lines and sequences' ``START WITH`` (each node's
    sequences start in its own class)."""
    out: list[str] = []
    for e in entries(dump):
        if not e.chorus_own:
            out.append(f"-- {e.type} {e.schema} {e.name} {e.owner}")
            out.extend(_significant(e.text))
    return out


def differences(donor: str, joiner: str, limit: int = 40) -> list[str]:
    """The first lines of a unified diff of the normalised dumps (empty when they agree)."""
    d = list(difflib.unified_diff(normalise(donor), normalise(joiner), "donor", "joiner", lineterm="", n=1))
    return d[:limit]


def table_entries(dump: str) -> dict[str, str]:
    """``schema.name`` -> the text of its TABLE entry (its columns, types, defaults)."""
    return {f"{e.schema}.{e.name}": "\n".join(_significant(e.text)) for e in entries(dump) if e.type == "TABLE"}


_IDENT = r'(?:"(?:[^"]|"")*"|[A-Za-z_][A-Za-z0-9_$]*)'
_ROLE_STMT = re.compile(rf"^(?:CREATE ROLE|ALTER ROLE|COMMENT ON ROLE|SECURITY LABEL FOR {_IDENT} ON ROLE) ({_IDENT})")
_GRANT = re.compile(rf"^GRANT ({_IDENT}) TO ({_IDENT})")


def unquote(ident: str) -> str:
    return ident[1:-1].replace('""', '"') if ident.startswith('"') else ident


def role_statements(dumpall: str, missing: set[str]) -> list[str]:
    """The statements of ``pg_dumpall --roles-only`` that create the ``missing`` roles (their
    attributes, password hashes, settings, comments) and grant memberships that involve them."""
    out: list[str] = []
    for line in dumpall.splitlines():
        m = _ROLE_STMT.match(line)
        if m and unquote(m[1]) in missing:
            out.append(line)
            continue
        g = _GRANT.match(line)
        if g and (unquote(g[1]) in missing or unquote(g[2]) in missing):
            out.append(line)
    return out


def dumped_roles(dumpall: str) -> list[str]:
    return [unquote(m[1]) for line in dumpall.splitlines() if (m := re.match(rf"^CREATE ROLE ({_IDENT});", line))]


# ---- I/O -----------------------------------------------------------------------------------------

Say = Callable[[str], None]


def _run(ep: Endpoint, program: str, args: list[str], what: str, options: str = "",
         stdin: Optional[str] = None) -> str:
    dbname, secret_env = ep.program(options)
    env = dict(os.environ, **secret_env)
    if program == "psql":
        args = ["-X", "-q", "-v", "ON_ERROR_STOP=1", *args]
    r = subprocess.run([str(PGBIN / program), *args, f"--dbname={dbname}"], input=stdin, capture_output=True,
                       text=True, env=env)
    if r.returncode != 0:
        raise SchemaSyncError(f"{what} failed: {r.stderr.strip()}")
    return r.stdout


def dump_schema(ep: Endpoint, snapshot: Optional[str] = None) -> str:
    """``pg_dump --schema-only`` with owners and privileges (at the snapshot, for the donor)."""
    args = ["--schema-only"] + ([f"--snapshot={snapshot}"] if snapshot else [])
    return _run(ep, "pg_dump", args, f"pg_dump of {ep.name}'s schema")


def copy_roles(donor: Endpoint, conn: psycopg.Connection[Any]) -> list[str]:
    """Create on the joiner the roles the donor has and it lacks (``pg_dumpall --roles-only``,
    password hashes included when the donor's user may read them); never alter or drop one."""
    try:
        dumpall = _run(donor, "pg_dumpall", ["--roles-only"], f"pg_dumpall --roles-only of {donor.name}")
    except SchemaSyncError:  # not a superuser on the donor: no password hashes then
        dumpall = _run(donor, "pg_dumpall", ["--roles-only", "--no-role-passwords"],
                       f"pg_dumpall --roles-only of {donor.name}")
    have = {r[0] for r in conn.execute("SELECT rolname FROM pg_roles").fetchall()}
    missing = {r for r in dumped_roles(dumpall) if r not in have and not r.startswith("pg_")}
    if not missing:
        return []
    conn.execute("SET chorus.replicate_roles = off")
    try:
        with conn.transaction():
            for stmt in role_statements(dumpall, missing):
                conn.execute(stmt.encode())
    finally:
        conn.execute("RESET chorus.replicate_roles")
    return [f"created the roles {', '.join(sorted(missing))} (as on the donor)"]


_USER_SCHEMAS = """
SELECT n.nspname FROM pg_namespace n
 WHERE n.nspname NOT IN ('public', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%'
   AND n.nspname <> ALL(%s)
   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_namespace'::regclass
                   AND d.objid = n.oid AND d.deptype = 'e')
"""

# the objects in schema public that no extension owns, as DROP statements (IF EXISTS: a cascade
# may have taken them already)
_PUBLIC_OBJECTS = """
WITH ext AS (SELECT classid, objid FROM pg_depend WHERE deptype = 'e')
SELECT format('DROP %s IF EXISTS %s CASCADE', CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
              WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE' WHEN 'c' THEN 'TYPE' ELSE 'TABLE' END,
              c.oid::regclass)
  FROM pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f', 'c')
   AND NOT EXISTS (SELECT 1 FROM ext WHERE classid = 'pg_class'::regclass AND objid = c.oid)
   -- a sequence an identity or serial column owns goes with its table (an identity's cannot be dropped alone)
   AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                                        AND d.objid = c.oid AND d.refclassid = 'pg_class'::regclass
                                        AND d.deptype IN ('i', 'a')))
UNION ALL
SELECT format('DROP ROUTINE IF EXISTS %s CASCADE', p.oid::regprocedure) FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace
   AND NOT EXISTS (SELECT 1 FROM ext WHERE classid = 'pg_proc'::regclass AND objid = p.oid)
UNION ALL
SELECT format('DROP TYPE IF EXISTS %s CASCADE', t.oid::regtype) FROM pg_type t
 WHERE t.typnamespace = 'public'::regnamespace AND t.typtype IN ('b', 'd', 'e', 'r')
   AND NOT EXISTS (SELECT 1 FROM pg_type a WHERE a.typarray = t.oid)
   AND NOT EXISTS (SELECT 1 FROM ext WHERE classid = 'pg_type'::regclass AND objid = t.oid)
UNION ALL
SELECT format('DROP COLLATION IF EXISTS %I.%I CASCADE', 'public', c.collname) FROM pg_collation c
 WHERE c.collnamespace = 'public'::regnamespace
   AND NOT EXISTS (SELECT 1 FROM ext WHERE classid = 'pg_collation'::regclass AND objid = c.oid)
UNION ALL
SELECT format('DROP STATISTICS IF EXISTS %I.%I', 'public', s.stxname) FROM pg_statistic_ext s
 WHERE s.stxnamespace = 'public'::regnamespace
UNION ALL
SELECT format('DROP TEXT SEARCH CONFIGURATION IF EXISTS %I.%I CASCADE', 'public', c.cfgname) FROM pg_ts_config c
 WHERE c.cfgnamespace = 'public'::regnamespace
   AND NOT EXISTS (SELECT 1 FROM ext WHERE classid = 'pg_ts_config'::regclass AND objid = c.oid)
"""

# default privileges left after the schemas went (global ones, and those IN SCHEMA public)
_DEFAULT_ACLS = """
SELECT pg_get_userbyid(d.defaclrole), d.defaclnamespace::regnamespace::text, d.defaclnamespace = 0,
       d.defaclobjtype, array_agg(DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END)
  FROM pg_default_acl d CROSS JOIN LATERAL aclexplode(d.defaclacl) a
 GROUP BY 1, 2, 3, 4
"""
_DEFACL_KIND = {"r": "TABLES", "S": "SEQUENCES", "f": "FUNCTIONS", "T": "TYPES", "n": "SCHEMAS"}
_DEFACL_PUBLIC = {"f": "EXECUTE", "T": "USAGE"}


def _drop_user_objects(conn: psycopg.Connection[Any]) -> None:
    """Drop every object of the joiner's database that the donor's dump would create: the user
    schemas, what is in public, extensions (but chorus and plpgsql), user event triggers, and
    default privileges; public itself is kept and given back its initial owner, ACL and comment."""
    for (nsp,) in conn.execute(_USER_SCHEMAS, (list(OWN_SCHEMAS),)).fetchall():
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(nsp)))
    for (ext,) in conn.execute("SELECT extname FROM pg_extension WHERE extname NOT IN ('chorus', 'plpgsql')").fetchall():
        conn.execute(sql.SQL("DROP EXTENSION IF EXISTS {} CASCADE").format(sql.Identifier(ext)))
    for (stmt,) in conn.execute(_PUBLIC_OBJECTS).fetchall():
        conn.execute(stmt)
    for (evt,) in conn.execute("SELECT evtname FROM pg_event_trigger e WHERE NOT EXISTS (SELECT 1 FROM pg_depend d "
                               "WHERE d.classid = 'pg_event_trigger'::regclass AND d.objid = e.oid "
                               "AND d.deptype = 'e')").fetchall():
        conn.execute(sql.SQL("DROP EVENT TRIGGER {}").format(sql.Identifier(evt)))
    for owner, nsp, is_global, kind, grantees in conn.execute(_DEFAULT_ACLS).fetchall():
        scope = sql.SQL("") if is_global else sql.SQL("IN SCHEMA {} ").format(sql.Identifier(nsp))
        base = sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} {}").format(sql.Identifier(owner), scope)
        objs = sql.SQL(_DEFACL_KIND[kind])
        conn.execute(base + sql.SQL("REVOKE ALL ON {} FROM {}").format(objs, sql.SQL(", ").join(
            sql.SQL(g) for g in grantees)))
        if is_global:  # back to the built-in default, which removes the entry
            conn.execute(base + sql.SQL("GRANT ALL ON {} TO {}").format(objs, sql.Identifier(owner)))
            if kind in _DEFACL_PUBLIC:
                conn.execute(base + sql.SQL("GRANT {} ON {} TO PUBLIC").format(sql.SQL(_DEFACL_PUBLIC[kind]), objs))
    row = conn.execute("SELECT array_agg(DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE "
                       "quote_ident(pg_get_userbyid(a.grantee)) END) FROM pg_namespace n "
                       "CROSS JOIN LATERAL aclexplode(n.nspacl) a WHERE n.nspname = 'public'").fetchone()
    if row and row[0]:
        conn.execute(sql.SQL("REVOKE ALL ON SCHEMA public FROM {}").format(sql.SQL(", ").join(
            sql.SQL(g) for g in row[0])))
    conn.execute("ALTER SCHEMA public OWNER TO pg_database_owner")
    conn.execute("GRANT ALL ON SCHEMA public TO pg_database_owner")
    conn.execute("GRANT USAGE ON SCHEMA public TO PUBLIC")
    conn.execute("COMMENT ON SCHEMA public IS 'standard public schema'")


_KEEPABLE = """
SELECT n.nspname, c.relname, c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname <> ALL(%s)
   AND n.nspname NOT LIKE 'pg\\_%%'
   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                   AND d.deptype = 'e')
"""
_STORED = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum
"""


def _keep_rows(conn: psycopg.Connection[Any], same: set[str]) -> list[tuple[str, str, int]]:
    """Copy aside (as text) the rows of the tables whose definition is the donor's: (schema,
    table, keep number)."""
    kept: list[tuple[str, str, int]] = []
    tables = [r for r in conn.execute(_KEEPABLE, (list(OWN_SCHEMAS),)).fetchall() if f"{r[0]}.{r[1]}" in same]
    if not tables:
        return kept
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(KEEP_SCHEMA)))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(KEEP_SCHEMA)))
    for i, (nsp, rel, oid) in enumerate(tables, start=1):
        cols = [r[0] for r in conn.execute(_STORED, (oid,)).fetchall()]
        if not cols:
            continue
        conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM ONLY {}").format(
            sql.Identifier(KEEP_SCHEMA, f"k{i}"),
            sql.SQL(", ").join(sql.SQL("{}::text AS {}").format(sql.Identifier(c), sql.Identifier(c)) for c in cols),
            sql.Identifier(nsp, rel)))
        kept.append((nsp, rel, i))
    return kept


def _restore_rows(conn: psycopg.Connection[Any], kept: list[tuple[str, str, int]]) -> int:
    """Put the kept rows back into the tables the donor's dump created (same definition, so
    every text form reads back as the column's type); triggers do not fire."""
    rows = 0
    for nsp, rel, i in kept:
        oid = conn.execute("SELECT to_regclass(%s)::oid", (sql.Identifier(nsp, rel).as_string(conn),)).fetchone()
        if not oid or oid[0] is None:
            continue
        cols = conn.execute(_STORED, (oid[0],)).fetchall()
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            rows += conn.execute(sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {}").format(
                sql.Identifier(nsp, rel), sql.SQL(", ").join(sql.Identifier(c) for c, _ in cols),
                sql.SQL(", ").join(sql.SQL("{}::{}").format(sql.Identifier(c), sql.SQL(t)) for c, t in cols),
                sql.Identifier(KEEP_SCHEMA, f"k{i}"))).rowcount
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(KEEP_SCHEMA)))
    return rows


def sync_schema(donor: Endpoint, snapshot: str, joiner: Endpoint, conn: psycopg.Connection[Any]) -> list[str]:
    """Make the joiner's schema the donor's at ``snapshot`` (see the module's docstring); ``conn``
    is an autocommit session on the joiner with capture and DDL replication off. Returns what it
    did, one line each."""
    done = copy_roles(donor, conn)
    ddump = dump_schema(donor, snapshot)
    jdump = dump_schema(joiner)
    if normalise(ddump) == normalise(jdump):
        done.append("the schema is the donor's already (pg_dump --schema-only agrees)")
        return done
    done.append("the schema differs from the donor's (pg_dump --schema-only, first differences):\n"
                + "\n".join(differences(ddump, jdump, limit=12)))
    dtab, jtab = table_entries(ddump), table_entries(jdump)
    same = {label for label, text in jtab.items() if dtab.get(label) == text}
    conn.execute("ALTER EVENT TRIGGER chorus_on_ddl_end DISABLE")
    try:
        kept = _keep_rows(conn, same)
        _drop_user_objects(conn)
        _run(joiner, "psql", [], f"restoring the donor's schema on {joiner.name}", options=OFF,
             stdin=restorable(ddump))
        rows = _restore_rows(conn, kept)
    finally:
        conn.execute("ALTER EVENT TRIGGER chorus_on_ddl_end ENABLE ALWAYS")
    done.append(f"rebuilt the schema from the donor's dump (owners and privileges included); "
                f"kept the {rows} rows of {len(kept)} tables whose definition agreed, for the diff")
    left = differences(ddump, dump_schema(joiner))
    if left:
        done.append("WARNING: the schema still differs from the donor's:\n" + "\n".join(left))
    return done


def populated_matviews(conn: psycopg.Connection[Any]) -> list[str]:
    """The materialized views that hold data on this node (the donor, at its snapshot)."""
    return [r[0] for r in conn.execute("SELECT format('%%I.%%I', schemaname, matviewname) FROM pg_matviews "
                                       "WHERE ispopulated AND schemaname <> ALL(%s) ORDER BY 1",
                                       (list(OWN_SCHEMAS),)).fetchall()]


def refresh_matviews(conn: psycopg.Connection[Any], names: list[str]) -> list[str]:
    """Refresh these materialized views on the joiner, once its rows are the donor's (a
    schema-only dump creates them empty; kept ones hold the joiner's old rows)."""
    done = []
    for name in names:
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone() == (True,):
            conn.execute(sql.SQL("REFRESH MATERIALIZED VIEW {}").format(sql.SQL(name)))
            done.append(name)
    return [f"refreshed the materialized views {', '.join(done)}"] if done else []


_CAPTURED = """
SELECT DISTINCT format('%I.%I', n.nspname, c.relname) FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE t.tgfoid = to_regprocedure('chorus.capture()') ORDER BY 1
"""


def sync_capture(donor: psycopg.Connection[Any], conn: psycopg.Connection[Any]) -> list[str]:
    """Capture on the joiner (``conn``) the tables the donor captures, and only those (a table
    detached on the donor stays so): their internal capture triggers, which no dump carries
    (extension/chorus_attach.c). Returns what it did, one line each."""
    want = {r[0] for r in donor.execute(_CAPTURED).fetchall()}
    have = {r[0] for r in conn.execute(_CAPTURED).fetchall()}
    done = []
    for t in sorted(want - have):
        conn.execute("SELECT chorus.attach(%s::regclass)", (t,))
    for t in sorted(have - want):
        conn.execute("SELECT chorus.detach(%s::regclass)", (t,))
    if want - have:
        done.append(f"captured {len(want - have)} tables as the donor does")
    if have - want:
        done.append(f"detached {len(have - want)} tables the donor does not capture: {', '.join(sorted(have - want))}")
    return done
