"""The compiled apply scheduler (chorus/_csched.pyx) against the pure-Python reference
(scheduler.PyScheduler): for the same random sequence of registrations (local and remote,
schema-change barriers, keys in every mode), commits, replays, restarts and failed attempts, both
dispatch the same runs and replays in the same order and describe every GID alike."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.commit import scheduler
from chorus.wire import KeyMode

SCALE = int(os.environ.get("CHORUS_FUZZ_SCALE", "1"))

_csched = pytest.importorskip("chorus._csched", reason="the compiled scheduler is not built (scripts/setup.sh builds it)")

HASHES = [b"t:a", b"t:b", b"r:a1", b"r:a2", b"r:b1"]
keys = st.lists(st.tuples(st.sampled_from(HASHES), st.sampled_from(list(KeyMode))), max_size=4)
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), keys, st.booleans(), st.integers(0, 9)),  # keys, local, barrier if 0
    st.tuples(st.just("commit"), st.integers(0, 12)),  # the n-th oldest pending GID
    st.tuples(st.just("runs"), st.integers(1, 4), st.integers(1, 5), st.integers(0, 3)),
    st.tuples(st.just("replay"), st.integers(0, 12)),
    st.tuples(st.just("next_replay")),
    st.tuples(st.just("redispatch"), st.integers(0, 12)),
    st.tuples(st.just("restart"), st.integers(0, 3)),
    st.tuples(st.just("upto"), st.integers(0, 3)),
), max_size=80)


def _run(s: Any, steps: list[tuple[Any, ...]]) -> list[Any]:
    """Apply ``steps`` as the commit pipeline would: a failed attempt (redispatch) only of a GID
    dispatched and not committed yet."""
    out: list[Any] = []
    gid = 0
    dispatched: list[int] = []
    for step in steps:
        kind = step[0]
        pending = s.pending()
        if kind == "add":
            gid += 1
            s.add(gid, step[1], local=step[2], barrier=step[3] == 0)
            out.append(None)
        elif kind in ("commit", "replay"):
            if pending:
                g = pending[step[1] % len(pending)]
                out.append(s.committed(g) if kind == "commit" else s.replay(g))
                if kind == "commit" and g in dispatched:
                    dispatched.remove(g)
        elif kind == "redispatch":
            if dispatched:
                out.append(s.redispatch(dispatched.pop(step[1] % len(dispatched))))
        elif kind == "runs":
            cap = step[3]
            runs = s.ready_runs(step[1], step[2], lambda run: cap == 0 or len(run) <= cap)
            dispatched.extend(g for run in runs for g in run)
            out.append(runs)
        elif kind == "next_replay":
            r = s.next_replay()
            if r is not None:
                dispatched.append(r)
            out.append(r)
        elif kind == "restart":
            out.append(s.replay_all_from(max(0, gid - step[1])))
            dispatched.clear()
        else:
            s.committed_upto(max(0, gid - step[1]))
            dispatched = [g for g in dispatched if g > max(0, gid - step[1])]
        out.append((len(s), s.queued, s.pending(), [s.describe(g) for g in range(gid + 2)]))
    out.append(s.ready_remote(100))
    return out


@settings(max_examples=300 * SCALE, deadline=None)
@given(ops)
def test_both_dispatch_alike(steps: list[tuple[Any, ...]]) -> None:
    assert _run(scheduler.PyScheduler(), steps) == _run(_csched.Scheduler(), steps)


def test_the_chosen_one_is_named() -> None:
    want = os.environ.get("CHORUS_IMPL", "c") or "c"
    assert scheduler.IMPL == want
    assert scheduler.Scheduler is (scheduler.PyScheduler if want == "python" else _csched.Scheduler)
