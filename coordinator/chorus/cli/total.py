"""Total recovery (``chorus node join --total``: a node of a local cluster with ``--dir DIR NAME``,
any node with ``--config FILE --donor-dsn DSN``) and ``chorus verify`` (a local cluster): both run
the Spark snapshot diff (chorus.total.recover, spark/chorus_spark)."""

from __future__ import annotations

import shutil
from typing import Any, Optional

import click

from chorus.cli.common import ChorusCliError, json_option, print_json, print_table
from chorus.config import NodeConfig

spark_options = [
    click.option("--spark-master", default="auto", show_default=True,
                 help="Spark master URL for the rows level (spark://HOST:PORT runs it on that cluster; "
                      "docs/RECOVERY.md); auto: Spark (local[*]) only when there are over 5M rows to compare, "
                      "else threads of this process; none: never Spark."),
    click.option("--spark-submit", "spark_submit", default=None,
                 help="Run the job's driver with this spark-submit (client mode, on --spark-master) "
                      "instead of in this process."),
    click.option("--range-rows", default=1000, show_default=True,
                 help="Rows per key range compared by hash before its leaves (of 32 rows) are."),
]


def with_spark_options(f: Any) -> Any:
    for opt in reversed(spark_options):
        f = opt(f)
    return f


def _say(line: str) -> None:
    click.echo(line, err=True)


def _local(directory: str) -> tuple[Any, Any]:
    """The local cluster in ``directory``, or the lab (chorus lab) if it is one."""
    from pathlib import Path

    from chorus.testkit.lab.rig import Lab
    from chorus.testkit.localcluster import LocalCluster

    c = Lab(directory, log=_say) if (Path(directory) / "lab.json").exists() else LocalCluster(directory, log=_say)
    return c, c.load()


def _endpoint(c: Any, meta: Any, n: Any) -> Any:
    """A local node's database over TCP (the diff's tasks reach it so), with the password from
    the cluster's password file; what the DSN leaves out (TLS) from the libpq environment
    (total.conn.Endpoint)."""
    from chorus.total.recover import Endpoint

    return Endpoint.from_dsn(n.name, c.tcp_dsn(n))


def database_gid(dsn: str, whose: str) -> int:
    """The GID a node's database holds: its durable GID, or the committed one if its coordinator
    ran since PostgreSQL started (a commit not flushed yet is still there to lose). ``whose``
    names the database in the error ("the donor n1", "the joiner n2")."""
    import psycopg

    from chorus.total.conn import redact

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SELECT greatest(chorus.durable_gid(), chorus.committed_gid())").fetchone()
    except psycopg.OperationalError as e:
        raise ChorusCliError(f"cannot connect to {whose} ({redact(dsn)}): {str(e).strip()}") from e
    return int(row[0]) if row else 0


def check_donor(joiner: str, joiner_gid: int, donor: str, donor_gid: int, force: bool) -> None:
    """Refuse a donor behind the joiner (history.donor_problem) unless ``force``: the GIDs only
    the joiner holds would be dropped, acknowledged transactions among them."""
    from chorus.history import donor_problem

    problem = donor_problem(joiner, joiner_gid, donor, donor_gid)
    if problem is None:
        return
    if not force:
        raise ChorusCliError(f"{problem}. Pick a donor that has committed GID {joiner_gid} (`chorus status` on each "
                             "node shows its committed GID), or let the cluster re-form from this node; --force "
                             "drops them")
    _say(f"warning: {problem}; dropping them (--force)")


def _online_status(c: Any, meta: Any, name: str, any_state: bool = False) -> Optional[dict[str, Any]]:
    from chorus.admin import admin_request

    try:
        st: dict[str, Any] = admin_request(c.config(meta, c._node(meta, name)).admin_socket)["status"]
    except (OSError, ValueError, KeyError):
        return None
    return st if any_state or st.get("state") == "online" else None


