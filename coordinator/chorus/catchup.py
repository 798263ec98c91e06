"""Partial recovery, the joining side (docs/RECOVERY.md): carries out the steps of a catch-up
(catchupplan.py decides them) on the coordinator's event loop: the LogQuery through the bus and
the answers, the TLS stream from a partner's recovery server (recovery.py), the waits, and the
admission of the streamed records into the commit pipeline and the writeset log. Each writeset
is only scanned here, never decoded; a run is applied as one transaction by the apply function's
run form, as a live run is.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from typing import Any, Awaitable, Callable, Coroutine, Optional

from chorus.bus import proto as bp
from chorus import recovery as rc
from chorus import wire
from chorus.catchupplan import (CATCHUP_WINDOW, Abandoned, Act, AskLogs, CatchUpPlan, Fetch, Steps, Wait,
                                WaitCommitted)
from chorus.commit.pipeline import CommitPipeline, Pending
from chorus.actions import Action, CatchUp
from chorus.replicator import Replicator
from chorus.spool import Spool
from chorus.wslog import FLAG_DDL_SKIPPED, LogFeeder, LogRecord

log = logging.getLogger("chorus.coordinator")

LOG_QUERY_WAIT_S = 1.0  # how long a recovering node collects answers to its LogQuery


def _scan(rec: LogRecord) -> wire.Writeset:
    """A record's writeset, checked and scanned (its rows are read by the apply function)."""
    try:
        return wire.scan(rec.payload)
    except wire.WireError as e:
        raise rc.RecoveryError(f"GID {rec.gid} from the partner's log does not decode: {e}") from e


class PipelineAdmission:
    """catchupplan.Admission: catch-up records into the commit pipeline and the writeset log."""

    def __init__(self, pipeline: CommitPipeline, feeder: LogFeeder) -> None:
        self.pipeline = pipeline
        self.feeder = feeder

    @property
    def watermark(self) -> int:
        return self.pipeline.watermark

    @property
    def admitted(self) -> int:
        return self.pipeline.book.admitted

    @property
    def lanes(self) -> int:
        return self.pipeline.book.lanes

    def log(self, rec: LogRecord) -> None:
        self.feeder.certified(rec.gid, rec.origin, rec.payload, False, rec.commit_time)

    def admit_run(self, run: list[LogRecord], prev: int) -> None:
        self.feeder.flush()  # logged before anything of it can commit
        scanned = tuple(_scan(rec) for rec in run)
        self.pipeline.admit_run(Pending(run[-1].gid, prev, run[-1].origin, scanned[-1], before=scanned[:-1],
                                        before_gids=tuple(r.gid for r in run[:-1]), commit_time=run[-1].commit_time))
        self.pipeline.dispatch()

    def settle(self, rec: LogRecord) -> None:
        self.pipeline.settle_from_log(rec.gid, not rec.flags & FLAG_DDL_SKIPPED)

    def admit_one(self, rec: LogRecord, prev: int) -> None:
        # a schema change undone everywhere (its nodes' reports) commits its GID empty
        p = Pending(rec.gid, prev, rec.origin, _scan(rec), skip=bool(rec.flags & FLAG_DDL_SKIPPED),
                    commit_time=rec.commit_time)
        self.pipeline.admit(p, local=False)
        if p.ddl_known is not None:  # the log records a failed schema change as skipped
            p.ddl_ok = not rec.flags & FLAG_DDL_SKIPPED
            self.feeder.outcome(rec.gid, p.ddl_ok)
            p.ddl_known.set()
        self.feeder.flush()
        self.pipeline.dispatch()


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
        self.keys = keys
        self.plan = CatchUpPlan(node, replicator, PipelineAdmission(pipeline, feeder), partners, batch,
                                keys is not None)
        self._send = send
        self._act = act
        self._stopping = stopping
        self._failed = failed
        self._offers: dict[str, list[bp.LogInfo]] = {}

    @property
    def held(self) -> Optional[list[Action]]:
        """The live actions held while catching up (None when no catch-up holds them)."""
        return self.plan.held

    def hold(self, a: Action) -> bool:
        return self.plan.hold(a)

    def offered(self, info: bp.LogInfo) -> None:
        """A member answered this node's LogQuery."""
        if info.request_id in self._offers:
            self._offers[info.request_id].append(info)

    def start(self, c: CatchUp) -> Coroutine[Any, Any, None]:
        """Begin catch-up ``c`` (the live stream after c.upto is held from now on: see
        CatchUpPlan.start). Returns the task to run."""
        return self._drive(self.plan.start(c))

    async def _drive(self, steps: Steps) -> None:
        result: Any = None
        error: Optional[BaseException] = None
        try:
            while not self._stopping.is_set():
                try:
                    step = steps.send(result) if error is None else steps.throw(error)
                except StopIteration:
                    return
                result, error = None, None
                if isinstance(step, AskLogs):
                    result = await self._ask_logs(step)
                elif isinstance(step, Fetch):
                    assert self.keys is not None  # the plan gives up without them
                    try:
                        result = await rc.fetch(step.partner.address, self.keys, self.r.cluster_uuid, self.node,
                                                step.after, step.upto, functools.partial(self._take, run=step.run),
                                                self.spool)
                    except rc.RecoveryError as e:
                        error = e
                elif isinstance(step, Wait):
                    await asyncio.sleep(step.seconds)
                elif isinstance(step, Act):
                    await self._act(step.actions)
                elif isinstance(step, WaitCommitted):
                    while self.pipeline.watermark < step.gid and not self._failed() and self.plan.live():
                        await asyncio.sleep(0.02)
        except Abandoned as e:
            log.info("%s", e)
        finally:
            steps.close()

    async def _take(self, rec: LogRecord, run: object) -> None:
        self.plan.take(rec, run)
        while len(self.pipeline.pending) > CATCHUP_WINDOW and not self._failed():
            await asyncio.sleep(0.005)

    async def _ask_logs(self, step: AskLogs) -> list[bp.LogInfo]:
        """Which members' logs hold what: a LogQuery through the bus, answers for a moment."""
        rid = uuid.uuid4().hex
        self._offers[rid] = []
        self._send(bp.LogQuery(self.node, rid))
        deadline = time.monotonic() + LOG_QUERY_WAIT_S
        while time.monotonic() < deadline and not step.members <= {o.partner for o in self._offers[rid]}:
            await asyncio.sleep(0.02)
        return self._offers.pop(rid)

    def status(self) -> Optional[dict[str, Any]]:
        return self.plan.status()
