"""bench/flame.py's attribution of py-spy samples to the segments of a transaction's path."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import flame  # noqa: E402

LOOP = "uv_run (core.c:464);uv__io_poll (linux.c:1546)"


def test_a_sample_belongs_to_its_innermost_chorus_frame():
    stack = [*LOOP.split(";"), "CommitPipeline.admit (chorus/commit/pipeline.py:300)",
             "add (chorus/_csched.pyx:120)", "Py_DECREF (object.h:537)"]
    assert flame.segment(stack) == "(e) admission, dispatch, commit book"
    stack = [*LOOP.split(";"), "Replicator._certify (chorus/replicator.py:600)", "encode (chorus/bus/proto.py:40)"]
    assert flame.segment(stack) == "(b) bus send"
    stack = [*LOOP.split(";"), "Replicator.on_delivery (chorus/replicator.py:500)", "decode (chorus/bus/proto.py:90)"]
    assert flame.segment(stack) == "(d) order and certification"
    stack = [*LOOP.split(";"), "BusSender.pump (chorus/bus/sender.py:1)", "CorosyncBus._mcast (chorus/bus/corosync.py:2)"]
    assert flame.segment(stack) == "(b) bus send"
    stack = [*LOOP.split(";"), "CorosyncBus._dispatch (chorus/bus/corosync.py:3)"]
    assert flame.segment(stack) == "(c) delivery"


def test_psycopg_is_apply_and_a_stack_without_chorus_is_the_loop():
    assert flame.segment(["ApplySession._call (chorus/commit/applier.py:10)", "send (psycopg/pq/x.py:1)"]) == "(i) apply"
    assert flame.segment(LOOP.split(";")) == flame.LOOP


def test_split_counts_samples_and_sets_the_loops_sleep_apart():
    collapsed = "\n".join([
        f"{LOOP};epoll_pwait (libc.so.6) 40",
        f"{LOOP};BackendServer._writeset (chorus/commit/backends.py:9) 30",
        f"{LOOP};BackendServer._writeset (chorus/commit/backends.py:9);send (libc.so.6) 10",
        f"{LOOP};WritesetLog.append_many (chorus/wslog/writer.py:1);uv__queue_empty (queue.h:33) 20",
        "garbage line",
    ])
    segments, kinds = flame.split(collapsed)
    assert segments == {flame.WAITING_KEY: 40, "(a)+(g) backend frames": 40, "(f) log": 20}
    assert kinds == {flame.WAITING_KEY: 40, "Python (interpreter)": 30,
                     "libc (system calls and their wrappers)": 10, "uvloop and libuv": 20}
    text = flame.table(segments, 90.0, 10.0)
    assert "| (a)+(g) backend frames | 66.7 % | 67 |" in text
    assert "40 more asleep" in text and "**100**" in text
