"""The snapshot diff of total recovery and verify, pushed into PostgreSQL and recursing like a
Merkle tree: both sides hash their own rows; only hashes of what differs, and then the rows that
differ, travel. For one table with a primary key (the donor at its exported snapshot; the joiner
stopped, or for verify another node at its own snapshot):

- **sample**: random keys (an integer key) or random pages are looked up on both sides; the
  share that differs decides copy or diff (``analyse``) and the size of a leaf (``leaf_size``).
- **leaves** (one scan per side): the rows are cut into leaves of 8 to 64 rows by the first key
  column, the same cut on both sides (``Cut``: equal widths of an integer key, bounds read from
  the donor for any other type, or a hash of a composite key whose first column has few
  values); each side keeps ``(leaf, rows, XOR of row hashes)`` in a temporary table of its own
  session.
- **ranges**: about ``range_rows`` rows make a range; the sides compare range summaries computed
  from their leaves, then the leaves of the ranges that differ (the donor's copied into the
  joiner's session and joined there). A table most of whose leaves differ is copied instead.
- **rows** (``run_task``, in threads or on Spark executors): within the differing leaves, read
  as key intervals through the primary key's index, the donor's keys and row hashes are copied
  into the joiner's session and joined with its own; keys only the joiner has are staged for
  deletion, the donor's rows that the joiner lacks or holds otherwise are copied from the donor
  straight into the joiner's staging table.

A row's hash (``row_hash``) is ``hash_record_extended`` of the row when every column's own hash
tells apart values that print differently, else ``hashtextextended`` of its text form under
fixed output settings (``SESSION_SETTINGS``), so 1.0 and 1.00 differ. The chorus process relays
COPY data in blocks and parses no rows; every read from the donor is counted (``Counter``).
``copy_table`` is the copy: TRUNCATE and COPY FREEZE, indexes built after the load.
"""

from __future__ import annotations

import math
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from chorus_spark.conninfo import program_args
from chorus_spark.sqlgen import SESSION_SETTINGS, Table, ident, literal

LEAF_ROWS = 32  # rows per leaf, when no sample says otherwise
FANOUT = 32  # leaves per range at the level above, when no range size is given
SAMPLE_ROWS = 2000  # donor rows sampled to decide between copying and diffing
COPY_SHARE = 0.5  # copy a table when the leaves that differ hold more than this share of its rows
COPY_DRIFT = 0.03  # or when a sample says more than this share of its rows differ
TASK_ROWS = 200_000  # rows of differing leaves compared by one task, about (each task starts two psql)
MAX_INTERVALS_PER_TASK = 50_000
SAMPLE_KEYS = 20  # differing keys of each kind a task names
REBUILD_BYTES = 64 << 20  # a copied table this large has its indexes built after the load, not during it
INTEGER_TYPES = {"smallint", "integer", "bigint"}
SPARSE = 4  # an integer key spanning more than this many values a row is cut by bounds, not widths
OFF = "-c chorus.capture=off -c chorus.replicate_ddl=off"
# leaves are grouped in memory, by hashing (the planner cannot know how few groups there are, and
# would sort every row on disk first), no JIT for a query run once
WORK_SETTINGS = ["SET work_mem = '128MB'", "SET jit = off", "SET enable_sort = off"]


class DiffError(Exception):
    pass


@dataclass
class Counter:
    """Bytes read from each side (COPY data as it arrives)."""

    donor: int = 0
    joiner: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, side: str, n: int) -> None:
        with self.lock:
            setattr(self, side, getattr(self, side) + n)


def open_session(dsn: str, snapshot: Optional[str] = None, options: Optional[str] = None) -> psycopg.Connection[Any]:
    """A session in one REPEATABLE READ transaction (at ``snapshot`` when given) with the fixed
    output settings. Rolled back when closed: its temporary tables go with it."""
    conn = psycopg.connect(dsn, autocommit=True, options=options) if options else \
        psycopg.connect(dsn, autocommit=True)
    try:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        if snapshot:
            conn.execute(f"SET TRANSACTION SNAPSHOT {literal(snapshot)}")
        for stmt in SESSION_SETTINGS.split(";") + WORK_SETTINGS:
            conn.execute(stmt)
    except psycopg.Error:
        conn.close()
        raise
    return conn


def close_session(conn: psycopg.Connection[Any]) -> None:
    try:
        if not conn.closed:
            conn.execute("ROLLBACK")
    except psycopg.Error:
        pass
    finally:
        conn.close()


def copy_out(conn: psycopg.Connection[Any], query: sql.Composable, counter: Counter, side: str) -> Iterator[bytes]:
    """The raw COPY text of ``query``'s result, chunk by chunk, counted."""
    with conn.cursor().copy(sql.SQL("COPY ({}) TO STDOUT").format(query)) as cp:
        for chunk in cp:
            data = bytes(chunk)
            counter.add(side, len(data))
            yield data


def copy_lines(conn: psycopg.Connection[Any], query: sql.Composable, counter: Counter, side: str) -> Iterator[list[str]]:
    """``query``'s rows as lists of COPY-escaped text fields (kept escaped: both sides escape
    alike, and written back into a COPY they read as the same values)."""
    rest = b""
    for chunk in copy_out(conn, query, counter, side):
        rest += chunk
        *lines, rest = rest.split(b"\n")
        for line in lines:
            yield line.decode(errors="surrogateescape").split("\t")
    if rest:
        yield rest.decode(errors="surrogateescape").split("\t")


