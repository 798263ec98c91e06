"""``chorus demo``: a 3-node local cluster, a workload on every node, a consistency check."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any

import click
import psycopg

from chorus.testkit.check import CheckError, compare, node_refs, wait_quiescent
from chorus.cli.common import ChorusCliError, dir_option, print_table
from chorus.testkit.workload import BANK_SCHEMA, bank_setup, bank_total, run_bank


def _chorus(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "chorus", *args], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise ChorusCliError(f"chorus {' '.join(args)} failed:\n{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


@click.command()
@dir_option
@click.option("--nodes", default=3, show_default=True, help="Number of nodes.")
@click.option("--seconds", default=10.0, show_default=True, help="How long the workload runs.")
@click.option("--port-base", default=5433, show_default=True)
@click.option("--keep/--down", default=True, show_default=True, help="Leave the cluster running afterwards.")
def demo(directory: str, nodes: int, seconds: float, port_base: int, keep: bool) -> None:
    """Start a local cluster, run bank transfers on every node at once, check all nodes agree."""
    click.echo(f"starting a {nodes}-node local cluster in {directory} ...")
    info: dict[str, Any] = json.loads(_chorus("local", "up", "--nodes", str(nodes), "--dir", directory,
                                              "--port-base", str(port_base), "--json"))
    refs = node_refs(info["nodes"])
    ok = False
    try:
        first = refs[0].dsn
        with psycopg.connect(first, autocommit=True) as conn:
            conn.execute(BANK_SCHEMA)  # a schema change: every node runs it
        wait_quiescent(refs, 60)
        accounts, initial = 100, 1000
        bank_setup(first, accounts, initial)
        wait_quiescent(refs, 60)
        click.echo(f"created {accounts} accounts with {initial} each on {refs[0].name}; "
                   f"running transfers on every node for {seconds:.0f} s ...")
        t0 = time.monotonic()
        results = run_bank([(r.name, r.dsn) for r in refs], accounts, seconds)
        elapsed = time.monotonic() - t0
        wait_quiescent(refs, 60, progress=click.echo)
        diffs = compare(refs)
        totals = {r.name: bank_total(r.dsn) for r in refs}
        rows = []
        for r in refs:
            mine = [x for x in results if x.node == r.name]
            commits = sum(x.commits for x in mine)
            conflicts = sum(x.conflicts for x in mine)
            lat = [v for x in mine for v in x.latencies_ms]
            rows.append([r.name, commits, conflicts, f"{commits / elapsed:.0f}",
                         f"{statistics.median(lat):.1f}" if lat else "-", totals[r.name]])
        click.echo("")
        print_table(["node", "commits", "40001 retries", "tps", "p50 ms", "bank total"], rows)
        errors = [e for x in results for e in x.errors]
        click.echo("")
        expected = accounts * initial
        if errors:
            click.echo(f"unexpected client errors: {len(errors)}; first: {errors[0]}")
        if diffs:
            click.echo("NODES DIFFER:\n  " + "\n  ".join(diffs))
        elif any(t != expected for t in totals.values()):
            click.echo(f"BANK TOTAL CHANGED: expected {expected}, got {totals}")
        else:
            click.echo(f"all {len(refs)} nodes hold identical data; the bank total is {expected} everywhere.")
            ok = not errors
    except CheckError as e:
        raise ChorusCliError(str(e)) from e
    finally:
        if keep:
            click.echo(f"\nthe cluster keeps running: `chorus local status --dir {directory}`; "
                       f"stop it with `chorus local down --dir {directory}`.")
            for n in info["nodes"]:  # the password is in the cluster's password file
                click.echo(f"  {n['name']}: {n['psql']}")
        else:
            _chorus("local", "down", "--dir", directory)
    if not ok:
        raise SystemExit(1)
