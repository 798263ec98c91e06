"""The differential test's foundation (docs/NATIVE.md, section 4 and step 0): the trace format
(dataplane/events.py, trace.py), traces recorded from the simulation (tests/sim: each
coordinator's core input and output), and their replay through a fresh core
(dataplane/refcore.py, replay.py) with each implementation of the certifier and the scheduler.

The golden traces (tests/golden/traces/) were recorded with ``tests/sim/simrun.py --seed N
--record DIR`` (seeds 36 and 18): a node catching up (held live writesets, runs from a log,
certification conflicts), a node bootstrapping a cluster that then votes on a GID it could not
apply, and a node whose PostgreSQL restarts. A deliberate change of the core's behaviour makes
them differ: record them again then, and say why in the commit.
"""

from __future__ import annotations

import logging
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus.certifier import OK, PyCertifier, Verdict
from chorus.commit.scheduler import PyScheduler
from chorus.dataplane import events as ev
from chorus.dataplane.events import Record, TraceError
from chorus.dataplane.replay import check, compare, implementations, replay
from chorus.dataplane.trace import MAGIC, VERSION, Trace, TraceWriter, encode_record, read_trace

GOLDEN = sorted((Path(__file__).resolve().parents[1] / "golden" / "traces").glob("*.trace"))
SIM = Path(__file__).resolve().parents[1] / "sim"
SEEDS = (3, 27)  # recorded at run time: partitions, freezes, kills, a power cut, catch-ups


def _simrun() -> ModuleType:
    """tests/sim/simrun.py, imported without leaving the simulation's log level behind."""
    chorus_log = logging.getLogger("chorus")
    level = chorus_log.level
    sys.path.insert(0, str(SIM))
    try:
        import simrun
    finally:
        sys.path.remove(str(SIM))
        chorus_log.setLevel(level)
    return simrun


@pytest.fixture(scope="module")
def sim_traces() -> dict[str, Trace]:
    simrun = _simrun()
    out = {}
    for seed in SEEDS:
        res = simrun.run(seed, record=True)
        assert res.ok, res.line()
        for name, data in res.traces.items():
            out[f"{seed}-{name}"] = read_trace(data)
    return out


@pytest.fixture(params=["python", "cython", "native"])
def impl(request: pytest.FixtureRequest) -> str:
    """The certifier and scheduler to replay with: the references, the Cython modules, the C
    certification index and scheduler (compiled by the native_core fixture)."""
    name: str = request.param
    if name == "native":
        request.getfixturevalue("native_core")
    try:
        implementations(name)
    except ImportError as e:
        pytest.skip(str(e))
    return name


# ---- the format ---------------------------------------------------------------------------------

_u64 = st.integers(0, (1 << 64) - 1)
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_KINDS: dict[str, st.SearchStrategy[Any]] = {
    "u8": st.integers(0, 255), "bool": st.booleans(), "u32": st.integers(0, (1 << 32) - 1), "u64": _u64,
    "str": _text, "blob": st.binary(max_size=64),
    "u64s": st.lists(_u64, max_size=5).map(tuple), "strs": st.lists(_text, max_size=5).map(tuple),
    "applies": st.lists(st.tuples(_u64, _u64, _text, st.booleans(), st.binary(max_size=40)), max_size=3).map(tuple),
    "logrecs": st.lists(st.tuples(_u64, _text, st.integers(0, 255), st.binary(max_size=40)), max_size=3).map(tuple),
}
_times = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def records(draw: st.DrawFn) -> Record:
    cls = draw(st.sampled_from(sorted(ev.BY_CODE.values(), key=lambda c: c.CODE)))
    values = [draw(_KINDS[kind]) for _, kind in cls.SPEC]
    return cls(*values, depth=draw(st.integers(0, 64)), seq=draw(_u64), mono=draw(_times), wall=draw(_times))


def _trace(recs: list[Record], **header: Any) -> bytes:
    w = TraceWriter({"node": "n1", **header})
    for r in recs:
        w(r)
    return w.getvalue()


@given(st.lists(records(), max_size=8))
def test_records_round_trip(recs: list[Record]) -> None:
    t = read_trace(_trace(recs, seed=1))
    assert list(t.records) == recs
    assert t.node == "n1" and t.header["version"] == VERSION and t.header["seed"] == 1


def test_every_code_is_named_once() -> None:
    assert len({c.CODE for c in ev.BY_CODE.values()}) == len(ev.BY_CODE) == len(ev.EVENTS) + len(ev.ACTIONS)
    assert ev.ViewEv((1), (), (), (), "", True, 1, 0, "").name == "VIEW"
    assert ev.LogAppend(()).name == "LOG_APPEND" and not ev.LogAppend(()).is_event


def _header(raw: bytes) -> bytes:
    return MAGIC + struct.pack(">I", len(raw)) + raw


