"""What crosses a trust boundary, fuzzed (issue 23): bus messages from a member, frames on the
backend socket, requests on the admin socket. Bad input is refused with the module's own error
or a clean answer, never another exception, and a node that met it decides exactly as the
others do afterwards. (The recovery stream: tests/unit/test_recovery_stream.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chorus.commit import backendproto as bpf
from chorus.bus import proto as bp
from chorus import wire
from chorus.admin import serve
from test_replicator import NAMES, form, writeset

# CHORUS_FUZZ_SCALE=100 runs a hundred times as many examples (a longer run from the command line)
SCALE = int(os.environ.get("CHORUS_FUZZ_SCALE", "1"))


def _mutations(raw: bytes, rnd: random.Random) -> list[bytes]:
    out = [raw[:rnd.randrange(len(raw) + 1)], raw + bytes([rnd.randrange(256)])]
    b = bytearray(raw)
    for _ in range(rnd.randint(1, 4)):
        b[rnd.randrange(len(b))] = rnd.randrange(256)
    out.append(bytes(b))
    return out


SAMPLES = [bp.encode(m) for m in (
    bp.WritesetMsg("n2", 7, writeset(0, 5)), bp.WritesetBatch("n2", ((1, writeset(0, 1)), (2, writeset(0, 2)))),
    bp.GidRequest("n2", "r1", "c", 3), bp.Progress("n2", 9), bp.FlowControl("n2", True),
    bp.DdlResult("n2", 4, True, "", writeset(0, 3)), bp.SyncMarker("n2", 2), bp.Vote("n2", 3, False, "x"),
    bp.LogQuery("n2", "q"), bp.LogInfo("n1", "q", "n2", "h:1", 0, 5, 5, 0), bp.Received("n2", 4),
    bp.LinkWriteset("n2", 1, "east-west", "east", 0, 5, 6, 0, 1, 2, writeset(0, 4)),
    bp.LinkApplied("n2", "east-west", 41))]
# the protocol negotiation's fields (bus/versions.py), at version 4 and folded into version 3
SAMPLES += [bp.encode(m, v) for v in (3, 4) for m in (
    bp.GidRequest("n2", "r2", "c", 3, speaks=(3, 4)), bp.Speaks("n2", (3, 4)),
    bp.GidReply("n2", "r2", "m2", "c", 3, 3, (("n1", "m1"), ("n2", "m2")), (), b"", compat="UTF8 15",
                version=3, speaks=(("n1", 3, 4), ("n2", 3, 4))))]


@settings(max_examples=500 * SCALE)
@given(st.binary(max_size=200), st.integers(0, len(SAMPLES) - 1), st.randoms(use_true_random=False))
def test_bus_messages_decode_or_are_refused_with_their_own_error(garbage: bytes, which: int,
                                                                 rnd: random.Random) -> None:
    for raw in [garbage, bytes([bp.VERSION]) + garbage, *_mutations(SAMPLES[which], rnd)]:
        try:
            bp.decode(raw)
        except bp.BusProtoError:
            pass


@settings(max_examples=60 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(SAMPLES) - 1), st.integers(0, 2**32)), min_size=1, max_size=8))
def test_a_malformed_message_from_a_member_leaves_every_node_deciding_alike(bad: list[tuple[int, int]]) -> None:
    """Every node delivers the same damaged messages (from n2) between valid writesets: those
    that do not parse are refused alike; those that still parse are taken alike (a damaged GID
    request in n2's name makes every node, n2 too, count n2 out). No node commits a GID the
    others do not, and the nodes that stay online agree on every GID."""
    c = form()
    for which, seed in bad:
        rnd = random.Random(seed)
        for raw in _mutations(SAMPLES[which], rnd):
            c.order.append(("n2", raw))
        c.submit("n1", 0, seed % 50)
    c.drain()
    committed = {n: {g for g, ok in c.log[n] if ok} for n in NAMES}
    online = [n for n in NAMES if c.nodes[n].accepts_writes]
    assert "n1" in online and "n3" in online
    assert all(committed[n] == committed["n1"] and c.nodes[n].gid == c.nodes["n1"].gid for n in online)
    assert all(committed[n] <= committed["n1"] for n in NAMES)
    assert committed["n1"]


@settings(max_examples=400 * SCALE)
@given(st.binary(max_size=120), st.lists(st.integers(1, 40), max_size=6))
def test_backend_frames_parse_or_are_refused_with_frame_or_wire_errors(data: bytes, cuts: list[int]) -> None:
    """What a backend may send, cut anywhere: FrameParser yields frames or raises FrameError,
    and each frame's body reads or raises the error its reader owns (the coordinator closes
    the connection on either)."""
    parser = bpf.FrameParser()
    chunks, pos = [], 0
    for c in cuts:
        chunks.append(data[pos:pos + c])
        pos += c
    chunks.append(data[pos:])
    try:
        for chunk in chunks:
            for f in parser.feed(chunk):
                if f.type == bpf.FrameType.WRITESET:
                    try:
                        wire.scan(f.payload)
                    except wire.WireError:
                        pass
                elif f.type in (bpf.FrameType.COMMITTED, bpf.FrameType.ABORTED):
                    bpf.parse_done(f.payload)
                elif f.type == bpf.FrameType.DDL_RAN:
                    bpf.parse_ran(f.payload)
    except bpf.FrameError:
        pass


async def _answer(cmd: str, req: dict[str, Any]) -> dict[str, Any]:
    return {"ok": cmd == "status", "cmd": cmd}


def test_the_admin_socket_answers_every_request_with_json() -> None:
    rnd = random.Random(11)
    requests = [bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 300))) + b"\n" for _ in range(150)]
    requests += [b'{"cmd": ' + json.dumps(v).encode() + b"}\n" for v in (None, 7, [], {}, "x" * 5000, "status")]
    requests += [b"{" * 10000 + b"\n", b'"status"\n', b"null\n", b"\xff\xfe\n", b"x" * 70000 + b"\n"]

    def ask(path: str, data: bytes) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(path)
            s.sendall(data)
            return s.recv(1 << 20)

    async def main(path: str) -> None:
        server = await asyncio.start_unix_server(lambda r, w: serve(r, w, _answer), path)
        async with server:
            loop = asyncio.get_running_loop()
            for data in requests:
                answer = await loop.run_in_executor(None, ask, path, data)
                reply = json.loads(answer)  # every request gets one JSON answer
                assert isinstance(reply, dict) and "ok" in reply, (data[:40], answer)
            good = await loop.run_in_executor(None, ask, path, b'{"cmd": "status"}\n')
            assert json.loads(good) == {"ok": True, "cmd": "status"}

    with tempfile.TemporaryDirectory() as d:
        asyncio.run(main(os.path.join(d, "admin.sock")))
