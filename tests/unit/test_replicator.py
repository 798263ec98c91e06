"""The replication core on three simulated nodes fed one total order (seed 7.1, 8.1, 8.2).

A tiny in-test sequencer stands in for the bus: every message any node sends is appended to one
global order and delivered to every node, which is exactly the guarantee the bus gives.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Callable

from chorus.bus import proto as bp
from chorus import wire
from chorus.bus import Delivery, View
from chorus.history import Epoch, MemberRecord
from chorus.actions import (Apply, CatchUp, DdlOutcome, LocalVerdict, LogOffered, LogQueried, Pause, Phase, PhaseChange,
                            Send, VoteDecided, VoteOpened)
from chorus.replicator import BOOTSTRAP_WAIT_S, REQUEST_RETRY_S, Holding, Replicator
from chorus.voting import InconsistencyVoting
from chorus.wire import Key, KeyMode, Row, Table, Writeset

NAMES = ["n1", "n2", "n3"]
T = Table("public", "t", (wire.Column("id", "integer"), wire.Column("v", "text")), (0,))


def writeset(last_seen: int, key: int) -> bytes:
    ws = Writeset(1, 1, last_seen, (T,), (Row("U", 0, (str(key).encode(),), (str(key).encode(), b"x")),),
                  (Key(KeyMode.REFERENCE, (b"public", b"t")),  # as the extension writes them
                   Key(KeyMode.UPDATE, (b"public", b"t", b"id", str(key).encode()))))
    return wire.encode(ws)


class Cluster:
    def __init__(self, bootstrap: str = "n1", names: list[str] = NAMES) -> None:
        self.nodes = {n: Replicator(n, "", 0, bootstrap=(n == bootstrap)) for n in names}
        self.order: deque[tuple[str, bytes]] = deque()
        self.log: dict[str, list[tuple[int, bool]]] = {n: [] for n in names}
        self.applied: dict[str, list[int]] = {n: [] for n in names}
        self.now = 0.0
        self.ticket = 0

    def act(self, node: str, actions: list) -> None:  # type: ignore[type-arg]
        for a in actions:
            if isinstance(a, Send):
                self.order.append((node, bp.encode(a.message)))
            elif isinstance(a, LocalVerdict):
                self.log[node].append((a.gid, a.ok))
            elif isinstance(a, Apply):
                self.log[node].append((a.gid, True))
                self.applied[node].append(a.gid)

    def view(self, members: list[str], quorate: bool = True, quorum: int = 1, expected: int = 0,
             tie_breaker: str = "") -> None:
        for n in members:
            before = self.nodes[n].members
            joined = tuple(m for m in members if m not in before)
            v = View(1, tuple(members), joined, tuple(m for m in before if m not in members), n, quorate, quorum,
                     expected, tie_breaker)
            self.act(n, self.nodes[n].on_view(v, self.now))

    def drain(self) -> None:
        while self.order:
            sender, payload = self.order.popleft()
            for n, r in self.nodes.items():
                self.act(n, r.on_delivery(Delivery(sender, payload)))

    def tick(self, seconds: float) -> None:
        self.now += seconds
        for n, r in self.nodes.items():
            self.act(n, r.tick(self.now))
        self.drain()

    def submit(self, node: str, last_seen: int, key: int) -> None:
        self.ticket += 1
        self.order.append((node, bp.encode(bp.WritesetMsg(node, self.ticket, writeset(last_seen, key)))))


def form(quorum: int = 1, names: list[str] = NAMES, expected: int = 0, tie_breaker: str = "") -> Cluster:
    c = Cluster(names=names)
    c.view(names, quorum=quorum, expected=expected, tie_breaker=tie_breaker)
    c.drain()
    for _ in range(5):
        c.tick(1.0)
    assert all(r.phase == Phase.ONLINE for r in c.nodes.values()), {n: r.phase for n, r in c.nodes.items()}
    return c


def test_bootstrap_and_join_through_gid_requests() -> None:
    c = form()
    uuids = {r.cluster_uuid for r in c.nodes.values()}
    assert len(uuids) == 1 and uuids != {""}
    assert all(set(r.online) == set(NAMES) for r in c.nodes.values())


def test_same_gids_and_verdicts_on_every_node() -> None:
    c = form()
    rnd = random.Random(7)
    for _ in range(300):
        node = rnd.choice(NAMES)
        gid = c.nodes[node].gid
        c.submit(node, max(0, gid - rnd.randint(0, 3)), rnd.randint(0, 5))
        if rnd.random() < 0.3:
            c.drain()
    c.drain()
    certified = [{g for g, ok in c.log[n] if ok} for n in NAMES]
    assert certified[0] == certified[1] == certified[2]
    assert all(r.gid == 300 for r in c.nodes.values())
    assert 0 < len(certified[0]) < 300
    # each node applies exactly the certified writesets of the other nodes
    local_ok = {n: {g for g, ok in c.log[n] if ok} - set(c.applied[n]) for n in NAMES}
    for n in NAMES:
        others = set().union(*(local_ok[m] for m in NAMES if m != n))
        assert set(c.applied[n]) == others


def test_a_new_cluster_starts_once_every_member_asked() -> None:
    """The node told to bootstrap starts a new cluster as soon as every member of its quorate
    view has asked and none ever joined a cluster, without waiting BOOTSTRAP_WAIT_S: nobody could
    answer. While a member has not asked, it waits."""
    c = Cluster()
    c.view(NAMES, quorum=2, expected=3)
    sent = [type(bp.decode(p)).__name__ for _, p in c.order]
    assert sent == ["GidRequest"] * 3
    c.order.pop()  # n3's request is not delivered yet: n1 waits
    c.drain()
    assert not any(r.cluster_uuid for r in c.nodes.values())
    assert all(r.phase == Phase.JOINING for r in c.nodes.values())
    c.tick(REQUEST_RETRY_S)  # n3 asks again (its request was never seen): n1 starts the cluster at once
    assert c.now < BOOTSTRAP_WAIT_S and all(r.phase == Phase.ONLINE for r in c.nodes.values()), \
        {n: r.phase for n, r in c.nodes.items()}
    assert len({r.cluster_uuid for r in c.nodes.values()}) == 1


def test_a_node_that_joined_a_cluster_is_waited_for() -> None:
    """A member that once joined a cluster may be the one to re-form it (Membership.
    reform_decision): the node told to bootstrap does not start a new cluster at once beside it."""
    c = Cluster()
    c.nodes["n3"] = Replicator("n3", "6a1f5e4c-0000-4000-8000-000000000000", 0)
    c.view(NAMES, quorum=2, expected=3)
    c.drain()
    for _ in range(5):
        c.tick(1.0)
    assert {r.cluster_uuid for r in c.nodes.values()} == {"6a1f5e4c-0000-4000-8000-000000000000"}
    assert all(r.phase == Phase.ONLINE for r in c.nodes.values()), {n: r.phase for n, r in c.nodes.items()}


def test_late_joiner_gets_gid_and_certification_state() -> None:
    c = Cluster()
    c.view(["n1", "n2"])
    c.drain()
    for _ in range(5):
        c.tick(1.0)
    c.submit("n1", 0, 1)
    c.drain()
    # n3 joins late at GID 1: its database must be at GID 1 for the handshake to succeed
    c.nodes["n3"] = Replicator("n3", c.nodes["n1"].cluster_uuid, 1)
    c.view(NAMES)
    c.drain()
    c.submit("n2", 0, 1)  # conflicts with GID 1 on every node, n3 included
    c.drain()
    c.tick(1.0)
    assert c.nodes["n3"].phase == Phase.ONLINE
    assert c.nodes["n3"].gid == 2
    assert c.log["n2"][-1] == (2, False)  # the origin is told it lost on every node
    assert 2 not in c.applied["n3"] and 2 not in c.applied["n1"]


def test_stale_joiner_catches_up_while_certifying_the_live_stream() -> None:
    c = form()
    c.submit("n1", 0, 1)
    c.drain()
    stale = Replicator("n2", c.nodes["n1"].cluster_uuid, 0)
    c.nodes["n2"] = stale
    caught: list[CatchUp] = []
    orig = c.act

    def act(node: str, actions: list) -> None:  # type: ignore[type-arg]
        caught.extend(a for a in actions if node == "n2" and isinstance(a, CatchUp))
        orig(node, actions)

    c.act = act  # type: ignore[method-assign]
    c.view(NAMES)
    c.drain()
    assert stale.phase == Phase.RECOVERING and not stale.accepts_writes
    assert caught == [CatchUp(0, 1)]
    c.submit("n3", 1, 2)  # certified on every node, the recovering one included
    c.drain()
    assert stale.gid == 2 and c.applied["n2"][-1] == 2
    # it asks the others what their logs hold; every member answers, a recovering one too (it
    # serves what it has committed)
    queried = c.nodes["n1"].on_delivery(Delivery("m", bp.encode(bp.LogQuery("n2", "r1"))))
    assert queried == [LogQueried("n2", "r1")]
    assert stale.on_delivery(Delivery("m", bp.encode(bp.LogQuery("n1", "r2")))) == [LogQueried("n1", "r2")]
    info = bp.LogInfo("n2", "r1", "n1", "127.0.0.1:1", 0, 2, 2, 0)
    assert stale.on_delivery(Delivery("m", bp.encode(info))) == [LogOffered(info)]
    assert c.nodes["n3"].on_delivery(Delivery("m", bp.encode(info))) == []
    assert all("n2" not in r.synced for r in c.nodes.values())
    # caught up: it says so in the order, and every node counts it synced at that place
    c.act("n2", stale.recovered(2))
    assert stale.phase == Phase.RECOVERING
    c.drain()
    assert stale.phase == Phase.ONLINE and stale.accepts_writes
    assert all(r.synced == set(NAMES) for r in c.nodes.values())


def test_joiner_ahead_of_the_cluster_needs_total_recovery() -> None:
    c = form()
    ahead = Replicator("n2", c.nodes["n1"].cluster_uuid, 50)
    c.nodes["n2"] = ahead
    c.view(NAMES)
    c.drain()
    assert ahead.phase == Phase.NEEDS_RECOVERY


def test_joiner_with_a_commit_past_the_cluster_in_one_lane_needs_total_recovery() -> None:
    """Several commit lanes: a crash can leave a node's database with commits above its
    watermark. One past the GID the cluster is at (it re-formed from a node that never had it)
    was never acknowledged, and its GID will name another writeset: the node must not join."""
    c = form()
    ahead = Replicator("n2", c.nodes["n1"].cluster_uuid, 0, max_committed=50)
    c.nodes["n2"] = ahead
    c.view(NAMES)
    c.drain()
    assert ahead.phase == Phase.NEEDS_RECOVERY
    behind = Replicator("n3", c.nodes["n1"].cluster_uuid, 0, max_committed=0)
    c.nodes["n3"] = behind
    c.view(NAMES)
    c.drain()
    assert behind.phase == Phase.ONLINE


def test_joiner_of_another_cluster_needs_total_recovery() -> None:
    c = form()
    other = Replicator("n2", "another-cluster", 0)
    c.nodes["n2"] = other
    c.view(NAMES)
    c.drain()
    assert other.phase == Phase.NEEDS_RECOVERY


def test_minority_refuses_writes() -> None:
    c = form()
    r = c.nodes["n3"]
    c.act("n3", r.on_view(View(2, ("n3",), (), ("n1", "n2"), "n3", False), c.now))
    assert r.phase == Phase.NON_PRIMARY and not r.accepts_writes


def test_uniform_commit_releases_a_writeset_once_a_quorum_delivered_it() -> None:
    c = form(quorum=2)  # three bus nodes: two votes make a quorum
    for n in NAMES:
        c.log[n].clear()
    c.submit("n1", 1, 7)
    sender, payload = c.order.popleft()
    # only n1 has delivered it so far: it certifies, holds it and reports what it delivered
    actions = c.nodes["n1"].on_delivery(Delivery(sender, payload))
    assert not [a for a in actions if isinstance(a, (LocalVerdict, Apply))]
    assert [a.message for a in actions if isinstance(a, Send)] == [bp.Received("n1", 1)]
    c.act("n1", actions)
    for n in ("n2", "n3"):
        c.act(n, c.nodes[n].on_delivery(Delivery(sender, payload)))
    assert c.log == {n: [] for n in NAMES}
    c.drain()  # the reports: every node now knows a quorum has GID 2
    assert c.log == {n: [(1, True)] for n in NAMES}
    assert all(r.released == 1 for r in c.nodes.values())


def test_a_report_that_never_comes_back_is_sent_again() -> None:
    """A Received report whose send failed would leave the others waiting for it forever."""
    c = form(quorum=2)
    c.submit("n1", 1, 4)
    sender, payload = c.order.popleft()
    r1 = c.nodes["n1"]
    first = [a for a in r1.on_delivery(Delivery(sender, payload)) if isinstance(a, Send)]
    assert [a.message for a in first] == [bp.Received("n1", 1)]  # ... and it is lost
    assert r1.tick(c.now + 1) == []  # on the bus for less than a tick
    again = [a.message for a in r1.tick(c.now + 2) if isinstance(a, Send)]
    assert again == [bp.Received("n1", 1)]


def test_writeset_only_a_node_cut_off_delivered_never_commits_anywhere() -> None:
    """Corosync's agreed order is not uniform: n3 may deliver its own writeset and be cut off
    before anyone else receives it. n3 must not commit it, and its client learns that the
    outcome is decided by the primary component (which, here, never had it)."""
    c = form(quorum=2)
    for n in NAMES:
        c.log[n].clear()
    c.submit("n3", 1, 9)
    sender, payload = c.order.popleft()
    r3 = c.nodes["n3"]
    actions = r3.on_delivery(Delivery(sender, payload))
    assert not [a for a in actions if isinstance(a, LocalVerdict)]
    # the partition: n3's report never reaches the others, n1 and n2 go on as the primary
    actions = r3.on_view(View(2, ("n3",), (), ("n1", "n2"), "n3", False, 2), c.now)
    unknown = [a for a in actions if isinstance(a, LocalVerdict)]
    assert len(unknown) == 1 and not unknown[0].ok and unknown[0].unknown and unknown[0].gid == 1
    assert r3.phase == Phase.NON_PRIMARY and r3.released == 0
    for n in ("n1", "n2"):
        c.act(n, c.nodes[n].on_view(View(2, ("n1", "n2"), (), ("n3",), n, True, 2), c.now))
    c.order.clear()
    c.submit("n1", 1, 9)  # the primary's GID 1 is another transaction on the same row
    sender, payload = c.order.popleft()
    for n in ("n1", "n2"):
        c.act(n, c.nodes[n].on_delivery(Delivery(sender, payload)))
    while c.order:
        s, p = c.order.popleft()
        for n in ("n1", "n2"):
            c.act(n, c.nodes[n].on_delivery(Delivery(s, p)))
    assert c.log["n1"] == c.log["n2"] == [(1, True)]
    assert c.log["n3"] == [] and r3.gid == 0


def test_a_local_transaction_that_did_not_see_an_own_writeset_its_session_gave_up_is_refused() -> None:
    """Simulation seed 8358: n3 ordered its own writeset (GID 1) and was cut off before a quorum
    was known to have it; its session heard "unknown" and released its row locks uncommitted.
    The primary component had it and commits it, and n3 applies it when it rejoins. A local
    transaction of n3 that did not see GID 1 may have changed its rows as they were before it,
    and certification does not compare writesets of one node (their sessions' row locks order
    them), so it would be certified over GID 1: a lost update. The origin refuses it before it
    is ordered (40001); one that saw GID 1 goes on."""
    c = form(quorum=2)
    r3 = c.nodes["n3"]
    assert r3.stale_local(0) is None
    c.submit("n3", 0, 8)
    sender, payload = c.order.popleft()
    for n in NAMES:
        c.nodes[n].on_delivery(Delivery(sender, payload))  # the reports are lost with n3
    actions = r3.on_view(View(2, ("n3",), (), ("n1", "n2"), "n3", False, 2), c.now)
    unknown = [a for a in actions if isinstance(a, LocalVerdict)]
    assert len(unknown) == 1 and unknown[0].unknown and unknown[0].gid == 1
    for n in ("n1", "n2"):
        c.act(n, c.nodes[n].on_view(View(2, ("n1", "n2"), (), ("n3",), n, True, 2), c.now))
    c.order = deque((s, p) for s, p in c.order if s != "n3")
    while c.order:
        s, p = c.order.popleft()
        for n in ("n1", "n2"):
            c.act(n, c.nodes[n].on_delivery(Delivery(s, p)))
    assert c.nodes["n1"].released == 1  # the primary component commits n3's GID 1
    assert not r3.accepts_writes  # out of it, n3 takes no writes at all
    # back in the primary component, it refuses a transaction that did not see GID 1 ...
    c.view(NAMES, quorum=2)
    c.drain()
    for _ in range(3):
        c.tick(1.0)
    assert r3.phase == Phase.RECOVERING  # its database lacks GID 1: it catches up
    why = r3.stale_local(0)
    assert why is not None and "GID 1" in why and "saw GID 0" in why
    assert r3.stale_local(1) is None
    # ... and so does the node started again, which learns of GID 1 from the cluster
    fresh = Replicator("n3", r3.cluster_uuid, 0, epochs=r3.epochs, records=dict(r3.records),
                       holding=lambda: Holding(0))
    assert fresh.stale_local(0) is None
    c.nodes["n3"] = fresh
    c.view(["n1", "n2"], quorum=2)
    c.view(NAMES, quorum=2)
    c.drain()
    for _ in range(3):
        c.tick(1.0)
    assert fresh.phase == Phase.RECOVERING
    assert fresh.stale_local(0) is not None and fresh.stale_local(1) is None


def test_an_own_writeset_the_primary_component_never_had_holds_no_write_back() -> None:
    """n3 alone delivered its writeset (GID 1) before it was cut off; the primary component never
    had it and stays idle. Back, n3 must take writes at once: nothing of its own is applied, and
    GID 1 will never commit on it (refusing snapshots below it would refuse every write)."""
    c = form(quorum=2)
    r3 = c.nodes["n3"]
    c.submit("n3", 0, 8)
    sender, payload = c.order.popleft()
    r3.on_delivery(Delivery(sender, payload))
    r3.on_view(View(2, ("n3",), (), ("n1", "n2"), "n3", False, 2), c.now)
    for n in ("n1", "n2"):
        c.act(n, c.nodes[n].on_view(View(2, ("n1", "n2"), (), ("n3",), n, True, 2), c.now))
    c.order.clear()
    c.view(NAMES, quorum=2)
    c.drain()
    for _ in range(3):
        c.tick(1.0)
    assert r3.phase == Phase.ONLINE and r3.gid == 0
    assert r3.stale_local(0) is None


def test_view_change_inside_the_primary_keeps_held_writesets() -> None:
    c = form(quorum=2)
    for n in NAMES:
        c.log[n].clear()
    c.submit("n2", 1, 3)
    sender, payload = c.order.popleft()
    for n in NAMES:
        c.nodes[n].on_delivery(Delivery(sender, payload))  # the reports are lost with n3
    for n in ("n1", "n2"):
        c.act(n, c.nodes[n].on_view(View(2, ("n1", "n2"), (), ("n3",), n, True, 2), c.now))
    c.order = deque((s, p) for s, p in c.order if s != "n3")
    while c.order:
        s, p = c.order.popleft()
        for n in ("n1", "n2"):
            c.act(n, c.nodes[n].on_delivery(Delivery(s, p)))
    assert c.log["n1"] == c.log["n2"] == [(1, True)]


def test_node_that_comes_back_with_fewer_than_a_quorum_rejoins() -> None:
    """n1 was frozen: n2 and n3 went on without it. Corosync shows n1 the others leaving and
    joining again in one view that is quorate; n1 must not carry on as if nothing happened."""
    c = form(quorum=2)
    r1 = c.nodes["n1"]
    actions = r1.on_view(View(2, ("n1", "n2", "n3"), ("n2", "n3"), ("n2", "n3"), "n1", True, 2), c.now)
    assert r1.phase == Phase.JOINING and not r1.accepts_writes
    assert any(isinstance(a, Send) and isinstance(a.message, bp.GidRequest) for a in actions)
    # the others saw n1 leave and join: they stay online
    r2 = c.nodes["n2"]
    r2.on_view(View(2, ("n2", "n3"), (), ("n1",), "n2", True, 2), c.now)
    r2.on_view(View(3, ("n1", "n2", "n3"), ("n1",), (), "n2", True, 2), c.now)
    assert r2.phase == Phase.ONLINE


def test_writeset_of_a_node_that_is_not_online_is_dropped_everywhere() -> None:
    """n1 was cut off and is back in the view, but has not rejoined: a writeset it sent before
    learning so is refused on n1 and dropped on the others, at the same position."""
    c = form(quorum=2)
    for n in ("n2", "n3"):
        r = c.nodes[n]
        r.on_view(View(2, ("n2", "n3"), (), ("n1",), n, True, 2), c.now)
        r.on_view(View(3, ("n1", "n2", "n3"), ("n1",), (), n, True, 2), c.now)
        assert "n1" not in r.online
    for n in NAMES:
        c.log[n].clear()
    c.submit("n1", 1, 5)
    sender, payload = c.order.popleft()
    for n in ("n2", "n3"):
        assert c.nodes[n].on_delivery(Delivery(sender, payload)) == []
    r1 = c.nodes["n1"]
    r1.on_view(View(2, ("n1", "n2", "n3"), ("n2", "n3"), ("n2", "n3"), "n1", True, 2), c.now)
    refused = [a for a in r1.on_delivery(Delivery(sender, payload)) if isinstance(a, LocalVerdict)]
    assert len(refused) == 1 and not refused[0].ok and not refused[0].unknown


_STATEMENT = wire.Schema((("search_path", "public"),), "postgres", b"ALTER TABLE t ADD COLUMN c int")
_KEYS = (Key(KeyMode.EXCLUSIVE, (b"public", b"t")),)


def _ddl(table: bytes = b"t") -> bytes:
    """A schema change's request for its place in the order (its content comes later)."""
    return wire.encode(Writeset(0, 1, 0, (), (_STATEMENT,), (Key(KeyMode.EXCLUSIVE, (b"public", table)),),
                                flags=wire.FLAG_TOI))


