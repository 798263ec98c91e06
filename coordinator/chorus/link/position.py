"""The apply of a link writeset on the receiving site, decided without I/O (docs/LINKS.md section 3).

A transaction received over a link enters the receiving site's total order as a link writeset
(``bus.proto.LinkWriteset``). Every node applies it at its GID in one transaction that reads the
link's row of ``chorus.link_position`` and writes, in the same transaction, either

- the peer's rows and the link's row moved to the peer GID (:data:`Decision.APPLY`), when the
  link writeset follows the position exactly: its ``after`` is the position's ``applied_gid``;
- nothing (its GID commits empty), when its peer GID is at or below the position
  (:data:`Decision.DUPLICATE`: the same range sent again after a reconnect or by two receivers
  after a failover), when it does not follow the position (:data:`Decision.GAP`: an earlier one
  was not applied, so the receiver resumes from the position and sends this one again), or when
  the position belongs to another peer site (:data:`Decision.WRONG_PEER`, a misconfiguration).

The decision depends only on the link writeset and the row as of the GID before it, which every
node has alike (link writesets of one link are applied one after another, in GID order), so every
node decides alike without a vote. What is applied is one writeset (:func:`final_writeset`): the
peer's tables and rows plus the position's row, the same bytes on every node, and the bytes the
writeset log keeps for that GID, so a node that catches up from a log applies exactly that.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from dataclasses import dataclass
from typing import Optional, Sequence

from chorus import wire
from chorus.bus.proto import LinkStep, LinkWriteset

ORIGIN_PREFIX = "link:"

POSITION_TABLE = wire.Table(
    "chorus", "link_position",
    (wire.Column("link", "text"), wire.Column("peer_site", "text"), wire.Column("applied_gid", "int8"),
     wire.Column("peer_clock", "int8"), wire.Column("max_replicated", "int8"),
     wire.Column("updated_at", "timestamptz")),
    (0,))

# what the apply reads of the link's row (the columns of PositionRow, updated_at in µs)
READ_SQL = ("SELECT link, peer_site, applied_gid, peer_clock, max_replicated, "
            "(extract(epoch FROM updated_at) * 1000000)::bigint FROM chorus.link_position "
            "WHERE link OPERATOR(pg_catalog.=) %s")

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def origin(link: str) -> str:
    """The origin a link writeset is certified and logged under: not a node's name, so it
    conflicts with every node's local transactions (a local one that overlaps it and is
    certified after it, without having seen it, fails with 40001, as against a remote node's)."""
    return ORIGIN_PREFIX + link


def is_link_origin(name: str) -> bool:
    return name.startswith(ORIGIN_PREFIX)


# A transaction a site forwards (docs/LINKS.md section 10: a chain A-B-C, B sending A's changes on
# to C) names its origin site: the stream's RECORD carries it (link protocol 4), and from there the
# receiving site's link writeset carries it as a table no row uses, ``chorus.link_origin`` whose one
# column is named after the origin site (as the realignment and the copy are marked: the writeset
# travels as it is through the bus message, every node's apply and the log, so neither the bus
# message nor the log record needs a new field). The apply keeps it in what it commits, so the
# forwarding site's own sender finds the origin in its log again. No mark: the origin is the
# link's peer itself.
ORIGIN_TABLE = ("chorus", "link_origin")


def with_origin(ws: wire.Writeset, site: str) -> wire.Writeset:
    """``ws`` (a transaction of ``site`` that a neighbour forwarded) marked with its origin."""
    if origin_in(ws) is not None:
        raise ValueError("the writeset names its origin already")
    mark = wire.Table(ORIGIN_TABLE[0], ORIGIN_TABLE[1], (wire.Column(site, "text"),), (0,))
    return wire.Writeset(ws.xid, ws.pid, ws.last_seen, (*ws.tables, mark), ws.rows, ws.keys, flags=ws.flags,
                         encoding=ws.encoding)


def origin_in(ws: wire.Writeset) -> Optional[str]:
    """The origin site a forwarded transaction's writeset names (None: not forwarded). Two marks
    naming different sites, or a mark a row uses, are refused (``wire.WireError``)."""
    found: Optional[str] = None
    for n, t in enumerate(ws.tables):
        if (t.nspname, t.relname) != ORIGIN_TABLE:
            continue
        if len(t.columns) != 1 or any(isinstance(r, wire.Row) and r.table == n for r in ws.rows):
            raise wire.WireError("a chorus.link_origin mark with rows or other than one column")
        site = t.columns[0].name
        if found is not None and found != site:
            raise wire.WireError(f"a writeset naming two origin sites, {found} and {site}")
        found = site
    return found