PSQL = "/usr/lib/postgresql/15/bin/psql"
CAPTURE_TRIGGER = "chorus_capture"


def _psql_dsn(dsn: str) -> tuple[str, dict[str, str]]:
    """psql's ``-d`` without the password, and its environment with it (conninfo.program_args)."""
    dbname, secrets = program_args({k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None})
    return dbname, {**os.environ, **secrets}


def stream_out(dsn: str, snapshot: Optional[str], query: sql.Composable, conn: psycopg.Connection[Any],
               counter: Counter, block: int = 1 << 20, table: bool = False) -> Iterator[bytes]:
    """``query``'s COPY text (``table``: a whole table's, ``query`` naming it and its columns,
    which COPY reads faster than a query) from a ``psql`` at ``snapshot``, in blocks of up to
    ``block`` bytes, counted as read from the donor (psql relays COPY data in C; reading it row
    by row through Python costs as much again). The script goes through psql's standard input:
    it may be long. ``conn`` (any session) only renders the query."""
    import subprocess

    steps = ["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"]
    if snapshot:
        steps.append(f"SET TRANSACTION SNAPSHOT {literal(snapshot)}")
    steps += [s.strip() for s in SESSION_SETTINGS.split(";")]
    steps.append(sql.SQL("COPY {} TO STDOUT" if table else "COPY ({}) TO STDOUT").format(query).as_string(conn))
    dbname, env = _psql_dsn(dsn)
    proc = subprocess.Popen([PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dbname], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:  # psql prints nothing before the COPY's data: the whole script can be written first
        proc.stdin.write(";\n".join(steps).encode() + b";\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass
    try:
        while True:
            data = os.read(proc.stdout.fileno(), block)
            if not data:
                break
            counter.add("donor", len(data))
            yield data
    finally:
        proc.stdout.close()
        err = proc.stderr.read().decode(errors="replace").strip()
        if proc.wait() != 0:
            raise DiffError(f"reading from the donor failed: {err}")


_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def unescape(field: str) -> str:
    """A COPY text field's value (COPY TO escapes only these: backslash, b f n r t v)."""
    if "\\" not in field:
        return field
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), field)


# ---- the cut into leaves -------------------------------------------------------------------------

@dataclass(frozen=True)
class Cut:
    """How a table's rows fall into leaves, the same on both sides. A dense integer first key:
    leaf ``(k - base) / width``. Any other (or a sparse integer key): ``width_bucket(k, bounds)``
    (bounds are the donor's keys at every leaf_rows-th row, as text)."""

    key_type: str
    base: Optional[int] = None
    width: Optional[int] = None
    bounds: tuple[str, ...] = ()
    wide: bool = False  # the keys span more than bigint arithmetic can subtract: numeric instead
    leaf_rows: int = 32  # rows a leaf holds, about
    typed: bool = False  # rows hashed by their columns' own hash functions (row_hash)
    hashed: int = 0  # leaves by a hash of the whole key, this many (a composite key whose first column
    # has few values: ranges of it would be too coarse); the rows level then scans, not seeks

    @property
    def arithmetic(self) -> bool:
        return self.base is not None

    def leaf_of(self, col: sql.Composable, key: Optional[sql.Composable] = None) -> sql.Composable:
        if self.hashed:
            return sql.SQL("mod(hashtextextended(ROW({})::text, 1) & 9223372036854775807, {})").format(
                key, sql.Literal(self.hashed))
        if self.arithmetic:
            form = "div({}::numeric - {}, {})::bigint" if self.wide else "(({}::bigint - {}) / {})"
            return sql.SQL(form).format(col, sql.Literal(self.base), sql.Literal(self.width))
        return sql.SQL("width_bucket({}, {})").format(col, self._bounds_array())

    def _bounds_array(self) -> sql.Composable:
        return sql.SQL("{}::text[]::{}[]").format(sql.Literal(list(self.bounds)), sql.SQL(self.key_type))

    def interval(self, lo_leaf: int, hi_leaf: int) -> tuple[Optional[str], Optional[str]]:
        """Leaves lo_leaf..hi_leaf-1 as a key interval [lo, hi) in text (None: open end)."""
        if self.arithmetic:
            assert self.base is not None and self.width is not None
            return str(self.base + lo_leaf * self.width), str(self.base + hi_leaf * self.width)
        lo = self.bounds[lo_leaf - 1] if lo_leaf >= 1 else None
        hi = self.bounds[hi_leaf - 1] if hi_leaf - 1 < len(self.bounds) else None
        return lo, hi

    def to_dict(self) -> dict[str, Any]:
        return {"key_type": self.key_type, "base": self.base, "width": self.width, "bounds": list(self.bounds),
                "wide": self.wide, "leaf_rows": self.leaf_rows, "typed": self.typed, "hashed": self.hashed}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Cut":
        return Cut(d["key_type"], d.get("base"), d.get("width"), tuple(d.get("bounds") or ()), bool(d.get("wide")),
                   int(d.get("leaf_rows") or LEAF_ROWS), bool(d.get("typed")), int(d.get("hashed") or 0))


