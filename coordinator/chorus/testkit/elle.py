"""A list-append history checker in the manner of Jepsen's Elle (issue 23; docs/CHECKER.md).

Kingsbury & Alvaro, "Elle: Inferring Isolation Anomalies from Experimental Observations"
(VLDB 2020). Clients run transactions of micro-operations over lists: ``append(key, value)``
adds a value no other operation ever appends, ``r(key)`` reads the whole list. Because lists
only grow and every value is unique, each read shows the order in which every value before it
was appended, so the checker can recover each key's *version order* and from it the
dependency graph between transactions:

* ``ww``: T1 appended the element just before T2's in a key's version order;
* ``wr``: T2 read a list whose last element T1 appended;
* ``rw``: T1 read a list, T2 appended the element that follows it (an anti-dependency).

Snapshot isolation (what Chorus promises for REPEATABLE READ) forbids G0, G1a, G1b, G1c and
G-single (a cycle with exactly one rw edge: read skew); it allows G2 (cycles with two or more
rw edges: write skew), which is reported as allowed. Besides cycles the checker reports what
no isolation level allows: lost appends (an acknowledged append missing from the final read
of its key), garbage reads, duplicate appends or elements, reads that disagree on a key's
order, and transactions that do not see their own appends.

Everything here is pure: a history goes in, a :class:`Report` comes out. Real-time order is
not checked (that would be strict SI); completion times only guide the search order.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Optional, Sequence, Union

Key = Union[str, int]
Value = int
Outcome = Literal["ok", "fail", "info"]
EdgeKind = Literal["ww", "wr", "rw"]

#: Anomaly kinds snapshot isolation forbids (every kind not in ``ALLOWED``).
ALLOWED = frozenset({"G2"})


# --- the history -------------------------------------------------------------------------


@dataclass(frozen=True)
class Append:
    """``("append", key, value)``: add ``value`` at the end of ``key``'s list."""

    key: Key
    value: Value


@dataclass(frozen=True)
class Read:
    """``("r", key, values)``: the list observed. ``None`` (no row yet) reads as empty."""

    key: Key
    values: Optional[tuple[Value, ...]]

    @property
    def seen(self) -> tuple[Value, ...]:
        return self.values or ()


MicroOp = Union[Append, Read]


def mop(f: str, key: Key, value: Any) -> MicroOp:
    """A micro-operation from its tuple form: ``("append", k, v)`` or ``("r", k, list|None)``."""
    if f == "append":
        return Append(key, int(value))
    if f == "r":
        return Read(key, None if value is None else tuple(int(v) for v in value))
    raise ValueError(f"unknown micro-operation {f!r}")


@dataclass(frozen=True)
class Txn:
    """One transaction as a client saw it.

    ``outcome``: ``ok`` (committed), ``fail`` (definitely aborted, e.g. SQLSTATE 40001) or
    ``info`` (unknown: the connection broke or timed out). ``final`` marks the reads the
    harness makes after quiescence; lost appends are judged against them.
    """

    id: int
    process: int
    node: str
    ops: tuple[MicroOp, ...]
    outcome: Outcome
    invoked: Optional[float] = None
    completed: Optional[float] = None
    final: bool = False

    @staticmethod
    def of(id: int, ops: Iterable[tuple[str, Key, Any]], outcome: Outcome = "ok",
           process: int = 0, node: str = "", invoked: Optional[float] = None,
           completed: Optional[float] = None, final: bool = False) -> "Txn":
        return Txn(id, process, node, tuple(mop(*o) for o in ops), outcome, invoked,
                   completed, final)


# --- the report ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """A dependency ``src -> dst`` of one kind, through one key."""

    src: int
    dst: int
    kind: EdgeKind
    key: Key

    def __str__(self) -> str:
        return f"T{self.src} -{self.kind}({self.key})-> T{self.dst}"


