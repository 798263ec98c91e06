"""Local loses to remote (docs/ARCHITECTURE.md invariant 6): the loop that finds the local sessions whose
locks block the commit of a certified writeset, and aborts them. What to abort and how is the
policy in blockers.py; this module only asks PostgreSQL and acts."""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg

from chorus.blockers import Blocking, BlockerWatch
from chorus.concurrent import ConcurrentSchemaChanges
from chorus.nodedb import NodeDatabase
from chorus.nodestatus import Counters
from chorus.commit.pipeline import CommitPipeline

log = logging.getLogger("chorus.coordinator")

BLOCKER_CHECK_S = 0.005  # how often (and after how long) applies have their lock blockers checked

_BLOCKERS = ("SELECT w.pid, a.pid, a.state, a.xact_start FROM unnest(%s::int[]) AS w(pid),"
             " unnest(pg_blocking_pids(w.pid)) AS b(pid) JOIN pg_stat_activity a ON a.pid = b.pid")


async def watch_blockers(db: NodeDatabase, pipeline: CommitPipeline, concurrent: ConcurrentSchemaChanges,
                         counters: Counters, idle_grace_s: float) -> None:
    """Every BLOCKER_CHECK_S while a session commits a certified writeset, one query asks what
    blocks those that have been running a while (apply sessions, and the backend of a schema
    change while it runs); the watch says which local sessions to abort and how. While none
    does, it sleeps until one does (no wake-up every BLOCKER_CHECK_S for nothing: on a node that
    applies nothing, as a lone node, that was 200 wake-ups a second). Runs until cancelled."""
    watch = BlockerWatch(idle_grace_s)
    waiters = pipeline.waiters
    loop = asyncio.get_running_loop()
    while True:
        for g in [g for g in waiters if g not in pipeline.pending]:
            del waiters[g]
        if not waiters:
            await waiters.added(loop)
        await asyncio.sleep(BLOCKER_CHECK_S)
        if db.conn is None or not db.ok.is_set():
            continue
        now = time.monotonic()
        for g in [g for g in waiters if g not in pipeline.pending]:
            del waiters[g]
        waiting = {w.pid(): g for g, w in waiters.items() if now - w.since >= BLOCKER_CHECK_S and w.pid()}
        watch.forget(waiting.values())
        if not waiting:
            continue
        try:
            rows = await db.q_all(_BLOCKERS, (list(waiting),))
            # appliers, and the sessions running other nodes' index builds, are never touched
            appliers = {w.pid for w in pipeline.sessions()} | set(concurrent.pids.values())
            certified = {p.backend.pid: g for g, p in pipeline.pending.items() if p.backend is not None}
            for a in watch.decide([Blocking(*row) for row in rows], waiting, appliers, certified, time.monotonic()):
                if a.note:
                    (log.warning if a.warning else log.info)("%s", a.note)
                if await db.q("SELECT chorus.abort_local(%s, %s, %s)", (a.pid, a.gid, a.how)) and a.counts:
                    counters.local_aborts += 1
        except psycopg.Error as e:
            log.warning("checking what blocks the appliers: %s", str(e).strip())
