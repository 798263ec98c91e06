"""Nemesis campaigns on the lab (docs/LAB.md, issue 34): one seed after another, each a run of
the randomized nemesis (nemesis.py) under the list-append, bank and set workloads, then the heal,
the time until every node is online again, and the checks. Per seed a report: the faults made,
the transactions and their outcomes, the anomalies found, the time to recover after the heal,
or the stuck state with every node's phase and reason.

It breaks and checks; printing is the CLI's (``chorus lab nemesis``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import psycopg

from chorus.testkit import appendload
from chorus.admin import admin_request
from chorus.testkit.check import CheckError, NodeRef, compare, wait_quiescent
from chorus.testkit.lab.nemesis import Nemesis
from chorus.testkit.lab.rig import Lab
from chorus.testkit.workload import (BANK_SCHEMA, DEFINITE, SET_SCHEMA, Load, Outcomes, bank_intent_op, bank_setup,
                             bank_total, check_set, set_intent_op)

WORKLOADS = ("append", "bank", "set")
ACCOUNTS = 40
INITIAL = 1000
STATUS_FIELDS = ("state", "reason", "members", "synced_members", "committed_gid", "certified_gid", "recovery",
                 "reform")


@dataclass
class SeedReport:
    seed: int
    seconds: float
    faults: dict[str, int] = field(default_factory=dict)
    appends: dict[str, int] = field(default_factory=dict)  # list-append transactions: ok, fail, info
    transfers: dict[str, int] = field(default_factory=dict)  # bank: acked, failed, unknown
    inserts: dict[str, int] = field(default_factory=dict)  # set: acked, failed, unknown
    anomalies: list[str] = field(default_factory=list)  # forbidden ones, lost acknowledgements, divergence
    allowed: dict[str, int] = field(default_factory=dict)  # anomalies snapshot isolation allows
    recovered_in: Optional[float] = None  # seconds from the heal until every node was online
    stuck: Optional[dict[str, dict[str, Any]]] = None  # every node's status when it did not come back
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.stuck is None and not self.anomalies

    def line(self) -> str:
        faults = ", ".join(f"{k} x{v}" for k, v in sorted(self.faults.items()))
        txns = (f"appends {self.appends.get('ok', 0)} ok/{self.appends.get('fail', 0)} failed/"
                f"{self.appends.get('info', 0)} unknown; transfers {self.transfers.get('acked', 0)} acked; "
                f"inserts {self.inserts.get('acked', 0)} acked")
        if self.stuck is not None:
            nodes = "; ".join(f"{n}: {st.get('state')}: {st.get('reason')}" for n, st in sorted(self.stuck.items()))
            return f"seed {self.seed}: STUCK after {self.seconds:.0f} s of faults ({faults}); {txns}; {nodes}"
        verdict = "ok" if self.ok else f"{len(self.anomalies)} ANOMALIES"
        return (f"seed {self.seed}: {verdict}; {self.seconds:.0f} s of faults ({faults}); {txns}; back "
                f"{self.recovered_in:.1f} s after the heal")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _counts(results: list[Outcomes]) -> dict[str, int]:
    """Acknowledged commits, and attempts that certainly failed or whose outcome is unknown."""
    return {"acked": sum(len(o.commit_times) for o in results),
            "failed": sum(n for o in results for state, n in o.errors.items() if state in DEFINITE),
            "unknown": sum(n for o in results for state, n in o.errors.items()
                           if state not in DEFINITE and state != "connect")}


def node_statuses(refs: list[NodeRef]) -> dict[str, dict[str, Any]]:
    """Every node's status in short ("down" when its coordinator does not answer)."""
    out: dict[str, dict[str, Any]] = {}
    for r in refs:
        try:
            st = admin_request(r.admin, timeout=3)["status"]
            out[r.name] = {k: st.get(k) for k in STATUS_FIELDS}
        except (OSError, ValueError, KeyError) as e:
            out[r.name] = {"state": "down", "reason": f"its coordinator does not answer ({e})"}
    return out


def wait_all_online(refs: list[NodeRef], timeout: float) -> Optional[dict[str, dict[str, Any]]]:
    """None once every node is online; else, after ``timeout``, every node's status."""
    deadline = time.monotonic() + timeout
    while True:
        st = node_statuses(refs)
        if all(s.get("state") == "online" for s in st.values()):
            return None
        if time.monotonic() > deadline:
            return st
        time.sleep(0.5)


