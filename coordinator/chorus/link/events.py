"""What a link's stream carries (docs/LINKS.md sections 2 and 4), and what is known about a row.

A site's stream is its writeset log in its own order, reduced to two kinds of items: the site's
own transactions (:class:`RemoteTransaction`, as the receiving side sees them) and clock events
(:class:`ClockEvent`). Rows stay in the writeset format (``chorus.wire``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from chorus import wire

SiteId = str  # a site's cluster UUID (any string in tests); sites compare by it where a tie must be broken


@dataclass(frozen=True)
class ClockEvent:
    """``site``'s clock reached ``value``: every change of ``site`` stamped below ``value``
    precedes this point of the stream ([epoch] "ClockVal_A = 40"). In a site's own stream it is
    the site's tick; in the other site's stream it is that tick passed through (a reflection)."""

    site: SiteId
    value: int


@dataclass(frozen=True)
class RemoteTransaction:
    """One transaction of the sending site, as the stream carries it: its origin site, the
    origin's clock value for its changes (its GID with the GID clock), its origin commit time
    (microseconds since the Unix epoch, the origin's wall clock) and its writeset, decoded."""

    site: SiteId
    clock: int
    commit_time: int
    writeset: wire.Writeset
    realign: bool = False  # an arbiter's realignment (docs/LINKS.md section 7)
    # the site where the transaction was made, where ``site`` (the neighbour whose stream carries
    # it) forwarded it from a third site (a chain, docs/LINKS.md section 10); None: ``site`` itself
    origin: Optional[SiteId] = None

    @property
    def made_at(self) -> SiteId:
        """The site whose change this is: its origin, whoever forwarded it."""
        return self.origin or self.site


StreamItem = Union[ClockEvent, RemoteTransaction]


@dataclass(frozen=True)
class Stamp:
    """What the receiving site knows of a row's last change (one row of ``chorus.link_stamp``):
    the site whose change it was, that site's clock value for it and its commit time."""

    site: SiteId
    clock: int
    commit_time: int


@dataclass(frozen=True)
class Version:
    """One side's version of a row in a conflict: whose change made it (site, clock, commit
    time), the row's values in the table's column order (None: the row is absent, deleted or
    never inserted) and, for an incoming change, the old values it replaced where they were
    captured (the delta policy needs them; None otherwise)."""

    site: SiteId
    clock: int
    commit_time: int
    values: Optional[tuple[wire.Value, ...]]
    old: Optional[tuple[wire.Value, ...]] = None

    @property
    def order(self) -> tuple[int, SiteId, int]:
        """The total order latest-commit-wins uses: commit time, then site, then clock."""
        return (self.commit_time, self.site, self.clock)


def latest(a: Version, b: Version) -> Version:
    """The later of two versions by latest-commit-wins: by commit time, then site, then clock,
    where both times are known; where either is 0 (unknown: a change made or logged by a release
    before commit times, or the realignment's), by site then clock alone. Both sites compare the
    same two versions, so they pick alike whichever rule applies; comparing a known time with an
    unknown one as a number would make every unknown time lose on one side only."""
    if a.commit_time and b.commit_time:
        return a if a.order >= b.order else b
    return a if (a.site, a.clock) >= (b.site, b.clock) else b


# a key column's type as the writeset names it (format_type's name, or the catalog's)
_INTS = {"int2": 2, "smallint": 2, "int4": 4, "integer": 4, "int8": 8, "bigint": 8, "oid": 4}


def key_text(column: wire.Column, value: bytes) -> bytes:
    """A key value as the certification key holds it: its text. A writeset carries the values
    of some built-in types in their binary send form (extension/chorus_values.c); their keys are
    text (extension/chorus_keys.c). The types a key is usually made of are turned back into text
    here; another binary one raises ValueError (its rows cannot be matched with their stamps)."""
    if not isinstance(value, wire.Binary):
        return bytes(value)
    raw = bytes(value)
    size = _INTS.get(column.typname)
    if size is not None and len(raw) == size:
        return b"%d" % int.from_bytes(raw, "big", signed=column.typname != "oid")
    if column.typname in ("bool", "boolean") and len(raw) == 1:
        return b"t" if raw[0] else b"f"
    if column.typname == "uuid" and len(raw) == 16:
        h = raw.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}".encode("ascii")
    raise ValueError(f"key column {column.name} of type {column.typname} comes in binary form: its rows cannot be "
                     "matched with their stamps (link conflict detection takes keys of smallint, integer, bigint, oid, "
                     "boolean, uuid and types sent as text)")


def row_key(table: wire.Table, row: wire.Row, new: bool = False) -> wire.Key:
    """The key of the row ``row`` changes, as the certification key of its identity:
    (schema, table, identity column names joined by commas, values). ``new``: the key after an
    UPDATE (its new image's identity), else the key it had (an UPDATE's or DELETE's old image,
    an INSERT's new image). A table without a primary key is keyed by its whole row image."""
    names = [table.columns[i].name for i in table.identity]
    if row.op == wire.OP_INSERT or new:
        if not row.new:
            raise ValueError(f"a {row.op} row has no new image")
        values = [row.new[i] for i in table.identity]
    elif len(row.old) == len(table.identity):
        values = list(row.old)
    elif len(row.old) == len(table.columns):  # a whole old image (captured for delta columns)
        values = [row.old[i] for i in table.identity]
    else:
        raise ValueError(f"an old image of {len(row.old)} values for {table.qualified}")
    cols = [table.columns[i] for i in table.identity]
    parts = [wire.name_bytes(table.nspname), wire.name_bytes(table.relname), wire.name_bytes(",".join(names))]
    parts += [b"\x00null" if v is None else key_text(c, v) for c, v in zip(cols, values)]
    mode = wire.KeyMode.UPDATE if row.op == wire.OP_UPDATE else wire.KeyMode.EXCLUSIVE
    return wire.Key(mode, tuple(parts))
