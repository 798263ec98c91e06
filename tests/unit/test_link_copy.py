"""Re-instantiation of a link (docs/LINKS.md section 10): the copy's frames (link/proto.py,
version 3) written and read back and fuzzed, and the pure core (link/copy.py): batches and
their ranges, the order checked, and what the receiving site's apply of a batch commits (the
range made the copy's, the stamps, the exceptions of this site's unseen changes, the position
at the end)."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus import wire
from chorus.bus.proto import LinkWriteset
from chorus.link import copy as lc
from chorus.link import position as lp
from chorus.link import proto
from chorus.link.proto import LinkError, LinkProtocolError
from chorus.link.settle import EXCEPTIONS_TABLE, STAMP_TABLE

T = wire.Table("app", "items", (wire.Column("id", "integer"), wire.Column("v", "text")), (0,))


def read(data: bytes) -> proto.Frame:
    kind, n = proto.frame_head(data[:5])
    assert len(data) == 5 + n
    return proto.decode(kind, data[5:])


def rows(*pairs: tuple[str, str]) -> tuple[tuple[wire.Value, ...], ...]:
    return tuple((k.encode(), v.encode()) for k, v in pairs)


def inserts(table: wire.Table, values: tuple[tuple[wire.Value, ...], ...]) -> wire.Writeset:
    return wire.Writeset(0, 0, 0, (table,), tuple(wire.Row(wire.OP_INSERT, 0, (), r) for r in values), ())


# ---- frames ------------------------------------------------------------------------------------

def test_the_copy_frames_read_back_as_written() -> None:
    hello = proto.Hello("eu-us", "site-b", "site-a", proto.Position(3, 4), b"n" * 16, 3, proto.COPY)
    assert read(proto.write_hello(hello)) == hello
    stream = proto.Hello("eu-us", "site-b", "site-a", proto.Position(3, 4), b"n" * 16)
    assert read(proto.write_hello(stream)).mode == proto.STREAM  # type: ignore[union-attr]
    for s in (proto.Snapshot(1 << 40), proto.Snapshot(9, True, 7), proto.Snapshot(9, False, 0)):
        assert read(proto.write_snapshot(s)) == s
    assert read(proto.write_copied(proto.Copied(5, 1 << 33))) == proto.Copied(5, 1 << 33)


def test_a_copy_needs_version_3_and_a_known_mode() -> None:
    with pytest.raises(ValueError, match="mode 1 in link protocol version 2"):
        proto.write_hello(proto.Hello("l", "b", "a", proto.Position(0), b"n" * 16, 2, proto.COPY))
    frame = bytearray(proto.write_hello(proto.Hello("l", "b", "a", proto.Position(0), b"n" * 16, 3, proto.COPY)))
    frame[-1] = 2
    with pytest.raises(LinkProtocolError, match="unknown mode 2"):
        read(bytes(frame))
    snap = bytearray(proto.write_snapshot(proto.Snapshot(1, True, 2)))
    snap[5 + 8] = 3
    with pytest.raises(LinkProtocolError, match="SNAPSHOT frame: flag 3"):
        read(bytes(snap))
    with pytest.raises(LinkProtocolError, match="COPIED frame truncated"):
        proto.decode(proto.FrameKind.COPIED, b"\x00" * 8)
    with pytest.raises(LinkProtocolError, match="SNAPSHOT frame of 18 bytes"):
        proto.frame_head(b"S" + struct.pack(">I", 18))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([proto.FrameKind.HELLO, proto.FrameKind.SNAPSHOT, proto.FrameKind.COPIED]),
       st.binary(max_size=300))
def test_decoding_random_copy_frames_raises_only_the_protocol_error(kind: proto.FrameKind, body: bytes) -> None:
    try:
        proto.decode(kind, body)
    except LinkProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_copy_frames_raise_only_the_protocol_error(data: st.DataObject) -> None:
    frames = [proto.write_hello(proto.Hello("l", "b", "a", proto.Position(1, 2), b"n" * 16, 3, proto.COPY)),
              proto.write_snapshot(proto.Snapshot(7, True, 3)), proto.write_copied(proto.Copied(7, 2))]
    frame = bytearray(data.draw(st.sampled_from(frames)))
    at = data.draw(st.integers(5, len(frame) - 1))
    frame[at] ^= data.draw(st.integers(1, 255))
    try:
        proto.decode(proto.frame_head(bytes(frame[:5]))[0], bytes(frame[5:]))
    except LinkProtocolError:
        pass


# ---- batches and ranges ------------------------------------------------------------------------

def test_ranges_cover_every_key_of_a_table() -> None:
    r = lc.Ranges(40, both=True)
    a = r.take(inserts(T, rows(("1", "a"), ("2", "b"))))
    b = r.take(inserts(T, rows(("3", "c"),)))
    end = r.take(inserts(T, ()))
    assert (a.lower, a.upper) == (None, (b"2",))
    assert (b.lower, b.upper) == ((b"2",), (b"3",))
    assert (end.lower, end.upper, end.rows) == ((b"3",), None, ())
    assert r.rows == 3 and all(x.both and x.gid == 40 for x in (a, b, end))
    # a table complete without rows: its one range is all of it
    empty = r.take(inserts(wire.Table("app", "none", T.columns, (0,)), ()))
    assert (empty.lower, empty.upper) == (None, None)


def test_rows_out_of_key_order_and_a_table_copied_twice_are_refused() -> None:
    r = lc.Ranges(4)
    r.take(inserts(T, rows(("10", "a"), ("2", "b"))))  # bytewise: "10" < "2"
    with pytest.raises(lc.CopyError, match="order"):
        r.take(inserts(T, rows(("1", "x"),)))
    with pytest.raises(lc.CopyError, match="order"):
        lc.Ranges(4).take(inserts(T, rows(("2", "a"), ("2", "b"))))
    r.take(inserts(T, ()))
    with pytest.raises(lc.CopyError, match="copied again"):
        r.take(inserts(T, rows(("3", "a"),)))
    with pytest.raises(lc.CopyError, match="primary key"):
        lc.Ranges(4).take(inserts(wire.Table("app", "k", T.columns, ()), ()))


def test_a_batch_travels_marked_and_reads_back() -> None:
    for b in (lc.Batch(9, T, rows(("1", "a"), ("5", "b")), (b"0",), (b"5",), both=True),
              lc.Batch(9, T, (), (b"5",), None), lc.Batch(9, None, (), None, None, final=True)):
        ws = lc.encode(b, "eu-us")
        back = wire.decode(wire.encode(ws))
        assert lc.is_copy(back) and lc.decode(back) == b
        assert lp.position_key("eu-us") in back.keys
    assert not lc.is_copy(inserts(T, rows(("1", "a"))))


def test_a_malformed_batch_is_refused() -> None:
    good = lc.encode(lc.Batch(9, T, rows(("1", "a"), ("5", "b")), None, (b"5",)), "l")
    swapped = wire.Writeset(0, 0, 0, good.tables, (good.rows[1], good.rows[0], good.rows[2]), good.keys)
    with pytest.raises(lc.CopyError, match="key order"):
        lc.decode(swapped)
    wrong_upper = lc.encode(lc.Batch(9, T, rows(("1", "a"),), None, (b"7",)), "l")
    with pytest.raises(lc.CopyError, match="upper bound"):
        lc.decode(wrong_upper)
    deleting = wire.Writeset(0, 0, 0, good.tables, (wire.Row(wire.OP_DELETE, 0, (b"1",)), good.rows[2]), good.keys)
    with pytest.raises(lc.CopyError, match="INSERTs"):
        lc.decode(deleting)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_mutated_batch_raises_only_copy_or_wire_errors(data: st.DataObject) -> None:
    raw = bytearray(wire.encode(lc.encode(lc.Batch(9, T, rows(("1", "a"), ("5", "b")), (b"0",), (b"5",)), "l")))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] ^= data.draw(st.integers(1, 255))
    try:
        ws = wire.decode(bytes(raw))
    except (wire.WireError, ValueError):
        return
    try:
        if lc.is_copy(ws):
            lc.decode(ws)
    except lc.CopyError:
        pass


# ---- the receiving site's apply ----------------------------------------------------------------

def step(final: bool = False, mr: int = 0) -> LinkWriteset:
    return LinkWriteset("w1", 1, "eu-us", "east", 39, 40, 41, mr, 0, 1_700_000_000_000_000, b"", "")


def plan(batch: lc.Batch, current: lp.PositionRow | None = None, mr: int = 0, subset: bool = False) -> lc.CopyPlan:
    return lc.CopyPlan(step(batch.final, mr), batch, current, 1000, "west", subset)


def test_a_range_is_made_the_copys() -> None:
    b = lc.Batch(40, T, rows(("1", "a"), ("3", "c"), ("4", "d")), None, (b"4",))
    p = plan(b)
    local = [("1", "a"), ("2", "x"), ("3", "old"), ("4", "d")]
    changes = p.diff(local)
    assert changes == [((b"3",), (b"3", b"old"), (b"3", b"c")), ((b"2",), (b"2", b"x"), None)]
    ws = wire.decode(p.final(changes, []))
    assert ws.tables[0] == T
    assert [r for r in ws.rows if isinstance(r, wire.Row) and r.table == 0] == [
        wire.Row(wire.OP_UPDATE, 0, (b"3",), (b"3", b"c")), wire.Row(wire.OP_DELETE, 0, (b"2",))]
    assert lp.position_key("eu-us") in ws.keys  # the extension stamps no link writeset: the plan does
    assert lp.reflected_in(ws) is None  # the position moves only at the end
    # rows absent here are inserted; with subset, rows the peer lacks stay
    assert plan(b).diff([]) == [((b"1",), None, (b"1", b"a")), ((b"3",), None, (b"3", b"c")),
                                ((b"4",), None, (b"4", b"d"))]
    assert plan(b, subset=True).diff(local) == [((b"3",), (b"3", b"old"), (b"3", b"c"))]


def _stamp(p: lc.CopyPlan, key: bytes, site: str, clock: int) -> tuple[bytes, str, int, int]:
    return (p._stamp_key((key,)), site, clock, 0)


def test_stamps_turn_to_the_peers_and_unseen_local_changes_are_recorded() -> None:
    b = lc.Batch(40, T, rows(("1", "a"), ("2", "b")), None, None)
    current = lp.PositionRow("eu-us", "east", 10, 11, 500, 0)
    p = plan(b, current)
    changes = p.diff([("1", "mine"), ("2", "old"), ("3", "gone")])
    # 1: this site's change the peer had not seen (clock 600 >= max_replicated 500); 2: seen (400);
    # 3: a row of the peer's (stamp of east): deleted without an exception
    stamps = [_stamp(p, b"1", "west", 600), _stamp(p, b"2", "west", 400), _stamp(p, b"3", "east", 7)]
    ws = wire.decode(p.final(changes, stamps))
    data = [r for r in ws.rows if isinstance(r, wire.Row) and r.table == 0]
    assert len(data) == 3
    # a row deleted here while the link was broken, which the copy has: back, and recorded
    back = wire.decode(p.final(p.diff([]), [_stamp(p, b"1", "west", 600)]))
    (ex0,) = [r for r in back.rows if isinstance(r, wire.Row) and r.table == back.tables.index(EXCEPTIONS_TABLE)]
    assert ex0.new[8] is None and ex0.new[16] == b"took-remote"
    st_i, ex_i = ws.tables.index(STAMP_TABLE), ws.tables.index(EXCEPTIONS_TABLE)
    stamped = [r for r in ws.rows if isinstance(r, wire.Row) and r.table == st_i]
    assert len(stamped) == 3 and all(r.new[1:3] == (b"east", b"40") for r in stamped)
    (ex,) = [r for r in ws.rows if isinstance(r, wire.Row) and r.table == ex_i]
    assert ex.new[0] == b"1000" and ex.new[5:7] == (b"west", b"600")
    assert json.loads(bytes(ex.new[8] or b"")) == {"id": "1", "v": "mine"}
    assert ex.new[14:17] == (b"copy", b"reinstantiate", b"took-remote")
    assert json.loads(bytes(ex.new[17] or b"")) == {"id": "1", "v": "a"}


def test_on_a_link_both_ways_an_unseen_local_change_stays_and_is_recorded() -> None:
    b = lc.Batch(40, T, rows(("1", "a"),), None, None, both=True)
    p = plan(b, lp.PositionRow("eu-us", "east", 10, 11, 500, 0))
    changes = p.diff([("1", "mine")])
    ws = wire.decode(p.final(changes, [_stamp(p, b"1", "west", 600)]))
    assert not [r for r in ws.rows if isinstance(r, wire.Row) and r.table == 0]
    assert STAMP_TABLE not in ws.tables  # its stamp stays this site's: the peer settles the change
    (ex,) = [r for r in ws.rows if isinstance(r, wire.Row) and r.table == ws.tables.index(EXCEPTIONS_TABLE)]
    assert ex.new[16] == b"kept-local" and json.loads(bytes(ex.new[17] or b"")) == {"id": "1", "v": "mine"}
    # a row deleted here that the peer had not seen deleted stays deleted (the delete is on its way)
    gone = p.diff([])
    ws3 = wire.decode(p.final(gone, [_stamp(p, b"1", "west", 600)]))
    assert not [r for r in ws3.rows if isinstance(r, wire.Row) and r.table == 0]
    (ex3,) = [r for r in ws3.rows if isinstance(r, wire.Row) and r.table == ws3.tables.index(EXCEPTIONS_TABLE)]
    assert ex3.new[8] is None and ex3.new[16] == b"kept-local" and ex3.new[17] is None
    # what the peer had applied as of the snapshot (the message's max_replicated) closes the window
    p2 = lc.CopyPlan(step(mr=601), b, lp.PositionRow("eu-us", "east", 10, 11, 500, 0), 1000, "west")
    ws2 = wire.decode(p2.final(p2.diff([("1", "mine")]), [_stamp(p2, b"1", "west", 600)]))
    assert [r for r in ws2.rows if isinstance(r, wire.Row) and r.table == 0] == [
        wire.Row(wire.OP_UPDATE, 0, (b"1",), (b"1", b"a"))]
    assert EXCEPTIONS_TABLE not in ws2.tables


def test_the_final_batch_moves_the_position() -> None:
    fin = lc.Batch(40, None, (), None, None, final=True)
    first = wire.decode(plan(fin).final([], []))
    assert lp.reflected_in(first) == lp.PositionRow("eu-us", "east", 40, 41, 0, 0)
    assert [r.op for r in first.rows if isinstance(r, wire.Row)] == [wire.OP_INSERT]
    again = wire.decode(plan(fin, lp.PositionRow("eu-us", "east", 3, 90, 12, 0)).final([], []))
    assert lp.reflected_in(again) == lp.PositionRow("eu-us", "east", 40, 90, 12, 0)  # clocks only grow
    assert [r.op for r in again.rows if isinstance(r, wire.Row)] == [wire.OP_UPDATE]


def test_the_range_sql_is_qualified_and_bounded() -> None:
    sql, params = lc.range_sql(wire.Table("a b", 'q"t', (wire.Column("k", "text"), wire.Column("n", "int")), (0, 1)),
                               (b"x", b"1"), (b"y", b"2"))
    assert 'FROM ONLY "a b"."q""t"' in sql and sql.count("OPERATOR(pg_catalog.>)") == 1
    assert sql.count("OPERATOR(pg_catalog.<=)") == 1 and "::pg_catalog.text COLLATE" not in sql
    assert params == ["x", "1", "y", "2"]
    assert "WHERE" not in lc.snapshot_sql(T)


def test_a_copy_of_a_link_both_ways_is_refused_unless_every_table_settles_by_primary_wins(tmp_path: Path) -> None:
    """A row both sites changed while the link was broken is settled on the peer only (this site
    sees the peer's version in the copy, never as a change): only primary-wins's arbiter realigns
    it afterwards, so under any other policy a copy could leave the sites different: refused."""
    from chorus.config import LinkConfig
    from chorus.link.site import SiteLinks
    from chorus.wslog import WritesetLog

    assert lc.unsettled_both_ways("primary-wins", {}) == []
    assert lc.unsettled_both_ways("primary-wins", {"public.c": "delta", "public.p": "primary-wins"}) == [
        "public.c: delta"]
    assert lc.unsettled_both_ways("latest-commit-wins", {}) == ["policy latest-commit-wins"]

    log = WritesetLog(str(tmp_path / "wslog"), segment_bytes=64 << 10, total_bytes=256 << 10)
    log.open()

    async def query(sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
        return []

    def links(**kw: object) -> SiteLinks:
        link = LinkConfig("a-b", "site-b", "site-a", "c", "k", "p", "s", peers=("127.0.0.1:1",), **kw)  # type: ignore[arg-type]
        return SiteLinks("nb", (link,), log, lambda: 0, lambda m: None, query)

    async def main() -> None:
        with pytest.raises(ValueError, match="goes both ways and settles conflicts by policy latest-commit-wins"):
            await links(listen="127.0.0.1:2").reinstantiate("a-b")
        with pytest.raises(ValueError, match=r"public\.c: delta"):
            await links(listen="127.0.0.1:2", policy="primary-wins", primary="site-a",
                        table_policy=(("public.c", "delta"),),
                        delta_columns=(("public.c", ("n",)),)).reinstantiate("a-b")
        # one way, or both ways under primary-wins: past this check (to the next: no receiver runs here)
        for kw in ({}, {"listen": "127.0.0.1:2", "policy": "primary-wins", "primary": "site-a"}):
            with pytest.raises(ValueError, match="receiver runs on node"):
                await links(**kw).reinstantiate("a-b")
    asyncio.run(main())
    log.close()


def test_a_copy_is_refused_when_the_peer_says_it_receives_the_link_too(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no node of this site serves the link's other way from this node's settings (no
    ``listen`` here), the peer's SNAPSHOT says the link goes both ways: the copy stops there,
    refused, before any batch is sent; a peer that does not receive it lets the copy go on."""
    from chorus.config import LinkConfig
    from chorus.link import site as link_site
    from chorus.link.site import SiteLinks
    from chorus.wslog import WritesetLog

    log = WritesetLog(str(tmp_path / "wslog"), segment_bytes=64 << 10, total_bytes=256 << 10)
    log.open()
    sent: list[object] = []

    class Peer:
        receives = True

        def __init__(self, *args: object) -> None:
            pass

        async def copy(self, address: str, snapshot: Any, sink: Any) -> proto.Copied:
            await snapshot(proto.Snapshot(7, Peer.receives, 3))
            raise LinkError("the peer went away")  # (past the check: the copy had started)

    monkeypatch.setattr(link_site, "LinkReceiver", Peer)

    async def query(sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
        return []

    async def run() -> tuple[SiteLinks, link_site.Reinstantiation]:
        link = LinkConfig("a-b", "site-b", "site-a", "c", "k", "p", "s", peers=("127.0.0.1:1",))
        links = SiteLinks("nb", (link,), log, lambda: 0, sent.append, query)
        links.receiver_nodes["a-b"] = "nb"
        await links.reinstantiate("a-b")
        copy = links.copies["a-b"]
        assert copy.task is not None
        await copy.task
        return links, copy

    links, copy = asyncio.run(run())
    assert copy.state == "refused" and copy.error is not None and "goes both ways" in copy.error
    assert copy.gid is None and sent == []
    [row] = links.status()  # what chorus link status shows: the refusal, until the receiver runs again
    assert row["copy"]["state"] == "refused" and row["why"] == copy.error
    Peer.receives = False
    links, copy = asyncio.run(run())
    assert copy.state == "failed" and copy.gid == 7 and "the peer went away" in (copy.error or "")
