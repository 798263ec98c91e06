"""A transaction received over a link, applied through the receiving site's total order
(docs/LINKS.md section 3): the bus message, the apply's decision and the writeset it commits, the
replicator's handling on every node, the receiver's sink and position, the configuration."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Optional

import pytest

from chorus import wire
from chorus.actions import Apply
from chorus.bus import Delivery
from chorus.bus import proto as bp
from chorus.config import ChorusConfigError, LinkConfig, load_config
from chorus.link import position as lp
from chorus.link.events import ClockEvent, RemoteTransaction
from chorus.link.proto import LinkError
from chorus.link.settle import SITE_SQL, STAMP_SQL, Settings
from chorus.link.site import Inbound, provenance, receiver_node
from chorus.wire import Key, KeyMode, Row, Table, Writeset
from chorus.wslog import LogRecord

from test_replicator import NAMES, form, writeset

T = Table("app", "items", (wire.Column("id", "int4"), wire.Column("v", "text")), (0,))


def remote(key: int = 1) -> Writeset:
    return Writeset(7, 8, 3, (T,), (Row("I", 0, (), (str(key).encode(), b"x")),),
                    (Key(KeyMode.EXCLUSIVE, (b"app", b"items", b"id", str(key).encode())),))


def step(after: int = 0, peer_gid: int = 5, **kw: Any) -> bp.LinkWriteset:
    values: dict[str, Any] = dict(node="n1", ticket=1, link="east-west", peer_site="east", after=after,
                                  peer_gid=peer_gid, peer_clock=peer_gid + 1, max_replicated=0,
                                  commit_time=1_700_000_000_000_000, sent_at=1_700_000_000_123_456,
                                  writeset=wire.encode(remote()), settings=Settings("west", "east").fingerprint)
    values.update(kw)
    return bp.LinkWriteset(**values)


# ---- the bus message ------------------------------------------------------------------------

def test_link_writeset_message_round_trip() -> None:
    m = step(after=4, peer_gid=9, max_replicated=3)
    assert bp.decode(bp.encode(m)) == m
    assert bp.encode(m)[:2] == bytes([bp.VERSION]) + b"K"


def test_link_writeset_at_version_3_carries_no_settings_fingerprint() -> None:
    """The fingerprint is a version-4 field: a cluster still at version 3 (a node of the release
    before among its members) reads the message as that release wrote it, and a node then finds
    no fingerprint to match its own, so it does not settle with settings it cannot compare."""
    from proto_v3_release import decode as v3_decode  # the release before's own reader
    m = step(after=4, peer_gid=9)
    old = bp.encode(m, 3)
    assert old[:2] == b"\x03K"
    assert bp.decode(old) == dataclasses.replace(m, settings="")
    assert v3_decode(old).writeset == m.writeset
    assert bp.decode(bp.encode(m, 4)).settings == m.settings


@pytest.mark.parametrize("bad, says", [
    (dict(after=5, peer_gid=5), "not a range"),
    (dict(after=6, peer_gid=5), "not a range"),
    (dict(link=""), "names its link"),
    (dict(peer_site="x" * 65), "at most 64"),
])
def test_link_writeset_that_is_not_one_is_not_written(bad: dict[str, Any], says: str) -> None:
    with pytest.raises(bp.BusProtoError, match=says):
        bp.encode(step(**bad))


def test_malformed_link_writeset_is_refused_with_a_clear_error() -> None:
    good = bp.encode(step())
    with pytest.raises(bp.BusProtoError, match="truncated"):
        bp.decode(good[:-1])
    with pytest.raises(bp.BusProtoError, match="trailing bytes"):
        bp.decode(good + b"\x00")
    with pytest.raises(bp.BusProtoError, match=f"unsupported bus message version {bp.VERSION + 1}"):
        bp.decode(bytes([bp.VERSION + 1]) + good[1:])
    with pytest.raises(bp.BusProtoError, match="unknown bus message type"):
        bp.decode(good[:1] + b"k" + good[2:])
    # a range the other way round, written by hand: after = peer GID
    m = step(after=0, peer_gid=5)
    raw = bytearray(bp.encode(m))
    head = 2 + 2 + len(m.node) + 2 + len(m.link) + 2 + len(m.peer_site)
    raw[head + 8:head + 16] = (5).to_bytes(8, "big")
    with pytest.raises(bp.BusProtoError, match="not a range"):
        bp.decode(bytes(raw))
    # every truncation is refused, never taken for a shorter message
    for n in range(len(good)):
        with pytest.raises(bp.BusProtoError):
            bp.decode(good[:n])


# ---- the apply's decision ---------------------------------------------------------------------

def row(applied: int, site: str = "east", clock: int = 0, mr: int = 0) -> lp.PositionRow:
    return lp.PositionRow("east-west", site, applied, clock, mr, 0)


def test_the_first_link_writeset_applies_from_no_position() -> None:
    assert lp.decide(step(after=0, peer_gid=5), None) == lp.Decision.APPLY


def test_the_next_link_writeset_applies_where_the_position_is() -> None:
    assert lp.decide(step(after=5, peer_gid=9), row(5)) == lp.Decision.APPLY


@pytest.mark.parametrize("after, peer_gid, applied", [(0, 5, 5), (0, 5, 9), (5, 9, 9), (3, 4, 9)])
def test_a_peer_gid_at_or_below_the_position_is_a_duplicate(after: int, peer_gid: int, applied: int) -> None:
    """Sent again after a reconnect, or by an old and a new receiver after a failover: the GID
    commits empty on every node (docs/LINKS.md section 3)."""
    assert lp.decide(step(after=after, peer_gid=peer_gid), row(applied)) == lp.Decision.DUPLICATE


@pytest.mark.parametrize("after, peer_gid, applied", [(7, 9, 5), (3, 9, 5), (2, 9, None)])
def test_a_link_writeset_that_does_not_follow_the_position_is_a_gap(after: int, peer_gid: int,
                                                                    applied: Optional[int]) -> None:
    """An earlier one was not applied (its message lost): this one commits empty, and the
    receiver resumes from the position."""
    current = row(applied) if applied is not None else None
    assert lp.decide(step(after=after, peer_gid=peer_gid), current) == lp.Decision.GAP


def test_a_position_of_another_peer_site_is_not_moved() -> None:
    assert lp.decide(step(after=5, peer_gid=9), row(5, site="north")) == lp.Decision.WRONG_PEER


def test_the_writeset_applied_holds_the_peers_rows_and_the_position() -> None:
    s = step(after=0, peer_gid=5, peer_clock=6, max_replicated=2)
    first = wire.decode(lp.final_writeset(s, remote(), None, lp.Decision.APPLY))
    assert first.tables == (T, lp.POSITION_TABLE)
    assert first.rows[0] == remote().rows[0]
    assert first.rows[1] == Row("I", 1, (), (b"east-west", b"east", b"5", b"6", b"2",
                                            b"2023-11-14 22:13:20.123456+00"))
    assert first.keys == (*remote().keys, lp.position_key("east-west"))
    # the next one updates the row; clock values never go back
    s2 = step(after=5, peer_gid=9, peer_clock=4, max_replicated=7)
    second = wire.decode(lp.final_writeset(s2, remote(2), row(5, clock=6, mr=2), lp.Decision.APPLY))
    assert second.rows[1] == Row("U", 1, (b"east-west",), (b"east-west", b"east", b"9", b"6", b"7",
                                                          b"2023-11-14 22:13:20.123456+00"))


@pytest.mark.parametrize("decision", [lp.Decision.DUPLICATE, lp.Decision.GAP, lp.Decision.WRONG_PEER])
def test_a_link_writeset_not_applied_commits_an_empty_writeset(decision: lp.Decision) -> None:
    assert lp.final_writeset(step(), remote(), row(9), decision) == wire.empty()


def test_the_position_key_is_the_rows_certification_key() -> None:
    from chorus.link.events import row_key
    new = lp.row_values(lp.advanced(None, step()))
    assert row_key(lp.POSITION_TABLE, Row("I", 0, (), new)).parts == lp.position_key("east-west").parts


def test_a_scanned_writeset_or_an_ordering_request_is_not_made_into_an_apply() -> None:
    with pytest.raises(ValueError, match="decoded in full"):
        lp.final_writeset(step(), wire.scan(wire.encode(remote())), None, lp.Decision.APPLY)
    toi = Writeset(7, 8, 3, (), (wire.Schema((), "postgres", b"CREATE TABLE x ()"),), (),
                   flags=wire.FLAG_DDL | wire.FLAG_TOI)
    with pytest.raises(ValueError, match="no ordering request"):
        lp.final_writeset(step(), toi, None, lp.Decision.APPLY)


def test_a_schema_change_is_applied_in_its_place_before_the_links_row() -> None:
    ddl = wire.Schema((("search_path", "app"),), "alice", b"ALTER TABLE app.items ADD c int")
    r = remote()
    ws = dataclasses.replace(r, rows=(ddl, *r.rows), flags=wire.FLAG_DDL)
    out = wire.decode(lp.final_writeset(step(), ws, None, lp.Decision.APPLY))
    assert out.has_schema and out.rows[0] == ddl and out.rows[1] == r.rows[0]
    assert lp.reflected_in(out) is not None  # the link's row, last
    assert not lp.batchable(ws)  # a schema change goes alone, never in a batch


# ---- every node of the site (the replicator) ---------------------------------------------------

def test_a_link_writeset_gets_a_gid_and_is_applied_on_every_node_its_receiver_too() -> None:
    c = form()
    m = step(node="n2", writeset=wire.encode(remote(1)))
    c.order.append(("n2", bp.encode(m)))
    c.drain()
    gids = {n: r.gid for n, r in c.nodes.items()}
    assert len(set(gids.values())) == 1
    for n, r in c.nodes.items():
        assert c.applied[n] == [r.gid]  # n2 applies it too: no backend ran it
    # the Apply carries the message, under the link's origin
    r = c.nodes["n1"]
    acts = r.on_delivery(Delivery("n2", bp.encode(dataclasses.replace(m, ticket=2))))
    assert [type(a) for a in acts] == [Apply]
    a = acts[0]
    assert isinstance(a, Apply) and a.link == dataclasses.replace(m, ticket=2) and a.origin == "link:east-west"


def test_where_the_peer_applied_reaches_every_node_of_the_site() -> None:
    """bp.LinkApplied from a member (its sender heard it from the peer's receiver): every node is
    told to pin its log there (docs/LINKS.md section 2); from a node that is not a member, none."""
    from chorus.actions import LinkPinned
    c = form()
    msg = bp.LinkApplied("n2", "east-west", 17)
    assert bp.decode(bp.encode(msg)) == msg
    for r in c.nodes.values():
        assert r.on_delivery(Delivery("n2", bp.encode(msg))) == [LinkPinned("n2", "east-west", 17)]
        assert r.on_delivery(Delivery("n9", bp.encode(bp.LinkApplied("n9", "east-west", 18)))) == []
    with pytest.raises(bp.BusProtoError, match="link name"):
        bp.encode(bp.LinkApplied("n2", "x" * 65, 1))


def test_a_local_transaction_that_overlaps_a_link_writeset_and_did_not_see_it_fails_everywhere() -> None:
    """Invariant 2 with the link's origin: the link writeset never fails (it is a blind write at
    its GID), the local transaction certified after it with an older snapshot does (40001), on
    the link's receiving node as on the others."""
    c = form()
    seen = c.nodes["n1"].gid
    key_ws = Writeset(1, 1, 0, (T,), (Row("U", 0, (b"1",), (b"1", b"y")),),
                      (Key(KeyMode.UPDATE, (b"app", b"items", b"id", b"1")),))
    c.order.append(("n2", bp.encode(step(node="n2", writeset=wire.encode(remote(1))))))
    for node in ("n1", "n2"):  # from the receiving node itself, and from another
        c.ticket += 1
        ws = wire.encode(dataclasses.replace(key_ws, last_seen=seen))
        c.order.append((node, bp.encode(bp.WritesetMsg(node, c.ticket, ws))))
    c.drain()
    link_gid = seen + 1
    for n in NAMES:
        assert (link_gid, True) in c.log[n] and link_gid in c.applied[n]
    assert c.log["n1"][-1] == (link_gid + 1, False)
    assert c.log["n2"][-1] == (link_gid + 2, False)
    assert all(r.stats.cert_failures == 2 for r in c.nodes.values())


