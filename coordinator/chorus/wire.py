"""The writeset wire format, version 2 (docs/PROTOCOL.md section 2).

The extension writes it (``extension/chorus_wswrite.c``) and reads it in C
(``extension/chorus_wsread.c``), its constants in ``extension/chorus_wire.h``; this module reads it without SQL and, for tests and tools, writes it too. Readers reject anything
they do not understand with :class:`WireError`: a wrong magic, an unknown version, flag bit, value
kind or op, a truncated field, trailing bytes, an index out of range.

Values stay bytes: text in the database's encoding (the header says which), binary values in their
type's send form. Names (schemas, tables, columns) are read as UTF-8 where they are, and their other
bytes kept as surrogates (``surrogateescape``), so they go back out unchanged whatever the encoding.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any, Iterable, NamedTuple, Optional, Protocol, Union

from chorus import impl
from chorus.spool import SpooledBuffer

MAGIC = b"CW"
VERSION = 2
MAX_PARTS = 4096


class WireError(ValueError):
    """Malformed or unsupported writeset bytes."""


class KeyMode(IntEnum):
    """Certification key modes, weakest first (docs/ARCHITECTURE.md invariant 2)."""

    REFERENCE = 1
    UPDATE = 2
    EXCLUSIVE = 3


def modes_conflict(a: KeyMode, b: KeyMode) -> bool:
    """Exclusive conflicts with every mode; update with update; reference only with exclusive."""
    if a == KeyMode.EXCLUSIVE or b == KeyMode.EXCLUSIVE:
        return True
    return a == KeyMode.UPDATE and b == KeyMode.UPDATE


# Header flags.
FLAG_DDL = 0x01  # holds schema change items: applied alone, after everything before it
FLAG_TOI = 0x02  # a schema change's place in the total order; its content comes with its outcome
FLAG_CONCURRENT = 0x04  # CREATE/DROP INDEX, REINDEX CONCURRENTLY: each node runs it in a session of its own
FLAGS_KNOWN = FLAG_DDL | FLAG_TOI | FLAG_CONCURRENT

# Column flags.
COL_IDENTITY = 0x01
COL_GENERATED = 0x02
COL_FLAGS_KNOWN = COL_IDENTITY | COL_GENERATED

# Table flags.
TABLE_FULL_IDENTITY = 0x01  # no primary key: rows are found by their whole old image
# an UPDATE's and a DELETE's old image has a value per column: the identity's and the captured
# columns' (chorus.link_old_columns, the delta policy's counters), every other one 'u' (not sent)
TABLE_OLD_COLUMNS = 0x02
TABLE_FLAGS_KNOWN = TABLE_FULL_IDENTITY | TABLE_OLD_COLUMNS

# Row items.
OP_INSERT, OP_UPDATE, OP_DELETE, OP_TRUNCATE, OP_SCHEMA = "I", "U", "D", "T", "S"
OPS = (b"I", b"U", b"D", b"T", b"S")
TRUNCATE_RESTART = 0x01  # TRUNCATE ... RESTART IDENTITY
TRUNCATE_FLAGS_KNOWN = TRUNCATE_RESTART

# Value kinds.
VAL_NULL, VAL_TEXT, VAL_BINARY = 0x6E, 0x74, 0x62  # 'n', 't', 'b'
VAL_UNCHANGED = 0x75  # 'u': an UPDATE's new value that is the old one (an unchanged TOAST value), not sent

HEAD_SIZE = 32

# What the rules below refer to, by name: the extension's header states each as CHORUS_WS_*,
# CHORUS_*_FLAGS_KNOWN, CHORUS_OP_*, CHORUS_VAL_*, CHORUS_KEY_* (extension/chorus_wire.h), the
# compiled reader in its ``cdef enum`` (chorus/_cwire.pyx); tests/unit/test_wire_rules.py reads
# both sources and compares them with this table.
LIMITS: dict[str, Any] = {
    "MAGIC": MAGIC,  # the first two bytes
    "VERSION": VERSION,  # the one version read
    "HEAD_SIZE": HEAD_SIZE,  # the header's size
    "FLAGS_KNOWN": FLAGS_KNOWN,  # the header's flags
    "COL_FLAGS_KNOWN": COL_FLAGS_KNOWN,  # a column's flags
    "TABLE_FLAGS_KNOWN": TABLE_FLAGS_KNOWN,  # a table's flags
    "TRUNCATE_FLAGS_KNOWN": TRUNCATE_FLAGS_KNOWN,  # a TRUNCATE's flags
    "OPS": OPS,  # an item's op: INSERT, UPDATE, DELETE, TRUNCATE, SCHEMA
    "VALUE_KINDS": (VAL_NULL, VAL_TEXT, VAL_BINARY, VAL_UNCHANGED),
    "KEY_MODES": tuple(int(m) for m in KeyMode),  # REFERENCE, UPDATE, EXCLUSIVE
    "MAX_PARTS": MAX_PARTS,  # a key has 1 to MAX_PARTS parts
}


@dataclass(frozen=True)
class Rule:
    """One rule of the writeset's validity, which every reader enforces: this module's
    :func:`read_python`, the compiled ``chorus/_cwire.pyx`` and the extension's
    ``extension/chorus_wsread.c``. A writeset that breaks it is refused: by the Python readers with
    a :class:`WireError` whose message matches ``says``, by the C reader with the failure
    ``CHORUS_WSR_<name>`` (extension/chorus_wsread.h), which ``chorus_wsr_error_text`` words as
    ``c_says``. tests/unit/test_wire_rules.py breaks each rule and asks the three readers."""
    name: str
    rule: str  # in words, naming LIMITS
    says: str  # a regular expression
    c_says: str


# The rules, in the order the readers check them (docs/PROTOCOL.md section 2).
RULES: tuple[Rule, ...] = (
    Rule("TRUNCATED", "every field lies within the writeset", r"^writeset truncated", "writeset truncated"),
    Rule("BAD_MAGIC", "it begins with MAGIC", r"^not a writeset \(bad magic\)$", "not a writeset (bad magic)"),
    Rule("BAD_VERSION", "its header's version is VERSION", r"^unsupported writeset version \d+ ",
         "unsupported writeset version"),
    Rule("UNKNOWN_FLAGS", "its header's flags are among FLAGS_KNOWN", r"^unknown writeset flags 0x",
         "unknown writeset flags"),
    Rule("COUNTS", "no count in its header exceeds its length", r"^writeset counts exceed its length$",
         "writeset counts exceed its length"),
    Rule("COLUMN_FLAGS", "a column's flags are among COL_FLAGS_KNOWN", r"^column .* has unknown flags 0x",
         "column with unknown flags"),
    Rule("IDENTITY_RANGE", "a table's identity columns are among its columns",
         r"^identity column index out of range in table ", "identity column out of range"),
    Rule("TABLE_FLAGS", "a table's flags are among TABLE_FLAGS_KNOWN", r"^table .* has unknown flags 0x",
         "table with unknown flags"),
    Rule("UNKNOWN_OP", "an item's op is one of OPS", r"^unknown row op ", "unknown row op"),
    Rule("TABLE_RANGE", "a row's table is one of the writeset's tables", r"^row refers to table \d+ of \d+$",
         "row refers to a table out of range"),
    Rule("TRUNCATE_FLAGS", "a TRUNCATE's flags are among TRUNCATE_FLAGS_KNOWN", r"^TRUNCATE with unknown flags 0x",
         "TRUNCATE with unknown flags"),
    Rule("WIDTH", "a row's new image has a value per column, its old image one per identity column (per column "
         "with TABLE_OLD_COLUMNS)",
         r"^(new|old) tuple has \d+ values, expected \d+$", "row image of the wrong width"),
    Rule("VALUE_KIND", "a value's kind is one of VALUE_KINDS", r"^(new|old) tuple has unknown value kind 0x",
         "value of unknown kind"),
    Rule("KEY_MODE", "a key's mode is one of KEY_MODES", r"^unknown key mode \d+$", "unknown key mode"),
    Rule("KEY_PARTS", "a key has 1 to MAX_PARTS parts", r"^key with \d+ parts$",
         "key with a wrong number of parts"),
    Rule("TOI_SHAPE", "an ordering request (FLAG_TOI) is one schema change item and nothing else",
         r"^a schema change's ordering request holds exactly one schema change item$",
         "a schema change's ordering request holds exactly one schema change item"),
    Rule("CONCURRENT_SHAPE", "a concurrent index change (FLAG_CONCURRENT) is one schema change item, flagged DDL, "
         "not TOI", r"^a concurrent index change holds exactly one schema change item$",
         "a concurrent index change holds exactly one schema change item"),
    Rule("DDL_FLAG", "FLAG_DDL is set exactly when it holds schema change items",
         r"^the DDL flag does not match the schema change items$",
         "the DDL flag does not match the schema change items"),
    Rule("TRAILING", "no byte follows its keys", r"^\d+ trailing bytes after writeset$",
         "trailing bytes after writeset"),
)

# PostgreSQL's encoding numbers (pg_wchar.h) of the encodings a database can have, for messages.
ENCODINGS = {0: "SQL_ASCII", 1: "EUC_JP", 2: "EUC_CN", 3: "EUC_KR", 4: "EUC_TW", 5: "EUC_JIS_2004",
             6: "UTF8", 7: "MULE_INTERNAL", 8: "LATIN1", 9: "LATIN2", 10: "LATIN3", 11: "LATIN4",
             12: "LATIN5", 13: "LATIN6", 14: "LATIN7", 15: "LATIN8", 16: "LATIN9", 17: "LATIN10",
             18: "WIN1256", 19: "WIN1258", 20: "WIN866", 21: "WIN874", 22: "KOI8R", 23: "WIN1251",
             24: "WIN1252", 25: "ISO_8859_5", 26: "ISO_8859_6", 27: "ISO_8859_7", 28: "ISO_8859_8",
             29: "WIN1250", 30: "WIN1253", 31: "WIN1254", 32: "WIN1255", 33: "WIN1257", 34: "KOI8U"}
UTF8 = 6


class Binary(bytes):
    """A value in its type's binary send form (a plain ``bytes`` value is text)."""

    __slots__ = ()


