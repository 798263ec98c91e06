"""Partial recovery's decisions, without I/O (docs/RECOVERY.md, "Joining and partial recovery").

A catch-up runs as a generator, the way psycopg runs its protocol: it yields the step it needs
done (:class:`AskLogs`, :class:`Fetch`, :class:`Wait`, :class:`Act`, :class:`WaitCommitted`) and
is sent the result. catchup.py carries the steps out on the coordinator's event loop (the bus,
TLS streams, the clock); tests/sim/ on simulated ones. The records a partner streams go to
:meth:`CatchUpPlan.take`, which decides how each is admitted (alone, or in a run of consecutive
writesets applied as one transaction) through an :class:`Admission` (the commit pipeline and the
writeset log).

What it decides:
- which member to stream from (:func:`choose_partners`): one whose log holds the next GID and
  that has committed past it;
- when to wait: a member's log holds the next GID but no such member has committed it yet, a
  synced member's log reaches back far enough (it logs the next GID once it is released there),
  or not every member has answered;
- when partial recovery is impossible: every member of the primary component answered, no log
  holds the next GID and every synced member's log starts after it (the members' databases have
  it: total recovery from one of them);
- how long the live stream is held, and when the node says it is synced.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Optional, Protocol, Sequence, Union

from chorus.bus import proto as bp
from chorus import wire
from chorus.commit.book import RunBatcher
from chorus.recoveryproto import RecoveryError
from chorus.actions import Action, Apply, CatchUp, DdlOutcome, Phase
from chorus.replicator import Replicator
from chorus.spool import SPOOL_AT
from chorus.wslog import LogRecord

log = logging.getLogger("chorus.coordinator")

CATCHUP_WINDOW = 256  # catch-up transactions queued for apply at most; held live writesets streamed past
CATCHUP_BATCH_BYTES = 8 << 20  # a run of catch-up writesets applied as one transaction: at most this much
RELOAD_WAIT_S = 0.2  # a round that brought nothing: ask again after this


# ---- steps ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AskLogs:
    """Send a LogQuery; the result is the answers (LogInfo) collected until every one of
    ``members`` answered or a moment passed."""
    members: frozenset[str]


@dataclass(frozen=True)
class Fetch:
    """Stream ``(after, upto]`` from ``partner``'s recovery server, each record to
    :meth:`CatchUpPlan.take` with ``run`` (the catch-up asking); the result is the partner's safe
    stop, or RecoveryError is thrown."""
    partner: bp.LogInfo
    after: int
    upto: int
    run: object = None


@dataclass(frozen=True)
class Wait:
    seconds: float


@dataclass(frozen=True)
class Act:
    """Carry out the replicator's actions, in order."""
    actions: list[Action]


@dataclass(frozen=True)
class WaitCommitted:
    """Until this node has committed ``gid`` (or the catch-up is abandoned)."""
    gid: int


Step = Union[AskLogs, Fetch, Wait, Act, WaitCommitted]
Steps = Generator[Step, Any, None]


class Abandoned(Exception):
    """The catch-up is over: the node left the primary component, or another catch-up began.
    Nothing more is admitted for it (the node announced what it holds)."""


class Admission(Protocol):
    """Where catch-up records go: the commit pipeline and the writeset log."""

    @property
    def watermark(self) -> int: ...

    @property
    def admitted(self) -> int: ...

    @property
    def lanes(self) -> int: ...

    def log(self, rec: LogRecord) -> None:
        """Log ``rec`` (a member of the next run; written before the run is admitted)."""

    def admit_run(self, run: list[LogRecord], prev: int) -> None:
        """Admit ``run`` (logged already), certified after GID ``prev``, committed as one at its last GID."""

    def admit_one(self, rec: LogRecord, prev: int) -> None:
        """Log and admit ``rec`` alone (a schema change, or a large writeset), certified after ``prev``."""

    def settle(self, rec: LogRecord) -> None:
        """``rec`` is committed or pending here already: if it is a schema change this node applied
        and holds for every node's report (made while it was away), the member's record says what
        the cluster made of it (applied, or undone: FLAG_DDL_SKIPPED)."""


# ---- which partner ------------------------------------------------------------------------


def choose_partners(offers: Sequence[bp.LogInfo], after: int, preferred: Sequence[str]) -> list[bp.LogInfo]:
    """The members whose logs hold the range after ``after`` and that have committed past it
    (a partner streams only what it has committed: one still behind ``after`` would hand over
    nothing, round after round), best first: the configured preference order, then the least
    loaded (fewest writesets waiting to commit), then the one that has committed most."""
    usable = [o for o in offers if o.after_min <= after < o.committed and o.address]
    rank = {name: i for i, name in enumerate(preferred)}
    return sorted(usable, key=lambda o: (rank.get(o.partner, len(rank)), o.load, -o.committed, o.partner))


