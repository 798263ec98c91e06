"""A chain of three sites, A - B - C, where B forwards A's changes to C and C's to A (docs/LINKS.md
section 10), under every interleaving of the four streams, with the GID clock: each link
detects conflicts between its two sites only (windows per pair of neighbours), a conflict
between A's and C's changes is settled by B's order (link/policy.py ``ChainOrder``), and after
quiescence the three sites hold the same rows; no change is applied twice on any site, and none
goes back to its origin. Random interleavings by hypothesis; the decisions are chorus.link's
(conflict.settle, LinkWindow), the sender's choice is the rule of link/sender.py ``Outbound``."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus import wire
from chorus.bus.proto import LinkWriteset
from chorus.config import ChorusConfigError, LinkConfig, load_config
from chorus.link import position as lp
from chorus.link import proto
from chorus.link.clock import LinkWindow
from chorus.link.conflict import Detection, settle
from chorus.link.events import ClockEvent, RemoteTransaction, Stamp, row_key
from chorus.link.policy import LatestCommitWins, Policy, PrimaryWins
from chorus.link.proto import LinkError, Position
from chorus.link.rules import RuleSet
from chorus.link.sender import Outbound, Provenance
from chorus.link.site import Inbound, NoSql, provenance
from chorus.wslog import LogRecord

from linkmodel import TABLE, delete, khash, upsert, ws
from test_link_apply import BASE as BASE_TOML

KEYS = ("k0", "k1")
NEIGHBOURS = {"A": ("B",), "B": ("A", "C"), "C": ("B",)}
LINKS = [("A", "B"), ("B", "A"), ("B", "C"), ("C", "B")]


@dataclass
class Txn:
    origin: str
    via: Optional[str]  # the neighbour it came from (None: made here)
    gid: int
    rows: tuple[wire.Row, ...]
    time: int


Entry = Union[Txn, ClockEvent]


@dataclass
class ChainSite:
    name: str
    policy: Policy
    primary: Optional[str] = None
    forward: bool = True
    gid: int = 0
    rows: dict[bytes, Optional[tuple[wire.Value, ...]]] = field(default_factory=dict)
    stamps: dict[bytes, Stamp] = field(default_factory=dict)
    log: list[Entry] = field(default_factory=list)
    windows: dict[str, LinkWindow] = field(default_factory=dict)
    applied: list[bytes] = field(default_factory=list)  # every value applied from another site

    def __post_init__(self) -> None:
        # the steady start: each neighbour applied every change of ours below GID 1
        self.windows = {n: LinkWindow(self.name, n, max_replicated=1) for n in NEIGHBOURS[self.name]}

    def stamp(self, key: bytes) -> Optional[Stamp]:
        return self.stamps.get(key)

    def values(self, table: wire.Table, key: wire.Key) -> Optional[tuple[wire.Value, ...]]:
        return self.rows.get(key.hashed())

    def commit(self, row: wire.Row, time: int) -> None:
        self.gid += 1
        h = row_key(TABLE, row).hashed()
        self.rows[h] = None if row.op == wire.OP_DELETE else row.new
        self.stamps[h] = Stamp(self.name, self.gid, time)
        self.log.append(Txn(self.name, None, self.gid, (row,), time))

    def outgoing(self, entry: Entry, dst: str) -> list[Union[RemoteTransaction, ClockEvent]]:
        """What this site's sender to ``dst`` sends for one entry of its log (Outbound's rule)."""
        if isinstance(entry, ClockEvent):  # a reflection: only to the site whose clock it is
            return [entry] if entry.site == dst else []
        if entry.via is None:
            return [RemoteTransaction(self.name, entry.gid, entry.time, ws(*entry.rows))]
        if entry.via != dst and self.forward and entry.origin != dst and entry.rows:
            return [RemoteTransaction(self.name, entry.gid, entry.time, ws(*entry.rows), origin=entry.origin)]
        return [ClockEvent(self.name, entry.gid + 1)]  # filtered: this site's clock moves on

    def receive(self, item: Union[RemoteTransaction, ClockEvent], src: str) -> None:
        window = self.windows[src]
        if isinstance(item, ClockEvent):
            out = window.observe(item)
            if out is not None:
                self.log.append(out)
            return
        assert item.origin != self.name, "a change came back to its origin"
        arbiter = self.primary if self.primary is not None else min(self.name, src)
        self.gid += 1
        (d,) = settle(window, [item], self, lambda t: self.policy, Detection.ROW, arbiter, self.gid)
        kept: list[wire.Row] = []
        for rd in d.rows:
            row = item.writeset.rows[rd.item]
            assert isinstance(row, wire.Row)
            if rd.applied:
                self.rows[rd.key] = rd.values
                key = row.old[0]
                assert isinstance(key, bytes)
                kept.append(delete(key.decode()) if rd.values is None else wire.Row(wire.OP_UPDATE, 0, (key,), rd.values))
                if rd.values is not None:
                    self.applied.append(bytes(rd.values[1] or b""))
            if rd.stamp_after is not None:  # (a site of several links stamps every row it takes)
                self.stamps[rd.key] = rd.stamp_after
        self.log.append(Txn(item.made_at, src, self.gid, tuple(kept), item.commit_time))
        ev = window.applied(item)
        if ev is not None:
            self.log.append(ev)


class Chain:
    def __init__(self, policy: Policy, primary: Optional[str] = None, forward: bool = True) -> None:
        self.sites = {n: ChainSite(n, policy, primary, forward) for n in "ABC"}
        self.cursor = {link: 0 for link in LINKS}
        self.pending: dict[tuple[str, str], list[Union[RemoteTransaction, ClockEvent]]] = {link: [] for link in LINKS}

    def deliver(self, src: str, dst: str, n: int) -> int:
        """Up to ``n`` items of ``src``'s stream to ``dst``, in order."""
        s, d = self.sites[src], self.sites[dst]
        done = 0
        q = self.pending[(src, dst)]
        while done < n:
            if not q:
                if self.cursor[(src, dst)] >= len(s.log):
                    break
                entry = s.log[self.cursor[(src, dst)]]
                self.cursor[(src, dst)] += 1
                q.extend(s.outgoing(entry, dst))
                continue
            d.receive(q.pop(0), src)
            done += 1
        return done

    def drain(self) -> None:
        for _ in range(1000):  # bounded: a loop would never end
            if not sum(self.deliver(a, b, 1 << 30) for a, b in LINKS):
                return
        raise AssertionError("the streams never went quiet: something circulates")

    def rows(self, site: str) -> dict[bytes, Optional[tuple[wire.Value, ...]]]:
        return {khash(k): self.sites[site].rows.get(khash(k)) for k in KEYS}


