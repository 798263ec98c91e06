"""``chorus lab ...``: several hosts on this machine, each in its own network namespace, with
partitions, delay, loss, freezes and crashes on demand (docs/LAB.md)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Callable

import click

from chorus import appendload
from chorus.check import NodeRef

from chorus.cli.check import settle_and_judge
from chorus.cli.common import ChorusCliError, json_option, print_json, print_table
from chorus.cli.local import _node_status
from chorus.lab.nemesis import Nemesis
from chorus.lab.rig import Lab
from chorus.localcluster import LocalClusterError


def lab_dir_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--dir", "directory", default="./chorus-lab", show_default=True,
                        type=click.Path(file_okay=False), help="Directory of the lab.")(f)


def _lab(directory: str) -> Lab:
    return Lab(directory, log=lambda s: click.echo(s, err=True))


def _do(what: Callable[[], Any]) -> Any:
    try:
        return what()
    except (LocalClusterError, ValueError, OSError) as e:
        raise ChorusCliError(str(e)) from e


def _show(lab: Lab, as_json: bool) -> None:
    hosts = _do(lambda: lab.describe(lab.load()))
    for h in hosts:
        st = _node_status(h["admin"]) if h["coordinator_pid"] else {}
        h["state"] = st.get("state", "down")
        h["reason"] = st.get("reason", "")
        h["committed_gid"] = st.get("committed_gid")
    if as_json:
        print_json({"dir": str(lab.dir), "nodes": hosts, "switch": _do(lab.switch_state)})
        return
    print_table(["host", "namespace", "dsn", "state", "committed GID", "corosync", "postgres", "coordinator"],
                [[h["name"], h["namespace"], h["dsn"], h["state"],
                  h["committed_gid"] if h["committed_gid"] is not None else "-",
                  h["corosync_pid"] or "-", h["pg_pid"] or "-", h["coordinator_pid"] or "-"] for h in hosts])


@click.group()
def lab() -> None:
    """Hosts in network namespaces, each with its own Corosync, PostgreSQL and coordinator."""


@lab.command()
@lab_dir_option
@click.option("--hosts", default=3, show_default=True, help="Number of hosts (when creating).")
@click.option("--port-base", default=6433, show_default=True, help="PostgreSQL port of the first host.")
@json_option
def up(directory: str, hosts: int, port_base: int, as_json: bool) -> None:
    """Create, or restart, a lab and wait until every node is online."""
    lab_ = _lab(directory)
    _do(lambda: lab_.create(hosts, port_base))
    _show(lab_, as_json)


@lab.command()
@lab_dir_option
@json_option
def status(directory: str, as_json: bool) -> None:
    """Hosts, their processes and state, and the switch's rules and counters."""
    _show(_lab(directory), as_json)


@lab.command()
@lab_dir_option
@click.argument("groups", nargs=-1, required=True)
def partition(directory: str, groups: tuple[str, ...]) -> None:
    """Split the hosts into GROUPS that cannot reach each other, e.g. `1,2 3`."""
    try:
        parsed = [[int(h) for h in g.split(",") if h] for g in groups]
    except ValueError as e:
        raise ChorusCliError(f"groups are comma-separated host numbers, e.g. `1,2 3`: {e}") from e
    answer = _do(lambda: _lab(directory).partition(parsed))
    click.echo(f"partitioned: {' | '.join(','.join(map(str, g)) for g in answer['groups'])}")


@lab.command()
@lab_dir_option
def heal(directory: str) -> None:
    """Let every host reach every other again."""
    _do(lambda: _lab(directory).heal())
    click.echo("healed")


@lab.command()
@lab_dir_option
@click.argument("spec")
def netem(directory: str, spec: str) -> None:
    """Delay, loss, duplication between hosts, in tc netem's words: 'delay 5ms 1ms loss 1%'.
    An empty SPEC clears them."""
    answer = _do(lambda: _lab(directory).netem(spec))
    click.echo(f"netem: {answer['netem']}")


def _host_command(name: str, doc: str, action: Callable[[Lab, str], None]) -> click.Command:
    @lab_dir_option
    @click.argument("host")
    def command(directory: str, host: str) -> None:
        node = host if host.startswith("n") else f"n{host}"
        _do(lambda: action(_lab(directory), node))

    command.__doc__ = doc
    return click.command(name)(command)


for _name, _doc, _action in (
    ("freeze", "SIGSTOP every process of HOST (a hung machine).", Lab.freeze),
    ("thaw", "SIGCONT every process of HOST.", Lab.thaw),
    ("kill", "SIGKILL HOST's coordinator, PostgreSQL and corosync (a crashed machine).", Lab.kill_host),
    ("restart", "Start HOST's corosync, PostgreSQL and coordinator and wait until it is online.",
     Lab.restart_host),
):
    lab.add_command(_host_command(_name, _doc, _action))


@lab.command()
@lab_dir_option
@click.option("--seconds", default=120.0, show_default=True, help="How long the faults go on.")
@click.option("--seed", default=1, show_default=True, help="The fault schedule follows it.")
@click.option("--clients", default=1, show_default=True, help="List-append clients per host.")
@json_option
def nemesis(directory: str, seconds: float, seed: int, clients: int, as_json: bool) -> None:
    """Randomized faults (partitions, kills, crashes, freezes, delay and loss) while list-append
    clients run on every host; then heal everything, let the cluster settle and check the
    history (docs/CHECKER.md). Exit status 1 if anything forbidden is found."""
    lab_ = _lab(directory)
    hosts = _do(lambda: lab_.describe(lab_.load()))
    names = [h["name"] for h in hosts]
    targets = [(h["name"], h["socket_dsn"]) for h in hosts]  # a client reaches its own host
    refs = [NodeRef(h["name"], h["socket_dsn"], h["admin"]) for h in hosts]
    out: list[appendload.History] = []
    settings = appendload.Settings()
    appendload.setup(targets[0][1], settings.keys)  # before anything breaks
    worker = threading.Thread(target=lambda: out.append(
        appendload.run(targets, seconds + 8, clients, settings, seed=seed, prepared=True)), daemon=True)
    worker.start()
    events = Nemesis(lab_, names, seed, say=lambda line: click.echo(line, err=True)).run(seconds)
    worker.join(seconds + 300)
    if not out:
        raise ChorusCliError("the list-append clients did not end")
    _do(lambda: lab_.wait_online(lab_.load(), names, timeout=300))
    faults = Counter(e.what for e in events if not e.what.startswith(("undo", "heal")))
    settle_and_judge(out[0], targets, refs, 300, as_json,
                     {"seed": seed, "seconds": seconds, "nemesis": dict(faults), "events": [e.as_dict() for e in events]},
                     ["faults: " + ", ".join(f"{k} x{v}" for k, v in sorted(faults.items()))])


@lab.command()
@lab_dir_option
def down(directory: str) -> None:
    """Stop everything the lab started and remove its namespaces and devices."""
    _do(lambda: _lab(directory).down())