def coming(offers: Sequence[bp.LogInfo], after: int) -> list[bp.LogInfo]:
    """Members whose logs hold the GID after ``after`` but that have not committed it yet: what a
    log holds past its node's committed GID is admitted there and commits soon."""
    return [o for o in offers if o.after_min <= after < o.high and o.committed <= after and o.address]


@dataclass
class Progress:
    """How a catch-up goes, for status and the CLI."""
    after: int
    upto: int
    position: int = 0
    partner: str = ""
    records: int = 0
    bytes: int = 0
    started: float = field(default_factory=time.monotonic)
    finished: Optional[float] = None
    state: str = "choosing a partner"
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.position = self.after

    def as_dict(self) -> dict[str, object]:
        elapsed = max((self.finished or self.clock()) - self.started, 1e-6)
        done = self.position - self.after
        rate = done / elapsed
        to_go = max(0, self.upto - self.position)
        avg = self.bytes / self.records if self.records else 0
        return {"state": self.state, "partner": self.partner, "after": self.after, "upto": self.upto,
                "position": self.position, "gids_to_go": to_go, "bytes_received": self.bytes,
                "bytes_to_go_estimate": int(to_go * avg), "records": self.records,
                "rate_gids_per_s": round(rate, 1), "rate_mb_per_s": round(self.bytes / elapsed / 1e6, 2),
                "eta_s": round(to_go / rate, 1) if rate > 0 else None, "elapsed_s": round(elapsed, 1)}


# ---- the plan ---------------------------------------------------------------------------------


class _Run:
    """One catch-up: its range, the live stream held meanwhile, and how it goes."""

    def __init__(self, c: CatchUp, batch: int, clock: Callable[[], float]) -> None:
        self.c = c
        self.held: Optional[list[Action]] = []  # live actions held while catching up
        self.progress = Progress(c.after, c.upto, started=clock(), clock=clock)
        self.prev = c.after  # the last certified GID handed to apply: the next one's prev
        self.runs: RunBatcher[LogRecord] = RunBatcher(batch, CATCHUP_BATCH_BYTES)


