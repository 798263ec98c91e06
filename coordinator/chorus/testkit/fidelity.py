"""Do all nodes hold exactly the same schema and data? (The fidelity harness.)

Run SQL through one node as a client would (``psql``, any session settings, any role), wait until
every node has committed everything, then compare every node against the first:

- the schema as ``pg_dump --schema-only`` prints it, owners and privileges included; what is
  meant to differ per node is left out: sequences' residue classes (docs/DDL.md), publications
  and subscriptions, tablespaces (``--no-tablespaces``);
- roles: their attributes and memberships;
- the content of every replicated table (permanent tables outside system schemas), read under
  fixed settings (ISO dates, UTC, all float digits), so that equal values print alike. Rows are
  compared as sorted lines of ``COPY``'s text output, so types without an ordering compare too.

The first difference found is reported with the lines around it. ``chorus check fidelity`` runs
it from the command line; the fidelity tests run PostgreSQL's own regression scripts and many
single cases through it.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import psycopg

from chorus.testkit.check import NodeRef, wait_quiescent

PGBIN = "/usr/lib/postgresql/15/bin"

_CANONICAL = ("SET datestyle = 'ISO'; SET intervalstyle = 'postgres'; SET timezone = 'UTC'; "
              "SET extra_float_digits = 3; SET bytea_output = 'hex'; SET search_path = pg_catalog")

# Replicated tables: permanent, plain (a partitioned table's rows are in its partitions).
_TABLES = """
SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind = 'r' AND c.relpersistence = 'p'
   AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'chorus')
   AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp%'
 ORDER BY 1
"""

_ROLES = """
SELECT r.rolname, r.rolsuper, r.rolinherit, r.rolcreaterole, r.rolcreatedb, r.rolcanlogin,
       r.rolreplication, r.rolbypassrls, r.rolconnlimit, r.rolvaliduntil,
       coalesce((SELECT string_agg(g.rolname || CASE WHEN m.admin_option THEN '*' ELSE '' END, ','
                                   ORDER BY g.rolname)
                   FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid), '')
  FROM pg_roles r WHERE r.rolname NOT LIKE 'pg\\_%' ORDER BY 1
"""


class FidelityError(Exception):
    """The nodes differ (or could not be compared)."""


@dataclass(frozen=True)
class Difference:
    what: str  # "schema", "roles", or a table's name
    node: str  # the node that differs from the first
    detail: str

    def __str__(self) -> str:
        return f"{self.what} differs on {self.node}:\n{self.detail}"


def run_sql(dsn: str, script: str, *, settings: Sequence[str] = (), timeout: float = 600,
            stop_on_error: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``script`` through ``psql`` against ``dsn`` as one session, with ``settings`` (e.g.
    ``"datestyle = 'SQL, DMY'"``) set first. Errors do not stop it unless ``stop_on_error``."""
    pre = "".join(f"SET {s};\n" for s in settings)
    args = [f"{PGBIN}/psql", "-X", "-q", "-v", f"ON_ERROR_STOP={1 if stop_on_error else 0}", "-d", dsn, "-f", "-"]
    return subprocess.run(args, input=pre + script, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PGOPTIONS": "", "PGAPPNAME": "chorus fidelity"})


_SEQ_PARAM = re.compile(r"^\s+(START WITH|INCREMENT BY|RESTART WITH) -?\d+\s*$")
_IDENTITY_PARAMS = re.compile(r"(START WITH|INCREMENT BY|RESTART WITH) -?\d+")


def _normalise_schema(text: str) -> list[str]:
    """pg_dump's schema text without what differs by design between nodes."""
    out = []
    for line in text.splitlines():
        if line.startswith(("--", "\\restrict", "\\unrestrict")) or not line.strip():
            continue
        if _SEQ_PARAM.match(line):
            continue  # each node's residue class (docs/DDL.md: sequences)
        out.append(_IDENTITY_PARAMS.sub(r"\1 #", line))
    return out


def schema_of(dsn: str) -> list[str]:
    r = subprocess.run([f"{PGBIN}/pg_dump", "--schema-only", "--no-publications", "--no-subscriptions",
                        "--no-tablespaces", "--exclude-schema=chorus", "-d", dsn],
                       capture_output=True, text=True, errors="surrogateescape", timeout=300)
    if r.returncode != 0:
        raise FidelityError(f"pg_dump failed: {r.stderr.strip()}")
    return _normalise_schema(r.stdout)


def _rows(conn: psycopg.Connection[Any], table: str) -> list[bytes]:
    with conn.cursor() as cur:
        with cur.copy(f"COPY (SELECT * FROM {table}) TO STDOUT") as cp:
            data = b"".join(bytes(b) for b in cp)
    return sorted(data.split(b"\n")[:-1])


def _first_diff(a: list[str], b: list[str], context: int = 3) -> str:
    lines = list(difflib.unified_diff(a, b, "first node", "this node", n=context, lineterm=""))
    return "\n".join(lines[:40]) + ("\n..." if len(lines) > 40 else "")


def _connect(dsn: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    for s in _CANONICAL.split("; "):
        conn.execute(s.encode())
    return conn


def compare(nodes: Sequence[NodeRef], *, data: bool = True) -> Optional[Difference]:
    """The first difference between the first node and another, or None if they are identical."""
    base = nodes[0]
    base_schema = schema_of(base.dsn)
    for n in nodes[1:]:
        other = schema_of(n.dsn)
        if other != base_schema:
            return Difference("schema", n.name, _first_diff(base_schema, other))
    with _connect(base.dsn) as c0:
        roles0 = [repr(r) for r in c0.execute(_ROLES.encode()).fetchall()]
        tables0 = [str(r[0]) for r in c0.execute(_TABLES.encode()).fetchall()]
        for n in nodes[1:]:
            with _connect(n.dsn) as c:
                roles = [repr(r) for r in c.execute(_ROLES.encode()).fetchall()]
                if roles != roles0:
                    return Difference("roles", n.name, _first_diff(roles0, roles))
                tables = [str(r[0]) for r in c.execute(_TABLES.encode()).fetchall()]
                if tables != tables0:
                    return Difference("the list of tables", n.name, _first_diff(tables0, tables))
                if not data:
                    continue
                for t in tables0:
                    a, b = _rows(c0, t), _rows(c, t)
                    if a != b:
                        sa = [x.decode("utf-8", "backslashreplace") for x in a]
                        sb = [x.decode("utf-8", "backslashreplace") for x in b]
                        return Difference(f"table {t}", n.name, _first_diff(sa, sb, 0))
    return None


def check(nodes: Sequence[NodeRef], timeout: float = 120) -> Optional[Difference]:
    """Wait until the nodes are quiescent, then :func:`compare` them."""
    wait_quiescent(nodes, timeout)
    return compare(nodes)
