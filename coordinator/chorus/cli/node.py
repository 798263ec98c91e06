"""Commands for one node: run the coordinator, bootstrap a cluster, show status, and
``chorus node join|leave|recover`` (a node of a local cluster: ``--dir DIR NAME``; any node:
``--config FILE`` while its coordinator runs under a service manager)."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, NoReturn, Optional

import click

from chorus.cli.common import ChorusCliError, json_option, print_json, print_table
from chorus.cli.total import total_join_config, total_join_local, verify, with_spark_options
from chorus.config import ChorusConfigError, NodeConfig, load_config
from chorus.state import StateError, load_state, save_state


def _config(path: str) -> NodeConfig:
    try:
        return load_config(path)
    except ChorusConfigError as e:
        raise ChorusCliError(str(e)) from e


config_option = click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
                             help="The node's configuration file (TOML).")


@click.command()
@config_option
def run(config_path: str) -> None:
    """Run the coordinator of one node (in the foreground)."""

    from chorus import eventloop
    from chorus.bus.corosync import CorosyncBus
    from chorus.dataplane import native
    from chorus.coordinator import Coordinator, FatalError

    os.umask(0o077)  # whatever starts it: every file it makes is its user's alone (logs, state, sockets, spool)
    cfg = _config(config_path)
    try:
        loop = eventloop.choose()
    except eventloop.LoopChoiceError as e:
        raise ChorusCliError(str(e)) from e
    logging.basicConfig(
        level=getattr(logging, cfg.log_level.upper(), logging.INFO),
        format=f"%(asctime)s {cfg.name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    coord = Coordinator(cfg, lambda: CorosyncBus(cfg.cluster_group, native=native.cpg_module()), event_loop=loop)
    try:
        eventloop.run(coord.run, loop)
    except FatalError as e:
        logging.getLogger("chorus").error("fatal: %s", e)
        _exit_now(2)
    _exit_now(0)


def _exit_now(code: int) -> NoReturn:
    """End the coordinator's process once it has stopped: everything it keeps is closed and on
    disk by then (Coordinator._shutdown: the log synced, the state saved, the bus left, the loop's
    worker threads joined), so the interpreter's own teardown, which frees every object one by
    one, is skipped: it took about a second of CPU after each stop (measured with strace: from
    the atexit handlers to exit_group), and every stop and restart of a node waited for it."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@click.command()
@config_option
@click.option("--force", is_flag=True, help="Bootstrap even though this node was not the last to leave.")
def bootstrap(config_path: str, force: bool) -> None:
    """Mark this node to start a new cluster (or restart one) when its coordinator runs.

    A node that already belonged to a cluster restarts that cluster (same UUID, its own last GID)
    only if it was the last to leave, unless --force.
    """
    cfg = _config(config_path)
    try:
        st = load_state(cfg.state_file, cfg.name)
    except StateError as e:
        raise ChorusCliError(str(e)) from e
    if st.cluster_uuid and not st.safe_to_bootstrap and not force:
        raise ChorusCliError(
            f"node {cfg.name} belongs to cluster {st.cluster_uuid} and was not the last to leave it: "
            "another node may hold newer data. Bootstrap from the node that left last, or use --force "
            "on the node with the highest GID.")
    save_state(cfg.state_file, st.with_(bootstrap=True))
    click.echo(f"node {cfg.name} will bootstrap "
               f"{'cluster ' + st.cluster_uuid if st.cluster_uuid else 'a new cluster'} when its coordinator starts")


def fetch_status(admin_socket: str) -> dict[str, Any]:
    from chorus.admin import admin_request

    try:
        resp = admin_request(admin_socket)
    except (OSError, ValueError) as e:
        raise ChorusCliError(f"coordinator not reachable at {admin_socket}: {e}") from e
    if not resp.get("ok"):
        raise ChorusCliError(str(resp.get("error")))
    status: dict[str, Any] = resp["status"]
    return status


