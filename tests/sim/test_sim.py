"""The deterministic simulation of the coordinator's core (tests/sim/README.md; docs/ARCHITECTURE.md
invariants 1, 3, 5, 8 and 9; docs/RECOVERY.md, "The cluster comes back by itself").

CI runs CHORUS_SIM_SEEDS random fault schedules (default 500, from CHORUS_SIM_FIRST_SEED, on
CHORUS_SIM_JOBS processes), every seed that ever failed, and scripted scenarios. A failing seed
prints its trace and the command that replays it.
"""

from __future__ import annotations

import multiprocessing
import os

import pytest

import simrun
from simworld import Sim, Violation

SEEDS = int(os.environ.get("CHORUS_SIM_SEEDS", "500"))  # more run outside CI: simrun.py --seeds
FIRST = int(os.environ.get("CHORUS_SIM_FIRST_SEED", "1"))
JOBS = int(os.environ.get("CHORUS_SIM_JOBS", str(min(2, os.cpu_count() or 1))))

# Seeds that failed once, and what they found (each passes since its fix). The bus, faults and
# workload of a seed are fixed by simrun.py's FAULTS and shape draws: keep those as they are.
REGRESSIONS = {
    39: "the only synced member held writesets no running node had delivered; joiners vouched only "
        "after their request, so nothing released them and the catch-ups waited for good",
    77: "the same, seen as a node told to rebuild by total recovery while it held more than any synced member",
    91: "the same deadlock, with five nodes",
    763: "a local writeset lost by the bus at a view change left its client waiting for good",
    1351: "the same, after a freeze and a partition",
    553: "a coordinator that had just started counted nothing committed until its first tick; a vote opened "
         "then on an older GID never got its vote, never closed, and the node that failed to apply waited",
    598: "the simulation's apply (not the pipeline's) put a failed run's GIDs back after its session was idle "
         "and dispatched again: both sessions took later writesets, which waited for their commit turn for good",
    9016: "the simulation's coordinator, frozen while its PostgreSQL restarted, never learnt of the restart (the "
          "real one's connections die with it): its commit book kept GIDs the database had lost",
    1462: "the simulation's coordinator (not nodedb.start_node, whose chorus.durable_gid() flushes) started "
          "without flushing its predecessor's applies; PostgreSQL then lost them and nothing applied them again",
    8358: "a lost update: n3, frozen out of the primary component while its own writesets waited for a quorum, "
          "told their sessions the outcome was unknown (their row locks went uncommitted) and came back with them "
          "in its GID answer, to be applied; a new local transaction that had not seen its own GID 39 changed "
          "the same row, and certification, which does not compare writesets of one node, certified it "
          "(OrderCore.stale_local refuses it before it is ordered since)",
    9038: "the simulation's backends outlived their PostgreSQL: a writeset sent before a kill-postgres was "
          "certified after the restart, its (dead) backend was given the verdict and waited for a turn the "
          "pipeline's re-apply had taken; its transaction stayed certified for good (a backend now belongs to the "
          "PostgreSQL it was opened on, and its socket closes with it: Coord.backends_died)",
    11691: "a node added and rebuilt from a donor with a row changed behind Chorus's back failed, catching up, a "
           "GID the cluster had voted on before it joined: the members ignored its vote (decided already) and it "
           "waited for the ballot forever (members now answer a late vote with the outcome they hold)",
    13336: "a node failed a GID as its PostgreSQL came back and was isolated before its vote got out: back in "
           "the primary component it waited for that ballot forever (it now asks again when it rejoins)",
}


def report(failed: list[simrun.Result]) -> str:
    out = []
    for r in failed:
        out.append(r.line())
        out += ["    " + line for line in r.trace[-80:]]
        out.append(f"  replay: {simrun.replay_command(r.seed)}")
    return "\n".join(out)


def _run_many(seeds: list[int]) -> list[simrun.Result]:
    return [r for r in (simrun.run(s) for s in seeds) if not r.ok]


@pytest.mark.timeout(1800)
def test_random_fault_schedules_keep_every_invariant_and_the_cluster_comes_back() -> None:
    seeds = list(range(FIRST, FIRST + SEEDS))
    if JOBS > 1:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(JOBS) as pool:
            failed = [r for part in pool.map(_run_many, [seeds[i::JOBS] for i in range(JOBS)]) for r in part]
    else:
        failed = _run_many(seeds)
    failed.sort(key=lambda r: r.seed)
    assert not failed, f"{len(failed)} of {len(seeds)} seeds failed:\n" + report(failed[:3])


