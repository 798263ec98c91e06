"""Conflicts in the apply of a link writeset (docs/LINKS.md sections 4-7, 9): two sites replayed
through the real pieces: each site's log (local writesets stamped with their GID, as the
extension does, and link writesets decided by ``link.settle.Settlement`` against the stamps
and rows as of their GID), each site's sender (``Outbound`` with the link's ``provenance``:
link-applied records reflect the peer's clock back) and receiver sink (``Inbound``: the link
writesets with ``after``, the peer clock and ``max_replicated``).

The worked example of ndb-epoch-conflict-windows.txt ("Determining happened before from the
Binlog", "Conflict Windows") with the GID clock: MA1 and MB1 change row X concurrently; both
sites detect it when the other's change arrives, settle it alike by the policy, and record it;
a change made after the other's change came back is not flagged (the window closed)."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import struct
from dataclasses import replace
from typing import Any, Optional

import pytest

from chorus import wire
from chorus.bus import proto as bp
from chorus.config import LinkConfig, link_settings
from chorus.link import position as lp
from chorus.link.conflict import Detection
from chorus.link.events import ClockEvent, RemoteTransaction, key_text
from chorus.link.proto import Position, Record
from chorus.link.rules import RuleSet, TableRule
from chorus.link.settle import (EXCEPTIONS_TABLE, STAMP_TABLE, SettleError, Settings, Settlement, is_realign,
                                realignment, stamp_hash, table_stamp_key, unmarked)
from chorus.link.sender import Outbound
from chorus.link.site import Inbound, NoSql, provenance
from chorus.wslog import LogRecord

T = wire.Table("app", "items", (wire.Column("id", "int4"), wire.Column("v", "text"), wire.Column("n", "int4")), (0,))
LINK = "ab"
T0 = 1_700_000_000_000_000  # µs


def key(k: str, mode: wire.KeyMode = wire.KeyMode.UPDATE) -> wire.Key:
    return wire.Key(mode, (b"app", b"items", b"id", k.encode()))


def update(k: str, v: str, n: int = 0) -> wire.Writeset:
    return wire.Writeset(1, 1, 0, (T,), (wire.Row("U", 0, (k.encode(),), (k.encode(), v.encode(), b"%d" % n)),),
                         (key(k),))


def insert(k: str, v: str, n: int = 0) -> wire.Writeset:
    return wire.Writeset(1, 1, 0, (T,), (wire.Row("I", 0, (), (k.encode(), v.encode(), b"%d" % n)),),
                         (key(k, wire.KeyMode.EXCLUSIVE),))


def delete(k: str) -> wire.Writeset:
    return wire.Writeset(1, 1, 0, (T,), (wire.Row("D", 0, (k.encode(),)),), (key(k, wire.KeyMode.EXCLUSIVE),))


def _us(text: wire.Value) -> int:
    """A stamp's commit time as the apply writes it (position.timestamp_text), in µs."""
    t = datetime.datetime.strptime(bytes(text or b"").decode().replace("+00", "+0000"), "%Y-%m-%d %H:%M:%S.%f%z")
    return (t - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)) // datetime.timedelta(microseconds=1)