write = st.tuples(st.just("w"), st.sampled_from("ABC"), st.sampled_from(KEYS), st.booleans())
send = st.tuples(st.just("d"), st.sampled_from(LINKS), st.integers(1, 3), st.just(False))
programs = st.lists(st.one_of(write, send), max_size=40)


def _run(program: list[tuple[str, object, object, bool]], policy: Policy, primary: Optional[str] = None) -> Chain:
    chain = Chain(policy, primary)
    now = 0
    for kind, a, b, flag in program:
        if kind == "w":
            now += 1
            site = str(a)
            chain.sites[site].commit(delete(str(b)) if flag else upsert(str(b), f"{site}{now}"), now)
        else:
            src, dst = a  # type: ignore[misc]
            chain.deliver(src, dst, int(str(b)))
    chain.drain()
    return chain


def _check(chain: Chain) -> None:
    assert chain.rows("A") == chain.rows("B") == chain.rows("C")
    for s in chain.sites.values():  # no value applied twice on a site, none of its own came back
        assert len(s.applied) == len(set(s.applied)), s.applied
        assert not any(v.startswith(s.name.encode()) for v in s.applied)


@settings(max_examples=400, deadline=None)
@given(programs)
def test_latest_commit_wins_along_a_chain_under_any_interleaving(program: list[tuple[str, object, object, bool]]) -> None:
    _check(_run(program, LatestCommitWins()))


@settings(max_examples=200, deadline=None)
@given(programs, st.sampled_from("ABC"))
def test_primary_wins_along_a_chain_under_any_interleaving(program: list[tuple[str, object, object, bool]],
                                                           primary: str) -> None:
    # each link's primary must be one of its two sites: the middle, or the end where it is one
    chain_primary = "B" if primary == "B" else None
    _check(_run(program, PrimaryWins("B") if chain_primary else LatestCommitWins(), chain_primary))


def test_a_write_at_one_end_reaches_the_other_through_the_middle_and_not_back() -> None:
    chain = Chain(LatestCommitWins())
    chain.sites["A"].commit(upsert("k0", "A1"), 1)
    chain.sites["C"].commit(upsert("k1", "C2"), 2)
    chain.drain()
    assert chain.rows("A") == chain.rows("B") == chain.rows("C")
    assert chain.rows("C")[khash("k0")] == (b"k0", b"A1", b"0")
    assert chain.rows("A")[khash("k1")] == (b"k1", b"C2", b"0")
    # C's stamp of A's row names the neighbour it came through, at C's GID of the apply: the
    # window it is tested against is C's with B
    assert chain.sites["C"].stamps[khash("k0")] == Stamp("B", 2, 1)
    assert chain.sites["A"].applied == [b"C2"] and chain.sites["C"].applied == [b"A1"]


