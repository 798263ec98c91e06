"""Conflicts in the apply of a link writeset, decided without I/O (docs/LINKS.md sections 5-7, 9).

The apply of a link writeset that follows its link's position (link/position.py,
:data:`~chorus.link.position.Decision.APPLY`) does not commit the peer's rows as they come: it
checks each against its row's stamp (``chorus.link_stamp``) and the link's window, settles the
rows in conflict by the table's policy, and commits what :class:`Settlement` makes of it:

- the peer's rows not in conflict, as they come;
- for a row in conflict, what the policy decided (the incoming change, a merged row, or nothing
  when the local version stands);
- the stamps of rows whose last change is now the peer's (or a merged row's winner): a stamp
  already there is updated, so a remote change closes the local window on the row; a row with no
  stamp gets none (no stamp and a stamp of the peer's decide alike);
- one row of ``chorus.link_exceptions`` per conflict, both versions and the decision;
- the link's row of ``chorus.link_position``, as before.

On the link's arbiter the rows whose own version stood (kept by the policy, or rejected with
their transaction) are stamped with this GID, and their exceptions are the realignment its
sender sends (:func:`realignment`, docs/LINKS.md section 7.1); on the other site a realignment
(marked by :data:`REALIGN_TABLE`) is settled row by row to the values it carries.

Its inputs are the link writeset, the link's position row, the stamps of the keys the peer's
rows touch and the current values of the rows in conflict, all read in the apply's transaction,
as of the GID before it: the same on every node, so every node commits the same bytes. What it
reads is said by :meth:`Settlement.stamp_keys` and :meth:`Settlement.wanted` (the shell runs
:data:`STAMP_SQL` and :func:`row_sql`).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Sequence

from chorus import wire
from chorus.bus.proto import LinkWriteset
from chorus.link import position as lp
from chorus.link.clock import LinkWindow
from chorus.link.conflict import Detection, Reason, RowDecision, TransactionDecision, row_changes, settle
from chorus.link.events import RemoteTransaction, SiteId, Stamp, key_text, row_key
from chorus.link.funcall import FunctionCall, FunctionCalls
from chorus.link.policy import ConflictFunction, DeltaApply, FunctionPolicy, LatestCommitWins, Outcome, Policy, PrimaryWins

STAMP_TABLE = wire.Table(
    "chorus", "link_stamp",
    (wire.Column("key", "bytea"), wire.Column("site", "text"), wire.Column("clock", "int8"),
     wire.Column("commit_time", "timestamptz")),
    (0,))

EXCEPTIONS_TABLE = wire.Table(
    "chorus", "link_exceptions",
    tuple(wire.Column(n, t) for n, t in (
        ("gid", "int8"), ("n", "int4"), ("link", "text"), ("table_name", "text"), ("row_key", "text"),
        ("local_site", "text"), ("local_clock", "int8"), ("local_commit_time", "timestamptz"), ("local_row", "jsonb"),
        ("remote_site", "text"), ("remote_clock", "int8"), ("remote_commit_time", "timestamptz"),
        ("remote_row", "jsonb"), ("max_replicated", "int8"), ("detection", "text"), ("policy", "text"),
        ("decision", "text"), ("result_row", "jsonb"))),
    (0, 1))

# the stamps of the keys the peer's rows touch (key hashes as one bytea[] parameter)
STAMP_SQL = ("SELECT key, site, clock, (extract(epoch FROM commit_time) * 1000000)::bigint "
             "FROM chorus.link_stamp WHERE key OPERATOR(pg_catalog.=) ANY(%s)")

# the site this node stamps its rows for (extension/chorus_stamp.c), which must be the link's
SITE_SQL = "SELECT pg_catalog.current_setting('chorus.link_site', true)"

POLICIES = ("latest-commit-wins", "primary-wins", "delta", "function")
FALLBACKS = ("latest-commit-wins", "primary-wins")  # of delta, for its other columns
# the types a delta column may have (format_type_be names): its increments are added as decimals
DELTA_TYPES = ("int2", "int4", "int8", "numeric", "smallint", "integer", "bigint")
STAMP_KEY_BYTES = 16
_U32 = struct.Struct(">I")


def stamp_hash(parts: Sequence[bytes]) -> bytes:
    """The key of a row's stamp in ``chorus.link_stamp``: the first 16 bytes of the SHA-256 of
    its certification key's parts, each as u32 length and bytes (as the extension computes it
    from a writeset's keys, extension/chorus_stamp.c)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(_U32.pack(len(p)))
        h.update(p)
    return h.digest()[:STAMP_KEY_BYTES]