@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_a_seed_that_once_failed(seed: int) -> None:
    r = simrun.run(seed, node_changes=False)  # its schedule as it failed, before the simulation changed nodes
    assert r.ok, f"{REGRESSIONS[seed]}:\n" + report([r])


def _trace(r: simrun.Result, what: str) -> list[str]:
    return [line for line in r.trace if what in line]


def test_issue_34_the_last_synced_member_dies_while_the_others_catch_up_from_it() -> None:
    """The issue's story: n1 and n2's databases stall while n3 commits; every host crashes; n3
    re-forms at the highest GID and n1 and n2 catch up from it, their databases stalled again;
    n3's host dies. The nodes that remain hold what n3's primary component released (they
    admitted it: their logs have it), so they re-form without n3, whose records say it left at
    a GID they hold; n3 comes back and catches up. Nobody is told to rebuild, nothing is lost."""
    script = [(1.0, "stall-postgres", "n1", 4.2), (1.0, "stall-postgres", "n2", 4.2), (5.0, "crash-all", "n1", 2.0),
              (5.5, "stall-postgres", "n1", 12.0), (5.5, "stall-postgres", "n2", 12.0),
              (12.0, "kill-host", "n3", 8.0), (24.0, "kill-host", "n2", 4.0)]
    r = simrun.run(1, script=script, n=3, seconds=30.0, rate=60.0, capacity=5000, keep_trace=4000)
    assert r.ok, report([r])
    assert _trace(r, "n3 phase online: bootstrapped") and "(epoch 2)" in _trace(r, "n3 phase online: bootstrapped")[0]
    assert [line for line in _trace(r, "phase non-primary: no member of the primary component is synced")
            if " n1 " in line or " n2 " in line]
    assert not _trace(r, "needs-recovery") and r.total_recoveries == 0


def test_a_node_that_crashed_with_the_others_is_waited_for_then_the_one_holding_most_re_forms() -> None:
    """A power cut of every host, n2 back only much later: n1 and n3 may lack acknowledged
    writesets n2 holds (it was a member when everything stopped), so they wait for it, without
    starting a cluster, until it is back; then the one holding the most re-forms."""
    script = [(3.0, "power-cut-all", "n1", 1.0), (3.5, "kill-host", "n2", 25.0)]
    r = simrun.run(2, script=script, n=3, seconds=30.0, rate=20.0, capacity=5000, keep_trace=4000)
    assert r.ok, report([r])
    back = min(float(line.split()[0]) for line in _trace(r, "undo kill-host n2"))
    reforms = [float(line.split()[0]) for line in _trace(r, "phase online: bootstrapped") if "epoch 2" in line]
    assert reforms and min(reforms) > back, report([r])
    waits = [line for line in _trace(r, "re-form: ") if "waits for n2" in line]
    assert waits and float(waits[0].split()[0]) < back, report([r])


def test_a_node_thawed_from_a_freeze_sends_what_its_backends_committed_before_after_its_request() -> None:
    """Found by the lab (nemesis campaign seed 3): a node frozen past the token timeout, thawed,
    reads its backends' COMMITs and the piled-up views in one loop turn; its writesets leave
    after its GID request. The members drop them (it is no member there); the joiner replayed
    them after the answer had admitted it, counted them, and every later GID named another
    writeset on it than on the others. Here the simulation's seed 40 reproduces it."""
    script = [(2.0, "freeze", "n3", 5.0), (9.0, "freeze", "n2", 4.5), (15.0, "freeze", "n1", 6.0)]
    r = simrun.run(40, script=script, n=3, seconds=20.0, rate=80.0, capacity=5000)
    assert r.ok, report([r])


@pytest.mark.parametrize("seed", [5, 6, 7, 8, 10, 11, 52])
def test_postgresql_killed_while_a_catch_up_run_is_not_flushed(seed: int) -> None:
    """Found by the lab (nemesis campaign seed 4): a node caught up in runs of writesets, then its
    PostgreSQL was killed before a run was flushed. The run, applied again first, was ordered by
    its last writeset's keys only: a later writeset on a key of an earlier one of the run went
    to another session at once, took the row and waited for its commit turn, while the run waited
    for the row (seeds 5 to 11). And a local writeset replayed before an earlier one on its row
    was applied held the row the same way (seed 52). The simulation's applies hold their rows'
    locks until they commit, so it finds both."""
    script = [(2.0, "isolate-one", "n3", 6.0), (9.4 + (seed % 60) * 0.03, "kill-postgres", "n3", 1.0)]
    r = simrun.run(seed, script=script, n=3, seconds=15.0, rate=60.0, capacity=5000)
    assert r.ok, report([r])


