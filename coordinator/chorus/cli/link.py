"""``chorus link``: the links between sites this node has a part in (docs/LINKS.md section 9), and
``chorus link reinstantiate NAME``, which copies the peer's rows of a broken or new link (section 10).

``chorus link status`` asks a node's coordinator over its admin socket (as ``chorus status``
does) and prints a row per link and direction: a table for people, ``--json`` for programs (the
rows of link/status.py, which ``chorus.link_status`` and the ``chorus_link_*`` metrics show too).
"""

from __future__ import annotations

import time
from typing import Any, Optional

import click

from chorus.cli.common import ChorusCliError, json_option, print_json, print_table


def fetch_links(admin_socket: str, cmd: str = "links", **args: Any) -> dict[str, Any]:
    from chorus.admin import admin_request

    try:
        resp = admin_request(admin_socket, cmd, **args)
    except (OSError, ValueError) as e:
        raise ChorusCliError(f"coordinator not reachable at {admin_socket}: {e}") from e
    if not resp.get("ok"):
        raise ChorusCliError(str(resp.get("error")))
    return resp


def _cell(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def print_links(answer: dict[str, Any]) -> None:
    rows = answer["links"]
    if not rows:
        click.echo(f"node {answer['node']} has no [[link]] in its configuration")
        return
    print_table(["link", "dir", "sites", "state", "receiver", "sender", "peer GID", "applied", "lag (GIDs)",
                 "lag (s)", "own clock", "max repl.", "conflicts", "sent/filtered/returned"],
                [[r["link"], r["direction"],
                  f"{r['peer_site']} -> {r['site']}" if r["direction"] == "in" else f"{r['site']} -> {r['peer_site']}",
                  r["state"],
                  _cell(r["receiver_node"]) if r["direction"] == "in" else ", ".join(r.get("receivers") or []) or "-",
                  _cell(r["sender"]), _cell(r["peer_gid"]), _cell(r["applied_gid"]), _cell(r["lag_gids"]),
                  _cell(r["lag_seconds"]), _cell(r["own_clock"]), _cell(r["max_replicated"]), _cell(r["conflicts"]),
                  "-" if r["sent"] is None else f"{r['sent']}/{r['filtered']}/{r['returned']}"]
                 for r in rows])
    conflicts = [(r["link"], c) for r in rows for c in r["conflicts_by"]]
    if conflicts:
        click.echo("\nconflicts (chorus.link_exceptions)")
        print_table(["link", "table", "decision", "count"],
                    [[link, c["table"], c["decision"], c["count"]] for link, c in conflicts])
    for r in rows:
        copy = r.get("copy")
        if copy is not None:
            click.echo(f"\n{r['link']} ({r['direction']}): re-instantiation {copy['state']}: peer GID "
                       f"{_cell(copy['peer_gid'])}, {copy['tables']} table(s), {copy['rows']} row(s), "
                       f"{copy['applied']}/{copy['batches']} batch(es) applied, {copy['seconds']} s")
        if r.get("why"):
            click.echo(f"\n{r['link']} ({r['direction']}): {r['why']}")
        if r.get("ddl_skipped"):
            click.echo(f"\n{r['link']} ({r['direction']}): {r['ddl_skipped']} schema change(s) not sent, the last "
                       f"{r['ddl_skipped_last']}")


@click.group()
def link() -> None:
    """Links between sites (docs/LINKS.md)."""


_NODE_OPTIONS = (
    click.option("--config", "config_path", type=click.Path(dir_okay=False), help="The node's configuration file."),
    click.option("--admin", "admin_socket", help="The coordinator's admin socket (instead of --config)."),
    click.option("--dir", "directory", type=click.Path(file_okay=False), help="A local cluster's directory (with --node)."),
)


def _socket(config_path: Optional[str], admin_socket: Optional[str], directory: Optional[str],
            node: Optional[str]) -> str:
    if admin_socket is not None:
        return admin_socket
    if config_path is None and directory is None:
        raise ChorusCliError("give --config FILE, --admin SOCKET, or --dir DIR --node NAME")
    from chorus.cli.node import _admin_of

    return _admin_of(config_path, directory, node)


@link.command()
@_NODE_OPTIONS[0]
@_NODE_OPTIONS[1]
@_NODE_OPTIONS[2]
@click.option("--node", help="The node of a local cluster (with --dir).")
@click.option("--force", is_flag=True, help="Copy even a link that is neither broken nor new.")
@click.option("--no-wait", is_flag=True, help="Start it and return (poll with chorus link status / the log).")
@click.argument("name")
def reinstantiate(config_path: Optional[str], admin_socket: Optional[str], directory: Optional[str],
                  node: Optional[str], force: bool, no_wait: bool, name: str) -> None:
    """Instantiate link NAME again on the receiving site (docs/LINKS.md section 10): the peer
    copies the rows the link carries as of one of its GIDs (its log pinned there), this site
    realigns each table to the copy through its own order, and the link streams from that GID.
    Run it against the node running the link's receiver; refused where the link is neither
    broken nor new unless --force. Interrupted, it loses nothing: run it again."""
    sock = _socket(config_path, admin_socket, directory, node)
    answer = fetch_links(sock, "link-reinstantiate", link=name, force=force)
    shown = None
    while True:
        line = (f"{answer['state']}: peer {answer.get('peer') or '-'}, GID {answer.get('gid') or '-'}, "
                f"{answer['tables']} table(s), {answer['rows']} row(s), {answer['applied']}/{answer['batches']} "
                f"batch(es) applied, {answer['seconds']} s")
        if line != shown:
            click.echo(line)
            shown = line
        if answer["state"] == "done":
            click.echo(f"link {name} streams again from the peer's GID {answer['gid']}")
            return
        if answer["state"] in ("failed", "refused"):
            raise ChorusCliError(f"link {name}: re-instantiation {answer['state']}: {answer['error']}")
        if no_wait:
            return
        time.sleep(0.5)
        answer = fetch_links(sock, "link-reinstantiate", link=name, poll=True)


@link.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="The node's configuration file.")
@click.option("--admin", "admin_socket", help="The coordinator's admin socket (instead of --config).")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="A local cluster's directory (with NAME).")
@click.argument("name", required=False)
@json_option
def status(config_path: Optional[str], admin_socket: Optional[str], directory: Optional[str], name: Optional[str],
           as_json: bool) -> None:
    """The state of each link this node has a part in, by direction: in (the peer's changes
    applied here) and out (this site's, sent from this node): the node running each end, lag in
    GIDs and seconds, clocks, conflicts by table and decision, records sent and filtered."""
    if admin_socket is None:
        if config_path is None and directory is None:
            raise ChorusCliError("give --config FILE, --admin SOCKET, or --dir DIR NAME")
        from chorus.cli.node import _admin_of

        admin_socket = _admin_of(config_path, directory, name)
    answer = fetch_links(admin_socket)
    if as_json:
        print_json(answer)
        return
    print_links(answer)
