"""What a link's sender sends, decided without I/O (chorus/link/sender.py Outbound; docs/LINKS.md
sections 2 and 4): the site's own transactions in GID order through the link's rules, the peer's
clock passed through where the peer's changes were applied (never those changes), this site's
clock when filtering or idle, and a broken link said as such."""

from __future__ import annotations

from typing import Optional

import pytest

from chorus import wire
from chorus.link import proto
from chorus.link.events import ClockEvent
from chorus.link.rules import RuleSet, TableRule
from chorus.link.proto import Position
from chorus.link.sender import Outbound, Provenance, retained
from chorus.wslog import FLAG_DDL_SKIPPED, LogRecord

T = wire.Table("public", "t", (wire.Column("id", "int4"), wire.Column("region", "text")), (0,))
AUDIT = wire.Table("public", "audit", (wire.Column("id", "int4"),), (0,))


def ws(*rows: tuple[int, str], audit: bool = False) -> bytes:
    items: list[wire.Item] = [wire.Row(wire.OP_INSERT, 0, (), (str(i).encode(), r.encode())) for i, r in rows]
    if audit:
        items.append(wire.Row(wire.OP_INSERT, 1, (), (b"1",)))
    keys = tuple(wire.Key(wire.KeyMode.EXCLUSIVE, (b"public", b"t", b"id", str(i).encode())) for i, _ in rows)
    return wire.encode(wire.Writeset(1, 2, 0, (T, AUDIT) if audit else (T,), tuple(items), keys))


class Regions:
    """The row filter ``region = 'x'``, as PostgreSQL would evaluate it."""

    def predicate(self, table: wire.Table, values: tuple[wire.Value, ...], predicate: str) -> bool:
        return values[1] == predicate.partition(" = ")[2].strip("'").encode()

    def expression(self, table: wire.Table, values: tuple[wire.Value, ...], expression: str) -> wire.Value:
        raise AssertionError("no computed columns here")

    def row_function(self, table: wire.Table, values: tuple[wire.Value, ...],
                     function: str) -> Optional[tuple[wire.Value, ...]]:
        raise AssertionError("no row functions here")


def facts(r: LogRecord) -> Provenance:
    """This test's marking of link-applied records: origin ``link:<site>:<clock value>``."""
    if r.origin.startswith("link:"):
        _, site, value = r.origin.split(":")
        return Provenance(r.gid * 10, site, ClockEvent(site, int(value)))
    return Provenance(r.gid * 10)


def outbound(after: int = 0, rules: RuleSet = RuleSet(), interval: float = 1.0, clock: int = 0) -> Outbound:
    return Outbound("A", "B", Position(after, clock), rules, Regions(), facts, clock_interval=interval)


def sent(frames: list[proto.Record | ClockEvent]) -> list[object]:
    return [(f.gid, f.commit_time) if isinstance(f, proto.Record) else f for f in frames]


def test_own_transactions_go_in_gid_order_with_their_commit_time() -> None:
    o = outbound(after=3)
    payload = ws((1, "eu"))
    frames = o.take(LogRecord(5, "n1", 0, payload), now=0.0) + o.take(LogRecord(8, "n2", 0, payload), now=0.0)
    assert sent(frames) == [(5, 50), (8, 80)]
    assert all(isinstance(f, proto.Record) and f.site == "A" and f.writeset == payload for f in frames)
    assert o.position == 8 and o.sent == 2
    with pytest.raises(ValueError, match="GID order"):
        o.take(LogRecord(8, "n1", 0, payload), now=0.0)


def test_what_came_from_the_peer_goes_back_only_as_its_clock() -> None:
    """Section 4: B's sender does not send A's rows back; the clock event passed through with
    them is sent at their place, which is how A's windows close ([epoch] "passed through")."""
    o = outbound(interval=10.0)
    assert o.take(LogRecord(1, "n1", 0, ws((1, "eu"))), now=0.0)[0] == proto.Record(1, "A", 10, ws((1, "eu")))
    assert o.take(LogRecord(2, "link:B:41", 0, ws((2, "eu"))), now=1.0) == [ClockEvent("B", 41)]
    # a record of a third site is not sent on without forward (docs/LINKS.md section 10.2), nor is its clock
    assert o.take(LogRecord(3, "link:C:7", 0, ws((3, "eu"))), now=2.0) == []
    assert o.position == 3 and (o.sent, o.filtered, o.returned) == (1, 1, 1)


