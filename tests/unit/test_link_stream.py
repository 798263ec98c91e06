"""A link's stream for real (docs/LINKS.md sections 2-4): a sender serving a writeset log written
in a temporary directory, a receiver handing what it gets to a list, TLS over loopback with each
site's own certificate. It follows the log up to the committed GID, resumes after a cut from the
sink's position (nothing lost, nothing twice), refuses whoever lacks the link's keys or names
another link or site, carries a large writeset in parts, and says when the link is broken."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import threading
from pathlib import Path
from typing import Callable, Coroutine, Optional

import pytest

from chorus import recovery as rc
from chorus import recoveryproto as rp
from chorus import wire
from chorus.link import proto
from chorus.link.events import ClockEvent, RemoteTransaction, StreamItem
from chorus.link.proto import LinkBroken, LinkEnd, LinkError, LinkKeys, Position
from chorus.link.receiver import LinkReceiver
from chorus.link.rules import RuleError, RuleSet, TableRule
from chorus.link.sender import LinkServer, Provenance
from chorus.spool import Spool
from chorus.wslog import LogRecord, WritesetLog

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

TABLE = wire.Table("public", "t", (wire.Column("id", "int4"), wire.Column("v", "text")), (0,))
WAIT_S = 20.0  # generous: only a broken stream takes this long


def writeset(gid: int, size: int = 1000) -> bytes:
    row = wire.Row(wire.OP_INSERT, 0, (), (str(gid).encode(), b"v" * size))
    key = wire.Key(wire.KeyMode.EXCLUSIVE, (b"public", b"t", b"id", str(gid).encode()))
    return wire.encode(wire.Writeset(gid, 1, 0, (TABLE,), (row,), (key,)))


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LinkKeys]:
    """Keys of sites a and b for their link, and of a site c that is not part of it."""
    base = tmp_path_factory.mktemp("keys")
    sites = {s: rc.generate_keys(str(base / s)) for s in "abc"}
    secret = base / "link.secret"
    secret.write_text(os.urandom(32).hex())
    other = base / "other.secret"
    other.write_text(os.urandom(32).hex())
    return {"a": LinkKeys(sites["a"].cert, sites["a"].key, sites["b"].cert, str(secret)),
            "b": LinkKeys(sites["b"].cert, sites["b"].key, sites["a"].cert, str(secret)),
            "b-other-secret": LinkKeys(sites["b"].cert, sites["b"].key, sites["a"].cert, str(other)),
            "c": LinkKeys(sites["c"].cert, sites["c"].key, sites["a"].cert, str(secret))}


class Unused:
    """The rules here have no SQL parts."""

    def predicate(self, table: wire.Table, values: tuple[wire.Value, ...], predicate: str) -> bool:
        raise AssertionError(predicate)

    def expression(self, table: wire.Table, values: tuple[wire.Value, ...], expression: str) -> wire.Value:
        raise AssertionError(expression)

    def row_function(self, table: wire.Table, values: tuple[wire.Value, ...],
                     function: str) -> Optional[tuple[wire.Value, ...]]:
        raise AssertionError(function)


def facts(r: LogRecord) -> Provenance:
    """This test's marking of records a link applied: origin ``link:<site>:<clock value>``."""
    if r.origin.startswith("link:"):
        _, site, value = r.origin.split(":")
        return Provenance(0, site, ClockEvent(site, int(value)))
    return Provenance(1_000_000 * r.gid)


class SiteA:
    """The sending site: a node's log, its committed GID and a link server on loopback."""

    def __init__(self, tmp: Path, keys: LinkKeys, link: str = "a-b", total_bytes: int = 4 << 20) -> None:
        self.log = WritesetLog(str(tmp / "wslog"), segment_bytes=64 << 10, total_bytes=total_bytes)
        self.log.open()
        self.committed = 0
        self.server = LinkServer(self.log, LinkEnd(link, "site-a", "site-b", keys), lambda: self.committed,
                                 RuleSet(), Unused(), facts, clock_interval=0.05, poll_s=0.01)

    def commit(self, gid: int, payload: Optional[bytes] = None, origin: str = "n1") -> None:
        self.log.append(gid, origin, payload if payload is not None else writeset(gid))
        self.committed = gid

    async def start(self) -> str:
        await self.server.start("127.0.0.1:0")
        assert self.server.server is not None
        return f"127.0.0.1:{self.server.server.sockets[0].getsockname()[1]}"


