"""Conflict detection (docs/LINKS.md section 6): NDB$EPOCH per row, NDB$EPOCH_TRANS per
transaction with the transactions that depend on a rejected one; and the decision for a batch of
incoming transactions, policy included (section 7).

:func:`settle` is what the apply of one link writeset computes on every node of the receiving
site: the same inputs (the batch, the stamps and rows as of that GID, the window) give the same
answer everywhere. It reads the database only through :class:`LocalRows`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

from chorus import wire
from chorus.link.clock import LinkWindow
from chorus.link.events import RemoteTransaction, SiteId, Stamp, Version, row_key
from chorus.link.policy import Decision, DeltaApply, Outcome, Policy, delta_values, has_old


class Detection(enum.Enum):
    ROW = "row"  # NDB$EPOCH
    TRANSACTION = "transaction"  # NDB$EPOCH_TRANS


class Reason(enum.Enum):
    """Why a row of an incoming transaction is treated as in conflict."""
    ROW = "row"  # its own window is open
    TRANSACTION = "transaction"  # another row of its transaction is in conflict (EPOCH_TRANS)
    DEPENDENT = "dependent"  # its transaction depends on a rejected one (EPOCH_TRANS)


class LocalRows(Protocol):
    """The receiving site's rows as of the apply's GID (``chorus.link_stamp`` and the tables)."""

    def stamp(self, key: bytes) -> Optional[Stamp]:
        """The stamp of the row with this key hash, or None."""
        ...

    def values(self, table: wire.Table, key: wire.Key) -> Optional[tuple[wire.Value, ...]]:
        """The row's current values in ``table``'s column order, or None if absent."""
        ...


@dataclass(frozen=True)
class RowDecision:
    """One row change of an incoming transaction: its key's hash, the stamp found, whether and
    why it is in conflict, the policy's decision (None: not decided by a policy: applied as it
    comes, or rejected with its transaction), whether the change is applied and the row it
    leaves (None: absent; delta columns already added up), the stamp the row has afterwards,
    and whether this site, the arbiter, realigns the row."""

    item: int  # index in the writeset's rows
    key: bytes
    stamp: Optional[Stamp]
    reason: Optional[Reason]
    decision: Optional[Decision]
    applied: bool
    values: Optional[tuple[wire.Value, ...]]
    stamp_after: Optional[Stamp]
    realign: bool

    @property
    def in_conflict(self) -> bool:
        return self.reason is not None


@dataclass(frozen=True)
class TransactionDecision:
    txn: RemoteTransaction
    rows: tuple[RowDecision, ...]
    rejected: bool  # EPOCH_TRANS: none of its rows is applied
    depends_on: Optional[int]  # index in the batch of the rejected transaction it depends on

    @property
    def in_conflict(self) -> bool:
        return any(r.in_conflict for r in self.rows)


def row_changes(ws: wire.Writeset) -> list[tuple[int, wire.Table, wire.Row, wire.Key]]:
    """The row changes of a writeset with the key of the row each one changes (an UPDATE that
    changes its key counts for both keys). TRUNCATE and schema changes have no row key."""
    out: list[tuple[int, wire.Table, wire.Row, wire.Key]] = []
    for i, item in enumerate(ws.rows):
        if not isinstance(item, wire.Row) or item.op == wire.OP_TRUNCATE:
            continue
        table = ws.tables[item.table]
        key = row_key(table, item)
        out.append((i, table, item, key))
        if item.op == wire.OP_UPDATE and not table.full_identity:
            new_vals = [item.new[c] for c in table.identity]
            if not any(isinstance(v, wire.Unchanged) for v in new_vals) and tuple(new_vals) != item.old:
                out.append((i, table, item, row_key(table, item, new=True)))
    return out


def _txn_keys(txn: RemoteTransaction) -> dict[bytes, wire.KeyMode]:
    """Every key a transaction touches with its strongest mode: its certification keys and its
    rows' keys."""
    keys: dict[bytes, wire.KeyMode] = {}
    for k in txn.writeset.keys:
        h = k.hashed()
        keys[h] = max(keys.get(h, k.mode), k.mode)
    for _i, _t, _r, k in row_changes(txn.writeset):
        h = k.hashed()
        keys[h] = max(keys.get(h, k.mode), k.mode)
    return keys


def depends(earlier: dict[bytes, wire.KeyMode], later: dict[bytes, wire.KeyMode]) -> bool:
    """``later`` depends on ``earlier``: a key the earlier one wrote (update or exclusive) is
    touched by the later one in a conflicting mode (the certifier's matrix, wire.modes_conflict)."""
    small, big = (earlier, later) if len(earlier) <= len(later) else (later, earlier)
    for h in small:
        if h in big:
            a, b = earlier[h], later[h]
            if a != wire.KeyMode.REFERENCE and wire.modes_conflict(a, b):
                return True
    return False


def dependency_closure(batch: Sequence[RemoteTransaction], seeds: set[int]) -> dict[int, int]:
    """NDB$EPOCH_TRANS's propagation: every transaction of ``batch`` (in stream order) that
    depends, directly or through others, on one of ``seeds``, mapped to the transaction it
    depends on directly (seeds map to themselves)."""
    keys = [_txn_keys(t) for t in batch]
    out: dict[int, int] = {i: i for i in seeds}
    for i in range(len(batch)):
        if i in out:
            continue
        for j in range(i):
            if j in out and depends(keys[j], keys[i]):
                out[i] = j
                break
    return out