class SiteSim:
    """One site as its log and database see it: a GID counter, the rows of app.items, the
    stamps, the exceptions, the link's position row; local commits stamped as
    extension/chorus_stamp.c does, link writesets applied as the pipeline does."""

    def __init__(self, name: str, peer: str, **conflict: Any) -> None:
        self.name = name
        self.gid = 0
        self.rows: dict[bytes, tuple[wire.Value, ...]] = {}
        self.stamps: dict[bytes, tuple[str, int, int]] = {}
        self.exceptions: list[tuple[wire.Value, ...]] = []
        self.position: Optional[tuple[object, ...]] = None
        self.log: list[LogRecord] = []
        self.link = LinkConfig(LINK, name, peer, "c", "k", "pc", "s", listen="h:1", peers=("h:2",), **conflict)
        self.settings = link_settings(self.link)
        self.sent: list[bp.LinkWriteset] = []
        self.inbound = Inbound("n1", self.link, self._send, self._read, window=1000, wall=lambda: T0 / 1e6)
        self.outbound: Optional[Outbound] = None  # this site's sender, to the peer
        self.decisions: list[Settlement] = []

    def _send(self, msg: bp.Message) -> None:
        assert isinstance(msg, bp.LinkWriteset)
        self.sent.append(msg)

    async def _read(self) -> Optional[lp.PositionRow]:
        return lp.PositionRow.of(self.position)

    # -- the database
    def _apply_rows(self, ws: wire.Writeset) -> None:
        for item in ws.rows:
            assert isinstance(item, wire.Row)
            t = ws.tables[item.table]
            if t.relname == "items":
                if item.op == "D":
                    self.rows.pop(key_text(t.columns[0], item.old[0] or b""), None)
                else:
                    self.rows[key_text(t.columns[0], item.new[0] or b"")] = item.new
            elif t == STAMP_TABLE:
                k = bytes.fromhex(bytes(item.new[0] or b"")[2:].decode())
                assert (k in self.stamps) == (item.op == "U"), "an UPDATE of a stamp that is there, else an INSERT"
                self.stamps[k] = (bytes(item.new[1] or b"").decode(), int(item.new[2] or 0), _us(item.new[3]))
            elif t == EXCEPTIONS_TABLE:
                self.exceptions.append(item.new)
            elif t == lp.POSITION_TABLE:
                v = [bytes(x or b"") for x in item.new]
                self.position = (v[0].decode(), v[1].decode(), int(v[2]), int(v[3]), int(v[4]), 0)

    def commit(self, ws: wire.Writeset, at: int = 0, stamped: Optional[int] = None) -> int:
        """A local transaction: its GID, its rows, its stamps (every non-reference key); ``at``
        its commit time, which its bus message gave the stamps and the log record alike
        (``stamped``: the time its stamps say, if another)."""
        self.gid += 1
        self._apply_rows(ws)
        for k in ws.keys:
            if k.mode != wire.KeyMode.REFERENCE:
                self.stamps[stamp_hash(k.parts)] = (self.name, self.gid, at if stamped is None else stamped)
        self.log.append(LogRecord(self.gid, "n1", 0, wire.encode(ws), at))
        return self.gid

    def apply_link(self, msg: bp.LinkWriteset) -> lp.Decision:
        """A link writeset at its GID, decided from the state as of the GID before."""
        self.gid += 1
        current = lp.PositionRow.of(self.position)
        decision = lp.decide(msg, current)
        if decision == lp.Decision.APPLY:
            plan = Settlement(msg, wire.decode(msg.writeset), current, self.gid, self.settings)
            stamps = [(k, *self.stamps[k]) for k in plan.stamp_keys() if k in self.stamps]
            values = {k.hashed(): self.rows.get(params[0].encode()) for _t, k, params in plan.wanted(stamps)}
            final = plan.final(stamps, values)
            self.decisions.append(plan)
        else:
            final = lp.final_writeset(msg, None, current, decision)
        self._apply_rows(wire.decode(final))
        self.log.append(LogRecord(self.gid, lp.origin(LINK), 0, final))
        return decision

    # -- the link
    def serve(self, upto: int) -> list[Any]:
        """What this site's sender sends from its log up to GID ``upto`` (from where it got to)."""
        if self.outbound is None:
            self.outbound = Outbound(self.name, self.link.peer_site, Position(0), RuleSet(), NoSql(),
                                     provenance(self.link), clock_interval=1e9)
        out: list[Any] = []
        for r in self.log:
            if self.outbound.position < r.gid <= upto:
                out += self.outbound.take(r, 0.0)
        return out

    def receive(self, frames: list[Any]) -> None:
        """The receiver: each frame into the sink; each link writeset it sends on is applied
        here at once (the site's total order) and its outcome heard."""
        async def go() -> None:
            for f in frames:
                if isinstance(f, Record):
                    item: Any = RemoteTransaction(f.site, f.gid, f.commit_time, wire.decode(f.writeset))
                else:
                    item = f
                await self.inbound.sink(item)
                while self.sent:
                    msg = self.sent.pop(0)
                    self.inbound.committed(msg.ticket, self.apply_link(msg))
        asyncio.run(go())

    def value(self, k: str) -> Optional[bytes]:
        row = self.rows.get(k.encode())
        return None if row is None else row[1]

    def conflicts(self) -> list[tuple[str, str, str]]:
        """(row key, detection, decision) of each recorded conflict."""
        return [(bytes(e[4] or b"").decode(), bytes(e[14] or b"").decode(), bytes(e[16] or b"").decode())
                for e in self.exceptions]


def sites(**conflict: Any) -> tuple[SiteSim, SiteSim]:
    """A steady start ([epoch] "Determining happened before"): rows made on A, applied by B,
    and the clocks gone round, so no window is open."""
    a, b = SiteSim("A", "B", **conflict), SiteSim("B", "A", **conflict)
    a.commit(insert("x", "start"))
    a.commit(insert("y", "start"))
    exchange(a, b)
    b.commit(update("w", "B's first"))  # (a row only B has: what B sends carries A's clock back)
    exchange(a, b)
    assert a.conflicts() == [] and b.conflicts() == [] and a.rows == b.rows
    return a, b


def exchange(a: SiteSim, b: SiteSim, rounds: int = 2) -> None:
    """Each sends the other everything it has (a few times: reflections come back)."""
    for _ in range(rounds):
        b.receive(a.serve(a.gid))
        a.receive(b.serve(b.gid))


