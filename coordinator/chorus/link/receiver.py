"""A link's receiver (docs/LINKS.md sections 2 and 3): connects to the peer site's sender,
proves it holds the link's keys, asks for the peer's transactions after the last one applied
here, and hands the stream's items in order to a sink: each :class:`RemoteTransaction` (a
writeset sent in parts is gathered in bounded memory first) and each :class:`ClockEvent`.

The receiver keeps no position of its own: each connection starts from the sink's durable
position (what the apply committed), so after an outage nothing is lost and nothing is handed
twice. What the sink does with the items (the apply through this site's total order) is not
the receiver's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import secrets
import ssl
import time
from typing import AsyncIterator, Awaitable, Callable, NoReturn, Optional, Sequence

from chorus import wire
from chorus.link import proto
from chorus.link.events import ClockEvent, StreamItem
from chorus.link.proto import LinkBroken, LinkEnd, LinkError, LinkProtocolError, Position, Record
from chorus.recovery import split_address
from chorus.spool import Spool

log = logging.getLogger("chorus.link.receiver")

# A sender sends this site's clock at least every clock interval (1 s) even when idle: one that
# sends nothing for this long is frozen or cut off with the connection left open.
FRAME_TIMEOUT_S = 30.0
APPLIED_EVERY_S = 1.0  # how often at most the receiver tells the sender what this site applied
BACKOFF_S = (0.1, 10.0)  # the wait after a round of the peer's addresses that got nothing: doubling, bounded


class LinkReceiver:
    """Receives one link's stream from the peer site, whose senders are at ``addresses``.

    ``position`` returns what this site durably applied of the stream (the last peer GID, the
    peer clock last seen); ``sink`` takes each item of the stream, in order, and returns once it
    has taken it (the next frame is read then); ``applied``, cheaper, the last peer GID this site
    applied in order as far as this node knows (None when it does not know), which goes to the
    sender in APPLIED frames at most every ``applied_every`` seconds (the peer's log is pinned there).
    """

    def __init__(self, end: LinkEnd, addresses: Sequence[str], position: Callable[[], Awaitable[Position]],
                 sink: Callable[[StreamItem], Awaitable[None]], spool: Optional[Spool] = None,
                 frame_timeout: float = FRAME_TIMEOUT_S, backoff: tuple[float, float] = BACKOFF_S,
                 applied: Optional[Callable[[], Optional[int]]] = None, applied_every: float = APPLIED_EVERY_S) -> None:
        if not addresses:
            raise ValueError(f"link {end.link}: no address of site {end.peer}")
        self.end = end
        self.addresses = list(addresses)
        self.position = position
        self.sink = sink
        self.spool = spool
        self.frame_timeout = frame_timeout
        self.backoff = backoff
        self.applied = applied
        self.applied_every = applied_every
        self.version = proto.PROTOCOL  # lowered when a sender of a release before says it speaks less
        self.received = 0  # items handed to the sink
        self.connected: Optional[str] = None  # the address streaming now

    async def run(self) -> None:
        """Stream until cancelled: connect to the peer's addresses in turn, each time from the
        sink's position; after a round in which none streamed anything, wait (doubling the wait
        up to its bound). Raises :class:`LinkBroken` when every address says the link is broken."""
        wait = self.backoff[0]
        while True:
            before = self.received
            broken: list[LinkBroken] = []
            for address in self.addresses:
                try:
                    await self.stream(address)
                except LinkBroken as e:
                    log.error("link %s from %s: %s", self.end.link, address, e)
                    broken.append(e)
                except LinkError as e:
                    log.warning("link %s from %s: %s", self.end.link, address, e)
            if len(broken) == len(self.addresses):
                raise broken[-1]
            if self.received > before:
                wait = self.backoff[0]
            await asyncio.sleep(wait)
            wait = min(wait * 2, self.backoff[1])

    async def stream(self, address: str) -> None:
        """One connection to the sender at ``address``, until it ends (END: the sender stopped
        serving). Raises :class:`LinkError` when it fails."""
        end = self.end
        async with self._connection(address, "stream") as (reader, writer, parts):
            self.connected = address
            try:
                last = await self._handshake(reader, writer)
                told, told_at = last, time.monotonic()
                while True:
                    due = time.monotonic() - told_at >= self.applied_every
                    if self.applied is not None and self.version >= 2 and due:
                        applied = self.applied()
                        if applied is not None and told < applied <= last:
                            writer.write(proto.write_applied(proto.Applied(applied)))
                            told, told_at = applied, time.monotonic()
                    record = await self._whole(reader, parts, f"{address} sent nothing after GID {last}")
                    if record is None:
                        continue
                    if isinstance(record, Record):
                        # a third site's transaction the peer forwards (version 4), never this site's own
                        forwarded = record.site != end.peer and self.version >= proto.FORWARDED
                        if (record.site != end.peer and not forwarded) or record.site == end.site or record.gid <= last:
                            raise LinkProtocolError(f"a transaction of site {record.site} at GID {record.gid} "
                                                    f"after GID {last} of site {end.peer}")
                        last = record.gid
                        txn = proto.transaction(record)
                        await self._hand(dataclasses.replace(txn, site=end.peer, origin=record.site)
                                         if forwarded else txn)
                    elif isinstance(record, ClockEvent):
                        if record.site not in (end.site, end.peer):
                            raise LinkProtocolError(f"a clock event of site {record.site} on link {end.link}")
                        await self._hand(record)
                    elif isinstance(record, proto.End):
                        log.info("link %s: %s stopped serving at GID %d", end.link, address, record.gid)
                        return
                    else:
                        _unexpected(record, "mid-stream")
            finally:
                self.connected = None

    @contextlib.asynccontextmanager
    async def _connection(self, address: str, what: str) -> AsyncIterator[
            tuple[asyncio.StreamReader, asyncio.StreamWriter, proto.Reassembler]]:
        """A TLS connection to the sender at ``address`` and the reassembly of what it sends in
        parts, both closed after; :class:`LinkError` when it cannot be made or breaks (the
        ``what``, a stream or a copy, from ``address`` broke)."""
        host, port = split_address(address)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=self.end.keys.context(False), limit=1 << 20),
                proto.HANDSHAKE_TIMEOUT_S)
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as e:
            raise LinkError(f"cannot connect to {address}: {e}") from e
        parts = proto.Reassembler(self.spool)
        try:
            yield reader, writer, parts
        except (ConnectionError, ssl.SSLError, asyncio.TimeoutError) as e:
            raise LinkError(f"the {what} from {address} broke: {e!r}") from e
        finally:
            parts.discard()
            writer.close()

    async def _whole(self, reader: asyncio.StreamReader, parts: proto.Reassembler, silent: str) -> Optional[proto.Frame]:
        """The next frame, a transaction sent in parts joined (None until its last part is in);
        :class:`LinkError` (saying ``silent``) when nothing comes for ``frame_timeout``."""
        try:
            frame = await asyncio.wait_for(proto.read_frame(reader), self.frame_timeout)
        except asyncio.TimeoutError:
            raise LinkError(f"{silent} for {self.frame_timeout:.0f} s") from None
        if parts.open and not isinstance(frame, (proto.Part, proto.Error)):
            raise LinkProtocolError(f"a {type(frame).__name__} frame inside a transaction sent in parts")
        return parts.add(frame) if isinstance(frame, proto.Part) else frame

    async def copy(self, address: str, snapshot: Callable[[proto.Snapshot], Awaitable[None]],
                   sink: Callable[[wire.Writeset], Awaitable[None]]) -> proto.Copied:
        """Re-instantiation (docs/LINKS.md section 10): ask the sender at ``address`` for a copy of
        the rows the link carries; ``snapshot`` hears the GID it is as of (the sender's log is
        pinned there), ``sink`` takes each writeset of the copy in order (link/copy.py). Returns
        the sender's COPIED frame once every row came; raises :class:`LinkError` otherwise."""
        async with self._connection(address, "copy") as (reader, writer, parts):
            await self._handshake(reader, writer, proto.COPY)
            first = await asyncio.wait_for(proto.read_frame(reader), self.frame_timeout)
            if isinstance(first, proto.Error):
                raise proto.error(first)
            if not isinstance(first, proto.Snapshot):
                raise LinkProtocolError(f"expected SNAPSHOT, got {type(first).__name__}")
            await snapshot(first)
            while True:
                record = await self._whole(reader, parts, f"{address} sent nothing of the copy")
                if record is None:
                    continue
                if isinstance(record, Record):
                    if record.site != self.end.peer or record.gid != first.gid:
                        raise LinkProtocolError(f"a copy record of site {record.site} at GID {record.gid} in a copy "
                                                f"of site {self.end.peer} at GID {first.gid}")
                    await sink(proto.transaction(record).writeset)
                elif isinstance(record, proto.Copied):
                    if record.gid != first.gid:
                        raise LinkProtocolError(f"COPIED at GID {record.gid} for a copy at GID {first.gid}")
                    return record
                else:
                    _unexpected(record, "in a copy")

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         mode: int = proto.STREAM) -> int:
        """Prove both ends hold the link's keys and ask for the transactions after the sink's
        position (or, ``mode`` COPY, for a copy); that position."""
        end = self.end
        secret = end.keys.secret()
        position = await self.position()
        nonce = secrets.token_bytes(proto.NONCE_BYTES)
        if mode != proto.STREAM and self.version < 3:
            self.version = proto.PROTOCOL  # (a copy needs version 3: a sender that speaks less says so)
        writer.write(proto.write_hello(proto.Hello(end.link, end.site, end.peer, position, nonce, self.version,
                                                   mode)))
        answer = await asyncio.wait_for(proto.read_frame(reader), proto.HANDSHAKE_TIMEOUT_S)
        if isinstance(answer, proto.Error):
            versions = [v for v in proto.spoken(answer) or () if v in proto.PROTOCOLS and v < self.version]
            if versions:  # a sender of a release before: speak its version (no APPLIED frames) from the next connection
                log.warning("link %s: the sender speaks link protocol version %d: its site's log is not pinned",
                            end.link, max(versions))
                self.version = max(versions)
            raise proto.error(answer)
        if not isinstance(answer, proto.Proof) or not hmac.compare_digest(
                answer.mac, proto.proof(secret, b"sender", end.link, end.peer, end.site, nonce, answer.nonce)):
            raise LinkError("the sender failed authentication")
        writer.write(proto.write_proof(proto.Proof(
            nonce, proto.proof(secret, b"receiver", end.link, end.peer, end.site, answer.nonce, nonce))))
        return position.applied_gid

    async def _hand(self, item: StreamItem) -> None:
        await self.sink(item)
        self.received += 1


def _unexpected(frame: proto.Frame, where: str) -> NoReturn:
    """A frame that has no place ``where`` it came: the sender's ERROR as its error, else a
    protocol error."""
    if isinstance(frame, proto.Error):
        raise proto.error(frame)
    raise LinkProtocolError(f"a {type(frame).__name__} frame {where}")
