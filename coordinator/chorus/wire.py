"""The writeset wire format, version 1 (docs/PROTOCOL.md section 2).

The extension writes it (``extension/chorus_writeset.c``); this module reads it without SQL and,
for tests and tools, writes it too. Readers reject anything they do not understand with
:class:`WireError`: a wrong magic, an unknown version or flag bit, a truncated field, trailing
bytes, an index out of range.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Optional

MAGIC = b"CW"
VERSION = 1
MAX_PARTS = 4096


class WireError(ValueError):
    """Malformed or unsupported writeset bytes."""


class KeyMode(IntEnum):
    """Certification key modes, weakest first (DESIGN.md invariant 2)."""

    REFERENCE = 1
    UPDATE = 2
    EXCLUSIVE = 3


def modes_conflict(a: KeyMode, b: KeyMode) -> bool:
    """Exclusive conflicts with every mode; update with update; reference only with exclusive."""
    if a == KeyMode.EXCLUSIVE or b == KeyMode.EXCLUSIVE:
        return True
    return a == KeyMode.UPDATE and b == KeyMode.UPDATE


COL_IDENTITY = 0x01
COL_GENERATED = 0x02

OPS = (b"I", b"U", b"D", b"T")

Value = Optional[str]


@dataclass(frozen=True)
class Column:
    name: str
    typname: str
    flags: int = 0

    @property
    def generated(self) -> bool:
        return bool(self.flags & COL_GENERATED)


@dataclass(frozen=True)
class Table:
    nspname: str
    relname: str
    columns: tuple[Column, ...]
    identity: tuple[int, ...]  # indexes into columns

    @property
    def qualified(self) -> str:
        return f"{quote_ident(self.nspname)}.{quote_ident(self.relname)}"


@dataclass(frozen=True)
class Row:
    op: str  # "I", "U", "D", "T"
    table: int
    old: tuple[Value, ...] = ()
    new: tuple[Value, ...] = ()


@dataclass(frozen=True)
class Key:
    mode: KeyMode
    parts: tuple[bytes, ...]

    def describe(self) -> str:
        """A person's reading of the key: ``"public"."t" (id)=(5)`` or ``"public"."t" (table)``."""
        p = [x.decode("utf-8", "replace") for x in self.parts]
        if len(p) < 2:
            return repr(self.parts)
        table = f"{quote_ident(p[0])}.{quote_ident(p[1])}"
        if len(p) == 2:
            return f"{table} (table)"
        return f"{table} ({p[2]})=({', '.join(p[3:])})"


@dataclass(frozen=True)
class Writeset:
    xid: int
    pid: int
    last_seen: int
    tables: tuple[Table, ...]
    rows: tuple[Row, ...]
    keys: tuple[Key, ...]
    flags: int = 0
    extra: dict[str, str] = field(default_factory=dict, compare=False)


