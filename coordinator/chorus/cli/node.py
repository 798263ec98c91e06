"""Commands for one node: run the coordinator, bootstrap a cluster, show status."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any, Optional

import click

from chorus.cli.common import ChorusCliError, json_option, print_json, print_table
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
    from chorus.bus.corosync import CorosyncBus
    from chorus.coordinator import Coordinator, FatalError

    cfg = _config(config_path)
    logging.basicConfig(
        level=getattr(logging, cfg.log_level.upper(), logging.INFO),
        format=f"%(asctime)s {cfg.name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    coord = Coordinator(cfg, lambda: CorosyncBus(cfg.cluster_group))
    try:
        asyncio.run(coord.run())
    except FatalError as e:
        logging.getLogger("chorus").error("fatal: %s", e)
        raise SystemExit(2)


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
    from chorus.coordinator import admin_request

    try:
        resp = admin_request(admin_socket)
    except (OSError, ValueError) as e:
        raise ChorusCliError(f"coordinator not reachable at {admin_socket}: {e}") from e
    if not resp.get("ok"):
        raise ChorusCliError(str(resp.get("error")))
    status: dict[str, Any] = resp["status"]
    return status


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="The node's configuration file.")
@click.option("--admin", "admin_socket", help="The coordinator's admin socket (instead of --config).")
@json_option
def status(config_path: Optional[str], admin_socket: Optional[str], as_json: bool) -> None:
    """Show a node's replication status."""
    if admin_socket is None:
        if config_path is None:
            raise ChorusCliError("give --config FILE or --admin SOCKET")
        admin_socket = _config(config_path).admin_socket
    st = fetch_status(admin_socket)
    if as_json:
        print_json(st)
        return
    rows = [[k, v] for k, v in st.items()]
    print_table(["field", "value"], rows)


COMMANDS = [run, bootstrap, status]