class SiteB:
    """The receiving site's sink: a list, and the position it would have made durable."""

    def __init__(self, after: int = 0) -> None:
        self.items: list[StreamItem] = []
        self.after = after
        self.clock = 0  # of site a, as seen

    async def take(self, item: StreamItem) -> None:
        self.items.append(item)
        if isinstance(item, RemoteTransaction):
            self.after = item.clock
            self.clock = max(self.clock, item.clock + 1)
        elif item.site == "site-a":
            assert item.value >= self.clock, f"site a's clock went back from {self.clock} to {item.value}"
            self.clock = item.value

    async def position(self) -> Position:
        return Position(self.after, self.clock)

    @property
    def gids(self) -> list[int]:
        return [i.clock for i in self.items if isinstance(i, RemoteTransaction)]

    def receiver(self, addresses: list[str], keys: LinkKeys, link: str = "a-b", site: str = "site-b",
                 spool: Optional[Spool] = None, applied: bool = False) -> LinkReceiver:
        return LinkReceiver(LinkEnd(link, site, "site-a", keys), addresses, self.position, self.take, spool,
                            backoff=(0.01, 0.1), applied=(lambda: self.after) if applied else None,
                            applied_every=0.01)


async def until(check: Callable[[], bool], what: str) -> None:
    async def wait() -> None:
        while not check():
            await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(wait(), WAIT_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"not within {WAIT_S} s: {what}") from None


def run(main: Callable[[], Coroutine[None, None, None]]) -> None:
    asyncio.run(main())


def test_the_stream_follows_the_log_up_to_the_committed_gid(tmp_path: Path, keys: dict[str, LinkKeys]) -> None:
    async def main() -> None:
        a = SiteA(tmp_path, keys["a"])
        for g in range(1, 30, 2):  # odd GIDs certified; even ones failed certification
            a.commit(g)
        a.commit(30, origin="link:site-b:7")  # site b's change, applied here: only its clock goes back
        a.log.append(31, "n1", writeset(31))  # certified, not committed yet
        address = await a.start()
        b = SiteB(after=4)
        task = asyncio.ensure_future(b.receiver([address], keys["b"]).stream(address))
        await until(lambda: ClockEvent("site-a", 31) in b.items, "the sender's clock at the committed GID")
        assert b.gids == list(range(5, 30, 2))
        assert all(i.commit_time == 1_000_000 * i.clock for i in b.items if isinstance(i, RemoteTransaction))
        assert [i for i in b.items if isinstance(i, ClockEvent) and i.site == "site-b"] == [ClockEvent("site-b", 7)]
        assert b.items.index(ClockEvent("site-b", 7)) > b.items.index(next(
            i for i in b.items if isinstance(i, RemoteTransaction) and i.clock == 29))
        # the log grows: the sender follows it
        a.committed = 31
        for g in range(32, 60):
            a.commit(g)
        await until(lambda: b.gids[-1:] == [59], "the records appended later")
        assert b.gids == list(range(5, 30, 2)) + list(range(31, 60))
        txn = b.items[-1]
        assert isinstance(txn, RemoteTransaction) and txn.site == "site-a"
        assert txn.writeset.rows == (wire.Row(wire.OP_INSERT, 0, (), (b"59", b"v" * 1000)),)
        # the sender stops serving: it ends the stream where it got to
        await a.server.close()
        await asyncio.wait_for(task, WAIT_S)
        a.log.close()

    run(main)


