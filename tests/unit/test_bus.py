"""Fragmentation and the simulated bus (the guarantees of chorus.bus.Bus)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.bus import Delivery, View
from chorus.bus.fragment import FragmentError, Reassembler, fragments
from chorus.bus.simulated import SimulatedBus, SimulatedNetwork


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.binary(max_size=200)), max_size=20), st.randoms())
def test_fragment_round_trip_with_interleaved_senders(msgs: list[tuple[str, bytes]], rnd) -> None:  # type: ignore[no-untyped-def]
    queues = {s: [f for i, (snd, m) in enumerate(msgs) if snd == s for f in fragments(m, i, 24)] for s in "abc"}
    expected = {s: [m for snd, m in msgs if snd == s] for s in "abc"}
    r = Reassembler()
    got: dict[str, list[bytes]] = {s: [] for s in "abc"}
    while any(queues.values()):
        s = rnd.choice([k for k, v in queues.items() if v])
        whole = r.feed(s, queues[s].pop(0))
        if whole is not None:
            got[s].append(whole)
    assert got == expected


def test_fragment_rejects_out_of_order_and_bad_version() -> None:
    frames = list(fragments(b"x" * 100, 1, 30))
    r = Reassembler()
    r.feed("a", frames[0])
    with pytest.raises(FragmentError, match="out-of-order"):
        r.feed("a", frames[2])
    with pytest.raises(FragmentError, match="version"):
        r.feed("a", b"\x09" + frames[0][1:])
    with pytest.raises(FragmentError, match="shorter"):
        r.feed("a", b"\x01")


def test_partial_message_of_a_leaving_member_is_dropped() -> None:
    frames = list(fragments(b"y" * 100, 1, 30))
    r = Reassembler()
    r.feed("a", frames[0])
    r.drop("a")
    assert r.pending() == 0
    assert r.feed("a", list(fragments(b"z", 2, 30))[0]) == b"z"


async def _collect(bus: SimulatedBus, n: int) -> list[object]:
    out: list[object] = []
    async for ev in bus.events():
        out.append(ev)
        if len(out) >= n:
            break
    return out


def test_simulated_bus_same_order_views_and_fragmentation() -> None:
    async def main() -> None:
        net = SimulatedNetwork(frame_limit=32)
        buses = [SimulatedBus(net, f"m{i}") for i in range(3)]
        for b in buses:
            await b.join()
        for i in range(30):
            await buses[i % 3].send(bytes([i]) * (i * 7))
        # m0 sees 3 views, m1 2, m2 1, then 30 deliveries each
        logs = [await _collect(b, 33 - i) for i, b in enumerate(buses)]
        deliveries = [[(e.sender, e.payload) for e in log if isinstance(e, Delivery)] for log in logs]
        assert deliveries[0] == deliveries[1] == deliveries[2]
        assert len(deliveries[0]) == 30
        last_view = [e for e in logs[0] if isinstance(e, View)][-1]
        assert last_view.members == ("m0", "m1", "m2")
        net.partition(["m0", "m1"], ["m2"])
        v = await _collect(buses[2], 1)
        assert isinstance(v[0], View) and v[0].members == ("m2",)
        await buses[1].leave()
        v0 = await _collect(buses[0], 2)
        assert isinstance(v0[-1], View) and v0[-1].left == ("m1",)

    asyncio.run(main())


def test_simulated_quorum() -> None:
    async def main() -> None:
        net = SimulatedNetwork(expected=3)
        buses = [SimulatedBus(net, f"m{i}") for i in range(3)]
        for b in buses:
            await b.join()
        net.partition(["m0", "m1"], ["m2"])
        views = {b.name: [e for e in await _collect(b, {"m0": 4, "m1": 3, "m2": 2}[b.name]) if isinstance(e, View)][-1]
                 for b in buses}
        assert views["m0"].quorate and views["m1"].quorate and not views["m2"].quorate

    asyncio.run(main())
