"""Re-instantiation of a link (docs/LINKS.md section 10), the parts without I/O: the copy's
batches, what the receiving site's apply of one commits, and the SQL both ends read with.

The sending site copies the rows its link carries as of one of its GIDs, G (its log pinned at
G first), table by table, each table's rows in the order of its key columns' text compared
bytewise (``COLLATE "C"``, which is Python's order of bytes), through the link's rules, in
batches (link/proto.py: RECORD frames of GID G). A batch covers a *range* of keys: from the key
after the previous batch's last (or the start) to its own last key (or, for the table's closing
batch without rows, the end). The receiving site makes each range of its table equal to the
batch: rows of the batch absent here are inserted, rows that differ updated, rows here that the
batch lacks deleted. So the ranges cover every key, and a row is judged where it falls, whatever
was here.

Each batch goes through the receiving site's total order as a link writeset (bus message ``K``)
marked by :data:`COPY_TABLE` (a table no row of a real writeset uses, as link/settle.py marks a
realignment), which every node applies at its GID: it reads the range's rows in the apply's
transaction (the same on every node at that GID), and commits :meth:`CopyPlan.final`: the
inserts, updates and deletes, the stamps the realigned rows had turned to the peer's (section 5),
and one ``chorus.link_exceptions`` row for each row this site had changed that the peer had not
seen (its stamp this site's, at or above ``max_replicated``) and the copy overwrote or deleted.
The last link writeset of the copy (:attr:`Batch.final`) moves the link's row of
``chorus.link_position`` to G. Until then the position is where it was, so an interrupted copy is
started again from the beginning: every batch is idempotent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from chorus import wire
from chorus.bus.proto import LinkWriteset
from chorus.link import position as lp
from chorus.link.events import Stamp, row_key
from chorus.link.settle import EXCEPTIONS_TABLE, STAMP_TABLE, row_json, stamp_hash

COPY_TABLE = wire.Table(
    "chorus", "link_copy",
    (wire.Column("snapshot_gid", "int8"), wire.Column("lower", "text"), wire.Column("upper", "text"),
     wire.Column("final", "bool"), wire.Column("both", "bool")),
    (0,))

BATCH_ROWS = 500  # rows of one table in one batch at most (and BATCH_BYTES of values)
BATCH_BYTES = 1 << 20
POLICY = b"reinstantiate"
DETECTION = b"copy"

KeyValues = tuple[bytes, ...]


class CopyError(ValueError):
    """A copy batch that is not one (the link writeset then fails its apply with the reason)."""


def unsettled_both_ways(policy: str, table_policy: Mapping[str, str]) -> list[str]:
    """Why a copy of a link both ways could leave the two sites different: the policies other
    than ``primary-wins`` it settles tables by (``policy`` for every table not in
    ``table_policy``). A row both sites changed while the link was broken reaches the peer as a
    conflict, but this site sees the peer's version only in the copy, never as a change to settle;
    only the arbiter of ``primary-wins`` realigns it afterwards (docs/LINKS.md section 10.1).
    Empty: a copy is safe."""
    out = [] if policy == "primary-wins" else [f"policy {policy}"]
    out += [f"{t}: {p}" for t, p in sorted(table_policy.items()) if p != "primary-wins"]
    return out


class BothWays(CopyError):
    """A copy of a link both ways refused: it could leave the two sites different."""


def refuse_both_ways(link: str, policy: str, table_policy: Mapping[str, str]) -> None:
    """Raise :class:`BothWays` where a copy of ``link``, which goes both ways, is not safe
    (:func:`unsettled_both_ways`), saying how to make it so."""
    unsettled = unsettled_both_ways(policy, table_policy)
    if unsettled:
        raise BothWays(
            f"link {link} goes both ways and settles conflicts by {'; '.join(unsettled)}: a row both sites "
            "changed while it was broken could stay different on the two sites after a copy. Refused: set "
            "policy = \"primary-wins\" (and primary, table_policy) on every node of both sites for the copy, "
            "run it, then set the policies back")


@dataclass(frozen=True)
class Batch:
    """One range of one table as of the peer's GID ``gid``: ``rows`` (new images, in key order)
    are every row of the peer's in ``(lower, upper]`` (None: from the start, to the end). A
    ``final`` batch has no table: it ends the copy (the link's position moves to ``gid``)."""

    gid: int
    table: Optional[wire.Table]
    rows: tuple[tuple[wire.Value, ...], ...]
    lower: Optional[KeyValues]
    upper: Optional[KeyValues]
    final: bool = False
    both: bool = False  # the peer receives this link too: this site's changes it had not applied are on their way


def key_of(table: wire.Table, values: Sequence[wire.Value]) -> KeyValues:
    """A row's key values (its identity columns' text)."""
    out = []
    for i in table.identity:
        v = values[i]
        if v is None or isinstance(v, (wire.Binary, wire.Unchanged)):
            raise CopyError(f"{table.qualified}: a copied row's key column {table.columns[i].name} is not text")
        out.append(bytes(v))
    return tuple(out)


def _bound(k: Optional[KeyValues]) -> Optional[bytes]:
    return None if k is None else json.dumps([v.hex() for v in k]).encode("ascii")


def _unbound(v: wire.Value, width: int) -> Optional[KeyValues]:
    if v is None:
        return None
    try:
        parts = json.loads(bytes(v))
        out = tuple(bytes.fromhex(p) for p in parts)
    except (ValueError, TypeError) as e:
        raise CopyError(f"a copy batch's key bound is malformed: {e}") from None
    if len(out) != width:
        raise CopyError(f"a copy batch's key bound has {len(out)} values for a key of {width}")
    return out


def encode(b: Batch, link: str) -> wire.Writeset:
    """The writeset of link writeset message ``K`` that carries batch ``b``: the table's rows as
    INSERTs, then the mark (:data:`COPY_TABLE`, one row: the GID, the bounds, final), and the
    keys it is certified with: the whole table (it may change any row of it) and the link's row
    (so the link's writesets are applied one after another)."""
    tables: list[wire.Table] = []
    rows: list[wire.Item] = []
    keys = [lp.position_key(link)]
    if b.table is not None:
        tables.append(b.table)
        rows += [wire.Row(wire.OP_INSERT, 0, (), r) for r in b.rows]
        keys.insert(0, wire.Key(wire.KeyMode.EXCLUSIVE, (wire.name_bytes(b.table.nspname),
                                                         wire.name_bytes(b.table.relname))))
    tables.append(COPY_TABLE)
    rows.append(wire.Row(wire.OP_INSERT, len(tables) - 1, (), (b"%d" % b.gid, _bound(b.lower), _bound(b.upper),
                                                                b"t" if b.final else b"f", b"t" if b.both else b"f")))
    return wire.Writeset(0, 0, 0, tuple(tables), tuple(rows), tuple(keys))


def is_copy(ws: wire.Writeset) -> bool:
    return any((t.nspname, t.relname) == (COPY_TABLE.nspname, COPY_TABLE.relname) for t in ws.tables)


def decode(ws: wire.Writeset) -> Batch:
    """The batch a marked writeset carries (:func:`encode`); :class:`CopyError` if malformed."""
    n = len(ws.tables) - 1
    if n not in (0, 1) or (ws.tables[n].nspname, ws.tables[n].relname) != (COPY_TABLE.nspname, COPY_TABLE.relname):
        raise CopyError("a copy batch has at most one table, then its mark")
    marks = [r for r in ws.rows if isinstance(r, wire.Row) and r.table == n]
    data = [r for r in ws.rows if isinstance(r, wire.Row) and r.table != n]
    if len(marks) != 1 or len(marks[0].new) != 5 or len(data) + 1 != len(ws.rows) or ws.has_schema:
        raise CopyError("a copy batch has one mark row and INSERTs of its table only")
    if any(r.op != wire.OP_INSERT for r in data):
        raise CopyError("a copy batch's rows are INSERTs")
    gid_v, lower_v, upper_v, final_v, both_v = marks[0].new
    try:
        gid = int(bytes(gid_v or b""))
    except ValueError:
        raise CopyError("a copy batch without its snapshot GID") from None
    table = ws.tables[0] if n == 1 else None
    final = final_v == b"t"
    if final != (table is None) or (table is not None and (not table.identity or table.full_identity)):
        raise CopyError("a copy batch has a table with a key, or is the final one")
    width = len(table.identity) if table is not None else 0
    rows = tuple(r.new for r in data)
    batch = Batch(gid, table, rows, _unbound(lower_v, width), _unbound(upper_v, width), final, both_v == b"t")
    if table is not None:
        keys = [key_of(table, r) for r in rows]
        if any(a >= b for a, b in zip(keys, keys[1:])) or (keys and batch.lower is not None and keys[0] <= batch.lower):
            raise CopyError(f"{table.qualified}: a copy batch's rows are not in key order after its lower bound")
        if batch.upper is not None and (not keys or keys[-1] != batch.upper):
            raise CopyError(f"{table.qualified}: a copy batch's upper bound is not its last row's key")
    return batch


class Ranges:
    """The receiving end of the copy's stream: turns each writeset the sender sent (one table,
    INSERTs of a batch of its rows in key order; a table without rows: the table is complete)
    into a :class:`Batch` with its range, checking the order (a row not after the previous one of
    its table, or a table again after it was complete, is refused)."""

    def __init__(self, gid: int, both: bool = False) -> None:
        self.gid = gid
        self.both = both
        self.last: dict[tuple[str, str], Optional[KeyValues]] = {}
        self.done: set[tuple[str, str]] = set()
        self.rows = 0

    def take(self, ws: wire.Writeset) -> Batch:
        if len(ws.tables) != 1 or ws.has_schema or any(
                not isinstance(r, wire.Row) or r.op != wire.OP_INSERT or r.table != 0 for r in ws.rows):
            raise CopyError("a copy record holds INSERTs of one table")
        table = ws.tables[0]
        if not table.identity or table.full_identity:
            raise CopyError(f"{table.qualified}: a copied table needs a primary key")
        name = (table.nspname, table.relname)
        if name in self.done:
            raise CopyError(f"{table.qualified}: copied again after it was complete")
        lower = self.last.get(name)
        rows = tuple(r.new for r in ws.rows if isinstance(r, wire.Row))
        if not rows:
            self.done.add(name)
            return Batch(self.gid, table, (), lower, None, both=self.both)
        keys = [key_of(table, r) for r in rows]
        if any(a >= b for a, b in zip(keys, keys[1:])) or (lower is not None and keys[0] <= lower):
            raise CopyError(f"{table.qualified}: copied rows not in the order of their keys")
        self.last[name] = keys[-1]
        self.rows += len(rows)
        return Batch(self.gid, table, rows, lower, keys[-1], both=self.both)


# ---- SQL --------------------------------------------------------------------------------------

def _key_exprs(table: wire.Table) -> list[str]:
    return [f'({wire.text_of(wire.quote_ident(table.columns[i].name))}) COLLATE pg_catalog."C"' for i in table.identity]


def range_sql(table: wire.Table, lower: Optional[KeyValues], upper: Optional[KeyValues]) -> tuple[str, list[str]]:
    """The rows of ``table`` in ``(lower, upper]`` in key order, each value's text under the
    apply's settings (as :func:`chorus.link.settle.row_sql`), and the parameters. Every name is
    quoted and every operator and type qualified: nothing here can be redirected by search_path."""
    cols = ", ".join(wire.text_of(wire.quote_ident(c.name)) for c in table.columns)
    keys = _key_exprs(table)
    row = f"ROW({', '.join(keys)})"
    holes = f"ROW({', '.join(['%s::pg_catalog.text'] * len(keys))})"
    where: list[str] = []
    params: list[str] = []
    if lower is not None:
        where.append(f"{row} OPERATOR(pg_catalog.>) {holes}")
        params += [v.decode("utf-8", "surrogateescape") for v in lower]
    if upper is not None:
        where.append(f"{row} OPERATOR(pg_catalog.<=) {holes}")
        params += [v.decode("utf-8", "surrogateescape") for v in upper]
    cond = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {cols} FROM ONLY {table.qualified}{cond} ORDER BY {', '.join(keys)}", params


def snapshot_sql(table: wire.Table) -> str:
    """The sending site's rows of ``table`` in key order (the copy's cursor)."""
    return range_sql(table, None, None)[0]


# the sending site's tables a copy considers: ordinary and partitioned tables (a partition is
# copied through its parent when it has one), outside the system's and the extension's schemas,
# with their columns that hold data, their primary keys (identity: the key's columns, by number)
# and their owners (each table is read as its owner: a cast to text of a type its owner chose runs
# with the owner's rights, not the coordinator's)
TABLES_SQL = """
SELECT n.nspname::pg_catalog.text, c.relname::pg_catalog.text, c.oid::pg_catalog.int8,
       (SELECT pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
         WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.>) 0
           AND NOT a.attisdropped AND a.attgenerated OPERATOR(pg_catalog.=) ''),
       (SELECT pg_catalog.array_agg(pg_catalog.format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum)
          FROM pg_catalog.pg_attribute a
         WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.>) 0
           AND NOT a.attisdropped AND a.attgenerated OPERATOR(pg_catalog.=) ''),
       (SELECT pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY k.i)
          FROM pg_catalog.pg_index x, pg_catalog.unnest(x.indkey) WITH ORDINALITY AS k(attnum, i),
               pg_catalog.pg_attribute a
         WHERE x.indrelid OPERATOR(pg_catalog.=) c.oid AND x.indisprimary
           AND a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.=) k.attnum),
       pg_catalog.pg_get_userbyid(c.relowner)::pg_catalog.text
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
 WHERE c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'p']::pg_catalog."char"[]) AND NOT c.relispartition
   AND n.nspname OPERATOR(pg_catalog.<>) ALL (ARRAY['pg_catalog', 'information_schema', 'chorus',
                                                    'chorus_recovery', 'pg_toast'])
   AND n.nspname::pg_catalog.text NOT LIKE 'pg\\_temp\\_%' AND n.nspname::pg_catalog.text NOT LIKE 'pg\\_toast\\_temp\\_%'
 ORDER BY 1, 2
"""


def table_of(schema: str, name: str, columns: Sequence[str], types: Sequence[str],
             key: Optional[Sequence[str]]) -> Optional[wire.Table]:
    """A table as :data:`TABLES_SQL` describes it (None: it has no primary key, and a copy can
    tell its rows apart by no key)."""
    if not key or any(k not in columns for k in key):
        return None
    return wire.Table(schema, name, tuple(wire.Column(c, t) for c, t in zip(columns, types)),
                      tuple(list(columns).index(k) for k in key))


# ---- the receiving site's apply ----------------------------------------------------------------

@dataclass
class CopyPlan:
    """What the apply of copy batch ``batch`` (link writeset ``step``) commits at this site's GID
    ``gid``, given the link's row ``current`` (link/position.py), the range's rows here (read with
    :func:`range_sql`, in key order) and the stamps of the rows it changes (``STAMP_SQL``)."""

    step: LinkWriteset
    batch: Batch
    current: Optional[lp.PositionRow]
    gid: int
    site: str
    subset: bool = False  # the peer filters rows (the receiving site's ``subset``): rows it lacks stay here

    @property
    def max_replicated(self) -> int:
        """This site's clock values the peer had applied (reflected), with what the copy says:
        the peer had applied this site's GIDs up to ``max_replicated - 1`` as of the snapshot."""
        return max(self.step.max_replicated, self.current.max_replicated if self.current is not None else 0)

    def diff(self, local: Sequence[Sequence[object]]) -> list[tuple[KeyValues, Optional[tuple[wire.Value, ...]],
                                                                          Optional[tuple[wire.Value, ...]]]]:
        """The rows that differ, by key: (key, the row here or None, the copy's or None)."""
        table = self.batch.table
        if table is None:
            return []
        here: dict[KeyValues, tuple[wire.Value, ...]] = {}
        for r in local:
            values: tuple[wire.Value, ...] = tuple(None if v is None else str(v).encode("utf-8", "surrogateescape")
                                                   for v in r)
            if len(values) != len(table.columns):
                raise CopyError(f"{table.qualified}: {len(values)} values read for {len(table.columns)} columns")
            here[key_of(table, values)] = values
        out: list[tuple[KeyValues, Optional[tuple[wire.Value, ...]], Optional[tuple[wire.Value, ...]]]] = []
        for r in self.batch.rows:
            k = key_of(table, r)
            mine = here.pop(k, None)
            if mine != tuple(r):
                out.append((k, mine, tuple(r)))
        if not self.subset:
            out += [(k, mine, None) for k, mine in here.items()]
        return out

    def stamp_keys(self, changes: Sequence[tuple[KeyValues, object, object]]) -> list[bytes]:
        """The stamp keys of the rows that change (read with STAMP_SQL)."""
        table = self.batch.table
        return [] if table is None else [self._stamp_key(k) for k, _m, _c in changes]

    def _stamp_key(self, k: KeyValues) -> bytes:
        table = self.batch.table
        assert table is not None
        values: list[wire.Value] = [None] * len(table.columns)
        for i, v in zip(table.identity, k):
            values[i] = v
        return stamp_hash(row_key(table, wire.Row(wire.OP_INSERT, 0, (), tuple(values))).parts)

    def final(self, changes: Sequence[tuple[KeyValues, Optional[tuple[wire.Value, ...]], Optional[tuple[wire.Value, ...]]]],
              stamps: Sequence[Sequence[object]]) -> bytes:
        """The writeset every node commits: the range made the copy's, the changed rows' stamps
        turned to the peer's at the snapshot GID (a stamp of the peer's and none decide alike,
        section 5; none is written where there was none), an exception for each row of this
        site's changes the peer had not seen that the copy overwrote or deleted; for the final
        batch, the link's row at the snapshot GID."""
        read = {bytes(r[0]): Stamp(str(r[1]), int(r[2]), int(r[3])) for r in stamps}  # type: ignore[call-overload]
        mr = self.max_replicated
        tables: list[wire.Table] = []
        rows: list[wire.Item] = []
        keys: list[wire.Key] = []
        table = self.batch.table
        if table is not None:
            tables.append(table)
            stamped: list[tuple[bytes, KeyValues, Optional[tuple[wire.Value, ...]], Optional[tuple[wire.Value, ...]], bool]] = []
            for k, mine, theirs in changes:
                sk = self._stamp_key(k)
                st = read.get(sk)
                # (a row deleted here has its stamp too: a delete is a change)
                unseen = st is not None and st.site == self.site and st.clock >= mr
                if unseen and self.batch.both:
                    # this site's change the peer had not applied as of the snapshot is on its way
                    # there (the link goes both ways): it stays, and the peer settles it (section 10)
                    stamped.append((sk, k, mine, theirs, False))
                    continue
                if mine is None:
                    assert theirs is not None
                    rows.append(wire.Row(wire.OP_INSERT, 0, (), theirs))
                elif theirs is None:
                    rows.append(wire.Row(wire.OP_DELETE, 0, k))
                else:
                    rows.append(wire.Row(wire.OP_UPDATE, 0, k, theirs))
                if st is not None:
                    stamped.append((sk, k, mine, theirs, True))
            n = 0
            for sk, k, mine, theirs, took in stamped:
                st = read[sk]
                if took:
                    if STAMP_TABLE not in tables:
                        tables.append(STAMP_TABLE)
                    rows.append(wire.Row(wire.OP_UPDATE, tables.index(STAMP_TABLE), (_bytea(sk),),
                                         (_bytea(sk), self.step.peer_site.encode("utf-8"), b"%d" % self.batch.gid,
                                          lp.timestamp_text(0))))
                    keys.append(wire.Key(wire.KeyMode.UPDATE, (b"chorus", b"link_stamp", b"key", _bytea(sk))))
                if st.site == self.site and st.clock >= mr:
                    n += 1
                    if EXCEPTIONS_TABLE not in tables:
                        tables.append(EXCEPTIONS_TABLE)
                    rows.append(wire.Row(wire.OP_INSERT, tables.index(EXCEPTIONS_TABLE), (),
                                         self._exception(n, table, k, st, mine, theirs, mr, took)))
                    keys.append(wire.Key(wire.KeyMode.EXCLUSIVE, (b"chorus", b"link_exceptions", b"gid,n",
                                                                  b"%d" % self.gid, b"%d" % n)))
        keys.append(lp.position_key(self.step.link))
        if self.batch.final:
            clock = max(self.batch.gid + 1, self.current.peer_clock if self.current is not None else 0)
            moved = lp.PositionRow(self.step.link, self.step.peer_site, self.batch.gid, clock, mr, self.step.sent_at)
            tables.append(lp.POSITION_TABLE)
            t = len(tables) - 1
            rows.append(wire.Row(wire.OP_INSERT, t, (), lp.row_values(moved)) if self.current is None
                        else wire.Row(wire.OP_UPDATE, t, (self.step.link.encode("ascii"),), lp.row_values(moved)))
        return wire.encode(wire.Writeset(0, 0, 0, tuple(tables), tuple(rows), tuple(keys)))

    def _exception(self, n: int, table: wire.Table, k: KeyValues, st: Stamp, mine: Optional[tuple[wire.Value, ...]],
                   theirs: Optional[tuple[wire.Value, ...]], mr: int, took: bool) -> tuple[wire.Value, ...]:
        names = ", ".join(table.columns[i].name for i in table.identity)
        described = f"{table.qualified} ({names})=({', '.join(v.decode('utf-8', 'replace') for v in k)})"
        return (b"%d" % self.gid, b"%d" % n, self.step.link.encode("ascii"), table.qualified.encode("utf-8"),
                described.encode("utf-8"), st.site.encode("utf-8"), b"%d" % st.clock,
                lp.timestamp_text(st.commit_time), row_json(table, mine),
                self.step.peer_site.encode("utf-8"), b"%d" % self.batch.gid, lp.timestamp_text(0),
                row_json(table, theirs), b"%d" % mr, DETECTION, POLICY, b"took-remote" if took else b"kept-local",
                row_json(table, theirs if took else mine))


def _bytea(key: bytes) -> bytes:
    return b"\\x" + key.hex().encode("ascii")