def fetch_views(admin_socket: str, conflicts: int = 20) -> dict[str, Any]:
    """What the extension's views show (chorus.node, chorus.members, the last ``conflicts`` of
    chorus.conflicts), from the coordinator's admin socket."""
    from chorus.admin import admin_request

    try:
        resp = admin_request(admin_socket, "views", conflicts=conflicts)
    except (OSError, ValueError) as e:
        raise ChorusCliError(f"coordinator not reachable at {admin_socket}: {e}") from e
    if not resp.get("ok"):
        raise ChorusCliError(str(resp.get("error")))
    return resp


def print_views(views: dict[str, Any]) -> None:
    """The node, its members and its recent conflicts, as tables."""
    print_table(["field", "value"], [[k, v] for k, v in views["node"].items()])
    click.echo("\nmembers")
    print_table(["name", "this node", "phase", "committed GID", "lag (GIDs)"],
                [[m["name"], "*" if m["this_node"] else "", m["phase"], m["committed_gid"], m["lag_gids"]]
                 for m in views["members"]])
    if views["conflicts"]:
        click.echo("\nrecent certification conflicts")
        print_table(["at", "GID", "table", "key", "winner GID", "winner node", "loser node", "loser xid"],
                    [[time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["at"])), c["gid"],
                      f"{c['schema']}.{c['table']}" if c["table"] else "-", c["key"] or "-", c["winner_gid"] or "-",
                      c["winner_node"] or "-", c["loser_node"], c["loser_xid"]] for c in views["conflicts"]])


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="The node's configuration file.")
@click.option("--admin", "admin_socket", help="The coordinator's admin socket (instead of --config).")
@click.option("--details", is_flag=True, help="Every field the coordinator reports, not only the main ones.")
@json_option
def status(config_path: Optional[str], admin_socket: Optional[str], details: bool, as_json: bool) -> None:
    """Show a node's replication status: the node, the members it sees (what chorus.node and
    chorus.members show) and its recent certification conflicts (chorus.conflicts)."""
    if admin_socket is None:
        if config_path is None:
            raise ChorusCliError("give --config FILE or --admin SOCKET")
        admin_socket = _config(config_path).admin_socket
    st = fetch_status(admin_socket)
    views = fetch_views(admin_socket)
    if as_json:
        print_json({**st, "members_view": views["members"], "conflicts": views["conflicts"]})
        return
    if details:
        print_table(["field", "value"], [[k, v] for k, v in st.items()])
        return
    print_views(views)


def _node_config(config_path: Optional[str], directory: Optional[str], name: Optional[str]) -> NodeConfig:
    """The node's configuration: its file, or for a node of a local cluster the file the cluster
    wrote for it (an operator may have edited it)."""
    if directory is not None:
        from chorus.testkit.localcluster import LocalCluster, LocalClusterError

        if not name:
            raise ChorusCliError("give the node's NAME with --dir")
        c = LocalCluster(directory)
        try:
            meta = c.load()
            n = c._node(meta, name)
        except LocalClusterError as e:
            raise ChorusCliError(str(e)) from e
        path = c.node_dir(name) / "chorus.toml"
        return _config(str(path)) if path.exists() else c.config(meta, n)
    if config_path is None:
        raise ChorusCliError("give --config FILE, or --dir DIR NAME for a node of a local cluster")
    return _config(config_path)


def _admin_of(config_path: Optional[str], directory: Optional[str], name: Optional[str]) -> str:
    return _node_config(config_path, directory, name).admin_socket


def describe_recovery(rec: dict[str, Any]) -> str:
    eta = f", ETA {rec['eta_s']} s" if rec.get("eta_s") is not None else ""
    return (f"{rec['state']}: GID {rec['position']} of {rec['upto']} from {rec['partner'] or '?'}, "
            f"{rec['gids_to_go']} GIDs to go (~{rec['bytes_to_go_estimate'] / 1e6:.1f} MB), "
            f"{rec['rate_gids_per_s']} GIDs/s, {rec['rate_mb_per_s']} MB/s{eta}")


