"""``chorus node add`` and ``chorus node remove``: change a running cluster's nodes
(docs/MEMBERSHIP.md "Adding and removing nodes", docs/DEPLOY.md section "Adding and removing a
node").

On a local cluster (``--dir DIR``) everything is done here: the new node's PostgreSQL, the
change of the configured nodes through the total order, its total recovery. On hosts
(``--config FILE`` of a running member) the command rewrites this host's ``corosync.conf``
(``--conf-only`` stops there: run it so on every other host first), reloads every Corosync
(``corosync-cfgtool -R``) and sends the change through this node's coordinator. Every check is
made before anything is changed; a refused change changes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, Optional

import click

from chorus.cli.common import ChorusCliError, json_option, print_json
from chorus.cli.node import _config, fetch_status, watch_until_online
from chorus.cli.total import total_join_local, with_spark_options
from chorus.confchange.corosync_conf import (CorosyncConfError, CorosyncNode, add_node, next_nodeid, read_nodes,
                                             remove_node)

COROSYNC_CONF = "/etc/corosync/corosync.conf"


def _say(line: str) -> None:
    click.echo(line, err=True)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ChorusCliError(f"cannot read {path}: {e}") from e


def _write(path: str, text: str) -> None:
    """Write ``text`` over ``path`` atomically, keeping the old file as ``path.bak`` (its mode too)."""
    mode = os.stat(path).st_mode & 0o777
    shutil.copy2(path, f"{path}.bak")
    tmp = f"{path}.chorus-new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _run(cmd: list[str]) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ChorusCliError(f"{' '.join(cmd)}: {e}") from e
    if r.returncode != 0:
        raise ChorusCliError(f"{' '.join(cmd)} failed: {(r.stderr or r.stdout).strip()}")


def _online(admin: str) -> dict[str, Any]:
    st = fetch_status(admin)
    if st.get("state") != "online" or not st.get("accepts_writes"):
        raise ChorusCliError(f"node {st.get('node')} is {st.get('state')} ({st.get('reason')}): run this on a node "
                             "that is online in the primary component")
    return st


def quorum_problem(members: list[str], nodes: list[str]) -> Optional[str]:
    """Why ``nodes`` as the configured set would leave no quorum of them among the ``members``
    online now (None: it leaves one)."""
    here = sorted(set(members) & set(nodes))
    if 2 * len(here) > len(nodes):
        return None
    return (f"{len(here)} of the {len(nodes)} configured nodes would be online ({', '.join(here) or 'none'}): not a "
            "quorum, the cluster would stop writing. Bring the others online first")


def _configure(admin: str, st: dict[str, Any], nodes: list[str], conf_nodes: list[CorosyncNode]) -> str:
    """Ask for the new configured ``nodes``, with each one's Corosync node id from corosync.conf's
    node list (``conf_nodes``): only those ids count toward a view's quorum (the members check
    them against their own ids, confchange.with_ids)."""
    from chorus.admin import admin_request

    ids = {n.name: str(n.nodeid) for n in conf_nodes if n.name in nodes}
    try:
        resp = admin_request(admin, "configure", timeout=30, nodes=sorted(nodes), ids=ids,
                             version=int(st.get("config_version") or 0) + 1)
    except (OSError, ValueError) as e:
        raise ChorusCliError(f"the change could not be asked: {e}") from e
    if not resp.get("ok"):
        raise ChorusCliError(f"the cluster refused the change: {resp.get('error')}")
    return str(resp.get("result", ""))


def _current(st: dict[str, Any], conf_nodes: list[CorosyncNode], name: str, adding: bool) -> list[str]:
    """The configured nodes: the cluster's set once changed, else corosync.conf's node names as
    they were before this change (a node added with ``--conf-only`` on this host is in the file
    already; a node to remove must still be in it: run the change on a host whose file has it)."""
    if st.get("config_version"):
        return list(st.get("configured_nodes") or [])
    if adding and name in st.get("members", []):
        return [n.name for n in conf_nodes]  # a member is configured: refused as such
    names = [n.name for n in conf_nodes if not adding or n.name != name]
    strangers = sorted(set(st.get("members", [])) - set(names))
    if strangers:
        raise ChorusCliError(f"members {', '.join(strangers)} are not named in corosync.conf's node list "
                             f"({', '.join(names)}): each node's Corosync name must be its Chorus name")
    return names


def add_on_machine(c: Any, name: Optional[str], port: Optional[int], donor: Optional[str], timeout: float,
                   spark_master: str, spark_submit: Optional[str], range_rows: int, as_json: bool) -> None:
    """Add a node to a local cluster or a lab (``c``), rebuild it by total recovery, and wait
    until it is online."""
    from chorus.testkit.localcluster import LocalClusterError

    try:
        n = c.add_node(name, port)
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e
    _say(f"{n.name}: rebuilding it by total recovery")
    rebuilt = total_join_local(str(c.dir), n.name, donor, spark_master, spark_submit, range_rows)
    st = watch_until_online(c.config(c.load(), n).admin_socket, timeout)
    if as_json:
        print_json(dict(st, total_recovery=rebuilt))
    else:
        click.echo(f"node {n.name} added; online at GID {st['committed_gid']}")


def remove_on_machine(c: Any, name: str, as_json: bool) -> None:
    """Remove a node from a local cluster or a lab (``c``)."""
    from chorus.testkit.localcluster import LocalClusterError

    try:
        result = c.remove_node(name)
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e
    if as_json:
        print_json({"ok": True, "result": result})
    else:
        click.echo(f"node {name} removed: {result}")


@click.command("add")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="A local cluster's directory.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="On a host: the configuration file of this host's node (a running member).")
@click.argument("name", required=False)
@click.option("--address", help="On hosts: the new node's address (corosync ring0_addr).")
@click.option("--nodeid", type=int, default=None, help="On hosts: its Corosync node id (default: one above the highest).")
@click.option("--corosync-conf", default=COROSYNC_CONF, show_default=True, type=click.Path(dir_okay=False))
@click.option("--conf-only", is_flag=True, help="On hosts: only rewrite this host's corosync.conf (do this on every "
              "other host first; then run the command without it on one).")
@click.option("--port", type=int, default=None, help="Local cluster: the new node's PostgreSQL port (default: next).")
@click.option("--donor", default=None, help="Local cluster: the node its data is copied from (default: the online "
              "node that holds most).")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for the new node to be online.")
@with_spark_options
@json_option
def add(directory: Optional[str], config_path: Optional[str], name: Optional[str], address: Optional[str],
        nodeid: Optional[int], corosync_conf: str, conf_only: bool, port: Optional[int], donor: Optional[str],
        timeout: float, spark_master: str, spark_submit: Optional[str], range_rows: int, as_json: bool) -> None:
    """Add a node to a running cluster: the cluster's configured nodes grow by it at one place of
    the total order on every node (quorum counts it from there), then it joins by total recovery."""
    if directory is not None:
        from chorus.testkit.localcluster import LocalCluster

        add_on_machine(LocalCluster(directory, log=_say), name, port, donor, timeout, spark_master, spark_submit,
                       range_rows, as_json)
        return
    if config_path is None or not name or not address:
        raise ChorusCliError("give --dir DIR [NAME] (a local cluster), or --config FILE NAME --address ADDR (hosts)")
    text = _read(corosync_conf)
    wanted = CorosyncNode(nodeid or next_nodeid(text), name, address)
    try:
        present = read_nodes(text)
        if wanted in present or (nodeid is None and any(n.name == name and n.address == address for n in present)):
            new_text = text  # this host's file has it already (--conf-only ran here)
        else:
            new_text = add_node(text, wanted)
    except CorosyncConfError as e:
        raise ChorusCliError(f"{corosync_conf}: {e}") from e
    if conf_only:
        if new_text != text:
            _write(corosync_conf, new_text)
        click.echo(f"{corosync_conf}: node {name} ({address}) in the node list")
        return
    admin = _config(config_path).admin_socket
    st = _online(admin)
    current = _current(st, present, name, adding=True)
    if name in current:
        raise ChorusCliError(f"node {name} is one of the configured nodes already ({', '.join(sorted(current))})")
    problem = quorum_problem(st.get("members", []), current + [name])
    if problem is not None:
        raise ChorusCliError(problem)
    if new_text != text:
        _write(corosync_conf, new_text)
    _run(["corosync-cfgtool", "-R"])
    result = _configure(admin, st, current + [name], [n for n in present if n.name != name] + [wanted])
    if as_json:
        print_json({"ok": True, "result": result})
    else:
        click.echo(f"node {name} added: {result}. Start Corosync on it with this corosync.conf, then rebuild it: "
                   "`chorus node join --total --config FILE --donor-dsn DSN` (docs/DEPLOY.md)")


@click.command("remove")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="A local cluster's directory.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="On a host: the configuration file of this host's node (a running member, not the one removed).")
@click.argument("name")
@click.option("--corosync-conf", default=COROSYNC_CONF, show_default=True, type=click.Path(dir_okay=False))
@click.option("--conf-only", is_flag=True, help="On hosts: only rewrite this host's corosync.conf.")
@json_option
def remove(directory: Optional[str], config_path: Optional[str], name: str, corosync_conf: str, conf_only: bool,
           as_json: bool) -> None:
    """Remove a node from a running cluster: it stops, and the cluster's configured nodes shrink by
    it at one place of the total order on every node (quorum counts without it from there). It
    cannot join again unless it is added again."""
    if directory is not None:
        from chorus.testkit.localcluster import LocalCluster

        remove_on_machine(LocalCluster(directory, log=_say), name, as_json)
        return
    if config_path is None:
        raise ChorusCliError("give --dir DIR (a local cluster) or --config FILE (a host's running member)")
    text = _read(corosync_conf)
    try:
        present = read_nodes(text)
        new_text = remove_node(text, name) if any(name in (n.name, n.address) for n in present) else text
    except CorosyncConfError as e:
        raise ChorusCliError(f"{corosync_conf}: {e}") from e
    if conf_only:
        if new_text != text:
            _write(corosync_conf, new_text)
        click.echo(f"{corosync_conf}: node {name} not in the node list")
        return
    cfg = _config(config_path)
    if cfg.name == name:
        raise ChorusCliError(f"run it on another node than {name}: that one's coordinator stops")
    st = _online(cfg.admin_socket)
    current = _current(st, present, name, adding=False)
    if name not in current:
        raise ChorusCliError(f"node {name} is not one of the configured nodes ({', '.join(sorted(current))})")
    rest = [n for n in current if n != name]
    problem = quorum_problem(st.get("members", []), rest)
    if problem is not None:
        raise ChorusCliError(problem)
    if new_text != text:
        _write(corosync_conf, new_text)
    _run(["corosync-cfgtool", "-R"])
    result = _configure(cfg.admin_socket, st, rest, present)
    if as_json:
        print_json({"ok": True, "result": result})
    else:
        click.echo(f"node {name} removed: {result}")