def _content() -> bytes:
    """What the origin reports it ran: the statement and its table keys."""
    return wire.encode(Writeset(0, 1, 0, (), (_STATEMENT,), _KEYS))


def test_schema_change_outcome_is_the_same_everywhere() -> None:
    """Writesets ordered after a schema change wait for its outcome, then are certified against
    what it touched: a writer that did not see the change loses, everywhere alike."""
    c = form()
    outcomes: dict[str, list[tuple[int, bool, bool]]] = {n: [] for n in NAMES}
    c.ticket += 1
    c.order.append(("n1", bp.encode(bp.WritesetMsg("n1", c.ticket, _ddl()))))
    c.drain()
    gid = c.nodes["n1"].gid
    assert all(r.ddl_open == {gid: "n1"} for r in c.nodes.values())
    # a writer on n2 that did not see the change waits for its outcome ...
    c.submit("n2", gid - 1, 5)
    c.drain()
    assert c.log["n2"][-1] == (gid, True) and all(r.deferred_count == 1 for r in c.nodes.values())
    # ... the origin reports (a second, later report is ignored) ...
    c.order.append(("n1", bp.encode(bp.DdlResult("n1", gid, True, "", _content()))))
    c.order.append(("n1", bp.encode(bp.DdlResult("n1", gid, False, "late"))))
    while c.order:
        sender, payload = c.order.popleft()
        for n, r in c.nodes.items():
            acts = r.on_delivery(Delivery(sender, payload))
            c.act(n, acts)
            for a in acts:
                if isinstance(a, DdlOutcome):
                    outcomes[n].append((a.gid, a.ok, a.content is not None and a.content.has_schema))
    assert all(o == [(gid, True, True)] for o in outcomes.values()), outcomes
    # ... and then loses, even though no row key conflicts
    assert c.log["n2"][-1] == (gid + 1, False)
    assert all(r.deferred_count == 0 and not r.ddl_open for r in c.nodes.values())