def table_stamp_key(table: wire.Table) -> bytes:
    """The stamp of a whole table (a writeset past chorus.max_row_keys_per_table, or a TRUNCATE,
    certifies the table instead of its rows, and so stamps it)."""
    return stamp_hash((wire.name_bytes(table.nspname), wire.name_bytes(table.relname)))


# The mark of a realignment (docs/LINKS.md section 7.1): the arbiter's sender appends this table,
# which no row uses, to the writeset it sends; the other site's apply removes it. (A table of the
# writeset format rather than a field of the stream or of the bus message: the writeset travels
# as it is, from the sender's record through the receiver and the link writeset to every node.)
REALIGN_TABLE = wire.Table("chorus", "link_realign", (wire.Column("site", "text"),), (0,))

# the decisions of link_exceptions whose row the arbiter realigns: its own version stood
REALIGNED = (b"kept-local", b"rejected")
# and a row a conflict function merged (its policy in link_exceptions starts so)
FUNCTION_MERGED, FUNCTION_POLICY = b"merged", b"function "


def realigned(r: RowDecision, function: bool = False) -> bool:
    """Whether the arbiter realigns row ``r``: in conflict or rejected with its transaction, and
    its own version stands (a row it took from the peer is the peer's own version already), or
    a conflict ``function`` merged the two (one that is not commutative over several changes:
    the peer may have merged other versions, docs/LINKS.md section 7)."""
    merged = function and r.decision is not None and r.decision.outcome == Outcome.MERGED
    return r.realign and (not r.applied or merged)


def _is(t: wire.Table, other: wire.Table) -> bool:
    return (t.nspname, t.relname) == (other.nspname, other.relname)


def is_realign(ws: wire.Writeset) -> bool:
    return any(_is(t, REALIGN_TABLE) for t in ws.tables)


def marked(ws: wire.Writeset) -> wire.Writeset:
    """``ws`` (rows of the arbiter's realignment, as the link's rules carry them) marked as a
    realignment."""
    return wire.Writeset(ws.xid, ws.pid, ws.last_seen, (*ws.tables, REALIGN_TABLE), ws.rows, ws.keys,
                         flags=ws.flags, encoding=ws.encoding)


def unmarked(ws: wire.Writeset) -> wire.Writeset:
    """A realignment without its mark (the last table, which no row uses)."""
    n = len(ws.tables) - 1
    if n < 0 or not _is(ws.tables[n], REALIGN_TABLE) or any(_is(t, REALIGN_TABLE) for t in ws.tables[:n]) or any(
            isinstance(r, wire.Row) and r.table == n for r in ws.rows):
        raise SettleError("a realignment's mark must be its last table, used by no row")
    return wire.Writeset(ws.xid, ws.pid, ws.last_seen, ws.tables[:n], ws.rows, ws.keys, flags=ws.flags,
                         encoding=ws.encoding)