class Relay:
    """A loopback TCP relay to the sender that cuts its first connection once ``cut_after``
    bytes came from the sender: the receiver sees the stream break mid-frame. ``progress`` is
    noted as each connection starts."""

    def __init__(self, target: str, cut_after: int, progress: Callable[[], int]) -> None:
        self.host, self.port = rc.split_address(target)
        self.cut_after = cut_after
        self.progress = progress
        self.at_connection: list[int] = []
        self.server: Optional[asyncio.base_events.Server] = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.at_connection.append(self.progress())
        limit = self.cut_after if len(self.at_connection) == 1 else None
        server_r, server_w = await asyncio.open_connection(self.host, self.port)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, limit: Optional[int]) -> None:
            n = 0
            while data := await r.read(1 << 16):
                if limit is not None and n + len(data) >= limit:
                    w.write(data[:limit - n])
                    break
                w.write(data)
                await w.drain()
                n += len(data)

        try:
            await asyncio.wait([asyncio.ensure_future(pipe(client_r, server_w, None)),
                                asyncio.ensure_future(pipe(server_r, client_w, limit))],
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            client_w.close()
            server_w.close()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


def test_a_receiver_cut_off_mid_stream_resumes_from_its_position(tmp_path: Path, keys: dict[str, LinkKeys]) -> None:
    """Section 3's resume position: after the cut the receiver asks again from what the sink
    took, trying the peer's addresses in turn (the first is dead): every transaction once, in order,
    and site a's clock never going back although what was filtered is passed again."""
    async def main() -> None:
        a = SiteA(tmp_path, keys["a"])
        for g in range(1, 101):
            a.commit(g, origin=f"link:site-b:{g}" if g % 10 == 0 else "n1")
        b = SiteB()
        relay = Relay(await a.start(), cut_after=40_000, progress=lambda: len(b.gids))
        dead = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        dead_address = f"127.0.0.1:{dead.sockets[0].getsockname()[1]}"
        dead.close()
        await dead.wait_closed()
        receiver = b.receiver([dead_address, await relay.start()], keys["b"])
        task = asyncio.ensure_future(receiver.run())
        await until(lambda: b.gids[-1:] == [99], "all 90 transactions")
        assert len(relay.at_connection) == 2 and 0 < relay.at_connection[1] < 90  # cut mid-stream, once
        assert b.gids == [g for g in range(1, 100) if g % 10]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await relay.close()
        await a.server.close()
        a.log.close()

    run(main)


@pytest.mark.parametrize("who, expected", [
    ("b-other-secret", "the sender failed authentication"),
    ("wrong-link", "the peer says: this is link a-b from site site-a to site site-b"),
    ("wrong-site", "the peer says: this is link a-b from site site-a to site site-b"),
    ("c", "cannot connect|broke|closed"),  # a certificate site a does not trust
])
def test_a_receiver_without_the_links_keys_or_names_is_refused(tmp_path: Path, keys: dict[str, LinkKeys],
                                                               who: str, expected: str) -> None:
    async def main() -> None:
        a = SiteA(tmp_path, keys["a"])
        a.commit(1)
        address = await a.start()
        b = SiteB()
        if who == "wrong-link":
            receiver = b.receiver([address], keys["b"], link="a-c")
        elif who == "wrong-site":
            receiver = b.receiver([address], keys["b"], site="site-c")
        else:
            receiver = b.receiver([address], keys[who])
        with pytest.raises(LinkError, match=expected):
            await receiver.stream(address)
        assert b.items == []
        await a.server.close()
        a.log.close()

    run(main)


def test_a_receiver_speaking_another_version_is_told_so(tmp_path: Path, keys: dict[str, LinkKeys]) -> None:
    async def main() -> None:
        a = SiteA(tmp_path, keys["a"])
        host, port = rc.split_address(await a.start())
        reader, writer = await asyncio.open_connection(host, port, ssl=keys["b"].context(False))
        writer.write(proto.write_hello(proto.Hello("a-b", "site-b", "site-a", Position(0), b"n" * 16, version=5)))
        answer = await asyncio.wait_for(proto.read_frame(reader), WAIT_S)
        assert answer == proto.Error("link protocol version 5 is not spoken here (this site speaks 1, 2, 3, 4)")
        writer.close()
        await a.server.close()
        a.log.close()

    run(main)


def test_a_large_writeset_travels_in_parts_and_is_gathered_in_a_spool_file(
        tmp_path: Path, keys: dict[str, LinkKeys], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rp, "PART_BYTES", 10_000)
    monkeypatch.setattr(rp, "SPOOL_AT", 50_000)
    kinds: list[str] = []
    read_frame = proto.read_frame

    async def spy(reader: asyncio.StreamReader) -> proto.Frame:
        frame = await read_frame(reader)
        kinds.append(type(frame).__name__)
        return frame
    monkeypatch.setattr(proto, "read_frame", spy)
    spool = Spool(str(tmp_path / "spool"))
    spool.open()

    async def main() -> None:
        a = SiteA(tmp_path, keys["a"])
        a.commit(1)
        a.commit(2, writeset(2, size=300_000))  # larger than a log segment, too: logged in pieces
        a.commit(3)
        address = await a.start()
        b = SiteB()
        task = asyncio.ensure_future(b.receiver([address], keys["b"], spool=spool).stream(address))
        await until(lambda: b.gids == [1, 2, 3], "the three transactions")
        big = b.items[[i for i, x in enumerate(b.items) if isinstance(x, RemoteTransaction)][1]]
        assert isinstance(big, RemoteTransaction)
        assert big.writeset.rows == (wire.Row(wire.OP_INSERT, 0, (), (b"2", b"v" * 300_000)),)
        assert kinds.count("Part") == 31 and spool.files == 1
        await a.server.close()
        await asyncio.wait_for(task, WAIT_S)
        a.log.close()

    run(main)


def test_a_link_whose_position_the_log_no_longer_holds_is_broken(tmp_path: Path, keys: dict[str, LinkKeys]) -> None:
    """Section 2: the ring reused what the link had not sent; the receiver is told which GIDs are
    gone and stops (the link must be instantiated again), never skipping them."""
    async def main() -> None:
        a = SiteA(tmp_path, keys["a"], total_bytes=1 << 20)
        for g in range(1, 3000):  # ~3 MB through a 1 MiB ring
            a.commit(g, writeset(g, size=1000))
        gone = a.log.base_gid
        assert gone > 10
        address = await a.start()
        b = SiteB(after=10)
        with pytest.raises(LinkBroken, match=f"link broken: GIDs 11..{gone} are gone from the log"):
            await b.receiver([address], keys["b"]).run()
        assert b.gids == []
        await a.server.close()
        a.log.close()

    run(main)


def test_a_record_the_link_cannot_carry_stops_it_there_visibly(tmp_path: Path, keys: dict[str, LinkKeys]) -> None:
    async def main() -> None:
        a = SiteA(tmp_path, keys["a"])
        a.commit(1)
        a.commit(2, b"not a writeset")
        address = await a.start()
        b = SiteB()
        with pytest.raises(LinkError, match="the peer says: GID 2 cannot be sent: "):
            await b.receiver([address], keys["b"]).stream(address)
        assert b.gids == [1]
        await a.server.close()
        a.log.close()

    run(main)


class Flaky:
    """A row filter evaluator that fails on the row of GID 2 until it is fixed (as an operator
    fixes a rule), and notes the threads it runs in."""

    def __init__(self) -> None:
        self.fixed = False
        self.threads: set[str] = set()

    def predicate(self, table: wire.Table, values: tuple[wire.Value, ...], predicate: str) -> bool:
        self.threads.add(threading.current_thread().name)
        if values[0] == b"2" and not self.fixed:
            raise RuleError(f"row filter {predicate!r} on public.t failed: cannot execute INSERT in a read-only "
                            "transaction")
        return True

    def expression(self, table: wire.Table, values: tuple[wire.Value, ...], expression: str) -> wire.Value:
        raise AssertionError(expression)

    def row_function(self, table: wire.Table, values: tuple[wire.Value, ...],
                     function: str) -> Optional[tuple[wire.Value, ...]]:
        raise AssertionError(function)


def test_rules_that_fail_stop_the_link_visibly_and_it_resumes_once_fixed(tmp_path: Path,
                                                                        keys: dict[str, LinkKeys]) -> None:
    """A failure to evaluate neither drops nor sends the transaction: the sender stops the
    stream there and says why (ERROR to the receiver, its ``error`` for status); the receiver
    keeps its position; once the rule works, the stream resumes from that position."""
    async def main() -> None:
        a = SiteA(tmp_path, keys["a"])
        flaky = Flaky()
        a.server.rules = RuleSet(tables=(TableRule("public.t", "hostile()"),))
        a.server.evaluator = flaky
        for gid in (1, 2, 3):
            a.commit(gid)
        address = await a.start()
        b = SiteB()
        with pytest.raises(LinkError, match="GID 2 cannot be sent: .*read-only transaction"):
            await b.receiver([address], keys["b"]).stream(address)
        assert b.gids == [1] and b.after == 1  # nothing past it, nothing skipped
        assert a.server.error is not None and a.server.error[0] == 2 and "read-only" in a.server.error[1]
        assert threading.current_thread().name not in flaky.threads  # routed off the event loop
        flaky.fixed = True
        task = asyncio.ensure_future(b.receiver([address], keys["b"]).run())
        await until(lambda: b.gids == [1, 2, 3], "the rest after the fix")
        assert a.server.error is None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await a.server.close()
        a.log.close()

    run(main)


SEGMENT = 64 << 10  # SiteA's log segments: about 60 of its records each


async def stop(task: "asyncio.Future[None]") -> None:
    """Cancel a receiver's task until it ends: Python 3.11's wait_for can swallow a cancellation
    that meets a frame arriving at that moment, and the receiver would then go on streaming."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.1)


async def _cut_at_50(tmp_path: Path, keys: dict[str, LinkKeys], max_retain: int) -> tuple[SiteA, str, SiteB]:
    """Site a (a ring of 4 segments) and its sender; site b received its first 50 transactions,
    said so (the log is pinned at 50), and was cut off."""
    a = SiteA(tmp_path, keys["a"], total_bytes=4 * SEGMENT)
    a.server.max_retain = max_retain
    for g in range(1, 51):
        a.commit(g)
    address = await a.start()
    b = SiteB()
    task = asyncio.ensure_future(b.receiver([address], keys["b"], applied=True).run())
    await until(lambda: a.log.pins() == {"link:a-b": 50}, "the pin at what b applied")
    await stop(task)
    return a, address, b


def test_the_log_keeps_what_a_cut_off_receiver_has_not_applied(tmp_path: Path, keys: dict[str, LinkKeys]) -> None:
    """docs/LINKS.md section 2: the receiver says what its site applied; the sender pins the log
    there; while the receiver is away the ring (4 segments) grows rather than reuse what it has
    not applied (within max_retain), and it resumes losing nothing; once it applied it all, the
    ring gives the segments back."""
    async def main() -> None:
        a, address, b = await _cut_at_50(tmp_path, keys, 16 * SEGMENT)
        for g in range(51, 601):  # about 9 segments: more than the ring holds
            a.commit(g)
        assert a.log.base_gid <= 50 and a.log.stats()["segments"] > 4
        assert a.server.sending()[1] is None
        task = asyncio.ensure_future(b.receiver([address], keys["b"], applied=True).run())
        await until(lambda: a.log.pins() == {"link:a-b": 600}, "the pin at what b applied")
        assert b.gids == list(range(1, 601))
        for g in range(601, 700):  # the next segments reuse the ones b applied
            a.commit(g)
        await until(lambda: b.gids[-1:] == [699], "the rest")
        assert a.log.stats()["segments"] <= 5 and a.log.base_gid > 50
        await stop(task)
        await a.server.close()
        a.log.close()

    run(main)


def test_a_link_past_max_retain_is_broken_and_resumes_from_no_position(tmp_path: Path,
                                                                      keys: dict[str, LinkKeys]) -> None:
    """Past max_retain the pin is broken: the sender says so with the GIDs lost (status), and
    refuses every resume, from the lost range or from a later position, until instantiated again."""
    async def main() -> None:
        a, address, b = await _cut_at_50(tmp_path, keys, 6 * SEGMENT)
        for g in range(51, 801):
            a.commit(g)
        lost = a.log.broken("link:a-b")
        assert lost is not None and lost[0] == 51 and a.log.base_gid >= lost[1] > 51
        assert a.server.sending()[1] == f"link broken: GIDs 51..{lost[1]} are gone from the log"
        with pytest.raises(LinkBroken, match=f"GIDs 51..{lost[1]} are gone"):
            await asyncio.wait_for(b.receiver([address], keys["b"], applied=True).run(), WAIT_S)
        later = SiteB(after=790)  # a position past the loss: still refused, nothing skipped silently
        with pytest.raises(LinkBroken, match=f"GIDs 51..{lost[1]} are gone"):
            await asyncio.wait_for(later.receiver([address], keys["b"], applied=True).run(), WAIT_S)
        assert b.gids == list(range(1, 51)) and later.gids == []
        await a.server.close()
        a.log.close()

    run(main)


def test_a_broken_link_shows_broken_on_the_receiving_site_and_is_tried_again_only_now_and_then(
        tmp_path: Path, keys: dict[str, LinkKeys], monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiving site's node that runs the receiver of a broken link says so, and does not
    start the receiver again at every membership tick (it did: its row flipped between broken and
    reconnecting, and every tick cost the sender a refused connection); after BROKEN_RETRY_S it
    tries again, still showing broken until the link streams."""
    from chorus.config import LinkConfig
    from chorus.link import site as link_site

    async def main() -> None:
        a, address, _b = await _cut_at_50(tmp_path / "a", keys, 6 * SEGMENT)
        for g in range(51, 801):
            a.commit(g)
        assert a.log.broken("link:a-b") is not None
        k = keys["b"]
        link = LinkConfig("a-b", "site-b", "site-a", k.cert, k.key, k.peer_cert, k.secret_file, peers=(address,))
        b_log = WritesetLog(str(tmp_path / "b-wslog"), segment_bytes=64 << 10, total_bytes=4 * SEGMENT)
        b_log.open()

        async def query(sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
            return []  # no position row yet: from the start
        links = link_site.SiteLinks("nb", (link,), b_log, lambda: 0, lambda m: None, query)
        starts = 0
        start = links._start_receiver

        def counted(link: LinkConfig) -> None:
            nonlocal starts
            starts += 1
            start(link)
        monkeypatch.setattr(links, "_start_receiver", counted)
        links.membership(["nb"], True)
        await until(lambda: "a-b" in links.broken and links.receivers["a-b"].done(), "the receiver finds it broken")
        assert "GIDs 51.." in links.broken["a-b"]
        for _ in range(5):  # membership ticks
            links.membership(["nb"], True)
            await asyncio.sleep(0.02)
        assert starts == 1 and [r["state"] for r in links.status()] == ["broken"]
        monkeypatch.setattr(link_site, "BROKEN_RETRY_S", 0.0)
        links.membership(["nb"], True)
        assert starts == 2 and "a-b" in links.broken  # tried again, and broken until it streams
        await until(lambda: links.receivers["a-b"].done(), "refused again")
        assert [r["state"] for r in links.status()] == ["broken"]
        await links.close()
        await a.server.close()
        a.log.close()
        b_log.close()

    run(main)


def test_every_node_of_the_site_keeps_what_the_peer_has_not_applied(tmp_path: Path, keys: dict[str, LinkKeys]) -> None:
    """The node serving the stream announces where the peer is (bp.LinkApplied on its site's
    bus); every other node that may serve the link pins its own log there, only ever forward,
    and leaves the pin to its own streams while it serves one."""
    from chorus.bus import proto as bp
    from chorus.config import LinkConfig
    from chorus.link.site import SiteLinks

    async def main() -> None:
        serving = SiteA(tmp_path / "n1", keys["a"], total_bytes=4 * SEGMENT)
        announced: list[bp.Message] = []
        serving.server.announce = lambda gid: announced.append(bp.LinkApplied("n1", "a-b", gid))
        other = SiteA(tmp_path / "n2", keys["a"], total_bytes=4 * SEGMENT)  # another node of site a
        other.server.max_retain = 16 * SEGMENT
        link = LinkConfig("a-b", "site-a", "site-b", "c", "k", "p", "s", listen="127.0.0.1:0")

        async def query(sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
            return []
        links = SiteLinks("n2", (link,), other.log, lambda: other.committed, announced.append, query)
        links.servers["a-b"] = other.server
        for g in range(1, 51):
            serving.commit(g)
            other.commit(g)
        address = await serving.start()
        b = SiteB()
        task = asyncio.ensure_future(b.receiver([address], keys["b"], applied=True).run())
        await until(lambda: bp.LinkApplied("n1", "a-b", 50) in announced, "the serving node's announcement")
        await stop(task)
        for m in announced:  # as the bus delivers them, in order, to node n2
            assert isinstance(m, bp.LinkApplied) and bp.decode(bp.encode(m)) == m
            links.pinned(m.node, m.link, m.gid)
        assert other.log.pins() == {"link:a-b": 50}
        links.pinned("n1", "a-b", 20)  # never back
        links.pinned("n2", "a-b", 60)  # its own announcement: its own streams decided already
        assert other.log.pins() == {"link:a-b": 50}
        for g in range(51, 601):  # more than the ring holds, on the node that did not serve
            other.commit(g)
        assert other.log.base_gid <= 50
        assert [r.gid for r in other.log.reader(50).read(600, 1 << 30)] == list(range(51, 601))
        await serving.server.close()
        serving.log.close()
        other.log.close()

    run(main)


def test_a_broken_pin_is_dropped_once_the_peer_is_announced_where_the_log_serves_it(
        tmp_path: Path, keys: dict[str, LinkKeys]) -> None:
    """Re-instantiation (docs/LINKS.md section 10.1): the node that served the copy pins its log
    at the copy's GID and announces it; another node of the site whose pin of the link is broken
    drops it and pins there, if its own log holds what follows (else it stays broken)."""
    from chorus.config import LinkConfig
    from chorus.link.site import SiteLinks
    from chorus.wslog import LogRangeUnavailable

    async def main() -> None:
        other = SiteA(tmp_path / "n2", keys["a"], total_bytes=4 * SEGMENT)
        link = LinkConfig("a-b", "site-a", "site-b", "c", "k", "p", "s", listen="127.0.0.1:0")

        async def query(sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
            return []
        links = SiteLinks("n2", (link,), other.log, lambda: other.committed, lambda m: None, query)
        links.servers["a-b"] = other.server
        for g in range(1, 601):
            other.commit(g)
        base = other.log.base_gid
        assert base > 1
        with pytest.raises(LogRangeUnavailable):
            other.log.pin("link:a-b", 1, 1 << 30)
        lost = other.log.broken("link:a-b")
        assert lost is not None
        links.pinned("n1", "a-b", base - 1)  # its log cannot serve from there: still broken
        assert other.log.broken("link:a-b") == lost
        links.pinned("n1", "a-b", 590)
        assert other.log.broken("link:a-b") is None and other.log.pins() == {"link:a-b": 590}
        other.log.close()

    run(main)


def test_a_receiver_speaks_version_1_to_a_sender_of_the_release_before(tmp_path: Path, keys: dict[str, LinkKeys],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sender that speaks only version 1 refuses the HELLO of version 2 saying so: the receiver
    connects again speaking 1 (no APPLIED frames; the sender's log is not pinned) and loses nothing."""
    async def main() -> None:
        monkeypatch.setattr(proto, "PROTOCOLS", (1,))
        a = SiteA(tmp_path, keys["a"])
        for g in range(1, 11):
            a.commit(g)
        address = await a.start()
        b = SiteB()
        receiver = b.receiver([address], keys["b"], applied=True)
        task = asyncio.ensure_future(receiver.run())
        await until(lambda: b.gids == list(range(1, 11)), "the transactions over version 1")
        assert receiver.version == 1 and a.log.pins() == {}
        await stop(task)
        await a.server.close()
        a.log.close()

    run(main)