def total_join_local(directory: str, name: str, donor: Optional[str], spark_master: str,
                     spark_submit: Optional[str], range_rows: int, copy_under_mb: int = 16,
                     force: bool = False, any_donor: bool = False) -> dict[str, Any]:
    """Rebuild node ``name`` of a local cluster from a donor's snapshot (the online node that
    has committed most, or ``donor``); start it (it then catches up from the snapshot GID by
    partial recovery). A donor behind the node is refused unless ``force``. The donor must be
    online, unless ``any_donor``: then any node whose coordinator answers (``chorus load --fast``
    rebuilds the others from a node left alone, outside the primary component, once its load is
    done)."""
    from chorus.testkit.localcluster import SERVICE_USER, LocalClusterError
    from chorus.state import load_state, save_state
    from chorus.total.recover import TotalRecoveryError, total_recover
    from chorus.total.conn import ConnectionSettingsError

    try:
        c, meta = _local(directory)
        n = c._node(meta, name)
        others = [m.name for m in meta.nodes if m.name != name]
        candidates = [donor] if donor else others
        donors = [(d, st) for d in candidates if (st := _online_status(c, meta, d, any_donor)) is not None]
        if not donors:
            raise ChorusCliError(f"no online donor among {', '.join(candidates) or 'no other nodes'}")
        # an online donor commits everything it released: the one that released most holds most
        dname, dstatus = max(donors, key=lambda ds: (int(ds[1].get("released_gid") or 0), -candidates.index(ds[0])))
        c._start_postgres(n)  # (it runs, unless the node is stopped: its GID is read from it)
        check_donor(name, database_gid(c.config(meta, n).dsn, f"the joiner {name}"), dname,
                    int(dstatus.get("released_gid") or 0), force)
        _say(f"{name}: stopping its coordinator for total recovery from {dname}")
        c._stop_coordinator(n)
        c._start_postgres(n)
        c.save(meta)
        result = total_recover(_endpoint(c, meta, c._node(meta, dname)), _endpoint(c, meta, n), _say,
                               range_rows=range_rows, small_bytes=copy_under_mb << 20,
                               master=spark_master, spark_submit=spark_submit)
        cfg = c.config(meta, n)
        state = load_state(cfg.state_file, name)
        save_state(cfg.state_file, state.with_(cluster_uuid=dstatus["cluster_uuid"], last_gid=result["gid"], left_by_vote="",
                                            removed="", bootstrap=False, safe_to_bootstrap=False,
                                            epochs=_epochs(dstatus)))
        if c.as_root:  # the coordinator runs as the service user
            shutil.chown(cfg.state_file, SERVICE_USER, SERVICE_USER)
        c.start(name, wait=False)
    except (LocalClusterError, TotalRecoveryError, ConnectionSettingsError) as e:
        raise ChorusCliError(str(e)) from e
    return result


def _epochs(status: dict[str, Any]) -> tuple[Any, ...]:
    """The donor's epochs (its history, chorus/history.py), which the rebuilt node's data now follows."""
    from chorus.history import Epoch

    return tuple(Epoch(int(n), int(g), str(node)) for n, g, node in status.get("epochs") or [])