@pytest.mark.parametrize("data, says", [
    (b"", "shorter than the header"),
    (b"CHTRACE2" + bytes(4), "magic"),
    (_header(b'{"node": "n1", "version": 2}'), "version 2"),
    (_header(b'{"node": "n1", "version": "1"}'), "no integer version"),
    (_header(b'{"node": "n1"}'), "no integer version"),
    (_header(b'{"version": 1}'), "names no node"),
    (_header(b'[1]'), "not a JSON object"),
    (_header(b'{"node": '), "not JSON"),
    (MAGIC + struct.pack(">I", 99) + b"{}", "does not fit"),
    (_trace([]) + bytes(3), "truncated"),
    (_trace([]) + struct.pack(">IBBQdd", 999, 0x03, 0, 1, 0.0, 0.0), "truncated"),
    (_trace([]) + struct.pack(">IBBQdd", 2, 0x03, 0, 1, 0.0, 0.0), "length 2 outside"),
    (_trace([]) + struct.pack(">IBBQdd", 26, 0x7E, 0, 1, 0.0, 0.0), "unknown record code 0x7e"),
    (_trace([]) + struct.pack(">IBBQdd", 26, 0x04, 65, 1, 0.0, 0.0), "depth 65"),
    (_trace([]) + struct.pack(">IBBQdd", 26, 0x04, 0, 1, float("nan"), 0.0), "not finite"),
    (_trace([]) + struct.pack(">IBBQddB", 27, 0x04, 0, 1, 0.0, 0.0, 0), "bytes after its body"),
    (_trace([]) + struct.pack(">IBBQddB", 27, 0x0C, 0, 1, 0.0, 0.0, 2), "boolean byte 2"),
    (_trace([]) + struct.pack(">IBBQddI", 30, 0x0E, 0, 1, 0.0, 0.0, 5), "truncated"),
    (_trace([]) + struct.pack(">IBBQddI", 30, 0x0D, 0, 1, 0.0, 0.0, 0), "truncated"),
])
def test_the_reader_refuses_malformed_traces(data: bytes, says: str) -> None:
    with pytest.raises(TraceError, match=says):
        read_trace(data)


def test_the_writer_refuses_what_the_reader_would() -> None:
    with pytest.raises(TraceError):
        encode_record(ev.Committed(1 << 64))
    with pytest.raises(TraceError):
        encode_record(ev.Flush(depth=65))
    with pytest.raises(TraceError):
        TraceWriter({"version": 1})


def _only_trace_errors(data: bytes) -> None:
    try:
        read_trace(data)
    except TraceError:
        pass


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_fuzz_any_bytes(data: bytes) -> None:
    _only_trace_errors(data)
    _only_trace_errors(MAGIC + data)
    _only_trace_errors(_trace([]) + data)


_VALID = _trace([ev.Start('{"node": "n1"}'), ev.Deliver("1:1", b"W\x00payload"), ev.ViewEv(7, ("1:1", "2:1"), ("2:1",), (), "1:1", True, 2, 3, ""),
                 ev.AdmitRun(3, ((4, "n2", 0, b"ws"), (5, "n2", 1, b"ws2"))), ev.BusSend(b"M", (1, 2)),
                 ev.ApplyResult(0, False, 1, (4, 5), 0, "")])


