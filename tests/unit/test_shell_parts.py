"""The coordinator's parts that decide without a database: causal-read markers (commit/causal.py),
inconsistency voting (voting.py), the bus sender's batching (bus/sender.py) and the commit
pipeline's admission (commit/pipeline.py), each built alone with what the daemon would give it
(issue 20: no part reaches another through a shared self)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Coroutine

from chorus.commit import backendproto as bpf
from chorus import wire
from chorus.bus import proto as bp
from chorus.bus import BusError
from chorus.bus.sender import BATCH_BYTES, BusSender, OwnMessages
from chorus.commit.book import CommitBook
from chorus.commit.causal import CausalReads
from chorus.concurrent import ConcurrentSchemaChanges
from chorus.nodestatus import Counters
from chorus.commit.pipeline import CommitPipeline, Hooks, Pending, reschedule
from chorus.actions import LocalVerdict, SyncReached, VoteDecided
from chorus.commit.scheduler import Scheduler
from chorus.voting import InconsistencyVoting
from chorus.wslog import LogFeeder, WritesetLog


class Reader:
    def __init__(self) -> None:
        self.closed = False
        self.frames: list[bytes] = []

    def send(self, frame: bytes) -> None:
        self.frames.append(frame)


def _kind_gid(frame: bytes) -> tuple[int, int]:
    assert frame[4:5] == bpf.FrameType.VERDICT.value
    return frame[5], int.from_bytes(frame[6:14], "big")


def test_causal_readers_share_a_marker_and_learn_its_gid() -> None:
    sent: list[bp.Message] = []
    c = CausalReads("n1", sent.append)
    a, b, late = Reader(), Reader(), Reader()
    c.request(a)
    c.request(b)  # while the first marker is on the bus: it waits for the next
    assert sent == [bp.SyncMarker("n1", 1)]
    c.reached(SyncReached(1, 42, True))
    assert [_kind_gid(f) for f in a.frames] == [(bpf.VERDICT_COMMIT, 42)]
    assert sent == [bp.SyncMarker("n1", 1), bp.SyncMarker("n1", 2)]  # b's marker
    c.request(late)
    c.view_changed()  # marker 2 will never be delivered: a new one carries b and late
    assert sent[-1] == bp.SyncMarker("n1", 3)
    c.reached(SyncReached(2, 50, True))  # a stale token answers nobody
    assert b.frames == [] and late.frames == []
    c.reached(SyncReached(3, 0, False))
    assert [_kind_gid(f)[0] for f in b.frames + late.frames] == [bpf.VERDICT_REFUSED] * 2


class Votes:
    def __init__(self, watermark: int) -> None:
        self.sent: list[bp.Message] = []
        self.decisions: dict[int, bool] = {}
        self.watermark = watermark
        self.skipped: list[int] = []
        self.left: list[str] = []

    def voting(self) -> InconsistencyVoting:
        return InconsistencyVoting("n1", self.sent.append, self.decisions.get, lambda: self.watermark,
                                   self.skipped.append, self.left.append)


def test_a_node_votes_once_it_has_committed_the_gid() -> None:
    v = Votes(watermark=5)
    voting = v.voting()
    voting.opened(5)
    voting.opened(7)  # not committed here yet: the vote waits
    assert v.sent == [bp.Vote("n1", 5, True)]
    voting.committed_here(7)
    assert v.sent[-1] == bp.Vote("n1", 7, True)


def test_a_failed_apply_leaves_if_the_majority_applied_it_and_commits_empty_if_not() -> None:
    def scenario(majority_applied: bool) -> Votes:
        v = Votes(watermark=9)
        voting = v.voting()
        voting.apply_failed(10, "boom")
        voting.apply_failed(10, "boom")  # a retry of the same GID votes once
        assert v.sent == [bp.Vote("n1", 10, False, "boom")] and v.skipped == [] and v.left == []
        voting.decided(VoteDecided(10, majority_applied, ""))
        return v

    applied = scenario(True)
    assert applied.skipped == [] and "the majority applied it" in applied.left[0]
    failed = scenario(False)
    assert failed.skipped == [10] and failed.left == []


def test_a_vote_due_is_sent_once_the_node_has_committed_the_gid_however_it_learnt_so() -> None:
    v = Votes(watermark=5)
    voting = v.voting()
    voting.opened(7)
    assert v.sent == []
    v.watermark = 9  # the database shows it committed (no apply of this node reported it)
    voting.check_due()
    assert v.sent == [bp.Vote("n1", 7, True)]
    voting.check_due()
    assert len(v.sent) == 1


def test_a_node_that_applied_what_the_majority_could_not_leaves() -> None:
    v = Votes(watermark=12)
    voting = v.voting()
    voting.decided(VoteDecided(11, False, ""))
    assert "could not apply it and this node did" in v.left[0]


class Bus:
    def __init__(self, takes: bool) -> None:
        self.takes = takes
        self.now: list[bytes] = []
        self.later: list[bytes] = []

    def send_nowait(self, payload: bytes) -> bool:
        if self.takes:
            self.now.append(payload)
        return self.takes

    async def send(self, payload: bytes) -> None:
        raise BusError("down")


def test_local_writesets_leave_one_message_at_a_time_in_batches() -> None:
    async def scenario() -> tuple[Bus, list[int]]:
        bus = Bus(takes=True)
        failed: list[int] = []
        s = BusSender("n1", asyncio.create_task, lambda tickets, e: failed.extend(tickets))
        s.attach(bus, asyncio.get_running_loop())  # type: ignore[arg-type]
        for t in range(1, 4):
            s.queue_writeset(t, b"x" * 10)
        await asyncio.sleep(0)
        assert len(bus.now) == 1 and s.batches == 1  # the first pump sends all three together
        for t in range(4, 7):
            s.queue_writeset(t, b"y" * (BATCH_BYTES // 2))
        await asyncio.sleep(0)
        assert len(bus.now) == 1  # one message in flight: the next waits for its delivery
        s.delivered_own(bus.now[0])
        s.pump()
        assert len(bus.now) == 2 and s.writesets == 5  # two half-batches fit in one message
        return bus, failed

    bus, failed = asyncio.run(scenario())
    assert [bp.decode(m).__class__.__name__ for m in bus.now] == ["WritesetBatch", "WritesetBatch"]
    assert failed == []


def test_a_batch_the_bus_cannot_take_fails_its_tickets() -> None:
    async def scenario() -> list[int]:
        failed: list[int] = []
        s = BusSender("n1", asyncio.create_task, lambda tickets, e: failed.extend(tickets))
        s.attach(Bus(takes=False), asyncio.get_running_loop())  # type: ignore[arg-type]
        s.queue_writeset(1, b"a")
        s.queue_writeset(2, b"b")
        for _ in range(5):
            await asyncio.sleep(0)
        return failed

    assert asyncio.run(scenario()) == [1, 2]


def test_writesets_the_bus_lost_at_a_view_change_are_known_once_a_later_message_comes_back() -> None:
    """Per sender the bus delivers in the order sent; a message it loses at a view change (the
    other side of a partition may have delivered it) never comes back. Once a later message of
    the node does, the local writesets sent before it have an unknown outcome: their backends
    are told instead of waiting for good (a simulated client's COMMIT waited so)."""
    async def scenario() -> tuple[list[int], list[int], int]:
        bus = Bus(takes=True)
        s = BusSender("n1", asyncio.create_task, lambda tickets, e: None)
        s.attach(bus, asyncio.get_running_loop())  # type: ignore[arg-type]
        s.queue_writeset(1, b"a")
        s.queue_writeset(2, b"b")
        await asyncio.sleep(0)
        s.view_changed()
        s.queue_writeset(3, b"c")
        await asyncio.sleep(0)
        s.send(bp.Received("n1", 7))
        assert len(bus.now) == 3
        first = s.delivered_own(bus.now[1])  # the batch of 1 and 2 never came back
        again = s.delivered_own(bus.now[2])
        return first, again, len(s.own)

    first, again, left = asyncio.run(scenario())
    assert first == [1, 2] and again == [] and left == 0


def test_own_messages_a_message_not_posted_loses_nothing() -> None:
    own = OwnMessages()
    own.posted(b"one", [1])
    own.posted(b"two", [2])
    assert own.delivered(b"three") == [] and len(own) == 2
    own.failed(b"one")
    assert own.delivered(b"two") == [] and len(own) == 0


def test_a_catch_up_run_is_scheduled_by_the_keys_of_all_its_writesets(tmp_path: Path) -> None:
    """A catch-up run (commit.book.RunBatcher) is admitted as one pending entry holding every
    writeset of it, scanned, not merged: what comes after waits for it if it shares a key with
    any of them, and its apply hands all of them, in order, to the apply function."""
    table = wire.Table("public", "t", (wire.Column("id", "integer"),), (0,))

    def ws(key: bytes) -> wire.Writeset:
        return wire.scan(wire.encode(wire.Writeset(1, 1, 0, (table,), (wire.Row("I", 0, (), (key,)),),
                                                   (wire.Key(wire.KeyMode.UPDATE, (b"public", b"t", b"id", key)),))))

    async def scenario() -> list[list[int]]:
        log = WritesetLog(str(tmp_path / "log"), segment_bytes=1 << 16, total_bytes=4 << 16)
        log.open()
        hooks = Hooks(committed_here=lambda g: None, apply_failed=_never, connection_lost=_never,
                      fatal=lambda why: None, backlog_changed=lambda: None)
        p = CommitPipeline("n1", "dbname=none", 1, 8, ConcurrentSchemaChanges("dbname=none", "n1"), LogFeeder(log),
                           Db(ok=False), Counters(), lambda m: None, asyncio.create_task, hooks)
        a, b = ws(b"1"), ws(b"2")
        run = Pending(2, 0, "n2", b, before=(a,))
        assert run.run() == (a, b)
        p.admit_run(run)
        p.admit(Pending(3, 2, "n2", ws(b"1")), local=False)  # shares a key with the run's first writeset
        p.admit(Pending(4, 3, "n2", ws(b"9")), local=False)
        log.close()
        return p.scheduler.ready_runs(10, 1)

    assert asyncio.run(scenario()) == [[2]]  # 3 waits for the run; 4 comes after 3 in the queue


async def _never(*args: object) -> None:
    raise AssertionError("not called")


class Db:
    """The node's database as the pipeline asks it (pipeline.NodeDb), answering what a test sets."""

    def __init__(self, ok: bool = True, committed: int = 0, ended: bool = False) -> None:
        self.ok = asyncio.Event()
        if ok:
            self.ok.set()
        self.committed = committed
        self.ended = ended
        self.asked: list[tuple[int, int]] = []

    async def committed_gid(self) -> int:
        return self.committed

    async def local_xact_ended(self, xid: int, pid: int) -> bool:
        self.asked.append((xid, pid))
        return self.ended


@dataclass
class Backend:
    """A local backend as the pipeline sees it (pipeline.BackendRef)."""
    pid: int
    certified: set[int] = field(default_factory=set)
    closed: bool = False


def _local_ws(key: bytes) -> wire.Writeset:
    table = wire.Table("public", "t", (wire.Column("id", "integer"),), (0,))
    return wire.scan(wire.encode(wire.Writeset(7, 4242, 0, (table,), (wire.Row("I", 0, (), (key,)),),
                                               (wire.Key(wire.KeyMode.UPDATE, (b"public", b"t", b"id", key)),))))


def _ddl_ws() -> wire.Writeset:
    """A schema change's request for its place in the order (its content comes later)."""
    statement = wire.Schema((("search_path", "public"),), "postgres", b"ALTER TABLE t ADD COLUMN c int")
    return wire.scan(wire.encode(wire.Writeset(0, 4242, 0, (), (statement,),
                                               (wire.Key(wire.KeyMode.EXCLUSIVE, (b"public", b"t")),),
                                               flags=wire.FLAG_TOI)))


def _pipeline(tmp_path: Path, db: Db, spawn: Any = asyncio.create_task) -> tuple[CommitPipeline, WritesetLog]:
    log = WritesetLog(str(tmp_path / "log"), segment_bytes=1 << 16, total_bytes=4 << 16)
    log.open()
    hooks = Hooks(committed_here=lambda g: None, apply_failed=_never, connection_lost=_never,
                  fatal=lambda why: None, backlog_changed=lambda: None)
    return CommitPipeline("n1", "dbname=none", 1, 8, ConcurrentSchemaChanges("dbname=none", "n1"), LogFeeder(log),
                          db, Counters(), lambda m: None, spawn, hooks), log


def test_the_pipeline_decides_what_becomes_of_a_certified_local_writeset(tmp_path: Path) -> None:
    """Admission has one owner: a certified local writeset whose backend waits is handed back for
    the COMMIT verdict and left to that backend; one whose backend is gone (closed, or no longer
    known) is replayed; a schema change's backend is watched for lock blockers; one that commits
    once every node has reported is not answered yet."""
    async def scenario() -> None:
        p, log = _pipeline(tmp_path, Db(ok=False))  # (nothing is applied: no PostgreSQL here)
        live, closed = Backend(100), Backend(101, closed=True)
        got = p.admit_local(LocalVerdict(1, True, 1, 0, "", _local_ws(b"1")), live)
        assert got is not None and (got.gid, got.prev, got.wait_for, got.backend) == (1, 0, 0, live)
        assert live.certified == {1} and p.describe(1)["replay"] is False
        assert p.admit_local(LocalVerdict(2, True, 2, 1, "", _local_ws(b"2")), closed) is None
        assert closed.certified == set() and p.describe(2)["backend_pid"] is None and p.describe(2)["replay"]
        assert p.admit_local(LocalVerdict(3, True, 3, 2, "", _local_ws(b"3")), None) is None
        assert p.describe(3)["replay"]
        ddl = p.admit_local(LocalVerdict(4, True, 4, 3, "", _ddl_ws()), live)
        assert ddl is not None and p.waiters[4].pid() == 100  # it runs now: blockers in its way lose
        ddl.backend = None
        assert p.waiters[4].pid() == 0
        settled = p.admit_local(LocalVerdict(5, True, 5, 4, "", _local_ws(b"5"), settle=True), live)
        assert settled is None and live.certified == {1, 4, 5}  # its backend hears once the nodes reported
        assert sorted(p.pending) == [1, 2, 3, 4, 5]
        log.close()

    asyncio.run(scenario())


def test_a_backend_gone_with_a_certified_gid_is_followed_until_it_commits_or_ends(tmp_path: Path) -> None:
    """A backend that closed its socket holding a certified GID: its transaction is done when the
    database's committed GID passes it, and replayed when the database says it ended without
    committing; the socket server only reports the backend gone."""
    async def scenario(db: Db) -> tuple[dict[str, Any], int, list[tuple[int, int]]]:
        spawned: list[Coroutine[Any, Any, Any]] = []
        p, log = _pipeline(tmp_path / str(id(db)), db, spawn=spawned.append)
        b = Backend(100)
        assert p.admit_local(LocalVerdict(1, True, 1, 0, "", _local_ws(b"1")), b) is not None
        b.closed = True
        p.backend_gone(b)
        watch = spawned.pop()
        await watch
        for c in spawned:  # a replay's apply (no PostgreSQL here)
            c.close()
        log.close()
        return p.describe(1) if 1 in p.pending else {}, p.counters.local_commits, db.asked

    described, commits, asked = asyncio.run(scenario(Db(committed=1)))
    assert (described, commits, asked) == ({}, 1, [])  # committed: done, nothing asked
    described, commits, asked = asyncio.run(scenario(Db(committed=0, ended=True)))
    assert commits == 0 and described["backend_pid"] is None and described["replay"] and asked == [(7, 100)]


def test_after_postgresql_lost_a_catch_up_run_it_is_ordered_again_by_all_its_keys() -> None:
    """PostgreSQL restarted and lost a catch-up run it had committed: pipeline.reschedule puts it
    first again, ordered by the keys of every writeset in it. By its last writeset's keys alone,
    a later writeset on a key of an earlier one went to another session at once, took the row
    and waited for its commit turn, while the run waited for the row: a lab node stalled so."""
    table = wire.Table("public", "t", (wire.Column("id", "integer"),), (0,))

    def ws(key: bytes) -> wire.Writeset:
        return wire.scan(wire.encode(wire.Writeset(1, 1, 0, (table,), (wire.Row("I", 0, (), (key,)),),
                                                   (wire.Key(wire.KeyMode.UPDATE, (b"public", b"t", b"id", key)),))))

    book: CommitBook[Pending] = CommitBook()
    book.start(1, 0)
    run = Pending(2, 0, "n2", ws(b"2"), before=(ws(b"1"),), before_gids=(1,))
    later = Pending(3, 2, "n2", ws(b"1"))
    book.admit(run)
    book.admit(later)
    book.committed(2)  # the run committed, not flushed ...
    scheduler = reschedule(book, Scheduler(), "n1", 1, 0)  # ... and PostgreSQL came back at GID 0
    assert scheduler.ready_runs(10, 1) == [[2]]  # GID 3 waits for the run


def _keyed_insert(key: bytes) -> wire.Writeset:
    """A one-row insert into public.t, keyed by ``key``."""
    table = wire.Table("public", "t", (wire.Column("id", "integer"),), (0,))
    return wire.scan(wire.encode(wire.Writeset(1, 1, 0, (table,), (wire.Row("I", 0, (), (key,)),),
                                               (wire.Key(wire.KeyMode.UPDATE, (b"public", b"t", b"id", key)),))))


def test_a_catch_up_run_partly_committed_here_applies_the_rest(tmp_path: Path) -> None:
    """Local backends of a coordinator that stopped commit their certified GIDs while the next
    one catches up: a run whose first GIDs they committed (SQLSTATE CH002) goes again with the
    rest, after the last one committed, instead of stopping the node."""
    from chorus.commit.applier import PartlyCommitted
    ws = _keyed_insert

    class Session:
        pid = 0

        def __init__(self) -> None:
            self.calls: list[tuple[int, int, list[wire.Writeset]]] = []

        async def apply_run(self, gid: int, wait_for: int, writesets: list[wire.Writeset], ddl_ok: bool = True,
                            prev: int = -1, commit_time: int = 0) -> bool:
            self.calls.append((gid, wait_for, list(writesets)))
            if len(self.calls) == 1:
                raise PartlyCommitted(gid, 12)
            return True

    async def scenario() -> tuple[list[tuple[int, int, list[wire.Writeset]]], list[wire.Writeset]]:
        log = WritesetLog(str(tmp_path / "log"), segment_bytes=1 << 16, total_bytes=4 << 16)
        log.open()
        failed: list[int] = []

        async def apply_failed(gid: int, why: str) -> None:
            failed.append(gid)
        hooks = Hooks(committed_here=lambda g: None, apply_failed=apply_failed, connection_lost=_never,
                      fatal=lambda why: None, backlog_changed=lambda: None)
        p = CommitPipeline("n1", "dbname=none", 1, 8, ConcurrentSchemaChanges("dbname=none", "n1"), LogFeeder(log),
                           Db(ok=False), Counters(), lambda m: None, asyncio.create_task, hooks)
        w = [ws(b"%d" % i) for i in range(11, 15)]
        p.admit_run(Pending(14, 10, "n2", w[3], before=tuple(w[:3]), before_gids=(11, 12, 13)))
        s = Session()
        await p._apply(s, [14], replay=False, pooled=False)  # type: ignore[arg-type]
        await p._apply(s, [14], replay=False, pooled=False)  # type: ignore[arg-type]
        log.close()
        assert not failed
        return s.calls, w

    calls, w = asyncio.run(scenario())
    assert [(g, wf, len(wss)) for g, wf, wss in calls] == [(14, 10, 4), (14, 12, 2)]
    assert calls[1][2] == [w[2], w[3]]


def test_several_catch_up_runs_applied_as_one_and_partly_committed_go_again_one_by_one(tmp_path: Path) -> None:
    """Two catch-up runs dispatched as one apply, the first committed here whole already (by the
    previous coordinator's backends, or an earlier attempt): the extension says the run is partly
    committed. Each goes again alone, so the committed one is found committed and the other
    applies its rest; a lab node was voted out when the failure went to the vote instead."""
    from chorus.commit.applier import PartlyCommitted
    ws = _keyed_insert

    class Session:
        pid = 0

        async def apply_run(self, gid: int, wait_for: int, writesets: list[wire.Writeset], ddl_ok: bool = True,
                            prev: int = -1, commit_time: int = 0) -> bool:
            raise PartlyCommitted(gid, 12)

    async def scenario() -> tuple[list[int], list[list[int]]]:
        log = WritesetLog(str(tmp_path / "log"), segment_bytes=1 << 16, total_bytes=4 << 16)
        log.open()
        failed: list[int] = []
        hooks = Hooks(committed_here=lambda g: None, apply_failed=lambda g, why: failed.append(g),
                      connection_lost=_never, fatal=lambda why: None, backlog_changed=lambda: None)
        p = CommitPipeline("n1", "dbname=none", 1, 8, ConcurrentSchemaChanges("dbname=none", "n1"), LogFeeder(log),
                           Db(ok=False), Counters(), lambda m: None, asyncio.create_task, hooks)
        w = [ws(b"%d" % i) for i in range(11, 15)]
        p.admit_run(Pending(12, 10, "n2", w[1], before=(w[0],), before_gids=(11,)))
        p.admit_run(Pending(14, 12, "n2", w[3], before=(w[2],), before_gids=(13,)))
        (run,) = p.scheduler.ready_runs(10, 8)
        assert run == [12, 14]
        await p._apply(Session(), run, replay=False, pooled=False)  # type: ignore[arg-type]
        runs = p.scheduler.ready_runs(10, 8)
        log.close()
        return failed, runs

    failed, runs = asyncio.run(scenario())
    assert failed == []  # no vote
    assert runs == [[12], [14]]  # each alone now


def test_an_apply_that_fails_after_postgres_restarted_leaves_the_restarted_pipeline_alone(tmp_path: Path) -> None:
    """An apply in flight when PostgreSQL restarts ends (failed) after the restart rebuilt the
    idle sessions and the scheduler: it must not hand its session back a second time (two applies
    would share one connection), re-dispatch its GID, or report the lost connection again."""
    from chorus.commit.applier import ApplyConnectionLost
    table = wire.Table("public", "t", (wire.Column("id", "integer"),), (0,))
    ws = wire.scan(wire.encode(wire.Writeset(1, 1, 0, (table,), (wire.Row("I", 0, (), (b"1",)),),
                                             (wire.Key(wire.KeyMode.UPDATE, (b"public", b"t", b"id", b"1")),))))

    async def scenario() -> None:
        log = WritesetLog(str(tmp_path / "log"), segment_bytes=1 << 16, total_bytes=4 << 16)
        log.open()
        gone = asyncio.Event()

        async def apply_run(*args: object, **kw: object) -> bool:
            await gone.wait()
            raise ApplyConnectionLost("server closed the connection unexpectedly")
        hooks = Hooks(committed_here=lambda g: None, apply_failed=_never, connection_lost=_never,
                      fatal=lambda why: None, backlog_changed=lambda: None)
        db = Db()
        spawned: list[object] = []

        def spawn(coro: Any) -> "asyncio.Task[Any]":
            spawned.append(coro)
            return asyncio.create_task(coro)
        p = CommitPipeline("n1", "dbname=none", 2, 8, ConcurrentSchemaChanges("dbname=none", "n1"), LogFeeder(log),
                           db, Counters(), lambda m: None, spawn, hooks)
        p.admit(Pending(1, 0, "n2", ws), local=False)
        session = p.idle.pop()
        session.apply_run = apply_run  # type: ignore[method-assign]
        in_flight = asyncio.create_task(p._apply(session, [1], replay=False))
        await asyncio.sleep(0)
        close = p.close

        async def close_and_dispatch() -> None:  # writesets keep arriving while the sessions close
            p.dispatch()
            await close()
        p.close = close_and_dispatch  # type: ignore[method-assign]
        await p.restart(1, 0)  # PostgreSQL came back: every session idle, GID 1 to apply again
        assert spawned == [], "dispatched while the sessions were being closed"
        assert sorted(map(id, p.idle)) == sorted(map(id, p.workers))
        db.ok.clear()  # no new applies from here on: only the one in flight is watched
        gone.set()
        await in_flight
        assert sorted(map(id, p.idle)) == sorted(map(id, p.workers)), "a session handed back twice"
        assert p.counters.apply_retries == 0
        log.close()

    asyncio.run(scenario())


def test_the_blocker_watch_sleeps_while_no_session_commits_a_certified_writeset() -> None:
    """lockwatch.watch_blockers looked at the database every BLOCKER_CHECK_S even on a node that
    applied nothing (200 wake-ups a second); now it wakes when a session starts committing a
    certified writeset, and then checks what blocks it as before."""
    from types import SimpleNamespace

    from chorus.commit.pipeline import Waiter, Waiters
    from chorus.lockwatch import BLOCKER_CHECK_S, watch_blockers

    class Db:
        def __init__(self) -> None:
            self.looked = 0
            self.queries: list[Any] = []
            self.ok = asyncio.Event()
            self.ok.set()

        @property
        def conn(self) -> object:
            self.looked += 1
            return object()

        async def q_all(self, sql: str, args: Any) -> list[Any]:
            self.queries.append(args)
            return []

    async def scenario() -> tuple[int, list[Any]]:
        db = Db()
        pipeline = SimpleNamespace(waiters=Waiters(), pending={5: object()}, sessions=lambda: [])
        task = asyncio.create_task(watch_blockers(db, pipeline, SimpleNamespace(pids={}), Counters(), 1.0))  # type: ignore[arg-type]
        await asyncio.sleep(BLOCKER_CHECK_S * 12)
        idle_looks = db.looked
        pipeline.waiters[5] = Waiter(lambda: 123, 0.0)  # an apply session committing GID 5 for a while
        for _ in range(100):
            await asyncio.sleep(BLOCKER_CHECK_S)
            if db.queries:
                break
        task.cancel()
        return idle_looks, db.queries

    idle_looks, queries = asyncio.run(scenario())
    assert idle_looks == 0
    assert queries and queries[0] == ([123],)