@dataclass(frozen=True)
class Anomaly:
    """One finding. ``txns`` names the transactions involved; ``cycle`` lists a cycle's edges."""

    kind: str
    description: str
    txns: tuple[int, ...]
    key: Optional[Key] = None
    cycle: tuple[Edge, ...] = ()

    @property
    def forbidden(self) -> bool:
        return self.kind not in ALLOWED

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.kind, "forbidden": self.forbidden,
                             "description": self.description, "txns": list(self.txns)}
        if self.key is not None:
            d["key"] = self.key
        if self.cycle:
            d["cycle"] = [{"from": e.src, "to": e.dst, "kind": e.kind, "key": e.key}
                          for e in self.cycle]
        return d


@dataclass(frozen=True)
class Counts:
    ok: int
    fail: int
    info: int
    appends: int
    reads: int
    keys: int
    ww: int
    wr: int
    rw: int


@dataclass(frozen=True)
class Report:
    counts: Counts
    anomalies: tuple[Anomaly, ...]

    @property
    def violations(self) -> tuple[Anomaly, ...]:
        return tuple(a for a in self.anomalies if a.forbidden)

    @property
    def allowed(self) -> tuple[Anomaly, ...]:
        return tuple(a for a in self.anomalies if not a.forbidden)

    @property
    def valid(self) -> bool:
        """True iff no anomaly snapshot isolation forbids was found."""
        return not self.violations

    def kinds(self) -> set[str]:
        return {a.kind for a in self.anomalies}

    def as_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, "counts": vars(self.counts),
                "anomalies": [a.as_dict() for a in self.anomalies]}


# --- the checker --------------------------------------------------------------------------


def check(history: Sequence[Txn], final: Sequence[Txn] = ()) -> Report:
    """Check a list-append history against snapshot isolation.

    ``final`` holds the reads made after quiescence (or mark them ``final=True`` in
    ``history``); without a final read of a key, lost appends to it cannot be seen.
    """
    txns = list(history) + [t if t.final else _as_final(t) for t in final]
    ids = [t.id for t in txns]
    if len(set(ids)) != len(ids):
        raise ValueError("transaction ids must be unique")
    found: list[Anomaly] = []

    writes = _index_writes(txns, found)
    ok_reads = [(t, op) for t in txns if t.outcome == "ok" for op in t.ops
                if isinstance(op, Read)]
    for t in txns:
        if t.outcome == "ok":
            _check_internal(t, found)
    groups = _group_reads(ok_reads)
    _check_reads(groups, writes, found)
    orders = _version_orders(groups, found)

    observed = {writes.writer[(k, v)] for k, g in groups.items() for v in g.distinct()
                if (k, v) in writes.writer}
    by_id = {t.id: t for t in txns}
    committed = {t.id for t in txns if t.outcome == "ok"
                 or (t.outcome == "info" and t.id in observed)}
    _check_lost(txns, committed, found)

    graph = _build_graph(ok_reads, orders, writes, committed, by_id)
    order_hint = {t.id: (t.completed if t.completed is not None else float("inf"), i)
                  for i, t in enumerate(txns)}
    found.extend(_cycles(graph, committed, order_hint))

    counts = Counts(
        ok=sum(t.outcome == "ok" for t in txns), fail=sum(t.outcome == "fail" for t in txns),
        info=sum(t.outcome == "info" for t in txns),
        appends=sum(isinstance(o, Append) for t in txns for o in t.ops),
        reads=sum(isinstance(o, Read) for t in txns for o in t.ops),
        keys=len({o.key for t in txns for o in t.ops}),
        ww=graph.count("ww"), wr=graph.count("wr"), rw=graph.count("rw"))
    return Report(counts, tuple(found))


def _as_final(t: Txn) -> Txn:
    return Txn(t.id, t.process, t.node, t.ops, t.outcome, t.invoked, t.completed, True)


def _show(values: Sequence[Value], limit: int = 8) -> str:
    if len(values) <= limit:
        return "[" + ", ".join(map(str, values)) + "]"
    return "[..., " + ", ".join(map(str, values[-limit:])) + "]"


@dataclass(frozen=True)
class _Writes:
    writer: Mapping[tuple[Key, Value], int]  # (key, value) -> the txn that appended it
    outcome: Mapping[int, Outcome]
    last: Mapping[tuple[int, Key], Value]  # (txn, key) -> that txn's last append to key
    ambiguous: frozenset[tuple[Key, Value]]  # appended more than once: no edges through it