def test_rules_drop_and_reshape_before_sending() -> None:
    rules = RuleSet(exclude=("public.audit",), tables=(TableRule("public.t", row_filter="region = 'eu'"),))
    o = outbound(rules=rules, interval=10.0)
    assert o.take(LogRecord(1, "n1", 0, ws((1, "us"))), now=0.0) == [ClockEvent("A", 2)]  # nothing left: filtered
    (r,) = o.take(LogRecord(2, "n1", 0, ws((1, "us"), (2, "eu"), audit=True)), now=0.0)
    assert isinstance(r, proto.Record)
    carried = wire.decode(r.writeset)
    assert [row.new for row in carried.rows if isinstance(row, wire.Row)] == [(b"2", b"eu")]
    assert [t.relname for t in carried.tables] == ["t"]
    # a writeset the rules carry whole goes as the origin wrote it
    whole = ws((3, "eu"))
    (r,) = o.take(LogRecord(3, "n1", 0, whole), now=0.0)
    assert isinstance(r, proto.Record) and r.writeset is whole


def test_a_schema_change_that_failed_is_not_sent() -> None:
    o = outbound()
    assert o.take(LogRecord(4, "n1", FLAG_DDL_SKIPPED, wire.empty()), now=0.0) == [ClockEvent("A", 5)]


def test_the_own_clock_goes_out_when_idle_or_filtering_every_interval() -> None:
    o = outbound(after=10, interval=1.0)
    assert o.idle(bound=10, now=100.0) == [ClockEvent("A", 11)]  # at once on a new stream
    assert o.idle(bound=12, now=100.5) == []  # not more often than the interval
    assert o.idle(bound=12, now=101.0) == [ClockEvent("A", 13)]
    assert o.idle(bound=12, now=102.0) == [ClockEvent("A", 13)]  # unchanged: the sender is alive
    o.take(LogRecord(14, "n1", 0, ws((1, "eu"))), now=102.5)  # a record carries the clock itself
    assert o.idle(bound=14, now=103.0) == []
    assert o.take(LogRecord(15, "link:B:3", 0, ws((1, "eu"))), now=103.2) == [ClockEvent("B", 3)]
    assert o.take(LogRecord(16, "link:B:4", 0, ws((1, "eu"))), now=103.6) == [ClockEvent("B", 4), ClockEvent("A", 17)]
    assert o.idle(bound=16, now=104.0) == []


def test_the_clock_never_goes_below_what_the_receiver_saw() -> None:
    """A receiver resuming after a reconnect, or from another node of the site that had got
    further than this one committed: the clock events sent must not take its view of this
    site's clock back (clock.LinkWindow refuses that)."""
    assert outbound(after=50).idle(bound=20, now=0.0) == [ClockEvent("A", 51)]
    # it had seen clock 90 after GID 50 (records 51..89 filtered): passing them again says 90
    o = outbound(after=50, clock=90, interval=0.0)
    assert o.take(LogRecord(60, "link:B:3", 0, ws((1, "eu"))), now=0.0) == [ClockEvent("B", 3), ClockEvent("A", 90)]
    assert o.idle(bound=70, now=1.0) == [ClockEvent("A", 90)]
    assert o.idle(bound=95, now=2.0) == [ClockEvent("A", 96)]


def test_a_resume_position_the_log_no_longer_holds_breaks_the_link() -> None:
    retained(after=9, base_gid=9)
    with pytest.raises(proto.LinkBroken, match=r"link broken: GIDs 6\.\.9 are gone from the log"):
        retained(after=5, base_gid=9)
