"""Large writesets through the coordinator without holding them in memory (docs/APPLY.md, "Large
writesets"): spool files, the bus reassembling a large message into one, the bus message of a
spooled writeset sent in frames, the backend's large writeset frame gathered into one; each
against the same bytes held in memory."""

from __future__ import annotations

import gc
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.commit import backendproto as bpf
from chorus.bus import proto as bp
from chorus import wire
from chorus.commit.backends import BackendConnection
from chorus.bus.fragment import FragmentError, Reassembler, fragments
from chorus.spool import Concat, Spool, SpooledBuffer


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    s = Spool(str(tmp_path / "spool"))
    s.open()
    return s


def _files(spool: Spool) -> list[str]:
    gc.collect()
    return os.listdir(spool.directory)


def test_the_directory_is_private_and_emptied_at_start(tmp_path: Path) -> None:
    s = Spool(str(tmp_path / "spool"))
    s.open()
    w = s.writer()
    w.write(b"left over")
    w.fd = os.close(w.fd) or -1  # a crash: the file stays
    assert os.stat(s.directory).st_mode & 0o777 == 0o700
    assert os.stat(w.path).st_mode & 0o777 == 0o600
    Spool(s.directory).open()
    assert os.listdir(s.directory) == []


def test_a_spooled_buffer_reads_its_bytes_and_its_file_goes_with_it(spool: Spool) -> None:
    data = os.urandom(100_000)
    w = spool.writer()
    w.write(data[:40_000])
    w.write(memoryview(data)[40_000:])
    whole = w.finish()
    part = whole.sub(123)
    assert (len(whole), bytes(whole.view), whole[5:9]) == (100_000, data, data[5:9])
    assert (part.path, part.offset, len(part), bytes(part.view)) == (whole.path, 123, 100_000 - 123, data[123:])
    del whole
    assert len(_files(spool)) == 1  # the part keeps the file
    del part
    assert _files(spool) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=6), st.integers(20, 700), st.integers(0, 3000))
def test_concat_slices_as_the_joined_bytes(sizes: list[int], frame: int, spool_at: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        s = Spool(d)
        parts: list[Any] = []
        for i, n in enumerate(sizes):
            data = os.urandom(n)
            if i % 2 and n:
                w = s.writer()
                w.write(data)
                parts.append(w.finish())
            else:
                parts.append(data)
        joined = b"".join(bytes(p.view) if isinstance(p, SpooledBuffer) else p for p in parts)
        c = Concat(*parts)
        assert len(c) == len(joined)
        for start in range(0, len(joined) + 1, max(1, frame)):
            assert c[start:start + frame] == joined[start:start + frame]
        assert list(fragments(c, 9, frame + 10)) == list(fragments(joined, 9, frame + 10))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 20_000), min_size=1, max_size=5), st.integers(200, 5000), st.integers(0, 30_000))
def test_reassembly_with_a_spool_delivers_the_same_bytes(sizes: list[int], frame: int, spool_at: int) -> None:
    """Messages from two senders, interleaved frame by frame: with a spool each is the same bytes,
    in a spool file exactly when larger than spool_at; no file is left once they are dropped."""
    with tempfile.TemporaryDirectory() as d:
        s = Spool(d)
        plain, spooled = Reassembler(), Reassembler(spool=s, spool_at=spool_at)
        streams = [[("a", f) for i, n in enumerate(sizes) for f in fragments(os.urandom(n), i, frame)],
                   [("b", f) for i, n in enumerate(sizes) for f in fragments(os.urandom(n), i, frame)]]
        order = [x for pair in zip(*streams) for x in pair]
        for sender, f in order:
            a, b = plain.feed(sender, f), spooled.feed(sender, f)
            assert (a is None) == (b is None)
            if a is not None:
                assert isinstance(b, SpooledBuffer) == (len(a) > spool_at and len(a) > 0 and
                                                        len(list(fragments(a, 0, frame))) > 1)
                assert (bytes(b.view) if isinstance(b, SpooledBuffer) else b) == a
        del a, b
        gc.collect()
        assert os.listdir(d) == []