def _index_writes(txns: Sequence[Txn], found: list[Anomaly]) -> _Writes:
    writer: dict[tuple[Key, Value], int] = {}
    last: dict[tuple[int, Key], Value] = {}
    dups: dict[tuple[Key, Value], list[int]] = {}
    for t in txns:
        for op in t.ops:
            if not isinstance(op, Append):
                continue
            kv = (op.key, op.value)
            if kv in writer:
                dups.setdefault(kv, [writer[kv]]).append(t.id)
            else:
                writer[kv] = t.id
            last[(t.id, op.key)] = op.value
    for (k, v), who in dups.items():
        found.append(Anomaly(
            "duplicate-append",
            f"value {v} was appended to {k} {len(who)} times, by "
            + ", ".join(f"T{i}" for i in who) + "; values must be unique per run",
            tuple(dict.fromkeys(who)), key=k))
    return _Writes(writer, {t.id: t.outcome for t in txns}, last, frozenset(dups))


def _check_internal(t: Txn, found: list[Anomaly]) -> None:
    """A transaction's reads reflect its own earlier reads and appends of the same key."""
    known: dict[Key, list[Value]] = {}  # the full list, once the txn has read the key
    own: dict[Key, list[Value]] = {}  # its appends to a key it has not read yet
    for op in t.ops:
        if isinstance(op, Append):
            if op.key in known:
                known[op.key].append(op.value)
            else:
                own.setdefault(op.key, []).append(op.value)
            continue
        seen = list(op.seen)
        if op.key in known:
            expected, ok = known[op.key], seen == known[op.key]
            what = "exactly"
        else:
            expected = own.get(op.key, [])
            ok = not expected or seen[-len(expected):] == expected
            what = "ending with"
        if not ok:
            found.append(Anomaly(
                "internal",
                f"T{t.id} read {op.key} = {_show(seen)}, but its own earlier operations "
                f"imply a list {what} {_show(expected)}", (t.id,), key=op.key))
        known[op.key] = seen
        own.pop(op.key, None)


@dataclass(frozen=True)
class _KeyReads:
    """The ``ok`` reads of one key: the longest, and those that are not a prefix of it."""

    reads: tuple[tuple[Txn, Read], ...]
    longest: tuple[Txn, tuple[Value, ...]]
    odd: tuple[tuple[Txn, Read], ...]

    def distinct(self) -> dict[Value, None]:
        """Every value some read of the key holds. Prefix reads add nothing to the longest, so
        the scan costs the longest read plus the odd ones, not every read."""
        values = dict.fromkeys(self.longest[1])
        for _, op in self.odd:
            values.update(dict.fromkeys(op.seen))
        return values

    def readers(self, v: Value) -> tuple[int, ...]:
        """The transactions whose read of the key holds ``v``."""
        top = self.longest[1]
        first = top.index(v) if v in top else len(top)
        odd = {id(op) for _, op in self.odd}
        return tuple(dict.fromkeys(
            t.id for t, op in self.reads
            if (len(op.seen) > first if id(op) not in odd else v in op.seen)))


def _group_reads(reads: Sequence[tuple[Txn, Read]]) -> dict[Key, _KeyReads]:
    by_key: dict[Key, list[tuple[Txn, Read]]] = {}
    for t, op in reads:
        by_key.setdefault(op.key, []).append((t, op))
    out: dict[Key, _KeyReads] = {}
    for k, rs in by_key.items():
        lt, lop = max(rs, key=lambda r: len(r[1].seen))
        top = lop.seen
        odd = tuple((t, op) for t, op in rs if top[:len(op.seen)] != op.seen)
        out[k] = _KeyReads(tuple(rs), (lt, top), odd)
    return out