# Types whose own hash function tells apart every two values that print differently (with a
# deterministic collation, for the string types): numeric (1.0 = 1.00), float (-0 = 0), interval
# ('1 day' = '24 hours'), jsonb, arrays, citext and the like are not among them.
EXACT_HASH_TYPES = frozenset({"smallint", "integer", "bigint", "boolean", "text", "character varying", "character",
                              "bytea", "date", "timestamp without time zone", "timestamp with time zone",
                              "time without time zone", "uuid", "oid", "name", '"char"'})

_COLUMN_TYPES = """
SELECT format_type(a.atttypid, a.atttypmod), coalesce(c.collisdeterministic, true)
  FROM pg_attribute a LEFT JOIN pg_collation c ON c.oid = a.attcollation
 WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
"""


def exact_hashes(conn: psycopg.Connection[Any], t: Table) -> bool:
    """Whether every stored column's own hash function can hash the rows (cheaper than their text)."""
    rows = conn.execute(_COLUMN_TYPES, (t.qualified,)).fetchall()
    return bool(rows) and all(re.sub(r"\(.*?\)", "", ty) in EXACT_HASH_TYPES and det for ty, det in rows)


def row_hash(t: Table, typed: bool = False) -> sql.Composable:
    """A row's 64-bit hash: of its text form under the fixed output settings, or (``typed``) by
    its columns' own hash functions (``hash_record_extended``; exact_hashes says when)."""
    cols = sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c.name)) for c in t.stored)
    if typed:
        return sql.SQL("hash_record_extended(ROW({}), 0)").format(cols)
    return sql.SQL("hashtextextended(ROW({})::text, 0)").format(cols)


def _first_key(t: Table) -> sql.Composable:
    return sql.SQL("t.{}").format(sql.Identifier(t.key[0]))


def _whole_key(t: Table) -> sql.Composable:
    return sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(k)) for k in t.key)


def _table(t: Table) -> sql.Composable:
    return sql.Identifier(t.schema, t.name)


def make_cut(donor: psycopg.Connection[Any], joiner: psycopg.Connection[Any], t: Table, rows: int,
             counter: Counter, leaf_rows: int = LEAF_ROWS, typed: bool = False) -> Cut:
    """The leaves of ``t`` (about ``leaf_rows`` rows each) for a donor of about ``rows`` rows."""
    ktype = t.column(t.key[0]).type
    k = _first_key(t)
    leaves = max(1, math.ceil(rows / leaf_rows))
    if len(t.key) > 1:
        q = sql.SQL("SELECT count(DISTINCT k)::float8 / greatest(count(*), 1) FROM (SELECT {} AS k FROM {} t "
                    "TABLESAMPLE SYSTEM ({}) LIMIT {}) s").format(
            k, _table(t), sql.Literal(min(100.0, 100.0 * SAMPLE_ROWS / max(1, rows))), sql.Literal(SAMPLE_ROWS))
        row = donor.execute(q).fetchone()
        if row is not None and float(row[0]) < 0.5:
            return Cut(ktype, leaf_rows=leaf_rows, typed=typed, hashed=leaves)
    if ktype in INTEGER_TYPES:
        q = sql.SQL("SELECT min({0}), max({0}) FROM {1} t").format(k, _table(t))
        ends = [c.execute(q).fetchone() for c in (donor, joiner)]
        lows = [e[0] for e in ends if e and e[0] is not None]
        highs = [e[1] for e in ends if e and e[1] is not None]
        if not lows:
            return Cut(ktype, 0, 1, leaf_rows=leaf_rows, typed=typed)
        base, top = min(lows), max(highs)
        if top - base + 1 <= SPARSE * max(1, rows):  # dense enough for equal widths
            return Cut(ktype, base, max(1, math.ceil((top - base + 1) / leaves)), wide=top - base >= 2 ** 62,
                       leaf_rows=leaf_rows, typed=typed)
    q = sql.SQL("SELECT k FROM (SELECT {0} AS k, row_number() OVER (ORDER BY {0}) AS r FROM {1} t) s "
                "WHERE mod(r, {2}) = 1 ORDER BY k").format(k, _table(t), sql.Literal(leaf_rows))
    bounds = tuple(unescape(r[0]) for r in copy_lines(donor, q, counter, "donor"))
    return Cut(ktype, bounds=bounds, leaf_rows=leaf_rows, typed=typed)


# ---- sampling: copy or diff ----------------------------------------------------------------------

