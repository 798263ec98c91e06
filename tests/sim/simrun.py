"""One simulated run per seed: a cluster formed, clients writing on every node, faults from the
seed for a while, then every fault healed; the cluster must come back by itself and hold what
its clients were told (simchecks.py). A failing seed prints its trace and the command that
replays it.

    .venv/bin/python tests/sim/simrun.py --seeds 1..2000        # a summary
    .venv/bin/python tests/sim/simrun.py --seed 1234 --trace    # one seed, every step
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chorus import history  # noqa: E402
from chorus.actions import Phase  # noqa: E402
from chorus.bus import Votes  # noqa: E402
from chorus.bus import proto as bp  # noqa: E402
from chorus.cli.members import quorum_problem  # noqa: E402
from chorus.state import NodeState  # noqa: E402
from simworld import (MERGE_S, PROCESS_CHANGE_S, TOKEN_TIMEOUT_S, Host, Sim, Stuck, Violation)  # noqa: E402

FAULTS = ("partition-halves", "isolate-one", "all-alone", "kill-postgres", "kill-coordinator", "kill-corosync",
          "kill-host", "power-cut-host", "crash-all", "power-cut-all", "freeze", "stall-postgres", "netem")
WEIGHTS = (3, 3, 1, 2, 3, 1, 2, 2, 1, 1, 2, 1, 1)
FORM_S = 30.0  # the cluster forms within this
RECOVER_S = 300.0  # after the faults stop, every node online within this (simulated seconds)


@dataclass
class Result:
    seed: int
    ok: bool
    nodes: int = 0
    seconds: float = 0.0
    error: str = ""
    kind: str = ""  # violation, stuck, bug
    faults: Counter[str] = field(default_factory=Counter)
    committed: int = 0
    acked: int = 0
    total_recoveries: int = 0
    recovered_in: float = 0.0  # simulated seconds from the heal to every node online and settled
    trace: list[str] = field(default_factory=list)
    traces: dict[str, bytes] = field(default_factory=dict)  # with ``record``: each coordinator's core trace

    def line(self) -> str:
        faults = ", ".join(f"{k} x{v}" for k, v in sorted(self.faults.items()))
        head = (f"seed {self.seed}: {'ok' if self.ok else self.kind.upper()} {self.nodes} nodes, {self.seconds:.0f} s of "
                f"faults ({faults}); {self.acked} transactions acknowledged")
        if self.ok:
            return head + f"; back in {self.recovered_in:.1f} s, {self.total_recoveries} total recoveries"
        return head + f"\n  {self.error}"


Script = list[tuple[float, str, str, float]]  # (seconds after the cluster formed, fault, host, hold)


class Run:
    """The schedule of one seed, carried out on a Sim: faults at random from the seed, or the
    faults of ``script`` (a scenario) with the run's shape given."""

    def __init__(self, seed: int, trace: bool = False, script: Optional[Script] = None, n: int = 0,
                 seconds: float = 0.0, rate: float = 0.0, capacity: int = 0, keep_trace: int = 400,
                 dead: tuple[str, ...] = (), record: bool = False, node_changes: bool = True) -> None:
        self.seed = seed
        self.script = script
        self.dead = set(dead)  # hosts of a scenario that never come back
        rnd = random.Random(seed * 7919 + 1)  # the run's shape, from the seed
        self.n = n or rnd.choice((3, 3, 3, 3, 3, 4, 5, 2))
        self.seconds = seconds or rnd.choice((10.0, 20.0, 30.0, 45.0))
        capacity = capacity or rnd.choice((40, 150, 600, 5000))
        self.rate = rate or rnd.choice((1.0, 3.0, 8.0))  # transactions per second per node
        # one seed in six: a row changed behind Chorus's back on one node, so that applies touching
        # it fail there and the nodes vote (drawn apart from the faults: the fault menu stays)
        tamper = random.Random(seed * 104729 + 3)
        self.tamper = ((tamper.uniform(1.0, self.seconds), f"n{tamper.randint(1, self.n)}", tamper.randrange(12))
                       if script is None and tamper.random() < 1 / 6 else None)
        # one seed in four: the cluster's nodes change while the faults go on (`chorus node add`:
        # a new node, joined by total recovery; `chorus node remove`), one node at a time, drawn
        # apart from the faults too (seeds without changes keep their schedule; ``node_changes``
        # False: none, as a seed that failed before there were any replays it)
        self.member_rnd = random.Random(seed * 15485863 + 5)
        self.changes: list[tuple[float, str]] = []
        # half the nodes added: their operator starts them (Corosync and coordinator) at once, before
        # the change is applied or while it is refused (not configured yet, in the views all the same:
        # only configured nodes' Corosync ids count toward quorum)
        self.stray_rnd = random.Random(seed * 7919 + 17)
        if script is None and self.member_rnd.random() < 1 / 4 and node_changes:
            t = self.member_rnd.uniform(0.5, self.seconds * 0.6)  # after the cluster formed
            for op in self.member_rnd.choice((("add",), ("remove",), ("add", "remove"), ("remove", "add"),
                                              ("add", "add", "remove"), ("remove", "remove", "add"))):
                self.changes.append((t, op))
                t += self.member_rnd.uniform(0.5, 8.0)
        self.sim = sim = Sim(seed, n=self.n, log_capacity=capacity, trace=trace, keep_trace=keep_trace, record=record)
        self.rnd = sim.rnd
        self.faults: Counter[str] = Counter()
        self.stalled: set[str] = set()
        self.held_down: set[str] = set()  # hosts killed by a fault of their own, until it is undone
        self.total_recoveries = 0
        self.writing = False
        self.pending: list[tuple[str, str]] = []  # node changes asked and not settled: (add|remove, node)
        self.rebuild: set[str] = set()  # nodes added and not yet rebuilt by total recovery
        self.first_fault_at = 0.0
        self.asking = False  # a change is on its way through the cluster (its answer not read yet)
        self.ops_left = len(self.changes)  # changes of the schedule not done (or given up) yet
        sim.trace("sim", f"seed {seed}: {self.n} nodes, logs of {capacity} records, {self.rate}/s per node, "
                         f"{self.seconds} s of faults")

    # -- the schedule

    def go(self) -> Result:
        sim = self.sim
        res = Result(self.seed, False, self.n, self.seconds)
        try:
            first = sim.hosts["n1"]
            first.state = NodeState("n1", bootstrap=True)
            for h in sim.hosts.values():
                sim.clock.after(self.rnd.random() * 0.5, h.start_coordinator)
            self._until(lambda: self._all_online(), FORM_S, "the cluster did not form")
            self.writing = True
            self.first_fault_at = sim.clock.now
            for h in sim.hosts.values():
                self._client(h)
            end = sim.clock.now + self.seconds
            if self.script is None:
                self._nemesis(end)
                if self.tamper is not None:
                    at, name, key = self.tamper
                    sim.clock.after(at, self._tamper, sim.hosts[name], key)
                if self.changes:
                    sim.clock.after(self.changes[0][0], self._next_change)
            else:
                for t, fault, name, hold in self.script:
                    sim.clock.after(t, self._fault, fault, sim.hosts[name], hold)
            sim.clock.run_until(end)
            self.writing = False
            self.heal_all()
            healed = sim.clock.now
            sim.trace("sim", "faults stop: every host healed and started")
            self._until(self._settled, RECOVER_S, "the cluster did not come back", operator=True)
            res.recovered_in = sim.clock.now - healed
            self._final()
            res.ok = True
        except Violation as e:
            res.kind, res.error = "violation", str(e)
        except Stuck as e:
            res.kind, res.error = "stuck", str(e)
        except Exception as e:  # a bug in the core or the simulation: reported with its trace
            import traceback
            res.kind, res.error = "bug", "".join(traceback.format_exception(e))
        res.faults = self.faults
        res.acked = len(sim.checker.acked)
        res.total_recoveries = self.total_recoveries
        res.trace = list(sim.lines)
        res.traces = {name: w.getvalue() for name, w in sim.traces.items()}
        return res

    def _until(self, done: Callable[[], bool], within: float, what: str, operator: bool = False) -> None:
        sim = self.sim
        deadline = sim.clock.now + within
        while sim.clock.now < deadline:
            sim.clock.run_until(min(deadline, sim.clock.now + 1.0), done)
            if done():
                return
            if operator:
                self._operator()
        raise Stuck(f"{what} within {within:.0f} s:\n{self.describe()}")

    def describe(self) -> str:
        out = []
        for h in self.sim.hosts.values():
            c = h.coord
            if c is None or not c.alive:
                out.append(f"  {h.name}: down (database at GID {h.db.last}{', vote' if h.state.left_by_vote else ''})")
                continue
            r = c.r
            rec = c.plan.status()
            out.append(f"  {h.name}: {r.phase.value}: {c.phase_reason}; committed {h.db.last}, certified "
                       f"{r.last_certified}, members {sorted(r.online)} synced {sorted(r.synced)}, log "
                       f"({h.log.base_gid}, {h.log.end_gid}], pending {len(c.book.pending)}"
                       + (f", catch-up {rec['state']} at {rec['position']} of {rec['upto']}" if rec else "")
                       + (f", re-form: {r.reform.reason}" if r.reform is not None else ""))
        return "\n".join(out)

    def _client(self, h: Host) -> None:
        if not self.writing:
            return
        self.sim.client_txn(h)
        self.sim.clock.after(self.rnd.expovariate(self.rate), self._client, h)

    def _all_online(self) -> bool:
        return all(h.phase == "online" for h in self.sim.hosts.values())

    def live(self) -> list[Host]:
        """The cluster's hosts: not those of a scenario that never come back, nor removed ones."""
        return [h for h in self.sim.hosts.values() if h.name not in self.dead and not h.state.removed]

    def _settled(self) -> bool:
        if self.ops_left or self.asking or self.rebuild:
            return False  # the operator's node changes are done first
        coords = self.sim.coords()
        live = {h.name for h in self.live()}
        if {c.name for c in coords} != live or any(c.r.phase != Phase.ONLINE for c in coords):
            return False
        if any(t.state in ("sent", "certified") and t.node in live for t in self.sim.txns[-200:]):
            return False
        lasts = {c.host.db.last for c in coords} | {c.r.last_certified for c in coords}
        return len(lasts) == 1 and not any(c.book.pending for c in coords) and \
            all(set(c.r.synced) == live for c in coords)

    # -- faults

    def _nemesis(self, end: float) -> None:
        t = self.sim.clock.now + self.rnd.uniform(0.5, 3.0)
        while t < end:
            fault = self.rnd.choices(FAULTS, WEIGHTS)[0]
            hold = self.rnd.uniform(0.5, 8.0)
            target = self.rnd.choice(list(self.sim.hosts.values()))
            self.sim.clock.at(t, self._fault, fault, target, hold)
            t += hold * (0.3 if self.rnd.random() < 0.25 else 1.0) + self.rnd.uniform(0.2, 5.0)  # some overlap

    def _fault(self, fault: str, h: Host, hold: float) -> None:
        sim = self.sim
        self.faults[fault] += 1
        sim.trace("nem", f"{fault} {h.name} for {hold:.1f} s")
        undo: Callable[[], None]
        if fault in ("partition-halves", "isolate-one", "all-alone"):
            order = [x.index for x in sim.hosts.values()]  # (1..n unless nodes were added)
            self.rnd.shuffle(order)
            if fault == "partition-halves":
                cut = self.rnd.randint(1, len(order) - 1)
                groups = [sorted(order[:cut]), sorted(order[cut:])]
            elif fault == "isolate-one":
                groups = [[h.index], [i for i in order if i != h.index]]
            else:
                groups = [[i] for i in order]
            sim.partition = groups
            sim.bus.regroup(TOKEN_TIMEOUT_S)
            undo = self.heal_network
        elif fault == "kill-coordinator":
            if h.coord is not None:
                h.coord.crash()

            def undo() -> None:
                if h.name not in self.held_down and h.name not in self.dead:
                    h.start_coordinator()
        elif fault == "kill-postgres":
            self.crash_db(h, keep=self.rnd.randint(0, 3))
            undo = lambda: self.start_db(h)  # noqa: E731
        elif fault in ("kill-corosync", "kill-host", "power-cut-host"):
            if fault == "kill-corosync":
                h.bus_up = False
                if h.coord is not None:
                    h.coord.crash(TOKEN_TIMEOUT_S)
            else:
                self.crash_host(h, power=fault == "power-cut-host")
            self.held_down.add(h.name)

            def undo() -> None:
                self.held_down.discard(h.name)
                self.restart_host(h)
        elif fault in ("crash-all", "power-cut-all"):
            for x in sim.hosts.values():
                self.crash_host(x, power=fault == "power-cut-all")

            def undo() -> None:
                for x in sim.hosts.values():
                    sim.clock.after(self.rnd.random() * 2, self.restart_host, x)
        elif fault == "freeze":
            self.freeze(h)
            undo = lambda: self.thaw(h)  # noqa: E731
        elif fault == "stall-postgres":  # its database hangs (SIGSTOP of PostgreSQL alone; if it is
            self.stalled.add(h.name)     # down, from when it starts)
            h.db.frozen = h.db.up

            def undo() -> None:
                self.stalled.discard(h.name)
                h.db.frozen = h.frozen and h.db.up
        else:
            sim.bus.extra_latency = self.rnd.choice((0.005, 0.02, 0.05))
            undo = lambda: setattr(sim.bus, "extra_latency", 0.0)  # noqa: E731

        def undo_logged() -> None:
            sim.trace("nem", f"undo {fault} {h.name}")
            undo()
        sim.clock.after(hold, undo_logged)

    def _tamper(self, h: Host, key: int) -> None:
        self.faults["tamper"] += 1
        self.sim.trace("nem", f"tamper {h.name}: row {key} changed behind Chorus's back")
        h.db.tampered.add(key)

    def crash_db(self, h: Host, keep: int) -> None:
        db = self.sim.hosts[h.name].db
        if not db.up:
            return
        lost = db.lose_unflushed(keep=min(keep, len(db.order) - 1 - db.order.index(db.flushed)))
        db.up = False
        h.db_generation += 1
        h.lost_gid = 0  # the extension's shared memory starts again
        if h.coord is not None and h.coord.alive and not h.coord.frozen:
            h.coord.backends_died()  # their sockets close (a frozen coordinator reads it at the thaw)
        self.sim.trace(h.name, f"PostgreSQL crashed at GID {db.last}, lost {lost}")
        self.sim.checker.lost(h, lost)

    def start_db(self, h: Host) -> None:
        if not h.powered or h.name in self.held_down or h.name in self.dead:
            return
        h.db.up = True
        h.db.frozen = h.name in self.stalled
        h.start_coordinator()

    def crash_host(self, h: Host, power: bool) -> None:
        if h.frozen:
            self.thaw(h)
        if h.coord is not None:
            h.coord.crash(TOKEN_TIMEOUT_S)
        self.crash_db(h, keep=0 if power else self.rnd.randint(0, 5))
        if power:
            h.log.power_cut(self.rnd)
            h.powered = False
        h.bus_up = False

    def restart_host(self, h: Host) -> None:
        if h.name in self.held_down or h.name in self.dead:
            return  # a fault of its own keeps it down
        self.thaw(h)  # what was stopped is killed first (Lab.kill_host thaws); new processes run
        h.powered = True
        h.bus_up = True
        h.db.up = True
        h.db.frozen = h.name in self.stalled
        h.start_coordinator()

    def freeze(self, h: Host) -> None:
        """SIGSTOP the host's running processes (docs/LAB.md): its coordinator and PostgreSQL."""
        if h.frozen:
            return
        h.frozen = True
        h.db.frozen = h.db.up
        if h.coord is not None and h.coord.alive:
            h.coord.frozen = True
            self.sim.bus.freeze(h.coord.member)

    def thaw(self, h: Host) -> None:
        if not h.frozen:
            return
        h.frozen = False
        h.db.frozen = False
        if h.coord is not None and h.coord.frozen:
            h.coord.frozen = False
            if h.coord.alive:
                h.coord.thawed()
                self.sim.bus.thaw(h.coord.member)

    def heal_network(self) -> None:
        self.sim.partition = None
        self.sim.bus.regroup(MERGE_S)

    def heal_all(self) -> None:
        sim = self.sim
        self.heal_network()
        sim.bus.extra_latency = 0.0
        self.held_down.clear()
        for h in self.live():
            self.thaw(h)
            if not (h.powered and h.bus_up and h.db.up and h.coord is not None and h.coord.alive):
                sim.clock.after(self.rnd.random() * 2, self.restart_host, h)

    # -- the operator, once the faults stopped: total recovery where a node says it needs it

    def _operator(self) -> None:
        for op, node in list(self.pending):
            self._change(op, node)
        for h in self.live():
            self._rebuild_if_needed(h)

    def _rebuild_if_needed(self, h: Host) -> None:
        """Total recovery of ``h`` if it says it needs it, was voted out, or was added."""
        sim = self.sim
        c = h.coord
        needs = ((c is not None and c.alive and c.r.phase == Phase.NEEDS_RECOVERY
                  and "total recovery" in c.phase_reason) or bool(h.state.left_by_vote) or h.name in self.rebuild)
        if not needs:
            return
        # an online donor, the one that holds most; with none (two nodes, one voted out: the
        # other is no quorum alone), the database that holds most, as `--donor-dsn` would
        donors = ([d for d in self.live() if d.phase == "online"]
                  or [d for d in self.live() if d is not h and d.db.up and not d.state.left_by_vote])
        if not donors:
            return
        donor = max(donors, key=lambda d: (d.db.last, -d.index))
        problem = history.donor_problem(h.name, h.db.last, donor.name, donor.db.last)
        if problem is not None:
            sim.trace("op", f"chorus node join --total {h.name} refuses: {problem}")
            return
        self.total_recovery(h, donor)

    def total_recovery(self, h: Host, donor: Host) -> None:
        sim = self.sim
        sim.trace("op", f"total recovery of {h.name} (at GID {h.db.last}) from {donor.name} (at GID {donor.db.last})")
        self.total_recoveries += 1
        self.rebuild.discard(h.name)
        if h.coord is not None:
            h.coord.crash(PROCESS_CHANGE_S)
        old = list(h.db.order)
        h.db_generation += 1  # a new data directory: the old one's backends are gone
        h.lost_gid = 0
        h.db.replace_with(donor.db)
        sim.checker.replaced(h, old)
        h.log.reset(h.db.last)
        epochs = donor.coord.r.epochs if donor.coord is not None and donor.coord.alive else donor.state.epochs
        h.state = h.state.with_(cluster_uuid=donor.state.cluster_uuid, last_gid=h.db.last, left_by_vote="",
                                removed="", bootstrap=False, epochs=epochs)
        sim.clock.after(1.0, h.start_coordinator)

    # -- the operator's node changes (`chorus node add` / `chorus node remove`: cli/members.py)

    def _asker(self, but: str) -> Optional[Host]:
        """A node online in the primary component to ask (`chorus node add/remove` refuse others)."""
        ok = [h for h in self.live() if h.name != but and h.coord is not None and h.coord.alive
              and not h.coord.frozen and h.coord.r.phase == Phase.ONLINE and h.coord.r.quorate]
        return self.member_rnd.choice(ok) if ok else None

    def _next_change(self) -> None:
        """The schedule's next change, not before its time: one at a time, as an operator makes them."""
        if self.changes:
            at, op = self.changes.pop(0)
            self.sim.clock.at(max(self.sim.clock.now, self.first_fault_at + at), self._change, op, "")

    def _change(self, op: str, node: str) -> None:
        """``op`` of ``node`` ("" at first: the CLI picks the new node's name, the schedule the node
        removed), as the CLI does it: checks, the new host's PostgreSQL made (add) or the node
        stopped (remove), the change through an online node's coordinator, then the answer."""
        sim = self.sim
        if (op, node) in self.pending:
            self.pending.remove((op, node))
        asker = self._asker(node if op == "remove" else "")
        if asker is None:
            return self._again(op, node, "no node is online in the primary component")
        assert asker.coord is not None
        r = asker.coord.r
        current = list(r.config.nodes) if r.config is not None else [f"n{i}" for i in range(1, self.n + 1)]
        if op == "add" and node and node in current or op == "remove" and node and node not in current:
            return self._changed(op, node)  # an earlier request went through (its answer was lost)
        if op == "remove" and len(current) <= 2:
            # a cluster of one node cannot grow again (the node added counts at once, and one of
            # two is no quorum: docs/MEMBERSHIP.md), so the schedule's later adds could not happen
            sim.trace("op", f"chorus node remove: not to one node ({', '.join(current)}); not done")
            self.ops_left -= 1
            return self._next_change()
        if op == "add":
            node = node or f"n{max(h.index for h in sim.hosts.values()) + 1}"
            new = current + [node]
        else:
            node = node or self.member_rnd.choice(current)
            new = [n for n in current if n != node]
        problem = quorum_problem(sorted(r.online), new)
        if problem is not None:
            return self._again(op, node, problem)
        if op == "add" and node not in sim.hosts:
            sim.add_host()  # its PostgreSQL, empty; started by total recovery once it is configured
            self.dead.add(node)  # till then nothing starts it (a restart of every host neither)
            if self.stray_rnd.random() < 0.5:  # ... but its operator, unconfigured
                sim.clock.after(self.stray_rnd.uniform(0.0, 2.0), self._stray, sim.hosts[node])
        elif op == "remove":
            self.dead.add(node)  # stopped first; nothing starts it again
            t = sim.hosts[node]
            if t.coord is not None:
                t.coord.crash()
        # every Corosync reloads the new node list: votequorum's votes follow it
        sim.bus.votes = Votes(len(new) // 2 + 1, len(new), "")
        rid = f"{op}-{self.member_rnd.getrandbits(48):012x}"
        version = (r.config.version if r.config is not None else 0) + 1
        sim.trace("op", f"chorus node {op} {node} through {asker.name}: configured nodes {','.join(sorted(new))} "
                        f"(version {version})")
        # each node's Corosync node id, as corosync.conf's node list says (the CLI sends them)
        asker.coord.send(bp.Configure(asker.name, rid, version, tuple(sorted(new)), "",
                                      tuple((n, n[1:]) for n in sorted(new))))
        self.asking = True
        sim.clock.after(0.2, self._answer, op, node, rid, sim.clock.now + 20.0)

    def _stray(self, h: Host) -> None:
        """An added node's coordinator (its Corosync) started by its operator before it is configured:
        in the group's views until it is refused (it then stops, as removed)."""
        if h.name in self.dead and (h.coord is None or not h.coord.alive):
            self.sim.trace("op", f"{h.name} started before it is configured")
            # its operator runs it from here (restarted like the others): refused, it stops for good
            # (removed) until the change is made; admitted (the change was made, its answer lost),
            # it is a node of the cluster
            self.dead.discard(h.name)
            h.start_coordinator()

    def _answer(self, op: str, node: str, rid: str, deadline: float) -> None:
        sim = self.sim
        a = sim.answers.pop(rid, None)
        if a is None and sim.clock.now < deadline:
            sim.clock.after(0.2, self._answer, op, node, rid, deadline)
            return
        self.asking = False
        if a is not None and a.ok:
            return self._changed(op, node)
        why = a.reason if a is not None else "no answer in 20 s"
        if op == "remove":  # the CLI starts it again
            self.dead.discard(node)
            self.restart_host(sim.hosts[node])
        self._again(op, node, why)  # (an answer lost: the next try reads what the cluster holds)

    def _again(self, op: str, node: str, why: str) -> None:
        """Not done now: again in a second while the faults last, then by the operator."""
        self.sim.trace("op", f"chorus node {op} {node or ''}: not done ({why})")
        if self.writing:
            self.sim.clock.after(1.0, self._change, op, node)
        elif (op, node) not in self.pending:
            self.pending.append((op, node))

    def _changed(self, op: str, node: str) -> None:
        sim = self.sim
        self.faults[f"node-{op}"] += 1
        self.ops_left -= 1
        sim.trace("op", f"chorus node {op} {node}: done")
        if op == "remove":
            self.rebuild.discard(node)
        if op == "add":  # it joins by total recovery, now or once a donor is online
            h = sim.hosts[node]
            self.dead.discard(node)
            # a machine set up anew: whatever the faults did to it while it was not in the cluster
            h.frozen = h.db.frozen = False
            h.powered = h.bus_up = h.db.up = True
            h.state = h.state.with_(removed="")  # refused before it was configured (a stray start)
            self.rebuild.add(node)
            self._rebuild_if_needed(h)
            self._client(h)
            if node in self.rebuild:
                self.pending_rebuild(h)
            # `chorus node add` returns once the node is online (or its wait times out)
            return self._when_online(h, sim.clock.now + 120.0)
        self._next_change()

    def _when_online(self, h: Host, deadline: float) -> None:
        if h.phase == "online" or self.sim.clock.now >= deadline:
            self._next_change()
        else:
            self.sim.clock.after(0.5, self._when_online, h, deadline)

    def pending_rebuild(self, h: Host) -> None:
        if h.name in self.rebuild and self.writing:
            self._rebuild_if_needed(h)
            self.sim.clock.after(1.0, self.pending_rebuild, h)

    # -- after the faults

    def _final(self) -> None:
        sim = self.sim
        hosts = self.live()
        ref = hosts[0].db
        for h in hosts[1:]:
            if h.db.order != ref.order or h.db.chain[h.db.last] != ref.chain[ref.last]:
                raise Violation(f"{h.name}'s database differs from {hosts[0].name}'s after the cluster settled")
        for gid, ident in sim.checker.acked.items():
            if ref.ident.get(gid) != ident:
                raise Violation(f"acknowledged transaction {ident} (GID {gid}) is not in the databases")
        configs = {h.coord.r.config for h in hosts if h.coord is not None and h.coord.r.config is not None}
        if self.faults["node-add"] + self.faults["node-remove"]:
            names = tuple(sorted(h.name for h in hosts))
            if {c.nodes for c in configs} != {names} or len(configs) != 1 or \
                    any(h.coord is None or h.coord.r.config is None for h in hosts):
                raise Violation(f"the configured nodes after the changes are {sorted(configs, key=str)}, the "
                                f"cluster's nodes {list(names)}")
        present = set(ref.ident.values())
        for t in sim.txns:
            if t.state == "failed" and t.xid in present:
                raise Violation(f"transaction {t.node}/{t.xid} was told it failed, but committed")


def run(seed: int, trace: bool = False, **shape: object) -> Result:
    chorus_log = logging.getLogger("chorus")
    level = chorus_log.level
    chorus_log.setLevel(logging.CRITICAL)
    import chorus.replicator as replicator_module
    real_uuid = replicator_module.uuid
    try:
        return Run(seed, trace, **shape).go()  # type: ignore[arg-type]
    finally:
        replicator_module.uuid = real_uuid
        chorus_log.setLevel(level)


def parse_seeds(text: str) -> range:
    a, _, b = text.partition("..")
    return range(int(a), int(b or a) + 1)


def replay_command(seed: int) -> str:
    return f".venv/bin/python tests/sim/simrun.py --seed {seed} --trace"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1..100", help="A..B")
    ap.add_argument("--seed", type=int, help="one seed")
    ap.add_argument("--trace", action="store_true", help="print every step")
    ap.add_argument("--quiet", action="store_true", help="only failures and the summary")
    ap.add_argument("--record", metavar="DIR", help="write each coordinator's core trace to DIR/<seed>-<node>-<n>.trace "
                    "(chorus/dataplane/trace.py; replay with chorus.dataplane.replay)")
    args = ap.parse_args(argv)
    seeds = range(args.seed, args.seed + 1) if args.seed is not None else parse_seeds(args.seeds)
    t0 = time.monotonic()
    failed = []
    kinds: Counter[str] = Counter()
    slowest = 0.0
    for s in seeds:
        r = run(s, trace=args.trace, record=bool(args.record))
        if args.record:
            os.makedirs(args.record, exist_ok=True)
            for name, data in r.traces.items():
                with open(os.path.join(args.record, f"{s}-{name}.trace"), "wb") as f:
                    f.write(data)
        if not r.ok:
            failed.append(r)
            print(r.line(), flush=True)
            if not args.trace:
                print("\n".join("    " + line for line in r.trace[-60:]))
            print(f"  replay: {replay_command(s)}", flush=True)
        elif not args.quiet:
            print(r.line(), flush=True)
        kinds[r.kind or "ok"] += 1
        slowest = max(slowest, r.recovered_in)
    print(f"{len(seeds)} seeds in {time.monotonic() - t0:.1f} s: {dict(kinds)}; slowest recovery after the heal "
          f"{slowest:.1f} simulated s; failed: {[r.seed for r in failed]}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