def test_a_link_writeset_from_a_node_that_is_not_a_member_is_dropped_everywhere() -> None:
    c = form()
    before = {n: r.gid for n, r in c.nodes.items()}
    c.order.append(("n9", bp.encode(step(node="n9"))))
    c.drain()
    assert {n: r.gid for n, r in c.nodes.items()} == before


def test_a_malformed_link_writeset_takes_its_gid_and_is_applied_nowhere() -> None:
    c = form()
    before = c.nodes["n1"].gid
    c.order.append(("n1", bp.encode(step(writeset=b"CW\x02garbage"))))
    toi = Writeset(7, 8, 3, (), (wire.Schema((), "postgres", b"CREATE TABLE x ()"),), (),
                   flags=wire.FLAG_DDL | wire.FLAG_TOI)  # a link never carries an ordering request
    c.order.append(("n1", bp.encode(step(writeset=wire.encode(toi)))))
    c.drain()
    assert all(r.gid == before + 2 for r in c.nodes.values())
    assert all(c.applied[n] == [] for n in NAMES)
    assert all(r.stats.malformed == 2 for r in c.nodes.values())


def ddl_remote() -> Writeset:
    """A peer's schema change as its log holds it (docs/DDL.md): the statement, an exclusive key on
    the table it names and the key every schema change holds."""
    return Writeset(7, 8, 3, (), (wire.Schema((("search_path", "app"),), "alice", b"ALTER TABLE items ADD c int"),),
                    (Key(KeyMode.EXCLUSIVE, (b"app", b"items")), Key(KeyMode.EXCLUSIVE, (b"chorus", b"schema changes"))),
                    flags=wire.FLAG_DDL)