class Decision(str, enum.Enum):
    APPLY = "apply"
    DUPLICATE = "duplicate"
    GAP = "gap"
    WRONG_PEER = "wrong-peer"
    COPY = "copy"  # a batch of a re-instantiation (link/copy.py), applied whatever the position


@dataclass(frozen=True)
class PositionRow:
    """One row of ``chorus.link_position``; ``updated_at`` in µs since the Unix epoch."""

    link: str
    peer_site: str
    applied_gid: int
    peer_clock: int
    max_replicated: int
    updated_at: int

    @staticmethod
    def of(row: Optional[tuple[object, ...]]) -> Optional["PositionRow"]:
        """The row as :data:`READ_SQL` returns it (None: the link has no row yet)."""
        if row is None:
            return None
        link, site, applied, clock, mr, at = row
        return PositionRow(str(link), str(site), int(applied), int(clock), int(mr), int(at))  # type: ignore[call-overload]


def decide(step: LinkWriteset, current: Optional[PositionRow]) -> Decision:
    """What the apply of link writeset ``step`` does, given the link's row before it."""
    if current is not None and current.peer_site != step.peer_site:
        return Decision.WRONG_PEER
    applied = current.applied_gid if current is not None else 0
    if step.peer_gid <= applied:
        return Decision.DUPLICATE
    if step.after != applied:
        return Decision.GAP
    return Decision.APPLY


def advanced(current: Optional[PositionRow], step: LinkWriteset) -> PositionRow:
    """The link's row once ``step`` is applied: at its peer GID; the clock values only grow."""
    clock = max(step.peer_clock, current.peer_clock if current is not None else 0)
    mr = max(step.max_replicated, current.max_replicated if current is not None else 0)
    return PositionRow(step.link, step.peer_site, step.peer_gid, clock, mr, step.sent_at)


def position_key(link: str) -> wire.Key:
    """The certification key of the link's row (as ``link.events.row_key`` makes it): the link
    writesets of one link hold it, so they are applied one after another."""
    return wire.Key(wire.KeyMode.EXCLUSIVE, (b"chorus", b"link_position", b"link", link.encode("ascii")))


def timestamp_text(us: int) -> bytes:
    """A timestamptz value as text, read under the apply's fixed settings (UTC, ISO)."""
    t = _EPOCH + datetime.timedelta(microseconds=us)
    return t.strftime("%Y-%m-%d %H:%M:%S.%f+00").encode("ascii")


def row_values(row: PositionRow) -> tuple[wire.Value, ...]:
    return (row.link.encode("ascii"), row.peer_site.encode("ascii"), b"%d" % row.applied_gid,
            b"%d" % row.peer_clock, b"%d" % row.max_replicated, timestamp_text(row.updated_at))


def final_writeset(step: LinkWriteset, remote: Optional[wire.Writeset], current: Optional[PositionRow],
                   decision: Decision, encoding: int = wire.UTF8) -> bytes:
    """The writeset every node applies at the link writeset's GID: for :data:`Decision.APPLY`
    ``remote`` (the peer's writeset, decoded in full) with the link's row written after its rows
    (inserted the first time, else updated), else an empty one (the GID commits, nothing changes).
    The peer's schema changes (docs/LINKS.md section 8.1) stay in their place among its rows."""
    if decision != Decision.APPLY:
        return wire.empty(remote.encoding if remote is not None else encoding)
    if remote is None or remote.scanned:
        raise ValueError("the peer's writeset is needed decoded in full")
    if remote.toi or remote.concurrent:
        raise ValueError("a link writeset carries no ordering request or concurrent index change")
    new = row_values(advanced(current, step))
    t = len(remote.tables)
    item = (wire.Row(wire.OP_INSERT, t, (), new) if current is None
            else wire.Row(wire.OP_UPDATE, t, (step.link.encode("ascii"),), new))
    return wire.encode(wire.Writeset(remote.xid, remote.pid, remote.last_seen, (*remote.tables, POSITION_TABLE),
                                     (*remote.rows, item), (*remote.keys, position_key(step.link)),
                                     flags=remote.flags, encoding=remote.encoding))


def reflected(payload: bytes) -> Optional[PositionRow]:
    """The link's row a link writeset's log record committed (what :func:`final_writeset` made
    of it), or None for one that committed empty. Its ``peer_clock`` is the peer's clock value
    this site had applied by then: the reflection this site's sender passes back to the peer
    at that point of the log ([epoch]: the ClockVal events passed through)."""
    return reflected_in(wire.decode(payload))