class Unchanged(bytes):
    """An UPDATE's new value that is the same as the old one and was not sent: an out-of-line
    (TOASTed) value the UPDATE left alone. The applier keeps the value it has (seed 12.7)."""

    __slots__ = ()


UNCHANGED = Unchanged(b"")


Value = Optional[bytes]  # None for SQL NULL; Binary for a binary value; UNCHANGED; bytes for text


def text(s: str) -> bytes:
    """A text value from a Python string (tests and tools; UTF-8)."""
    return s.encode("utf-8")


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
    full_identity: bool = False  # no primary key: the identity is the whole old row
    old_columns: bool = False  # TABLE_OLD_COLUMNS: an old image has a value per column

    @property
    def old_width(self) -> int:
        """How many values an UPDATE's or a DELETE's old image holds."""
        return len(self.columns) if self.old_columns else len(self.identity)

    @property
    def qualified(self) -> str:
        return f"{quote_ident(self.nspname)}.{quote_ident(self.relname)}"


class Row(NamedTuple):
    """One changed row (a tuple: decoding makes many, and a tuple is the cheapest object).
    ``flags``: a TRUNCATE's (TRUNCATE_RESTART)."""

    op: str  # "I", "U", "D", "T"
    table: int
    old: tuple[Value, ...] = ()
    new: tuple[Value, ...] = ()
    flags: int = 0