def test_concurrent_changes_of_one_row_are_detected_on_both_sites_and_settled_alike() -> None:
    """[epoch]: MA1 and MB1 change row X before either has the other's: B applies MA1 over MB1
    and A applies MB1 over MA1, so each detects the conflict when the other's change arrives;
    latest-commit-wins (equal commit times: the site that sorts last, B) leaves both with B's."""
    a, b = sites()
    a.commit(update("x", "from A"))  # MA1
    b.commit(update("x", "from B"))  # MB1
    exchange(a, b)
    assert a.conflicts() == [('"app"."items" (id)=(x)', "row", "took-remote")]
    assert b.conflicts() == [('"app"."items" (id)=(x)', "row", "kept-local")]
    assert a.value("x") == b.value("x") == b"from B"
    assert a.rows == b.rows


def test_primary_wins_on_both_sites() -> None:
    a, b = sites(policy="primary-wins", primary="A")
    a.commit(update("x", "from A"))
    b.commit(update("x", "from B"))
    exchange(a, b)
    assert [c[2] for c in a.conflicts()] == ["kept-local"]
    assert [c[2] for c in b.conflicts()] == ["took-remote"]
    assert a.value("x") == b.value("x") == b"from A"


def test_a_change_after_the_other_sites_came_back_is_not_flagged() -> None:
    """The window closes: A changes X, B applies it (and its clock comes back to A), then B
    changes X: not a conflict at A (B's change happened after MA1 at B); nor the other way."""
    a, b = sites()
    a.commit(update("x", "A first"))
    exchange(a, b)
    b.commit(update("x", "B after"))
    exchange(a, b)
    a.commit(update("x", "A again"))
    exchange(a, b)
    assert a.conflicts() == [] and b.conflicts() == []
    assert a.value("x") == b.value("x") == b"A again"


def test_changes_of_different_rows_are_not_flagged() -> None:
    a, b = sites()
    a.commit(update("x", "A"))
    b.commit(update("y", "B"))
    exchange(a, b)
    assert a.conflicts() == [] and b.conflicts() == []
    assert a.rows == b.rows


def test_max_replicated_follows_the_reflections() -> None:
    """A's own clock comes back in B's stream at the point where B applied A's change (the
    link writeset B committed carries it, B's sender passes it as a CLOCK frame), and A's link
    position holds it: the window's lower bound."""
    a, b = sites()
    g = a.commit(update("x", "A"))
    b.receive(a.serve(a.gid))
    frames = b.serve(b.gid)
    assert ClockEvent("A", g + 1) in frames
    b.commit(update("y", "B"))  # something of B's to carry the reflection into A's position
    a.receive(frames + b.serve(b.gid))
    assert a.position is not None and int(a.position[4]) >= g + 1  # type: ignore[call-overload]


def test_a_delete_against_an_update_is_settled_alike() -> None:
    a, b = sites()
    a.commit(delete("x"))
    b.commit(update("x", "B"))
    exchange(a, b)
    assert len(a.conflicts()) == 1 and len(b.conflicts()) == 1
    assert a.value("x") == b.value("x") == b"B"  # B's is the later by the tie-break: the row is back


def test_epoch_trans_rejects_the_whole_transaction_on_the_primary() -> None:
    """NDB$EPOCH_TRANS: B's transaction changes X (in conflict) and Z (not): on the primary A
    neither is applied; B takes A's version of X and its own Z stays."""
    a, b = sites(policy="primary-wins", primary="A", detection="transaction")
    a.commit(update("x", "A"))
    both = wire.Writeset(1, 1, 0, (T,), (wire.Row("U", 0, (b"x",), (b"x", b"B", b"0")),
                                         wire.Row("I", 0, (), (b"z", b"B", b"0")),
                                         wire.Row("U", 0, (b"y",), (b"y", b"B", b"0"))),
                         (key("x"), key("z", wire.KeyMode.EXCLUSIVE), key("y")))
    b.commit(both)
    exchange(a, b)
    assert sorted(a.conflicts()) == [('"app"."items" (id)=(x)', "row", "kept-local"),
                                     ('"app"."items" (id)=(y)', "transaction", "rejected"),
                                     ('"app"."items" (id)=(z)', "transaction", "rejected")]
    assert a.value("x") == b.value("x") == b"A"
    # the arbiter's realignment: B's y and z, which A rejected with their transaction without a
    # conflict of their own, are A's again on B (y as it stood on A, z deleted)
    assert a.value("y") == b.value("y") == b"start"
    assert a.value("z") is None and b.value("z") is None
    assert a.rows == b.rows
    y = next(e for e in a.exceptions if b"(y)" in bytes(e[4] or b""))
    assert b'"v":"start"' in bytes(y[8] or b"") and b'"v":"start"' in bytes(y[17] or b"")  # local row, result
    z = next(e for e in a.exceptions if b"(z)" in bytes(e[4] or b""))
    assert z[5] is None and z[8] is None  # no stamp, no local row: the local version is absent