def test_a_partial_spooled_message_is_dropped_with_its_sender(spool: Spool) -> None:
    r = Reassembler(spool=spool, spool_at=1000)
    frames = list(fragments(os.urandom(10_000), 1, 1024))
    for f in frames[:5]:
        assert r.feed("a", f) is None
    assert len(_files(spool)) == 1
    r.drop("a")
    assert _files(spool) == []
    for f in frames[:5]:
        r.feed("b", f)
    with pytest.raises(FragmentError):
        r.feed("b", frames[7])  # out of order: the message is dropped, its file too
    assert _files(spool) == []


def _writeset(rows: int) -> bytes:
    t = wire.Table("public", "big", (wire.Column("id", "integer", 0), wire.Column("pad", "text", 0)), (0,))
    return wire.encode(wire.Writeset(
        7, 8, 3, (t,), tuple(wire.Row("I", 0, (), (b"%d" % i, b"x" * 200)) for i in range(rows)),
        (wire.Key(wire.KeyMode.EXCLUSIVE, (b"public", b"big")),)))


def test_a_spooled_writeset_goes_through_the_bus_and_reads_as_the_bytes_would(spool: Spool) -> None:
    """Origin: the backend's writeset in a spool file, its bus message a Concat of a head and the
    file; every member: the message gathered in a spool file, decoded without reading the
    writeset into memory, scanned in place: the same message and writeset as in memory."""
    raw = _writeset(20_000)
    w = spool.writer()
    w.write(raw)
    from_backend = w.finish()
    msg = bp.encode(bp.WritesetMsg("n1", 42, from_backend))  # type: ignore[arg-type]
    assert isinstance(msg, Concat)
    r = Reassembler(spool=spool, spool_at=1 << 20)
    got = [x for x in (r.feed("n1", f) for f in fragments(msg, 1, 64 * 1024)) if x is not None]
    assert len(got) == 1 and isinstance(got[0], SpooledBuffer) and bp.carries_writesets(got[0])
    m = bp.decode(got[0])
    assert isinstance(m, bp.WritesetMsg) and (m.origin, m.ticket) == ("n1", 42)
    assert isinstance(m.writeset, SpooledBuffer) and bytes(m.writeset.view) == raw
    ws, ref = wire.scan(m.writeset), wire.scan(raw)
    assert ws == ref and ws.keys == ref.keys and ws.tables == ref.tables
    assert ws.spool is m.writeset and bytes(ws.raw) == raw
    assert (ws.spool.path, ws.spool.offset, len(ws.spool)) == (got[0].path, len(msg) - len(raw), len(raw))


def test_a_large_message_of_another_kind_is_read_whole(spool: Spool) -> None:
    big = bp.DdlResult("n1", 5, True, "", os.urandom(3 << 20))
    r = Reassembler(spool=spool, spool_at=1 << 20)
    got = [x for x in (r.feed("n1", f) for f in fragments(bp.encode(big), 1, 64 * 1024)) if x is not None]
    assert isinstance(got[0], SpooledBuffer) and bp.decode(got[0]) == big


