"""The conflict window with a logical clock, after the seed's worked example
(ndb-epoch-conflict-windows.txt, "Tracking conflict windows with a logical clock"), replayed
step by step through the link core (docs/LINKS.md sections 4-6)."""

from __future__ import annotations

import pytest

from chorus.link.clock import ClockError, LinkWindow, SiteClock
from chorus.link.conflict import Detection
from chorus.link.events import ClockEvent, RemoteTransaction, Stamp
from chorus.link.policy import PrimaryWins

from linkmodel import Site, khash, upsert, ws


def _seed_sites() -> tuple[Site, Site]:
    # the seed's clocks: A at 39, B at 233; a steady start (each applied all of the other's
    # changes below those values); A is primary; no realignment, to watch the windows alone
    a = Site("A", "B", PrimaryWins("A"), "A", unique_clock=False, realign=False, clock_start=39)
    b = Site("B", "A", PrimaryWins("A"), "A", unique_clock=False, realign=False, clock_start=233)
    return a, b


def test_seed_worked_example_step_by_step() -> None:
    a, b = _seed_sites()
    # Server A's Binlog: MA1..MA3 at 39, ClockVal_A = 40, MA4 MA5 at 40, ClockVal_A = 41, MA6 at 41
    for k in ("x1", "x2", "x3"):
        a.commit(upsert(k, "a"))
    a.tick()
    a.commit(upsert("x4", "a"))
    a.commit(upsert("x5", "a"))
    a.tick()
    a.commit(upsert("x6", "a"))
    assert [s.clock for s in (a.stamps[khash(k)] for k in ("x1", "x2", "x3", "x4", "x5", "x6"))] == [39, 39, 39, 40, 40, 41]

    # Server B commits MB1 (row x1, which MA1 also changed) and MB2, then applies A's Binlog up
    # to ClockVal_A = 40 (MA1, MA2, MA3) and passes the clock event into its own Binlog
    b.commit(upsert("x1", "b"))
    b.commit(upsert("y", "b"))
    assert b.receive(a.log[0], a) is not None and b.detected[-1].local == ("B", 233)  # MA1 meets MB1: in conflict at B
    for item in a.log[1:4]:
        b.receive(item, a)
    assert b.log[-1] == ClockEvent("A", 40)
    b.commit(upsert("x2", "b"))  # MB3: after MA2 at B
    b.commit(upsert("x4", "b"))  # MB4: before MA4 at B
    b.tick()  # ClockVal_B = 234
    b.commit(upsert("x5", "b"))  # MB5
    b.commit(upsert("z", "b"))  # MB6
    for item in a.log[4:7]:  # MA4, MA5, ClockVal_A = 41
        b.receive(item, a)
    b.commit(upsert("x3", "b"), upsert("x6", "b"))  # MB7
    # Server B's Binlog, as the seed lists it (A's rows applied at B are not sent back)
    kinds = [(e.site, e.value) if isinstance(e, ClockEvent) else f"MB@{e.clock}" for e in b.log]
    assert kinds == ["MB@233", "MB@233", ("A", 40), "MB@233", "MB@233", ("B", 234), "MB@234", "MB@234", ("A", 41), "MB@234"]
    # B found MA1, MA4 and MA5 in conflict (its MB1, MB4, MB5 were committed before them)
    assert [d.incoming for d in b.detected] == [("A", 39), ("A", 40), ("A", 40)]

    # Server A applies B's Binlog: max replicated starts at 39 and follows ClockVal_A events
    seen = []
    for item in b.log:
        before = len(a.detected)
        a.receive(item, b)
        if isinstance(item, RemoteTransaction):
            keys = [r.old[0] for r in item.writeset.rows]  # type: ignore[union-attr]
            hit = [d.key for d in a.detected[before:]]
            seen.append((keys, a.window.max_replicated, [k for k in keys if khash(k.decode()) in hit]))
    assert seen == [
        ([b"x1"], 39, [b"x1"]),  # MB1: x1 stamped 39 >= 39: MA1 had not reached B
        ([b"y"], 39, []),  # MB2: a row A never changed
        ([b"x2"], 40, []),  # MB3: ClockVal_A = 40 came first: MA2 happened before MB3 at B
        ([b"x4"], 40, [b"x4"]),  # MB4: x4 stamped 40 >= 40
        ([b"x5"], 40, [b"x5"]),  # MB5
        ([b"z"], 40, []),  # MB6
        ([b"x3", b"x6"], 41, [b"x6"]),  # MB7: x3 (39) is closed, x6 (41) is open
    ]
    # ClockVal_B = 234 was passed through into A's log, to go back to B
    assert a.log[-1] == ClockEvent("B", 234)
    # and MA6, still in flight to B, meets MB7 there: the same conflict, seen from B
    b.receive(a.log[7], a)
    assert b.detected[-1].incoming == ("A", 41) and b.detected[-1].local == ("B", 234)
    # primary wins (A) on both sides: A kept its rows, B took A's
    for k in ("x1", "x4", "x5", "x6"):
        assert a.rows[khash(k)] == b.rows[khash(k)] == (k.encode(), b"a", b"0")


def test_in_conflict_is_at_or_above_max_replicated() -> None:
    w = LinkWindow("A", "B", max_replicated=40)
    assert w.in_conflict(Stamp("A", 40, 0)) and w.in_conflict(Stamp("A", 41, 0))
    assert not w.in_conflict(Stamp("A", 39, 0))
    assert not w.in_conflict(Stamp("B", 10**9, 0))  # last changed by the peer's stream
    assert not w.in_conflict(None)
    assert w.closed(Stamp("A", 39, 0)) and not w.closed(Stamp("A", 40, 0))


def test_max_replicated_only_grows_and_peer_events_pass_through_once() -> None:
    w = LinkWindow("A", "B", max_replicated=10)
    assert w.observe(ClockEvent("A", 12)) is None and w.max_replicated == 12
    w.observe(ClockEvent("A", 11))  # late or repeated: nothing moves back
    assert w.max_replicated == 12
    assert w.observe(ClockEvent("B", 5)) == ClockEvent("B", 5)
    assert w.observe(ClockEvent("B", 5)) is None
    with pytest.raises(ClockError):
        w.observe(ClockEvent("B", 4))
    with pytest.raises(ClockError):
        w.observe(ClockEvent("C", 1))
    assert LinkWindow.restore(w.state).state == w.state


def test_gid_clock_reflects_each_applied_transaction() -> None:
    w = LinkWindow("A", "B")
    txn = RemoteTransaction("B", 7, 0, ws())
    assert w.applied(txn) == ClockEvent("B", 8)  # every change of B below 8 is applied here
    with pytest.raises(ClockError):
        w.applied(RemoteTransaction("B", 6, 0, ws()))
    coarse = LinkWindow("A", "B", unique_clock=False)
    assert coarse.applied(txn) is None  # a coarse clock reflects on its tick events only


def test_site_clock() -> None:
    c = SiteClock("A", 39)
    assert c.tick() == ClockEvent("A", 40) and c.stamp(5) == Stamp("A", 40, 5)
    assert c.advance(40) is None and c.advance(45) == ClockEvent("A", 45)
    with pytest.raises(ClockError):
        c.advance(44)


def test_detection_default_is_per_row() -> None:
    assert Detection("row") == Detection.ROW