@settings(max_examples=300)
@given(st.data())
def test_fuzz_damaged_traces(data: st.DataObject) -> None:
    """A valid trace cut, with bytes flipped, inserted or removed anywhere: read or TraceError."""
    b = bytearray(_VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(("flip", "insert", "delete", "cut")))
        i = data.draw(st.integers(0, len(b) - 1)) if b else 0
        if op == "flip" and b:
            b[i] ^= data.draw(st.integers(1, 255))
        elif op == "insert":
            b[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and b:
            del b[i:i + data.draw(st.integers(1, 8))]
        else:
            del b[i:]
    _only_trace_errors(bytes(b))


# ---- replay -----------------------------------------------------------------------------------


def test_recording_changes_nothing_in_the_simulation() -> None:
    simrun = _simrun()
    plain, recorded = simrun.run(SEEDS[0]), simrun.run(SEEDS[0], record=True)
    assert plain.ok and recorded.ok
    assert (plain.line(), plain.trace) == (recorded.line(), recorded.trace)
    assert not plain.traces and recorded.traces


def test_the_simulation_traces_cover_the_boundary(sim_traces: dict[str, Trace]) -> None:
    seen = {r.name for t in sim_traces.values() for r in t.records}
    kinds = {f"{r.name}:{r.kind}" for t in sim_traces.values() for r in t.records if isinstance(r, (ev.Handoff, ev.Notify))}
    assert {"START", "VIEW", "DELIVER", "FLUSH", "WRITESET", "COMMITTED", "TICK", "DB_COMMITTED", "DB_DURABLE",
            "APPLY_RESULT", "SEND", "HOLD_LIVE", "ADMIT_HELD", "ADMIT_RUN", "LOG_REC", "CALL", "DISPATCH", "RANDOM",
            "VERDICT", "BUS_SEND", "LOG_APPEND", "APPLY_RUN", "HANDOFF", "NOTIFY"} <= seen
    assert {"HANDOFF:CatchUp", "HANDOFF:PhaseChange", "NOTIFY:HELD", "NOTIFY:COMMITTED"} <= kinds
    verdicts = [r for t in sim_traces.values() for r in t.records if isinstance(r, ev.Verdict)]
    assert any(v.ok for v in verdicts) and any("certification conflict" in v.reason for v in verdicts)
    assert any(r.depth > 0 for t in sim_traces.values() for r in t.records)  # control-plane calls, nested


def test_simulation_traces_replay_to_the_same_actions(sim_traces: dict[str, Trace], impl: str) -> None:
    for name, t in sim_traces.items():
        d = check(t, impl=impl)
        assert d is None, f"{name} with {impl}:\n{d}"


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_traces_replay_to_the_same_actions(path: Path, impl: str) -> None:
    t = read_trace(path.read_bytes())
    d = check(t, impl=impl)
    assert d is None, f"{path.name} with {impl}:\n{d}"


def test_there_are_golden_traces() -> None:
    assert len(GOLDEN) >= 3 and sum(p.stat().st_size for p in GOLDEN) < 200_000


def test_replay_refuses_a_trace_without_its_start() -> None:
    with pytest.raises(TraceError, match="START"):
        replay(read_trace(_trace([ev.Tick()])))


# ---- a perturbed core is caught, readably ---------------------------------------------------


def _flipping(gid: int) -> type[PyCertifier]:
    """A certifier that gives the opposite verdict for ``gid`` (restored ones too)."""

    class Flipping(PyCertifier):
        def certify(self, g: int, origin: str, last_seen: int, keys: Any) -> Verdict:
            v = super().certify(g, origin, last_seen, keys)
            if g != gid:
                return v
            return Verdict(False, "flipped on purpose") if v.ok else OK

    return Flipping


def _first(traces: dict[str, Trace], pred: Callable[[Record], bool]) -> tuple[str, Trace, Record]:
    for name, t in sorted(traces.items()):
        for r in t.records:
            if pred(r):
                return name, t, r
    raise AssertionError("no trace has one")


def test_a_flipped_verdict_is_the_first_difference(sim_traces: dict[str, Trace]) -> None:
    name, t, v = _first(sim_traces, lambda r: isinstance(r, ev.Verdict) and r.ok)
    assert isinstance(v, ev.Verdict)
    r = replay(t, certifiers=_flipping(v.gid), impl="python")  # type: ignore[arg-type]
    d = compare(t.records, r.records, note=r.stopped or "")
    assert d is not None
    assert isinstance(d.got, ev.Verdict) and not d.got.ok and d.got.reason == "flipped on purpose"
    assert d.got.ticket == v.ticket and d.index <= t.records.index(v)
    text = str(d)
    assert f"first difference at record {d.index}" in text and "expected:" in text and "got:      VERDICT" in text
    assert "reason: expected '', got 'flipped on purpose'" in text and len(d.before) == 8
    print(f"{name}:\n{text}")


def test_a_conflict_turned_into_a_commit_is_caught(sim_traces: dict[str, Trace]) -> None:
    name, t, v = _first(sim_traces, lambda r: isinstance(r, ev.Verdict) and "certification conflict" in r.reason)
    assert isinstance(v, ev.Verdict)
    i = t.records.index(v)

    class Lenient(PyCertifier):
        def certify(self, g: int, origin: str, last_seen: int, keys: Any) -> Verdict:
            v = super().certify(g, origin, last_seen, keys)
            return OK if "certification conflict" in v.reason and origin == t.node else v

    d = check(t, certifiers=Lenient, schedulers=PyScheduler)
    assert d is not None and d.index <= i and d.expected is not None, str(d)


def test_a_scheduler_that_splits_runs_is_caught(sim_traces: dict[str, Trace]) -> None:
    name, t, run = _first(sim_traces, lambda r: isinstance(r, ev.ApplyRun) and len(r.run) > 1)

    class Alone(PyScheduler):
        def ready_runs(self, limit: int, max_run: int, fits: Optional[Callable[[list[int]], bool]] = None
                       ) -> list[list[int]]:
            return super().ready_runs(limit, 1, fits)

    d = check(t, schedulers=Alone, certifiers=PyCertifier)
    assert d is not None and isinstance(d.got, ev.ApplyRun) and isinstance(d.expected, ev.ApplyRun), str(d)
    assert len(d.got.run) == 1 < len(d.expected.run)


def test_a_core_that_fails_stops_the_replay_there(sim_traces: dict[str, Trace]) -> None:
    name, t, first = _first(sim_traces, lambda r: isinstance(r, ev.ApplyResult))

    class Broken(PyScheduler):
        def committed(self, gid: int) -> None:
            raise RuntimeError("broken on purpose")

    r = replay(t, schedulers=Broken, certifiers=PyCertifier)
    assert r.stopped is not None and "broken on purpose" in r.stopped
    d = compare(t.records, r.records, note=r.stopped)
    assert d is not None and "broken on purpose" in str(d)


