"""A model of two linked sites for the link core's unit tests (docs/LINKS.md): each site a
single ordered log (its total order), rows and stamps in dictionaries (``chorus.link_stamp``),
a window per direction; streams delivered one item at a time in whatever interleaving a test
chooses. The decisions are the core's (chorus.link); only the bookkeeping is here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from chorus import wire
from chorus.link.clock import LinkWindow, SiteClock
from chorus.link.conflict import Detection, Reason, TransactionDecision, settle
from chorus.link.events import ClockEvent, RemoteTransaction, Stamp, row_key
from chorus.link.policy import Policy

TABLE = wire.Table("public", "t", (wire.Column("id", "text"), wire.Column("v", "text"), wire.Column("n", "int8")), (0,))


def ws(*rows: wire.Row) -> wire.Writeset:
    keys = tuple(row_key(TABLE, r) for r in rows)
    return wire.Writeset(0, 0, 0, (TABLE,), tuple(rows), keys)


def upsert(key: str, v: str, n: int = 0, old: Optional[tuple[wire.Value, ...]] = None) -> wire.Row:
    return wire.Row(wire.OP_UPDATE, 0, old if old is not None else (key.encode(),), (key.encode(), v.encode(), str(n).encode()))


def delete(key: str) -> wire.Row:
    return wire.Row(wire.OP_DELETE, 0, (key.encode(),))


def khash(key: str) -> bytes:
    return row_key(TABLE, delete(key)).hashed()


@dataclass
class Detected:
    site: str
    incoming: tuple[str, int]  # (site, clock) of the incoming change
    local: tuple[str, int]  # the local stamp it met
    key: bytes
    winner: Optional[tuple[str, int]]  # None: rejected with its transaction
    truth: bool  # whether the peer had not applied the local change when it committed the incoming one


LogItem = Union[RemoteTransaction, ClockEvent]


@dataclass
class Site:
    name: str
    peer: str
    policy: Policy
    arbiter: str
    detection: Detection = Detection.ROW
    unique_clock: bool = True
    realign: bool = True
    clock_start: int = 0
    rows: dict[bytes, Optional[tuple[wire.Value, ...]]] = field(default_factory=dict)
    stamps: dict[bytes, Stamp] = field(default_factory=dict)
    log: list[LogItem] = field(default_factory=list)  # own transactions and passed-through clock events
    sent: int = 0  # how much of the log the peer received
    detected: list[Detected] = field(default_factory=list)
    # row checks against a stamp of ours whose answer differs from the truth (must stay empty
    # with the GID clock): (incoming, stamp, in_conflict)
    mismatches: list[tuple[tuple[str, int], Stamp, bool]] = field(default_factory=list)
    applied_peer: int = 0  # highest peer clock value applied here (for the tests' truth)
    seen_at_commit: dict[int, int] = field(default_factory=dict)  # own clock -> applied_peer then
    time: int = 0

    def __post_init__(self) -> None:
        self.clock = SiteClock(self.name, self.clock_start)
        # the steady start: the peer has applied every change of ours stamped below this
        self.window = LinkWindow(self.name, self.peer, max_replicated=self.clock_start + (1 if self.unique_clock else 0),
                                 unique_clock=self.unique_clock)

    # LocalRows
    def stamp(self, key: bytes) -> Optional[Stamp]:
        return self.stamps.get(key)

    def values(self, table: wire.Table, key: wire.Key) -> Optional[tuple[wire.Value, ...]]:
        return self.rows.get(key.hashed())

    def commit(self, *rows: wire.Row, time: Optional[int] = None, realign: bool = False) -> RemoteTransaction:
        """A local transaction: with the GID clock it takes the next clock value."""
        if self.unique_clock:
            self.clock.advance(self.clock.value + 1)
        t = time if time is not None else self.time + 1
        self.time = max(self.time, t)
        txn = RemoteTransaction(self.name, self.clock.value, t, ws(*rows), realign)
        for r in rows:
            h = row_key(TABLE, r).hashed()
            self.rows[h] = None if r.op == wire.OP_DELETE else r.new
            self.stamps[h] = Stamp(self.name, self.clock.value, t)
        self.seen_at_commit[self.clock.value] = self.applied_peer
        self.log.append(txn)
        return txn

    def tick(self) -> None:
        self.log.append(self.clock.tick())

    def stream(self) -> list[LogItem]:
        """What the peer has not received yet: own transactions and clock events (own ticks and
        the peer's passed through); the link sends nothing of the peer's back."""
        return self.log[self.sent:]

    def receive(self, item: LogItem, peer: "Site") -> Optional[TransactionDecision]:
        if isinstance(item, ClockEvent):
            out = self.window.observe(item)
            if out is not None:
                self.log.append(out)
            return None
        decision = settle(self.window, [item], self, lambda t: self.policy, self.detection, self.arbiter)[0]
        realign: list[wire.Row] = []
        realign_time = 0
        for rd in decision.rows:
            row = item.writeset.rows[rd.item]
            assert isinstance(row, wire.Row)
            if rd.stamp is not None and rd.stamp.site == self.name and rd.reason in (None, Reason.ROW):
                truth = rd.stamp.clock > peer.seen_at_commit[item.clock]
                if truth != rd.in_conflict:
                    self.mismatches.append(((item.site, item.clock), rd.stamp, rd.in_conflict))
            if rd.in_conflict:
                assert rd.stamp is not None
                w = rd.decision.winner if rd.decision is not None else None
                self.detected.append(Detected(
                    self.name, (item.site, item.clock), (rd.stamp.site, rd.stamp.clock), rd.key,
                    None if w is None else (w.site, w.clock),
                    rd.stamp.site == self.name and rd.stamp.clock > peer.seen_at_commit[item.clock]))
            if rd.applied:
                self.rows[rd.key] = rd.values
            if rd.stamp_after is not None:
                self.stamps[rd.key] = rd.stamp_after
            if rd.realign and self.realign:
                if rd.decision is not None:
                    realign_time = max(realign_time, rd.decision.winner.commit_time)
                cur = self.rows.get(rd.key)
                realign.append(delete(row.old[0].decode()) if cur is None  # type: ignore[union-attr]
                               else wire.Row(wire.OP_UPDATE, 0, cur, cur))
        self.applied_peer = max(self.applied_peer, item.clock)
        if self.unique_clock:
            self.clock.advance(self.clock.value + 1)  # the link writeset takes a GID here
        ev = self.window.applied(item)
        if ev is not None:
            self.log.append(ev)
        if realign:
            self.commit(*realign, time=realign_time or self.time, realign=True)
        return decision


def deliver(src: Site, dst: Site, n: int = 1) -> int:
    """Deliver up to ``n`` stream items from ``src`` to ``dst``; how many were."""
    done = 0
    while done < n and src.sent < len(src.log):
        item = src.log[src.sent]
        src.sent += 1
        dst.receive(item, src)
        done += 1
    return done


def drain(a: Site, b: Site) -> None:
    while deliver(a, b, 1 << 30) + deliver(b, a, 1 << 30):
        pass


Step = Callable[[Site, Site], None]
