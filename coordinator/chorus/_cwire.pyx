# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled reader of the writeset wire format: the same reading as wire.py's ``read_python``
(the reference), compiled with Cython. wire.py picks one at import (``CHORUS_IMPL=python|c``);
tests/unit/test_impl.py checks that both read every writeset alike and refuse the same bytes.

It makes wire.py's own objects, which wire.py hands it (:func:`bind`): this module imports no
other module of Chorus.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

cdef object Table, Column, Row, Schema, Key, Writeset, Binary, UNCHANGED, WireError, TABLES, MODES, blake2b
cdef int MAX_PARTS, VERSION
cdef uint8_t FLAGS_KNOWN, COL_FLAGS_KNOWN, TABLE_FLAGS_KNOWN, TRUNCATE_FLAGS_KNOWN
cdef uint8_t FLAG_DDL, FLAG_TOI, FLAG_CONCURRENT, TABLE_FULL_IDENTITY, TABLE_OLD_COLUMNS
cdef bint bound = False

# The format's constants the reading is compiled with (the rest comes from wire.py: bind).
# tests/unit/test_wire_rules.py reads this block and compares it with wire.LIMITS.
cdef enum:
    HEAD = 32  # the header's size (HEAD_SIZE)
    MAGIC_0 = 0x43  # the first two bytes, "CW" (MAGIC)
    MAGIC_1 = 0x57
    VAL_NULL = 0x6E  # value kinds (VALUE_KINDS)
    VAL_TEXT = 0x74
    VAL_BINARY = 0x62
    VAL_UNCHANGED = 0x75
    OP_INSERT = 0x49  # item ops, "IUDTS" (OPS)
    OP_UPDATE = 0x55
    OP_DELETE = 0x44
    OP_TRUNCATE = 0x54
    OP_SCHEMA = 0x53
    KEY_MODE_FIRST = 1  # key modes (KEY_MODES)
    KEY_MODE_LAST = 3


def bind(wire) -> None:
    """Take the classes and constants of the wire module (once, at its import)."""
    global Table, Column, Row, Schema, Key, Writeset, Binary, UNCHANGED, WireError, TABLES, MODES, blake2b, bound
    global MAX_PARTS, VERSION, FLAGS_KNOWN, COL_FLAGS_KNOWN, TABLE_FLAGS_KNOWN, TRUNCATE_FLAGS_KNOWN
    global FLAG_DDL, FLAG_TOI, FLAG_CONCURRENT, TABLE_FULL_IDENTITY, TABLE_OLD_COLUMNS
    Table, Column, Row, Schema, Key = wire.Table, wire.Column, wire.Row, wire.Schema, wire.Key
    Writeset, Binary, WireError, TABLES = wire.Writeset, wire.Binary, wire.WireError, wire._TABLES
    UNCHANGED = wire.UNCHANGED
    MODES = {int(m): m for m in wire.KeyMode}
    import hashlib
    blake2b = hashlib.blake2b
    MAX_PARTS, VERSION = wire.MAX_PARTS, wire.VERSION
    FLAGS_KNOWN, COL_FLAGS_KNOWN = wire.FLAGS_KNOWN, wire.COL_FLAGS_KNOWN
    TABLE_FLAGS_KNOWN, TRUNCATE_FLAGS_KNOWN = wire.TABLE_FLAGS_KNOWN, wire.TRUNCATE_FLAGS_KNOWN
    FLAG_DDL, FLAG_TOI, FLAG_CONCURRENT = wire.FLAG_DDL, wire.FLAG_TOI, wire.FLAG_CONCURRENT
    TABLE_FULL_IDENTITY = wire.TABLE_FULL_IDENTITY
    TABLE_OLD_COLUMNS = wire.TABLE_OLD_COLUMNS
    bound = True


cdef inline uint16_t u16(const uint8_t *p) noexcept nogil:
    return (<uint16_t>p[0] << 8) | p[1]