class NeedsTotalRecovery(ChorusCliError):
    """The node stays out: no member's log holds what it misses (or its data is from another
    history); only total recovery brings it back."""


def watch_until_online(admin: str, timeout: float) -> dict[str, Any]:
    """Poll a node's status, printing recovery progress on stderr, until it is online (or cannot be)."""
    deadline = time.monotonic() + timeout
    last = ""
    st: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            st = fetch_status(admin)
        except ChorusCliError:
            time.sleep(0.1)
            continue
        rec = st.get("recovery")
        line = f"{st['state']}: {st['reason']}"
        if rec and st["state"] == "recovering":
            line = describe_recovery(rec)
        if line != last:
            click.echo(line, err=True)
            last = line
        if st["state"] == "online":
            if rec and rec["state"] == "done":
                click.echo(f"caught up: {rec['records']} writesets ({rec['bytes_received'] / 1e6:.1f} MB) from "
                           f"{rec['partner']} in {rec['elapsed_s']} s, {rec['rate_gids_per_s']} GIDs/s", err=True)
            return st
        if st["state"] == "needs-recovery":
            raise NeedsTotalRecovery(f"node {st['node']} cannot go online: {st['reason']}")
        if st["state"] == "failed":
            raise ChorusCliError(f"node {st['node']} cannot go online: {st['reason']}")
        time.sleep(0.1)
    raise ChorusCliError(f"node not online after {timeout:.0f} s: {st.get('state')}: {st.get('reason')}")


