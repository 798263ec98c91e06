"""The list-append workload (issue 23; docs/CHECKER.md): clients on every node run short
REPEATABLE READ transactions of appends and reads over a few keys, record every invocation and
its outcome, and after quiescence every node's lists are read; elle.py checks the history.

A key is a row of ``chorus_append`` holding an integer array; an append is
``UPDATE ... SET v = v || value``, with a value no other operation in the run appends; a read
returns the whole array. Keys rotate: a key takes a bounded number of appends, then a new one
is used, so lists stay short. Outcomes: committed (``ok``); a certification loss (40001), a
deadlock, or a refusal before anything could commit (25006, a node outside the primary
component) is ``fail`` and retried as a new transaction; a broken connection or a timeout at
COMMIT (08006, 08007, ...) is ``info``: it may have committed, the checker decides from what
the reads show.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import psycopg

from chorus.testkit import elle

# made anew for each run: values are unique within one run only
COMMIT_REFUSALS = {"40001", "25006"}  # at COMMIT: certainly not committed (docs/ISOLATION.md)
SCHEMA = ("DROP TABLE IF EXISTS chorus_append",
          "CREATE TABLE chorus_append (k integer PRIMARY KEY, v integer[] NOT NULL DEFAULT '{}')")


@dataclass
class Settings:
    keys: int = 8  # keys in use at a time
    appends_per_key: int = 64  # then the key retires and a new one takes its place
    max_ops: int = 5  # micro-operations per transaction: 1 to this
    read_share: float = 0.5
    statement_timeout_ms: int = 10000


class _Keys:
    """The keys in use: ``count`` at a time; each retires after its share of appends."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.lock = threading.Lock()
        self.next_value = itertools.count(1)
        self.active = list(range(s.keys))
        self.appends = dict.fromkeys(self.active, 0)
        self.created = s.keys  # keys 0 .. created-1 exist (made by setup)

    def pick(self, rnd: random.Random, append: bool) -> tuple[int, Optional[int]]:
        with self.lock:
            k = rnd.choice(self.active)
            if not append:
                return k, None
            self.appends[k] += 1
            if self.appends[k] >= self.s.appends_per_key:
                self.active[self.active.index(k)] = self.created
                self.appends[self.created] = 0
                self.created += 1
            return k, next(self.next_value)


@dataclass
class History:
    txns: list[elle.Txn] = field(default_factory=list)
    final: list[elle.Txn] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ids: "itertools.count[int]" = field(default_factory=lambda: itertools.count(1))

    def add(self, t: elle.Txn) -> None:
        with self.lock:
            self.txns.append(t)

    def counts(self) -> dict[str, int]:
        out = {"ok": 0, "fail": 0, "info": 0}
        for t in self.txns:
            out[t.outcome] += 1
        return out


def setup(dsn: str, keys: int) -> None:
    """The table, new, with rows for the first ``keys`` keys (later keys are made as they come)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for s in SCHEMA:
            c.execute(s)
        c.execute("INSERT INTO chorus_append (k) SELECT g FROM generate_series(0, %s) g",
                  (keys - 1,))


class CommitFailed(Exception):
    """COMMIT raised ``error``: the writeset may have gone to the cluster before it did."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.error = error


def _transaction(conn: psycopg.Connection[Any], ops: list[tuple[str, int, Optional[int]]]
                 ) -> list[tuple[str, int, Any]]:
    """Run one transaction's micro-operations; what each observed. An error at COMMIT is
    raised as :class:`CommitFailed`."""
    out: list[tuple[str, int, Any]] = []
    conn.execute("BEGIN")
    for f, k, v in ops:
        if f == "append":
            cur = conn.execute("UPDATE chorus_append SET v = v || %s WHERE k = %s", (v, k))
            if cur.rowcount == 0:  # a new key: its row is made by its first append
                conn.execute("INSERT INTO chorus_append (k, v) VALUES (%s, ARRAY[%s]::integer[])"
                             " ON CONFLICT (k) DO UPDATE SET v = chorus_append.v || EXCLUDED.v", (k, v))
            out.append(("append", k, v))
        else:
            row = conn.execute("SELECT v FROM chorus_append WHERE k = %s", (k,)).fetchone()
            out.append(("r", k, list(row[0]) if row else None))
    try:
        conn.execute("COMMIT")
    except psycopg.Error as e:
        raise CommitFailed(e) from e
    return out


