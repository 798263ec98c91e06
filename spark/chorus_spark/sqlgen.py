"""SQL the diff job sends over JDBC, built from a table's plan: identifiers are always quoted,
literals (range bounds, keys to fetch) always quoted and cast to the column's type. Values are
compared in their text form (``col::text``), which PostgreSQL's input functions read back
exactly; sessions use fixed output settings (``SESSION_SETTINGS``) so both sides print alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

SESSION_SETTINGS = ("SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'; "
                    "SET extra_float_digits = 1; SET bytea_output = 'hex'")


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # format_type(): a valid cast target
    generated: bool = False


@dataclass(frozen=True)
class Table:
    schema: str
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # the primary key's columns, in index order
    bounds: tuple[str, ...] = ()  # text forms of the first key column splitting it into ranges

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Table":
        return Table(d["schema"], d["name"], tuple(Column(**c) for c in d["columns"]), tuple(d["key"]),
                     tuple(d.get("bounds", ())))

    @property
    def qualified(self) -> str:
        return f"{ident(self.schema)}.{ident(self.name)}"

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.name}"

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    @property
    def stored(self) -> list[Column]:
        """Columns that hold data (generated ones are computed from the others)."""
        return [c for c in self.columns if not c.generated]

    def key_alias(self, i: int) -> str:
        return f"_k{i}"

    @property
    def key_aliases(self) -> list[str]:
        """The key columns as the queries name them (text forms): _k0.."""
        return [self.key_alias(i) for i in range(len(self.key))]

    def value_alias(self, i: int) -> str:
        return f"_v{i}"

    # --- the queries: subqueries for JDBC reads, which append "WHERE <predicate>" on the typed
    # --- key columns _t0.. (PostgreSQL pushes it down to an index scan) -------------------------

    def _keys(self) -> str:
        return ", ".join(f"t.{ident(k)} AS _t{i}, t.{ident(k)}::text AS {self.key_alias(i)}"
                         for i, k in enumerate(self.key))

    def _bound(self, i: int) -> str:
        return f"{literal(self.bounds[i])}::{self.column(self.key[0]).type}"

    def range_of(self, lo: Optional[int], hi: Optional[int], col: str = "_t0") -> str:
        """Predicate: the first key column lies in ranges lo..hi-1 (ids as width_bucket gives
        them: range r holds bounds[r-1] <= k < bounds[r]; None: open end)."""
        parts = []
        if lo is not None and lo > 0:
            parts.append(f"{col} >= {self._bound(lo - 1)}")
        if hi is not None and hi <= len(self.bounds):
            parts.append(f"{col} < {self._bound(hi - 1)}")
        return " AND ".join(parts) or "true"

    def row_text(self) -> str:
        return "ROW(" + ", ".join(f"t.{ident(c.name)}" for c in self.stored) + ")::text"

    def summary_query(self, lo: Optional[int], hi: Optional[int], check_snapshot: bool) -> str:
        """Level 1: (rng, n, h) for ranges lo..hi-1, and the session's snapshot when
        ``check_snapshot`` (the job checks that each read ran in the snapshot it was given)."""
        if self.bounds:
            arr = "ARRAY[" + ", ".join(self._bound(i) for i in range(len(self.bounds))) + "]"
            rng = f"width_bucket(t.{ident(self.key[0])}, {arr})"
        else:
            rng = "0"
        snap = "pg_current_snapshot()::text" if check_snapshot else "NULL::text"
        where = self.range_of(lo, hi, f"t.{ident(self.key[0])}")
        return (f"(SELECT {rng} AS rng, count(*) AS n, sum(hashtextextended({self.row_text()}, 0))::text AS h, "
                f"{snap} AS snap FROM {self.qualified} t WHERE {where} GROUP BY 1) AS s")

    def hash_query(self) -> str:
        """Level 2: the key (typed and as text) and a hash of the row, per row."""
        return (f"(SELECT {self._keys()}, hashtextextended({self.row_text()}, 0)::text AS _h "
                f"FROM {self.qualified} t) AS s")

    def rows_query(self) -> str:
        """Level 3: the key, and every stored column as text (_v0..)."""
        vals = ", ".join(f"t.{ident(c.name)}::text AS {self.value_alias(i)}" for i, c in enumerate(self.stored))
        return f"(SELECT {self._keys()}, {vals} FROM {self.qualified} t) AS s"

    def keys_in(self, keys: Sequence[Sequence[str]]) -> str:
        """Predicate: the row's key is one of ``keys`` (text forms, cast to the key's types)."""
        types = [self.column(k).type for k in self.key]
        if len(self.key) == 1:
            return "_t0 IN (" + ", ".join(f"{literal(k[0])}::{types[0]}" for k in keys) + ")"
        cols = ", ".join(f"_t{i}" for i in range(len(self.key)))
        tuples = ", ".join("(" + ", ".join(f"{literal(v)}::{t}" for v, t in zip(key, types)) + ")"
                           for key in keys)
        return f"({cols}) IN ({tuples})"


def intervals(ids: Sequence[int], max_ranges: int) -> list[tuple[int, int]]:
    """Sorted range ids -> [lo, hi) runs of consecutive ids, each at most ``max_ranges`` long."""
    out: list[tuple[int, int]] = []
    for r in sorted(set(ids)):
        if out and out[-1][1] == r and r - out[-1][0] < max_ranges:
            out[-1] = (out[-1][0], r + 1)
        else:
            out.append((r, r + 1))
    return out


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]
