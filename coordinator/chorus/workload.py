"""Workloads that run against every node at once (demo, tests, benchmarks).

Each worker is bound to one node, retries certification losses (SQLSTATE 40001) and records
what was acknowledged, so a checker can compare what clients were told with what the nodes hold.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import psycopg

RETRYABLE = {"40001", "40P01"}


@dataclass
class WorkerResult:
    node: str
    commits: int = 0
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)


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


def _bank_worker(dsn: str, node: str, accounts: int, until: float, seed: int, out: WorkerResult) -> None:
    rnd = random.Random(seed)
    try:
        conn = psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as e:
        out.errors.append(f"connect: {e}")
        return
    with conn:
        while time.monotonic() < until:
            a, b = rnd.sample(range(accounts), 2)
            amount = rnd.randint(1, 10)
            t0 = time.monotonic()
            try:
                with conn.transaction():
                    conn.execute("UPDATE bank_accounts SET balance = balance - %s, updated_by = %s WHERE id = %s",
                                 (amount, node, a))
                    conn.execute("UPDATE bank_accounts SET balance = balance + %s, updated_by = %s WHERE id = %s",
                                 (amount, node, b))
                out.commits += 1
                out.latencies_ms.append((time.monotonic() - t0) * 1000)
            except psycopg.Error as e:
                if e.sqlstate in RETRYABLE:
                    out.conflicts += 1
                    continue
                out.errors.append(f"{e.sqlstate}: {str(e).strip()}")
                if len(out.errors) > 20:
                    return
                time.sleep(0.05)


def run_bank(nodes: Sequence[tuple[str, str]], accounts: int, seconds: float,
             workers_per_node: int = 2) -> list[WorkerResult]:
    """Transfers between random accounts from every node for ``seconds``."""
    until = time.monotonic() + seconds
    results: list[WorkerResult] = []
    threads = []
    for i, (name, dsn) in enumerate(nodes):
        for w in range(workers_per_node):
            r = WorkerResult(name)
            results.append(r)
            t = threading.Thread(target=_bank_worker, args=(dsn, name, accounts, until, i * 100 + w, r))
            t.start()
            threads.append(t)
    for t in threads:
        t.join(seconds + 60)
    return results


def bank_total(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row: Any = conn.execute("SELECT coalesce(sum(balance), 0) FROM bank_accounts").fetchone()
        return int(row[0])
