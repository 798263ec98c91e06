"""The writeset wire format, version 1 (docs/PROTOCOL.md section 2).

The extension writes it (``extension/chorus_writeset.c``); this module reads it without SQL and,
for tests and tools, writes it too. Readers reject anything they do not understand with
:class:`WireError`: a wrong magic, an unknown version or flag bit, a truncated field, trailing
bytes, an index out of range.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Iterable, NamedTuple, Optional

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

FLAG_DDL = 0x01  # the writeset is a schema change run in total order (DDL section follows the keys)

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


class Row(NamedTuple):
    """One changed row (a tuple: decoding makes many, and a tuple is the cheapest object)."""

    op: str  # "I", "U", "D", "T"
    table: int
    old: tuple[Value, ...] = ()
    new: tuple[Value, ...] = ()


def key_hash(parts: Iterable[bytes]) -> bytes:
    """16-byte hash of a key's parts (each as u32 length and bytes, as the wire format writes
    them); a collision can only add a false conflict."""
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(_U32.pack(len(p)))
        h.update(p)
    return h.digest()


class Key:
    """A certification key: its mode and parts (schema, table, then columns and values). Equal
    keys have equal mode and parts; ``digest`` is key_hash(parts) when decode computed it from
    the encoded parts (empty otherwise). Not a frozen dataclass: decode makes one per key, and a
    plain class with slots is built several times faster; treat it as immutable."""

    __slots__ = ("mode", "parts", "digest")

    def __init__(self, mode: KeyMode, parts: tuple[bytes, ...], digest: bytes = b"") -> None:
        self.mode = mode
        self.parts = parts
        self.digest = digest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and self.mode == other.mode and self.parts == other.parts

    def __hash__(self) -> int:
        return hash((self.mode, self.parts))

    def __repr__(self) -> str:
        return f"Key(mode={self.mode!r}, parts={self.parts!r})"

    def hashed(self) -> bytes:
        return self.digest or key_hash(self.parts)

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
class Ddl:
    """A replicated schema change: the statement and the session state it needs."""

    statement: str
    search_path: str
    role: str


@dataclass(frozen=True)
class Writeset:
    xid: int
    pid: int
    last_seen: int
    tables: tuple[Table, ...]
    rows: tuple[Row, ...]
    keys: tuple[Key, ...]
    flags: int = 0
    ddl: Optional[Ddl] = None
    raw: bytes = field(default=b"", compare=False, repr=False)  # the encoded form, when decoded


def quote_ident(name: str) -> str:
    """Quote an SQL identifier the way PostgreSQL's quote_ident does, always."""
    return '"' + name.replace('"', '""') + '"'


# Table descriptions parsed before, by their encoded schema and name: (encoded description, table).
# Equal descriptions share one Table object, and a known one is not parsed again.
_TABLES: dict[bytes, list[tuple[bytes, Table]]] = {}

_HEAD = struct.Struct(">2sBBIIQHII")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_KEYHEAD = struct.Struct(">BH")


def decode(buf: bytes) -> Writeset:
    """Parse writeset bytes; raise :class:`WireError` on anything malformed."""
    try:
        return _decode(bytes(buf))
    except (struct.error, IndexError) as e:
        raise WireError(f"writeset truncated: {e}") from e
    except UnicodeDecodeError as e:
        raise WireError(f"writeset text is not valid UTF-8: {e.reason}") from e