def both(k1: str, k2: str, v: str, insert_second: bool = False) -> wire.Writeset:
    """One transaction: an UPDATE of ``k1`` and an UPDATE (or INSERT) of ``k2``."""
    second = (wire.Row("I", 0, (), (k2.encode(), v.encode(), b"0")) if insert_second
              else wire.Row("U", 0, (k2.encode(),), (k2.encode(), v.encode(), b"0")))
    return wire.Writeset(1, 1, 0, (T,), (wire.Row("U", 0, (k1.encode(),), (k1.encode(), v.encode(), b"0")), second),
                         (key(k1), key(k2, wire.KeyMode.EXCLUSIVE if insert_second else wire.KeyMode.UPDATE)))


def test_the_arbiters_realignment_is_its_change_at_the_gid_it_decided() -> None:
    """What A's sender sends for the link writeset it settled: the reflection, then, at that
    GID, A's change marked as a realignment: the rows A rejected, as they stood on A (an UPDATE
    to A's values, a DELETE of a row A does not have). Any sender of A sends it, after any
    restart: it is read from the log record, which every node of A holds alike."""
    a, b = sites(policy="primary-wins", primary="A", detection="transaction")
    a.commit(update("x", "A"))
    b.commit(both("x", "z", "B", insert_second=True))
    b.receive(a.serve(a.gid))
    a.receive(b.serve(b.gid))
    g = a.gid  # the link writeset A settled
    frames = a.serve(a.gid)
    assert isinstance(frames[0], ClockEvent) and frames[0].site == "B"  # the reflection first
    (rec,) = [f for f in frames if isinstance(f, Record)]
    assert (rec.gid, rec.site) == (g, "A")
    ws = wire.decode(rec.writeset)
    assert is_realign(ws)
    got = sorted((r.op, r.old, r.new) for r in unmarked(ws).rows if isinstance(r, wire.Row))
    assert got == [("D", (b"z",), ()), ("U", (b"x",), (b"x", b"A", b"0"))]
    # a sender started afresh (another node, or after a crash) from the same position sends the same
    fresh = SiteSim("A", "B", policy="primary-wins", primary="A", detection="transaction")
    fresh.log = a.log
    fresh.outbound = Outbound("A", "B", Position(g - 1, b.position[3] if b.position else 0),  # type: ignore[arg-type]
                              RuleSet(), NoSql(), provenance(a.link), clock_interval=1e9)
    assert [f for f in fresh.serve(g) if isinstance(f, Record)] == [rec]
    # A's rows rejected are stamped with that GID: a later change of B's made before B had the
    # realignment is in conflict on A
    assert a.stamps[stamp_hash((b"app", b"items", b"id", b"z"))] == ("A", g, 0)
    # the non-arbiter sends no realignment for what it settled
    assert not any(isinstance(f, Record) for f in b.serve(b.gid))


def test_without_the_arbiters_realignment_the_sites_differ() -> None:
    """The same as the EPOCH_TRANS test, with A's sender sending no realignment (as before it
    was built): B keeps its y and z, A has its own."""
    a, b = rejected_on_a()
    a.outbound = Outbound("A", "B", Position(a.outbound.position if a.outbound else 0), RuleSet(), NoSql(),
                          lambda r: replace(provenance(a.link)(r), realign=None), clock_interval=1e9)
    exchange(a, b)
    assert a.value("y") == b"start" and b.value("y") == b"B"
    a2, b2 = sites(policy="primary-wins", primary="A", detection="transaction")
    a2.commit(update("x", "A"))
    b2.commit(both("y", "x", "B"))
    exchange(a2, b2)
    assert a2.value("y") == b2.value("y") == b"start" and a2.rows == b2.rows


def test_a_realignment_meets_a_later_change_and_both_sites_decide_it_alike() -> None:
    """B changes z again before A's realignment of z arrives: A, where z is stamped with the
    realignment's GID, finds B's change in conflict, and B finds the realignment in conflict
    with it; both settle it by the policy (A's, the primary's), so both end with A's."""
    a, b = sites(policy="primary-wins", primary="A", detection="transaction")
    a.commit(update("x", "A"))
    b.commit(both("x", "z", "B", insert_second=True))
    b.receive(a.serve(a.gid))
    a.receive(b.serve(b.gid))  # A rejects it: z (absent on A) is realigned
    b.commit(update("z", "B again"))  # before the realignment arrives
    b.commit(update("w", "B's w"))  # not in conflict anywhere
    exchange(a, b, rounds=3)
    assert a.value("z") is None and b.value("z") is None
    assert a.value("w") == b.value("w") == b"B's w"
    assert a.rows == b.rows
    assert ('"app"."items" (id)=(z)', "row", "took-remote") in b.conflicts()  # the realignment, on B


