"""Cluster-wide checks: wait for quiescence, compare every table on every node."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import psycopg
from psycopg import sql

from chorus.admin import admin_request

SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "chorus", "pg_toast")


@dataclass(frozen=True)
class NodeRef:
    name: str
    dsn: str
    admin: str


class CheckError(Exception):
    pass


def node_refs(nodes: Sequence[dict[str, Any]]) -> list[NodeRef]:
    return [NodeRef(n["name"], n["dsn"], n["admin"]) for n in nodes]


def statuses(nodes: Sequence[NodeRef]) -> dict[str, dict[str, Any]]:
    out = {}
    for n in nodes:
        resp = admin_request(n.admin)
        out[n.name] = resp["status"]
    return out


def wait_quiescent(nodes: Sequence[NodeRef], timeout: float = 60.0,
                   progress: Optional[Callable[[str], None]] = None) -> dict[str, dict[str, Any]]:
    """Wait until every node has committed every writeset delivered so far and all agree."""
    deadline = time.monotonic() + timeout
    stable = 0
    last: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        try:
            last = statuses(nodes)
        except OSError as e:
            raise CheckError(f"a coordinator is not reachable: {e}") from e
        delivered = {s["delivered_gid"] for s in last.values()}
        caught_up = all(s["committed_gid"] == s["certified_gid"] for s in last.values())
        idle = all(s["pending"] == 0 and s["apply_queue"] == 0 for s in last.values())
        if len(delivered) == 1 and caught_up and idle:
            stable += 1
            if stable >= 2:
                return last
        else:
            stable = 0
            if progress:
                progress("waiting for quiescence: " + ", ".join(
                    f"{n} {s['committed_gid']}/{s['delivered_gid']}" for n, s in last.items()))
        time.sleep(0.25)
    raise CheckError("cluster did not quiesce in time: " + ", ".join(
        f"{n}: committed {s.get('committed_gid')} delivered {s.get('delivered_gid')} "
        f"pending {s.get('pending')} state {s.get('state')}" for n, s in last.items()))


def user_tables(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r','p') AND c.relpersistence = 'p' AND n.nspname <> ALL(%s) "
        "AND n.nspname NOT LIKE 'pg_temp%%' ORDER BY 1, 2", (list(SYSTEM_SCHEMAS),)).fetchall()
    return [(str(a), str(b)) for a, b in rows]


def table_digest(conn: psycopg.Connection[Any], nsp: str, rel: str) -> tuple[int, str]:
    q = sql.SQL("SELECT count(*), coalesce(md5(string_agg(t::text, E'\\n' ORDER BY t::text)), '') "
                "FROM {}.{} t").format(sql.Identifier(nsp), sql.Identifier(rel))
    row = conn.execute(q).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def digests(dsn: str) -> dict[str, tuple[int, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {f"{n}.{r}": table_digest(conn, n, r) for n, r in user_tables(conn)}


def compare(nodes: Sequence[NodeRef]) -> list[str]:
    """Differences between nodes, one line each (empty when all nodes are identical)."""
    per_node = {n.name: digests(n.dsn) for n in nodes}
    ref_name = nodes[0].name
    ref = per_node[ref_name]
    out = []
    for name, d in per_node.items():
        for table in sorted(set(ref) | set(d)):
            a, b = ref.get(table), d.get(table)
            if a != b:
                out.append(f"table {table}: {ref_name} has {a[0] if a else 'no table'} rows, "
                           f"{name} has {b[0] if b else 'no table'} rows (contents differ)")
    return out
