"""Frames on the backend socket (docs/PROTOCOL.md section 1): the coordinator's parser."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chorus.commit import backendproto as bpf


def _frames() -> list[bytes]:
    return [bpf.writeset_frame(b"CW" + bytes(40)), bpf.done_frame(b"C", 7, 99),
            bpf.writeset_frame(bytes(3000)), bpf.done_frame(b"A", 8, 100), b"\x00\x00\x00\x01S"]


@given(st.lists(st.integers(min_value=1, max_value=64), max_size=200))
def test_frames_come_out_whole_however_the_bytes_are_split(cuts: list[int]) -> None:
    data = b"".join(_frames())
    parser = bpf.FrameParser()
    out: list[bpf.Frame] = []
    pos = 0
    for n in cuts:
        out += parser.feed(data[pos:pos + n])
        pos += n
    out += parser.feed(data[pos:])
    assert [(f.type, len(f.payload)) for f in out] == [(b"W", 42), (b"C", 12), (b"W", 3000), (b"A", 12), (b"S", 0)]
    assert bpf.parse_done(out[1].payload) == (7, 99)


@pytest.mark.parametrize("frame, message", [
    (b"\x00\x00\x00\x00", "out of range"),
    (b"\x00\x00\x00\x02Xy", "unknown frame type"),
    (b"\x00\x00\x00\x02Sx", "payload bytes"),  # a causal read carries nothing
    (b"\x00\x00\x00\x05C1234", "payload bytes"),  # a commit report is 12 bytes
])
def test_malformed_frames_are_refused(frame: bytes, message: str) -> None:
    with pytest.raises(bpf.FrameError, match=message):
        bpf.FrameParser().feed(frame)


def test_bad_type_is_refused_before_its_body_arrives() -> None:
    with pytest.raises(bpf.FrameError, match="unknown frame type"):
        bpf.FrameParser().feed(b"\x10\x00\x00\x00Z")  # a 256 MB frame of an unknown type