def test_on_the_other_site_epoch_trans_settles_row_by_row() -> None:
    """Only the arbiter rejects transactions: under latest-commit-wins (A the arbiter, B the
    site whose name sorts last and wins ties) A takes B's x and applies B's transaction; B keeps
    its x against A's transaction and still applies A's y, which A has: the sites end equal (were
    B to reject A's transaction whole, y would differ and nothing would realign it)."""
    a, b = sites(detection="transaction")
    a.commit(both("x", "y", "A"))
    b.commit(update("x", "B"))
    exchange(a, b)
    assert a.value("x") == b.value("x") == b"B"
    assert a.value("y") == b.value("y") == b"A"
    assert a.rows == b.rows
    assert [c[1:] for c in b.conflicts()] == [("row", "kept-local")]


def rejected_on_a() -> tuple[SiteSim, SiteSim]:
    """A, the primary, has rejected B's transaction of x (in conflict) and y (not); B has not
    heard of it yet."""
    a, b = sites(policy="primary-wins", primary="A", detection="transaction")
    a.commit(update("x", "A"))
    b.commit(both("y", "x", "B"))
    b.receive(a.serve(a.gid))
    a.receive(b.serve(b.gid))
    return a, b


def twin_of(b: SiteSim, **conflict: Any) -> SiteSim:
    """Another node of ``b``'s site, in the same state; the logs of both emptied."""
    twin = SiteSim(b.name, b.link.peer_site, **conflict)
    for attr in ("gid", "rows", "stamps", "position"):
        setattr(twin, attr, dict(getattr(b, attr)) if isinstance(getattr(b, attr), dict) else getattr(b, attr))
    twin.log, b.log = [], []
    return twin


def test_every_node_applies_a_realignment_alike() -> None:
    a, b = rejected_on_a()
    msgs = sent_on(a, b)
    assert any(is_realign(wire.decode(m.writeset)) for m in msgs)
    twin = twin_of(b, policy="primary-wins", primary="A", detection="transaction")
    for m in msgs:
        b.apply_link(m)
        twin.apply_link(m)
    assert [r.payload for r in b.log] == [r.payload for r in twin.log]
    assert b.value("y") == b"start" and twin.rows == b.rows


def test_a_realignment_from_a_site_that_is_not_the_arbiter_is_refused() -> None:
    a, b = rejected_on_a()
    (m,) = [m for m in sent_on(a, b) if is_realign(wire.decode(m.writeset))]
    # B configured with itself as the primary (A believes it is): a realignment from A is refused
    other = SiteSim("B", "A", policy="primary-wins", primary="B", detection="transaction")
    other.position = b.position
    with pytest.raises(SettleError, match="not the link's arbiter here"):
        other.apply_link(replace(m, settings=other.settings.fingerprint))
    assert b.apply_link(m) == lp.Decision.APPLY


def sent_on(a: SiteSim, b: SiteSim) -> list[bp.LinkWriteset]:
    """The link writesets b's receiver sends on for what a's sender has, not applied yet."""
    msgs: list[bp.LinkWriteset] = []
    inbound = Inbound("n1", b.link, lambda m: msgs.append(m) if isinstance(m, bp.LinkWriteset) else None, b._read,
                      window=1000, wall=lambda: T0 / 1e6)

    async def go() -> None:
        await inbound.position()
        for f in a.serve(a.gid):
            if isinstance(f, Record):
                await inbound.sink(RemoteTransaction(f.site, f.gid, f.commit_time, wire.decode(f.writeset)))
    asyncio.run(go())
    return msgs


def test_every_node_commits_the_same_bytes() -> None:
    """The decision depends only on the link writeset and the state as of its GID: two nodes
    of a site with the same state decide the same writeset, byte for byte."""
    a, b = sites()
    a.commit(update("x", "A"))
    b.commit(update("x", "B"))
    msgs = sent_on(a, b)
    twin = twin_of(b)
    for m in msgs:
        b.apply_link(m)
        twin.apply_link(m)
    assert [r.payload for r in b.log] == [r.payload for r in twin.log]
    assert b.conflicts() and b.exceptions == twin.exceptions


def test_stamp_hash_is_sha256_of_the_key_parts() -> None:
    parts = (b"app", b"items", b"id", b"7")
    want = hashlib.sha256(b"".join(struct.pack(">I", len(p)) + p for p in parts)).digest()[:16]
    assert stamp_hash(parts) == want
    assert table_stamp_key(T) == stamp_hash((b"app", b"items"))


def test_a_table_stamped_as_a_whole_counts_for_its_rows() -> None:
    """A writeset past chorus.max_row_keys_per_table stamps its table: an incoming change of
    any of its rows within the window is in conflict."""
    a, b = sites()
    a.gid += 1
    a.stamps[table_stamp_key(T)] = ("A", a.gid, 0)
    b.commit(update("y", "B"))
    a.receive(b.serve(b.gid))
    assert [c[0] for c in a.conflicts()] == ['"app"."items" (id)=(y)']