def sample_drift(donor: psycopg.Connection[Any], joiner: psycopg.Connection[Any], t: Table, rows: int,
                 counter: Counter, typed: bool) -> tuple[float, int]:
    """The share of rows that differ between the sides, estimated from a sample, and the sample's
    size. An integer key is probed at random values between the lowest and highest key of either
    side (a row only one side has counts, wherever it is); other keys by the donor's rows in
    random pages (TABLESAMPLE SYSTEM: rows the donor lacks are not seen, and rows rewritten lately
    sit in the newest pages, so this under-counts; the leaves correct it)."""
    if rows <= 0:
        return 0.0, 0
    if len(t.key) == 1 and t.column(t.key[0]).type in INTEGER_TYPES:
        probed = _probe_drift(donor, joiner, t, counter, typed)
        if probed is not None:
            return probed
    pct = min(100.0, 100.0 * SAMPLE_ROWS / rows)
    keys = sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(k)) for k in t.key)
    q = sql.SQL("SELECT {}, {} FROM {} t TABLESAMPLE SYSTEM ({}) LIMIT {}").format(
        keys, row_hash(t, typed), _table(t), sql.Literal(pct), sql.Literal(SAMPLE_ROWS * 4))
    sample = [line for line in copy_lines(donor, q, counter, "donor")]
    if not sample:
        return 0.0, 0
    nkey = len(t.key)
    types = [t.column(k).type for k in t.key]
    # the joiner's hashes of the same keys (through its primary key)
    arrays = sql.SQL(", ").join(sql.SQL("{}::text[]::{}[]").format(sql.Literal([unescape(s[i]) for s in sample]), sql.SQL(ty))
                                for i, ty in enumerate(types))
    match = sql.SQL(" AND ").join(sql.SQL("t.{} = s.k{}").format(sql.Identifier(k), sql.SQL(str(i)))
                                  for i, k in enumerate(t.key))
    names = sql.SQL(", ").join(sql.SQL("k{}").format(sql.SQL(str(i))) for i in range(nkey))
    jq = sql.SQL("SELECT {}, {} FROM unnest({}) AS s({}) JOIN {} t ON {}").format(
        keys, row_hash(t, typed), arrays, names, _table(t), match)
    theirs = {tuple(line[:nkey]): line[nkey] for line in copy_lines(joiner, jq, counter, "joiner")}
    differ = sum(1 for s in sample if theirs.get(tuple(s[:nkey])) != s[nkey])
    return differ / len(sample), len(sample)


def _probe_drift(donor: psycopg.Connection[Any], joiner: psycopg.Connection[Any], t: Table, counter: Counter,
                 typed: bool) -> Optional[tuple[float, int]]:
    """sample_drift for a one-column integer key: SAMPLE_ROWS random keys looked up on both sides
    through the primary key. None when too few of them exist (a sparse key)."""
    import random

    k = _first_key(t)
    ends = [c.execute(sql.SQL("SELECT min({0}), max({0}) FROM {1} t").format(k, _table(t))).fetchone()
            for c in (donor, joiner)]
    lows = [e[0] for e in ends if e and e[0] is not None]
    highs = [e[1] for e in ends if e and e[1] is not None]
    if not lows:
        return None
    lo, hi = min(lows), max(highs)
    keys = sorted({random.randint(lo, hi) for _ in range(SAMPLE_ROWS)})
    q = sql.SQL("SELECT {}, {} FROM {} t WHERE {} = ANY({}::bigint[])").format(
        k, row_hash(t, typed), _table(t), k, sql.Literal(keys))
    d = {f[0]: f[1] for f in copy_lines(donor, q, counter, "donor")}
    j = {f[0]: f[1] for f in copy_lines(joiner, q, counter, "joiner")}
    seen = d.keys() | j.keys()
    if len(seen) < SAMPLE_ROWS // 10:
        return None
    return sum(1 for key in seen if d.get(key) != j.get(key)) / len(seen), len(seen)


def leaf_size(drift: float, sampled: int) -> int:
    """Rows per leaf for a table whose rows differ at about ``drift``: a leaf costs a group and a
    summary on each side, a row in a differing leaf is hashed about three times at the rows level
    (about 1.5 leaves' worth, measured on pgbench_accounts), so the total is least near
    sqrt(1 / (1.5 drift)) rows a leaf (8 to 64)."""
    p = max(drift, 0.5 / max(1, sampled))
    return max(8, min(64, round(math.sqrt(1.0 / (1.5 * p)))))


# ---- leaves and ranges -----------------------------------------------------------------------------

LEAVES = "chorus_leaves"  # this side's leaves (temporary, per session)
DONOR_LEAVES = "chorus_donor_leaves"  # the donor's, copied into the joiner's session
DONOR_ROWS = "chorus_donor_rows"  # the donor's keys and row hashes of a task's leaves, likewise
MINE = "chorus_joiner_rows"  # the joiner's keys and row hashes of a task's leaves


