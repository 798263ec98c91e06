"""The link stream's frames (chorus/link/proto.py, docs/LINKS.md section 2): each written and
read back, the version and names refused where they must be, the proof bound to the link and
both sites, and a decoder that answers anything malformed with its one error."""

from __future__ import annotations

import asyncio
import os
import struct
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus import recoveryproto as rp
from chorus import wire
from chorus.link import proto
from chorus.link.events import ClockEvent
from chorus.link.proto import LinkError, LinkProtocolError

TABLE = wire.Table("public", "t", (wire.Column("id", "int4"), wire.Column("v", "text")), (0,))


def writeset(n: int, size: int = 10) -> bytes:
    row = wire.Row(wire.OP_INSERT, 0, (), (str(n).encode(), b"v" * size))
    return wire.encode(wire.Writeset(n, 1, 0, (TABLE,), (row,), (wire.Key(wire.KeyMode.EXCLUSIVE,
                                                                            (b"public", b"t", b"id", str(n).encode())),)))


def read(data: bytes) -> proto.Frame:
    kind, n = proto.frame_head(data[:5])
    assert len(data) == 5 + n
    return proto.decode(kind, data[5:])


HELLO = proto.Hello("eu-us", "site-b", "site-a", proto.Position(41, 45), b"n" * 16)


def test_every_frame_reads_back_as_written() -> None:
    assert read(proto.write_hello(HELLO)) == HELLO
    p = proto.Proof(os.urandom(16), os.urandom(32))
    assert read(proto.write_proof(p)) == p
    assert read(proto.write_clock(ClockEvent("site-b", 1 << 40))) == ClockEvent("site-b", 1 << 40)
    assert read(proto.write_end(proto.End(7))) == proto.End(7)
    assert read(proto.write_applied(proto.Applied(1 << 50))) == proto.Applied(1 << 50)
    assert read(proto.write_error(proto.Error("no"))) == proto.Error("no")
    r = proto.Record(12, "site-a", 1_700_000_000_000_000, writeset(12))
    frames = list(proto.write_record(r))
    assert len(frames) == 1 and frames[0][:1] == b"R" and read(frames[0]) == r
    txn = proto.transaction(r)
    assert (txn.site, txn.clock, txn.commit_time) == ("site-a", 12, 1_700_000_000_000_000)
    assert txn.writeset.rows == (wire.Row(wire.OP_INSERT, 0, (), (b"12", b"v" * 10)),)


def test_a_large_transaction_goes_in_parts_and_is_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rp, "PART_BYTES", 1000)
    r = proto.Record(5, "site-a", 99, writeset(5, size=10_000))
    frames = list(proto.write_record(r))
    assert len(frames) == 11 and {f[:1] for f in frames} == {b"P"}
    joiner = proto.Reassembler()
    got = [joiner.add(p) for p in (read(f) for f in frames) if isinstance(p, proto.Part)]
    assert got[:-1] == [None] * 10 and got[-1] == r and not joiner.open
    # parts out of order, or of another transaction, are refused
    joiner = proto.Reassembler()
    assert joiner.add(proto.Part(frames[0][5:])) is None
    with pytest.raises(LinkProtocolError, match="does not continue"):
        joiner.add(proto.Part(frames[2][5:]))


def test_an_unknown_version_is_refused_with_a_clear_error() -> None:
    frame = proto.write_hello(HELLO)
    later = frame[:5] + struct.pack(">H", 5) + frame[7:]
    with pytest.raises(LinkProtocolError, match="link protocol version 5 is not spoken here .this site speaks 1, 2, 3, 4"):
        read(later)
    # a receiver of a release before: no mode byte (version 2), and no APPLIED frames (version 1)
    for version in (1, 2):
        earlier = frame[:3] + struct.pack(">I", len(frame) - 6)[2:] + struct.pack(">H", version) + frame[7:-1]
        assert read(earlier) == proto.Hello(HELLO.link, HELLO.receiver, HELLO.sender, HELLO.position, HELLO.nonce,
                                             version)


def test_names_are_bounded_and_plain() -> None:
    """Link and site names join the proof with ``|``: ones that could move a field boundary are refused."""
    for bad in ("a|b", "", "x" * 65, "é"):
        with pytest.raises(ValueError):
            proto.write_hello(proto.Hello(bad, "site-b", "site-a", proto.Position(0), b"n" * 16))
    body = bytearray(proto.write_clock(ClockEvent("ab", 1))[5:])
    body[1:3] = b"a|"
    with pytest.raises(LinkProtocolError, match="not a valid"):
        proto.decode(proto.FrameKind.CLOCK, bytes(body))


