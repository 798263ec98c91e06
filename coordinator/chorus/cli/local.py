"""``chorus local ...`` and ``chorus sql``: a development cluster on this machine."""

from __future__ import annotations

from typing import Any, Optional

import click
import psycopg

from chorus.cli.common import ChorusCliError, dir_option, json_option, print_json, print_table
from chorus.localauth import psql_line
from chorus.testkit.localcluster import LocalCluster, LocalClusterError


def _cluster(directory: str, quiet: bool = False) -> LocalCluster:
    return LocalCluster(directory, log=(lambda s: None) if quiet else (lambda s: click.echo(s, err=True)))


def _node_status(admin: str) -> dict[str, Any]:
    from chorus.admin import admin_request

    try:
        st: dict[str, Any] = admin_request(admin, timeout=2)["status"]
        return st
    except (OSError, ValueError, KeyError):
        return {}


def _show(nodes: list[dict[str, Any]], as_json: bool, c: LocalCluster) -> None:
    """Each node's processes and what chorus.node shows of it (its phase, whether it takes
    writes, its committed GID and lag, the certification failures it saw), and how to connect:
    the psql line (with the cluster's password file) for people, DSNs naming it in JSON."""
    for n in nodes:
        n["psql"] = psql_line(n["port"], c.passfile)
        st = _node_status(n["admin"]) if n["coordinator_pid"] else {}
        n["state"] = st.get("state", "down")
        n["committed_gid"] = st.get("committed_gid")
        n["accepts_writes"] = st.get("accepts_writes", False)
        n["lag_gids"] = st.get("lag_gids")
        n["certification_failures"] = st.get("certification_failures")

    def shown(v: Any) -> Any:
        return "-" if v is None else v

    if as_json:
        print_json({"dir": str(c.dir), "passfile": str(c.passfile), "nodes": nodes})
        return
    print_table(["name", "port", "state", "writable", "committed GID", "lag", "cert. failures", "http",
                 "postgres pid", "coordinator pid"],
                [[n["name"], n["port"], n["state"], "yes" if n["accepts_writes"] else "no", shown(n["committed_gid"]),
                  shown(n["lag_gids"]), shown(n["certification_failures"]), n["http"],
                  n["pg_pid"] or "-", n["coordinator_pid"] or "-"] for n in nodes])
    click.echo("")
    for n in nodes:
        click.echo(f"{n['name']}: {n['psql']}")


@click.group()
def local() -> None:
    """A local cluster of several nodes on this machine (development, demos, tests)."""


@local.command()
@dir_option
@click.option("--nodes", default=3, show_default=True, help="Number of nodes (when creating).")
@click.option("--port-base", default=5433, show_default=True, help="PostgreSQL port of the first node.")
@click.option("--log-segment-mb", default=32, show_default=True, help="Writeset log segment size (when creating).")
@click.option("--log-total-mb", default=2048, show_default=True,
              help="Writeset log size per node (when creating); the largest writeset is this less one segment.")
@click.option("--commit-lanes", type=click.IntRange(1, 16), default=None,
              help="apply.commit_lanes of every node: 1 commits in GID order (the default), more lets "
                   "independent writesets commit out of order (docs/APPLY.md). Kept for later restarts.")
@click.option("--encoding", default="UTF8", show_default=True,
              help="The databases' encoding (when creating), e.g. LATIN1 or SQL_ASCII.")
@json_option
def up(directory: str, nodes: int, port_base: int, log_segment_mb: int, log_total_mb: int,
       commit_lanes: Optional[int], encoding: str, as_json: bool) -> None:
    """Create, or restart, a local cluster and wait until every node is online. Over TCP its
    PostgreSQL takes the password in DIR/pgpass (the lines printed name it); a cluster made
    before clusters had passwords gets one here (docs/OPERATIONS.md)."""
    c = _cluster(directory)
    try:
        desc = c.up(nodes, port_base, log_segment_mb, log_total_mb, commit_lanes, encoding)
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e
    _show(desc, as_json, c)


@local.command()
@dir_option
@json_option
def status(directory: str, as_json: bool) -> None:
    """Processes and replication state of each node."""
    c = _cluster(directory)
    try:
        _show(c.describe(c.load()), as_json, c)
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e


@local.command()
@dir_option
def down(directory: str) -> None:
    """Stop exactly the processes this cluster started."""
    try:
        _cluster(directory).down()
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e


@local.command()
@dir_option
@click.argument("name")
def stop(directory: str, name: str) -> None:
    """Stop one node (coordinator, then PostgreSQL)."""
    try:
        _cluster(directory).stop(name)
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e


@local.command()
@dir_option
@click.argument("name")
@click.option("--pgbin", type=click.Path(file_okay=False, exists=True), default=None,
              help="Run the node's PostgreSQL from the binaries in this directory from now on (the node must be "
                   "stopped): a minor upgrade of one node at a time, docs/DEPLOY.md.")
def start(directory: str, name: str, pgbin: Optional[str]) -> None:
    """Start one node and wait until it is online."""
    try:
        _cluster(directory).start(name, pgbin=pgbin)
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e


@local.command()
@dir_option
@click.argument("name")
@click.option("--what", type=click.Choice(["postgres", "coordinator", "all"]), default="all", show_default=True)
def kill(directory: str, name: str, what: str) -> None:
    """SIGKILL a node's PostgreSQL postmaster and/or coordinator (fault tests)."""
    try:
        _cluster(directory).kill(name, what)
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e


@click.command("sql")
@dir_option
@click.option("--all", "all_nodes", is_flag=True, help="Run on every node.")
@click.option("--node", help="Run on this node only.")
@click.argument("statement")
def sql_command(directory: str, all_nodes: bool, node: Optional[str], statement: str) -> None:
    """Run a statement on every node (or one) of a local cluster, locally on each (over its Unix
    socket, as the postgres role: root and the service user may, by peer authentication)."""
    if all_nodes == bool(node):
        raise ChorusCliError("give exactly one of --all or --node NAME")
    c = _cluster(directory, quiet=True)
    try:
        nodes = c.describe(c.load())
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e
    for n in nodes:
        if node and n["name"] != node:
            continue
        try:
            with psycopg.connect(n["socket_dsn"], autocommit=True,
                                 options="-c chorus.replicate_ddl=off -c chorus.capture=off") as conn:
                cur = conn.execute(statement)
                if cur.description:
                    for row in cur.fetchall():
                        click.echo(f"{n['name']}: " + "\t".join("" if v is None else str(v) for v in row))
        except psycopg.Error as e:
            raise ChorusCliError(f"{n['name']}: {str(e).strip()}") from e