def build_leaves(conn: psycopg.Connection[Any], t: Table, cut: Cut) -> None:
    """One scan: this side's leaves into a temporary table of its session."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS pg_temp.{}").format(sql.Identifier(LEAVES)))
    conn.execute(sql.SQL("CREATE TEMP TABLE {} AS SELECT {} AS b, count(*) AS n, bit_xor({}) AS h "
                         "FROM {} t GROUP BY 1").format(sql.Identifier(LEAVES), cut.leaf_of(_first_key(t), _whole_key(t)),
                                                        row_hash(t, cut.typed), _table(t)))


def _summaries(conn: psycopg.Connection[Any], q: sql.Composable, counter: Counter, side: str) -> dict[int, tuple[str, str]]:
    return {int(f[0]): (f[1], f[2]) for f in copy_lines(conn, q, counter, side)}


def differing(a: dict[int, tuple[str, str]], b: dict[int, tuple[str, str]]) -> list[int]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def differing_leaves(donor: psycopg.Connection[Any], joiner: psycopg.Connection[Any], counter: Counter,
                     both: Any, fanout: int = FANOUT) -> tuple[int, int, list[int], int]:
    """Ranges (their summaries compared here), then the leaves of the ranges that differ: the
    donor's are copied into the joiner's session and compared there. Returns (ranges, ranges
    differing, leaves differing, leaves in all). ``both(fn)`` runs fn(side) for the two sides
    at once."""
    ranges_q = sql.SQL("SELECT b / {0}, sum(n), bit_xor(h) FROM {1} GROUP BY 1").format(
        sql.Literal(fanout), sql.Identifier(LEAVES))
    rd, rj = both(lambda c, side: _summaries(c, ranges_q, counter, side))
    ranges = differing(rd, rj)
    if not ranges:
        return len(rd.keys() | rj.keys()), 0, [], 0
    under = sql.SQL("b / {} = ANY({}::bigint[])").format(sql.Literal(fanout), sql.Literal(ranges))
    # the donor's leaves into the joiner's session, in blocks of text made by the donor (a row at
    # a time through Python would cost more than the comparison)
    joiner.execute(sql.SQL("DROP TABLE IF EXISTS pg_temp.{}").format(sql.Identifier(DONOR_LEAVES)))
    joiner.execute(sql.SQL("CREATE TEMP TABLE {} (b bigint, n bigint, h bigint)").format(sql.Identifier(DONOR_LEAVES)))
    blocks = donor.execute(sql.SQL("SELECT string_agg(concat_ws(E'\\t', b, n, h), E'\\n') || E'\\n' FROM {} "
                                   "WHERE {} GROUP BY b / 65536").format(sql.Identifier(LEAVES), under))
    with joiner.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(DONOR_LEAVES))) as cp:
        for (block,) in blocks:
            data = block.encode()
            counter.add("donor", len(data))
            cp.write(data)
    joiner.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(DONOR_LEAVES)))
    rows = joiner.execute(sql.SQL(
        "SELECT coalesce(d.b, j.b) FROM {} d FULL JOIN (SELECT * FROM {} WHERE {}) j ON d.b = j.b "
        "WHERE (d.n, d.h) IS DISTINCT FROM (j.n, j.h) ORDER BY 1").format(
        sql.Identifier(DONOR_LEAVES), sql.Identifier(LEAVES), under)).fetchall()
    total = int(donor.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(LEAVES))).fetchone()[0])  # type: ignore[index]
    return len(rd.keys() | rj.keys()), len(ranges), [int(r[0]) for r in rows], total


def intervals(leaves: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted leaf ids -> [lo, hi) runs of consecutive leaves."""
    out: list[tuple[int, int]] = []
    for b in leaves:
        if out and out[-1][1] == b:
            out[-1] = (out[-1][0], b + 1)
        else:
            out.append((b, b + 1))
    return out


# ---- rows ------------------------------------------------------------------------------------------

def _in_leaves(t: Table, cut: Cut, part: dict[str, Any], select: sql.Composable,
               where: Optional[sql.Composable] = None) -> sql.Composable:
    """``SELECT select FROM t`` for the rows of a task's leaves: key intervals (``spans``), or
    with a hashed cut leaf ids (``leaves``: a scan that keeps their rows)."""
    if cut.hashed:
        extra = sql.SQL(" AND {}").format(where) if where is not None else sql.SQL("")
        return sql.SQL("SELECT {} FROM {} t WHERE {} = ANY({}::bigint[]){}").format(
            select, _table(t), cut.leaf_of(_first_key(t), _whole_key(t)), sql.Literal(part["leaves"]), extra)
    return _in_intervals(t, cut, [(s[0], s[1]) for s in part["spans"]], select, where)


def _in_intervals(t: Table, cut: Cut, spans: Sequence[tuple[Optional[str], Optional[str]]],
                  select: sql.Composable, where: Optional[sql.Composable] = None) -> sql.Composable:
    """``SELECT select FROM t`` for the rows whose first key lies in one of ``spans`` ([lo, hi),
    None an open end): closed intervals through an index range scan each (a join with the
    interval list), the open-ended ones as their own branches."""
    k = _first_key(t)
    ty = sql.SQL(cut.key_type)
    extra = sql.SQL(" AND {}").format(where) if where is not None else sql.SQL("")
    closed = [(lo, hi) for lo, hi in spans if lo is not None and hi is not None]
    parts: list[sql.Composable] = []
    if closed:
        parts.append(sql.SQL("SELECT {} FROM unnest({}::text[]::{}[], {}::text[]::{}[]) AS r(lo, hi) "
                             "JOIN {} t ON {} >= r.lo AND {} < r.hi{}").format(
            select, sql.Literal([lo for lo, _ in closed]), ty, sql.Literal([hi for _, hi in closed]), ty,
            _table(t), k, k, extra))
    for lo, hi in spans:
        if lo is not None and hi is not None:
            continue
        conds: list[sql.Composable] = [sql.SQL("true")]
        if lo is not None:
            conds.append(sql.SQL("{} >= {}::{}").format(k, sql.Literal(lo), ty))
        if hi is not None:
            conds.append(sql.SQL("{} < {}::{}").format(k, sql.Literal(hi), ty))
        parts.append(sql.SQL("SELECT {} FROM {} t WHERE {}{}").format(
            select, _table(t), sql.SQL(" AND ").join(conds), extra))
    return sql.SQL(" UNION ALL ").join(parts)


def _keys_and_hash(t: Table, cut: Cut) -> sql.Composable:
    return sql.SQL("{}, {}").format(
        sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(k)) for k in t.key), row_hash(t, cut.typed))


