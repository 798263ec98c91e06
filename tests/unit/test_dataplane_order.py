"""The order core in C (coordinator/chorus/dataplane/native/order.c, bound by dataplane/native.py
as NativeOrderCore) against the reference, dataplane/order.py's OrderCore (docs/NATIVE.md
sections 2.6 and 4.3; invariants 1, 2 and 8: one order, deterministic certification, nothing
acknowledged before a quorum has it).

A Hypothesis state machine drives both with the same calls, as the replicator makes them:
writesets and batches from this node (scanned by its backend first, or not) and from others, with
keys from a small pool (so they conflict), snapshots of any age, schema changes in a transaction,
ordering requests (TOI) and concurrent index changes, and malformed ones; schema changes'
outcomes, Received reports from members in and out of the view, ticks, views and votes (quorum,
tie breaker), members joining at a GID, the origin leaving the primary component, not following,
purges, leaving and installing a joined state, and peer sites' transactions sent on by a link's
receiver. After every step it requires the same actions,
GIDs, counters, held and deferred writesets, open schema changes, reports, conflicts, outcomes,
certification index (its snapshot's bytes) and schema-change rounds opened. Then the golden traces
replayed with the C order core in the replicator."""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from chorus import wire
from chorus.actions import Apply, LocalVerdict
from chorus.bus import Votes
from chorus.bus import proto as bp
from chorus.certifier import PyCertifier
from chorus.dataplane import native
from chorus.dataplane.order import OrderCore

from test_dataplane_trace import sim_traces  # noqa: F401 - the fixture

SCALE = int(os.environ.get("CHORUS_FUZZ_SCALE", "1"))

pytestmark = pytest.mark.usefixtures("native_core")

NODE = "n1"
MEMBERS = {"n1": "1:a", "n2": "2:b", "n3": "3:c"}
PARTS = [(b"public", b"a"), (b"public", b"a", b"id", b"1"), (b"public", b"a", b"id", b"2"),
         (b"public", b"b", b"k", b"\xe9t\xe9"), (b"x",), (b"s", b"a\"b", b"c", b"1", b"2")]
keys = st.lists(st.builds(lambda m, p: wire.Key(m, p), st.sampled_from(list(wire.KeyMode)), st.sampled_from(PARTS)),
                max_size=4)
STATEMENT = wire.Schema((("search_path", "public"),), "alice", b"ALTER TABLE a ADD c int")
# what a writeset is: mostly plain, now and then a schema change of each kind, or malformed
kinds = st.sampled_from(["plain"] * 8 + ["ddl", "toi", "concurrent", "malformed"])


def writeset(kind: str, last_seen: int, ks: list[wire.Key], xid: int, damage: int) -> bytes:
    rows: tuple[wire.Item, ...] = ()
    flags = 0
    if kind == "ddl":
        rows = (STATEMENT,)
    elif kind == "toi":
        rows, flags = (STATEMENT,), wire.FLAG_TOI
    elif kind == "concurrent":
        rows, flags = (STATEMENT,), wire.FLAG_CONCURRENT
    buf = wire.encode(wire.Writeset(xid, 100 + xid, last_seen, (), rows, tuple(ks), flags))
    if kind == "malformed":
        b = bytearray(buf)
        b[damage % len(b)] ^= 0xFF
        buf = bytes(b[:max(2, len(b) - damage % 5)])
    return buf


def _raw(ws: wire.Writeset) -> bytes:
    return bytes(ws.raw)


class _Members:
    """What the order core reads of the membership: who is online, where each bus node joined."""

    def __init__(self) -> None:
        self.online = dict(MEMBERS)
        self.joined_at: dict[str, int] = {}


