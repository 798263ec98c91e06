"""Options and errors shared by the CLI modules."""

from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


class ChorusCliError(click.ClickException):
    """An error the CLI reports to the user with exit status 1."""


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(f)


def dir_option(f: F) -> F:
    return click.option(
        "--dir",
        "directory",
        default="./chorus-local",
        show_default=True,
        type=click.Path(file_okay=False),
        help="Directory of the local cluster.",
    )(f)


def print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    """A plain aligned table for people."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, r in enumerate(cells):
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if n == 0:
            click.echo("  ".join("-" * w for w in widths))