@pytest.mark.parametrize("conflict, says", [
    (dict(policy="newest"), "unknown conflict policy"),
    (dict(policy="primary-wins"), "needs primary"),
    (dict(policy="primary-wins", primary="C"), "needs primary"),
    (dict(table_policy=(("app.items", "x"),)), "unknown conflict policy"),
])
def test_settings_that_cannot_decide_are_refused(conflict: dict[str, Any], says: str) -> None:
    with pytest.raises(SettleError, match=says):
        link_settings(LinkConfig(LINK, "A", "B", "c", "k", "pc", "s", peers=("h:1",), **conflict))
    with pytest.raises(ValueError, match="detection"):
        link_settings(LinkConfig(LINK, "A", "B", "c", "k", "pc", "s", peers=("h:1",), detection="rows"))


def test_a_table_policy_overrides_the_links() -> None:
    s = Settings("A", "B", "latest-commit-wins", "A", Detection.ROW, {"app.items": "primary-wins"})
    assert s.policy_for(T).name == "primary-wins"
    assert s.policy_for(wire.Table("app", "other", T.columns, (0,))).name == "latest-commit-wins"
    assert s.arbiter == "A" and Settings("B", "A").arbiter == "A"


def test_binary_key_values_meet_their_text_stamps() -> None:
    """An int4 key travels in its binary send form in the rows and as text in the keys (and so
    in the stamps the extension writes): the apply matches them."""
    tb = wire.Table("app", "items", (wire.Column("id", "integer"), wire.Column("v", "text"),
                                     wire.Column("n", "integer")), (0,))

    def upd(k: int, v: str) -> wire.Writeset:
        kb = wire.Binary(k.to_bytes(4, "big"))
        return wire.Writeset(1, 1, 0, (tb,), (wire.Row("U", 0, (kb,), (kb, v.encode(), wire.Binary(bytes(4)))),),
                             (wire.Key(wire.KeyMode.UPDATE, (b"app", b"items", b"id", b"%d" % k)),))
    a, b = SiteSim("A", "B"), SiteSim("B", "A")
    a.commit(wire.Writeset(1, 1, 0, (tb,), (wire.Row("I", 0, (), (wire.Binary(bytes(3) + b"\x07"), b"s",
                                                                  wire.Binary(bytes(4)))),),
                           (wire.Key(wire.KeyMode.EXCLUSIVE, (b"app", b"items", b"id", b"7")),)))
    exchange(a, b)
    b.commit(upd(8, "B's own"))
    exchange(a, b)
    assert a.conflicts() == [] and b.conflicts() == []
    a.commit(upd(7, "A"))
    b.commit(upd(7, "B"))
    exchange(a, b)
    assert [c[:2] for c in a.conflicts()] == [('"app"."items" (id)=(7)', "row")]
    assert [c[:2] for c in b.conflicts()] == [('"app"."items" (id)=(7)', "row")]
    assert a.value("7") == b.value("7") == b"B"
    assert b'"id":"7"' in bytes(a.exceptions[0][8] or b"")  # the local row, its key as text


@pytest.mark.parametrize("typname, raw, text", [
    ("integer", b"\xff\xff\xff\xfe", b"-2"), ("int8", (2**40).to_bytes(8, "big"), b"1099511627776"),
    ("smallint", b"\x00\x07", b"7"), ("oid", b"\xff\xff\xff\xff", b"4294967295"), ("boolean", b"\x01", b"t"),
])
def test_binary_key_values_as_text(typname: str, raw: bytes, text: bytes) -> None:
    assert key_text(wire.Column("k", typname), wire.Binary(raw)) == text
    assert key_text(wire.Column("k", typname), text) == text  # text stays


def test_a_key_of_a_binary_type_without_a_text_here_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="of type numeric comes in binary form"):
        key_text(wire.Column("id", "numeric"), wire.Binary(b"\x00\x01"))


def test_a_node_whose_settings_differ_from_the_receivers_does_not_decide() -> None:
    """The receiver's settings travel as a fingerprint in each link writeset: a node configured
    otherwise fails the apply (inconsistency voting then settles which nodes stay) rather than
    settle conflicts differently from the others."""
    a, b = sites()
    other = SiteSim("B", "A", policy="primary-wins", primary="A")
    assert other.settings.fingerprint != b.settings.fingerprint
    a.commit(update("x", "A"))
    msgs = sent_on(a, b)
    (m,) = msgs
    assert m.settings == b.settings.fingerprint
    other.position = b.position
    with pytest.raises(SettleError, match="differ from those of node n1"):
        other.apply_link(m)
    assert b.apply_link(m) == lp.Decision.APPLY


class RegionIs:
    """A row filter's stand-in evaluator: ``v = 'eu'`` (column v is the region here)."""

    def predicate(self, table: wire.Table, values: tuple[wire.Value, ...], predicate: str) -> bool:
        assert predicate == "v = 'eu'"
        return values[1] == b"eu"

    def expression(self, table: wire.Table, values: tuple[wire.Value, ...], expression: str) -> wire.Value:
        raise AssertionError(expression)

    def row_function(self, table: wire.Table, values: tuple[wire.Value, ...],
                     function: str) -> Optional[tuple[wire.Value, ...]]:
        raise AssertionError(function)


