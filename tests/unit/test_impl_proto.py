"""The compiled codecs of the commit path (chorus/_cproto.pyx) against their pure-Python
references: the backend frame parser and the verdict frame (commit/backendproto.py), and the bus
messages that carry writesets (bus/proto.py). On any bytes, fed in any pieces, both give the same
frames and messages or both refuse."""

from __future__ import annotations

import os
import struct
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.commit import backendproto as bpf
from chorus.bus import proto as bp

SCALE = int(os.environ.get("CHORUS_FUZZ_SCALE", "1"))

_cproto = pytest.importorskip("chorus._cproto", reason="the compiled codecs are not built (scripts/setup.sh builds them)")

frames = st.one_of(
    st.binary(max_size=40).map(bpf.writeset_frame),
    st.builds(bpf.done_frame, st.sampled_from([b"C", b"A"]), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)),
    st.builds(bpf.ran_frame, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1), st.binary(max_size=20)),
    st.just(struct.pack(">I", 1) + b"S"),
    st.binary(max_size=12),  # anything at all
)


def _parse(parser: Any, stream: bytes, cuts: list[int]) -> Any:
    out: list[Any] = []
    pos = 0
    try:
        for c in sorted(cuts) + [len(stream)]:
            out += [(f.type, f.payload) for f in parser.feed(stream[pos:c])]
            pos = c
    except bpf.FrameError:
        return ("refused", out)
    return out


@settings(max_examples=500 * SCALE)
@given(st.lists(frames, max_size=6), st.lists(st.integers(0, 200), max_size=5), st.booleans())
def test_frame_parsers_agree(parts: list[bytes], cuts: list[int], flip: bool) -> None:
    stream = bytearray(b"".join(parts))
    if flip and stream:
        stream[len(stream) // 2] ^= 0x5A
    cuts = [c % (len(stream) + 1) for c in cuts]
    assert _parse(_cproto.FrameParser(), bytes(stream), cuts) == _parse(bpf.PyFrameParser(), bytes(stream), cuts)


@settings(max_examples=300 * SCALE)
@given(st.integers(0, 4), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.text(max_size=30),
       st.one_of(st.none(), st.integers(0, 2**64 - 1)))
def test_verdict_frames_agree(verdict: int, gid: int, wait_for: int, msg: str, prev: int | None) -> None:
    assert _cproto.verdict_frame(verdict, gid, wait_for, msg, prev) == bpf.py_verdict_frame(verdict, gid, wait_for,
                                                                                          msg, prev)
    long = "é" * 40000  # cut at 65535 bytes, as the reference cuts it
    assert _cproto.verdict_frame(verdict, gid, wait_for, long) == bpf.py_verdict_frame(verdict, gid, wait_for, long)


def _outcome(decode: Callable[[bytes], Any], b: bytes) -> Any:
    try:
        return decode(b)
    except bp.BusProtoError:
        return "refused"


items = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=30)), max_size=5)


@settings(max_examples=500 * SCALE)
@given(st.text(max_size=8), items, st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=3),
       st.integers(0, 400))
def test_writeset_messages_agree(origin: str, batch: list[tuple[int, bytes]], damage: list[tuple[int, int]],
                                 cut: int) -> None:
    when = cut * 1_000_003  # a commit time (bus version 5)
    raw = _cproto.encode_writesets(origin, batch, bp.VERSION, when)
    assert raw == bp.py_encode_writesets(origin, batch, bp.VERSION, when)
    assert _cproto.decode_writesets(raw) == bp.py_decode_writesets(raw) == (origin, batch, when)
    single = bp.encode(bp.WritesetMsg(origin, batch[0][0], batch[0][1], when)) if batch else raw
    for b in (raw, single):
        bad = bytearray(b)
        for pos, value in damage:
            if bad:
                bad[pos % len(bad)] = value
        for variant in (bytes(bad), b[:cut % (len(b) + 1)], b + b"x"):
            assert _outcome(_cproto.decode_writesets, variant) == _outcome(bp.py_decode_writesets, variant)


def test_the_chosen_ones_are_named() -> None:
    want = os.environ.get("CHORUS_IMPL", "c") or "c"
    assert bpf.IMPL == bp.IMPL == want
    assert bpf.FrameParser is (bpf.PyFrameParser if want == "python" else _cproto.FrameParser)
    assert bp._decode_writesets is (bp.py_decode_writesets if want == "python" else _cproto.decode_writesets)
