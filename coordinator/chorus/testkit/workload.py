"""Workloads that run against every node at once (demo, tests, benchmarks).

Each worker is bound to one node, retries certification losses (SQLSTATE 40001) and records
what was acknowledged, so a checker can compare what clients were told with what the nodes hold.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import psycopg

RETRYABLE = {"40001", "40P01"}


@dataclass
class WorkerResult:
    node: str
    commits: int = 0
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    acked: list[Any] = field(default_factory=list)  # what clients were told committed
    refused: int = 0  # expected refusals (a local constraint said no): not acknowledged


# An operation: given a connection and a random source, run one transaction and return what to
# record as acknowledged (or None). Raising psycopg.Error with a SQLSTATE in ``expected`` counts
# as a refusal; 40001 is retried as a new operation.
Operation = Callable[[psycopg.Connection[Any], random.Random, str], Any]


def _recover(conn: psycopg.Connection[Any], out: WorkerResult) -> bool:
    """After an error: end a transaction block the server left aborted (a cancel that lands on
    COMMIT leaves it so, as in PostgreSQL). False if the connection is gone."""
    if conn.closed:
        out.errors.append("the connection was closed")
        return False
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        try:
            conn.rollback()
        except psycopg.Error as e:
            out.errors.append(f"rollback: {e}")
            return False
    return True


def _worker(dsn: str, node: str, op: Operation, until: float, seed: int, out: WorkerResult,
            expected: frozenset[str]) -> None:
    rnd = random.Random(seed)
    try:
        conn = psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as e:
        out.errors.append(f"connect: {e}")
        return
    with conn:
        while time.monotonic() < until:
            t0 = time.monotonic()
            try:
                with conn.transaction():
                    ack = op(conn, rnd, node)
                out.commits += 1
                out.latencies_ms.append((time.monotonic() - t0) * 1000)
                if ack is not None:
                    out.acked.append(ack)
            except psycopg.Error as e:
                if not _recover(conn, out):
                    return
                if e.sqlstate in RETRYABLE:
                    out.conflicts += 1
                elif e.sqlstate in expected:
                    out.refused += 1
                else:
                    out.errors.append(f"{e.sqlstate}: {str(e).strip()}")
                    if len(out.errors) > 20:
                        return
                    time.sleep(0.05)


def run_workload(nodes: Sequence[tuple[str, str]], op: Operation, seconds: float,
                 workers_per_node: int = 2, expected: frozenset[str] = frozenset()) -> list[WorkerResult]:
    """Run ``op`` in a loop on every node for ``seconds``, ``workers_per_node`` clients each."""
    until = time.monotonic() + seconds
    results: list[WorkerResult] = []
    threads = []
    for i, (name, dsn) in enumerate(nodes):
        for w in range(workers_per_node):
            r = WorkerResult(name)
            results.append(r)
            t = threading.Thread(target=_worker, args=(dsn, name, op, until, i * 100 + w, r, expected))
            t.start()
            threads.append(t)
    for t in threads:
        t.join(seconds + 60)
    return results


# ---- counter: increments of one row from every node ---------------------------------------

COUNTER_SCHEMA = "CREATE TABLE IF NOT EXISTS jepsen_counter (id integer PRIMARY KEY, n bigint NOT NULL)"


def counter_op(conn: psycopg.Connection[Any], rnd: random.Random, node: str) -> Any:
    conn.execute("UPDATE jepsen_counter SET n = n + 1 WHERE id = 1")
    return 1


# ---- set: inserts with colliding primary keys and unique values ----------------------------

SET_SCHEMA = ("CREATE TABLE IF NOT EXISTS jepsen_set (id integer PRIMARY KEY, u integer NOT NULL UNIQUE, "
              "node text NOT NULL)")
SET_KEYS = 3000  # ids and unique values are drawn from this range: many collisions


def set_op(conn: psycopg.Connection[Any], rnd: random.Random, node: str) -> Any:
    row = (rnd.randrange(SET_KEYS), rnd.randrange(SET_KEYS), node)
    conn.execute("INSERT INTO jepsen_set (id, u, node) VALUES (%s, %s, %s)", row)
    return row


# ---- foreign keys: child inserts against parent deletes ------------------------------------

FK_SCHEMA = ("CREATE TABLE IF NOT EXISTS jepsen_parent (id integer PRIMARY KEY)",
             "CREATE TABLE IF NOT EXISTS jepsen_child (id bigserial PRIMARY KEY, "
             "parent integer NOT NULL REFERENCES jepsen_parent (id), node text NOT NULL)")
FK_PARENTS = 200


def fk_op(conn: psycopg.Connection[Any], rnd: random.Random, node: str) -> Any:
    p = rnd.randrange(FK_PARENTS)
    if rnd.random() < 0.5:
        conn.execute("INSERT INTO jepsen_child (parent, node) VALUES (%s, %s)", (p, node))
        return ("child", p)
    cur = conn.execute("DELETE FROM jepsen_parent WHERE id = %s", (p,))
    if cur.rowcount == 0:  # deleted already: put it back, so the run keeps deleting
        conn.execute("INSERT INTO jepsen_parent (id) VALUES (%s)", (p,))
        return ("parent+", p)
    return ("parent-", p)


BANK_SCHEMA = ("CREATE TABLE IF NOT EXISTS bank_accounts (id integer PRIMARY KEY, "
               "balance bigint NOT NULL, updated_by text)")


def bank_setup(dsn: str, accounts: int, initial: int) -> None:
    """Create the accounts with replication on, from one node (rows reach every node)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("DELETE FROM bank_accounts")
            with conn.cursor().copy("COPY bank_accounts (id, balance) FROM STDIN") as cp:
                for i in range(accounts):
                    cp.write_row((i, initial))