def reflected_in(ws: wire.Writeset) -> Optional[PositionRow]:
    """:func:`reflected` of the record's writeset, decoded."""
    for item in reversed(ws.rows):
        if isinstance(item, wire.Row) and item.op != wire.OP_DELETE:
            t = ws.tables[item.table]
            if (t.nspname, t.relname) == (POSITION_TABLE.nspname, POSITION_TABLE.relname):
                v = item.new
                if any(x is None or isinstance(x, (wire.Binary, wire.Unchanged)) for x in v[:5]):
                    raise wire.WireError("a link position row without its values")
                return PositionRow(bytes(v[0] or b"").decode(), bytes(v[1] or b"").decode(), int(v[2] or 0),
                                   int(v[3] or 0), int(v[4] or 0), 0)
    return None



# A batch (docs/LINKS.md section 3.1): the receiver sends the peer's consecutive transactions on
# in one link writeset, one GID here, applied in one transaction, each decided in turn as if it
# were a link writeset of its own (:func:`steps`), each seeing the rows of those before it.

def steps(msg: LinkWriteset) -> tuple[LinkWriteset, ...]:
    """The peer transactions link writeset ``msg`` carries, each as a link writeset of its own
    (the ticket, the time sent on and the settings are the message's; each follows the one before
    it, the first the message's ``after``): :func:`decide`, :func:`final_writeset` and the
    settlement take them one at a time."""
    if not msg.steps:
        return (msg,)
    out = []
    after = msg.after
    for st in msg.steps:
        out.append(dataclasses.replace(msg, after=after, peer_gid=st.peer_gid, peer_clock=st.peer_clock,
                                       max_replicated=st.max_replicated, commit_time=st.commit_time,
                                       writeset=st.writeset, steps=()))
        after = st.peer_gid
    return tuple(out)


def outcome(decisions: Sequence[Decision]) -> Decision:
    """What a link writeset did, given what each of its peer transactions did: the first that was
    neither applied nor a duplicate (the receiver then resumes from the position), else applied
    if any was, else a duplicate."""
    for d in decisions:
        if d not in (Decision.APPLY, Decision.DUPLICATE):
            return d
    return Decision.APPLY if Decision.APPLY in decisions else Decision.DUPLICATE


def batchable(ws: wire.Writeset) -> bool:
    """Whether a peer transaction may go in a batch: no schema change, and no table without a
    primary key (the apply orders such a table's writesets by its rows' changes, which a batch's
    writeset of keys alone does not carry); others go alone."""
    return not ws.has_schema and not any(t.full_identity for t in ws.tables)


def batch(items: Sequence[LinkWriteset]) -> LinkWriteset:
    """One link writeset carrying ``items`` (consecutive ones of one link, each following the one
    before, all sent on by one receiver): the first's ``after``, the last's numbers, and for
    certification and the scheduler a writeset of the keys of them all, without rows. One item is
    itself."""
    if len(items) == 1:
        return items[0]
    first, last = items[0], items[-1]
    keys: dict[wire.Key, None] = {}
    encoding = wire.UTF8
    for i, m in enumerate(items):
        if i and m.after != items[i - 1].peer_gid:
            raise ValueError(f"peer GID {m.peer_gid} follows {m.after}, not {items[i - 1].peer_gid}")
        ws = wire.scan(m.writeset)
        if not batchable(ws):
            raise ValueError(f"peer GID {m.peer_gid} is a transaction sent on alone")
        encoding = ws.encoding
        keys.update(dict.fromkeys(ws.keys))
    head = wire.encode(wire.Writeset(0, 0, 0, (), (), tuple(keys), encoding=encoding))
    return dataclasses.replace(last, after=first.after, writeset=head,
                               steps=tuple(LinkStep(m.peer_gid, m.peer_clock, m.max_replicated, m.commit_time,
                                                    m.writeset) for m in items))


def merged(finals: Sequence[bytes]) -> bytes:
    """The writeset a batch commits, as its GID's log record: what each of its transactions
    committed (:func:`final_writeset`), in order, as one writeset (its tables one after another,
    its rows and keys in order, each table once). Applying it is applying them one after another in one
    transaction: what a node that catches up from the log does."""
    if len(finals) == 1:
        return finals[0]
    parts = [wire.decode(f) for f in finals]
    rows: list[wire.Item] = []
    keys: list[wire.Key] = []
    index: dict[wire.Table, int] = {}
    for ws in parts:
        at = [index.setdefault(t, len(index)) for t in ws.tables]  # a table of several once
        for r in ws.rows:
            if not isinstance(r, wire.Row):
                raise ValueError("a batch carries no schema change (batchable)")
            rows.append(r._replace(table=at[r.table]))
        keys += ws.keys
    tables = list(index)
    first = next((ws for ws in parts if ws.rows), parts[0])
    if not rows:
        return wire.empty(first.encoding)
    return wire.encode(wire.Writeset(first.xid, first.pid, first.last_seen, tuple(tables), tuple(rows), tuple(keys),
                                     flags=first.flags, encoding=first.encoding))