def test_a_link_writeset_with_a_schema_change_is_applied_everywhere_and_fails_what_did_not_see_it() -> None:
    """docs/LINKS.md section 8.1: a peer's schema change takes a GID on every node like any link
    writeset (no report round: the link's apply applies it), as a barrier, and a local transaction
    of its table certified after it with an older snapshot fails (40001) on every node."""
    c = form()
    seen = c.nodes["n1"].gid
    c.order.append(("n2", bp.encode(step(node="n2", writeset=wire.encode(ddl_remote())))))
    c.ticket += 1
    local = Writeset(1, 1, seen, (T,), (Row("U", 0, (b"1",), (b"1", b"y")),),  # (its table's key as the extension puts it)
                     (Key(KeyMode.UPDATE, (b"app", b"items", b"id", b"1")), Key(KeyMode.REFERENCE, (b"app", b"items"))))
    c.order.append(("n1", bp.encode(bp.WritesetMsg("n1", c.ticket, wire.encode(local)))))
    c.drain()
    link_gid = seen + 1
    for n in NAMES:
        assert (link_gid, True) in c.log[n] and link_gid in c.applied[n]
    assert c.log["n1"][-1] == (link_gid + 1, False)  # the local transaction's 40001
    assert all(link_gid + 1 not in c.applied[n] for n in NAMES)
    assert all(r.stats.malformed == 0 and r.stats.cert_failures == 1 for r in c.nodes.values())