def bank_op(accounts: int) -> Operation:
    """A transfer of a small amount between two random accounts."""
    def op(conn: psycopg.Connection[Any], rnd: random.Random, node: str) -> Any:
        a, b = rnd.sample(range(accounts), 2)
        amount = rnd.randint(1, 10)
        conn.execute("UPDATE bank_accounts SET balance = balance - %s, updated_by = %s WHERE id = %s",
                     (amount, node, a))
        conn.execute("UPDATE bank_accounts SET balance = balance + %s, updated_by = %s WHERE id = %s",
                     (amount, node, b))
        return None
    return op


def run_bank(nodes: Sequence[tuple[str, str]], accounts: int, seconds: float,
             workers_per_node: int = 2) -> list[WorkerResult]:
    """Transfers between random accounts from every node for ``seconds``."""
    return run_workload(nodes, bank_op(accounts), seconds, workers_per_node)


def bank_total(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row: Any = conn.execute("SELECT coalesce(sum(balance), 0) FROM bank_accounts").fetchone()
        return int(row[0])


# ---- fault runs: clients that outlive their node's outages ---------------------------------

DEFINITE = {"40001", "40P01", "23505", "23503", "25006", "54000"}  # certainly not committed


@dataclass
class Outcomes:
    """What every attempt of one client came to: acknowledged, certainly not committed, or
    unknown (the commit's fate was not reported: SQLSTATE 08007, or the connection broke)."""
    node: str
    acked: list[Any] = field(default_factory=list)
    failed: list[Any] = field(default_factory=list)
    unknown: list[Any] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # SQLSTATE (or "connection") -> count
    latencies_ms: list[float] = field(default_factory=list)
    commit_times: list[float] = field(default_factory=list)  # monotonic time of each acknowledgement


class Load:
    """Clients on every node running ``op`` until :meth:`stop`, reconnecting after an outage.

    Unlike :func:`run_workload`, an error ends nothing: a node outside the primary component
    refuses writes, a killed node drops its connections, and the client keeps trying, recording
    each attempt's outcome so a checker can hold the cluster to what clients were told.
    """

    def __init__(self, nodes: Sequence[tuple[str, str]],
                 op: Callable[[psycopg.Connection[Any], random.Random, str, list[Any]], Any],
                 workers_per_node: int = 2, pause: float = 0.0) -> None:
        self.stop_event = threading.Event()
        self.results: list[Outcomes] = []
        self.threads: list[threading.Thread] = []
        self.pause = pause
        base = random.randrange(1 << 30)  # each run its own rows: a checker must not meet an earlier run's
        for i, (name, dsn) in enumerate(nodes):
            for w in range(workers_per_node):
                out = Outcomes(name)
                self.results.append(out)
                self.threads.append(threading.Thread(target=self._client, args=(dsn, op, base + i * 100 + w, out),
                                                     daemon=True))

    def start(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> list[Outcomes]:
        self.stop_event.set()
        for t in self.threads:
            t.join(60)
        return self.results

    def _client(self, dsn: str, op: Callable[..., Any], seed: int, out: Outcomes) -> None:
        rnd = random.Random(seed)
        conn: Any = None
        while not self.stop_event.is_set():
            if conn is None or conn.closed:
                try:
                    conn = psycopg.connect(dsn, autocommit=True, connect_timeout=3)
                except psycopg.Error:
                    out.errors["connect"] = out.errors.get("connect", 0) + 1
                    self.stop_event.wait(0.5)
                    continue
            intent: list[Any] = []
            t0 = time.monotonic()
            try:
                with conn.transaction():
                    ack = op(conn, rnd, out.node, intent)
                out.latencies_ms.append((time.monotonic() - t0) * 1000)
                out.commit_times.append(time.monotonic())
                if ack is not None:
                    out.acked.append(ack)
            except psycopg.Error as e:
                state = e.sqlstate or "connection"
                out.errors[state] = out.errors.get(state, 0) + 1
                (out.failed if state in DEFINITE else out.unknown).extend(intent)
                if not _recover(conn, WorkerResult(out.node)):
                    conn = None
                if state not in ("40001", "40P01", "23505"):
                    self.stop_event.wait(0.1)  # refused or broken: do not spin
            if self.pause:
                self.stop_event.wait(self.pause)
        if conn is not None and not conn.closed:
            conn.close()


def set_intent_op(conn: psycopg.Connection[Any], rnd: random.Random, node: str, intent: list[Any]) -> Any:
    """:func:`set_op` that says what it tries before it tries it."""
    row = (rnd.randrange(SET_KEYS * 100), rnd.randrange(SET_KEYS * 100), node)
    intent.append(row)
    conn.execute("INSERT INTO jepsen_set (id, u, node) VALUES (%s, %s, %s)", row)
    return row


def bank_intent_op(accounts: int) -> Callable[..., Any]:
    inner = bank_op(accounts)

    def op(conn: psycopg.Connection[Any], rnd: random.Random, node: str, intent: list[Any]) -> Any:
        return inner(conn, rnd, node)
    return op


def check_set(results: Sequence[Outcomes], rows: set[tuple[int, int, str]]) -> list[str]:
    """Every acknowledged insert is present; none that certainly failed is."""
    problems = []
    acked = {tuple(r) for o in results for r in o.acked}
    maybe = acked | {tuple(r) for o in results for r in o.unknown}
    lost = acked - rows
    if lost:
        problems.append(f"{len(lost)} acknowledged inserts are missing, e.g. {sorted(lost)[:3]}")
    ghosts = {tuple(r) for o in results for r in o.failed} - maybe
    present = ghosts & rows
    if present:
        problems.append(f"{len(present)} inserts that failed are present, e.g. {sorted(present)[:3]}")
    return problems