def test_no_gid_reply_while_a_schema_change_is_open() -> None:
    """The state after an open schema change is not final: a joiner is answered once it is."""
    c = form()
    c.ticket += 1
    c.order.append(("n1", bp.encode(bp.WritesetMsg("n1", c.ticket, _ddl()))))
    c.drain()
    r1 = c.nodes["n1"]
    acts = r1.on_delivery(Delivery("n4", bp.encode(bp.GidRequest("n4", "rq", r1.cluster_uuid, 0))))
    assert not [a for a in acts if isinstance(a, Send) and isinstance(a.message, bp.GidReply)]


def test_malformed_content_fails_the_schema_change_everywhere() -> None:
    c = form()
    c.ticket += 1
    c.order.append(("n1", bp.encode(bp.WritesetMsg("n1", c.ticket, _ddl()))))
    c.drain()
    gid = c.nodes["n1"].gid
    c.order.append(("n1", bp.encode(bp.DdlResult("n1", gid, True, "", b"CW\x02garbage"))))
    outcomes = set()
    while c.order:
        sender, payload = c.order.popleft()
        for r in c.nodes.values():
            outcomes |= {(a.gid, a.ok) for a in r.on_delivery(Delivery(sender, payload)) if isinstance(a, DdlOutcome)}
    assert outcomes == {(gid, False)}


