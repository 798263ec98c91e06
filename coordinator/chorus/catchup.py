"""Partial recovery, the joining side (docs/RECOVERY.md): stream the certified writesets a node
missed from a member's writeset log and apply them in order, while the live stream after them is
held; then apply what was held and go online.

The donor side is recovery.py's server; which partner to ask is recovery.choose_partners, and
how consecutive writesets are batched into runs is commitbook.RunBatcher. A run is applied
as one transaction by the apply function's run form, as a live run is; each writeset is only
scanned here, never decoded.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Awaitable, Callable, Coroutine, Optional

from chorus import busproto as bp
from chorus import recovery as rc
from chorus import wire
from chorus.commitbook import RunBatcher
from chorus.pipeline import CommitPipeline, Pending
from chorus.replicator import Action, Apply, CatchUp, Phase, Replicator
from chorus.spool import SPOOL_AT, Spool
from chorus.wslog import FLAG_DDL_SKIPPED, LogFeeder, LogRecord

log = logging.getLogger("chorus.coordinator")

LOG_QUERY_WAIT_S = 1.0  # how long a recovering node collects answers to its LogQuery
# Only online members answer a LogQuery: when none does (the others may be catching up too, after a
# partition heals), the node asks again for this long before it concludes no log can help it.
NO_ANSWER_GRACE_S = 30.0
CATCHUP_WINDOW = 256  # catch-up transactions queued for apply at most
CATCHUP_BATCH_BYTES = 8 << 20  # a run of catch-up writesets applied as one transaction: at most this much


def _scan(rec: LogRecord) -> wire.Writeset:
    """A record's writeset, checked and scanned (its rows are read by the apply function)."""
    try:
        return wire.scan(rec.payload)
    except wire.WireError as e:
        raise rc.RecoveryError(f"GID {rec.gid} from the partner's log does not decode: {e}") from e


