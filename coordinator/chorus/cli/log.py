"""``chorus log ...``: look at a writeset log on disk (seed 9.5), read-only, beside a running coordinator."""

from __future__ import annotations

from typing import Any, Optional

import click

from chorus.cli.common import ChorusCliError, json_option, print_json, print_table
from chorus.wslog import FLAG_DDL_SKIPPED, LogError, inspect_segment, verify_directory


def _gids(first: int, last: int, records: int) -> str:
    return f"{first}-{last}" if records else "-"


def _span(gids: str, s: dict[str, Any]) -> str:
    """A segment's GIDs, marked "…" where a record spans from the segment before or into the next."""
    lead, tail = s.get("continues"), s.get("continued")
    if lead is not None:
        gids = f"…{lead}" if gids == "-" else f"…{lead}, {gids}"
    if tail is not None:
        gids += "…"
    return gids


def _piece(r: dict[str, Any]) -> str:
    p = r.get("piece")
    return "-" if p is None else f"{p['offset']}+{p['length']} of {p['total']}"


def _flags(flags: Optional[int]) -> str:
    if flags is None:
        return "?"
    if flags == 0:
        return "-"
    return "ddl-skipped" if flags == FLAG_DDL_SKIPPED else f"{flags:#x}"


def _problem_line(p: dict[str, Any]) -> str:
    where = f" offset {p['offset']}" if p.get("offset") is not None else ""
    return f"{p.get('file', '')}{where}: {p['kind']}: {p['message']}".lstrip()


@click.group()
def log() -> None:
    """Inspect and verify a node's writeset log (its segment files), without the coordinator."""


@log.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@json_option
def inspect(path: str, as_json: bool) -> None:
    """One segment file: header, GID range, records, where the valid data ends.

    Exits with status 1 when the header or a record is bad.
    """
    try:
        res = inspect_segment(path)
    except (LogError, OSError) as e:
        raise ChorusCliError(str(e)) from e
    if as_json:
        print_json(res)
    else:
        _show_segment(res)
    if res["problem"] is not None:
        raise SystemExit(1)


def _show_segment(res: dict[str, Any]) -> None:
    h = res["header"]
    rows: list[tuple[str, str]] = [("file", f"{res['file']} ({res['file_bytes']} bytes)")]
    if h is None:
        rows.append(("header", "none (a free segment)" if res["state"] == "free" else "too short"))
    else:
        rows.append(("header", f"seq {h['seq']}, epoch {h['epoch']}, version {h['version']}, "
                               f"prev GID {h['prev_gid']}, first GID {h['first_gid']}, "
                               f"segment {h['segment_bytes']} bytes, magic {'ok' if h['magic_ok'] else 'BAD'}, "
                               f"checksum {'ok' if h['crc_ok'] else 'BAD'}"))
    if res["header_problem"]:
        rows.append(("header problem", res["header_problem"]))
    if res["state"] == "segment":
        rows.append(("records", f"{res['record_count']}, GIDs {_gids(res['first_gid'], res['last_gid'], res['record_count'])}"))
        p = res["problem"]
        rows.append(("valid data", f"ends at offset {res['valid_end']}"
                     + (" (clean end)" if p is None else f"; first bad offset {p['offset']}: {p['kind']}: {p['message']}")))
    if res["unsettled"]:
        rows.append(("note", "a writer kept changing the file while it was read: run again"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")
    if res["records"]:
        click.echo()
        print_table(["GID", "origin", "flags", "bytes", "offset", "piece (bytes of the record)", "CRC"],
                    [[r["gid"], r["origin"] if r["origin"] is not None else "?", _flags(r["flags"]), r["size"],
                      r["offset"], _piece(r), "ok" if r["crc_ok"] else "BAD"] for r in res["records"]])


@log.command()
@click.argument("logdir", type=click.Path(exists=True, file_okay=False))
@json_option
def verify(logdir: str, as_json: bool) -> None:
    """Every segment of a log directory, in order: totals and each problem found.

    Exits with status 1 on any problem (a bad header, a bad record, a missing segment), 0 otherwise.
    """
    try:
        res = verify_directory(logdir)
    except (LogError, OSError) as e:
        raise ChorusCliError(str(e)) from e
    if as_json:
        print_json(res)
    else:
        _show_directory(res)
    if not res["ok"]:
        raise SystemExit(1)


def _show_directory(res: dict[str, Any]) -> None:
    print_table(["segment", "state", "seq", "epoch", "after GID", "GIDs", "records", "bytes"],
                [[s["file"], s["state"], s["seq"] if s["seq"] is not None else "-",
                  s["epoch"] if s["epoch"] is not None else "-", s["prev_gid"] if s["prev_gid"] is not None else "-",
                  _span(_gids(s["first_gid"], s["last_gid"], s["records"]), s), s["records"], s["bytes"]]
                 for s in res["segments"]])
    click.echo()
    click.echo(f"segments: {res['segment_count']} ({res['live_segments']} in the log); records: {res['records']}; "
               f"bytes: {res['bytes']}")
    click.echo(f"GIDs held: {_gids(res['low_gid'], res['high_gid'], res['records'])}; "
               f"every certified GID after {res['base_gid']}")
    if res["unsettled"]:
        click.echo("note: a writer kept changing the files while they were read: run again")
    if res["ok"]:
        click.echo("no problems")
        return
    click.echo(f"{len(res['problems'])} problem(s):")
    for p in res["problems"]:
        click.echo(f"  {_problem_line(p)}")
