"""Partial recovery's decisions (chorus/catchupplan.py; docs/RECOVERY.md): the steps of a
catch-up, driven by hand here as catchup.py and the simulation drive them."""

from __future__ import annotations

from typing import Any, Optional

from chorus.bus import proto as bp
from chorus import wire
from chorus.catchupplan import AskLogs, CatchUpPlan, Fetch, Steps, Wait, Act, WaitCommitted
from chorus.recoveryproto import RecoveryError
from chorus.actions import Apply, CatchUp, Phase, PhaseChange, Send
from chorus.replicator import Replicator
from chorus.wslog import LogRecord


class Admission:
    def __init__(self, watermark: int) -> None:
        self.watermark = self.admitted = watermark
        self.lanes = 1
        self.logged: list[int] = []
        self.runs: list[list[int]] = []

    def log(self, rec: LogRecord) -> None:
        self.logged.append(rec.gid)

    def admit_run(self, run: list[LogRecord], prev: int) -> None:
        self.runs.append([r.gid for r in run])
        self.admitted = run[-1].gid

    def admit_one(self, rec: LogRecord, prev: int) -> None:
        self.runs.append([rec.gid])
        self.admitted = rec.gid


def recovering(members: dict[str, bool]) -> Replicator:
    """n9 catching up in a primary component of ``members`` (name: synced)."""
    r = Replicator("n9", "c", 10)
    r.phase = Phase.RECOVERING
    r.online = {n: f"{n}:1" for n in [*members, "n9"]}
    r.synced = {n for n, s in members.items() if s}
    return r


def offer(node: str, after: int, high: int, committed: int, address: str = "h:1") -> bp.LogInfo:
    return bp.LogInfo("n9", "q", node, address, after, high, committed, 0)


def record(gid: int) -> LogRecord:
    t = wire.Table("public", "t", (wire.Column("id", "integer"),), (0,))
    ws = wire.Writeset(gid, 1, 0, (t,), (wire.Row("I", 0, (), (str(gid).encode(),)),),
                       (wire.Key(wire.KeyMode.UPDATE, (b"public", b"t", b"id", str(gid).encode())),))
    return LogRecord(gid, "n1", 0, wire.encode(ws))


def step(steps: Steps, send: Any = None, throw: Optional[BaseException] = None) -> Any:
    return steps.throw(throw) if throw is not None else steps.send(send)


def test_it_waits_while_a_synced_member_has_not_released_the_next_gids_yet() -> None:
    """Every member answered and no log holds the GID after the node's position: but the synced
    member's log reaches back to it, so it will log them once released there (a stalled uniform
    commit). A simulated node gave up here and was told to rebuild while it held GIDs the synced
    member had not committed yet."""
    r = recovering({"n1": True, "n2": False})
    plan = CatchUpPlan("n9", r, Admission(10), (), 8, True, clock=lambda: 0.0)
    steps = plan.start(CatchUp(10, 20))
    ask = step(steps)
    assert isinstance(ask, AskLogs) and ask.members == frozenset({"n1", "n2"})
    got = step(steps, [offer("n1", 5, 10, 10), offer("n2", 40, 40, 40)])
    assert isinstance(got, Wait), got
    assert r.phase == Phase.RECOVERING and "waiting for n1" in plan.status()["state"]  # type: ignore[index]


def test_it_waits_for_every_member_to_answer_before_concluding() -> None:
    r = recovering({"n1": True, "n2": False})
    plan = CatchUpPlan("n9", r, Admission(10), (), 8, True, clock=lambda: 0.0)
    steps = plan.start(CatchUp(10, 20))
    step(steps)
    assert isinstance(step(steps, [offer("n1", 15, 30, 30)]), Wait)  # n2 did not answer (yet)


def test_when_every_member_answered_and_the_range_left_every_log_it_gives_up_in_the_order() -> None:
    r = recovering({"n1": True, "n2": False})
    plan = CatchUpPlan("n9", r, Admission(10), (), 8, True, clock=lambda: 0.0)
    steps = plan.start(CatchUp(10, 20))
    step(steps)
    act = step(steps, [offer("n1", 15, 30, 30), offer("n2", 3, 8, 8)])
    assert isinstance(act, Act)
    assert r.phase == Phase.NEEDS_RECOVERY
    leave = [a.message for a in act.actions if isinstance(a, Send)]
    assert leave and isinstance(leave[0], bp.Leave) and leave[0].node == "n9"
    reason = [a.reason for a in act.actions if isinstance(a, PhaseChange)][0]
    assert "GIDs after 10" in reason and "n1's log holds GIDs 16..30" in reason and "total recovery" in reason


