"""Moving a database into Chorus and out of it (docs/MIGRATION.md): ``chorus dump`` (a node's
dump that restores into a plain PostgreSQL) and ``chorus load`` (a dump into a local cluster,
replicated or through one node and total recovery)."""

from __future__ import annotations

import subprocess
import sys
from typing import IO, Optional

import click

from chorus.cli.common import ChorusCliError, json_option, print_json


def _node_dsn(directory: Optional[str], node: Optional[str], dsn: Optional[str]) -> str:
    if dsn:
        return dsn
    if not directory:
        raise ChorusCliError("give --dsn, or --dir (and --node) of a local cluster")
    from chorus.testkit.localcluster import LocalCluster, LocalClusterError

    try:
        c = LocalCluster(directory)
        meta = c.load()
        return c.config(meta, c._node(meta, node or meta.nodes[0].name)).dsn
    except LocalClusterError as e:
        raise ChorusCliError(str(e)) from e


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--dsn", help="The node's database (libpq connection string).")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="A local cluster's directory.")
@click.option("--node", help="The local cluster's node to dump (default: the first).")
@click.option("-f", "--file", "path", type=click.Path(dir_okay=False), help="Write here (default: standard output).")
@click.option("--list", "archive", type=click.Path(exists=True, dir_okay=False),
              help="Instead: print the table of contents of this pg_dump archive (-Fc, -Ft) without "
                   "Chorus's entries, for pg_restore -L.")
@click.argument("pg_dump_args", nargs=-1, type=click.UNPROCESSED)
def dump(dsn: Optional[str], directory: Optional[str], node: Optional[str], path: Optional[str],
         archive: Optional[str], pg_dump_args: tuple[str, ...]) -> None:
    """A plain-SQL dump of a node (pg_dump, any of its options after --) without Chorus's own
    objects (the extension, its schema): it restores into a PostgreSQL without Chorus, e.g.
    `psql -v ON_ERROR_STOP=1 -f dump.sql`."""
    from chorus.testkit.localcluster import PGBIN
    from chorus.migrate import portable

    out: IO[str] = open(path, "w", encoding="utf-8", errors="surrogateescape") if path else sys.stdout
    try:
        if archive:
            listed = subprocess.run([str(PGBIN / "pg_restore"), "--list", archive], capture_output=True, text=True)
            if listed.returncode != 0:
                raise ChorusCliError(f"pg_restore --list failed: {listed.stderr.strip()}")
            out.writelines(portable.toc(listed.stdout.splitlines(keepends=True)))
            return
        if any(a.startswith(("-F", "--format")) for a in pg_dump_args):
            raise ChorusCliError("chorus dump writes plain SQL; for an archive, run pg_dump and restore it "
                                 "with pg_restore -L and the list `chorus dump --list ARCHIVE` prints")
        proc = subprocess.Popen([str(PGBIN / "pg_dump"), *pg_dump_args, _node_dsn(directory, node, dsn)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                encoding="utf-8", errors="surrogateescape")
        assert proc.stdout is not None and proc.stderr is not None
        out.writelines(portable.plain(proc.stdout))
        err = proc.stderr.read()
        if proc.wait() != 0:
            raise ChorusCliError(f"pg_dump failed: {err.strip()}")
    finally:
        if path:
            out.close()


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False), help="A local cluster's directory.")
@click.option("--node", help="The node to restore through (default: the first).")
@click.option("--jobs", default=4, show_default=True, help="pg_restore --jobs.")
@click.option("--fast", is_flag=True,
              help="Restore into the node alone and rebuild the others from it by total recovery "
                   "(no writes meanwhile); without it, every row is replicated as the restore goes.")
@click.option("--spark-master", default="auto", show_default=True, help="Total recovery's Spark master (--fast).")
@json_option
@click.argument("archive", type=click.Path(exists=True))
@click.argument("pg_restore_args", nargs=-1, type=click.UNPROCESSED)
def load(directory: str, node: Optional[str], jobs: int, fast: bool, spark_master: str, as_json: bool,
         archive: str, pg_restore_args: tuple[str, ...]) -> None:
    """Load a pg_dump archive (-Fc, -Fd) into a local cluster (docs/MIGRATION.md); more
    pg_restore options after the archive. Create the dump's roles first, through any node."""
    from chorus.testkit.localcluster import LocalCluster, LocalClusterError
    from chorus.migrate import load as loading

    def say(line: str) -> None:
        click.echo(line, err=True)

    try:
        c = LocalCluster(directory)
        meta = c.load()
        name = node or meta.nodes[0].name
        if fast:
            from chorus.cli.node import watch_until_online
            from chorus.cli.total import total_join_local

            def rebuild(joiner: str, donor: str) -> None:
                total_join_local(directory, joiner, donor, spark_master, None, 1000, any_donor=True)

            result = loading.through_one_node(directory, archive, name, say, rebuild,
                                              lambda socket: watch_until_online(socket, 3600), jobs,
                                              list(pg_restore_args))
        else:
            result = loading.replicated(c.config(meta, c._node(meta, name)).dsn, archive, jobs,
                                        list(pg_restore_args))
    except (LocalClusterError, loading.LoadError) as e:
        raise ChorusCliError(str(e)) from e
    if as_json:
        print_json(result)
    else:
        click.echo(" ".join(f"{k}={v}" for k, v in result.items()))