@pytest.mark.parametrize("subset", [True, False])
def test_rows_moving_in_and_out_of_a_filtered_subset(subset: bool) -> None:
    """A's rules send the rows with v = 'eu' (docs/LINKS.md section 8): an UPDATE that moves a
    row out arrives as a DELETE of its key, one that moves a row in as an UPDATE of a row B does
    not have, which B (``subset``) applies as an INSERT; a DELETE of a row B never had is
    nothing there. Without ``subset`` those are passed as they come (the apply of a real site
    then fails them: the row is not there, which is what an unfiltered link must say)."""
    a, b = SiteSim("A", "B", subset=subset), SiteSim("B", "A", subset=subset)
    a.outbound = Outbound("A", "B", Position(0), RuleSet(tables=(TableRule("app.items", "v = 'eu'"),)), RegionIs(),
                          provenance(a.link), clock_interval=1e9)
    a.commit(insert("1", "eu"))
    a.commit(insert("2", "us"))
    a.commit(insert("3", "us"))
    exchange(a, b)
    assert sorted(b.rows) == [b"1"]
    before = len(b.log)
    a.commit(update("2", "eu"))  # enters the subset
    a.commit(update("1", "us"))  # leaves it
    a.commit(delete("3"))  # never was in it
    exchange(a, b)
    final = [wire.decode(r.payload) for r in b.log[before:] if r.origin == lp.origin(LINK)]
    ops = [(i.op, bytes(i.new[0] or b"") if i.new else bytes(i.old[0] or b"")) for ws in final for i in ws.rows
           if isinstance(i, wire.Row) and ws.tables[i.table] == T]
    if subset:
        assert ops == [("I", b"2"), ("D", b"1")]  # the UPDATE of an absent row inserted; the DELETE of 3 dropped
    else:
        assert ops == [("U", b"2"), ("D", b"1"), ("D", b"3")]
    assert sorted(b.rows) == [b"2"] and b.value("2") == b"eu"
    assert b.conflicts() == []
    assert link_settings(b.link).fingerprint != link_settings(replace(b.link, subset=not subset)).fingerprint


def test_a_realignment_outside_utf8_stops_the_link() -> None:
    """The exceptions' rows hold values as UTF-8 text: in a LATIN1 database they are not the
    row's bytes, so the arbiter's sender stops (visibly) rather than realign the peer wrongly."""
    a, b = rejected_on_a()
    record = wire.decode(bytes(a.log[-1].payload))
    assert realignment(record) is not None
    latin1 = wire.Writeset(record.xid, record.pid, record.last_seen, record.tables, record.rows, record.keys,
                           flags=record.flags, encoding=8)
    with pytest.raises(wire.WireError, match="needs a UTF8 database"):
        realignment(latin1)


# a table whose old images carry the counter n (TABLE_OLD_COLUMNS: chorus.link_old_columns lists it)
TD = replace(T, old_columns=True)
DELTA = {"table_policy": (("app.items", "delta"),), "delta_columns": (("app.items", ("n",)),)}


def increment(k: str, v: str, old: int, new: int) -> wire.Writeset:
    """An UPDATE of n from ``old`` to ``new``, captured with n's old value."""
    row = wire.Row("U", 0, (k.encode(), wire.UNCHANGED, b"%d" % old), (k.encode(), v.encode(), b"%d" % new))
    return wire.Writeset(1, 1, 0, (TD,), (row,), (key(k),))


def n_of(site: SiteSim, k: str) -> int:
    return int(bytes(site.rows[k.encode()][2] or b""))


def test_delta_keeps_every_increment_of_both_sites() -> None:
    """Both sites increment x's counter, several times, before either has the other's changes:
    each adds the other's increments to its own row, so both end with the sum; the text column
    follows latest-commit-wins (B, which sorts last); the conflicts are recorded as merged."""
    a, b = sites(**DELTA)
    a.commit(increment("x", "A", 0, 3))
    a.commit(increment("x", "A", 3, 4))
    b.commit(increment("x", "B", 0, 10))
    b.commit(increment("x", "B", 10, 30))
    exchange(a, b)
    assert n_of(a, "x") == n_of(b, "x") == 34
    assert a.value("x") == b.value("x") == b"B"
    assert a.conflicts() and b.conflicts()
    assert {d for _k, _r, d in a.conflicts() + b.conflicts()} <= {"merged", "took-remote", "kept-local"}
    assert "merged" in {d for _k, _r, d in a.conflicts()} and "merged" in {d for _k, _r, d in b.conflicts()}
    # what each site committed has no captured old values left (only the identity's)
    for site in (a, b):
        for r in site.log:
            ws = wire.decode(bytes(r.payload))
            if r.origin == lp.origin(LINK):
                assert not any(t.old_columns for t in ws.tables)
    # later increments, not concurrent, add up too, and are not flagged
    before = (len(a.conflicts()), len(b.conflicts()))
    exchange(a, b)
    a.commit(increment("x", "B", 34, 35))
    exchange(a, b)
    assert n_of(a, "x") == n_of(b, "x") == 35 and (len(a.conflicts()), len(b.conflicts())) == before