def _check_reads(groups: Mapping[Key, _KeyReads], writes: _Writes,
                 found: list[Anomaly]) -> None:
    """Garbage, aborted (G1a) and intermediate (G1b) reads, duplicate elements."""
    for k, g in groups.items():
        for t, seen in [g.longest] + [(t, op.seen) for t, op in g.odd]:
            if len(set(seen)) != len(seen):
                dup = sorted({v for v in seen if seen.count(v) > 1})
                found.append(Anomaly(
                    "duplicate-element", f"T{t.id} read {k} = {_show(seen)}, which holds "
                    f"{dup} more than once", (t.id,), key=k))
        for v in g.distinct():
            w = writes.writer.get((k, v))
            if w is None:
                who = g.readers(v)
                found.append(Anomaly(
                    "garbage-read", f"{_names(who)} read {k} holding {v}, which no "
                    f"transaction ever appended", who, key=k))
            elif writes.outcome[w] == "fail":
                who = tuple(r for r in g.readers(v) if r != w)
                found.append(Anomaly(
                    "G1a", f"{_names(who)} read {k} holding {v}, appended by T{w}, which "
                    f"aborted", (w,) + who, key=k))
        for t, op in g.reads:
            n = _external(t, op, writes)
            if n:
                v = op.seen[n - 1]
                w = writes.writer.get((k, v))
                if w is not None and w != t.id and writes.last.get((w, k)) != v:
                    found.append(Anomaly(
                        "G1b", f"T{t.id} read {k} = {_show(op.seen[:n])}, ending at {v}, an "
                        f"intermediate append of T{w}, whose last append to {k} was "
                        f"{writes.last[(w, k)]}", (w, t.id), key=k))