def realignment(record: wire.Writeset) -> Optional[wire.Writeset]:
    """The arbiter's realignment carried by the record of a link writeset it applied (what
    :meth:`Settlement.final` committed, as the writeset log holds it), or None: for each of its
    ``chorus.link_exceptions`` rows whose local version stood (kept by the policy, or the peer's
    change rejected with its transaction), the row as it stood, read in that apply (its
    ``result_row``): an UPDATE of the row to those values, or a DELETE of its key where the row
    was absent (the key from the peer's version). Not marked (:func:`marked`): the sender's rules
    come first."""
    ex = next((i for i, t in enumerate(record.tables) if _is(t, EXCEPTIONS_TABLE)), None)
    if ex is None:
        return None
    if record.encoding != wire.UTF8:
        # the exceptions' rows hold the values as UTF-8 text (row_json): in another encoding they
        # are not the row's bytes, and realigning from them would make the sites differ
        raise wire.WireError("a realignment needs a UTF8 database (its values come from chorus.link_exceptions, "
                             f"written as UTF-8; this one's encoding is {record.encoding}): the link stops here")
    rows: list[wire.Item] = []
    keys: list[wire.Key] = []
    tables: list[wire.Table] = []
    for item in record.rows:
        if not isinstance(item, wire.Row) or item.table != ex or item.op != wire.OP_INSERT:
            continue
        v = item.new
        if v[16] not in REALIGNED and not (v[16] == FUNCTION_MERGED
                                           and bytes(v[15] or b"").startswith(FUNCTION_POLICY)):
            continue
        name = bytes(v[3] or b"").decode("utf-8")
        table = next((t for t in record.tables if t.qualified == name), None)
        if table is None:
            raise wire.WireError(f"a link exception of {name}, a table its writeset does not hold")
        result, peer = v[17], v[12]
        src = result if result is not None else peer
        if src is None:
            continue  # absent on both sites: nothing to realign
        if isinstance(src, (wire.Binary, wire.Unchanged)):
            raise wire.WireError("a link exception's row is not jsonb text")
        image = json.loads(bytes(src))
        try:
            values = tuple(None if image[c.name] is None else str(image[c.name]).encode("utf-8")
                           for c in table.columns)
        except KeyError as e:
            raise wire.WireError(f"a link exception's row of {name} lacks column {e}") from None
        ident = tuple(values[i] for i in table.identity)
        ti = _table_index(tables, table)
        row = (wire.Row(wire.OP_UPDATE, ti, ident, values) if result is not None
               else wire.Row(wire.OP_DELETE, ti, ident))
        rows.append(row)
        keys.append(row_key(table, row))
    if not rows:
        return None
    return wire.Writeset(record.xid, record.pid, record.last_seen, tuple(tables), tuple(rows), tuple(keys),
                         encoding=record.encoding)


class SettleError(ValueError):
    """A link's conflict settings that cannot decide (an unknown policy, primary-wins without a
    primary that is one of the two sites)."""


@dataclass(frozen=True)
class Settings:
    """How a link's conflicts are detected and settled on the receiving site ([[link]]
    ``policy``, ``primary``, ``detection``, ``table_policy``). Every node of the site must have the
    same (they decide the same GIDs with them)."""

    site: SiteId  # this site
    peer: SiteId
    policy: str = "latest-commit-wins"
    primary: str = ""
    detection: Detection = Detection.ROW
    table_policy: Mapping[str, str] = field(default_factory=dict)  # "schema.table" -> policy
    # the peer sends a subset of its rows (a row filter, docs/LINKS.md section 8): an UPDATE of a
    # row absent here is applied as an INSERT of its new image, a DELETE of an absent row is nothing
    subset: bool = False
    # the delta policy (docs/LINKS.md section 7.1): "schema.table" -> its counter columns, and the
    # policy of the other columns
    delta_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    delta_fallback: str = "latest-commit-wins"
    # the conflict function of policy "function" (docs/LINKS.md section 7.1): "schema.function"
    function: str = ""
    # the statement_timeout of each of its calls (not in the fingerprint: it decides nothing; a
    # call that times out fails the apply, and the nodes vote on it)
    function_timeout_ms: int = 1000
    # this site has other links (docs/LINKS.md section 10): a row the peer's change leaves gets a
    # stamp even where it had none, since another neighbour's change may meet it (not in the
    # fingerprint: it follows from the [[link]] tables, which every node of the site has alike)
    chained: bool = False

    @property
    def calls_functions(self) -> bool:
        """A table of the link is settled by a conflict function (its calls may read any row)."""
        return "function" in (self.policy, *self.table_policy.values())

    def __post_init__(self) -> None:
        if self.delta_fallback not in FALLBACKS:
            raise SettleError(f"delta_fallback must be one of {', '.join(FALLBACKS)}, not {self.delta_fallback!r}")
        for name in (self.policy, *self.table_policy.values(), self.delta_fallback):
            if name not in POLICIES:
                raise SettleError(f"unknown conflict policy {name!r} (known: {', '.join(POLICIES)})")
            if name == "primary-wins" and self.primary not in (self.site, self.peer):
                raise SettleError(f"policy primary-wins needs primary = {self.site!r} or {self.peer!r}")
        for table, name in self.table_policy.items():
            if name == "delta" and table not in self.delta_columns:
                raise SettleError(f"table {table} has policy delta but no columns in delta_columns")
        for table, columns in self.delta_columns.items():
            if self.table_policy.get(table, self.policy) != "delta":
                raise SettleError(f"delta_columns lists table {table}, whose policy is not delta")
            if not columns or len(set(columns)) != len(columns):
                raise SettleError(f"delta_columns of {table} must list its counter columns, each once")
        uses = "function" in (self.policy, *self.table_policy.values())
        if uses and not self.function:
            raise SettleError("policy function needs conflict_function, the function's schema-qualified name")
        if self.function and not uses:
            raise SettleError(f"conflict_function {self.function} is set but no table's policy is function")

    @property
    def fingerprint(self) -> str:
        """What every node compares before deciding with these settings (the receiver's travel
        in each link writeset): 32 hex digits of a hash of all of them."""
        delta = [sorted((k, list(v)) for k, v in self.delta_columns.items()), self.delta_fallback]
        text = json.dumps([self.site, self.peer, self.policy, self.primary, self.detection.value,
                           sorted(self.table_policy.items())] + (["subset"] if self.subset else [])
                          + (["delta", delta] if self.delta_columns or "delta" == self.policy else [])
                          + ([["function", self.function]] if self.function else []))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]

    @property
    def arbiter(self) -> SiteId:
        """The site that settles for both (docs/LINKS.md section 7): the primary, else the site
        whose name sorts first."""
        return self.primary or min(self.site, self.peer)

    def policy_for(self, table: wire.Table, evaluate: Optional[ConflictFunction] = None) -> Policy:
        """``table``'s policy; ``evaluate`` makes the calls of a conflict function (the
        settlement's :class:`~chorus.link.funcall.FunctionCalls`)."""
        qualified = f"{table.nspname}.{table.relname}"
        name = self.table_policy.get(qualified, self.policy)
        if name == "delta":
            fallback = _policy(self.delta_fallback, self.primary)
            columns = self.delta_columns.get(qualified, ())
            return DeltaApply(delta_columns(table, columns), fallback) if columns else fallback
        if name == "function":
            if evaluate is None:
                raise SettleError(f"{table.qualified}: policy function is decided by the apply alone")
            return FunctionPolicy(self.function, self.arbiter, evaluate, name=f"function {self.function}")
        return _policy(name, self.primary)


