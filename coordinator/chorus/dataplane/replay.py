"""Replay a trace through a fresh core and compare (docs/NATIVE.md 4.1, 4.4).

:func:`replay` makes a :class:`refcore.RefCore` from the trace's ``START``, with the certifier and
scheduler implementations asked for, and feeds it the trace's events in their places: the
top-level ones in order; the nested ones (fed by the control plane while it carried out an
action) when the core produces that action; the random bits when the core draws. It records
everything the core taps and stops at the first record that differs from the trace, or at the
first exception. :func:`compare` then names the first difference, with the records before it.

    python -m chorus.dataplane.replay TRACE... [--impl python|cython|native]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from chorus.certifier import CertifierClass, PyCertifier
from chorus.commit.scheduler import ApplyScheduler, PyScheduler
from chorus.dataplane import events as ev
from chorus.dataplane.events import Record, TraceError
from chorus.dataplane.refcore import RefCore
from chorus.dataplane.trace import Trace, encode_record, load

IMPLS = ("python", "cython", "native")


def implementations(name: str) -> tuple[CertifierClass, Callable[[], ApplyScheduler]]:
    """The certifier class and scheduler factory of implementation ``name``: ``python`` (the
    references), ``cython`` (``_ccert``, ``_csched``) or ``native`` (``dataplane/native``: the C
    certification index and scheduler). ImportError when it is not built."""
    if name == "python":
        return PyCertifier, PyScheduler
    if name == "cython":
        from chorus import _ccert, _csched
        return _ccert.Certifier, _csched.Scheduler
    if name == "native":
        from chorus.dataplane import native
        if not native.available():
            raise ImportError("the data plane's C core is not built (python coordinator/chorus/dataplane/build.py)")
        return native.NativeCertifier, native.NativeScheduler  # type: ignore[return-value]
    raise ValueError(f"implementation {name!r}: expected one of {', '.join(IMPLS)}")


class _Diverged(Exception):
    pass


@dataclass
class Replayed:
    """What a replay produced: every record the core tapped (the START first), and why it
    stopped early (None: it went through the whole trace)."""

    records: list[Record] = field(default_factory=list)
    stopped: Optional[str] = None


def replay(trace: Trace, *, certifiers: Optional[CertifierClass] = None,
           schedulers: Optional[Callable[[], ApplyScheduler]] = None, impl: Optional[str] = None,
           orders: Optional[Callable[..., Any]] = None) -> Replayed:
    """Drive a fresh core from ``trace``'s events (see the module's docstring). ``impl`` names
    both implementations at once; ``certifiers`` and ``schedulers`` override it; neither: the
    ones ``CHORUS_IMPL`` chose. ``orders``: the order core's implementation (dataplane/order.py's
    OrderCore unless told; native.NativeOrderCore is the C one)."""
    if impl is not None:
        c, s = implementations(impl)
        certifiers, schedulers = certifiers or c, schedulers or s
    recs = trace.records
    if not recs or not isinstance(recs[0], ev.Start):
        raise TraceError("a trace starts with its core's START")
    out = Replayed()
    pos = 1

    def at() -> Optional[Record]:
        return recs[pos] if pos < len(recs) else None

    def sink(a: Record) -> None:
        nonlocal pos
        want = at()
        if want is None or encode_record(want) != encode_record(a):
            raise _Diverged(f"the core produced a {a.name} that is not the trace's next record" if want is not None
                            else f"the core produced a {a.name} after the trace's end")
        pos += 1
        nested(a.depth + 1)

    def nested(depth: int) -> None:
        nonlocal pos
        while True:
            e = at()
            if e is None or not e.is_event or e.depth != depth or isinstance(e, ev.Random):
                return
            pos += 1
            core.step(e)

    def bits() -> bytes:
        nonlocal pos
        e = at()
        if not isinstance(e, ev.Random):
            raise _Diverged(f"the core drew random bits where the trace has {e.name if e is not None else 'its end'}")
        pos += 1
        core.step(e)
        return e.bits

    start = recs[0]
    assert isinstance(start, ev.Start)
    core = RefCore(start, sink, tap=out.records.append, mono=start.mono, wall=start.wall,
                   certifiers=certifiers, schedulers=schedulers, orders=orders)
    core.draw_from(bits)
    try:
        while pos < len(recs):
            e = recs[pos]
            if not e.is_event or e.depth != 0 or isinstance(e, ev.Random):
                raise _Diverged(f"the trace has {e.name} (depth {e.depth}) here, which the core did not produce")
            pos += 1
            core.step(e)
    except _Diverged as d:
        out.stopped = str(d)
    except Exception as x:  # the core failed where the recorded one did not
        out.stopped = f"the core raised {type(x).__name__}: {x}"
    return out


@dataclass(frozen=True)
class Difference:
    """The first place where two record streams differ."""

    index: int
    expected: Optional[Record]
    got: Optional[Record]
    before: tuple[Record, ...]
    note: str = ""

    def fields(self) -> list[str]:
        """The fields that differ, when both records are of one kind."""
        e, g = self.expected, self.got
        if e is None or g is None or type(e) is not type(g):
            return []
        names = [n for n, _ in e.SPEC] + ["depth", "seq", "mono", "wall"]
        return [f"{n}: expected {getattr(e, n)!r:.200}, got {getattr(g, n)!r:.200}"
                for n in names if getattr(e, n) != getattr(g, n)]

    def __str__(self) -> str:
        lines = [f"first difference at record {self.index}" + (f" ({self.note})" if self.note else "") + ":"]
        lines += ["    " + ev.describe(r) for r in self.before]
        lines.append("  expected: " + (ev.describe(self.expected) if self.expected is not None else "(the end)"))
        lines.append("  got:      " + (ev.describe(self.got) if self.got is not None else "(nothing: the replay stopped)"))
        lines += ["    " + f for f in self.fields()]
        return "\n".join(lines)


def compare(expected: Sequence[Record], got: Sequence[Record], context: int = 8,
            note: str = "") -> Optional[Difference]:
    """None if the two streams are equal record for record (bytes and header), else the first
    difference with the ``context`` records before it."""
    for i in range(max(len(expected), len(got))):
        e = expected[i] if i < len(expected) else None
        g = got[i] if i < len(got) else None
        if e is None or g is None or encode_record(e) != encode_record(g):
            return Difference(i, e, g, tuple(expected[max(0, i - context):i]), note)
    return None


def check(trace: Trace, **impls: object) -> Optional[Difference]:
    """Replay ``trace`` (``impls``: :func:`replay`'s options) and compare it with its record."""
    r = replay(trace, **impls)  # type: ignore[arg-type]
    return compare(trace.records, r.records, note=r.stopped or "")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--impl", choices=IMPLS, action="append", help="implementations to replay with (default: all built)")
    args = ap.parse_args(argv)
    impls = args.impl or [n for n in IMPLS if _built(n)]
    bad = 0
    for path in args.traces:
        t = load(path)
        for name in impls:
            d = check(t, impl=name)
            print(f"{path} [{name}]: {len(t.records)} records, " + ("same" if d is None else f"DIFFERENT\n{d}"))
            bad += d is not None
    return 1 if bad else 0


def _built(name: str) -> bool:
    try:
        implementations(name)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