class CatchUpRunner:
    """Runs the node's catch-ups, one at a time. ``act`` carries out replicator actions (the
    daemon's); ``failed()`` says the node is stopping on a fatal error."""

    def __init__(self, node: str, replicator: Replicator, pipeline: CommitPipeline, feeder: LogFeeder,
                 keys: Optional[rc.ClusterKeys], partners: tuple[str, ...], batch: int,
                 send: Callable[[bp.Message], None], act: Callable[[list[Action]], Awaitable[None]],
                 stopping: asyncio.Event, failed: Callable[[], bool], spool: Optional[Spool] = None) -> None:
        self.node = node
        self.spool = spool  # where a large record from the partner is gathered (spool.py)
        self.r = replicator
        self.pipeline = pipeline
        self.feeder = feeder
        self.keys = keys
        self.partners = partners
        self.batch = batch
        self._send = send
        self._act = act
        self._stopping = stopping
        self._failed = failed
        self.progress: Optional[rc.Progress] = None  # the current or last catch-up
        self._unanswered_since: Optional[float] = None  # since when no member answered (NO_ANSWER_GRACE_S)
        self.held: Optional[list[Action]] = None  # live actions held while catching up
        self._offers: dict[str, list[bp.LogInfo]] = {}

    def offered(self, info: bp.LogInfo) -> None:
        """A member answered this node's LogQuery."""
        if info.request_id in self._offers:
            self._offers[info.request_id].append(info)

    def start(self, c: CatchUp) -> Coroutine[Any, Any, None]:
        """Begin catch-up ``c``: the live stream after c.upto is held from now on, before the
        catch-up task first runs (the actions acted on right after the CatchUp, in the same
        batch, are live writesets after the range: admitted before it, the range's commits would
        wait for them). Returns the task to run."""
        self.held = []
        self.progress = rc.Progress(c.after, c.upto)
        return self._run(c, self.progress)

    async def _run(self, c: CatchUp, prog: rc.Progress) -> None:
        """Stream the certified writesets in (c.after, c.upto] and apply them in order (in
        parallel where independent, like live ones); meanwhile the live stream after c.upto is
        held. Then apply what was held and go online once everything up to c.upto is committed."""
        r, pipeline = self.r, self.pipeline
        assert self.held is not None
        self._unanswered_since = None
        prev = c.after  # the last certified GID handed to apply: the next one's prev
        runs: RunBatcher[LogRecord] = RunBatcher(self.batch, CATCHUP_BATCH_BYTES)

        def flush() -> None:
            self.feeder.flush()  # logged before anything of it can commit
            got = runs.take()
            if got is None:
                return
            run, before = got
            scanned = tuple(_scan(rec) for rec in run)
            pipeline.admit_run(Pending(run[-1].gid, before, run[-1].origin, scanned[-1], before=scanned[:-1],
                                       before_gids=tuple(r.gid for r in run[:-1])))
            pipeline.dispatch()

        async def take(rec: LogRecord) -> None:
            nonlocal prev
            prog.position, prog.records, prog.bytes = rec.gid, prog.records + 1, prog.bytes + len(rec.payload)
            if rec.gid <= max(pipeline.watermark, pipeline.book.admitted):  # committed, or pending already
                # (a schema change this node applied and holds, reported on while it was away: the
                # member's record says what the cluster made of it)
                pipeline.settle_from_log(rec.gid, not rec.flags & FLAG_DDL_SKIPPED)
                prev = rec.gid
                return
            if (not wire.is_schema_change(rec.payload) and self.batch > 1 and pipeline.book.lanes == 1
                    and len(rec.payload) <= SPOOL_AT):  # a large one is applied alone, from a spool file
                self.feeder.certified(rec.gid, rec.origin, rec.payload, False)
                full = runs.add(rec, prev, len(rec.payload))
                prev = rec.gid
                if full:
                    flush()
            else:
                flush()
                # a schema change undone everywhere (its nodes' reports) commits its GID empty
                p = Pending(rec.gid, prev, rec.origin, _scan(rec), skip=bool(rec.flags & FLAG_DDL_SKIPPED))
                pipeline.admit(p, local=False)
                if p.ddl_known is not None:  # the log records a failed schema change as skipped
                    p.ddl_ok = not rec.flags & FLAG_DDL_SKIPPED
                    self.feeder.outcome(rec.gid, p.ddl_ok)
                    p.ddl_known.set()
                prev = rec.gid
                self.feeder.flush()
                pipeline.dispatch()
            while len(pipeline.pending) > CATCHUP_WINDOW and not self._failed():
                await asyncio.sleep(0.005)

        try:
            target, backlog = c.upto, None
            while True:
                while prog.position < target:
                    if r.phase != Phase.RECOVERING or self._stopping.is_set():
                        log.warning("catch-up stopped at GID %d: the node is %s", prog.position, r.phase.value)
                        return
                    before = prog.position
                    ok = await self._fetch_round(prog, target, take)
                    flush()  # what this round brought, before waiting for more
                    if not ok:
                        return
                    if prog.position == before:
                        await asyncio.sleep(0.2)  # the partner has not committed further yet: reload
                    if target > c.upto:
                        break  # following the live stream: one round at a time
                # The live stream held meanwhile is in the members' logs too: rather than hold it
                # all in memory and apply it in one go, keep streaming while that shrinks it.
                self.held = [a for a in self.held if not (isinstance(a, Apply) and a.gid <= prog.position)]
                live = [a.gid for a in self.held if isinstance(a, Apply)]
                if len(live) <= CATCHUP_WINDOW or (backlog is not None and len(live) >= backlog):
                    break
                backlog, target = len(live), live[-1]
                prog.upto = target
            prog.state = "applying"
            held, self.held = self.held, None
            await self._act(held)
            while pipeline.watermark < c.upto and not self._failed():
                await asyncio.sleep(0.02)
            prog.state, prog.finished = "done", time.monotonic()
            log.info("caught up from GID %d to %d: %d writesets, %.1f MB from %s", c.after, c.upto,
                     prog.records, prog.bytes / 1e6, prog.partner)
            await self._act(r.recovered())
        finally:
            if self.held is not None:
                self.held = None
                if prog.state != "done":
                    prog.state, prog.finished = "failed", time.monotonic()

    async def _ask_logs(self) -> list[bp.LogInfo]:
        """Which members' logs hold what: a LogQuery through the bus, answers for a moment."""
        rid = uuid.uuid4().hex
        self._offers[rid] = []
        self._send(bp.LogQuery(self.node, rid))
        deadline = time.monotonic() + LOG_QUERY_WAIT_S
        others = len([n for n in self.r.online if n != self.node])
        while time.monotonic() < deadline and len(self._offers[rid]) < others:
            await asyncio.sleep(0.02)
        return self._offers.pop(rid)

    async def _fetch_round(self, prog: rc.Progress, upto: int,
                           take: Callable[[LogRecord], Awaitable[None]]) -> bool:
        """One round of catch-up: ask who holds the range, stream from the best partner up to
        its safe stop. False (and the node marked as needing total recovery) if nobody can."""
        r = self.r
        if self.keys is None:
            return await self._impossible("this node has no recovery keys configured")
        prog.state = "choosing a partner"
        offers = await self._ask_logs()
        if offers:
            self._unanswered_since = None
        else:
            self._unanswered_since = self._unanswered_since or time.monotonic()
            if time.monotonic() - self._unanswered_since < NO_ANSWER_GRACE_S:
                prog.state = "waiting for an online member to answer"
                return True  # no progress: the caller waits a moment and asks again
        partners = rc.choose_partners(offers, prog.position, self.partners)
        if not partners:
            if any(o.after_min <= prog.position for o in offers):
                prog.state = f"waiting for a partner to commit past GID {prog.position}"
                return True  # their logs hold the range; they have not committed it yet
            held = ", ".join(f"{o.partner} after GID {o.after_min}" for o in offers) or "no member answered"
            return await self._impossible(f"no member's writeset log holds the GIDs after {prog.position} ({held})")
        for o in partners:
            prog.partner, prog.state = o.partner, "streaming"
            try:
                start = prog.position
                stop = await rc.fetch(o.address, self.keys, r.cluster_uuid, self.node, prog.position, upto, take,
                                      self.spool)
                prog.position = max(prog.position, stop)
                if prog.position > start:
                    break  # else the next partner may get further
            except rc.RecoveryError as e:
                log.warning("catch-up from %s (%s) failed at GID %d: %s", o.partner, o.address, prog.position, e)
        return True

    async def _impossible(self, why: str) -> bool:
        """Partial recovery cannot bring this node back: it needs total recovery. False."""
        await self._act(self.r.recovery_failed(
            f"partial recovery impossible: {why}; total recovery is needed (chorus node join --total)"))
        return False

    def status(self) -> Optional[dict[str, Any]]:
        return self.progress.as_dict() if self.progress is not None else None
