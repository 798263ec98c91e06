"""``chorus check ...``: consistency checks against a running cluster (docs/CHECKER.md)."""

from __future__ import annotations

import time
from typing import Any

import click

from chorus import appendload
from chorus.check import CheckError, node_refs, wait_quiescent
from chorus.cli.common import ChorusCliError, dir_option, json_option, print_json, print_table
from chorus.localcluster import LocalCluster, LocalClusterError


@click.group()
def check() -> None:
    """Check what a cluster guarantees, with a workload and a checker."""


@check.command()
@dir_option
@click.option("--seconds", default=30.0, show_default=True, help="How long the workload runs.")
@click.option("--clients", default=2, show_default=True, help="Clients per node.")
@click.option("--keys", default=8, show_default=True, help="Keys in use at a time.")
@click.option("--seed", default=0, show_default=True)
@json_option
def append(directory: str, seconds: float, clients: int, keys: int, seed: int, as_json: bool) -> None:
    """List-append transactions at REPEATABLE READ on every node of a local cluster at once, then
    the Elle-style check: cycles snapshot isolation forbids, lost acknowledged appends, garbage
    and aborted reads. Exit status 1 if anything forbidden is found."""
    try:
        nodes = LocalCluster(directory).describe(LocalCluster(directory).load())
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e
    targets = [(n["name"], n["dsn"]) for n in nodes]
    started = time.monotonic()
    if not as_json:
        click.echo(f"list-append on {len(targets)} nodes, {clients} clients each, {seconds:.0f} s ...", err=True)
    h = appendload.run(targets, seconds, clients, appendload.Settings(keys=keys), seed)
    try:
        wait_quiescent(node_refs(nodes), timeout=120)
    except CheckError as e:
        raise ChorusCliError(f"the cluster did not settle after the workload: {e}") from e
    appendload.read_final(targets, h)
    report = appendload.check(h)
    out: dict[str, Any] = {"valid": report.valid, "seconds": round(time.monotonic() - started, 1),
                           "outcomes": h.counts(), "client_errors": h.errors[:20], **report.as_dict()}
    if as_json:
        print_json(out)
    else:
        c = h.counts()
        print_table(["transactions", "ok", "failed", "unknown", "anomalies", "valid"],
                    [[len(h.txns), c["ok"], c["fail"], c["info"], len(report.violations), report.valid]])
        for a in report.anomalies:
            click.echo(f"{'FORBIDDEN' if a.forbidden else 'allowed'} {a.kind}: {a.description}")
    if not report.valid:
        raise SystemExit(1)