class OrderPair(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.members = _Members()
        self.now = 1000.0
        self.rounds: dict[str, list[tuple[int, str]]] = {"py": [], "c": []}
        self.py: Any = OrderCore(NODE, self.members, PyCertifier(), self._round("py"), lambda: self.now)
        self.c: Any = native.NativeOrderCore(NODE, self.members, native.NativeCertifier(), self._round("c"),
                                             lambda: self.now)
        self.ticket = 0
        self.xid = 0
        for core in (self.py, self.c):
            core.following, core.quorate, core.local_member = True, True, MEMBERS[NODE]

    def _round(self, side: str) -> Any:
        def open_round(gid: int, origin: str) -> bool:
            self.rounds[side].append((gid, origin))
            return gid % 3 != 0
        return open_round

    def both(self, call: str, *args: Any) -> Any:
        self.now += 1.0
        out = getattr(self.py, call)(*args)
        got = getattr(self.c, call)(*args)
        assert got == out, call
        return out

    def set_both(self, name: str, value: Any) -> None:
        setattr(self.py, name, value)
        setattr(self.c, name, value)

    def _message(self, origin: str, kind: str, back: int, ks: list[wire.Key], damage: int,
                 scanned: bool) -> bp.WritesetMsg:
        self.ticket += 1
        self.xid += 1
        buf = writeset(kind, max(0, self.py.gid - back), ks, self.xid, damage)
        if origin == NODE and scanned and kind != "malformed":
            ws = wire.scan(buf)
            self.py.expect_local(self.ticket, ws)
            self.c.expect_local(self.ticket, ws)
        return bp.WritesetMsg(origin, self.ticket, buf)

    @rule(origin=st.sampled_from(list(MEMBERS)), kind=kinds, back=st.integers(-1, 6), ks=keys,
          damage=st.integers(0, 200), scanned=st.booleans())
    def deliver(self, origin: str, kind: str, back: int, ks: list[wire.Key], damage: int, scanned: bool) -> None:
        self.both("writeset", self._message(origin, kind, back, ks, damage, scanned))

    @rule(origin=st.sampled_from(list(MEMBERS)),
          batch=st.lists(st.tuples(kinds, st.integers(-1, 6), keys, st.integers(0, 200), st.booleans()),
                         min_size=2, max_size=5))
    def deliver_batch(self, origin: str, batch: list[tuple[str, int, list[wire.Key], int, bool]]) -> None:
        """A WritesetBatch: its writesets one after the other, as Replicator._handle takes them."""
        for kind, back, ks, damage, scanned in batch:
            self.both("writeset", self._message(origin, kind, back, ks, damage, scanned))

    @rule(node=st.sampled_from(list(MEMBERS) + ["n4"]), kind=st.sampled_from(["plain"] * 6 + ["ddl", "malformed"]),
          ks=keys, link=st.sampled_from(["l1", "l2"]), damage=st.integers(0, 200))
    def deliver_link(self, node: str, kind: str, ks: list[wire.Key], link: str, damage: int) -> None:
        """A peer site's transaction sent on by a receiver (docs/LINKS.md section 3)."""
        self.ticket += 1
        buf = writeset(kind, 0, ks, 0, damage)
        self.both("link_writeset", bp.LinkWriteset(node, self.ticket, link, "site-b", self.ticket - 1, self.ticket,
                                                   0, 0, 0, 0, buf))

    @precondition(lambda self: bool(self.py.ddl_open))
    @rule(pick=st.integers(0, 3), ok=st.booleans(), content=st.one_of(st.none(), keys))
    def ddl_settled(self, pick: int, ok: bool, content: Any) -> None:
        gids = sorted(self.py.ddl_open)
        ws = None if content is None else wire.scan(writeset("ddl", 0, content, 0, 0))
        self.both("ddl_settled", gids[pick % len(gids)], ok, "" if ok else "it failed", ws)

    @rule(member=st.sampled_from(list(MEMBERS.values()) + ["4:d"]), node=st.sampled_from(list(MEMBERS)),
          back=st.integers(-2, 4), in_view=st.booleans())
    def received(self, member: str, node: str, back: int, in_view: bool) -> None:
        self.both("received_report", member, bp.Received(node, max(0, self.py.gid - back)), in_view)

    @rule()
    def tick(self) -> None:
        self.both("tick")

    @rule()
    def release(self) -> None:
        self.both("release")

    @rule(quorum=st.integers(1, 3), expected=st.integers(1, 4), tie=st.sampled_from(["", "1", "2", "4"]),
          new_view=st.booleans())
    def votes(self, quorum: int, expected: int, tie: str, new_view: bool) -> None:
        v = Votes(quorum, expected, tie)
        if new_view:
            self.both("view_changed", v)
        else:
            self.set_both("votes", v)

    @rule(bus=st.sampled_from(["1", "2", "3", "4"]), back=st.integers(-2, 6), drop=st.booleans())
    def joined(self, bus: str, back: int, drop: bool) -> None:
        if drop:
            self.members.joined_at.pop(bus, None)
        else:
            self.members.joined_at[bus] = max(0, self.py.gid - back)

    @rule(node=st.sampled_from(["n2", "n3"]))
    def origin_leaves_or_comes_back(self, node: str) -> None:
        if node in self.members.online:
            del self.members.online[node]
        else:
            self.members.online[node] = MEMBERS[node]

    @rule(following=st.booleans(), quorate=st.booleans())
    def phase(self, following: bool, quorate: bool) -> None:
        self.set_both("following", following or quorate)  # now and then one of them off
        self.set_both("quorate", quorate or following)

    @rule(back=st.integers(0, 8), history=st.integers(0, 3))
    def purge(self, back: int, history: int) -> None:
        self.both("purge", self.py.gid - back, history)

    @rule(catching_up=st.booleans())
    def leave(self, catching_up: bool) -> None:
        self.set_both("catching_up", catching_up)
        self.both("leave")
        assert self.c.will_hold == self.py.will_hold

    @rule(ahead=st.integers(0, 5), held=st.integers(0, 3), local=st.booleans())
    def install(self, ahead: int, held: int, local: bool) -> None:
        """A join: the GID, a certification index from a snapshot, and certified writesets held."""
        gid = self.py.gid + ahead
        snap = self.py.certifier.snapshot()
        for core, cert in ((self.py, PyCertifier.restore(snap)), (self.c, native.NativeCertifier.restore(snap))):
            unstable: list[tuple[int, Any]] = []
            for i in range(held):
                ws = wire.scan(writeset("plain", gid, [wire.Key(wire.KeyMode.UPDATE, PARTS[i])], 7, 0))
                g = gid + 1 + i
                link = bp.LinkWriteset("n2", 5, "l1", "site-b", 0, 1, 0, 0, 0, 0, _raw(ws)) if i == 2 else None
                unstable.append((g, LocalVerdict(900 + i, True, g, g - 1, "", ws) if local and i == 0
                                 else Apply(g, g - 1, "link:l1" if link else "n2", ws, link=link)))
            core.install(gid + held, gid + held, gid, unstable, cert)

    @rule(origin=st.sampled_from(list(MEMBERS)), n=st.integers(1, 3))
    def refuse_own(self, origin: str, n: int) -> None:
        msg = bp.WritesetBatch(origin, tuple((self.ticket + i, b"") for i in range(n)))
        self.both("refuse_own", msg)

    @rule()
    def forget(self) -> None:
        self.both("forget_local", self.ticket)

    @invariant()
    def same_state(self) -> None:
        py, c = self.py, self.c
        assert (c.gid, c.last_certified, c.released, c.held_count, c.deferred_count) == (
            py.gid, py.last_certified, py.released, py.held_count, py.deferred_count)
        assert c.ddl_open == py.ddl_open
        assert c.stats.as_dict() == dataclasses.asdict(py.stats)
        assert list(c.conflicts) == list(py.conflicts)
        assert c.received == py.received
        assert (c._st.reported, c._st.report_on_bus, c._st.report_last_tick) == (
            py._reported, py._report_on_bus, py._report_last_tick)
        assert (len(c.outcomes), c.outcomes.complete_after) == (len(py.outcomes), py.outcomes.complete_after)
        assert all(c.outcomes.get(o, x) == py.outcomes.get(o, x) for o, x in py.outcomes._by_txn)
        assert c.certifier.snapshot() == py.certifier.snapshot()
        assert c.local_in_flight() == py.local_in_flight()
        assert c.unstable_entries() == py.unstable_entries()
        assert self.rounds["c"] == self.rounds["py"]


def test_same_actions_and_state() -> None:
    run_state_machine_as_test(OrderPair, settings=settings(max_examples=150 * SCALE, stateful_step_count=50,
                                                           deadline=None))


def _pair() -> tuple[Any, Any, _Members]:
    m = _Members()
    py = OrderCore(NODE, m, PyCertifier(), lambda g, o: False, lambda: 5.0)
    c = native.NativeOrderCore(NODE, m, native.NativeCertifier(), lambda g, o: False, lambda: 5.0)
    for core in (py, c):
        core.following, core.quorate, core.local_member = True, True, MEMBERS[NODE]
    return py, c, m


def test_uniform_commit_holds_until_a_quorum_reports() -> None:
    py, c, _ = _pair()
    out = []
    for core in (py, c):
        core.view_changed(Votes(2, 3, ""))
        ws = [core.writeset(bp.WritesetMsg("n2", i, writeset("plain", 0, [wire.Key(wire.KeyMode.UPDATE, PARTS[i])],
                                                               i, 0))) for i in (1, 2)]
        out.append((ws, core.held_count, core.received_report("2:b", bp.Received("n2", 1), True), core.held_count,
                    core.tick(), core.tick(), core.received_report("2:b", bp.Received("n2", 2), True)))
    assert out[0] == out[1]
    assert [len(a) for a in out[0][0]] == [1, 0] and out[0][1] == 2 and out[0][3] == 1  # a report, then one released


@pytest.mark.parametrize("votes", [Votes(2, 2, "1"), Votes(2, 2, "2"), Votes(2, 3, "1"), Votes(3, 4, "1"),
                                   Votes(1, 1, "1"), Votes(2, 4, "")])
def test_the_tie_breaker(votes: Votes) -> None:
    """Half the votes with the tie breaker among them is a quorum; without it, or not half, not."""
    py, c, _ = _pair()
    out = []
    for core in (py, c):
        core.view_changed(votes)
        ws = writeset("plain", 0, [wire.Key(wire.KeyMode.UPDATE, PARTS[1])], 1, 0)
        out.append((core.writeset(bp.WritesetMsg("n2", 1, ws)), core.held_count,
                    core.received_report("2:b", bp.Received("n2", 1), True), core.held_count))
    assert out[0] == out[1]
    assert out[0][1] == (0 if votes in (Votes(2, 2, "1"), Votes(1, 1, "1")) else 1)


def test_a_schema_change_defers_what_follows() -> None:
    py, c, _ = _pair()
    runs = []
    for core in (py, c):
        a = core.writeset(bp.WritesetMsg("n2", 1, writeset("toi", 0, [], 1, 0)))
        table_and_row = [wire.Key(wire.KeyMode.REFERENCE, PARTS[0]), wire.Key(wire.KeyMode.UPDATE, PARTS[1])]
        b = core.writeset(bp.WritesetMsg("n1", 2, writeset("plain", 0, table_and_row, 2, 0)))
        deferred = core.deferred_count
        settled = core.ddl_settled(1, True, "", wire.scan(writeset("ddl", 0, [wire.Key(wire.KeyMode.EXCLUSIVE, PARTS[0])],
                                                                     3, 0)))
        runs.append((a, b, deferred, settled, core.stats.cert_failures))
    assert runs[0] == runs[1]
    assert runs[0][2] == 1 and runs[0][4] == 1  # the local writeset failed against the schema change


def test_the_byte_budget_refuses() -> None:
    m = _Members()
    c = native.NativeOrderCore(NODE, m, native.NativeCertifier(), lambda g, o: False, max_bytes=4096)
    c.following = c.quorate = True
    c.local_member = MEMBERS[NODE]
    c.view_changed(Votes(2, 3, ""))  # everything is held: the queue grows
    with pytest.raises(MemoryError):
        for i in range(10000):
            c.writeset(bp.WritesetMsg("n2", i, writeset("plain", 0, [], i, 0)))
    assert 0 < c.nbytes <= 4096


# ---- the golden traces, replayed with the C order core in the replicator ---------------------------

TRACES = sorted((Path(__file__).resolve().parents[1] / "golden" / "traces").glob("*.trace"))


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_golden_traces_replay_with_the_c_order_core(path: Path) -> None:
    from chorus.dataplane import replay
    from chorus.dataplane.trace import load

    trace = load(path)
    d = replay.check(trace, impl="native", orders=native.NativeOrderCore)
    assert d is None, str(d)


def test_simulation_traces_replay_with_the_c_order_core(sim_traces: dict[str, Any]) -> None:
    """The traces test_dataplane_trace.py records from simulation seeds (partitions, freezes,
    kills, a power cut, catch-ups), replayed with the C order core, certifier and scheduler."""
    from chorus.dataplane import replay

    for name, trace in sim_traces.items():
        d = replay.check(trace, impl="native", orders=native.NativeOrderCore)
        assert d is None, f"{name}: {d}"


def test_a_wrong_order_core_is_caught() -> None:
    """The replay is not blind to the order core: one that certifies nothing shows."""
    from chorus.dataplane import replay
    from chorus.dataplane.trace import load

    class Lax(native.NativeOrderCore):
        def writeset(self, msg: bp.WritesetMsg) -> list[Any]:
            out = super().writeset(msg)
            return [dataclasses.replace(a, prev=a.prev + 1) if isinstance(a, Apply) else a for a in out]

    assert any(replay.check(load(p), impl="native", orders=Lax) is not None for p in TRACES)


def test_random_streams_agree() -> None:
    """A long stream of pgbench-like writesets from three nodes, with conflicts: same actions."""
    py, c, _ = _pair()
    rnd = random.Random(7)
    for i in range(3000):
        origin = ("n1", "n2", "n3")[i % 3]
        ks = [wire.Key(wire.KeyMode.REFERENCE, (b"public", b"a")),
              wire.Key(wire.KeyMode.UPDATE, (b"public", b"a", b"id", str(rnd.randrange(50)).encode()))]
        msg = bp.WritesetMsg(origin, i, writeset("plain", max(0, py.gid - rnd.randrange(4)), ks, i, 0))
        assert c.writeset(msg) == py.writeset(msg)
        if i % 500 == 499:
            py.purge(py.gid, 100)
            c.purge(c.gid, 100)
    assert c.stats.as_dict() == dataclasses.asdict(py.stats) and py.stats.cert_failures > 0
    assert list(c.conflicts) == list(py.conflicts)