class CatchUpPlan:
    """The node's catch-ups, one at a time (a new one abandons the one before)."""

    def __init__(self, node: str, replicator: Replicator, admission: Admission, partners: tuple[str, ...],
                 batch: int, has_keys: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.r = replicator
        self.admission = admission
        self.partners = partners
        self.batch = batch
        self.has_keys = has_keys
        self.clock = clock
        self.current: Optional[_Run] = None

    @property
    def held(self) -> Optional[list[Action]]:
        return self.current.held if self.current is not None else None

    @property
    def progress(self) -> Optional[Progress]:
        return self.current.progress if self.current is not None else None

    def start(self, c: CatchUp) -> Steps:
        """Begin catch-up ``c``: the live stream after c.upto is held from now on, before the
        steps first run (the actions carried out right after the CatchUp, in the same batch, are
        live writesets after the range: admitted before it, the range's commits would wait for
        them). Returns its steps."""
        run = self.current = _Run(c, self.batch, self.clock)
        return self._steps(run)

    def hold(self, a: Action) -> bool:
        """Whether live action ``a`` is held (it comes after the range being caught up)."""
        held = self.held
        if held is not None and isinstance(a, (Apply, DdlOutcome)):
            held.append(a)
            return True
        return False

    def live(self, run: Optional[_Run] = None) -> bool:
        """Whether the current catch-up (or ``run``) still goes on."""
        run = run or self.current
        return run is not None and run is self.current and self.r.phase == Phase.RECOVERING

    def take(self, rec: LogRecord, run: object = None) -> None:
        """A record from the partner, in GID order: admit it (in a run when it can be), or skip
        it if it is committed or admitted here already. ``run``: the catch-up whose Fetch brought
        it (default: the current one). Abandoned once that catch-up is over: the stream of one
        that a newer catch-up replaced goes on until a record it hands over is refused, and its
        records, in another order than the newer stream's, must not enter the newer one's runs
        (the lab's seed 17: a GID applied twice in one run, the node voted out)."""
        current = self.current
        if run is not None and run is not current:
            raise Abandoned(f"catch-up abandoned at GID {rec.gid} (a newer one began)")
        run = current
        if run is None or not self.live(run):
            raise Abandoned(f"catch-up abandoned at GID {rec.gid}")
        prog, a = run.progress, self.admission
        prog.position, prog.records, prog.bytes = rec.gid, prog.records + 1, prog.bytes + len(rec.payload)
        if rec.gid <= max(a.watermark, a.admitted):  # committed, or pending already
            a.settle(rec)
            run.prev = rec.gid
            return
        if (not wire.is_schema_change(rec.payload) and self.batch > 1 and a.lanes == 1
                and len(rec.payload) <= SPOOL_AT):  # a large one is applied alone, from a spool file
            a.log(rec)
            full = run.runs.add(rec, run.prev, len(rec.payload))
            run.prev = rec.gid
            if full:
                self._flush(run)
        else:
            self._flush(run)
            a.admit_one(rec, run.prev)
            run.prev = rec.gid

    def _flush(self, run: _Run) -> None:
        got = run.runs.take()
        if got is not None:
            self.admission.admit_run(*got)

    def _steps(self, run: _Run) -> Steps:
        """Stream the certified writesets in (c.after, c.upto] and admit them in order; meanwhile
        the live stream after c.upto is held. Then admit what was held and say the node is synced
        once everything up to c.upto is committed."""
        c, prog = run.c, run.progress
        try:
            target, backlog = c.upto, None
            while True:
                while prog.position < target:
                    if not self.live(run):
                        log.warning("catch-up stopped at GID %d: the node is %s", prog.position, self.r.phase.value)
                        return
                    before = prog.position
                    ok = yield from self._round(run, target)
                    if self.live(run):  # (what an abandoned one holds comes again in the next one)
                        self._flush(run)  # what this round brought, before waiting for more
                    if not ok:
                        return
                    if prog.position == before:
                        yield Wait(RELOAD_WAIT_S)  # nobody has committed further yet: reload
                    if target > c.upto:
                        break  # following the live stream: one round at a time
                # The live stream held meanwhile is in the members' logs too: rather than hold it
                # all in memory and apply it in one go, keep streaming while that shrinks it.
                assert run.held is not None
                run.held = [a for a in run.held if not (isinstance(a, Apply) and a.gid <= prog.position)]
                live = [a.gid for a in run.held if isinstance(a, Apply)]
                if len(live) <= CATCHUP_WINDOW or (backlog is not None and len(live) >= backlog):
                    break
                backlog, target = len(live), live[-1]
                prog.upto = target
            if not self.live(run):
                return
            prog.state = "applying"
            held, run.held = run.held, None
            self.r.held_released()
            yield Act(held or [])
            yield WaitCommitted(c.upto)
            if not self.live(run):
                return
            prog.state, prog.finished = "done", self.clock()
            log.info("caught up from GID %d to %d: %d writesets, %.1f MB from %s", c.after, c.upto,
                     prog.records, prog.bytes / 1e6, prog.partner)
            yield Act(self.r.recovered(self.admission.watermark))
        finally:
            if run.held is not None:
                run.held = None
            if prog.state != "done":
                prog.state, prog.finished = "failed", self.clock()

    def _round(self, run: _Run, upto: int) -> Generator[Step, Any, bool]:
        """One round of catch-up: ask who holds the range, stream from the best partner up to
        its safe stop. False (the node gave up: it needs total recovery) if nobody can help."""
        prog = run.progress
        if not self.has_keys:
            yield Act(self._impossible("this node has no recovery keys configured"))
            return False
        prog.state = "choosing a partner"
        members = frozenset(n for n in self.r.online if n != self.node)
        offers: list[bp.LogInfo] = yield AskLogs(members)
        if not self.live(run):
            return True  # the caller sees it
        partners = choose_partners(offers, prog.position, self.partners)
        if not partners:
            answered = {o.partner for o in offers}
            soon = coming(offers, prog.position) + [o for o in offers if o.partner in self.r.synced
                                                    and o.after_min <= prog.position and o.address]
            if soon:
                prog.state = (f"waiting for {', '.join(sorted({o.partner for o in soon}))} to commit past "
                              f"GID {prog.position}")
                return True  # their logs hold, or (synced) will hold, the next GID; not committed yet
            if not members or not members <= answered:
                prog.state = (f"waiting for {', '.join(sorted(members - answered)) or 'a member'} to say what its "
                              "log holds")
                return True
            held = "; ".join(f"{o.partner}'s log holds GIDs {o.after_min + 1}..{o.high}, it committed {o.committed}"
                             if o.high > o.after_min else f"{o.partner}'s log is empty after GID {o.after_min}"
                             for o in sorted(offers, key=lambda o: o.partner))
            yield Act(self._impossible(
                f"no member's writeset log holds the GIDs after {prog.position} ({held}); every member of the "
                "primary component answered, so the range is gone from every log, and the members' databases "
                "hold it"))
            return False
        for o in partners:
            prog.partner, prog.state = o.partner, "streaming"
            start = prog.position
            try:
                stop = yield Fetch(o, prog.position, upto, run)
            except RecoveryError as e:
                log.warning("catch-up from %s (%s) failed at GID %d: %s", o.partner, o.address, prog.position, e)
                continue
            prog.position = max(prog.position, stop)
            if prog.position > start:
                break  # else the next partner may get further
        return True

    def _impossible(self, why: str) -> list[Action]:
        """Partial recovery cannot bring this node back: it leaves the primary component and
        stays out until it is rebuilt."""
        return self.r.recovery_failed(f"partial recovery impossible: {why}; total recovery from a member is "
                                      "needed (chorus node join --total)")

    def status(self) -> Optional[dict[str, Any]]:
        return self.progress.as_dict() if self.progress is not None else None