class Schema(NamedTuple):
    """A schema change item: the statement, in the form every node replays, the settings it
    is replayed under (name, value), and the role that ran it."""

    settings: tuple[tuple[str, str], ...]
    role: str
    statement: bytes
    op: str = OP_SCHEMA

    def setting(self, name: str) -> Optional[str]:
        return dict(self.settings).get(name)


Item = Union[Row, Schema]


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
class Writeset:
    xid: int
    pid: int
    last_seen: int
    tables: tuple[Table, ...]
    rows: tuple[Item, ...]
    keys: tuple[Key, ...]
    flags: int = 0
    encoding: int = UTF8
    raw: bytes = field(default=b"", compare=False, repr=False)  # the encoded form, when decoded
    # Read by scan(): ``rows`` holds its schema change items only (the row changes stay in
    # ``raw``, for the apply function), and ``scanned_changes`` the tables its rows change other
    # than by INSERT.
    scanned: bool = field(default=False, compare=False, repr=False)
    scanned_changes: frozenset[int] = field(default=frozenset(), compare=False, repr=False)
    # where ``raw`` is, when it is a large writeset in a spool file (spool.SpooledBuffer): raw is
    # then its mapped view, and PostgreSQL applies it from the file
    spool: Optional[Any] = field(default=None, compare=False, repr=False)

    @property
    def changed_tables(self) -> frozenset[int]:
        """The indexes of the tables it UPDATEs, DELETEs from or TRUNCATEs."""
        if self.scanned:
            return self.scanned_changes
        return frozenset(r.table for r in self.rows if isinstance(r, Row) and r.op != OP_INSERT)

    @property
    def has_schema(self) -> bool:
        """It holds schema changes: applied alone, once everything before it has committed (the
        header says so: decode checks that the DDL flag is set exactly when it does)."""
        return bool(self.flags & (FLAG_DDL | FLAG_TOI))

    @property
    def toi(self) -> bool:
        """A schema change's request for its place in the total order (its content follows)."""
        return bool(self.flags & FLAG_TOI)

    @property
    def concurrent(self) -> bool:
        """CREATE/DROP INDEX or REINDEX CONCURRENTLY: its GID commits nothing; then every node but its
        origin runs the statement in a session of its own (chorus/concurrent.py)."""
        return bool(self.flags & FLAG_CONCURRENT)

    @property
    def statements(self) -> list[Schema]:
        return [r for r in self.rows if isinstance(r, Schema)]