def _client(dsn: str, node: str, process: int, keys: _Keys, until: float, seed: int, h: History) -> None:
    rnd = random.Random(seed)
    conn: Optional[psycopg.Connection[Any]] = None
    while time.monotonic() < until:
        if conn is None or conn.closed:
            try:
                conn = psycopg.connect(dsn, autocommit=True, connect_timeout=5,
                                       options=f"-c default_transaction_isolation=repeatable\\ read "
                                               f"-c statement_timeout={keys.s.statement_timeout_ms}")
            except psycopg.Error as e:
                h.errors.append(f"{node}: connect: {str(e).strip()}")
                time.sleep(0.2)
                continue
        ops = []
        for _ in range(rnd.randint(1, keys.s.max_ops)):
            append = rnd.random() >= keys.s.read_share
            k, v = keys.pick(rnd, append)
            ops.append(("append" if append else "r", k, v))
        tid = next(h.ids)
        invoked = time.monotonic()
        intended: list[tuple[str, int, Any]] = [(f, k, v) if f == "append" else (f, k, None) for f, k, v in ops]
        try:
            done = _transaction(conn, ops)
            h.add(elle.Txn.of(tid, done, "ok", process, node, invoked, time.monotonic()))
        except (psycopg.Error, CommitFailed) as raised:
            at_commit = isinstance(raised, CommitFailed)
            error = raised.error if isinstance(raised, CommitFailed) else raised
            state = error.sqlstate or ""
            # Before COMMIT, any error the server raised rolled the transaction back. At COMMIT
            # only a certification loss (40001) or a refusal before the writeset was sent (25006)
            # is certain: a broken connection (08006), 08007, or a cancel during the verdict
            # wait (57014: the coordinator replays a certified writeset) leaves it unknown.
            unknown = not state or conn.closed or state.startswith("08") or (
                at_commit and state not in COMMIT_REFUSALS)
            outcome: elle.Outcome = "info" if unknown else "fail"
            h.add(elle.Txn.of(tid, [o for o in intended if o[0] == "append"], outcome, process, node, invoked,
                              time.monotonic()))
            if conn.closed or state.startswith("08"):
                conn = None
            elif conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                try:
                    conn.rollback()
                except psycopg.Error:
                    conn = None
            if state not in ("40001", "40P01"):
                time.sleep(0.1)  # refused (25006) or broken: do not spin while the node is out
    if conn is not None:
        conn.close()


def run(nodes: Sequence[tuple[str, str]], seconds: float, clients_per_node: int = 2,
        settings: Optional[Settings] = None, seed: int = 0, prepared: bool = False) -> History:
    """Run the workload on every node (``(name, dsn)``) at once for ``seconds``, after
    :func:`setup` on the first node unless ``prepared`` (a caller about to break the cluster
    makes the table first)."""
    s = settings or Settings()
    if not prepared:
        setup(nodes[0][1], s.keys)
    keys = _Keys(s)
    h = History()
    until = time.monotonic() + seconds
    threads = []
    for i, (name, dsn) in enumerate(nodes):
        for w in range(clients_per_node):
            p = i * clients_per_node + w
            t = threading.Thread(target=_client, args=(dsn, name, p, keys, until, seed * 1000 + p, h), daemon=True)
            t.start()
            threads.append(t)
    for t in threads:
        t.join(seconds + 120)
    return h


def read_final(nodes: Sequence[tuple[str, str]], h: History) -> None:
    """After quiescence: every node's every list, as final reads (one transaction per node)."""
    for name, dsn in nodes:
        with psycopg.connect(dsn, autocommit=True) as c:
            rows = c.execute("SELECT k, v FROM chorus_append ORDER BY k").fetchall()
        h.final.append(elle.Txn.of(next(h.ids), [("r", k, list(v)) for k, v in rows], "ok", -1, name,
                                   final=True))


def check(h: History) -> elle.Report:
    return elle.check(h.txns, h.final)
