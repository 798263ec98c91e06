"""How a conflict is settled (docs/LINKS.md section 7): per table a policy, a pure function of
the two versions of the row.

Every policy is *symmetric*: deciding at site A (A's version local, B's incoming) and at site B
(B's local, A's incoming) gives the same resulting row and the same winning version, whichever
side evaluates it and whenever. So both sites, each on its own apply, settle a conflict alike,
and so does every node of a site. The delta policy's sum is the same on both sides when both
changes started from the same row (the increments commute).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Optional, Protocol

from chorus import wire
from chorus.link.events import SiteId, Version, latest


class PolicyError(ValueError):
    """A policy that cannot decide this conflict (a primary that is neither side, a delta column
    without its old value, a value that is not a number)."""


class Outcome(enum.Enum):
    KEEP_LOCAL = "kept-local"  # the incoming change is not applied
    TAKE_REMOTE = "took-remote"  # the incoming change is applied over the local row
    MERGED = "merged"  # a row made of both (delta columns, a function's answer)


@dataclass(frozen=True)
class Decision:
    """A policy's answer: the outcome seen from the deciding side, the version whose metadata
    the resulting row carries (its stamp, and the realignment's), and the resulting values
    (None: the row is absent)."""

    outcome: Outcome
    winner: Version
    values: Optional[tuple[wire.Value, ...]]
    note: str = ""  # how the policy decided otherwise than its rule says (recorded with the conflict)


class Policy(Protocol):
    """A conflict policy. ``decide`` must be deterministic and symmetric (module docstring)."""

    @property
    def name(self) -> str: ...

    def decide(self, table: wire.Table, local: Version, remote: Version) -> Decision: ...


def _pick(local: Version, remote: Version, winner: Version) -> Decision:
    if winner is local:
        return Decision(Outcome.KEEP_LOCAL, local, local.values)
    return Decision(Outcome.TAKE_REMOTE, remote, remote.values)


@dataclass(frozen=True)
class PrimaryWins:
    """NDB$EPOCH's rule: the primary site's version stands. On the primary the secondary's
    conflicting change is rejected (and the row realigned from the primary); on the secondary
    the primary's change is applied over the local one."""

    primary: SiteId
    name: str = "primary-wins"

    def decide(self, table: wire.Table, local: Version, remote: Version) -> Decision:
        if local.site == remote.site:
            raise PolicyError(f"a conflict between two versions of site {local.site}")
        if self.primary not in (local.site, remote.site):
            raise PolicyError(f"primary site {self.primary} is neither {local.site} nor {remote.site}")
        return _pick(local, remote, local if local.site == self.primary else remote)


@dataclass(frozen=True)
class LatestCommitWins:
    """The version with the later origin commit time stands; equal times go to the site that
    sorts last, then to the higher clock value: a total order, the same everywhere. A version
    whose time is unknown (0) is compared by site and clock alone (events.latest)."""

    name: str = "latest-commit-wins"

    def decide(self, table: wire.Table, local: Version, remote: Version) -> Decision:
        if (local.site, local.clock) == (remote.site, remote.clock):
            raise PolicyError(f"two versions with the same origin, clock and time {local.order}")
        return _pick(local, remote, latest(local, remote))


_INT_SIZES = {"smallint": 2, "int2": 2, "integer": 4, "int4": 4, "bigint": 8, "int8": 8}
_NUMERIC_HEAD = struct.Struct(">hhHh")  # numeric's send form: ndigits, weight, sign, dscale
_NUMERIC_NEG = 0x4000


def _binary_number(column: wire.Column, raw: bytes) -> Decimal:
    """A number in its binary send form (the writeset carries integers and numeric so,
    extension/chorus_values.c)."""
    size = _INT_SIZES.get(column.typname)
    if size is not None and len(raw) == size:
        return Decimal(int.from_bytes(raw, "big", signed=True))
    if column.typname == "numeric" and len(raw) >= _NUMERIC_HEAD.size:
        ndigits, weight, sign, dscale = _NUMERIC_HEAD.unpack_from(raw)
        if sign in (0, _NUMERIC_NEG) and len(raw) == _NUMERIC_HEAD.size + 2 * ndigits:
            digits = struct.unpack_from(f">{ndigits}h", raw, _NUMERIC_HEAD.size)
            n = sum((Decimal(d) * Decimal(10000) ** (weight - i) for i, d in enumerate(digits)), Decimal(0))
            return (-n if sign == _NUMERIC_NEG else n).quantize(Decimal(1).scaleb(-dscale))
    raise PolicyError(f"delta column {column.name} of type {column.typname}: {raw!r} is not a finite number "
                      "in its binary form")


def _number(v: wire.Value, column: wire.Column) -> Decimal:
    if v is None or isinstance(v, wire.Unchanged):
        raise PolicyError(f"delta column {column.name}: {'NULL' if v is None else 'no value'} is not a number")
    if isinstance(v, wire.Binary):
        return _binary_number(column, bytes(v))
    try:
        d = Decimal(bytes(v).decode("ascii"))
    except (InvalidOperation, UnicodeDecodeError) as e:
        raise PolicyError(f"delta column {column.name}: {v!r} is not a number") from e
    if not d.is_finite():
        raise PolicyError(f"delta column {column.name}: {v!r} is not a finite number")
    return d


def _text_number(d: Decimal) -> bytes:
    return format(d, "f").encode("ascii")


def delta_values(table: wire.Table, columns: tuple[str, ...], base: tuple[wire.Value, ...],
                 local: tuple[wire.Value, ...], remote: Version) -> tuple[wire.Value, ...]:
    """``base`` with each delta column set to ``local + (remote new - remote old)`` (pgEdge
    Spock's delta apply). Used for every incoming change to those columns, in conflict or not:
    without concurrency ``local`` equals the old value and the result is the new one."""
    if remote.values is None:
        return base
    if remote.old is None:
        raise PolicyError(f"delta apply on {table.qualified} needs the incoming change's old values")
    index = {c.name: i for i, c in enumerate(table.columns)}
    out = list(base)
    for name in columns:
        if name not in index:
            raise PolicyError(f"delta column {name} is not a column of {table.qualified}")
        i = index[name]
        c = table.columns[i]
        change = _number(remote.values[i], c) - _number(remote.old[i], c)
        out[i] = _text_number(_number(local[i], c) + change)
    return tuple(out)


def has_old(table: wire.Table, columns: tuple[str, ...], remote: Version) -> bool:
    """Whether incoming change ``remote`` carries the old values of delta ``columns`` (an UPDATE
    captured with chorus.link_old_columns listing them)."""
    if remote.old is None:
        return False
    index = {c.name: i for i, c in enumerate(table.columns)}
    return all(n not in index or not isinstance(remote.old[index[n]], wire.Unchanged) for n in columns)


@dataclass(frozen=True)
class DeltaApply:
    """Counter columns keep both sites' increments; the other columns follow ``fallback``. A
    delete on either side is settled by the fallback alone (there is no row to add to)."""

    columns: tuple[str, ...]
    fallback: Policy = LatestCommitWins()
    name: str = "delta"

    def decide(self, table: wire.Table, local: Version, remote: Version) -> Decision:
        base = self.fallback.decide(table, local, remote)
        if local.values is None or remote.values is None or base.values is None:
            return base
        if not has_old(table, self.columns, remote):
            # a change captured without its counters' old values (before chorus.link_old_columns
            # listed them): no increment to add, the fallback's row stands
            return replace(base, note=f"no old values of the delta columns: {self.fallback.name}")
        values = delta_values(table, self.columns, base.values, local.values, remote)
        return Decision(Outcome.MERGED if values != base.values else base.outcome, base.winner, values)


class ConflictFunction(Protocol):
    """A SQL conflict handler, evaluated by PostgreSQL (``f(table, a_row, a_site, b_row, b_site,
    a_meta, b_meta) returns jsonb``, run as its owner in a restricted context: link/funcall.py).
    It gets the two versions in the canonical order, so both sites pass it the same arguments;
    it returns the resulting row (None: absent), the very values of a version it chose. It must
    be deterministic."""

    def __call__(self, function: str, table: wire.Table, first: Version,
                 second: Version) -> Optional[tuple[wire.Value, ...]]: ...


@dataclass(frozen=True)
class FunctionPolicy:
    """A SQL function decides. The arbiter's version is passed first (then the other), so the
    call is the same on both sites; the result row carries the metadata of the version it equals,
    else of the later one by latest-commit order (a merged row)."""

    function: str
    arbiter: SiteId
    evaluate: ConflictFunction
    name: str = "function"

    def decide(self, table: wire.Table, local: Version, remote: Version) -> Decision:
        if self.arbiter not in (local.site, remote.site):
            raise PolicyError(f"arbiter site {self.arbiter} is neither {local.site} nor {remote.site}")
        first, second = (local, remote) if local.site == self.arbiter else (remote, local)
        values = self.evaluate(self.function, table, first, second)
        if values == local.values and values == remote.values:
            return Decision(Outcome.KEEP_LOCAL, latest(local, remote), values)
        if values == local.values:
            return Decision(Outcome.KEEP_LOCAL, local, values)
        if values == remote.values:
            return Decision(Outcome.TAKE_REMOTE, remote, values)
        return Decision(Outcome.MERGED, latest(local, remote), values)