def test_a_node_gone_for_good_that_left_earlier_does_not_hold_the_others_back() -> None:
    """n3's host dies and stays down; n1 and n2 go on; then both crash at once and restart. n3
    left the primary component at a GID they hold: they re-form without it (Galera's pc.recovery
    waits for the last primary component only)."""
    script = [(2.0, "kill-host", "n3", 60.0), (10.0, "crash-all", "n1", 2.0)]
    r = simrun.run(3, script=script, n=3, seconds=30.0, rate=20.0, capacity=5000, keep_trace=4000, dead=("n3",))
    assert r.ok, report([r])
    assert [line for line in _trace(r, "phase online: bootstrapped") if "epoch 2" in line], report([r])


# seeds that reach the partly-committed path, one for each time of the kill (their timing moved
# when the simulated bus began to keep one sender's messages in order, and again when a new
# cluster began to start as soon as every node had asked)
@pytest.mark.parametrize("seed", [23, 27, 30, 39, 41])
def test_backends_of_a_killed_coordinator_commit_while_the_next_one_catches_up(seed: int) -> None:
    """Found by the lab (nemesis campaign seed 4): a certified local transaction whose commit turn
    had come needs its coordinator no more. PostgreSQL stalls, the coordinator is killed, the
    next one starts and catches up; when PostgreSQL resumes, such a backend commits its GID
    while the catch-up applies it, holding its rows meanwhile: the apply finds its run partly
    committed and applies the rest (commit/pipeline.py: partly_committed; several runs applied
    as one each go again alone: tests/unit/test_shell_parts.py). Backends still waiting for their
    turn fail when the next coordinator starts (chorus.node_init())."""
    script = [(2.0, "stall-postgres", "n2", 3.0), (3.0 + (seed % 5) * 0.3, "kill-coordinator", "n2", 0.5)]
    r = simrun.run(seed, script=script, n=3, seconds=12.0, rate=80.0, capacity=5000, keep_trace=100000)
    assert r.ok, report([r])
    assert _trace(r, "its backend commits without its coordinator"), report([r])
    assert _trace(r, "partly committed here"), report([r])


@pytest.mark.parametrize("seed", [3, 4, 8, 9, 13])
def test_a_catch_up_replaced_by_a_newer_one_feeds_it_nothing(seed: int) -> None:
    """Found by the lab (nemesis campaign seed 17): n3 catches up a long range, its database
    stalled, while a partition puts it out of the primary component and back; it joins again and
    a newer catch-up begins while the older one's stream goes on (the simulation's streams, as
    the coordinator's fetch, run until a record they hand over is refused). The older stream's
    records entered the newer catch-up's runs: a GID twice in a run, runs out of their turn
    (catchupplan.take refuses a record of a replaced catch-up since)."""
    d = (seed % 5) * 0.2
    script = [(2.0, "kill-coordinator", "n3", 14.0), (15.9, "stall-postgres", "n3", 9.0),
              (16.2 + d, "isolate-one", "n3", 4.0)]
    r = simrun.run(seed, script=script, n=3, seconds=28.0, rate=120.0, capacity=20000, keep_trace=100000)
    assert r.ok, report([r])
    assert len([line for line in _trace(r, "n3 phase recovering")]) >= 2, report([r])



def test_the_checker_finds_a_change_written_over_a_version_it_never_saw() -> None:
    """The lab's seed 20 (a bank transfer's debit lost on every node): GID 123152 changed a row as
    it was before GID 123084, which changed it first in the order. Every commit of the simulation
    is checked for it (simchecks.Checker._no_lost_update); a model of the fix is in simworld
    (Host.lost, Coord.refusal while re-applying)."""
    sim = Sim(1, n=1)
    host = sim.hosts["n1"]
    sim.writes.update({11: [5], 12: [5, 6], 13: [5]})
    sim.reads.update({11: {5: 0}, 12: {5: 1, 6: 0}, 13: {5: 1}})
    for gid, xid in ((1, 11), (2, 12)):
        host.db.commit([(gid, xid)])
        sim.checker.committed(host, [gid])
    host.db.commit([(3, 13)])
    with pytest.raises(Violation, match="lost update: GID 3 .* row 5 as GID 1 left it, over GID 2"):
        sim.checker.committed(host, [3])
