"""Sending on the group bus: one node's outgoing messages, in the order they are posted.

Local writesets queue in an outbox and leave in batches: at most ``MAX_IN_FLIGHT`` of this node's
writeset messages are on the bus, not yet delivered back to it, at a time; writesets that queue up
meanwhile go together in the next message (group commit through the bus). Other messages
(votes, flow control, markers, log queries) leave at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from typing import Any, Callable, Coroutine, Optional, Union

from chorus.bus import proto as bp
from chorus.bus import Bus, BusError
from chorus.spool import SpooledBuffer

log = logging.getLogger("chorus.coordinator")

BATCH_BYTES = 256 * 1024
MAX_IN_FLIGHT = 1  # own writeset messages sent and not yet delivered

Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


class OwnMessages:
    """This node's messages on the bus, in the order posted, until each comes back (no I/O).

    The bus delivers one sender's messages in the order sent, and one it loses is lost for good:
    at a view change a message ordered in the old view that this node's side of a partition
    did not receive is never delivered here, while the other side may have delivered it. So
    when one of its messages comes back, those posted before it that have not are lost here;
    a local writeset among them has an unknown outcome (the primary component may have
    committed it), and its backend must be told so rather than wait for ever. Found by the
    simulation (tests/sim): a client's COMMIT waited for good after a partition."""

    HEAD = 96  # bytes of a message that tell it from another (its type, sender, ticket or request id)

    def __init__(self) -> None:
        self._sent: deque[tuple[tuple[int, bytes], list[int]]] = deque()  # (key, its local writesets' tickets)

    @classmethod
    def key(cls, payload: Union[bytes, SpooledBuffer]) -> tuple[int, bytes]:
        return len(payload), bytes(payload[:cls.HEAD])

    def posted(self, payload: Union[bytes, SpooledBuffer], tickets: list[int]) -> None:
        self._sent.append((self.key(payload), tickets))

    def failed(self, payload: Union[bytes, SpooledBuffer]) -> None:
        """Its send failed: its backends were told; it is not waited for."""
        k = self.key(payload)
        for i, (key, _) in enumerate(self._sent):
            if key == k:
                del self._sent[i]
                return

    def delivered(self, payload: Union[bytes, SpooledBuffer]) -> list[int]:
        """One came back: the tickets of the local writesets posted before it that are lost."""
        k = self.key(payload)
        for i, (key, _) in enumerate(self._sent):
            if key == k:
                lost = [t for _ in range(i) for t in self._sent.popleft()[1]]
                self._sent.popleft()
                return lost
        return []

    def __len__(self) -> int:
        return len(self._sent)


class BusSender:
    """Posts this node's messages on ``bus``. ``on_batch_failed(tickets, error)`` hears of local
    writesets whose message could not be sent."""

    def __init__(self, node: str, spawn: Spawn, on_batch_failed: Callable[[list[int], BusError], None]) -> None:
        self.node = node
        self.bus: Optional[Bus] = None  # attached once joined
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._spawn = spawn
        self._on_batch_failed = on_batch_failed
        self.outbox: list[tuple[int, bytes]] = []  # (ticket, writeset) waiting for the bus
        self.batches = 0  # bus messages carrying local writesets
        self.writesets = 0  # local writesets sent
        self.messages = 0  # every bus message posted (writesets and control)
        self.bytes = 0  # ... and their bytes
        self._in_flight = 0
        self._waiting = 0  # messages handed to a task because the bus could not take them at once
        self._pump_scheduled = False
        self.own = OwnMessages()
        # the origin commit time a writeset message carries (bus version 5): this node's wall
        # clock when it sends it, µs since the Unix epoch (the simulation sets its own)
        self.wall_us: Callable[[], int] = lambda: time.time_ns() // 1000
        # the bus protocol version to write (the replicator's send_version: bus/versions.py)
        self.version: Callable[[], int] = lambda: bp.VERSION

    def attach(self, bus: Bus, loop: asyncio.AbstractEventLoop) -> None:
        """Send on ``bus`` from ``loop`` (kept: asyncio.get_running_loop costs a getpid() system
        call per call in Python 3.11, and this runs for every local writeset)."""
        self.bus, self._loop = bus, loop

    def send(self, msg: bp.Message, version: int = 0) -> None:
        """Multicast a message at bus protocol ``version`` (0: the node's; logged if it cannot be
        sent)."""
        self._post(bp.encode(msg, version or self.version()), lambda e: log.error("cannot send %s: %s", type(msg).__name__, e), [])

    def queue_writeset(self, ticket: int, payload: bytes) -> None:
        """A local writeset for certification: it leaves with the next batch."""
        self.outbox.append((ticket, payload))
        if not self._pump_scheduled:
            # after the other sockets that are readable now: their writesets go in the same message
            self._pump_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self.pump)

    def delivered_own(self, payload: Union[bytes, SpooledBuffer]) -> list[int]:
        """One of this node's messages came back from the bus. Returns the tickets of the local
        writesets sent before it that never will (OwnMessages)."""
        if bp.carries_writesets(payload):
            self._in_flight = max(0, self._in_flight - 1)
        lost = self.own.delivered(payload)
        if lost:
            self._in_flight = 0  # their messages are not on the bus any more
        return lost

    def view_changed(self) -> None:
        """What was not delivered before a view change never will be."""
        self._in_flight = 0

    def pump(self) -> None:
        """Send queued local writesets, as many per message as BATCH_BYTES allows, while fewer than
        MAX_IN_FLIGHT writeset messages are on the bus. An idle node sends at once; a busy one sends
        fewer, larger messages."""
        self._pump_scheduled = False
        while self.outbox and self._in_flight < MAX_IN_FLIGHT:
            n, size = 0, 0
            for _, payload in self.outbox:
                if n and size + len(payload) > BATCH_BYTES:
                    break
                n += 1
                size += len(payload)
            batch, self.outbox = self.outbox[:n], self.outbox[n:]
            now = self.wall_us()
            msg: bp.Message = (bp.WritesetMsg(self.node, *batch[0], commit_time=now) if n == 1
                               else bp.WritesetBatch(self.node, tuple(batch), now))
            self.batches += 1
            self.writesets += n
            self._in_flight += 1
            tickets = [t for t, _ in batch]
            self._post(bp.encode(msg, self.version()), functools.partial(self._batch_failed, tickets), tickets)

    def _batch_failed(self, tickets: list[int], e: BusError) -> None:
        self._in_flight -= 1
        self._on_batch_failed(tickets, e)
        if self.outbox:
            self.pump()

    def _post(self, payload: bytes, on_error: Callable[[BusError], None], tickets: list[int]) -> None:
        """Multicast ``payload`` (carrying the local writesets of ``tickets``): at once if the bus
        takes it, else from a task that retries (``on_error`` if it cannot). Messages leave in
        the order they are posted."""
        assert self.bus is not None
        self.messages += 1
        self.bytes += len(payload)
        self.own.posted(payload, tickets)
        if self._waiting == 0 and self.bus.send_nowait(payload):
            return
        self._waiting += 1
        self._spawn(self._send_later(payload, on_error))

    async def _send_later(self, payload: bytes, on_error: Callable[[BusError], None]) -> None:
        assert self.bus is not None
        try:
            await self.bus.send(payload)
        except BusError as e:
            self.own.failed(payload)
            on_error(e)
        finally:
            self._waiting -= 1