def test_schema_change_whose_origin_leaves_is_skipped_everywhere() -> None:
    c = form()
    c.ticket += 1
    c.order.append(("n3", bp.encode(bp.WritesetMsg("n3", c.ticket, _ddl()))))
    c.drain()
    gid = c.nodes["n1"].gid
    for n in ("n1", "n2"):
        acts = c.nodes[n].on_view(View(2, ("n1", "n2"), (), ("n3",), n, True), c.now)
        assert [(a.gid, a.ok) for a in acts if isinstance(a, DdlOutcome)] == [(gid, False)]
    # it never ran: a writer that did not see it passes
    c.submit("n2", gid - 1, 6)
    c.drain()
    assert c.log["n2"][-1] == (gid + 1, True)


def test_even_split_the_half_with_the_tie_breaker_commits_the_other_refuses() -> None:
    """Four nodes split 2|2: the half holding the tie-breaking node (n1) is the primary
    component and commits with two of four reports; the other half refuses writes, even if
    votequorum's flag were to say otherwise."""
    four = ["n1", "n2", "n3", "n4"]
    c = form(quorum=3, names=four, expected=4, tie_breaker="n1")
    for n in four:
        c.log[n].clear()
    c.view(["n1", "n2"], quorate=True, quorum=3, expected=4, tie_breaker="n1")
    c.view(["n3", "n4"], quorate=True, quorum=3, expected=4, tie_breaker="n1")
    assert [c.nodes[n].phase for n in four] == [Phase.ONLINE, Phase.ONLINE, Phase.NON_PRIMARY, Phase.NON_PRIMARY]
    assert not c.nodes["n3"].accepts_writes and c.nodes["n1"].accepts_writes
    c.submit("n2", 1, 8)
    while c.order:
        s, p = c.order.popleft()
        for n in ("n1", "n2"):
            c.act(n, c.nodes[n].on_delivery(Delivery(s, p)))
    assert c.log["n1"] == c.log["n2"] == [(1, True)]
    assert all(c.nodes[n].released == 1 for n in ("n1", "n2"))


def test_primary_component_re_forms_when_every_node_is_back() -> None:
    """A partition into 1|1|1 leaves no primary component. Once the partition heals, every node
    asks to join and nobody answers; the node with the highest GID starts the cluster again at
    its GID and the others join it (they catch up from its log)."""
    c = form(quorum=2, expected=3)
    c.submit("n2", 1, 1)
    c.submit("n2", 1, 2)
    c.drain()
    c.tick(1.0)
    assert all(r.released == 2 for r in c.nodes.values())
    for n in NAMES:  # alone, each: not quorate
        r = c.nodes[n]
        c.act(n, r.on_view(View(2, (n,), (), tuple(m for m in NAMES if m != n), n, False, 2, 3), c.now))
        assert r.phase == Phase.NON_PRIMARY
    c.nodes["n1"].order.released = 1  # n1 had not seen GID 2 released before it was cut off
    c.order.clear()
    c.view(NAMES, quorum=2, expected=3)  # healed: everyone asks, nobody is online to answer
    c.drain()
    for _ in range(4):
        c.tick(1.0)
    assert all(r.phase in (Phase.ONLINE, Phase.RECOVERING) for r in c.nodes.values()), \
        {n: r.phase for n, r in c.nodes.items()}
    assert {r.cluster_uuid for r in c.nodes.values()} == {c.nodes["n2"].cluster_uuid}
    assert c.nodes["n2"].phase == Phase.ONLINE and c.nodes["n2"].gid == 2  # n2 (not n3): lowest name among GID 2


def test_no_re_forming_while_a_configured_node_is_missing() -> None:
    """n3 is away (it may hold the only copy of an acknowledged commit): n1 and n2 form a quorum
    but neither may start the cluster again on its own."""
    c = form(quorum=2, expected=3)
    for n in NAMES:
        r = c.nodes[n]
        c.act(n, r.on_view(View(2, (n,), (), tuple(m for m in NAMES if m != n), n, False, 2, 3), c.now))
    c.order.clear()
    for n in ("n1", "n2"):
        r = c.nodes[n]
        c.act(n, r.on_view(View(3, ("n1", "n2"), ("n1", "n2"), (), n, True, 2, 3), c.now))
    for _ in range(6):
        c.now += 1.0
        for n in ("n1", "n2"):
            c.act(n, c.nodes[n].tick(c.now))
        while c.order:
            s, p = c.order.popleft()
            for n in ("n1", "n2"):
                c.act(n, c.nodes[n].on_delivery(Delivery(s, p)))
    assert c.nodes["n1"].phase == c.nodes["n2"].phase == Phase.JOINING


def test_a_joiner_vouches_only_for_what_it_delivered() -> None:
    """n3 asks to join at GID 1: it never delivered GID 1, so its reports do not count for it
    (its client could otherwise hear "committed" while only n1 holds the writeset); n2's do."""
    c = form(quorum=2)
    c.submit("n1", 1, 6)
    sender, payload = c.order.popleft()
    r1 = c.nodes["n1"]
    for n in NAMES:
        c.log[n].clear()
    r1.on_delivery(Delivery(sender, payload))  # only n1 has it; its own report is lost
    assert r1.held_count == 1
    r1.on_delivery(Delivery("n3", bp.encode(bp.GidRequest("n3", "req", r1.cluster_uuid, 0))))
    c.act("n1", r1.on_delivery(Delivery("n3", bp.encode(bp.Received("n3", 4)))))
    assert r1.held_count == 1 and c.log["n1"] == []
    c.act("n1", r1.on_delivery(Delivery("n2", bp.encode(bp.Received("n2", 1)))))
    assert r1.held_count == 0 and c.log["n1"] == [(1, True)]