def diff_rows(joiner: psycopg.Connection[Any], t: Table, cut: Cut,
              part: dict[str, Any], counter: Counter, stage: Optional[str], donor_dsn: str,
              snapshot: Optional[str]) -> dict[str, Any]:
    """The rows level for a task's leaves (``part``), compared in the joiner's session: the
    donor's keys and row hashes there are copied into it (through psql, at the snapshot) and
    joined with the joiner's own. With a ``stage`` (recover) the keys only the joiner has go into
    the stage (op D), and the donor's rows that the joiner lacks or holds otherwise are copied
    from the donor into it (op U). Returns the counts and up to SAMPLE_KEYS keys of each kind."""
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in t.key)  # (the hash column is _chorus_h: a key may be "h")
    match = sql.SQL(" AND ").join(sql.SQL("d.{0} = m.{0}").format(sql.Identifier(k)) for k in t.key)
    joiner.execute(sql.SQL("DROP TABLE IF EXISTS pg_temp.{}").format(sql.Identifier(DONOR_ROWS)))
    joiner.execute(sql.SQL("CREATE TEMP TABLE {} AS SELECT {}, 0::bigint AS _chorus_h FROM {} t WITH NO DATA").format(
        sql.Identifier(DONOR_ROWS), _whole_key(t), _table(t)))
    with joiner.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(DONOR_ROWS))) as cp:
        for data in stream_out(donor_dsn, snapshot, _in_leaves(t, cut, part, _keys_and_hash(t, cut)), joiner, counter):
            cp.write(data)
    joiner.execute(sql.SQL("DROP TABLE IF EXISTS pg_temp.{}").format(sql.Identifier(MINE)))
    joiner.execute(sql.SQL("CREATE TEMP TABLE {} AS {}").format(
        sql.Identifier(MINE), _in_leaves(t, cut, part, sql.SQL("{}, {} AS _chorus_h").format(_whole_key(t), row_hash(t, cut.typed)))))
    for temp in (DONOR_ROWS, MINE):
        joiner.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(temp)))
    # donor rows the joiner lacks (m is NULL) or holds otherwise
    changed = joiner.execute(sql.SQL(
        "SELECT d._chorus_h, m._chorus_h IS NULL FROM {} d LEFT JOIN {} m ON {} "
        "WHERE m._chorus_h IS DISTINCT FROM d._chorus_h").format(
        sql.Identifier(DONOR_ROWS), sql.Identifier(MINE), match)).fetchall()
    only_mine = sql.SQL("FROM {} m WHERE NOT EXISTS (SELECT 1 FROM {} d WHERE {})").format(
        sql.Identifier(MINE), sql.Identifier(DONOR_ROWS), match)

    def sample(q: sql.Composed) -> list[list[str]]:
        return [[str(v) for v in r] for r in joiner.execute(q).fetchall()]

    def text(alias: str) -> sql.Composed:
        return sql.SQL(", ").join(sql.SQL("{}.{}::text").format(sql.Identifier(alias), sql.Identifier(k))
                                  for k in t.key)

    def pair(join: str) -> sql.Composed:
        return sql.SQL("FROM {} d " + join + " {} m ON {}").format(sql.Identifier(DONOR_ROWS), sql.Identifier(MINE),
                                                                  match)

    limit = sql.SQL("ORDER BY 1 LIMIT {}").format(sql.Literal(SAMPLE_KEYS))
    out: dict[str, Any] = {
        "inserts": sum(1 for _, new in changed if new), "updates": sum(1 for _, new in changed if not new),
        "sample": {
            "missing": sample(sql.SQL("SELECT {} {} WHERE m._chorus_h IS NULL {}").format(
                text("d"), pair("LEFT JOIN"), limit)),
            "differs": sample(sql.SQL("SELECT {} {} WHERE m._chorus_h <> d._chorus_h {}").format(
                text("d"), pair("JOIN"), limit)),
            "extra": sample(sql.SQL("SELECT {} {} {}").format(text("m"), only_mine, limit))}}
    if stage is None:
        row = joiner.execute(sql.SQL("SELECT count(*) {}").format(only_mine)).fetchone()
        out["deletes"] = int(row[0]) if row else 0
        return out
    out["deletes"] = joiner.execute(sql.SQL("INSERT INTO {} ({}, _chorus_op) SELECT {}, 'D' {}").format(
        sql.SQL(stage), keys, sql.SQL(", ").join(sql.SQL("m.{}").format(sql.Identifier(k)) for k in t.key),
        only_mine)).rowcount
    if changed:
        cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in t.stored)
        sel = sql.SQL("{}, 'U'").format(sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c.name))
                                                            for c in t.stored))
        rows_q = _in_leaves(t, cut, part, sel, sql.SQL("{} = ANY({}::bigint[])").format(
            row_hash(t, cut.typed), sql.Literal([h for h, _ in changed])))
        with joiner.cursor().copy(sql.SQL("COPY {} ({}, _chorus_op) FROM STDIN").format(sql.SQL(stage), cols)) as cp:
            for data in stream_out(donor_dsn, snapshot, rows_q, joiner, counter):
                cp.write(data)
    return out


# ---- tasks: the rows level, where the executors run it -----------------------------------------------

