"""``chorus lab ...``: several hosts on this machine, each in its own network namespace, with
partitions, delay, loss, freezes and crashes on demand (docs/LAB.md)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Callable, Optional

import click

from chorus.cli.common import ChorusCliError, json_option, print_json, print_table
from chorus.cli.local import _node_status
from chorus.cli.members import add_on_machine, remove_on_machine
from chorus.cli.total import with_spark_options
from chorus.testkit.lab.campaign import WORKLOADS, SeedReport, run_seed
from chorus.testkit.lab.rig import Lab
from chorus.testkit.localcluster import LocalClusterError


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
@click.option("--spare", default=0, show_default=True,
              help="Hosts made beyond --hosts (namespaces, switch ports) for `chorus lab add` (when creating).")
@json_option
def up(directory: str, hosts: int, port_base: int, spare: int, as_json: bool) -> None:
    """Create, or restart, a lab and wait until every node is online."""
    lab_ = _lab(directory)
    _do(lambda: lab_.create(hosts, port_base, spare))
    _show(lab_, as_json)


@lab.command("add")
@lab_dir_option
@click.argument("host", required=False)
@click.option("--donor", default=None, help="The node its data is copied from (default: the one that holds most).")
@click.option("--timeout", default=600.0, show_default=True)
@with_spark_options
@json_option
def add_host(directory: str, host: Optional[str], donor: Optional[str], timeout: float, spark_master: str,
             spark_submit: Optional[str], range_rows: int, as_json: bool) -> None:
    """Add a spare host to the running cluster (chorus node add: the configured nodes grow by it
    in the total order, every Corosync reloads its node list, the host joins by total recovery)."""
    node = host if host is None or host.startswith("n") else f"n{host}"
    add_on_machine(_lab(directory), node, None, donor, timeout, spark_master, spark_submit, range_rows, as_json)


@lab.command("remove")
@lab_dir_option
@click.argument("host")
@json_option
def remove_host(directory: str, host: str, as_json: bool) -> None:
    """Remove a host from the running cluster (chorus node remove); its namespace stays spare."""
    remove_on_machine(_lab(directory), host if host.startswith("n") else f"n{host}", as_json)


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


def _seed_range(seed: Optional[int], seeds: Optional[str]) -> range:
    if seeds is None:
        return range(seed or 1, (seed or 1) + 1)
    a, _, b = seeds.partition("..")
    try:
        return range(int(a), int(b or a) + 1)
    except ValueError as e:
        raise ChorusCliError(f"--seeds is A..B, e.g. 1..20: {e}") from e


@lab.command()
@lab_dir_option
@click.option("--seconds", default=120.0, show_default=True, help="How long the faults go on, per seed.")
@click.option("--seed", type=int, default=None, help="The fault schedule follows it (default 1).")
@click.option("--seeds", default=None, help="Run seeds A..B one after another, e.g. 1..20.")
@click.option("--clients", default=1, show_default=True, help="Clients per host and workload.")
@click.option("--workloads", default=",".join(WORKLOADS), show_default=True,
              help="Comma-separated: append (list-append, checked Elle-style), bank (transfers, the total "
                   "checked), set (inserts, every acknowledged one present).")
@click.option("--recover-timeout", default=300.0, show_default=True,
              help="Seconds after the heal for every node to be online, else the seed is stuck.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="Append each seed's report to this file as it ends (JSON lines).")
@json_option
def nemesis(directory: str, seconds: float, seed: Optional[int], seeds: Optional[str], clients: int, workloads: str,
            recover_timeout: float, report_path: Optional[str], as_json: bool) -> None:
    """Randomized faults (partitions, kills, crashes, freezes, delay and loss) while workloads
    run on every host, one seed after another; after each, heal everything, time how long the
    cluster takes to come back, let it settle and check the histories (docs/CHECKER.md). A seed
    whose cluster does not come back ends the campaign, the lab left as it is, with every
    node's phase and reason. Exit status 1 if any seed is stuck or anything forbidden is found."""
    chosen = tuple(w.strip() for w in workloads.split(",") if w.strip())
    unknown = set(chosen) - set(WORKLOADS)
    if unknown or not chosen:
        raise ChorusCliError(f"--workloads: choose among {', '.join(WORKLOADS)} (not {', '.join(sorted(unknown))})")
    lab_ = _lab(directory)
    hosts = _do(lambda: lab_.describe(lab_.load()))
    reports: list[SeedReport] = []
    for s in _seed_range(seed, seeds):
        click.echo(f"seed {s}: {seconds:.0f} s of faults, workloads {', '.join(chosen)}", err=True)
        r = run_seed(lab_, hosts, s, seconds, clients, chosen, recover_timeout,
                     say=lambda line: click.echo(line, err=True))
        reports.append(r)
        click.echo(r.line(), err=as_json)
        for a in r.anomalies[:20]:
            click.echo(f"  FORBIDDEN {a}", err=as_json)
        if report_path is not None:
            with open(report_path, "a") as f:
                f.write(json.dumps(r.as_dict()) + "\n")
        if r.stuck is not None:
            break  # the lab stays as it is, to look at
    if as_json:
        print_json({"seeds": [r.as_dict() for r in reports]})
    else:
        _summary(reports)
    if not all(r.ok for r in reports):
        raise SystemExit(1)


def _summary(reports: list[SeedReport]) -> None:
    print_table(["seed", "faults", "appends ok", "transfers acked", "inserts acked", "anomalies", "back after heal"],
                [[r.seed, sum(r.faults.values()), r.appends.get("ok", 0), r.transfers.get("acked", 0),
                  r.inserts.get("acked", 0), len(r.anomalies),
                  "STUCK" if r.stuck is not None else f"{r.recovered_in:.1f} s"] for r in reports])
    back = [r.recovered_in for r in reports if r.recovered_in is not None]
    faults: Counter[str] = Counter()
    for r in reports:
        faults.update(r.faults)
    click.echo(f"{len(reports)} seeds: {sum(r.stuck is not None for r in reports)} stuck, "
               f"{sum(len(r.anomalies) for r in reports)} anomalies; slowest recovery after the heal "
               f"{max(back):.1f} s" if back else f"{len(reports)} seeds, none came back")
    click.echo("faults: " + ", ".join(f"{k} x{v}" for k, v in sorted(faults.items())))


@lab.command()
@lab_dir_option
def down(directory: str) -> None:
    """Stop everything the lab started and remove its namespaces and devices."""
    _do(lambda: _lab(directory).down())
