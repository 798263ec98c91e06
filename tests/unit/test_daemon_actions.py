"""The daemon loop's handling of the replicator's actions (coordinator.py:Coordinator._act),
with no bus and no database: the order in which what one delivery decided reaches the parts."""

from __future__ import annotations

import asyncio
from pathlib import Path

from chorus import wire
from chorus.catchup import CatchUpRunner
from chorus.config import NodeConfig
from chorus.coordinator import Coordinator
from chorus.commit.pipeline import Pending
from chorus.actions import Apply, CatchUp, Phase, PhaseChange
from chorus.replicator import Replicator


def _writeset(key: bytes) -> wire.Writeset:
    table = wire.Table("public", "t", (wire.Column("id", "integer"),), (0,))
    return wire.scan(wire.encode(wire.Writeset(1, 1, 0, (table,), (wire.Row("I", 0, (), (key,)),),
                                               (wire.Key(wire.KeyMode.UPDATE, (b"public", b"t", b"id", key)),))))


def test_live_writesets_decided_with_a_catch_up_are_held_until_it_has_applied_its_range(tmp_path: Path) -> None:
    """A node that joins behind gets, from one delivery, the CatchUp of the range it missed and
    the live writesets certified after it (those delivered while it waited for the answer). They
    must be held from the CatchUp on, even when nothing lets the catch-up task start in between
    (PostgreSQL is down, so setting the phase does not wait): admitted at once, they would be
    scheduled and logged ahead of the range, whose commits would then wait for them. A nemesis
    run stalled so, its node 'recovering' for good."""
    cfg = NodeConfig("n1", "dbname=none", str(tmp_path / "chorus.sock"), str(tmp_path / "admin.sock"),
                     str(tmp_path / "state.json"), str(tmp_path))

    async def scenario() -> tuple[dict[int, object], list[int], list[object]]:
        c = Coordinator(cfg, bus_factory=lambda: None)  # type: ignore[arg-type,return-value]
        r = c.replicator = Replicator(node="n1", cluster_uuid="u", last_gid=10)
        r.phase = Phase.RECOVERING
        c.pipeline.book.start(1, 10)
        spawned: list[object] = []
        c._spawn = lambda coro, name=None: spawned.append(coro)  # type: ignore[method-assign,assignment,misc,return-value]
        c.catchup = CatchUpRunner("n1", r, c.pipeline, c.feeder, None, (), 32, lambda m: None, c._act,
                                  c.stopping, lambda: False)
        await c._act([CatchUp(10, 20), PhaseChange(Phase.RECOVERING, "catching up from GID 10 to 20"),
                      Apply(21, 20, "n2", _writeset(b"1")), Apply(22, 21, "n2", _writeset(b"2"))])
        held = [a.gid for a in (c.catchup.held or []) if isinstance(a, Apply)]
        pending = dict(c.pipeline.pending)
        for coro in spawned:
            coro.close()  # type: ignore[attr-defined]
        return pending, held, spawned

    pending, held, spawned = asyncio.run(scenario())
    assert len(spawned) == 1, "the catch-up task"
    assert pending == {}, "live writesets admitted before the range they follow"
    assert held == [21, 22]


def test_a_gid_admitted_out_of_order_stops_the_node_instead_of_stalling_it(tmp_path: Path) -> None:
    """The commit book takes certified writesets in GID order only: one admitted after a later
    one would make the later one's commit wait for it while the scheduler orders it after; that
    is a bug, and the pipeline stops the node rather than stall or log out of order."""
    cfg = NodeConfig("n1", "dbname=none", str(tmp_path / "chorus.sock"), str(tmp_path / "admin.sock"),
                     str(tmp_path / "state.json"), str(tmp_path))

    async def scenario() -> tuple[list[int], str | None]:
        c = Coordinator(cfg, bus_factory=lambda: None)  # type: ignore[arg-type,return-value]
        c.wslog.open()
        c.pipeline.book.start(1, 10)
        c.pipeline.admit(Pending(12, 11, "n2", _writeset(b"1")), local=False)
        c.pipeline.admit(Pending(11, 10, "n2", _writeset(b"2")), local=False)
        c.wslog.close()
        return sorted(c.pipeline.pending), c.fatal

    pending, fatal = asyncio.run(scenario())
    assert pending == [12]
    assert fatal is not None and "GID 11 admitted after GID 12" in fatal
