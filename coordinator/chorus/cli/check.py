"""``chorus check ...``: consistency checks against a running cluster (docs/CHECKER.md)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Sequence

import click

from chorus.testkit import appendload
from chorus.testkit.check import CheckError, NodeRef, node_refs, wait_quiescent
from chorus.cli.common import ChorusCliError, dir_option, json_option, print_json, print_table
from chorus.testkit.localcluster import LocalCluster, LocalClusterError


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
        cluster = LocalCluster(directory)
        nodes = cluster.describe(cluster.load())
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e
    targets = [(n["name"], n["dsn"]) for n in nodes]
    started = time.monotonic()
    if not as_json:
        click.echo(f"list-append on {len(targets)} nodes, {clients} clients each, {seconds:.0f} s ...", err=True)
    h = appendload.run(targets, seconds, clients, appendload.Settings(keys=keys), seed)
    settle_and_judge(h, targets, node_refs(nodes), 120, as_json, {"seconds": round(time.monotonic() - started, 1)})


def settle_and_judge(h: appendload.History, targets: list[tuple[str, str]], refs: list[NodeRef], timeout: float,
                     as_json: bool, extra: dict[str, Any], lines: Sequence[str] = ()) -> None:
    """After a list-append run: wait until the cluster has settled, read every list on every
    node, check the history, and say so: a table (then ``lines``, the allowed anomalies counted,
    every forbidden one), or JSON
    with ``extra``. Exit status 1 if anything forbidden was found."""
    try:
        wait_quiescent(refs, timeout=timeout)
    except CheckError as e:
        raise ChorusCliError(f"the cluster did not settle after the run: {e}") from e
    appendload.read_final(targets, h)
    report = appendload.check(h)
    c = h.counts()
    if as_json:
        print_json({"valid": report.valid, "outcomes": c, "client_errors": h.errors[:20], **extra,
                    **report.as_dict()})
    else:
        print_table(["transactions", "ok", "failed", "unknown", "forbidden anomalies", "valid"],
                    [[len(h.txns), c["ok"], c["fail"], c["info"], len(report.violations), report.valid]])
        for line in lines:
            click.echo(line)
        allowed = Counter(a.kind for a in report.allowed)
        if allowed:
            click.echo("allowed under snapshot isolation: "
                       + ", ".join(f"{k} x{v}" for k, v in sorted(allowed.items())) + " (--json lists them)")
        for a in report.violations:
            click.echo(f"FORBIDDEN {a.kind}: {a.description}")
    if not report.valid:
        raise SystemExit(1)