def quote_ident(name: str) -> str:
    """Quote an SQL identifier the way PostgreSQL's quote_ident does, always."""
    return '"' + name.replace('"', '""') + '"'


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = memoryview(buf)
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise WireError(f"writeset truncated reading {what} at byte {self.pos}")
        out = self.buf[self.pos:end].tobytes()
        self.pos = end
        return out

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return int(struct.unpack(">H", self.take(2, what))[0])

    def u32(self, what: str) -> int:
        return int(struct.unpack(">I", self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack(">Q", self.take(8, what))[0])

    def text(self, what: str) -> str:
        raw = self.take(self.u16(what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise WireError(f"{what} is not valid UTF-8") from e

    def blob(self, what: str) -> bytes:
        return self.take(self.u32(what), what)

    def tuple_(self, expected: int, what: str) -> tuple[Value, ...]:
        n = self.u16(what)
        if n != expected:
            raise WireError(f"{what} has {n} values, expected {expected}")
        out: list[Value] = []
        for _ in range(n):
            kind = self.u8(what)
            if kind == ord("n"):
                out.append(None)
            elif kind == ord("t"):
                raw = self.blob(what)
                try:
                    out.append(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise WireError(f"{what} value is not valid UTF-8") from e
            else:
                raise WireError(f"{what} has unknown value kind {kind:#x}")
        return tuple(out)


def decode(buf: bytes) -> Writeset:
    """Parse writeset bytes; raise :class:`WireError` on anything malformed."""
    r = _Reader(buf)
    if r.take(2, "magic") != MAGIC:
        raise WireError("not a writeset (bad magic)")
    version = r.u8("version")
    if version != VERSION:
        raise WireError(f"unsupported writeset version {version} (this coordinator reads {VERSION})")
    flags = r.u8("flags")
    if flags:
        raise WireError(f"unknown writeset flags {flags:#x}")
    xid = r.u32("xid")
    pid = r.u32("pid")
    last_seen = r.u64("last_seen")
    ntables = r.u16("ntables")
    nrows = r.u32("nrows")
    nkeys = r.u32("nkeys")
    remaining = len(buf) - r.pos
    if nrows > remaining or nkeys > remaining or ntables > remaining:
        raise WireError("writeset counts exceed its length")
    tables: list[Table] = []
    for _ in range(ntables):
        nsp = r.text("nspname")
        rel = r.text("relname")
        ncols = r.u16("ncols")
        cols = tuple(Column(r.text("attname"), r.text("typname"), r.u8("column flags")) for _ in range(ncols))
        nident = r.u16("nidentity")
        ident = tuple(r.u16("identity column") for _ in range(nident))
        if any(i >= ncols for i in ident):
            raise WireError(f"identity column index out of range in table {nsp}.{rel}")
        tables.append(Table(nsp, rel, cols, ident))
    rows: list[Row] = []
    for _ in range(nrows):
        op = chr(r.u8("op"))
        if op.encode() not in OPS:
            raise WireError(f"unknown row op {op!r}")
        ti = r.u16("table index")
        if ti >= len(tables):
            raise WireError(f"row refers to table {ti} of {len(tables)}")
        t = tables[ti]
        old: tuple[Value, ...] = ()
        new: tuple[Value, ...] = ()
        if op in ("U", "D"):
            if not t.identity:
                raise WireError(f"{op} row on table {t.nspname}.{t.relname} without identity")
            old = r.tuple_(len(t.identity), "old tuple")
        if op in ("I", "U"):
            new = r.tuple_(len(t.columns), "new tuple")
        rows.append(Row(op, ti, old, new))
    keys: list[Key] = []
    for _ in range(nkeys):
        mode = r.u8("key mode")
        if mode not in (1, 2, 3):
            raise WireError(f"unknown key mode {mode}")
        nparts = r.u16("key parts")
        if nparts == 0 or nparts > MAX_PARTS:
            raise WireError(f"key with {nparts} parts")
        keys.append(Key(KeyMode(mode), tuple(r.blob("key part") for _ in range(nparts))))
    if r.pos != len(buf):
        raise WireError(f"{len(buf) - r.pos} trailing bytes after writeset")
    return Writeset(xid, pid, last_seen, tuple(tables), tuple(rows), tuple(keys), flags)


def _text(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack(">H", len(b)) + b


def _tuple(values: tuple[Value, ...]) -> bytes:
    out = [struct.pack(">H", len(values))]
    for v in values:
        if v is None:
            out.append(b"n")
        else:
            b = v.encode("utf-8")
            out.append(b"t" + struct.pack(">I", len(b)) + b)
    return b"".join(out)


def encode(ws: Writeset) -> bytes:
    """Write a writeset (the inverse of :func:`decode`); the extension does the same in C."""
    out = [MAGIC, struct.pack(">BBIIQHII", VERSION, ws.flags, ws.xid, ws.pid, ws.last_seen,
                              len(ws.tables), len(ws.rows), len(ws.keys))]
    for t in ws.tables:
        out += [_text(t.nspname), _text(t.relname), struct.pack(">H", len(t.columns))]
        for c in t.columns:
            out += [_text(c.name), _text(c.typname), bytes([c.flags])]
        out.append(struct.pack(">H", len(t.identity)))
        out += [struct.pack(">H", i) for i in t.identity]
    for row in ws.rows:
        out.append(row.op.encode() + struct.pack(">H", row.table))
        if row.op in ("U", "D"):
            out.append(_tuple(row.old))
        if row.op in ("I", "U"):
            out.append(_tuple(row.new))
    for k in ws.keys:
        out.append(struct.pack(">BH", int(k.mode), len(k.parts)))
        out += [struct.pack(">I", len(p)) + p for p in k.parts]
    return b"".join(out)