def _policy(name: str, primary: str) -> Policy:
    return PrimaryWins(primary) if name == "primary-wins" else LatestCommitWins()


def delta_columns(table: wire.Table, columns: tuple[str, ...]) -> tuple[str, ...]:
    """``columns``, checked against ``table`` as the writeset describes it: each one of its
    columns, numeric (SettleError otherwise: the link's settings do not fit the table)."""
    types = {c.name: c.typname for c in table.columns}
    for name in columns:
        if name not in types:
            raise SettleError(f"delta column {name} is not a column of {table.qualified} "
                              f"(its columns: {', '.join(types)})")
        if types[name].split(".")[-1] not in DELTA_TYPES:
            raise SettleError(f"delta column {name} of {table.qualified} is of type {types[name]}, not an "
                              f"integer or numeric type ({', '.join(DELTA_TYPES[:4])})")
        if any(table.columns[i].name == name for i in table.identity):
            raise SettleError(f"delta column {name} of {table.qualified} is part of its key")
    return columns


def row_sql(table: wire.Table) -> str:
    """The current values of one row of ``table`` in its column order, as text under the apply's
    fixed settings (as the writeset carries them, :func:`chorus.wire.text_of`), found by its identity
    columns' text (one parameter each, in the identity's order)."""
    cols = ", ".join(wire.text_of(wire.quote_ident(c.name)) for c in table.columns)
    where = " AND ".join(f"{wire.text_of(wire.quote_ident(table.columns[i].name))} OPERATOR(pg_catalog.=) %s"
                         for i in table.identity)
    return f"SELECT {cols} FROM ONLY {table.qualified} WHERE {where}"


def _stamp_of(row: Sequence[object]) -> tuple[bytes, Stamp]:
    key, site, clock, at = row
    return bytes(key), Stamp(str(site), int(clock), int(at))  # type: ignore[call-overload]