def _report_online(st: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(st)
    else:
        click.echo(f"node {st['node']} is online at GID {st['committed_gid']}")


@click.group()
def node() -> None:
    """Take a node into the cluster or out of it."""


node_target = [
    click.option("--config", "config_path", type=click.Path(dir_okay=False), help="The node's configuration file."),
    click.option("--dir", "directory", type=click.Path(file_okay=False), help="A local cluster's directory."),
    click.argument("name", required=False),
]


def _target(f: Any) -> Any:
    for opt in reversed(node_target):
        f = opt(f)
    return f


@node.command()
@_target
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for the node to be online.")
@click.option("--total", is_flag=True, help="Total recovery: rebuild the node from a donor's snapshot "
              "(Spark snapshot diff), then catch up from the snapshot's GID.")
@click.option("--donor", default=None, help="With --total on a local cluster: the donor node (default: the first online).")
@click.option("--donor-dsn", default=None,
              help="With --total and --config: the donor's database (a libpq connection string, reachable over TCP).")
@click.option("--cluster-uuid", default="",
              help="With --total and --config: the cluster's UUID (`chorus status` on a member); by default the node "
                   "adopts the UUID of the cluster its group runs.")
@click.option("--auto-total/--no-auto-total", default=None,
              help="If no member's log can catch the node up, rebuild it by total recovery "
                   "(default: the node's recovery.auto_total).")
@with_spark_options
@click.option("--copy-under-mb", default=16, show_default=True,
              help="With --total: tables smaller than this are copied whole rather than diffed.")
@click.option("--force", is_flag=True,
              help="With --total: rebuild from a donor that has committed less than this node, dropping the GIDs "
                   "only this node holds (refused without it, naming them).")
@json_option
def join(config_path: Optional[str], directory: Optional[str], name: Optional[str], timeout: float,
         total: bool, donor: Optional[str], donor_dsn: Optional[str], cluster_uuid: str,
         auto_total: Optional[bool], spark_master: str, spark_submit: Optional[str], range_rows: int,
         copy_under_mb: int, force: bool, as_json: bool) -> None:
    """Start a node (local cluster) and follow it until it is online: it joins the group and, if
    it missed writesets, catches up from a member's writeset log (partial recovery). With --total
    it is first rebuilt from a donor's snapshot (for a new node, or one no log can catch up);
    with --auto-total (or recovery.auto_total in its configuration) that happens only when
    partial recovery is impossible. With --config, --total needs --donor-dsn and a stopped
    coordinator; the command rebuilds the database and then waits for the coordinator, which
    the operator (or the service manager) starts."""
    rebuilt: Optional[dict[str, Any]] = None
    if total:
        if directory is not None and name:
            rebuilt = total_join_local(directory, name, donor, spark_master, spark_submit, range_rows, copy_under_mb,
                                       force)
        elif config_path is not None:
            if not donor_dsn:
                raise ChorusCliError("--total with --config needs --donor-dsn (the donor's database)")
            rebuilt = total_join_config(_config(config_path), config_path, donor_dsn, cluster_uuid, spark_master,
                                        spark_submit, range_rows, copy_under_mb, force)
        else:
            raise ChorusCliError("--total needs --dir DIR NAME (a local cluster) or --config FILE --donor-dsn DSN")
    elif directory is not None:
        from chorus.testkit.localcluster import LocalCluster, LocalClusterError

        try:
            LocalCluster(directory, log=lambda s: click.echo(s, err=True)).start(name or "", wait=False)
        except LocalClusterError as e:
            raise ChorusCliError(str(e)) from e
    admin = _admin_of(config_path, directory, name)
    try:
        st = watch_until_online(admin, timeout)
    except NeedsTotalRecovery as e:
        if auto_total is None:
            auto_total = _node_config(config_path, directory, name).auto_total
        if not auto_total or total:
            raise ChorusCliError(f"{e} (rebuild it with `chorus node join --total`, or let join do it: "
                                 "--auto-total or recovery.auto_total = true)") from e
        if directory is None or not name:
            raise ChorusCliError(f"{e}; automatic total recovery works on a node of a local cluster (--dir DIR NAME); "
                                 "here, stop the node's coordinator and run `chorus node join --total --config FILE "
                                 "--donor-dsn DSN`") from e
        click.echo(f"{e}: rebuilding it by total recovery (auto-total)", err=True)
        rebuilt = total_join_local(directory, name, donor, spark_master, spark_submit, range_rows, copy_under_mb)
        st = watch_until_online(admin, timeout)
    _report_online(dict(st, total_recovery=rebuilt) if rebuilt is not None else st, as_json)


@node.command()
@_target
def leave(config_path: Optional[str], directory: Optional[str], name: Optional[str]) -> None:
    """Leave the cluster gracefully: commit what is certified, leave the group, stop (with --dir,
    PostgreSQL too). A node that leaves last may restart the cluster (safe to bootstrap)."""
    if directory is not None:
        from chorus.testkit.localcluster import LocalCluster, LocalClusterError

        try:
            LocalCluster(directory, log=lambda s: click.echo(s, err=True)).stop(name or "")
        except LocalClusterError as e:
            raise ChorusCliError(str(e)) from e
        return
    from chorus.admin import admin_request

    resp = admin_request(_admin_of(config_path, directory, name), "leave")
    if not resp.get("ok"):
        raise ChorusCliError(str(resp.get("error")))
    click.echo("the coordinator is leaving the cluster")


@node.command()
@_target
@click.option("--timeout", default=600.0, show_default=True)
@json_option
def recover(config_path: Optional[str], directory: Optional[str], name: Optional[str], timeout: float,
            as_json: bool) -> None:
    """Ask a node that stayed out (needs recovery, or outside the primary component) to join again
    and catch up from a member's writeset log, and follow it until it is online."""
    from chorus.admin import admin_request

    admin = _admin_of(config_path, directory, name)
    resp = admin_request(admin, "recover")
    if not resp.get("ok"):
        raise ChorusCliError(str(resp.get("error")))
    _report_online(watch_until_online(admin, timeout), as_json)


COMMANDS = [run, bootstrap, status, node, verify]