def test_a_member_whose_log_holds_the_next_gid_but_not_committed_yet_is_waited_for() -> None:
    r = recovering({"n1": True, "n2": False})
    plan = CatchUpPlan("n9", r, Admission(10), (), 8, True, clock=lambda: 0.0)
    steps = plan.start(CatchUp(10, 20))
    step(steps)
    assert isinstance(step(steps, [offer("n1", 15, 30, 30), offer("n2", 5, 14, 10)]), Wait)


def test_it_streams_from_the_partner_holding_the_range_then_applies_the_held_stream_and_says_it_is_synced() -> None:
    r = recovering({"n1": True})
    adm = Admission(10)
    plan = CatchUpPlan("n9", r, adm, (), 8, True, clock=lambda: 0.0)
    steps = plan.start(CatchUp(10, 12))
    live = Apply(13, 12, "n1", wire.scan(record(13).payload))
    assert plan.hold(live)
    step(steps)
    fetch = step(steps, [offer("n1", 0, 13, 13)])
    assert isinstance(fetch, Fetch) and (fetch.after, fetch.upto) == (10, 12)
    for g in (11, 12):
        plan.take(record(g))
    act = step(steps, 12)
    assert isinstance(act, Act) and act.actions == [live] and plan.held is None
    assert isinstance(step(steps), WaitCommitted)
    adm.watermark = 12
    act = step(steps)
    assert isinstance(act, Act) and isinstance(act.actions[0], Send) and isinstance(act.actions[0].message, bp.Progress)
    assert adm.runs == [[11, 12]]


def test_a_partner_that_fails_is_replaced_by_the_next_and_nothing_is_admitted_after_the_node_left() -> None:
    r = recovering({"n1": True, "n2": True})
    adm = Admission(10)
    plan = CatchUpPlan("n9", r, adm, (), 8, True, clock=lambda: 0.0)
    steps = plan.start(CatchUp(10, 20))
    step(steps)
    first = step(steps, [offer("n1", 0, 20, 20), offer("n2", 0, 20, 20)])
    second = step(steps, throw=RecoveryError("broke"))
    assert isinstance(first, Fetch) and isinstance(second, Fetch) and first.partner != second.partner
    r.phase = Phase.JOINING  # the primary component dissolved: the node announced what it holds
    try:
        plan.take(record(11))
        raise AssertionError("a record was admitted after the catch-up ended")
    except Exception as e:
        assert type(e).__name__ == "Abandoned"
    assert adm.runs == [] and adm.logged == []


def test_the_stream_of_a_replaced_catch_up_feeds_nothing_into_the_next() -> None:
    """Found by the lab (nemesis seed 17): the node left the primary component and joined again
    while its catch-up's stream went on; the next catch-up began, and the older stream's records
    entered its runs beside its own stream's, so a run held a GID twice and its apply failed on
    a duplicate key (the node was voted out). A record is taken only for the catch-up whose
    Fetch brought it; what the older one held but had not admitted is not admitted either."""
    r = recovering({"n1": True})
    adm = Admission(10)
    plan = CatchUpPlan("n9", r, adm, (), 8, True, clock=lambda: 0.0)
    older = plan.start(CatchUp(10, 40))
    step(older)
    first = step(older, [offer("n1", 0, 40, 40)])
    assert isinstance(first, Fetch)
    for g in (11, 12, 13):
        plan.take(record(g), first.run)  # batched, not admitted yet
    newer = plan.start(CatchUp(10, 40))  # joined again: the same range, from what it holds
    step(newer)
    second = step(newer, [offer("n1", 0, 40, 40)])
    assert isinstance(second, Fetch) and second.run is not first.run
    try:
        plan.take(record(14), first.run)
        raise AssertionError("the older stream's record was taken")
    except Exception as e:
        assert type(e).__name__ == "Abandoned"
    try:
        step(older, 13)  # its fetch ends: what it held goes nowhere
    except StopIteration:
        pass
    assert adm.runs == []
    for g in range(11, 21):
        plan.take(record(g), second.run)
    step(newer, 20)
    assert adm.runs == [[11, 12, 13, 14, 15, 16, 17, 18], [19, 20]]
