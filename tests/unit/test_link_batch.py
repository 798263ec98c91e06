"""Batches of a link (docs/LINKS.md section 3.1): the receiver sends the peer's consecutive
transactions on as one link writeset while earlier ones wait for their outcome; every node applies
them at one GID in one transaction, each decided in turn from the link's row the one before left;
the position moves with each exactly."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Optional

import pytest

from chorus import wire
from chorus.bus import proto as bp
from chorus.actions import Apply
from chorus.bus import Delivery
from chorus.commit.pipeline import Pending
from chorus.link import position as lp
from chorus.link.events import RemoteTransaction
from chorus.link.settle import SITE_SQL, STAMP_SQL, Settings
from chorus.link.site import Inbound

from test_link_apply import LINK, Site, remote, step, tx


def chain(*gids: int, after: int = 0) -> list[bp.LinkWriteset]:
    out = []
    for g in gids:
        out.append(step(after=after, peer_gid=g, peer_clock=g + 1, max_replicated=g // 2, commit_time=1000 + g,
                        writeset=wire.encode(remote(g))))
        after = g
    return out


# ---- the message ------------------------------------------------------------------------------

def test_a_batch_travels_at_bus_version_6_and_expands_to_its_transactions() -> None:
    items = chain(3, 5, 9, after=2)
    m = lp.batch(items)
    assert (m.after, m.peer_gid, m.peer_clock, m.max_replicated, m.commit_time) == (2, 9, 10, 4, 1009)
    head = wire.scan(m.writeset)
    assert not head.rows and set(head.keys) == {k for i in items for k in wire.decode(i.writeset).keys}
    assert bp.decode(bp.encode(m)) == m
    assert lp.steps(bp.decode(bp.encode(m))) == tuple(items)
    with pytest.raises(bp.BusProtoError, match="version 6"):
        bp.encode(m, 5)
    single = items[0]
    assert bp.decode(bp.encode(single)) == single and lp.steps(single) == (single,)
    assert bp.decode(bp.encode(single, 5)) == single  # a site still at version 5: as before
    good = bp.encode(m)
    for n in range(len(good)):  # every truncation is refused, never taken for a shorter message
        with pytest.raises(bp.BusProtoError):
            bp.decode(good[:n])
    with pytest.raises(bp.BusProtoError, match="trailing bytes"):
        bp.decode(good + b"\x00")


@pytest.mark.parametrize("bad, says", [
    (lambda m: dataclasses.replace(m, steps=m.steps[:1], peer_gid=3, peer_clock=4, max_replicated=1,
                                   commit_time=1003), "2 to"),
    (lambda m: dataclasses.replace(m, steps=(m.steps[1], m.steps[0])), "does not follow"),
    (lambda m: dataclasses.replace(m, peer_gid=8), "last transaction's"),
])
def test_a_batch_that_is_not_a_chain_is_not_written(bad: Any, says: str) -> None:
    with pytest.raises(bp.BusProtoError, match=says):
        bp.encode(bad(lp.batch(chain(3, 5, after=2))))


def test_what_goes_alone() -> None:
    assert lp.batchable(remote())
    nokey = wire.Table("app", "log", (wire.Column("v", "text"),), (0,), full_identity=True)
    assert not lp.batchable(dataclasses.replace(remote(), tables=(nokey,)))
    with pytest.raises(ValueError, match="follows"):
        lp.batch([*chain(3, 5), *chain(9, after=6)])


# ---- the decision and what a batch commits ----------------------------------------------------

def test_outcome_of_a_batch() -> None:
    D = lp.Decision
    assert lp.outcome([D.DUPLICATE, D.APPLY]) == D.APPLY
    assert lp.outcome([D.DUPLICATE, D.DUPLICATE]) == D.DUPLICATE
    assert lp.outcome([D.APPLY, D.GAP]) == D.GAP
    assert lp.outcome([D.WRONG_PEER]) == D.WRONG_PEER


def test_the_record_of_a_batch_is_its_transactions_in_order() -> None:
    items = chain(3, 5)
    row = None
    finals = []
    for s in items:
        finals.append(lp.final_writeset(s, wire.decode(s.writeset), row, lp.Decision.APPLY))
        row = lp.advanced(row, s)
    finals.insert(1, wire.empty())  # a duplicate between them commits nothing
    ws = wire.decode(lp.merged(finals))
    parts = [wire.decode(f) for f in finals]
    assert [(ws.tables[r.table], r.op, r.new) for r in ws.rows if isinstance(r, wire.Row)] == [
        (p.tables[r.table], r.op, r.new) for p in parts for r in p.rows if isinstance(r, wire.Row)]
    assert len(ws.tables) == 2 and list(ws.keys) == [k for p in parts for k in p.keys]
    mine = lp.reflected(lp.merged(finals))
    assert mine is not None and (mine.applied_gid, mine.peer_clock) == (5, 6)  # the last one's
    assert lp.merged([wire.empty(), wire.empty()]) == wire.empty()


def test_the_pipeline_decides_each_transaction_of_a_batch_after_applying_the_one_before(tmp_path: Any) -> None:
    from test_shell_parts import Db, _pipeline

    async def go() -> None:
        p, log = _pipeline(tmp_path, Db(ok=False))
        m = lp.batch(chain(3, 5, 9))
        pend = Pending(1, 0, lp.origin(m.link), wire.scan(m.writeset), link=m)
        p.admit(pend, local=False)
        p.link_settings = {"east-west": Settings("west", "east")}
        events: list[Any] = []

        async def query(sql: str, params: Any) -> list[tuple[Any, ...]]:
            events.append(sql)
            return [("west",)] if sql == SITE_SQL else []

        async def apply(data: bytes) -> None:
            events.append(lp.reflected(data))
        # the link is at peer GID 3 already: the first is a duplicate, the others apply in turn
        final = await p._link_final(pend, ("east-west", "east", 3, 4, 0, 0), query, apply)
        (applied,) = [e for e in events if not isinstance(e, str)]
        assert (applied.applied_gid, applied.peer_clock) == (9, 10)
        # keys apart: the transactions read their stamps together, and apply together
        assert [e if isinstance(e, str) else "apply" for e in events] == [SITE_SQL, STAMP_SQL, "apply"]
        assert (pend.link_decision, pend.link_applied) == (lp.Decision.APPLY, 2)
        row = lp.reflected(final)
        assert row is not None and (row.applied_gid, row.peer_clock, row.max_replicated) == (9, 10, 4)
        rows = [r for r in wire.decode(final).rows if isinstance(r, wire.Row)]
        assert [r.new[0] for r in rows if wire.decode(final).tables[r.table] != lp.POSITION_TABLE] == [b"5", b"9"]
        # a gap in the middle: what follows it commits nothing either, and the receiver resumes
        m2 = lp.batch(chain(11, 12, after=10))
        pend2 = Pending(2, 1, lp.origin(m2.link), wire.scan(m2.writeset), link=m2)
        p.admit(pend2, local=False)
        events.clear()
        assert await p._link_final(pend2, ("east-west", "east", 9, 10, 4, 0), query, apply) == wire.empty()
        assert (pend2.link_decision, pend2.link_applied) == (lp.Decision.GAP, 0)
    asyncio.run(go())


# ---- the receiver -----------------------------------------------------------------------------

def test_the_receiver_batches_what_arrives_while_the_window_is_full() -> None:
    async def go() -> None:
        site = Site(lp.PositionRow("east-west", "east", 1, 2, 0, 0))
        inbound = Inbound("n1", LINK, site.send, site.read, window=1, wall=lambda: 1.5, batch_max=3)
        await inbound.position()
        await inbound.sink(tx(2))  # room: sent at once, alone
        assert [(m.after, m.peer_gid, m.steps) for m in site.sent] == [(1, 2, ())]
        await inbound.sink(tx(4))  # the window is full: held, the sink returns
        await inbound.sink(tx(7))
        assert len(site.sent) == 1 and inbound.applied_through() == 1
        inbound.committed(site.sent[0].ticket, lp.Decision.APPLY)  # the outcome sends what was held
        assert len(site.sent) == 2
        b = site.sent[1]
        assert (b.after, b.peer_gid, [s.peer_gid for s in b.steps]) == (2, 7, [4, 7])
        assert [(s.after, s.peer_gid) for s in lp.steps(b)] == [(2, 4), (4, 7)]
        assert inbound.applied_through() == 2 and inbound.waiting()[0] == 4
        # a full batch waits for room
        for g in (8, 9):
            await inbound.sink(tx(g))
        full = asyncio.ensure_future(inbound.sink(tx(10)))
        await asyncio.sleep(0.01)
        assert not full.done()
        inbound.committed(b.ticket, lp.Decision.APPLY, 2)
        await asyncio.wait_for(full, 1)
        assert [s.peer_gid for s in site.sent[2].steps] == [8, 9, 10]
        assert inbound.applied == 3 and inbound.sent == 6
        # a failure: what is held is dropped, the stream resumes from the position
        await inbound.sink(tx(11))
        inbound.committed(site.sent[2].ticket, lp.Decision.GAP)
        assert len(site.sent) == 3  # (held, not sent after a failure)
        site.position = lp.PositionRow("east-west", "east", 7, 8, 0, 0)
        assert (await inbound.position()).applied_gid == 7 and not inbound.held
        await inbound.sink(tx(8))
        assert (site.sent[-1].after, site.sent[-1].peer_gid) == (7, 8)
    asyncio.run(go())


def test_a_large_transaction_goes_alone_after_what_was_held() -> None:
    async def go() -> None:
        site = Site()
        size = len(wire.encode(remote()))
        inbound = Inbound("n1", LINK, site.send, site.read, window=1, batch_bytes=size * 3)
        await inbound.position()
        await inbound.sink(tx(1))
        await inbound.sink(tx(2))
        await inbound.sink(tx(3))
        large = remote(4)
        large = dataclasses.replace(large, rows=(wire.Row("I", 0, (), (b"4", b"x" * size * 3)),))
        big = asyncio.ensure_future(inbound.sink(RemoteTransaction("east", 4, 0, wire.decode(wire.encode(large)))))
        await asyncio.sleep(0.01)
        assert not big.done()
        inbound.committed(site.sent[0].ticket, lp.Decision.APPLY)  # what was held goes first
        await asyncio.sleep(0.01)
        assert not big.done()
        inbound.committed(site.sent[1].ticket, lp.Decision.APPLY)
        await asyncio.wait_for(big, 1)
        assert [[s.peer_gid for s in lp.steps(m)] for m in site.sent] == [[1], [2, 3], [4]]
        await inbound.sink(tx(5))  # held: the large one waits
        assert len(site.sent) == 3
    asyncio.run(go())


# ---- every node: one GID, certified by the keys of all its transactions -------------------------

def test_a_batch_takes_one_gid_and_a_local_transaction_overlapping_any_of_it_fails_everywhere() -> None:
    from test_link_apply import T
    from test_replicator import NAMES, form

    c = form()
    seen = c.nodes["n1"].gid
    m = lp.batch([dataclasses.replace(s, node="n2") for s in chain(3, 5, 9)])
    c.order.append(("n2", bp.encode(m)))
    # a local transaction of the batch's second row, certified after it without having seen it
    c.ticket += 1
    ws = wire.Writeset(1, 1, seen, (T,), (wire.Row("U", 0, (b"5",), (b"5", b"y")),),
                       (wire.Key(wire.KeyMode.UPDATE, (b"app", b"items", b"id", b"5")),))
    c.order.append(("n1", bp.encode(bp.WritesetMsg("n1", c.ticket, wire.encode(ws)))))
    c.drain()
    for n in NAMES:
        assert c.nodes[n].gid == seen + 2
        assert c.applied[n] == [seen + 1]  # the batch, at one GID, on every node
        assert c.nodes[n].stats.cert_failures == 1  # the local transaction fails, on every node
    assert c.log["n1"][-1] == (seen + 2, False)
    r = c.nodes["n3"]
    acts = r.on_delivery(Delivery("n2", bp.encode(dataclasses.replace(m, ticket=9))))
    (a,) = acts
    assert isinstance(a, Apply) and a.link is not None and lp.steps(a.link) == tuple(
        dataclasses.replace(s, node="n2", ticket=9) for s in chain(3, 5, 9))


def test_a_transaction_that_reads_what_one_before_it_in_the_batch_writes_reads_after_its_apply(
        tmp_path: Any) -> None:
    """Two transactions of a batch change one row: the second reads the row's stamp (and the
    row, when in conflict) only once the first is applied in the transaction."""
    from test_shell_parts import Db, _pipeline

    async def go() -> None:
        p, log = _pipeline(tmp_path, Db(ok=False))
        same = [step(after=0, peer_gid=3, peer_clock=4, writeset=wire.encode(remote(1))),
                step(after=3, peer_gid=5, peer_clock=6, writeset=wire.encode(remote(2))),
                step(after=5, peer_gid=8, peer_clock=9, writeset=wire.encode(remote(1)))]
        m = lp.batch(same)
        pend = Pending(1, 0, lp.origin(m.link), wire.scan(m.writeset), link=m)
        p.admit(pend, local=False)
        p.link_settings = {"east-west": Settings("west", "east")}
        events: list[Any] = []

        async def query(sql: str, params: Any) -> list[tuple[Any, ...]]:
            events.append(sql if sql != STAMP_SQL else ("stamps", len(params[0])))
            return [("west",)] if sql == SITE_SQL else []

        async def apply(data: bytes) -> None:
            r = lp.reflected(data)
            events.append(("apply", r.applied_gid if r else None))
        await p._link_final(pend, None, query, apply)
        assert events == [SITE_SQL, ("stamps", 3), ("apply", 5), ("stamps", 2), ("apply", 8)]  # (rows and their table)
        assert (pend.link_decision, pend.link_applied) == (lp.Decision.APPLY, 3)
    asyncio.run(go())


def test_segments_of_a_batch() -> None:
    from chorus.commit.pipeline import link_segments
    a, b = remote(1), remote(2)
    whole = dataclasses.replace(remote(3), keys=(wire.Key(wire.KeyMode.EXCLUSIVE, (b"app", b"items")),))
    assert link_segments([a, b, remote(3)], False) == [[0, 1, 2]]
    assert link_segments([a, b, a, b], False) == [[0, 1], [2, 3]]
    assert link_segments([a, whole, b], False) == [[0], [1], [2]]
    assert link_segments([a, b], True) == [[0], [1]]