def _votes(c: Cluster, votes: list[tuple[str, bool]], gid: int) -> dict[str, list[tuple[int, bool]]]:
    """Deliver the votes in order to every node; what each decided."""
    for n, ok in votes:
        c.order.append((n, bp.encode(bp.Vote(n, gid, ok, "" if ok else "duplicate key"))))
    decided: dict[str, list[tuple[int, bool]]] = {n: [] for n in NAMES}
    opened: dict[str, int] = {n: 0 for n in NAMES}
    while c.order:
        sender, payload = c.order.popleft()
        for n, r in c.nodes.items():
            for a in r.on_delivery(Delivery(sender, payload)):
                if isinstance(a, VoteDecided):
                    decided[n].append((a.gid, a.ok))
                elif isinstance(a, VoteOpened):
                    opened[n] += 1
    assert all(v == 1 for v in opened.values()), opened
    return decided


def test_inconsistency_vote_the_minority_that_failed_loses() -> None:
    """Galera 4's inconsistency voting: n2 fails to apply GID 1, n1 and n3 applied it: every node
    decides, at the same vote, that the majority applied it (n2 leaves)."""
    c = form()
    c.submit("n1", 0, 1)
    c.drain()
    assert _votes(c, [("n2", False), ("n1", True), ("n3", True)], 1) == {n: [(1, True)] for n in NAMES}
    assert all(r.decided == {1: True} and not r.ballots for r in c.nodes.values())


def test_a_node_that_fails_a_gid_decided_before_it_joined_hears_the_outcome() -> None:
    """GID 1 was decided (applied) before n3 was there to count it; n3, rebuilt from a copy where a
    row differs, fails it while catching up and opens a ballot the members closed long ago. They
    answer with the outcome they hold, and n3 concludes as they did (found by simulation seed
    11691: n3 waited for the ballot forever)."""
    c = form()
    c.submit("n1", 0, 1)
    c.drain()
    assert _votes(c, [("n2", False), ("n1", True), ("n3", True)], 1) == {n: [(1, True)] for n in NAMES}
    r1, r3 = c.nodes["n1"], c.nodes["n3"]
    r3.decided.clear()  # n3 joined after GID 1 was decided, and is catching up (not synced)
    for r in c.nodes.values():
        r.membership.synced.discard("n3")
    late = bp.encode(bp.Vote("n3", 1, False, "a row it changes is not as its origin had it"))
    answers = [a for a in r1.on_delivery(Delivery("n3", late)) if isinstance(a, Send)]
    assert [a.message for a in answers] == [bp.Vote("n1", 1, True, "")]
    assert [type(a) for a in r3.on_delivery(Delivery("n3", late))] == [VoteOpened]
    answer = bp.encode(answers[0].message)
    assert [(a.gid, a.ok) for a in r3.on_delivery(Delivery("n1", answer)) if isinstance(a, VoteDecided)] == [(1, True)]
    assert r1.on_delivery(Delivery("n1", answer)) == []  # counted already there: no answer to an answer
    assert not r3.ballots and r3.decided == {1: True}


def test_the_members_answer_a_late_failure_vote_once_and_never_each_others_answers() -> None:
    """GID 1 was decided *failed* (the majority could not apply it). A late node's failure vote
    on it is answered by the synced members, with a failure vote each; those answers, from synced
    nodes, are not answered in turn (else the members would answer one another for good)."""
    c = form()
    c.submit("n1", 0, 1)
    c.drain()
    assert _votes(c, [("n2", False), ("n3", False), ("n1", True)], 1) == {n: [(1, False)] for n in NAMES}
    for r in c.nodes.values():
        r.membership.synced.discard("n1")  # n1 left and came back: catching up, not synced
    late = bp.encode(bp.Vote("n1", 1, False, "a row it changes is not as its origin had it"))
    answers = [a.message for n in ("n2", "n3") for a in c.nodes[n].on_delivery(Delivery("n1", late))
               if isinstance(a, Send)]
    assert answers == [bp.Vote("n2", 1, False, "the majority could not apply it"),
                       bp.Vote("n3", 1, False, "the majority could not apply it")]
    for m in answers:
        for n in ("n2", "n3"):
            assert c.nodes[n].on_delivery(Delivery(m.node, bp.encode(m))) == []


def test_a_node_asks_again_for_the_ballots_it_waits_on_when_it_rejoins() -> None:
    """A vote sent while the node was cut off reached no member (simulation seed 13336): back in
    the primary component, it asks again; a GID decided meanwhile concludes at once."""
    sent: list[bp.Message] = []
    decided: dict[int, bool] = {}
    skipped: list[int] = []
    left: list[str] = []
    v = InconsistencyVoting("n1", sent.append, decided.get, lambda: 129, skipped.append, left.append)
    v.apply_failed(130, "a row it changes is not as its origin had it")
    v.apply_failed(131, "another")
    assert [m.gid for m in sent if isinstance(m, bp.Vote)] == [130, 131]
    sent.clear()
    decided[131] = False  # the members decided 131 before this node heard
    v.rejoined()
    assert sent == [bp.Vote("n1", 130, False, "a row it changes is not as its origin had it")]
    assert skipped == [131] and not left
    sent.clear()
    v.rejoined()  # a second rejoin asks again on what is still open only
    assert [m.gid for m in sent if isinstance(m, bp.Vote)] == [130]


def test_inconsistency_vote_the_origin_loses_when_the_majority_failed() -> None:
    c = form()
    c.submit("n1", 0, 1)
    c.drain()
    assert _votes(c, [("n2", False), ("n3", False), ("n1", True)], 1) == {n: [(1, False)] for n in NAMES}


def test_inconsistency_vote_counts_the_voters_that_stay() -> None:
    """n3 leaves before voting: the two left decide between them (a tie keeps the writeset)."""
    c = form()
    c.submit("n1", 0, 1)
    c.drain()
    c.order.append(("n2", bp.encode(bp.Vote("n2", 1, False, "boom"))))
    c.order.append(("n1", bp.encode(bp.Vote("n1", 1, True))))
    c.drain()
    assert all(1 in r.ballots for r in c.nodes.values())
    outcomes = {}
    for n in ("n1", "n2"):
        acts = c.nodes[n].on_view(View(2, ("n1", "n2"), (), ("n3",), n, True), c.now)
        outcomes[n] = [(a.gid, a.ok) for a in acts if isinstance(a, VoteDecided)]
    assert outcomes == {"n1": [(1, True)], "n2": [(1, True)]}


def test_local_cluster_counts_coordinators_not_its_one_corosync() -> None:
    """Three coordinators on one Corosync node (a local cluster, bus.members = 3): when two of
    them stop, the third is not a primary component on its own."""
    members = ["1:100", "1:200", "1:300"]
    nodes = {m: Replicator(f"n{i + 1}", "", 0, bootstrap=(i == 0), member_votes=3) for i, m in enumerate(members)}
    for m, r in nodes.items():
        r.on_view(View(1, tuple(members), tuple(members), (), m, True, 1, 1), 0.0)
        r.phase, r.quorate, r.online = Phase.ONLINE, True, {x.node: k for k, x in nodes.items()}
        r.synced = set(r.online)
    r1 = nodes["1:100"]
    r1.on_view(View(2, ("1:100", "1:200"), (), ("1:300",), "1:100", True, 1, 1), 0.0)
    assert r1.accepts_writes  # two of three
    acts = r1.on_view(View(3, ("1:100",), (), ("1:200",), "1:100", True, 1, 1), 0.0)
    assert not r1.accepts_writes and r1.phase == Phase.NON_PRIMARY
    assert any(isinstance(a, PhaseChange) and a.phase == Phase.NON_PRIMARY for a in acts)


def test_flow_control_pauses_every_node_until_the_last_asker_lets_go() -> None:
    """A node's FlowControl request pauses writes on every node (each gets one Pause(True)); it
    lasts until no node asks any more, or the asker leaves the view."""
    c = form()
    said: dict[str, list[bool]] = {n: [] for n in NAMES}

    def deliver(sender: str, msg: bp.Message) -> None:
        for n, r in c.nodes.items():
            said[n] += [a.paused for a in r.on_delivery(Delivery(sender, bp.encode(msg))) if isinstance(a, Pause)]

    deliver("n2", bp.FlowControl("n2", True))
    deliver("n3", bp.FlowControl("n3", True))
    deliver("n2", bp.FlowControl("n2", False))
    assert said == {n: [True] for n in NAMES}  # n3 still asks
    for n in ("n1", "n2"):  # n3 leaves: nobody asks any more
        v = View(2, ("n1", "n2"), (), ("n3",), n, True, 1, 0, "")
        said[n] += [a.paused for a in c.nodes[n].on_view(v, c.now) if isinstance(a, Pause)]
    assert said["n1"] == said["n2"] == [True, False]