def _names(ids: Sequence[int], limit: int = 5) -> str:
    shown = ", ".join(f"T{i}" for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def _external(t: Txn, op: Read, writes: _Writes) -> int:
    """How much of a read came from other transactions: its own trailing appends cut."""
    seen = op.seen
    n = len(seen)
    while n and writes.writer.get((op.key, seen[n - 1])) == t.id:
        n -= 1
    return n


def _version_orders(groups: Mapping[Key, _KeyReads],
                    found: list[Anomaly]) -> dict[Key, tuple[Value, ...]]:
    """Each key's version order: its longest read, if every other read is a prefix of it."""
    orders: dict[Key, tuple[Value, ...]] = {}
    for k, g in groups.items():
        lt, top = g.longest
        if not g.odd:
            orders[k] = top
            continue
        t, op = g.odd[0]
        seen = op.seen
        i = next(i for i, (a, b) in enumerate(zip(seen, top)) if a != b)
        who = tuple(dict.fromkeys([lt.id] + [o.id for o, _ in g.odd]))
        found.append(Anomaly(
            "incompatible-order",
            f"reads of {k} disagree on its order: T{t.id} read {_show(seen[:i + 1])} but "
            f"T{lt.id} read {_show(top[:i + 1])} (position {i}); {len(g.odd)} read(s) "
            f"are not a prefix of the longest; no dependencies are inferred through {k}",
            who, key=k))
    return orders


def _check_lost(txns: Sequence[Txn], committed: set[int], found: list[Anomaly]) -> None:
    """Every committed append (``ok``, or ``info`` and observed) is in every final read."""
    finals: dict[Key, list[tuple[int, frozenset[Value]]]] = {}
    for t in txns:
        if t.final and t.outcome == "ok":
            for op in t.ops:
                if isinstance(op, Read):
                    finals.setdefault(op.key, []).append((t.id, frozenset(op.seen)))
    for t in txns:
        if t.id not in committed or t.final:
            continue
        for op in t.ops:
            if not isinstance(op, Append):
                continue
            for fid, values in finals.get(op.key, ()):
                if op.value not in values:
                    how = "acknowledged" if t.outcome == "ok" else "observed by a read"
                    found.append(Anomaly(
                        "lost-append", f"T{t.id} appended {op.value} to {op.key} and was "
                        f"{how}, but the final read T{fid} of {op.key} does not hold it",
                        (t.id, fid), key=op.key))


# --- the dependency graph -----------------------------------------------------------------


class _Graph:
    """Edges by kind: ``adj[kind][src][dst]`` is a key the dependency goes through."""

    def __init__(self) -> None:
        self.adj: dict[EdgeKind, dict[int, dict[int, Key]]] = {"ww": {}, "wr": {}, "rw": {}}

    def add(self, src: int, dst: int, kind: EdgeKind, key: Key) -> None:
        if src != dst:
            self.adj[kind].setdefault(src, {}).setdefault(dst, key)

    def count(self, kind: EdgeKind) -> int:
        return sum(len(d) for d in self.adj[kind].values())

    def out(self, node: int, kinds: Sequence[EdgeKind]) -> Iterable[tuple[int, EdgeKind, Key]]:
        for kind in kinds:
            for dst, key in self.adj[kind].get(node, {}).items():
                yield dst, kind, key


def _build_graph(reads: Sequence[tuple[Txn, Read]], orders: Mapping[Key, tuple[Value, ...]],
                 writes: _Writes, committed: set[int], by_id: Mapping[int, Txn]) -> _Graph:
    g = _Graph()

    def writer(k: Key, v: Value) -> Optional[int]:
        if (k, v) in writes.ambiguous:
            return None
        w = writes.writer.get((k, v))
        return w if w in committed else None

    for k, order in orders.items():
        for a, b in zip(order, order[1:]):
            wa, wb = writer(k, a), writer(k, b)
            if wa is not None and wb is not None:
                g.add(wa, wb, "ww", k)
    for t, op in reads:
        if op.key not in orders:
            continue
        order = orders[op.key]
        n = _external(t, op, writes)
        last = writer(op.key, op.seen[n - 1]) if n else None
        if last is not None:
            g.add(last, t.id, "wr", op.key)
        if n < len(order):
            nxt = writer(op.key, order[n])
            if nxt is not None and nxt != last:  # same writer: an intermediate read, G1b
                g.add(t.id, nxt, "rw", op.key)
    return g


def _tarjan(nodes: Iterable[int], g: _Graph, kinds: Sequence[EdgeKind]) -> list[list[int]]:
    """Strongly connected components (all of them, singletons too), iteratively."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    sccs: list[list[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[int, Iterator[tuple[int, EdgeKind, Key]]]] = []
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work.append((root, iter(list(g.out(root, kinds)))))
        while work:
            node, it = work[-1]
            pushed = False
            for dst, _, _ in it:
                if dst not in index:
                    index[dst] = low[dst] = counter
                    counter += 1
                    stack.append(dst)
                    on_stack.add(dst)
                    work.append((dst, iter(list(g.out(dst, kinds)))))
                    pushed = True
                    break
                if dst in on_stack:
                    low[node] = min(low[node], index[dst])
            if pushed:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                scc: list[int] = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    scc.append(x)
                    if x == node:
                        break
                sccs.append(scc)
    return sccs


def _path(g: _Graph, start: int, goal: int, kinds: Sequence[EdgeKind],
          allowed: Callable[[int], bool]) -> Optional[list[Edge]]:
    """A shortest path start -> goal (BFS) over ``kinds``, through nodes ``allowed(n)``."""
    if start == goal:
        return []
    prev: dict[int, Edge] = {}
    seen = {start}
    queue = deque([start])
    while queue:
        n = queue.popleft()
        for dst, kind, key in g.out(n, kinds):
            if dst in seen or not allowed(dst):
                continue
            seen.add(dst)
            prev[dst] = Edge(n, dst, kind, key)
            if dst == goal:
                path = [prev[dst]]
                while path[-1].src != start:
                    path.append(prev[path[-1].src])
                return path[::-1]
            queue.append(dst)
    return None


def _cycle_anomaly(kind: str, cycle: list[Edge], note: str) -> Anomaly:
    txns = tuple(e.src for e in cycle)
    return Anomaly(kind, f"{note}: " + ", ".join(map(str, cycle)), txns, cycle=tuple(cycle))


_WW: tuple[EdgeKind, ...] = ("ww",)
_WWWR: tuple[EdgeKind, ...] = ("ww", "wr")
_ALL: tuple[EdgeKind, ...] = ("ww", "wr", "rw")


def _cycles(g: _Graph, committed: set[int],
            hint: Mapping[int, tuple[float, int]]) -> list[Anomaly]:
    """One concrete cycle per strongly connected component and anomaly class.

    G0 and G1c: any edge inside a component of the ww (ww+wr) graph lies on a cycle, so one
    BFS per component finds one. G-single: an rw edge a -> b closes a cycle with exactly one
    rw edge iff b reaches a over ww/wr edges. To keep that search near-linear, the ww/wr
    components are numbered in a topological order that follows completion order where it can;
    a ww/wr path from b to a only passes components numbered between b's and a's, so most rw
    edges (b after a) need no search and the rest search a window of concurrent transactions.
    G2 (allowed): a component with an rw edge but no G-single holds a cycle through that edge,
    which then has two or more rw edges.
    """
    nodes = sorted(committed, key=lambda n: hint[n])
    found: list[Anomaly] = []

    for scc in _tarjan(nodes, g, _WW):
        if len(scc) > 1:
            members = set(scc)
            a = scc[0]
            b = next(d for d, _, _ in g.out(a, _WW) if d in members)
            back = _path(g, b, a, _WW, members.__contains__)
            assert back is not None
            found.append(_cycle_anomaly("G0", [Edge(a, b, "ww", g.adj["ww"][a][b])] + back,
                                        "write cycle (ww edges only)"))

    g1 = _tarjan(nodes, g, _WWWR)
    comp = {n: i for i, scc in enumerate(g1) for n in scc}
    for scc in g1:
        if len(scc) < 2:
            continue
        members = set(scc)
        wr = next(((a, b) for a in scc for b in g.adj["wr"].get(a, {}) if b in members), None)
        if wr is None:
            continue  # a ww-only component: reported as G0
        a, b = wr
        back = _path(g, b, a, _WWWR, members.__contains__)
        assert back is not None
        found.append(_cycle_anomaly("G1c", [Edge(a, b, "wr", g.adj["wr"][a][b])] + back,
                                    "cycle of ww/wr edges, at least one wr"))
    pos = _topological(g1, comp, g, hint)

    for scc in _tarjan(nodes, g, _ALL):
        if len(scc) < 2:
            continue
        members = set(scc)
        rws = [(a, b) for a in scc for b in g.adj["rw"].get(a, {}) if b in members]
        if not rws:
            continue
        single = None
        for a, b in rws:
            if pos[b] > pos[a]:
                continue
            limit = pos[a]
            back = _path(g, b, a, _WWWR, lambda n: n in members and pos[n] <= limit)
            if back is not None:
                single = [Edge(a, b, "rw", g.adj["rw"][a][b])] + back
                break
        if single is not None:
            found.append(_cycle_anomaly(
                "G-single", single, "cycle with exactly one rw edge (read skew)"))
            continue
        a, b = rws[0]
        back = _path(g, b, a, _ALL, members.__contains__)
        assert back is not None
        cycle = [Edge(a, b, "rw", g.adj["rw"][a][b])] + back
        found.append(_cycle_anomaly(
            "G2", cycle, f"cycle with {sum(e.kind == 'rw' for e in cycle)} rw edges "
            "(write skew; allowed under snapshot isolation)"))
    return found


def _topological(sccs: Sequence[Sequence[int]], comp: Mapping[int, int], g: _Graph,
                 hint: Mapping[int, tuple[float, int]]) -> dict[int, int]:
    """Number the ww/wr components in topological order, earliest completion first."""
    succ: list[set[int]] = [set() for _ in sccs]
    indeg = [0] * len(sccs)
    for i, scc in enumerate(sccs):
        for n in scc:
            for d, _, _ in g.out(n, _WWWR):
                j = comp[d]
                if j != i and j not in succ[i]:
                    succ[i].add(j)
                    indeg[j] += 1
    heap = [(min(hint[n] for n in scc), i) for i, scc in enumerate(sccs) if indeg[i] == 0]
    heapq.heapify(heap)
    order: dict[int, int] = {}
    while heap:
        _, i = heapq.heappop(heap)
        order[i] = len(order)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (min(hint[n] for n in sccs[j]), j))
    return {n: order[comp[n]] for n in comp}