def test_an_unstable_link_writeset_reaches_a_joiner_as_a_link_writeset() -> None:
    from chorus.dataplane.order import unstable_entry
    from chorus.replicator import _unstable_action
    m = step()
    a = Apply(12, 11, "link:east-west", wire.scan(m.writeset), link=m)
    entry = unstable_entry("n1", 12, a)
    back = _unstable_action(*entry)
    assert isinstance(back, Apply) and back.link == m and back.origin == a.origin
    plain = _unstable_action(3, 2, "n2", writeset(0, 1))
    assert isinstance(plain, Apply) and plain.link is None
    with pytest.raises(wire.WireError):
        _unstable_action(12, 11, "link:east-west", b"\x03garbage")


# ---- the receiver's sink and position -----------------------------------------------------------

LINK = LinkConfig("east-west", "west", "east", "c", "k", "pc", "s", peers=("h:1",))


def tx(gid: int) -> RemoteTransaction:
    return RemoteTransaction("east", gid, 0, wire.decode(wire.encode(remote(gid))))


class Site:
    def __init__(self, position: Optional[lp.PositionRow] = None) -> None:
        self.sent: list[bp.LinkWriteset] = []
        self.position = position

    def send(self, m: bp.Message) -> None:
        assert isinstance(m, bp.LinkWriteset)
        self.sent.append(m)

    async def read(self) -> Optional[lp.PositionRow]:
        return self.position


