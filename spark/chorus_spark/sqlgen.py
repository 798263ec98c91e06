"""A table as the diff sees it (columns, primary key), the quoting helpers, and the fixed output
settings of every diff session: values are compared in their text form, which PostgreSQL's
input functions read back exactly, so both sides must print alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Table":
        return Table(d["schema"], d["name"], tuple(Column(**c) for c in d["columns"]), tuple(d["key"]))

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