def test_without_forwarding_the_ends_do_not_meet() -> None:
    chain = Chain(LatestCommitWins(), forward=False)
    chain.sites["A"].commit(upsert("k0", "A1"), 1)
    chain.drain()
    assert chain.rows("B")[khash("k0")] == (b"k0", b"A1", b"0")
    assert chain.rows("C")[khash("k0")] is None


def test_a_conflict_of_the_two_ends_is_detected_in_the_middle_and_settled_alike() -> None:
    """A and C change k0 concurrently; B applies C's change, then A's, which meets a row that
    B took from C at a GID A had not applied: in conflict at B (between neighbours A and B, the
    local version C's), settled by latest-commit-wins: C's, the later, stands and A's is not
    sent on. A meets C's change, forwarded before B applied A's: in conflict there too, settled
    alike. Every site ends with C's."""
    chain = Chain(LatestCommitWins())
    chain.sites["A"].commit(upsert("k0", "A1"), 1)
    chain.sites["C"].commit(upsert("k0", "C2"), 2)
    chain.deliver("C", "B", 1)
    chain.deliver("A", "B", 1)
    assert chain.rows("B")[khash("k0")] == (b"k0", b"C2", b"0")
    chain.drain()
    want = (b"k0", b"C2", b"0")
    assert chain.rows("A")[khash("k0")] == chain.rows("B")[khash("k0")] == chain.rows("C")[khash("k0")] == want
    assert chain.sites["C"].applied == []  # A's change stopped at B


# ---- the pieces: the sender's choice, the provenance from the log, the receiver's sink ----------

B_TO_C = LinkConfig("b-c", "B", "C", "c", "k", "pc", "s", listen="h:2", peers=("h:3",), forward=True)
A_TO_B = LinkConfig("a-b", "B", "A", "c", "k", "pc", "s", listen="h:4", peers=("h:5",), forward=True)
ROW = ws(upsert("k0", "A1"))


def applied_record(gid: int, link: str, payload: wire.Writeset, commit_time: int = 77) -> LogRecord:
    """A record of B's log that a link applied: what the apply committed (its peer's rows, then
    the link's row of chorus.link_position)."""
    step = LinkWriteset("n1", 1, link, "A", gid - 1, gid, gid + 1, 0, commit_time, 0, b"")
    return LogRecord(gid, lp.origin(link), 0, lp.final_writeset(step, payload, None, lp.Decision.APPLY),
                     commit_time=commit_time)


def test_the_sender_forwards_a_third_sites_change_only_with_forward_and_never_to_its_origin() -> None:
    facts = provenance(B_TO_C, [A_TO_B, B_TO_C])
    rec = applied_record(5, "a-b", ROW)
    assert facts(rec) == Provenance(77, applied_from="A", origin="A")
    out = Outbound("B", "C", Position(4, 0), RuleSet(), NoSql(), facts, forward=True)
    (frame,) = out.take(rec, now=0.0)
    assert isinstance(frame, proto.Record) and (frame.gid, frame.site, frame.commit_time) == (5, "A", 77)
    sent_ws = wire.decode(bytes(frame.writeset))
    # the rows as B committed them, without B's own tables of the link (its position row)
    assert [t.qualified for t in sent_ws.tables] == [t.qualified for t in ROW.tables]
    assert sent_ws.rows == ROW.rows and out.sent == 1
    # forward off (the default): a third site's change is not sent, only B's clock moves on
    quiet = Outbound("B", "C", Position(4, 0), RuleSet(), NoSql(), provenance(dataclasses.replace(B_TO_C, forward=False)),
                     clock_interval=0.0)
    assert quiet.take(rec, now=0.0) == [ClockEvent("B", 6)] and quiet.filtered == 1
    # a change C made that B applied (over link c-b) and forwarded to A comes back to B named C
    # on the other link: B never sends it to C, its origin
    back = applied_record(9, "a-b", lp.with_origin(ROW, "C"))
    assert facts(back).origin == "C"
    assert out.take(back, now=0.0) == [] and out.filtered == 1
    # and to A, the link it came by, only its reflection goes back
    to_a = Outbound("B", "A", Position(4, 0), RuleSet(), NoSql(), provenance(A_TO_B, [A_TO_B, B_TO_C]), forward=True)
    assert to_a.take(rec, now=0.0)[0] == ClockEvent("A", 6) and to_a.returned == 1


def test_a_forwarded_change_names_its_origin_as_it_goes_on() -> None:
    """At C (a chain A-B-C-D), a change of A's that B forwarded is sent on to D named A."""
    c_to_d = LinkConfig("c-d", "C", "D", "c", "k", "pc", "s", listen="h:2", forward=True)
    b_to_c = LinkConfig("b-c", "C", "B", "c", "k", "pc", "s", peers=("h:1",))
    rec = applied_record(3, "b-c", lp.with_origin(ROW, "A"))
    out = Outbound("C", "D", Position(0, 0), RuleSet(), NoSql(), provenance(c_to_d, [b_to_c, c_to_d]), forward=True)
    (frame,) = out.take(rec, now=0.0)
    assert isinstance(frame, proto.Record) and frame.site == "A"
    assert lp.origin_in(wire.decode(bytes(frame.writeset))) is None  # the mark stays on B's side: the frame names it