def test_delta_without_old_values_falls_back_and_says_so() -> None:
    """A change captured before chorus.link_old_columns listed the counter has no old value of
    it: the conflict is settled by the fallback (latest-commit-wins), recorded with the reason."""
    a, b = sites(**DELTA)
    a.commit(increment("x", "A", 0, 3))
    b.commit(update("x", "B", 10))  # no old value of n
    b.receive(a.serve(a.gid))
    a.receive(b.serve(b.gid))
    assert n_of(a, "x") == 10  # B's row, by latest-commit-wins
    (e,) = a.exceptions
    assert e[15] == b"delta (no old values of the delta columns: latest-commit-wins)" and e[16] == b"took-remote"
    assert n_of(b, "x") == 13  # B had A's old value: merged


def test_delta_settings_are_checked() -> None:
    base = dict(site="A", peer="B")
    with pytest.raises(SettleError, match="no columns in delta_columns"):
        Settings(table_policy={"app.items": "delta"}, **base)  # type: ignore[arg-type]
    with pytest.raises(SettleError, match="whose policy is not delta"):
        Settings(delta_columns={"app.items": ("n",)}, **base)  # type: ignore[arg-type]
    with pytest.raises(SettleError, match="delta_fallback"):
        Settings(policy="delta", delta_fallback="delta", **base)  # type: ignore[arg-type]
    s = Settings(table_policy={"app.items": "delta"}, delta_columns={"app.items": ("n",)}, **base)  # type: ignore[arg-type]
    assert s.policy_for(T).name == "delta"
    assert Settings(**base).fingerprint != s.fingerprint  # type: ignore[arg-type]
    for columns, why in ((("v",), "of type text, not an integer or numeric type"),
                         (("nope",), "is not a column of"), (("id",), "part of its key")):
        bad = Settings(table_policy={"app.items": "delta"}, delta_columns={"app.items": columns}, **base)  # type: ignore[arg-type]
        with pytest.raises(SettleError, match=why):
            bad.policy_for(replace(T, columns=(wire.Column("id", "integer"), wire.Column("v", "text"),
                                               wire.Column("n", "bigint"))))
def test_latest_commit_wins_by_the_origins_commit_times() -> None:
    """Real commit times (bus version 5, kept in the stamps and the log): the later change of one
    row stands on both sites although the site tie-break would pick the other (B sorts last,
    A's change is later), and both record the versions' times. Where either time is unknown (a
    change of a release before) the tie-break alone decides, alike on both sites."""
    a, b = sites()
    b.commit(update("x", "from B"), at=T0 + 1_000)
    a.commit(update("x", "from A"), at=T0 + 2_000)
    exchange(a, b)
    assert a.value("x") == b.value("x") == b"from A"
    assert a.conflicts() == [('"app"."items" (id)=(x)', "row", "kept-local")]
    assert b.conflicts() == [('"app"."items" (id)=(x)', "row", "took-remote")]
    assert a.rows == b.rows
    # A, the arbiter, realigned x: both hold the realignment's stamp (A's, its time unknown)
    x = stamp_hash(key("x").parts)
    assert a.stamps[x] == b.stamps[x] and a.stamps[x][0] == "A" and a.stamps[x][2] == 0
    times = {(bytes(e[7] or b""), bytes(e[11] or b"")) for e in a.exceptions}
    assert times == {(lp.timestamp_text(T0 + 2_000), lp.timestamp_text(T0 + 1_000))}  # local, remote
    # one time unknown: the tie-break (B), on both sites
    b.commit(update("y", "from B"), at=0)
    a.commit(update("y", "from A"), at=T0 + 9_000)
    exchange(a, b)
    assert a.value("y") == b.value("y") == b"from B" and a.rows == b.rows


def test_stamps_without_times_and_a_stream_with_them_still_settle_alike() -> None:
    """The extension stamps local changes with no commit time (0) while the log and the stream
    carry the real one: each site sees its own version's time as unknown and the other's as
    known. Compared as numbers, each would take the other's version and the sites would differ;
    an unknown time makes both compare by site and clock alone."""
    a, b = sites()
    a.commit(update("x", "from A"), at=T0 + 2_000, stamped=0)
    b.commit(update("x", "from B"), at=T0 + 1_000, stamped=0)
    exchange(a, b)
    assert a.value("x") == b.value("x") == b"from B" and a.rows == b.rows