def test_a_gid_request_in_a_nodes_name_that_it_did_not_send_takes_it_out_everywhere() -> None:
    """Found by fuzzing the bus (tests/unit/test_fuzz_boundaries.py): a damaged message that
    still parsed as a GidRequest in n2's name made n1 and n3 count n2 out while n2, which never
    asked, went on certifying its own writesets: they committed on n2 alone. Now n2 leaves the
    primary component at the same place and asks to join again."""
    c = form()
    c.order.append(("n2", bp.encode(bp.GidRequest("n2", "not-n2s-request", c.nodes["n1"].cluster_uuid, 0))))
    c.order.append(("n2", bp.encode(bp.WritesetMsg("n2", 99, writeset(0, 7)))))
    c.drain()
    assert not any(ok for _, ok in c.log["n2"])  # n2 committed nothing the others dropped
    assert c.applied["n1"] == c.applied["n3"] == []
    assert c.nodes["n1"].gid == c.nodes["n3"].gid
    assert "n2" in c.nodes["n1"].online  # it asked to join again, and is back


def test_a_stale_request_of_a_member_takes_it_out_on_every_node_itself_included() -> None:
    """A member's own request to join, made before it joined (a Bootstrap or an earlier answer
    came first in the order), delivered while it is a member: the others forget it there, and so
    must it (found by the simulation, seed 11303: the others dropped it, it went on as a member,
    and two primary components formed). It leaves and asks again, and every node agrees."""
    c = form()
    n2 = c.nodes["n2"]
    c.order.append(("n2", bp.encode(bp.GidRequest("n2", n2.membership.request_id, n2.cluster_uuid, n2.gid))))
    c.order.append(("n2", bp.encode(bp.WritesetMsg("n2", 99, writeset(0, 7)))))
    c.drain()
    for _ in range(3):
        c.tick(1.0)
    assert not any(ok for _, ok in c.log["n2"])  # n2 committed nothing the others dropped
    assert c.nodes["n1"].gid == c.nodes["n3"].gid
    assert all(r.phase == Phase.ONLINE for r in c.nodes.values()), {n: r.phase for n, r in c.nodes.items()}
    assert len({tuple(sorted(r.online.items())) for r in c.nodes.values()}) == 1


def test_a_node_whose_bootstrap_is_on_the_way_asks_for_no_gid() -> None:
    """Seed 11303 of the simulation: n1, told to bootstrap and alone in a quorate view (a
    tie-breaker), sent its Bootstrap; the view changed before the bus ordered it, and in the new
    view n1 also asked to join. Its Bootstrap came first, then its own request, from a member:
    n2 forgot n1, found no synced member and started a second primary component. A node asks
    nothing while its Bootstrap is on the way, and one cluster forms."""
    c = Cluster(names=["n1", "n2"])
    c.view(["n1"], quorum=1, expected=2, tie_breaker="n1")
    assert [bp.decode(p).__class__ for _, p in c.order] == [bp.Bootstrap]  # not delivered yet
    c.view(["n1", "n2"], quorum=1, expected=2, tie_breaker="n1")
    assert [type(bp.decode(p)).__name__ for n, p in c.order if n == "n1"] == ["Bootstrap"]
    c.drain()
    for _ in range(5):
        c.tick(1.0)
    assert all(r.phase == Phase.ONLINE for r in c.nodes.values()), {n: r.phase for n, r in c.nodes.items()}
    assert {tuple(r.membership.epochs) for r in c.nodes.values()} == {tuple(c.nodes["n1"].membership.epochs)}
    assert len(c.nodes["n1"].membership.epochs) == 1
    assert len({tuple(sorted(r.online.items())) for r in c.nodes.values()}) == 1


def test_the_bootstrap_node_waits_for_a_quorum_before_it_bootstraps() -> None:
    """Found by the container test (tests/container/test_podman.py): the node told to bootstrap
    came up seconds before the others (one Corosync per node, 3 votes). Alone, its view was not
    quorate, yet after BOOTSTRAP_WAIT_S it bootstrapped; when the others arrived it counted
    itself cut off (it came with fewer than a quorum) and went non-primary, and the new nodes,
    with no cluster to join and no UUID to re-form, waited for ever. It now bootstraps only in
    a quorate view (invariant 7: no primary component without a quorum)."""
    c = Cluster()
    c.view(["n1"], quorum=2, expected=3)
    c.drain()
    for _ in range(5):
        c.tick(1.0)
    assert c.nodes["n1"].phase != Phase.ONLINE and not c.nodes["n1"].cluster_uuid
    c.view(NAMES, quorum=2, expected=3)
    c.drain()
    for _ in range(5):
        c.tick(1.0)
    assert all(r.phase == Phase.ONLINE for r in c.nodes.values()), {n: r.phase for n, r in c.nodes.items()}
    assert len({r.cluster_uuid for r in c.nodes.values()}) == 1


# ---- recovery that cannot deadlock (issue 34; docs/RECOVERY.md) -------------------------------