def test_the_origin_mark_is_one_site() -> None:
    marked = lp.with_origin(ROW, "A")
    assert lp.origin_in(marked) == "A" and lp.origin_in(ROW) is None
    with pytest.raises(ValueError):
        lp.with_origin(marked, "C")
    twice = wire.Writeset(0, 0, 0, (*marked.tables, dataclasses.replace(marked.tables[-1], columns=(wire.Column("C", "text"),))),
                          marked.rows, marked.keys)
    with pytest.raises(wire.WireError, match="two origin sites"):
        lp.origin_in(twice)


class _Bus:
    def __init__(self) -> None:
        self.sent: list[LinkWriteset] = []

    def send(self, m: object) -> None:
        assert isinstance(m, LinkWriteset)
        self.sent.append(m)

    async def read(self) -> Optional[lp.PositionRow]:
        return None


def test_the_sink_marks_a_forwarded_change_and_refuses_one_that_would_arrive_twice() -> None:
    c_from_b = LinkConfig("b-c", "C", "B", "c", "k", "pc", "s", peers=("h:1",))

    async def go() -> None:
        bus = _Bus()
        inbound = Inbound("n1", c_from_b, bus.send, bus.read, window=8, batches=lambda: True)
        await inbound.sink(RemoteTransaction("B", 4, 0, ROW))
        await inbound.sink(RemoteTransaction("B", 5, 0, ROW, origin="A"))
        assert [lp.origin_in(wire.decode(m.writeset)) for m in bus.sent] == [None, "A"]
        assert [m.peer_site for m in bus.sent] == ["B", "B"]  # the position is the neighbour's
        with pytest.raises(LinkError, match="carries a chorus.link_origin mark"):  # only this site marks
            await inbound.sink(RemoteTransaction("B", 6, 0, lp.with_origin(ROW, "A")))
        with pytest.raises(LinkError, match="back"):
            await inbound.sink(RemoteTransaction("B", 6, 0, ROW, origin="C"))
        # a triangle: C receives A's changes directly too
        tri = Inbound("n1", c_from_b, bus.send, bus.read, window=8, direct={"A": "a-c"})
        with pytest.raises(LinkError, match="directly over link a-c: each would be applied twice"):
            await tri.sink(RemoteTransaction("B", 5, 0, ROW, origin="A"))
    asyncio.run(go())


def test_the_sink_batches_one_origin_at_a_time() -> None:
    c_from_b = LinkConfig("b-c", "C", "B", "c", "k", "pc", "s", peers=("h:1",))

    async def go() -> None:
        bus = _Bus()
        inbound = Inbound("n1", c_from_b, bus.send, bus.read, window=1, batches=lambda: True)
        await inbound.sink(RemoteTransaction("B", 1, 0, ROW))  # goes at once
        for gid, origin in ((2, None), (3, None), (4, "A"), (5, "A")):
            held = asyncio.ensure_future(inbound.sink(RemoteTransaction("B", gid, 0, ROW, origin=origin)))
            await asyncio.sleep(0.01)
            if not held.done():  # the origin changed: what is held goes first, once there is room
                inbound.committed(bus.sent[-1].ticket, lp.Decision.APPLY)
                await asyncio.wait_for(held, 1)
        inbound.committed(bus.sent[-1].ticket, lp.Decision.APPLY)
        await asyncio.sleep(0.01)
        assert [[s.peer_gid for s in lp.steps(m)] for m in bus.sent] == [[1], [2, 3], [4, 5]]
        assert [lp.origin_in(wire.decode(s.writeset)) for m in bus.sent for s in lp.steps(m)] == [None, None, None, "A", "A"]
    asyncio.run(go())


def test_a_site_that_forwards_cannot_settle_counters_by_delta(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text(BASE_TOML + '''
[[link]]
name = "a-b"
site = "B"
peer_site = "A"
tls_cert = "c"
tls_key = "k"
peer_cert = "p"
secret_file = "s"
listen = "127.0.0.1:7000"
forward = true
policy = "delta"
delta_columns = { "app.t" = ["n"] }
''')
    with pytest.raises(ChorusConfigError, match="cannot settle counters by delta"):
        load_config(str(p))
    p.write_text(p.read_text().replace('policy = "delta"\ndelta_columns = { "app.t" = ["n"] }\n', ""))
    assert load_config(str(p)).links[0].forward
