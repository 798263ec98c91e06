"""A node's dump without Chorus's own objects: what restores into a plain PostgreSQL.

A Chorus node's capture is internal (extension/chorus_attach.c), so ``pg_dump`` of a node
writes the application's objects as they are, and three things of Chorus's: the ``chorus``
extension, its comment, and its schema (with the schema's owner and privileges). A PostgreSQL
without the extension fails on ``CREATE EXTENSION chorus``. PostgreSQL 15's pg_dump cannot leave
one extension out (``--exclude-extension`` came with 17), so these filters do it: one on a plain
dump as it streams (:func:`plain`), one on ``pg_restore --list`` output for an archive
(:func:`toc`). Pure functions, on text; ``chorus dump`` and docs/MIGRATION.md use them.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

from chorus.total.schema import Entry

# a plain dump's entry header (its object, or its data)
_HEADER = re.compile(r"^-- (?:Data for )?Name: (?P<name>.*); Type: (?P<type>.*); Schema: (?P<schema>.*); "
                     r"Owner: ?(?P<owner>.*)$")
# a pg_restore --list line: "id; catalog-oid oid TYPE schema name owner"
_TOC = re.compile(r"^\s*\d+;\s+\d+\s+\d+\s+(?P<rest>.*)$")
_TOC_TYPES = ("TABLE DATA", "SEQUENCE SET", "DEFAULT ACL", "EVENT TRIGGER", "FOREIGN TABLE", "MATERIALIZED VIEW",
              "TEXT SEARCH CONFIGURATION", "TEXT SEARCH DICTIONARY")


def _chorus_own(type_: str, schema: str, name: str) -> bool:
    """The chorus extension, its comment, its schema, its schema's privileges, what is in it."""
    return Entry(type_.strip(), schema.strip(), name.strip(), "", "").chorus_own


def plain(lines: Iterable[str]) -> Iterator[str]:
    """The lines of a plain ``pg_dump`` without the entries of Chorus's own objects. Streams:
    holds back one line at most (the ``--`` that opens the next entry's header)."""
    keep = True
    held: list[str] = []
    for line in lines:
        m = _HEADER.match(line.rstrip("\n"))
        if m:
            # the "--" held back opened this entry: it goes with it
            keep = not _chorus_own(m["type"], m["schema"], m["name"])
            if keep:
                yield from held
            held = []
            if keep:
                yield line
            continue
        if line.startswith("-- PostgreSQL database dump complete"):
            keep = True  # the footer, after the last entry
        if held and keep:
            yield from held
        held = []
        if line.rstrip("\n") == "--":
            held = [line]
        elif keep:
            yield line
    if keep:
        yield from held


def _toc_entry(rest: str) -> tuple[str, str, str]:
    """(type, schema, name) of a --list line's text after the OIDs."""
    for t in _TOC_TYPES + ("EXTENSION", "SCHEMA", "COMMENT", "ACL"):
        if rest.startswith(t + " "):
            words = rest[len(t) + 1:].split(" ")
            return t, words[0], " ".join(words[1:])
    words = rest.split(" ")
    return words[0], words[1] if len(words) > 1 else "-", " ".join(words[2:])


def toc(lines: Iterable[str]) -> Iterator[str]:
    """``pg_restore --list`` output without Chorus's entries: give it to ``pg_restore -L``."""
    for line in lines:
        m = _TOC.match(line)
        if m:
            type_, schema, rest = _toc_entry(m["rest"])
            # the name is followed by the owner (absent for comments of extensions)
            if type_ == "EXTENSION" and schema == "-" and rest.split(" ")[0] == "chorus":
                continue
            if type_ in ("COMMENT", "ACL") and schema == "-" and rest.startswith(("EXTENSION chorus", "SCHEMA chorus ")):
                continue
            if rest == "SCHEMA chorus":
                continue
            if type_ == "SCHEMA" and schema == "-" and rest.split(" ")[0] == "chorus":
                continue
            if schema == "chorus":
                continue
        yield line