def test_the_proof_binds_the_role_the_link_both_sites_and_both_nonces() -> None:
    s, n1, n2 = b"k" * 32, b"1" * 16, b"2" * 16
    base = proto.proof(s, b"sender", "eu-us", "site-a", "site-b", n1, n2)
    others = [proto.proof(b"j" * 32, b"sender", "eu-us", "site-a", "site-b", n1, n2),
              proto.proof(s, b"receiver", "eu-us", "site-a", "site-b", n1, n2),
              proto.proof(s, b"sender", "eu-asia", "site-a", "site-b", n1, n2),
              proto.proof(s, b"sender", "eu-us", "site-c", "site-b", n1, n2),
              proto.proof(s, b"sender", "eu-us", "site-a", "site-c", n1, n2),
              proto.proof(s, b"sender", "eu-us", "site-b", "site-a", n1, n2),
              proto.proof(s, b"sender", "eu-us", "site-a", "site-b", n2, n1)]
    assert len(base) == 32 and base not in others and len(set(others)) == len(others)
    # not the recovery stream's proof over the same fields
    assert base.hex() != rp.proof(s, b"sender", "eu-us", "site-a", "site-b", n1.hex(), n2.hex())


def test_a_broken_link_travels_as_an_error_frame() -> None:
    frame = read(proto.write_error(proto.broken(proto.LinkBroken(6, 90))))
    assert isinstance(frame, proto.Error)
    e = proto.error(frame)
    assert isinstance(e, proto.LinkBroken) and (e.first, e.last) == (6, 90)
    assert str(e) == "link broken: GIDs 6..90 are gone from the log"
    assert type(proto.error(proto.Error("busy"))) is LinkError


def test_oversized_and_unknown_frames_are_refused_by_their_head() -> None:
    with pytest.raises(LinkProtocolError, match="unknown frame type"):
        proto.frame_head(b"Z\x00\x00\x00\x00")
    with pytest.raises(LinkProtocolError, match="END frame of 9 bytes"):
        proto.frame_head(b"E\x00\x00\x00\x09")
    with pytest.raises(LinkProtocolError, match="RECORD frame of"):
        proto.frame_head(b"R\xff\xff\xff\xff")


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(list(proto.FrameKind)), st.binary(max_size=300))
def test_decoding_random_bodies_raises_only_the_protocol_error(kind: proto.FrameKind, body: bytes) -> None:
    try:
        frame = proto.decode(kind, body)
        if isinstance(frame, proto.Record):
            proto.transaction(frame)
        elif isinstance(frame, proto.Part):
            proto.Reassembler().add(frame)
    except LinkProtocolError:
        pass


def _stream() -> bytes:
    """A valid sender's stream: a proof, clock events, a small and a parted transaction, END."""
    old = rp.PART_BYTES
    rp.PART_BYTES = 64
    try:
        parted = list(proto.write_record(proto.Record(3, "site-a", 7, writeset(3, size=150))))
    finally:
        rp.PART_BYTES = old
    return b"".join([proto.write_proof(proto.Proof(b"n" * 16, b"m" * 32)), proto.write_clock(ClockEvent("site-a", 2)),
                     *proto.write_record(proto.Record(2, "site-a", 5, writeset(2))), *parted,
                     proto.write_clock(ClockEvent("site-b", 9)), proto.write_end(proto.End(3))])


async def _read_all(data: bytes) -> list[object]:
    """Everything a receiver would take from ``data``, as it takes it."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    joiner = proto.Reassembler()
    out: list[object] = []
    while True:
        frame = await proto.read_frame(reader)
        whole: Optional[proto.Frame] = joiner.add(frame) if isinstance(frame, proto.Part) else frame
        if isinstance(whole, proto.Record):
            out.append(proto.transaction(whole))
        elif whole is not None:
            out.append(whole)
        if isinstance(whole, proto.End):
            return out


def test_the_valid_stream_reads_whole() -> None:
    items = asyncio.run(_read_all(_stream()))
    assert [type(i).__name__ for i in items] == ["Proof", "ClockEvent", "RemoteTransaction", "RemoteTransaction",
                                                 "ClockEvent", "End"]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_mutated_stream_raises_only_link_errors(data: st.DataObject) -> None:
    """Bytes of a valid stream changed, cut out or inserted anywhere: the receiver's reading
    ends in a LinkError (malformed, or the connection closing inside a frame), never another."""
    stream = bytearray(_stream())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(stream) - 1))
        how = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if how == "flip":
            stream[at] ^= data.draw(st.integers(1, 255))
        elif how == "cut":
            del stream[at:at + data.draw(st.integers(1, 16))]
        else:
            stream[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    try:
        asyncio.run(_read_all(bytes(stream)))
    except LinkError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_link_errors(data: bytes) -> None:
    try:
        asyncio.run(_read_all(data))
    except LinkError:
        pass
