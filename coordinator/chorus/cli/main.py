"""Entry point: one click group; each concern registers its commands from its own module."""

from __future__ import annotations

import click

import chorus
from chorus.cli import check as check_cmds
from chorus.cli import demo as demo_cmds
from chorus.cli import lab as lab_cmds
from chorus.cli import link as link_cmds
from chorus.cli import local as local_cmds
from chorus.cli import log as log_cmds
from chorus.cli import members as members_cmds
from chorus.cli import migrate as migrate_cmds
from chorus.cli import node as node_cmds


@click.group()
@click.version_option(version=chorus.__version__, prog_name="chorus")
def cli() -> None:
    """Chorus: synchronous multi-master replication for PostgreSQL."""


cli.add_command(local_cmds.local)
cli.add_command(lab_cmds.lab)
cli.add_command(local_cmds.sql_command)
cli.add_command(demo_cmds.demo)
cli.add_command(check_cmds.check)
cli.add_command(log_cmds.log)
cli.add_command(link_cmds.link)
cli.add_command(migrate_cmds.dump)
cli.add_command(migrate_cmds.load)
for command in node_cmds.COMMANDS:
    cli.add_command(command)
node_cmds.node.add_command(members_cmds.add)  # chorus node add / remove
node_cmds.node.add_command(members_cmds.remove)


def main() -> None:
    cli()