class Group:
    """Replicators on one simulated bus whose member ids a test chooses (a restarted node comes
    back as a new member): every message is delivered, in one order, to the members of the
    current view."""

    def __init__(self, expected: int = 3) -> None:
        self.nodes: dict[str, Replicator] = {}  # member id -> replicator
        self.members: tuple[str, ...] = ()
        self.order: deque[tuple[str, bytes]] = deque()
        self.out: dict[str, list[object]] = {}
        self.expected = expected
        self.now = 0.0

    def act(self, member: str, actions: list) -> None:  # type: ignore[type-arg]
        for a in actions:
            if isinstance(a, Send):
                self.order.append((member, bp.encode(a.message)))
            else:
                self.out.setdefault(member, []).append(a)

    def view(self, members: list[str]) -> None:
        before = set(self.members)
        self.members = tuple(members)
        for m in members:
            r = self.nodes[m]
            v = View(1, self.members, tuple(x for x in members if x not in before or not r.members),
                     tuple(sorted(before - set(members))), m, True, self.expected // 2 + 1, self.expected)
            self.act(m, r.on_view(v, self.now))

    def drain(self, drop: Callable[[str, bp.Message], bool] = lambda m, msg: False) -> None:
        while self.order:
            sender, payload = self.order.popleft()
            if sender not in self.members or drop(sender, bp.decode(payload)):
                continue
            for m in self.members:
                self.act(m, self.nodes[m].on_delivery(Delivery(sender, payload)))

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds
        for m in self.members:
            self.act(m, self.nodes[m].tick(self.now))
        self.drain()

    def phases(self) -> dict[str, str]:
        return {self.nodes[m].node: self.nodes[m].phase.value for m in self.members}


def formed(n: int = 3) -> Group:
    g = Group(expected=n)
    for i in range(1, n + 1):
        g.nodes[f"n{i}"] = Replicator(f"n{i}", "", 0, bootstrap=(i == 1))
    g.view([f"n{i}" for i in range(1, n + 1)])
    g.drain()
    for _ in range(5):
        g.tick()
    assert set(g.phases().values()) == {"online"}, g.phases()
    return g


def restarted(g: Group, member: str, new: str, last_gid: int) -> None:
    """The node of ``member`` comes back as bus member ``new``, its database at ``last_gid``,
    with what its state file remembered."""
    old = g.nodes[member]
    g.nodes[new] = Replicator(old.node, old.cluster_uuid, last_gid, epochs=old.epochs, records=dict(old.records),
                              holding=lambda: Holding(last_gid))


def submit(g: Group, member: str, key: int, ticket: int = 1) -> None:
    r = g.nodes[member]
    g.order.append((member, bp.encode(bp.WritesetMsg(r.node, ticket, writeset(r.gid, key)))))


def test_a_joiner_delivers_what_the_answer_has_not_released_and_vouches_for_it() -> None:
    """A node just (re-)started the cluster and certified a writeset before the others' join
    requests reached it: nobody else delivered it. A joiner that vouched only for GIDs after
    its request would never let it be released, and the joiners' catch-up waited for it to
    commit: simulated clusters stalled so. The answer carries it; the joiner delivers it and
    vouches for it."""
    g = Group(expected=3)
    for i in (1, 2, 3):
        g.nodes[f"n{i}"] = Replicator(f"n{i}", "", 0)
    g.view(["n1", "n2", "n3"])
    g.drain()
    g.now += 4
    n1 = g.nodes["n1"]
    n1.bootstrap = True  # told after the requests (told before, it would start at the last of them)
    g.act("n1", n1.tick(g.now))  # nobody answered: n1 starts the cluster
    sender, payload = g.order.popleft()
    assert isinstance(bp.decode(payload), bp.Bootstrap)
    for m in g.members:
        g.act(m, g.nodes[m].on_delivery(Delivery(sender, payload)))
    assert n1.phase == Phase.ONLINE
    when = 1_790_000_000_000_001  # its commit time: the joiners get it with the answer (bus version 5)
    g.order.appendleft(("n1", bp.encode(bp.WritesetMsg("n1", 1, writeset(0, 1), when))))  # ahead of the requests
    g.drain()
    for _ in range(3):
        g.tick()
    assert n1.released == 1 and [a.commit_time for a in g.out["n1"] if isinstance(a, LocalVerdict) and a.ok] == [when]
    assert g.phases() == {"n1": "online", "n2": "online", "n3": "online"}
    for m in ("n2", "n3"):
        assert [(a.gid, a.commit_time) for a in g.out[m] if isinstance(a, Apply)] == [(1, when)]


def test_a_node_that_gives_up_says_so_and_every_node_drops_it_at_that_place() -> None:
    g = formed(3)
    restarted(g, "n3", "n3b", 0)
    submit(g, "n1", 1)
    g.drain()
    g.view(["n1", "n2", "n3b"])
    g.drain()
    n3 = g.nodes["n3b"]
    assert n3.phase == Phase.RECOVERING and all("n3" in g.nodes[m].online for m in ("n1", "n2"))
    g.act("n3b", n3.recovery_failed("no log holds it"))
    g.drain()
    assert n3.phase == Phase.NEEDS_RECOVERY
    assert all("n3" not in g.nodes[m].online for m in ("n1", "n2"))
    assert g.nodes["n1"].records["n3"].member is False  # remembered where it left


def test_no_synced_member_left_the_others_wait_for_it_then_the_one_holding_most_re_forms() -> None:
    """The issue's story: the synced member leaves while the others catch up from it. They have
    no primary component; they re-form it, but only once the node that may hold acknowledged
    writesets they lack is back, and from it: nobody is told to rebuild."""
    g = formed(3)
    for k in range(4):
        submit(g, "n1", k, ticket=k + 1)
        g.drain()
    restarted(g, "n2", "n2b", 1)
    g.view(["n1", "n3", "n2b"])
    g.drain()
    restarted(g, "n3", "n3b", 2)
    g.view(["n1", "n2b", "n3b"])
    g.drain()
    assert g.phases() == {"n1": "online", "n2": "recovering", "n3": "recovering"}
    g.view(["n2b", "n3b"])  # n1's host dies: quorate, but no synced member
    g.drain()
    for _ in range(3):
        g.tick()
    assert g.phases() == {"n2": "joining", "n3": "joining"}
    for m in ("n2b", "n3b"):
        d = g.nodes[m].reform
        assert d is not None and [n for n, _ in d.waiting_for] == ["n1"], d
    restarted(g, "n1", "n1b", 4)
    g.view(["n1b", "n2b", "n3b"])
    g.drain()
    for _ in range(3):
        g.tick()
    assert g.phases() == {"n1": "online", "n2": "recovering", "n3": "recovering"}
    n1 = g.nodes["n1b"]
    assert n1.epochs[-1] == Epoch(2, 4, "n1")
    assert all(g.nodes[m].epochs == n1.epochs for m in ("n2b", "n3b"))
    assert not [a for m in g.out for a in g.out[m] if isinstance(a, PhaseChange) and a.phase == Phase.NEEDS_RECOVERY]


def test_a_node_told_to_stay_out_that_holds_most_re_forms_the_cluster() -> None:
    """A needs-recovery node takes part in a re-form; if it holds most, it re-forms."""
    g = formed(3)
    for k in range(3):
        submit(g, "n1", k, ticket=k + 1)
        g.drain()
    n3 = g.nodes["n3"]
    n3.holding = lambda: Holding(3)
    n3.phase = Phase.NEEDS_RECOVERY  # it stays out (say it gave up earlier)
    g.view(["n1", "n2"])
    g.drain()
    restarted(g, "n1", "n1b", 0)  # then n1 and n2 restart with less (rebuilt from an old backup, say)
    restarted(g, "n2", "n2b", 0)
    g.view(["n1b", "n2b", "n3"])
    g.drain()
    for _ in range(3):
        g.tick()
    assert n3.phase == Phase.ONLINE and n3.epochs[-1] == Epoch(2, 3, "n3")
    assert g.phases() == {"n1": "recovering", "n2": "recovering", "n3": "online"}


def test_an_answer_to_an_earlier_request_is_ignored_by_every_node() -> None:
    """A node that asked twice takes only the answer to its latest request; every member must
    count it as that answer says. A simulated node was counted synced by the others from the
    answer to its first request (it held everything released then) while it caught up from the
    answer to its second (more was released by then), and never went online."""
    g = formed(3)
    submit(g, "n1", 1)
    g.drain()
    restarted(g, "n3", "n3b", 1)  # it holds GID 1: synced, if answered now

    def deliver(sender: str, payload: bytes) -> None:
        for m in g.members:
            g.act(m, g.nodes[m].on_delivery(Delivery(sender, payload)))

    def take() -> list[tuple[str, bytes]]:
        out = list(g.order)
        g.order.clear()
        return out

    g.view(["n1", "n2", "n3b"])
    (r1,) = [x for x in take() if isinstance(bp.decode(x[1]), bp.GidRequest)]
    deliver(*r1)
    (reply1,) = take()
    submit(g, "n1", 2, ticket=2)
    g.drain()
    g.tick()
    g.tick()  # GID 2, released by n1 and n2 (their reports sent again: those of the view change were taken)
    assert g.nodes["n1"].released == 2
    n3 = g.nodes["n3b"]
    g.act("n3b", n3.rejoin(1, g.now))  # n3 asks again
    (r2,) = take()
    deliver(*r2)
    (reply2,) = take()
    deliver(*reply1)
    deliver(*reply2)
    g.drain()
    assert n3.phase == Phase.RECOVERING
    for m in ("n1", "n2"):
        assert "n3" in g.nodes[m].online and "n3" not in g.nodes[m].synced, g.nodes[m].synced
    g.act("n3b", n3.recovered(2))
    g.drain()
    assert n3.phase == Phase.ONLINE and all("n3" in g.nodes[m].synced for m in ("n1", "n2"))


def test_a_joiners_own_writesets_delivered_before_its_answer_get_no_gid_anywhere() -> None:
    """A node thawed from a freeze sends writesets its backends committed just before, after its
    GID request (its sender waited for the view change). The members drop them: it is no member
    at their place. The joiner must drop them as well when it replays what it delivered after
    its request, though the answer admits it: a lab run counted them there, and the node gave
    every later GID to another writeset than the others did."""
    g = formed(3)
    submit(g, "n1", 1)
    g.drain()
    n3 = g.nodes["n3"]
    g.act("n3", n3.on_view(View(2, ("n3",), (), ("n1", "n2"), "n3", False, 2, 3), g.now))  # cut off
    g.view(["n1", "n2", "n3"])  # back: it asks to join
    requests = [x for x in g.order if isinstance(bp.decode(x[1]), bp.GidRequest)]
    assert [bp.decode(p).node for _, p in requests] == ["n3"]  # type: ignore[union-attr]
    submit(g, "n3", 7, ticket=9)  # after its request, before the answer
    g.drain()
    assert n3.phase == Phase.ONLINE
    assert len({g.nodes[m].gid for m in g.members}) == 1, {m: g.nodes[m].gid for m in g.members}
    refused = [a for a in g.out["n3"] if isinstance(a, LocalVerdict) and a.ticket == 9]
    assert refused and not refused[-1].ok
    submit(g, "n1", 2, ticket=10)
    g.drain()
    assert len({g.nodes[m].gid for m in g.members}) == 1 and all(g.nodes[m].last_certified == n3.last_certified
                                                                  for m in g.members)


# ---- schema changes settled by every node's report (docs/ARCHITECTURE.md invariant 10, docs/SECURITY.md) ----

def _schema_in_block(last_seen: int = 0) -> bytes:
    """A transaction that made a schema change (certified at commit like any writeset)."""
    return wire.encode(Writeset(0, 1, last_seen, (), (_STATEMENT,), _KEYS, flags=wire.FLAG_DDL))


def _settle_run(c: Cluster, reports: list[tuple[str, bool]], gid: int) -> dict[str, list[VoteDecided]]:
    """Deliver the reports in order to every node; the schema decisions each made."""
    for n, ok in reports:
        c.order.append((n, bp.encode(bp.Vote(n, gid, ok, "" if ok else "23514 check constraint violated"))))
    out: dict[str, list[VoteDecided]] = {n: [] for n in c.nodes}
    while c.order:
        sender, payload = c.order.popleft()
        for n, r in c.nodes.items():
            acts = r.on_delivery(Delivery(sender, payload))
            assert not [a for a in acts if isinstance(a, VoteOpened)]  # no inconsistency vote
            out[n] += [a for a in acts if isinstance(a, VoteDecided)]
    return out


def _certify_schema_change(c: Cluster, origin: str) -> tuple[int, dict[str, list[object]]]:
    c.ticket += 1
    c.order.append((origin, bp.encode(bp.WritesetMsg(origin, c.ticket, _schema_in_block(c.nodes[origin].gid)))))
    acts: dict[str, list[object]] = {n: [] for n in c.nodes}
    while c.order:
        sender, payload = c.order.popleft()
        for n, r in c.nodes.items():
            acts[n] += r.on_delivery(Delivery(sender, payload))
    return c.nodes[origin].gid, acts


def test_a_schema_change_commits_once_every_node_applied_it() -> None:
    """Its origin's backend and the other nodes' applies wait for every node's report."""
    c = form()
    gid, acts = _certify_schema_change(c, "n1")
    assert [(a.gid, a.settle) for a in acts["n1"] if isinstance(a, LocalVerdict)] == [(gid, True)]
    for n in ("n2", "n3"):
        assert [(a.gid, a.settle) for a in acts[n] if isinstance(a, Apply)] == [(gid, True)]
    assert all(r.settling and r.ballots[gid].votes == {"n1": (True, "")} for r in c.nodes.values())
    decided = _settle_run(c, [("n2", True)], gid)
    assert decided == {n: [] for n in NAMES}  # n3 has not reported yet
    decided = _settle_run(c, [("n3", True)], gid)
    assert {n: [(d.gid, d.ok, d.schema) for d in v] for n, v in decided.items()} == {
        n: [(gid, True, True)] for n in NAMES}
    assert all(not r.settling and r.settled == {gid: True} and not r.decided for r in c.nodes.values())


def test_one_node_that_cannot_apply_a_schema_change_undoes_it_everywhere_and_none_leaves() -> None:
    """The first failure decides at once, alike on every node: the change is undone everywhere
    (its origin's client hears the failing node's error); it is not an inconsistency vote, so no
    node leaves: code a replay runs cannot choose which node goes."""
    c = form()
    gid, _ = _certify_schema_change(c, "n2")
    decided = _settle_run(c, [("n3", False), ("n1", True)], gid)
    for n in NAMES:
        assert [(d.gid, d.ok, d.schema, d.failure) for d in decided[n]] == [
            (gid, False, True, "n3: 23514 check constraint violated")]
    assert all(r.settled == {gid: False} and not r.ballots and not r.decided for r in c.nodes.values())
    # the origin itself failing: impossible (it ran it); every other node failing: undone too
    gid2, _ = _certify_schema_change(c, "n1")
    decided = _settle_run(c, [("n2", False), ("n3", False)], gid2)
    assert all([(d.gid, d.ok) for d in v] == [(gid2, False)] for v in decided.values())


def test_a_schema_change_in_total_order_is_settled_after_its_content() -> None:
    c = form()
    c.ticket += 1
    c.order.append(("n1", bp.encode(bp.WritesetMsg("n1", c.ticket, _ddl()))))
    c.drain()
    gid = c.nodes["n1"].gid
    c.order.append(("n1", bp.encode(bp.DdlResult("n1", gid, True, "", _content()))))
    outcomes = set()
    while c.order:
        sender, payload = c.order.popleft()
        for r in c.nodes.values():
            outcomes |= {(a.gid, a.ok, a.settle) for a in r.on_delivery(Delivery(sender, payload))
                         if isinstance(a, DdlOutcome)}
    assert outcomes == {(gid, True, True)}
    decided = _settle_run(c, [("n2", True), ("n3", True)], gid)
    assert all([(d.gid, d.ok) for d in v] == [(gid, True)] for v in decided.values())


def test_a_node_that_leaves_no_longer_holds_a_schema_change_up() -> None:
    c = form()
    gid, _ = _certify_schema_change(c, "n1")
    _settle_run(c, [("n2", True)], gid)
    for n in ("n1", "n2"):
        acts = c.nodes[n].on_view(View(2, ("n1", "n2"), (), ("n3",), n, True), c.now)
        assert [(a.gid, a.ok, a.schema) for a in acts if isinstance(a, VoteDecided)] == [(gid, True, True)]


def test_no_schema_change_is_settled_outside_the_primary_component() -> None:
    """A node cut off while a schema change waits for reports decides nothing; when it joins
    again, what the cluster made of the change comes from a member's log (the catch-up), and a
    change the cluster never certified is undone here."""
    c = form(quorum=2)
    gid, _ = _certify_schema_change(c, "n1")
    r3 = c.nodes["n3"]
    r3.on_view(View(2, ("n3",), (), ("n1", "n2"), "n3", False, 2), c.now)
    assert r3.phase == Phase.NON_PRIMARY
    acts = r3.on_delivery(Delivery("n3", bp.encode(bp.Vote("n3", gid, False, "XX000 boom"))))
    assert not [a for a in acts if isinstance(a, VoteDecided)] and gid in r3.ballots
    # it joins a cluster that certified only up to before the change: undone here
    r3.membership.request_id, r3.membership.request_seen, r3.phase = "rq", True, Phase.JOINING
    reply = bp.GidReply("n3", "rq", "n3", r3.cluster_uuid, gid - 1, gid - 1, (("n1", "n1"), ("n3", "n3")),
                        (("n1", gid - 1),), c.nodes["n1"].certifier.snapshot())
    acts = r3.on_delivery(Delivery("n1", bp.encode(reply)))
    assert [(a.gid, a.ok, a.schema) for a in acts if isinstance(a, VoteDecided)] == [(gid, False, True)]
    assert not r3.ballots


def test_a_node_alone_settles_its_schema_changes_at_once() -> None:
    c = form(names=["n1"])
    _, acts = _certify_schema_change(c, "n1")
    assert [a.settle for a in acts["n1"] if isinstance(a, LocalVerdict)] == [False]