def make_tasks(table: dict[str, Any], cut: Cut, leaves: Sequence[int], at_least: int = 2) -> list[dict[str, Any]]:
    """The rows level's tasks: groups of leaf intervals (or of hashed leaves), at least
    ``at_least`` of them when there are that many leaves (so that every executor has one)."""
    step = max(1, min(MAX_INTERVALS_PER_TASK, TASK_ROWS // cut.leaf_rows, math.ceil(len(leaves) / max(1, at_least))))
    if cut.hashed:
        return [{"table": table, "cut": cut.to_dict(), "leaves": list(leaves[i:i + step]), "spans": [],
                 "nleaves": len(leaves[i:i + step])} for i in range(0, len(leaves), step)]
    runs = intervals(leaves)
    groups: list[list[tuple[int, int]]] = [[]]
    held = 0
    for run in runs:  # up to `step` leaves (and MAX_INTERVALS_PER_TASK intervals) a task
        if groups[-1] and (held + run[1] - run[0] > step or len(groups[-1]) >= MAX_INTERVALS_PER_TASK):
            groups.append([])
            held = 0
        groups[-1].append(run)
        held += run[1] - run[0]
    return [{"table": table, "cut": cut.to_dict(), "spans": [cut.interval(lo, hi) for lo, hi in group],
             "nleaves": sum(hi - lo for lo, hi in group)} for group in groups if group]


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """One task (a table's group of leaf intervals), in its own joiner session writing the staging
    table (committed when the task ends), or for verify (no stage) at the other node's snapshot;
    the donor's side is read at the exported snapshot by psql streams."""
    t = Table.from_dict(task["table"])
    counter = Counter()
    joiner = open_session(task["joiner_dsn"], task.get("joiner_snapshot"), options=OFF if task.get("stage") else None)
    try:  # (the donor is read by psql streams at the snapshot: diff_rows)
        out = diff_rows(joiner, t, Cut.from_dict(task["cut"]), task, counter, task.get("stage"),
                        task["donor_dsn"], task["snapshot"])
        joiner.execute("COMMIT")
    finally:
        close_session(joiner)
    out.update(table=t.label, node=task.get("node"), bytes_donor=counter.donor, bytes_joiner=counter.joiner,
               spans=len(task["spans"]) + len(task.get("leaves", [])))
    return out


def analyse(donor_dsn: str, snapshot: Optional[str], joiner_dsn: str, table: dict[str, Any], rows: int,
            size: int, small_bytes: int, joiner_snapshot: Optional[str] = None, may_copy: bool = True,
            range_rows: int = FANOUT * LEAF_ROWS) -> dict[str, Any]:
    """Copy or diff, for one table: a table under ``small_bytes`` is copied; a larger one is
    sampled, and copied if most of its leaves would differ; otherwise both sides build their
    leaves and compare ranges, then leaves, and the table is copied if most leaves differ after
    all. Returns the decision and its figures, and for a diff the tasks of the rows level.
    Verify compares two nodes at their snapshots and never copies (``may_copy`` false). A range
    holds about ``range_rows`` rows; a leaf 4 to 64 (leaf_size)."""
    t = Table.from_dict(table)
    counter = Counter()
    out: dict[str, Any] = {"table": t.label, "bytes": size, "rows": rows}
    if may_copy and size < small_bytes:
        return {**out, "mode": "copy", "why": f"small ({size / 1e6:.1f} MB)", "bytes_donor": 0}
    d = open_session(donor_dsn, snapshot)
    j = open_session(joiner_dsn, joiner_snapshot, options=None if joiner_snapshot else OFF)
    try:
        typed = exact_hashes(d, t)
        drift, sampled = sample_drift(d, j, t, rows, counter, typed)
        out.update(sampled=sampled, sample_drift=round(drift, 5))
        if may_copy and drift > COPY_DRIFT:
            return {**out, "mode": "copy", "why": f"a sample of {sampled} rows says {drift:.1%} of its rows differ",
                    "bytes_donor": counter.donor, "bytes_joiner": counter.joiner}
        cut = make_cut(d, j, t, rows, counter, leaf_size(drift, sampled), typed)
        with ThreadPoolExecutor(2) as pool:  # both sides scan at once
            list(pool.map(lambda c: build_leaves(c, t, cut), (d, j)))

            def both(fn: Callable[[Any, str], Any]) -> list[Any]:
                return list(pool.map(fn, (d, j), ("donor", "joiner")))

            nranges, rdiff, leaves, nleaves = differing_leaves(d, j, counter, both,
                                                               max(2, round(range_rows / cut.leaf_rows)))
        out.update(ranges=nranges, ranges_differing=rdiff, leaves=nleaves, leaves_differing=len(leaves),
                   leaf_rows=cut.leaf_rows, typed_hash=cut.typed, bytes_donor=counter.donor,
                   bytes_joiner=counter.joiner)
        # the rows' drift as the leaves tell it: a leaf of L rows differs with probability 1 - (1 - p)^L
        share = len(leaves) / nleaves if nleaves else 0.0
        if may_copy and (share > COPY_SHARE or 1.0 - (1.0 - share) ** (1.0 / cut.leaf_rows) > COPY_DRIFT):
            return {**out, "mode": "copy", "why": f"{share:.0%} of its leaves of {cut.leaf_rows} rows differ"}
        return {**out, "mode": "diff", "tasks": make_tasks(table, cut, leaves, os.cpu_count() or 2)}
    finally:
        close_session(d)
        close_session(j)


_INDEXES = """
SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid), c.conname, pg_get_constraintdef(c.oid),
       i.indisclustered OR i.indisreplident OR x.reltablespace <> 0
       OR obj_description(i.indexrelid, 'pg_class') IS NOT NULL
       OR (c.oid IS NOT NULL AND obj_description(c.oid, 'pg_constraint') IS NOT NULL)
       OR EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid OR h.inhparent = i.indexrelid)
       OR EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = i.indexrelid AND a.attstattarget > 0)
  FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid
  LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid AND c.contype IN ('p', 'u', 'x')
 WHERE i.indrelid = %s::regclass
"""


def _drop_indexes(conn: psycopg.Connection[Any], t: Table) -> list[Union[sql.SQL, sql.Composed]]:
    """Drop the table's indexes (and the constraints they serve) for a bulk load, if that can be
    undone exactly: not when one is clustered, the replica identity, in its own tablespace,
    commented, attached to a partitioned index or given statistics targets. Returns the
    statements that build them again (the same definitions and names), or nothing."""
    found = conn.execute(_INDEXES, (t.qualified,)).fetchall()
    if not found or any(r[4] for r in found):
        return []
    again: list[Union[sql.SQL, sql.Composed]] = []
    for index, indexdef, conname, condef, _ in found:
        if conname is not None:
            conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(_table(t), sql.Identifier(conname)))
            again.append(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(_table(t), sql.Identifier(conname),
                                                                             sql.SQL(condef)))
        else:
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.SQL(index)))
            again.append(sql.SQL(indexdef))
    return again


