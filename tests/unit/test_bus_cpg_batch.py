"""bus_cpg.c's batch (native/ch_cpg.h): what its C callbacks record during one cpg_dispatch, read
back by bus/corosync.py in Corosync's delivery order, views between messages included. The
records are made by the C recording functions the callbacks call, on a member that never
reaches Corosync (tests/integration/test_corosync_bus.py runs both members against the daemon)."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from chorus.bus import Delivery, View
from chorus.bus.corosync import BatchError, CorosyncBus, _NativeMember, batch_records
from chorus.bus.fragment import fragments, whole_frame
from chorus.dataplane import native

pytestmark = pytest.mark.usefixtures("native_core")


def _lib() -> Any:
    return native.module().lib, native.module().ffi


def _pairs(ffi: Any, members: list[tuple[int, int]]) -> Any:
    return ffi.new("uint32_t[]", [x for m in members for x in m] or [0])


def _record_change(c: Any, members: list[tuple[int, int]], left: list[tuple[int, int]],
                   joined: list[tuple[int, int]]) -> None:
    lib, ffi = _lib()
    assert lib.ch_cpg_rec_confchg(c, _pairs(ffi, members), len(members), _pairs(ffi, left), len(left),
                                  _pairs(ffi, joined), len(joined)) == 0


def _record_frame(c: Any, nodeid: int, pid: int, frame: bytes) -> None:
    lib, _ = _lib()
    assert lib.ch_cpg_rec_deliver(c, nodeid, pid, frame, len(frame)) == 0


def _batch(c: Any) -> bytes:
    lib, ffi = _lib()
    n = ffi.new("size_t *")
    p = lib.ch_cpg_batch(c, n)
    return bytes(ffi.buffer(p, n[0]))


@pytest.fixture
def member() -> Any:
    lib, ffi = _lib()
    c = lib.ch_cpg_new(b"g", 1)
    assert c != ffi.NULL
    yield c
    lib.ch_cpg_free(c)


def test_records_keep_their_order(member: Any) -> None:
    _record_frame(member, 1, 100, b"first")
    _record_change(member, [(1, 100), (2, 200)], [(3, 300)], [(2, 200)])
    _record_frame(member, 2, 200, b"")
    _record_frame(member, 1, 100, b"x" * 70_000)  # past the buffer's first size
    _record_change(member, [], [(1, 100), (2, 200)], [])
    got = list(batch_records(_batch(member)))
    assert got == [("1:100", b"first"),
                   ("", (("1:100", "2:200"), ("3:300",), ("2:200",))),
                   ("2:200", b""),
                   ("1:100", b"x" * 70_000),
                   ("", ((), ("1:100", "2:200"), ()))]


def test_clear_empties_the_batch(member: Any) -> None:
    lib, _ = _lib()
    _record_frame(member, 1, 1, b"y" * (5 << 20))  # larger than the buffer kept between batches
    lib.ch_cpg_batch_clear(member)
    assert _batch(member) == b""
    _record_frame(member, 1, 1, b"z")
    assert list(batch_records(_batch(member))) == [("1:1", b"z")]


def test_name_length_is_checked() -> None:
    lib, ffi = _lib()
    assert lib.ch_cpg_new(b"", 0) == ffi.NULL
    assert lib.ch_cpg_new(b"g" * 128, 128) == ffi.NULL


@pytest.mark.parametrize("cut", [1, 12, 13 + 2])
def test_a_cut_batch_is_refused(member: Any, cut: int) -> None:
    _record_frame(member, 1, 1, b"abc")
    data = _batch(member)
    with pytest.raises(BatchError):
        list(batch_records(data[:-cut] if cut < len(data) else data[:1]))


def test_an_unknown_record_is_refused() -> None:
    with pytest.raises(BatchError, match="unknown"):
        list(batch_records(struct.pack("=BIII", ord("Q"), 0, 0, 0)))


def test_the_bus_gets_messages_and_views_in_delivery_order() -> None:
    """Through CorosyncBus: frames reassembled (a fragmented message whole at its last frame's
    place), a view between two messages of one dispatch where Corosync put it, and a sender that
    left losing its partial message."""
    bus = CorosyncBus("g", native=native.module())
    assert bus.impl == "c"
    cpg = bus._cpg
    assert isinstance(cpg, _NativeMember)
    big = bytes(range(256)) * 40
    parts = list(fragments(big, 7, frame_limit=4096))
    assert len(parts) == 3
    c = cpg._c
    _record_change(c, [(1, 10), (2, 20)], [], [(1, 10), (2, 20)])
    _record_frame(c, 1, 10, whole_frame(b"a", 1))
    _record_frame(c, 2, 20, parts[0])
    _record_frame(c, 1, 10, whole_frame(b"b", 2))
    _record_frame(c, 2, 20, parts[1])
    _record_change(c, [(1, 10), (2, 20), (3, 30)], [], [(3, 30)])
    _record_frame(c, 3, 30, fragments(b"lost", 1, frame_limit=12).__next__())
    _record_frame(c, 2, 20, parts[2])
    _record_change(c, [(1, 10), (2, 20)], [(3, 30)], [])
    _record_frame(c, 1, 10, whole_frame(b"c", 3))
    cpg.take()
    assert _batch(c) == b""
    got = [(ev.view_id, ev.members, ev.joined, ev.left) if isinstance(ev, View) else (ev.sender, ev.payload)
           for ev in bus._pending]
    assert got == [(1, ("1:10", "2:20"), ("1:10", "2:20"), ()),
                   ("1:10", b"a"),
                   ("1:10", b"b"),
                   (2, ("1:10", "2:20", "3:30"), ("3:30",), ()),
                   ("2:20", big),
                   (3, ("1:10", "2:20"), (), ("3:30",)),
                   ("1:10", b"c")]
    assert all(isinstance(ev, (View, Delivery)) for ev in bus._pending)
    assert bus._reassembler.pending() == 0


def test_the_engine_chooses_the_member(monkeypatch: pytest.MonkeyPatch) -> None:
    """The data plane says which member the bus runs (the bus imports nothing of it)."""
    monkeypatch.setenv("CHORUS_IMPL", "python")
    assert native.cpg_module() is None
    assert CorosyncBus("g", native=native.cpg_module()).impl == "python"
    monkeypatch.setenv("CHORUS_IMPL", "c")
    assert native.cpg_module() is native.module()
    assert CorosyncBus("g", native=native.cpg_module()).impl == "c"