def quote_ident(name: str) -> str:
    """Quote an SQL identifier the way PostgreSQL's quote_ident does, always."""
    return '"' + name.replace('"', '""') + '"'


def text_of(expression: str) -> str:
    """SQL for the value of ``expression`` as its type's output function writes it, as the
    capture does (extension/chorus_capture.c; a boolean ``t``, a ``char(n)`` with its padding),
    NULL kept. Never a cast to text: a role that owns a type may define one (CREATE CAST ... AS
    text WITH FUNCTION), and the apply session that reads the row is a superuser; an output
    function is C, which only a superuser creates."""
    return (f"CASE WHEN pg_catalog.num_nulls({expression}) OPERATOR(pg_catalog.=) 0 "
            f"THEN pg_catalog.concat({expression}) END")


# Table descriptions parsed before, by their encoded schema and name: (encoded description, table).
# Equal descriptions share one Table object, and a known one is not parsed again.
_TABLES: dict[bytes, list[tuple[bytes, Table]]] = {}

_HEAD = struct.Struct(">2sBBIIQHHII")
_FLAGS_AT = 3  # the header: magic (2 bytes), version, then the flags byte
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_KEYHEAD = struct.Struct(">BH")
assert _HEAD.size == HEAD_SIZE


def _name(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def name_str(b: bytes) -> str:
    """A name read from the database, as a writeset's names are held (:func:`name_bytes` undoes it)."""
    return _name(b)


def name_bytes(s: str) -> bytes:
    """A name or setting of a writeset back as the bytes its origin wrote."""
    return s.encode("utf-8", "surrogateescape")


def decode(buf: bytes) -> Writeset:
    """Parse writeset bytes; raise :class:`WireError` on anything malformed."""
    try:
        return _read(bytes(buf), True)
    except (struct.error, IndexError) as e:
        raise WireError(f"writeset truncated: {e}") from e


def is_schema_change(buf: bytes) -> bool:
    """Whether writeset bytes hold a schema change (its header's flags), without reading further."""
    return len(buf) > _FLAGS_AT and bool(buf[_FLAGS_AT] & (FLAG_DDL | FLAG_TOI))


def scan(buf: Any) -> Writeset:
    """Check writeset bytes as :func:`decode` does, and read what certification, scheduling and
    schema changes need (header, tables, schema change items, keys) without making objects of
    the row values: the live path's reading (the apply function reads the rows, from ``raw``).
    The result is ``scanned``: its ``rows`` are its schema change items only. ``buf`` may be a
    spooled writeset (spool.SpooledBuffer): it is read where it is mapped, never copied whole
    by the compiled reader, and the result's ``raw`` is its view, ``spool`` the buffer."""
    spooled = buf if isinstance(buf, SpooledBuffer) else None
    if spooled is not None:
        buf = spooled.view
    elif not isinstance(buf, (bytes, memoryview)):
        buf = bytes(buf)
    try:
        ws = _read(buf, False)
    except (struct.error, IndexError) as e:
        raise WireError(f"writeset truncated: {e}") from e
    return ws if spooled is None else replace(ws, spool=spooled)


class Reader(Protocol):
    """A reader of writeset bytes: ``full`` decodes every value, else it scans (what
    :func:`scan` says). Two implementations: :func:`read_python` below, the reference, and the
    compiled one in ``chorus/_cwire.pyx``; :data:`IMPL` says which one :func:`decode` and
    :func:`scan` use."""

    def __call__(self, buf: bytes, full: bool) -> Writeset: ...


def read_python(buf: bytes, full: bool) -> Writeset:
    if isinstance(buf, memoryview):  # a spooled writeset's view: the reference reads a copy
        ws = read_python(bytes(buf), full)
        return replace(ws, raw=buf)
    n = len(buf)
    if n < _HEAD.size or buf[:2] != MAGIC:
        raise WireError("not a writeset (bad magic)" if buf[:2] != MAGIC else "writeset truncated in header")
    magic, version, flags, xid, pid, last_seen, encoding, ntables, nrows, nkeys = _HEAD.unpack_from(buf, 0)
    if version != VERSION:
        raise WireError(f"unsupported writeset version {version} (this coordinator reads {VERSION})")
    if flags & ~FLAGS_KNOWN:
        raise WireError(f"unknown writeset flags {flags:#x}")
    pos = _HEAD.size
    if nrows > n or nkeys > n or ntables > n:
        raise WireError("writeset counts exceed its length")
    u16 = _U16.unpack_from
    u32 = _U32.unpack_from
    view = memoryview(buf)

    def name(pos: int) -> tuple[str, int]:
        (ln,) = u16(buf, pos)
        end = pos + 2 + ln
        if end > n:
            raise WireError(f"writeset truncated reading a name at byte {pos}")
        return _name(buf[pos + 2:end]), end

    def blob(pos: int, what: str) -> tuple[bytes, int]:
        (ln,) = u32(buf, pos)
        end = pos + 4 + ln
        if end > n:
            raise WireError(f"writeset truncated reading {what}")
        return buf[pos + 4:end], end

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
        nsp, pos = name(pos)
        rel, pos = name(pos)
        (ncols,) = u16(buf, pos)
        pos += 2
        cols = []
        for _c in range(ncols):
            cname, pos = name(pos)
            typ, pos = name(pos)
            cflags = buf[pos]
            if cflags & ~COL_FLAGS_KNOWN:
                raise WireError(f"column {cname!r} of {nsp}.{rel} has unknown flags {cflags:#x}")
            cols.append(Column(cname, typ, cflags))
            pos += 1
        (nident,) = u16(buf, pos)
        ident = tuple(u16(buf, pos + 2 + 2 * i)[0] for i in range(nident))
        pos += 2 + 2 * nident
        if any(i >= ncols for i in ident):
            raise WireError(f"identity column index out of range in table {nsp}.{rel}")
        tflags = buf[pos]
        pos += 1
        if tflags & ~TABLE_FLAGS_KNOWN:
            raise WireError(f"table {nsp}.{rel} has unknown flags {tflags:#x}")
        t = Table(nsp, rel, tuple(cols), ident, bool(tflags & TABLE_FULL_IDENTITY), bool(tflags & TABLE_OLD_COLUMNS))
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
            if kind == VAL_NULL or kind == VAL_UNCHANGED:
                if full:
                    out.append(None if kind == VAL_NULL else UNCHANGED)
                pos += 1
            elif kind == VAL_TEXT or kind == VAL_BINARY:
                (ln,) = u32(buf, pos + 1)
                end = pos + 5 + ln
                if end > n:
                    raise WireError(f"writeset truncated reading {what}")
                if full:
                    out.append(buf[pos + 5:end] if kind == VAL_TEXT else Binary(buf[pos + 5:end]))
                pos = end
            else:
                raise WireError(f"{what} has unknown value kind {kind:#x}")
        return tuple(out), pos

    rows: list[Item] = []
    nschema = 0
    changes: set[int] = set()
    for _ in range(nrows):
        op = chr(buf[pos])
        if op == OP_SCHEMA:
            nschema += 1
            (nset,) = u16(buf, pos + 1)
            pos += 3
            settings = []
            for _s in range(nset):
                sname, pos = name(pos)
                svalue, pos = name(pos)
                settings.append((sname, svalue))
            role, pos = name(pos)
            statement, pos = blob(pos, "a schema change statement")
            rows.append(Schema(tuple(settings), role, statement))
            continue
        if op not in "IUDT":
            raise WireError(f"unknown row op {op!r}")
        (ti,) = u16(buf, pos + 1)
        pos += 3
        if ti >= len(tables):
            raise WireError(f"row refers to table {ti} of {len(tables)}")
        t = tables[ti]
        if op == OP_TRUNCATE:
            tflags = buf[pos]
            pos += 1
            if tflags & ~TRUNCATE_FLAGS_KNOWN:
                raise WireError(f"TRUNCATE with unknown flags {tflags:#x}")
            changes.add(ti)
            if full:
                rows.append(Row(op, ti, (), (), tflags))
            continue
        old: tuple[Value, ...] = ()
        new: tuple[Value, ...] = ()
        if op == "U" or op == "D":
            old, pos = values(pos, t.old_width, "old tuple")
            changes.add(ti)
        if op == "I" or op == "U":
            new, pos = values(pos, len(t.columns), "new tuple")
        if full:
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
    if flags & FLAG_TOI and (ntables or nrows != 1 or nschema != 1):
        raise WireError("a schema change's ordering request holds exactly one schema change item")
    if flags & FLAG_CONCURRENT and (flags & FLAG_TOI or not flags & FLAG_DDL or ntables or nrows != 1):
        raise WireError("a concurrent index change holds exactly one schema change item")
    if bool(flags & FLAG_DDL) != (nschema > 0):
        raise WireError("the DDL flag does not match the schema change items")
    if pos != n:
        raise WireError(f"{n - pos} trailing bytes after writeset")
    if full:
        return Writeset(xid, pid, last_seen, tuple(tables), tuple(rows), tuple(keys), flags, encoding, buf)
    return Writeset(xid, pid, last_seen, tuple(tables), tuple(rows), tuple(keys), flags, encoding, buf,
                    True, frozenset(changes))


_blake2b = hashlib.blake2b
_MODES = {1: KeyMode.REFERENCE, 2: KeyMode.UPDATE, 3: KeyMode.EXCLUSIVE}


def _text(s: str) -> bytes:
    b = name_bytes(s)
    return struct.pack(">H", len(b)) + b


def _tuple(values: tuple[Value, ...]) -> bytes:
    out = [struct.pack(">H", len(values))]
    for v in values:
        if v is None:
            out.append(b"n")
        elif isinstance(v, Unchanged):
            out.append(b"u")
        else:
            out.append((b"b" if isinstance(v, Binary) else b"t") + struct.pack(">I", len(v)) + v)
    return b"".join(out)


def encode(ws: Writeset) -> bytes:
    """Write a writeset (the inverse of :func:`decode`); the extension does the same in C."""
    if ws.scanned:
        raise ValueError("a scanned writeset is written as it was read: use its raw bytes")
    flags = (ws.flags & ~FLAG_DDL) | (FLAG_DDL if any(r.op == OP_SCHEMA for r in ws.rows) else 0)
    out = [MAGIC, struct.pack(">BBIIQHHII", VERSION, flags, ws.xid, ws.pid, ws.last_seen, ws.encoding,
                              len(ws.tables), len(ws.rows), len(ws.keys))]
    for t in ws.tables:
        out += [_text(t.nspname), _text(t.relname), struct.pack(">H", len(t.columns))]
        for c in t.columns:
            out += [_text(c.name), _text(c.typname), bytes([c.flags])]
        out.append(struct.pack(">H", len(t.identity)))
        out += [struct.pack(">H", i) for i in t.identity]
        out.append(bytes([(TABLE_FULL_IDENTITY if t.full_identity else 0) | (TABLE_OLD_COLUMNS if t.old_columns else 0)]))
    for row in ws.rows:
        if isinstance(row, Schema):
            out.append(b"S" + struct.pack(">H", len(row.settings)))
            out += [_text(k) + _text(v) for k, v in row.settings]
            out += [_text(row.role), struct.pack(">I", len(row.statement)), row.statement]
            continue
        out.append(row.op.encode() + struct.pack(">H", row.table))
        if row.op == OP_TRUNCATE:
            out.append(bytes([row.flags]))
        if row.op in ("U", "D"):
            out.append(_tuple(row.old))
        if row.op in ("I", "U"):
            out.append(_tuple(row.new))
    for k in ws.keys:
        out.append(struct.pack(">BH", int(k.mode), len(k.parts)))
        out += [struct.pack(">I", len(p)) + p for p in k.parts]
    return b"".join(out)


def describe(ws: Writeset) -> dict[str, Any]:
    """A writeset as plain data (JSON-ready): every field, values as ``{"text": ...}``,
    ``{"binary": hex}`` or None. Two readers of the same bytes agree iff their descriptions are
    equal: the golden writesets (tests/golden/) keep one beside each file."""
    def value(v: Value) -> Optional[dict[str, str]]:
        if v is None:
            return None
        if isinstance(v, Unchanged):
            return {"unchanged": ""}
        if isinstance(v, Binary):
            return {"binary": v.hex()}
        return {"text": v.decode("utf-8", "backslashreplace")}

    def item(r: Item) -> dict[str, Any]:
        if isinstance(r, Schema):
            return {"op": r.op, "settings": [list(x) for x in r.settings], "role": r.role,
                    "statement": r.statement.decode("utf-8", "backslashreplace")}
        return {"op": r.op, "table": r.table, "old": [value(v) for v in r.old],
                "new": [value(v) for v in r.new], "flags": r.flags}

    return {
        "xid": ws.xid, "pid": ws.pid, "last_seen": ws.last_seen, "flags": ws.flags, "encoding": ws.encoding,
        "tables": [{"schema": t.nspname, "name": t.relname, "full_identity": t.full_identity,
                    **({"old_columns": True} if t.old_columns else {}),
                    "identity": list(t.identity), "columns": [[c.name, c.typname, c.flags] for c in t.columns]}
                   for t in ws.tables],
        "items": [item(r) for r in ws.rows],
        "keys": [{"mode": int(k.mode), "parts": [p.hex() for p in k.parts]} for k in ws.keys],
    }


def empty(encoding: int = UTF8) -> bytes:
    """A writeset with nothing in it: applied, it commits its GID and changes nothing (a schema
    change that failed on its origin)."""
    return encode(Writeset(0, 0, 0, (), (), (), encoding=encoding))


# the compiled reader when it is built, unless CHORUS_IMPL=python (chorus/impl.py); built, it is
# bound either way: the tests compare both
_cwire = impl.compiled("_cwire")
if _cwire is not None:
    _cwire.bind(sys.modules[__name__])
IMPL = impl.chosen(_cwire)
_read: Reader = _cwire.read if IMPL == "c" and _cwire is not None else read_python