class _Server:
    """What BackendConnection hands its frames to, recorded."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self.frames: list[tuple[bytes, bytes, bool]] = []

        class Counters:
            malformed_frames = 0
        self.counters = Counters()

    def frame(self, b: Any, frame: bpf.Frame) -> None:
        p = frame.payload
        spooled = isinstance(p, SpooledBuffer)
        self.frames.append((frame.type, bytes(p.view) if spooled else p, spooled))  # type: ignore[union-attr]

    def closed(self, b: Any) -> None:
        pass


class _Transport:
    def close(self) -> None:
        raise AssertionError("closed")

    def write(self, data: bytes) -> None:
        pass


def _receive(sizes: list[int], cuts: list[int], d: str) -> tuple[list[bytes], list[tuple[bytes, bytes, bool]]]:
    """Writeset frames of these sizes, each followed by a C frame, fed to a BackendConnection cut
    at ``cuts`` (a spool threshold of 20,000 bytes): the payloads and the frames it handed over."""
    import chorus.commit.backends as backends
    server = _Server(Spool(d))
    conn = BackendConnection(server)  # type: ignore[arg-type]
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    payloads = [os.urandom(n) for n in sizes]
    stream = b"".join(bpf.writeset_frame(p) + bpf.done_frame(b"C", i, i) for i, p in enumerate(payloads))
    threshold = backends.SPOOL_AT
    backends.SPOOL_AT = 20_000
    try:
        pos = 0
        for c in sorted(c for c in cuts if c < len(stream)) + [len(stream)]:
            conn.data_received(stream[pos:c])
            pos = c
    finally:
        backends.SPOOL_AT = threshold
    conn.connection_lost(None)
    return payloads, server.frames


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([10, 5000, 70_000]), min_size=1, max_size=5),
       st.lists(st.integers(0, 400_000), max_size=12))
def test_a_backend_connection_hands_over_every_frame_in_any_pieces(sizes: list[int], cuts: list[int]) -> None:
    """Frames fed in any pieces: every frame arrives as the parser alone would give it (a large
    writeset from a spool file when it came in several pieces), and no spool file is left."""
    with tempfile.TemporaryDirectory() as d:
        payloads, frames = _receive(sizes, cuts, d)
        assert [(t, p) for t, p, _ in frames] == [
            x for i, p in enumerate(payloads) for x in ((b"W", p), (b"C", struct.pack(">QI", i, i)))]
        gc.collect()
        assert os.listdir(d) == []


def test_a_large_writeset_arriving_in_socket_reads_is_spooled() -> None:
    with tempfile.TemporaryDirectory() as d:
        _, frames = _receive([10, 70_000, 5000, 20_001], list(range(0, 200_000, 4096)), d)
        assert [(t, len(p), spooled) for t, p, spooled in frames if t == b"W"] == [
            (b"W", 10, False), (b"W", 70_000, True), (b"W", 5000, False), (b"W", 20_001, True)]


def test_frame_parsers_hand_over_a_large_writeset_alike() -> None:
    parsers: list[Any] = [bpf.PyFrameParser()]
    try:
        from chorus import _cproto
        parsers.append(_cproto.FrameParser())
    except ImportError:
        pass
    frame = bpf.writeset_frame(b"y" * 1000)
    for p in parsers:
        assert p.feed(bpf.done_frame(b"A", 1, 2) + frame[:300]) == [bpf.Frame(b"A", struct.pack(">QI", 1, 2))]
        assert p.take_large(2000) is None
        assert p.take_large(999) == (1001, frame[:300])
        assert p.take_large(10) is None and p.feed(b"") == []
        assert p.feed(bpf.done_frame(b"C", 3, 4)) == [bpf.Frame(b"C", struct.pack(">QI", 3, 4))]


def test_a_message_that_cannot_be_spooled_fails_the_bus_not_the_message(tmp_path: Path) -> None:
    """A spool directory that cannot take the message (here: gone): SpoolError, which makes the
    bus fail (the member leaves and catches up), never a message silently lost."""
    import shutil
    from chorus.bus.fragment import SpoolError
    s = Spool(str(tmp_path / "spool"))
    s.open()
    r = Reassembler(spool=s, spool_at=1000)
    frames = list(fragments(os.urandom(10_000), 1, 1024))
    r.feed("a", frames[0])
    shutil.rmtree(s.directory)
    with pytest.raises(SpoolError):
        for f in frames[1:]:
            r.feed("a", f)
    assert r.pending() == 0