cdef inline uint32_t u32(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t u64(const uint8_t *p) noexcept nogil:
    return (<uint64_t>u32(p) << 32) | u32(p + 4)


cdef class _Reader:
    cdef object buf  # bytes, or a read-only buffer (a spooled writeset's mapped view): never copied whole
    cdef bint isbytes
    cdef const uint8_t[::1] view  # keeps a buffer's export alive while p points into it
    cdef const uint8_t *p
    cdef Py_ssize_t n

    cdef inline bytes at(self, Py_ssize_t start, Py_ssize_t end):
        """Bytes [start, end) of the writeset, as bytes."""
        if self.isbytes:
            return (<bytes>self.buf)[start:end]
        return bytes(self.buf[start:end])

    cdef inline int need(self, Py_ssize_t pos, Py_ssize_t size, str what) except -1:
        if size < 0 or pos + size > self.n:
            raise WireError(f"writeset truncated reading {what} at byte {pos}")
        return 0

    cdef inline str name(self, Py_ssize_t *pos):
        cdef Py_ssize_t at = pos[0]
        self.need(at, 2, "a name")
        cdef Py_ssize_t ln = u16(self.p + at)
        self.need(at + 2, ln, "a name")
        pos[0] = at + 2 + ln
        return self.at(at + 2, at + 2 + ln).decode("utf-8", "surrogateescape")

    cdef inline bytes blob(self, Py_ssize_t *pos, str what):
        cdef Py_ssize_t at = pos[0]
        self.need(at, 4, what)
        cdef Py_ssize_t ln = u32(self.p + at)
        self.need(at + 4, ln, what)
        pos[0] = at + 4 + ln
        return self.at(at + 4, at + 4 + ln)

    cdef tuple values(self, Py_ssize_t *pos, Py_ssize_t expected, str what, bint full):
        cdef Py_ssize_t at = pos[0]
        self.need(at, 2, what)
        cdef Py_ssize_t cnt = u16(self.p + at), i, ln
        cdef uint8_t kind
        if cnt != expected:
            raise WireError(f"{what} has {cnt} values, expected {expected}")
        at += 2
        out = [] if full else None
        for i in range(cnt):
            self.need(at, 1, what)
            kind = self.p[at]
            if kind == VAL_NULL or kind == VAL_UNCHANGED:
                if full:
                    out.append(None if kind == VAL_NULL else UNCHANGED)
                at += 1
            elif kind == VAL_TEXT or kind == VAL_BINARY:
                self.need(at + 1, 4, what)
                ln = u32(self.p + at + 1)
                self.need(at + 5, ln, what)
                if full:
                    v = self.at(at + 5, at + 5 + ln)
                    out.append(v if kind == VAL_TEXT else Binary(v))
                at += 5 + ln
            else:
                raise WireError(f"{what} has unknown value kind {kind:#x}")
        pos[0] = at
        return tuple(out) if full else ()

    cdef object table(self, Py_ssize_t *pos):
        # A table description seen before (the same bytes) parses to the same table.
        cdef Py_ssize_t start = pos[0], at = pos[0], ln1, ln2, ncols, nident, c, i
        cdef uint8_t cflags, tflags
        self.need(at, 2, "a table")
        ln1 = u16(self.p + at)
        self.need(at + 2 + ln1, 2, "a table")
        ln2 = u16(self.p + at + 2 + ln1)
        self.need(at, 4 + ln1 + ln2, "a table")
        names = self.at(at, at + 4 + ln1 + ln2)
        seen = TABLES.get(names)
        if seen is not None:
            for raw, known in seen:
                if self.at(at, at + len(raw)) == raw:
                    pos[0] = at + len(raw)
                    return known
        nsp = self.name(&at)
        rel = self.name(&at)
        self.need(at, 2, "a table")
        ncols = u16(self.p + at)
        at += 2
        cols = []
        for c in range(ncols):
            cname = self.name(&at)
            typ = self.name(&at)
            self.need(at, 1, "a column")
            cflags = self.p[at]
            if cflags & ~COL_FLAGS_KNOWN:
                raise WireError(f"column {cname!r} of {nsp}.{rel} has unknown flags {cflags:#x}")
            cols.append(Column(cname, typ, cflags))
            at += 1
        self.need(at, 2, "a table")
        nident = u16(self.p + at)
        self.need(at + 2, 2 * nident + 1, "a table")
        ident = tuple([u16(self.p + at + 2 + 2 * i) for i in range(nident)])
        at += 2 + 2 * nident
        for i in ident:
            if i >= ncols:
                raise WireError(f"identity column index out of range in table {nsp}.{rel}")
        tflags = self.p[at]
        at += 1
        if tflags & ~TABLE_FLAGS_KNOWN:
            raise WireError(f"table {nsp}.{rel} has unknown flags {tflags:#x}")
        t = Table(nsp, rel, tuple(cols), ident, bool(tflags & TABLE_FULL_IDENTITY), bool(tflags & TABLE_OLD_COLUMNS))
        if len(TABLES) >= 4096:
            TABLES.clear()
        versions = TABLES.setdefault(names, [])
        if len(versions) >= 8:
            versions.clear()
        versions.append((self.at(start, at), t))
        pos[0] = at
        return t


def read(object buf, bint full):
    """Read writeset bytes (``full``: decode, else scan), as wire.py's ``read_python`` does."""
    if not bound:
        raise RuntimeError("chorus._cwire is not bound to the wire module")
    cdef _Reader r = _Reader.__new__(_Reader)
    if type(buf) is not bytes and not isinstance(buf, memoryview):
        buf = bytes(buf)
    r.buf = buf
    r.isbytes = type(buf) is bytes
    if r.isbytes:
        r.p = <const uint8_t *>PyBytes_AS_STRING(buf)
        r.n = PyBytes_GET_SIZE(buf)
    else:
        r.view = buf
        r.n = r.view.shape[0]
        r.p = &r.view[0] if r.n else <const uint8_t *>b""
    cdef Py_ssize_t n = r.n, pos, i, nset, s, ti, start
    cdef const uint8_t *p = r.p
    if n < HEAD or p[0] != MAGIC_0 or p[1] != MAGIC_1:
        raise WireError("not a writeset (bad magic)" if n < 2 or p[0] != MAGIC_0 or p[1] != MAGIC_1
                        else "writeset truncated in header")
    cdef uint8_t version = p[2], flags = p[3], op, tflags, mode
    cdef uint32_t xid = u32(p + 4), pid = u32(p + 8)
    cdef uint64_t last_seen = u64(p + 12)
    cdef uint32_t encoding = u16(p + 20), ntables = u16(p + 22), nrows = u32(p + 24), nkeys = u32(p + 28)
    if version != VERSION:
        raise WireError(f"unsupported writeset version {version} (this coordinator reads {VERSION})")
    if flags & ~FLAGS_KNOWN:
        raise WireError(f"unknown writeset flags {flags:#x}")
    if nrows > n or nkeys > n or ntables > n:
        raise WireError("writeset counts exceed its length")
    pos = HEAD
    tables = [r.table(&pos) for i in range(ntables)]
    cdef Py_ssize_t ntab = len(tables), nschema = 0, nparts, part
    rows = []
    changes = set()
    cdef tuple old, new
    for i in range(nrows):
        r.need(pos, 1, "a row")
        op = p[pos]
        if op == OP_SCHEMA:
            nschema += 1
            r.need(pos + 1, 2, "a schema change")
            nset = u16(p + pos + 1)
            pos += 3
            settings = []
            for s in range(nset):
                sname = r.name(&pos)
                svalue = r.name(&pos)
                settings.append((sname, svalue))
            role = r.name(&pos)
            statement = r.blob(&pos, "a schema change statement")
            rows.append(Schema(tuple(settings), role, statement))
            continue
        if op != OP_INSERT and op != OP_UPDATE and op != OP_DELETE and op != OP_TRUNCATE:
            raise WireError(f"unknown row op {chr(op)!r}")
        r.need(pos + 1, 2, "a row")
        ti = u16(p + pos + 1)
        pos += 3
        if ti >= ntab:
            raise WireError(f"row refers to table {ti} of {ntab}")
        t = tables[ti]
        if op == OP_TRUNCATE:
            r.need(pos, 1, "a TRUNCATE")
            tflags = p[pos]
            pos += 1
            if tflags & ~TRUNCATE_FLAGS_KNOWN:
                raise WireError(f"TRUNCATE with unknown flags {tflags:#x}")
            changes.add(ti)
            if full:
                rows.append(Row("T", ti, (), (), tflags))
            continue
        old = ()
        new = ()
        if op == OP_UPDATE or op == OP_DELETE:
            old = r.values(&pos, len(t.columns) if t.old_columns else len(t.identity), "old tuple", full)
            changes.add(ti)
        if op == OP_INSERT or op == OP_UPDATE:
            new = r.values(&pos, len(t.columns), "new tuple", full)
        if full:
            rows.append(Row(chr(op), ti, old, new))
    keys = []
    for i in range(nkeys):
        r.need(pos, 3, "a key")
        mode = p[pos]
        nparts = u16(p + pos + 1)
        pos += 3
        if mode < KEY_MODE_FIRST or mode > KEY_MODE_LAST:
            raise WireError(f"unknown key mode {mode}")
        if nparts == 0 or nparts > MAX_PARTS:
            raise WireError(f"key with {nparts} parts")
        parts = []
        start = pos
        for part in range(nparts):
            r.need(pos, 4, "a key part")
            ln = u32(p + pos)
            r.need(pos + 4, ln, "a key part")
            parts.append(r.at(pos + 4, pos + 4 + ln))
            pos += 4 + ln
        # the encoded parts are exactly what key_hash hashes
        keys.append(Key(MODES[mode], tuple(parts), blake2b(r.buf[start:pos], digest_size=16).digest()))
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
