"""A deterministic in-process bus for unit tests of pure logic (never for real clusters).

One :class:`SimulatedNetwork` holds a single global order; every connected member's
:class:`SimulatedBus` receives every message and view in that order. Partitions split the
members into components, each with its own order and views.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import AsyncIterator, Optional

from chorus.bus import Bus, BusError, Delivery, Event, View
from chorus.bus.fragment import Reassembler, SpoolError, fragments


class SimulatedNetwork:
    def __init__(self, expected: Optional[int] = None, frame_limit: int = 64) -> None:
        self.members: dict[str, "SimulatedBus"] = {}
        self.component: dict[str, int] = {}
        self.expected = expected
        self.frame_limit = frame_limit
        self._view_ids = itertools.count(1)

    def _quorate(self, size: int) -> bool:
        return self.expected is None or size * 2 > self.expected

    def _emit_view(self, comp: int, joined: tuple[str, ...], left: tuple[str, ...]) -> None:
        members = tuple(sorted(m for m, c in self.component.items() if c == comp))
        vid = next(self._view_ids)
        for m in members:
            self.members[m]._put(View(vid, members, joined, left, m, self._quorate(len(members)),
                                      self.expected // 2 + 1 if self.expected else 1))

    def connect(self, bus: "SimulatedBus") -> None:
        self.members[bus.local_id] = bus
        self.component[bus.local_id] = 0
        self._emit_view(0, (bus.local_id,), ())

    def disconnect(self, name: str) -> None:
        comp = self.component.pop(name, None)
        self.members.pop(name, None)
        if comp is not None:
            for m, c in self.component.items():
                if c == comp:
                    self.members[m].reassembler.drop(name)
            self._emit_view(comp, (), (name,))

    def crash(self, name: str) -> None:
        bus = self.members.get(name)
        self.disconnect(name)
        if bus is not None:
            bus._put(BusError("simulated crash"))

    def multicast(self, sender: str, frame: bytes) -> None:
        comp = self.component[sender]
        for m, c in sorted(self.component.items()):
            if c == comp:
                self.members[m]._deliver(sender, frame)

    def partition(self, *groups: list[str]) -> None:
        old = dict(self.component)
        for i, g in enumerate(groups):
            for m in g:
                self.component[m] = i
        for i, g in enumerate(groups):
            left = tuple(sorted(m for m in old if self.component.get(m) != i and old[m] == old[g[0]]))
            self._emit_view(i, (), left)

    def heal(self) -> None:
        for m in self.component:
            self.component[m] = 0
        self._emit_view(0, tuple(sorted(self.component)), ())


class SimulatedBus(Bus):
    def __init__(self, network: SimulatedNetwork, name: str) -> None:
        self.network = network
        self.name = name
        self.queue: asyncio.Queue[Event | BusError] = asyncio.Queue()
        self.reassembler = Reassembler()
        self._seq = 0
        self._joined = False

    @property
    def local_id(self) -> str:
        return self.name

    async def join(self) -> None:
        self.network.connect(self)
        self._joined = True

    async def send(self, payload: bytes) -> None:
        if not self._joined:
            raise BusError("not joined")
        self._seq += 1
        for frame in fragments(payload, self._seq, self.network.frame_limit):
            self.network.multicast(self.name, frame)

    def _put(self, ev: Event | BusError) -> None:
        self.queue.put_nowait(ev)

    def _deliver(self, sender: str, frame: bytes) -> None:
        try:
            whole = self.reassembler.feed(sender, frame)
        except SpoolError as e:
            self._put(BusError(f"cannot keep a large bus message in the spool directory: {e}"))
            return
        if whole is not None:
            self._put(Delivery(sender, whole))

    async def events(self) -> AsyncIterator[Event]:
        while True:
            ev = await self.queue.get()
            if isinstance(ev, BusError):
                raise ev
            yield ev

    async def leave(self) -> None:
        if self._joined:
            self._joined = False
            self.network.disconnect(self.name)