def checks_off(conn: psycopg.Connection[Any], table: sql.Composable) -> list[sql.Composed]:
    """Take the table's own CHECK constraints away for the rest of the transaction; returns the
    statements that put them back exactly (name, definition, validated or not) without checking
    a row. The donor's rows passed them already: loading them must not run the constraints'
    code again on the joiner, where a role's CHECK could behave differently and stop the
    rebuild (docs/SECURITY.md). Inherited ones stay (a partition cannot drop its parent's)."""
    rows = conn.execute(
        sql.SQL("SELECT c.conname, pg_catalog.pg_get_constraintdef(c.oid), c.convalidated "
                "FROM pg_catalog.pg_constraint c WHERE c.conrelid = {}::pg_catalog.regclass "
                "AND c.contype = 'c' AND c.coninhcount = 0 ORDER BY c.conname").format(
            sql.Literal(table.as_string(conn)))).fetchall()
    again: list[sql.Composed] = []
    for name, definition, valid in rows:
        if definition.endswith(" NOT VALID"):
            definition = definition[:-len(" NOT VALID")]
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(table, sql.Identifier(name)))
        again.append(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {} NOT VALID").format(
            table, sql.Identifier(name), sql.SQL(definition)))
        if valid:
            again.append(sql.SQL("UPDATE pg_catalog.pg_constraint SET convalidated = true "
                                 "WHERE conrelid = {}::pg_catalog.regclass AND conname = {}").format(
                sql.Literal(table.as_string(conn)), sql.Literal(name)))
    return again


def copy_table(task: dict[str, Any]) -> dict[str, Any]:
    """Replace a table's rows on the joiner with the donor's at the snapshot, streamed with COPY
    in one transaction: TRUNCATE and COPY FREEZE where nothing references the table (its indexes
    dropped first and built again after, as pg_restore does, when that can be undone exactly),
    DELETE where a foreign key does. Triggers and foreign-key checks do not fire (replica role,
    and the capture trigger, which fires always, is off for the transaction), nor CHECK
    constraints (checks_off)."""
    t = Table.from_dict(task["table"])
    counter = Counter()
    cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in t.stored)
    with psycopg.connect(task["joiner_dsn"], options=OFF) as joiner:
        joiner.execute("SET LOCAL session_replication_role = replica")
        joiner.execute("SET LOCAL maintenance_work_mem = '256MB'")
        row = joiner.execute("SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE confrelid = %s::regclass "
                             "AND contype = 'f'), (SELECT relkind = 'r' FROM pg_class WHERE oid = %s::regclass), "
                             "EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname = %s)",
                             (t.qualified, t.qualified, t.qualified, CAPTURE_TRIGGER)).fetchone()
        referenced, plain, captured = bool(row and row[0]), bool(row and row[1]), bool(row and row[2])
        joiner.execute(sql.SQL("{} {}").format(sql.SQL("DELETE FROM" if referenced else "TRUNCATE"), _table(t)))
        rebuild = _drop_indexes(joiner, t) if plain and not referenced and task.get("bytes", 0) >= REBUILD_BYTES else []
        rebuild += checks_off(joiner, _table(t))
        if captured:
            joiner.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER {}").format(_table(t), sql.Identifier(CAPTURE_TRIGGER)))
        freeze = sql.SQL(" (FREEZE)") if plain and not referenced else sql.SQL("")
        with joiner.cursor() as cur:
            with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN{}").format(_table(t), cols, freeze)) as dst:
                for data in stream_out(task["donor_dsn"], task["snapshot"], sql.SQL("{} ({})").format(_table(t), cols),
                                       joiner, counter, table=True):
                    dst.write(data)
            rows = cur.rowcount
        for stmt in rebuild:
            joiner.execute(stmt)
        if captured:
            joiner.execute(sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}").format(
                _table(t), sql.Identifier(CAPTURE_TRIGGER)))
    return {"table": t.label, "copied": rows, "bytes_donor": counter.donor, "indexes_rebuilt": len(rebuild)}