def total_join_config(cfg: NodeConfig, config_path: str, donor_dsn: str, cluster_uuid: str, spark_master: str,
                      spark_submit: Optional[str], range_rows: int, copy_under_mb: int = 16,
                      force: bool = False) -> dict[str, Any]:
    """Rebuild the node of configuration ``cfg`` (read from ``config_path``; any deployment) from
    the database at ``donor_dsn``. Its PostgreSQL must run and its coordinator must be stopped (a service
    manager owns it, so this command does not start it again). Afterwards the node's state says
    which GID its database holds; the cluster UUID is ``cluster_uuid`` if given, otherwise the
    node adopts the UUID of the cluster its group runs when it joins."""
    import os

    from chorus.admin import admin_request
    from chorus.state import load_state, save_state
    from chorus.total.recover import Endpoint, TotalRecoveryError, total_recover
    from chorus.total.conn import ConnectionSettingsError

    try:
        admin_request(cfg.admin_socket, timeout=2)
    except (OSError, ValueError):
        pass
    else:
        raise ChorusCliError(f"node {cfg.name}'s coordinator is running (it answers on {cfg.admin_socket}): stop it "
                             "first (its service, or the `chorus run` process), keep PostgreSQL running, then "
                             "run this again")
    try:
        donor = Endpoint.from_dsn("donor", donor_dsn)
        joiner = Endpoint.from_dsn(cfg.name, cfg.dsn)
        check_donor(cfg.name, database_gid(joiner.dsn, f"the joiner {cfg.name}"), "the donor",
                    database_gid(donor.dsn, "the donor"), force)
        result = total_recover(donor, joiner, _say, range_rows=range_rows, small_bytes=copy_under_mb << 20,
                               master=spark_master,
                               spark_submit=spark_submit)
    except (TotalRecoveryError, ConnectionSettingsError) as e:
        raise ChorusCliError(str(e)) from e
    st = load_state(cfg.state_file, cfg.name)
    owner = os.stat(cfg.state_file) if os.path.exists(cfg.state_file) else None
    # the donor's epochs are not known from its database alone: the node's data is checked against
    # the cluster's history by its GID when it joins
    save_state(cfg.state_file, st.with_(cluster_uuid=cluster_uuid, last_gid=result["gid"], bootstrap=False, left_by_vote="",
                                        removed="", safe_to_bootstrap=False, epochs=()))
    if owner is not None and os.geteuid() == 0:  # the coordinator's user must still own its state
        os.chown(cfg.state_file, owner.st_uid, owner.st_gid)
    _say(f"{cfg.name}: rebuilt at GID {result['gid']}; start its coordinator now (its service, or "
         f"`chorus run --config {config_path}`): it joins and catches up from GID {result['gid']}")
    return result


@click.command()
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="A local cluster's directory.")
@with_spark_options
@json_option
def verify(directory: str, spark_master: str, spark_submit: Optional[str], range_rows: int, as_json: bool) -> None:
    """Compare every online node with the first, at one snapshot GID, table by table; list the
    rows that differ. Exit status 1 if anything differs."""
    from chorus.testkit.localcluster import LocalClusterError
    from chorus.total.recover import TotalRecoveryError, verify as run_verify
    from chorus.total.conn import ConnectionSettingsError

    try:
        c, meta = _local(directory)
        nodes = [(_endpoint(c, meta, n), c.config(meta, n).admin_socket) for n in meta.nodes
                 if _online_status(c, meta, n.name) is not None]
        if len(nodes) < 2:
            raise ChorusCliError("verify needs at least two online nodes")
        result = run_verify(nodes, _say, range_rows=range_rows, master=spark_master, spark_submit=spark_submit)
    except (LocalClusterError, TotalRecoveryError, ConnectionSettingsError) as e:
        raise ChorusCliError(str(e)) from e
    if as_json:
        print_json(result)
    else:
        click.echo(f"compared with {result['reference']} at GID {result['gid']}")
        print_table(["table", "node", "ranges", "differing", "missing", "extra", "differs"],
                    [[t["table"], t["node"], t["ranges"], t["ranges_differing"], t["missing"], t["extra"],
                      t["differs"]] for t in result["tables"]])
        for d in result["schema_differences"]:
            click.echo(f"{d['table']} on {d['node']}: {d['problem']}")
        for t in result["tables"]:
            for s in t["sample"]:
                key = ", ".join(f"{k}={v}" for k, v in s["key"].items())
                click.echo(f"{t['table']} on {t['node']}: row ({key}) {s['kind']}")
        click.echo("identical" if result["identical"] else "NODES DIFFER")
    if not result["identical"]:
        raise SystemExit(1)