def test_the_sink_chains_each_transaction_to_the_one_before_within_a_window() -> None:
    async def go() -> None:
        site = Site(lp.PositionRow("east-west", "east", 4, 5, 0, 0))
        # a site whose bus is at version 5: nothing batched, the sink waits for room
        inbound = Inbound("n1", LINK, site.send, site.read, window=2, wall=lambda: 1.5, batches=lambda: False)
        assert (await inbound.position()).applied_gid == 4
        await inbound.sink(tx(6))
        await inbound.sink(ClockEvent("east", 9))  # the peer's clock
        await inbound.sink(ClockEvent("west", 3))  # this site's, passed back
        await inbound.sink(tx(10))
        assert [(m.after, m.peer_gid) for m in site.sent] == [(4, 6), (6, 10)]
        assert (site.sent[1].peer_clock, site.sent[1].max_replicated, site.sent[1].sent_at) == (11, 3, 1_500_000)
        third = asyncio.ensure_future(inbound.sink(tx(12)))  # the window is full: it waits
        await asyncio.sleep(0.01)
        assert not third.done()
        inbound.committed(site.sent[0].ticket, lp.Decision.APPLY)
        await asyncio.wait_for(third, 1)
        assert [m.peer_gid for m in site.sent] == [6, 10, 12]
    asyncio.run(go())


def test_a_link_writeset_not_applied_makes_the_receiver_resume_from_the_position() -> None:
    async def go() -> None:
        site = Site()
        inbound = Inbound("n1", LINK, site.send, site.read, window=8, drain_timeout=0.05)
        await inbound.position()
        await inbound.sink(tx(1))
        await inbound.sink(tx(2))
        inbound.committed(site.sent[0].ticket, lp.Decision.DUPLICATE)  # fine: it is applied
        inbound.committed(site.sent[1].ticket, lp.Decision.GAP)
        with pytest.raises(LinkError, match="committed empty"):
            await inbound.sink(tx(3))
        site.position = lp.PositionRow("east-west", "east", 1, 2, 0, 0)
        assert (await inbound.position()).applied_gid == 1
        await inbound.sink(tx(2))
        assert (site.sent[-1].after, site.sent[-1].peer_gid) == (1, 2)
    asyncio.run(go())


def test_a_link_writeset_with_no_outcome_in_time_is_taken_as_lost() -> None:
    async def go() -> None:
        site = Site()
        for batches in (False, True):
            inbound = Inbound("n1", LINK, site.send, site.read, window=1, outcome_timeout=0.05, drain_timeout=0.01,
                              batches=lambda: batches, batch_max=2)
            await inbound.position()
            await inbound.sink(tx(1))
            with pytest.raises(LinkError, match="not committed here"):
                await inbound.sink(tx(2))  # (batched: held, the batch full at the next)
                await inbound.sink(tx(3))
    asyncio.run(go())


def test_the_receiver_runs_on_the_lowest_named_synced_member_that_may() -> None:
    assert receiver_node(LINK, {"n3", "n2"}) == "n2"
    assert receiver_node(dataclasses.replace(LINK, nodes=("n3", "n4")), {"n1", "n2", "n3"}) == "n3"
    assert receiver_node(dataclasses.replace(LINK, nodes=("n4",)), {"n1"}) is None


def test_the_sender_does_not_send_back_what_a_link_applied_but_reflects_its_clock() -> None:
    """A record the link applied here is not sent back; the peer's clock value applied by then
    (the link's row it committed) goes back instead ([epoch]: ClockVal events passed through),
    so the peer's max_replicated moves. One that committed empty reflects nothing."""
    facts = provenance(dataclasses.replace(LINK, site="west", peer_site="east"))
    own = facts(LogRecord(3, "n1", 0, b""))
    applied = lp.final_writeset(step(after=0, peer_gid=5, peer_clock=9), remote(), None, lp.Decision.APPLY)
    back = facts(LogRecord(4, "link:east-west", 0, applied))
    empty = facts(LogRecord(5, "link:east-west", 0, wire.empty()))
    third = facts(LogRecord(6, "link:north-east", 0, b""))
    assert own.applied_from is None and own.reflection is None
    assert back.applied_from == "east" and back.reflection == ClockEvent("east", 9)
    assert empty.applied_from == "east" and empty.reflection is None
    assert third.applied_from not in (None, "east")


# ---- configuration ---------------------------------------------------------------------------------

BASE = """
[node]
name = "n1"
data_dir = "/d"
state_file = "/d/s"
socket_path = "/d/c.sock"
admin_socket = "/d/a.sock"
[postgres]
dsn = "x"
"""
LINK_TOML = """
[[link]]
name = "east-west"
site = "west"
peer_site = "east"
peers = ["10.0.0.1:7533"]
tls_cert = "c"
tls_key = "k"
peer_cert = "p"
secret_file = "s"
"""


def _load(tmp_path: Any, text: str) -> Any:
    p = tmp_path / "chorus.toml"
    p.write_text(BASE + text)
    return load_config(str(p))