def settle(window: LinkWindow, batch: Sequence[RemoteTransaction], rows: LocalRows,
           policy_for: Callable[[wire.Table], Policy], detection: Detection, arbiter: SiteId,
           gid: Optional[int] = None) -> list[TransactionDecision]:
    """Decide a batch of the peer's transactions, in stream order, against the local rows.

    A row change is in conflict when its row's window is open (``window.in_conflict``); the
    table's policy settles it. In ``Detection.TRANSACTION``: a transaction with a row whose
    policy keeps the local version is rejected whole, and so is every later one of the batch
    that depends on a rejected one. Rows applied earlier in the batch count with their new
    stamps. On the arbiter every row settled or rejected is realigned.

    Only the arbiter rejects transactions: on the other site ``Detection.TRANSACTION`` settles
    row by row. Its per-row decisions are the arbiter's (the policies are symmetric), and what
    the arbiter's rejection leaves different (the rows of the rejected transaction) comes back
    in the arbiter's realignment (docs/LINKS.md section 7.1); were the other site to reject the
    arbiter's transactions too, rows the arbiter applied without a conflict would stay different
    with nothing to realign them. A realignment (``txn.realign``) is settled row by row as well:
    it is the arbiter's decision, not a transaction of the application.

    ``gid``: this site's GID of the apply. A row the peer's change leaves is stamped with the peer
    (the neighbour whose stream brought it, whatever site made it) and that GID, so that in a
    chain (docs/LINKS.md section 10) a later change of another neighbour is tested against the
    point of this site's order where the row took it (None: the peer's clock, as a site of one
    link only ever compares its own stamps).
    """
    local = window.local
    if arbiter != local:
        detection = Detection.ROW
    overlay: dict[bytes, Optional[Stamp]] = {}
    rejected: dict[int, int] = {}
    keys = [_txn_keys(t) for t in batch]
    out: list[TransactionDecision] = []

    def stamp_of(h: bytes) -> Optional[Stamp]:
        return overlay[h] if h in overlay else rows.stamp(h)

    for n, txn in enumerate(batch):
        if txn.site != window.peer:
            raise ValueError(f"a transaction of {txn.site} in {window.peer}'s stream")
        remote_stamp = Stamp(txn.site, txn.clock if gid is None else gid, txn.commit_time)
        depends_on = None
        per_txn = detection == Detection.TRANSACTION and not txn.realign
        if per_txn:
            depends_on = next((j for j in rejected if depends(keys[j], keys[n])), None)
        changes = row_changes(txn.writeset)
        found: list[tuple[int, wire.Table, wire.Row, wire.Key, bytes, Optional[Stamp]]] = []
        for i, table, row, key in changes:
            h = key.hashed()
            found.append((i, table, row, key, h, stamp_of(h)))
        decided: list[tuple[Optional[Reason], Optional[Decision]]] = []
        for i, table, row, key, h, st in found:
            if depends_on is not None:
                decided.append((Reason.DEPENDENT, None))
            elif window.in_conflict(st):
                assert st is not None
                # the versions as the link's two sites hold them (the policies settle between
                # the two sites of a link: in a chain the local version may have come from
                # another neighbour, and the incoming one from a third site, forwarded)
                mine = Version(local, st.clock, st.commit_time, rows.values(table, key))
                decided.append((Reason.ROW, policy_for(table).decide(table, mine, _version(txn, table, row))))
            else:
                decided.append((None, None))
        reject = depends_on is not None or (
            per_txn
            and any(d is not None and d.outcome == Outcome.KEEP_LOCAL for _r, d in decided))
        if reject:
            rejected[n] = n if depends_on is None else depends_on
        row_out: list[RowDecision] = []
        for (i, table, row, key, h, st), (reason, dec) in zip(found, decided):
            if reject and reason is None:
                reason = Reason.TRANSACTION
            values: Optional[tuple[wire.Value, ...]] = None
            if reject:
                applied, after = False, st
            elif dec is None:
                applied, after = True, remote_stamp
                values = _plain(rows, policy_for(table), txn, table, row, key)
            elif dec.outcome == Outcome.KEEP_LOCAL:
                applied, after = False, st
            else:
                w = dec.winner
                # the row keeps the stamp of the version it is (the peer's: its stamp here)
                after = st if w.site == local and st is not None else remote_stamp
                applied, values = True, dec.values
            realign = arbiter == local and reason is not None
            overlay[h] = after
            row_out.append(RowDecision(i, h, st, reason, dec, applied, values, after, realign))
        out.append(TransactionDecision(txn, tuple(row_out), reject, depends_on))
    return out


def _version(txn: RemoteTransaction, table: wire.Table, row: wire.Row) -> Version:
    """The incoming change as a version: its new image (None for a DELETE) and its old image
    when it has a value per column (a table keyed by its whole row, or one whose old images carry
    the delta columns, ``Table.old_columns``; the others are ``wire.UNCHANGED`` there)."""
    return Version(txn.site, txn.clock, txn.commit_time, None if row.op == wire.OP_DELETE else row.new,
                   row.old if len(row.old) == len(table.columns) else None)


def _plain(rows: LocalRows, policy: Policy, txn: RemoteTransaction, table: wire.Table, row: wire.Row,
           key: wire.Key) -> Optional[tuple[wire.Value, ...]]:
    """The row an incoming change not in conflict leaves: its new image, with the delta policy's
    columns added to the local values (pgEdge Spock applies deltas always, not only in conflict)."""
    if row.op == wire.OP_DELETE:
        return None
    if isinstance(policy, DeltaApply) and row.op == wire.OP_UPDATE:
        remote = _version(txn, table, row)
        local = rows.values(table, key) if has_old(table, policy.columns, remote) else None
        if local is not None:
            return delta_values(table, policy.columns, row.new, local, remote)
    return row.new