def _text(c: wire.Column, v: wire.Value) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, wire.Unchanged):
        return "(unchanged)"
    if isinstance(v, wire.Binary):
        try:
            return key_text(c, v).decode("ascii")
        except ValueError:  # a binary form without a text of ours here: its bytes
            return "\\x" + bytes(v).hex()
    return bytes(v).decode("utf-8", "replace")


def row_json(table: wire.Table, values: Optional[Sequence[wire.Value]]) -> wire.Value:
    """A row as a jsonb value (text form): column name to the value's text, or NULL."""
    if values is None:
        return None
    return json.dumps({c.name: _text(c, v) for c, v in zip(table.columns, values)}, ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8")


class _Rows:
    """conflict.LocalRows over what the shell read (the stamps as :meth:`Settlement._stamps`
    chose them, the rows in conflict)."""

    def __init__(self, stamps: Mapping[bytes, Stamp], values: Mapping[bytes, Optional[tuple[wire.Value, ...]]]) -> None:
        self.stamps = stamps  # by certification key hash (Key.hashed)
        self.rows = values

    def stamp(self, key: bytes) -> Optional[Stamp]:
        return self.stamps.get(key)

    def values(self, table: wire.Table, key: wire.Key) -> Optional[tuple[wire.Value, ...]]:
        h = key.hashed()
        if h not in self.rows:
            raise KeyError(f"the row {key.describe()} was not read")
        return self.rows[h]


class Settlement:
    """The apply of link writeset ``step`` (already known to follow the link's position) at this
    site's GID ``gid``, the peer's writeset ``remote`` decoded in full, the link's row ``current``."""

    def __init__(self, step: LinkWriteset, remote: wire.Writeset, current: Optional[lp.PositionRow], gid: int,
                 settings: Settings, numbered: int = 0) -> None:
        if remote.scanned:
            raise ValueError("the peer's writeset is needed decoded in full")
        if remote.toi or remote.concurrent:
            raise ValueError("a link writeset carries no ordering request or concurrent index change")
        if settings.peer != step.peer_site:
            raise SettleError(f"link {step.link} is configured with peer site {settings.peer}, "
                              f"its writeset came from {step.peer_site}")
        if step.settings != settings.fingerprint:
            raise SettleError(f"link {step.link}: this node's conflict settings ([[link]] site, peer_site, policy, "
                              f"primary, detection, table_policy) differ from those of node {step.node}, which "
                              "received it: every node of a site needs the same")
        self.step = step
        self.remote = remote
        self.current = current
        self.gid = gid
        # the exceptions recorded at this GID before (a batch's transactions before this one): its
        # own are numbered after them
        self.numbered = numbered
        self.settings = settings
        mr = max(step.max_replicated, current.max_replicated if current is not None else 0)
        self.window = LinkWindow(settings.site, settings.peer, mr, 0)
        # the arbiter's realignment (docs/LINKS.md section 7.1): its marker table goes, its rows are
        # settled to the values they carry, row by row
        self.realign = is_realign(remote)
        if self.realign:
            if settings.arbiter != settings.peer:
                raise SettleError(f"link {step.link}: a realignment from site {settings.peer}, which is not the "
                                  f"link's arbiter here ({settings.arbiter}): the sites' conflict settings differ")
            remote = unmarked(remote)
            self.remote = remote
        # a transaction the peer forwarded from a third site (docs/LINKS.md section 10): its rows are
        # stamped and its versions named with its origin; the mark stays in what is committed
        origin = lp.origin_in(remote)
        if origin == settings.site:
            raise SettleError(f"link {step.link}: site {settings.peer} forwarded a change of this site's back")
        self.txn = RemoteTransaction(step.peer_site, step.peer_gid, step.commit_time, remote, self.realign,
                                     origin=origin)
        self.changes = row_changes(remote)
        # each row key's stamp key, and its table's
        self.stamp_of_key = {k.hashed(): (stamp_hash(k.parts), table_stamp_key(t)) for _i, t, _r, k in self.changes}
        self.decisions: Optional[TransactionDecision] = None
        self.local: dict[bytes, Optional[tuple[wire.Value, ...]]] = {}
        self.functions = FunctionCalls()  # the conflict function's calls (policy function)

    def _policy_for(self, table: wire.Table) -> Policy:
        return self.settings.policy_for(table, self.functions)

    def _function(self, r: RowDecision) -> bool:
        """Whether row ``r``'s table is settled by a conflict function."""
        item = self.remote.rows[r.item]
        assert isinstance(item, wire.Row)
        return isinstance(self._policy_for(self.remote.tables[item.table]), FunctionPolicy)

    def function_calls(self, stamps: Sequence[Sequence[object]],
                       values: Mapping[bytes, Optional[tuple[wire.Value, ...]]]) -> list[FunctionCall]:
        """The conflict function's calls :meth:`final` needs that were not made yet, given the
        stamps and rows read (the shell makes them, funcall.decide_calls, and asks again: an
        answer may change which later rows of the transaction are in conflict)."""
        if "function" not in (self.settings.policy, *self.settings.table_policy.values()):
            return []  # (no call to make: the decision is not computed twice)
        self.functions.collecting, self.functions.missing = True, []
        try:
            settle(self.window, [self.txn], _Rows(self._stamps(stamps), values), self._policy_for,
                   self.settings.detection, self.settings.arbiter, self._stamp_gid)
        finally:
            self.functions.collecting = False
        return self.functions.missing

    @property
    def _stamp_gid(self) -> Optional[int]:
        """The clock of the stamps the peer's changes leave: this GID on a site of several links
        (chains, docs/LINKS.md section 10), else the peer's clock (conflict.settle)."""
        return self.gid if self.settings.chained else None

    def stamp_keys(self) -> list[bytes]:
        """The stamp keys the decision needs (read with :data:`STAMP_SQL`): each row's and its
        table's."""
        return sorted({s for pair in self.stamp_of_key.values() for s in pair})

    def _stamps(self, rows: Sequence[Sequence[object]]) -> dict[bytes, Stamp]:
        """The stamps read, by certification key hash: a row's own or its table's; of two, the
        later of those not of the peer (stamped with this site's GIDs; the peer's clocks do not
        compare with them: those count, erring towards a conflict)."""
        read = dict(_stamp_of(r) for r in rows)
        out: dict[bytes, Stamp] = {}
        for h, (row_key, table_key) in self.stamp_of_key.items():
            found = [s for s in (read.get(row_key), read.get(table_key)) if s is not None]
            local = [s for s in found if s.site != self.settings.peer]
            if local or found:
                out[h] = max(local, key=lambda s: s.clock) if local else found[0]
        return out

    def wanted(self, stamps: Sequence[Sequence[object]]) -> list[tuple[wire.Table, wire.Key, list[str]]]:
        """Given the stamps read, the rows whose current values the decision needs (those in
        conflict): table, key and the parameters of :func:`row_sql`."""
        found = self._stamps(stamps)
        conflict = any(self.window.in_conflict(found.get(k.hashed())) for _i, _t, _r, k in self.changes)
        # a rejection's exceptions show every row, and its rows are realigned from their values here;
        # a realignment's rows are settled to its values (an UPDATE of a row absent here inserts it)
        whole = self.realign or (conflict and self.settings.detection == Detection.TRANSACTION
                                 and self.settings.arbiter == self.settings.site)
        out: dict[bytes, tuple[wire.Table, wire.Key, list[str]]] = {}
        for _i, table, row, key in self.changes:
            h = key.hashed()
            migrating = self.settings.subset and row.op in (wire.OP_UPDATE, wire.OP_DELETE)  # present here?
            # the delta policy adds an UPDATE's increments to the row here, in conflict or not
            counting = row.op == wire.OP_UPDATE and isinstance(self._policy_for(table), DeltaApply)
            if h not in out and (whole or migrating or counting or self.window.in_conflict(found.get(h))):
                params = [p.decode("utf-8", "surrogateescape") for p in key.parts[3:]]
                out[h] = (table, key, params)
        return list(out.values())

    def final(self, stamps: Sequence[Sequence[object]],
              values: Mapping[bytes, Optional[tuple[wire.Value, ...]]]) -> bytes:
        """The writeset every node commits at ``gid`` (module docstring). ``values``: the rows
        :meth:`wanted` asked for, by key hash (None: absent)."""
        found = self._stamps(stamps)
        self.local = dict(values)
        (d,) = settle(self.window, [self.txn], _Rows(found, values), self._policy_for,
                      self.settings.detection, self.settings.arbiter, self._stamp_gid)
        self.decisions = d
        by_item: dict[int, list[RowDecision]] = {}
        for r in d.rows:
            by_item.setdefault(r.item, []).append(r)
        tables = list(self.remote.tables)  # (a realignment's marker already gone)
        out_rows: list[wire.Item] = []
        for i, item in enumerate(self.remote.rows):
            ds = by_item.get(i)
            if not isinstance(item, wire.Row) or not ds or all(r.reason is None for r in ds):
                if ds and self.realign and isinstance(item, wire.Row):
                    out_rows += self._settled(item, ds[0])
                elif ds and isinstance(item, wire.Row) and all(r.applied for r in ds) and ds[0].values != (item.new or None):
                    out_rows += self._settled(item, ds[0])  # a delta column's increment added here
                elif not ds or all(r.applied for r in ds):
                    out_rows += (self._migrated(item, ds[0]) if ds and self.settings.subset and isinstance(item, wire.Row)
                                 else [item])
                continue
            if not all(r.applied for r in ds):
                continue  # the local version stands, or its transaction is rejected
            out_rows += self._settled(item, ds[0])
        keys = list(self.remote.keys)
        own = {k for k, _s in (_stamp_of(x) for x in stamps)}
        stamped: set[bytes] = set()
        for r in d.rows:
            before, after = found.get(r.key), r.stamp_after
            if realigned(r, self._function(r)):
                after = Stamp(self.settings.site, self.gid, 0)  # the realignment's: this GID
            elif after is None or after == before or (before is None and not self.settings.chained):
                continue  # no stamp is as good as the peer's (on a site of one link); a kept local version keeps its stamp
            st = _table_index(tables, STAMP_TABLE)
            sk = self.stamp_of_key[r.key][0]
            if sk in stamped:
                continue
            stamped.add(sk)
            # the row's own stamp: updated if it has one, else written (its table's was found)
            op, old = (wire.OP_UPDATE, (_bytea(sk),)) if sk in own else (wire.OP_INSERT, ())
            out_rows.append(wire.Row(op, st, old, _stamp_values(sk, after)))
            keys.append(wire.Key(wire.KeyMode.UPDATE, (b"chorus", b"link_stamp", b"key", _bytea(sk))))
        n = self.numbered
        for r in d.rows:
            if r.in_conflict:
                n += 1
                ex = _table_index(tables, EXCEPTIONS_TABLE)
                out_rows.append(wire.Row(wire.OP_INSERT, ex, (), self._exception(n, r)))
                keys.append(wire.Key(wire.KeyMode.EXCLUSIVE, (b"chorus", b"link_exceptions", b"gid,n",
                                                              b"%d" % self.gid, b"%d" % n)))
        tables, out_rows = _identity_only(tables, out_rows)
        remote = wire.Writeset(self.remote.xid, self.remote.pid, self.remote.last_seen, tuple(tables),
                               tuple(out_rows), tuple(keys), flags=self.remote.flags, encoding=self.remote.encoding)
        return lp.final_writeset(self.step, remote, self.current, lp.Decision.APPLY)

    def _migrated(self, item: wire.Row, r: RowDecision) -> list[wire.Item]:
        """A row of a peer that sends a subset of its rows, not in conflict: an UPDATE of a row
        absent here (it entered the subset) inserts its new image; a DELETE of an absent row
        (it left the subset, or never was in it) is nothing."""
        if item.op not in (wire.OP_UPDATE, wire.OP_DELETE) or self.local.get(r.key, ()) is not None:
            return [item]
        if item.op == wire.OP_DELETE:
            return []
        if any(isinstance(v, wire.Unchanged) for v in item.new):
            table = self.remote.tables[item.table]
            raise SettleError(f"{table.qualified}: the row {self._key(r).describe()} entered the peer's subset but is "
                              "absent here, and the UPDATE does not carry all its values (an unchanged out-of-line "
                              "value)")
        return [wire.Row(wire.OP_INSERT, item.table, (), item.new)]

    def _settled(self, item: wire.Row, r: RowDecision) -> list[wire.Item]:
        """The change that leaves row ``r`` as its policy decided, given the local row now."""
        table = self.remote.tables[item.table]
        local = self.local.get(r.key)
        want = r.values
        if want is None:
            return [] if local is None else [wire.Row(wire.OP_DELETE, item.table, _identity(table, item))]
        if any(isinstance(v, wire.Unchanged) for v in want):
            if local is None:
                raise SettleError(f"{table.qualified}: the row {self._key(r).describe()} is absent here and the "
                                  "incoming change does not carry all its values")
            want = tuple(lv if isinstance(v, wire.Unchanged) else v for v, lv in zip(want, local))
        if local is None:
            return [wire.Row(wire.OP_INSERT, item.table, (), want)]
        return [wire.Row(wire.OP_UPDATE, item.table, tuple(local[c] for c in table.identity), want)]

    @property
    def conflicts(self) -> int:
        """How many rows were in conflict (once :meth:`final` decided)."""
        return sum(1 for r in self.decisions.rows if r.in_conflict) if self.decisions else 0

    def _key(self, r: RowDecision) -> wire.Key:
        return next(c[3] for c in self.changes if c[3].hashed() == r.key)

    def _exception(self, n: int, r: RowDecision) -> tuple[wire.Value, ...]:
        """Row ``n`` of ``chorus.link_exceptions`` for conflict ``r``: both versions, the window,
        why it is in conflict, the policy and the decision, the row left."""
        i, table, row, key = next(c for c in self.changes if c[3].hashed() == r.key)
        assert r.reason is not None
        mine = self.local.get(r.key)
        st = r.stamp
        if r.decision is not None:
            decision, policy_name = r.decision.outcome.value, self._policy_for(table).name
            if r.decision.note:
                policy_name += f" ({r.decision.note})"
            if not r.applied and r.decision.outcome != Outcome.KEEP_LOCAL:
                decision = "rejected"  # the policy took the peer's, but its transaction is rejected
        else:
            decision, policy_name = "rejected", "epoch-trans"
        result = r.values if r.applied else mine
        return (b"%d" % self.gid, b"%d" % n, self.step.link.encode("ascii"), table.qualified.encode("utf-8"),
                key.describe().encode("utf-8"),
                None if st is None else st.site.encode("utf-8"), None if st is None else b"%d" % st.clock,
                None if st is None else lp.timestamp_text(st.commit_time),
                row_json(table, mine),
                self.txn.made_at.encode("utf-8"), b"%d" % self.txn.clock, lp.timestamp_text(self.txn.commit_time),
                row_json(table, None if row.op == wire.OP_DELETE else row.new),
                b"%d" % self.window.max_replicated, r.reason.value.encode("ascii"), policy_name.encode("ascii"),
                decision.encode("ascii"), row_json(table, result))


def _identity(table: wire.Table, row: wire.Row) -> tuple[wire.Value, ...]:
    """The old image an UPDATE or DELETE of ``row``'s row names it by (its identity values)."""
    if row.op == wire.OP_INSERT:
        return tuple(row.new[i] for i in table.identity)
    if len(row.old) == len(table.columns) and len(table.identity) != len(table.columns):
        return tuple(row.old[i] for i in table.identity)
    return row.old


def _identity_only(tables: list[wire.Table], rows: list[wire.Item]) -> tuple[list[wire.Table], list[wire.Item]]:
    """The committed writeset's tables and rows without the peer's captured old values
    (``Table.old_columns``: the delta policy used them here); old images of the identity alone."""
    if not any(t.old_columns for t in tables):
        return tables, rows
    out: list[wire.Item] = []
    for r in rows:
        t = tables[r.table] if isinstance(r, wire.Row) else None
        if t is not None and t.old_columns and isinstance(r, wire.Row) and len(r.old) == len(t.columns):
            r = r._replace(old=tuple(r.old[i] for i in t.identity))
        out.append(r)
    return [replace(t, old_columns=False) for t in tables], out


def _table_index(tables: list[wire.Table], table: wire.Table) -> int:
    if table not in tables:
        tables.append(table)
    return tables.index(table)


def _bytea(key: bytes) -> bytes:
    return b"\\x" + key.hex().encode("ascii")


def _stamp_values(key: bytes, s: Stamp) -> tuple[wire.Value, ...]:
    return (_bytea(key), s.site.encode("utf-8"), b"%d" % s.clock, lp.timestamp_text(s.commit_time))