def test_a_link_is_configured(tmp_path: Any) -> None:
    cfg = _load(tmp_path, LINK_TOML)
    assert cfg.links == (LinkConfig("east-west", "west", "east", "c", "k", "p", "s", peers=("10.0.0.1:7533",)),)
    assert cfg.links[0].max_retain_mb == 16384
    assert _load(tmp_path, LINK_TOML + "max_retain_mb = 100\n").links[0].max_retain_mb == 100


@pytest.mark.parametrize("change, says", [
    (("peers = [\"10.0.0.1:7533\"]", ""), "neither listen"),
    (("site = \"west\"", "site = \"east\""), "to itself"),
    (("name = \"east-west\"", "name = \"east west\""), "must be 1 to 64"),
    (("peers = [\"10.0.0.1:7533\"]", "peers = [\"nowhere\"]"), "is not host:port"),
    (("tls_cert = \"c\"", ""), "missing link.tls_cert"),
    (("secret_file = \"s\"", "secret_file = \"s\"\nwindow = 0"), "window must be at least 1"),
    (("secret_file = \"s\"", "secret_file = \"s\"\ncolour = 1"), "unknown key link.colour"),
    (("secret_file = \"s\"", "secret_file = \"s\"\nmax_retain_mb = 0"), "max_retain_mb must be at least 1"),
    (("secret_file = \"s\"", "secret_file = \"s\"\nmax_retain_mb = \"8GB\""), "link.max_retain_mb must be a int"),
])
def test_a_link_that_cannot_work_is_refused(tmp_path: Any, change: tuple[str, str], says: str) -> None:
    with pytest.raises(ChorusConfigError, match=says):
        _load(tmp_path, LINK_TOML.replace(*change))


def test_two_links_of_one_name_are_refused(tmp_path: Any) -> None:
    with pytest.raises(ChorusConfigError, match="two links named"):
        _load(tmp_path, LINK_TOML + LINK_TOML)


# ---- the pipeline: decided once, logged as committed -------------------------------------------

def test_the_pipeline_decides_once_and_logs_what_committed(tmp_path: Any) -> None:
    """A link writeset's record waits in the log until it committed here, and is then what it
    committed: the peer's rows and the position, decided at the first attempt and kept (a retry
    that reads a moved row applies the same bytes); empty when voting had it commit empty."""
    from chorus.commit.pipeline import Pending
    from test_shell_parts import Db, _pipeline

    async def go() -> None:
        p, log = _pipeline(tmp_path, Db(ok=False))
        m = step(after=0, peer_gid=5)
        first = Pending(1, 0, lp.origin(m.link), wire.scan(m.writeset), link=m)
        p.admit(first, local=False)
        m2 = step(after=5, peer_gid=9, ticket=2)
        second = Pending(2, 1, lp.origin(m2.link), wire.scan(m2.writeset), link=m2)
        p.admit(second, local=False)
        # one after the other (the link's row), and never in a run
        assert p.scheduler.ready_runs(4, 8, p._run_fits) == [[1]]
        p.feeder.flush()
        assert log.end_gid == 0  # the records wait for what they commit
        p.link_settings = {"east-west": Settings("west", "east")}
        asked: list[str] = []

        async def query(sql: str, params: Any) -> list[tuple[Any, ...]]:
            asked.append(sql)
            return [("west",)] if sql == SITE_SQL else []  # no stamps: nothing in conflict
        applied: list[bytes] = []

        async def apply(data: bytes) -> None:
            applied.append(data)
        final = await p._link_final(first, None, query, apply)
        assert asked == [SITE_SQL, STAMP_SQL] and applied == [final]
        assert await p._link_final(first, ("east-west", "east", 5, 6, 0, 0), query, apply) == final  # kept
        assert asked == [SITE_SQL, STAMP_SQL] and applied == [final, final]
        assert first.link_decision == lp.Decision.APPLY
        p._log_link(first)
        second.skip = True  # voting: it commits empty
        p._log_link(second)
        p.feeder.flush()
        records = log.reader(0).read(10)
        assert [(r.gid, r.origin) for r in records] == [(1, "link:east-west"), (2, "link:east-west")]
        assert bytes(records[0].payload) == final
        assert wire.decode(bytes(records[0].payload)).tables[-1] == lp.POSITION_TABLE
        assert bytes(records[1].payload) == wire.empty()
    asyncio.run(go())