def prepare(first_dsn: str, workloads: tuple[str, ...]) -> None:
    """Fresh tables for a seed, from one node (replicated to every node)."""
    if "append" in workloads:
        appendload.setup(first_dsn, appendload.Settings().keys)
    with psycopg.connect(first_dsn, autocommit=True) as conn:
        if "bank" in workloads:
            conn.execute(BANK_SCHEMA)
        if "set" in workloads:
            conn.execute(SET_SCHEMA)
            conn.execute("DELETE FROM jepsen_set")  # a row of an earlier seed would look like a failed insert
    if "bank" in workloads:
        bank_setup(first_dsn, ACCOUNTS, INITIAL)


def run_seed(lab: Lab, hosts: list[dict[str, Any]], seed: int, seconds: float, clients: int = 1,
             workloads: tuple[str, ...] = WORKLOADS, recover_timeout: float = 300.0,
             say: Callable[[str], None] = lambda line: None) -> SeedReport:
    """One seed: faults for ``seconds`` under the workloads, the heal, the wait for every node to
    come back (at most ``recover_timeout``), the checks. The lab must be online when it starts."""
    started = time.monotonic()
    report = SeedReport(seed, seconds)
    names = [h["name"] for h in hosts]
    targets = [(h["name"], h["socket_dsn"]) for h in hosts]  # a client reaches its own host
    refs = [NodeRef(h["name"], h["socket_dsn"], h["admin"]) for h in hosts]
    before = wait_all_online(refs, 120)
    if before is not None:
        report.stuck = before
        return report
    prepare(targets[0][1], workloads)
    try:
        wait_quiescent(refs, timeout=120)
    except CheckError as e:  # online, but a node cannot commit what it certified
        report.stuck = {n: dict(st, reason=f"{st.get('reason')} (before the run: {e})")
                        for n, st in node_statuses(refs).items()}
        return report
    histories: list[appendload.History] = []
    appends = threading.Thread(target=lambda: histories.append(
        appendload.run(targets, seconds + 8, clients, appendload.Settings(), seed=seed, prepared=True)), daemon=True)
    bank = Load(targets, bank_intent_op(ACCOUNTS), workers_per_node=clients) if "bank" in workloads else None
    sets = Load(targets, set_intent_op, workers_per_node=clients) if "set" in workloads else None
    for load in (bank, sets):
        if load is not None:
            load.start()
    if "append" in workloads:
        appends.start()
    nemesis = Nemesis(lab, names, seed, say=say)
    try:
        nemesis.run(seconds)  # heals and restarts everything at its end
    finally:
        healed = time.monotonic()
        report.faults = dict(Counter(e.what for e in nemesis.events if not e.what.startswith(("undo", "heal"))))
    report.stuck = wait_all_online(refs, recover_timeout)
    if report.stuck is None:
        report.recovered_in = round(time.monotonic() - healed, 1)
    if "append" in workloads:
        appends.join(seconds + 300)
    bank_results = bank.stop() if bank is not None else []
    set_results = sets.stop() if sets is not None else []
    report.transfers, report.inserts = _counts(bank_results), _counts(set_results)
    if report.stuck is not None:
        report.elapsed = round(time.monotonic() - started, 1)
        return report
    try:
        wait_quiescent(refs, timeout=300)
    except CheckError as e:
        report.anomalies.append(f"the cluster did not settle after it came back: {e}")
    _judge(report, targets, refs, histories, set_results, workloads)
    report.elapsed = round(time.monotonic() - started, 1)
    return report


def _judge(report: SeedReport, targets: list[tuple[str, str]], refs: list[NodeRef],
           histories: list[appendload.History], set_results: list[Outcomes], workloads: tuple[str, ...]) -> None:
    if "append" in workloads:
        if not histories:
            report.anomalies.append("the list-append clients did not end")
        else:
            h = histories[0]
            appendload.read_final(targets, h)
            checked = appendload.check(h)
            report.appends = h.counts()
            report.anomalies += [f"{a.kind}: {a.description}" for a in checked.violations]
            report.allowed = dict(Counter(a.kind for a in checked.allowed))
    if "bank" in workloads:
        for name, dsn in targets:
            total = bank_total(dsn)
            if total != ACCOUNTS * INITIAL:
                report.anomalies.append(f"bank total on {name} is {total}, not {ACCOUNTS * INITIAL}")
    if "set" in workloads:
        with psycopg.connect(targets[0][1], autocommit=True) as c:
            rows = {(int(a), int(b), str(n)) for a, b, n in c.execute("SELECT id, u, node FROM jepsen_set")}
        report.anomalies += check_set(set_results, rows)
    report.anomalies += [f"nodes differ: {d}" for d in compare(refs)]