def _decode(buf: bytes) -> Writeset:
    n = len(buf)
    if n < _HEAD.size or buf[:2] != MAGIC:
        raise WireError("not a writeset (bad magic)" if buf[:2] != MAGIC else "writeset truncated in header")
    magic, version, flags, xid, pid, last_seen, ntables, nrows, nkeys = _HEAD.unpack_from(buf, 0)
    if version != VERSION:
        raise WireError(f"unsupported writeset version {version} (this coordinator reads {VERSION})")
    if flags & ~FLAG_DDL:
        raise WireError(f"unknown writeset flags {flags:#x}")
    pos = _HEAD.size
    if nrows > n or nkeys > n or ntables > n:
        raise WireError("writeset counts exceed its length")
    u16 = _U16.unpack_from
    u32 = _U32.unpack_from
    view = memoryview(buf)

    def text(pos: int) -> tuple[str, int]:
        (ln,) = u16(buf, pos)
        end = pos + 2 + ln
        if end > n:
            raise WireError(f"writeset truncated reading a name at byte {pos}")
        return buf[pos + 2:end].decode("utf-8"), end

    tables: list[Table] = []
    for _ in range(ntables):
        # A table description seen before (the same bytes) parses to the same table: found by
        # its schema and name, then compared whole, it is not parsed again.
        start = pos
        (ln1,) = u16(buf, pos)
        (ln2,) = u16(buf, pos + 2 + ln1)
        names = buf[pos:pos + 4 + ln1 + ln2]
        seen = _TABLES.get(names)
        if seen is not None:
            for raw, known in seen:
                if buf.startswith(raw, pos):
                    pos += len(raw)
                    tables.append(known)
                    break
            else:
                seen = None
        if seen is not None:
            continue
        nsp, pos = text(pos)
        rel, pos = text(pos)
        (ncols,) = u16(buf, pos)
        pos += 2
        cols = []
        for _c in range(ncols):
            name, pos = text(pos)
            typ, pos = text(pos)
            cols.append(Column(name, typ, buf[pos]))
            pos += 1
        (nident,) = u16(buf, pos)
        ident = tuple(u16(buf, pos + 2 + 2 * i)[0] for i in range(nident))
        pos += 2 + 2 * nident
        if any(i >= ncols for i in ident):
            raise WireError(f"identity column index out of range in table {nsp}.{rel}")
        t = Table(nsp, rel, tuple(cols), ident)
        if len(_TABLES) >= 4096:
            _TABLES.clear()
        versions = _TABLES.setdefault(names, [])
        if len(versions) >= 8:
            versions.clear()
        versions.append((buf[start:pos], t))
        tables.append(t)

    def values(pos: int, expected: int, what: str) -> tuple[tuple[Value, ...], int]:
        (cnt,) = u16(buf, pos)
        if cnt != expected:
            raise WireError(f"{what} has {cnt} values, expected {expected}")
        pos += 2
        out: list[Value] = []
        for _v in range(cnt):
            kind = buf[pos]
            if kind == 0x6E:  # 'n'
                out.append(None)
                pos += 1
            elif kind == 0x74:  # 't'
                (ln,) = u32(buf, pos + 1)
                end = pos + 5 + ln
                if end > n:
                    raise WireError(f"writeset truncated reading {what}")
                out.append(buf[pos + 5:end].decode("utf-8"))
                pos = end
            else:
                raise WireError(f"{what} has unknown value kind {kind:#x}")
        return tuple(out), pos

    rows: list[Row] = []
    for _ in range(nrows):
        op = chr(buf[pos])
        if op not in "IUDT":
            raise WireError(f"unknown row op {op!r}")
        (ti,) = u16(buf, pos + 1)
        pos += 3
        if ti >= len(tables):
            raise WireError(f"row refers to table {ti} of {len(tables)}")
        t = tables[ti]
        old: tuple[Value, ...] = ()
        new: tuple[Value, ...] = ()
        if op == "U" or op == "D":
            if not t.identity:
                raise WireError(f"{op} row on table {t.nspname}.{t.relname} without identity")
            old, pos = values(pos, len(t.identity), "old tuple")
        if op == "I" or op == "U":
            new, pos = values(pos, len(t.columns), "new tuple")
        rows.append(Row(op, ti, old, new))

    keys: list[Key] = []
    for _ in range(nkeys):
        mode, nparts = _KEYHEAD.unpack_from(buf, pos)
        pos += 3
        if mode not in (1, 2, 3):
            raise WireError(f"unknown key mode {mode}")
        if nparts == 0 or nparts > MAX_PARTS:
            raise WireError(f"key with {nparts} parts")
        parts = []
        start = pos
        for _p in range(nparts):
            (ln,) = u32(buf, pos)
            end = pos + 4 + ln
            if end > n:
                raise WireError("writeset truncated reading a key part")
            parts.append(buf[pos + 4:end])
            pos = end
        # the encoded parts are exactly what key_hash hashes
        keys.append(Key(_MODES[mode], tuple(parts), _blake2b(view[start:pos], digest_size=16).digest()))
    ddl = None
    if flags & FLAG_DDL:
        if nrows or ntables:
            raise WireError("a schema-change writeset carries no rows")
        (ln,) = u32(buf, pos)
        end = pos + 4 + ln
        if end > n:
            raise WireError("writeset truncated reading the DDL statement")
        statement = buf[pos + 4:end].decode("utf-8")
        search_path, pos = text(end)
        role, pos = text(pos)
        ddl = Ddl(statement, search_path, role)
    if pos != n:
        raise WireError(f"{n - pos} trailing bytes after writeset")
    return Writeset(xid, pid, last_seen, tuple(tables), tuple(rows), tuple(keys), flags, ddl, buf)


_blake2b = hashlib.blake2b
_MODES = {1: KeyMode.REFERENCE, 2: KeyMode.UPDATE, 3: KeyMode.EXCLUSIVE}


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
    flags = ws.flags | (FLAG_DDL if ws.ddl is not None else 0)
    out = [MAGIC, struct.pack(">BBIIQHII", VERSION, flags, ws.xid, ws.pid, ws.last_seen,
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
    if ws.ddl is not None:
        stmt = ws.ddl.statement.encode("utf-8")
        out += [struct.pack(">I", len(stmt)), stmt, _text(ws.ddl.search_path), _text(ws.ddl.role)]
    return b"".join(out)


def merge(writesets: list[Writeset]) -> Writeset:
    """Row writesets applied one after another, as one writeset: the rows in order, the tables
    shared, the keys of all (catch-up applies a run of consecutive GIDs in one transaction)."""
    if any(ws.ddl is not None for ws in writesets):
        raise ValueError("schema changes are not merged")
    if len(writesets) == 1:
        return writesets[0]
    tables: list[Table] = []
    index: dict[Table, int] = {}
    rows: list[Row] = []
    keys: dict[Key, None] = {}
    for ws in writesets:
        remap = []
        for t in ws.tables:
            if t not in index:
                index[t] = len(tables)
                tables.append(t)
            remap.append(index[t])
        rows += [Row(r.op, remap[r.table], r.old, r.new) for r in ws.rows]
        keys.update(dict.fromkeys(ws.keys))
    last = writesets[-1]
    return Writeset(last.xid, last.pid, last.last_seen, tuple(tables), tuple(rows), tuple(keys))
