"""Adding and removing nodes online (chorus/confchange, docs/MEMBERSHIP.md "Adding and removing
nodes"): the corosync.conf rewrite, the rule a change must pass, and the configured set switched
at one place of the total order on every node, quorum and re-forming counted from it."""

from __future__ import annotations

from collections import deque
from typing import Any, Optional

import pytest

from chorus import confchange
from chorus import wire
from chorus.actions import Apply, LocalVerdict, Phase, Reconfigure, Reconfigured, Removed, Send
from chorus.bus import Delivery, View, Votes
from chorus.bus import proto as bp
from chorus.confchange import ClusterConfig, change_problem
from chorus.history import MemberRecord
from chorus.confchange.corosync_conf import (CorosyncConfError, CorosyncNode, add_node, next_nodeid, read_nodes,
                                             remove_node, tie_breaker)
from chorus.replicator import Replicator
from chorus.state import NodeState, load_state, save_state

CONF = """totem {
  version: 2
  cluster_name: chorus
  transport: knet
}
# the three hosts
quorum {
  provider: corosync_votequorum
  expected_votes: 3
  auto_tie_breaker: 1
}
nodelist {
  node {
    name: n1
    nodeid: 1
    ring0_addr: 10.0.0.1
  }
  node {
    name: n2
    nodeid: 2
    ring0_addr: 10.0.0.2   # second host
  }
  node {
    name: n3
    nodeid: 3
    ring0_addr: 10.0.0.3
  }
}
"""


# ---- corosync.conf ----------------------------------------------------------------------------

def test_adding_a_node_appends_it_to_the_node_list_and_counts_its_vote() -> None:
    out = add_node(CONF, CorosyncNode(4, "n4", "10.0.0.4"))
    assert read_nodes(out) == [CorosyncNode(1, "n1", "10.0.0.1"), CorosyncNode(2, "n2", "10.0.0.2"),
                               CorosyncNode(3, "n3", "10.0.0.3"), CorosyncNode(4, "n4", "10.0.0.4")]
    assert "  expected_votes: 4\n" in out and "expected_votes: 3" not in out
    assert "# the three hosts" in out and "# second host" in out  # the rest stays as it was
    assert "  node {\n    name: n4\n    nodeid: 4\n    ring0_addr: 10.0.0.4\n  }\n}\n" in out
    assert next_nodeid(out) == 5
    # and back: the same text as before
    assert remove_node(out, "n4") == CONF


def test_removing_a_node_by_name_or_address() -> None:
    out = remove_node(CONF, "10.0.0.2")
    assert [n.name for n in read_nodes(out)] == ["n1", "n3"]
    assert "expected_votes: 2" in out and "second host" not in out
    assert [n.name for n in read_nodes(remove_node(CONF, "n3"))] == ["n1", "n2"]


@pytest.mark.parametrize("node, what", [(CorosyncNode(4, "n2", "10.0.0.4"), "name n2"),
                                        (CorosyncNode(4, "n4", "10.0.0.3"), "address 10.0.0.3"),
                                        (CorosyncNode(1, "n4", "10.0.0.4"), "nodeid 1"),
                                        (CorosyncNode(4, "", "10.0.0.4"), "a name and an address"),
                                        (CorosyncNode(0, "n4", "10.0.0.4"), "not 1 to")])
def test_a_node_already_there_is_refused(node: CorosyncNode, what: str) -> None:
    with pytest.raises(CorosyncConfError, match=what):
        add_node(CONF, node)


def test_removing_a_node_that_is_not_there_or_the_last_one_is_refused() -> None:
    with pytest.raises(CorosyncConfError, match="no node n9 .*n1, n2, n3"):
        remove_node(CONF, "n9")
    one = remove_node(remove_node(CONF, "n3"), "n2")
    with pytest.raises(CorosyncConfError, match="last node"):
        remove_node(one, "n1")


def test_a_file_without_one_node_list_is_refused() -> None:
    with pytest.raises(CorosyncConfError, match="one top-level nodelist"):
        read_nodes("totem {\n  version: 2\n}\n")
    with pytest.raises(CorosyncConfError, match="not closed"):
        read_nodes("nodelist {\n  node {\n    nodeid: 1\n")


def test_expected_votes_are_left_to_votequorum_when_the_file_does_not_set_them() -> None:
    conf = CONF.replace("  expected_votes: 3\n", "")
    assert "expected_votes" not in add_node(conf, CorosyncNode(4, "n4", "10.0.0.4"))


def test_the_tie_breaker_read_from_the_file() -> None:
    assert tie_breaker(CONF) == "1"
    assert tie_breaker(remove_node(CONF, "n1")) == "2"
    assert tie_breaker(CONF.replace("auto_tie_breaker: 1", "auto_tie_breaker: 0")) == ""


# ---- the rule a change passes ---------------------------------------------------------------

ONLINE = {"n1": "1:10", "n2": "2:10", "n3": "3:10"}


def test_a_change_adds_or_removes_one_node_keeping_a_quorum_online() -> None:
    v1 = ClusterConfig(1, ("n1", "n2", "n3", "n4"))
    assert change_problem(None, 3, v1, ONLINE, "n1", False) is None
    assert change_problem(v1, 0, ClusterConfig(2, ("n1", "n2", "n3", "n4", "n5")), ONLINE, "n2", False) is None
    assert change_problem(v1, 0, ClusterConfig(2, ("n1", "n2", "n3")), ONLINE, "n3", False) is None


@pytest.mark.parametrize("current, count, new, online, why", [
    (None, 3, ClusterConfig(2, ("n1", "n2", "n3", "n4")), ONLINE, "version 2, the cluster is at version 0"),
    (None, 3, ClusterConfig(1, ("n1", "n2", "n3", "n4", "n5")), ONLINE, "one node at a time"),
    (ClusterConfig(1, ("n1", "n2", "n3", "n4")), 0, ClusterConfig(2, ("n1", "n2")), ONLINE, "one node at a time"),
    (ClusterConfig(1, ("n1", "n2", "n3", "n4")), 0, ClusterConfig(2, ("n1", "n2", "n3", "n5")), ONLINE,
     "one node at a time"),
    # two of three online: adding a fourth leaves 2 of 4, no quorum
    (None, 3, ClusterConfig(1, ("n1", "n2", "n3", "n4")), {"n1": "1:10", "n2": "2:10"}, "not a quorum of 4"),
    # removing one of the two online nodes of three: 1 of 2
    (None, 3, ClusterConfig(1, ("n1", "n3")), {"n1": "1:10", "n2": "2:10"}, "not a quorum of 2"),
    (None, 2, ClusterConfig(1, ()), ONLINE, "no configured node"),
    (None, 3, ClusterConfig(1, ("n1", "n2", "n3", "bad name")), ONLINE, "node names"),
    (None, 3, ClusterConfig(1, ("n1", "n2", "n3", "n4"), "1"), ONLINE, "breaks no ties"),
])
def test_a_change_that_cannot_be_made_is_refused(current: Optional[ClusterConfig], count: int,
                                                 new: ClusterConfig, online: dict[str, str], why: str) -> None:
    problem = change_problem(current, count, new, online, "n1", False)
    assert problem is not None and why in problem


def test_only_a_member_of_the_primary_component_changes_the_configuration() -> None:
    problem = change_problem(None, 3, ClusterConfig(1, ("n1", "n2", "n3", "n4")), ONLINE, "n7", False)
    assert problem is not None and "not a member" in problem


def test_majorities_of_one_node_apart_always_share_a_node() -> None:
    """Why one node at a time and no tie breaker: a quorum of the set before and a quorum of the
    set after always intersect, so nodes that switched and nodes that did not (a partition at
    the change) cannot both be quorate."""
    import itertools

    for n in range(1, 8):
        old = [f"n{i}" for i in range(1, n + 1)]
        new = old + [f"n{n + 1}"]
        q_old = Votes(n // 2 + 1, n)
        q_new = confchange.votes(ClusterConfig(1, tuple(new)), Votes(), False)
        for k in range(len(new) + 1):
            for side in itertools.combinations(new, k):
                other = [x for x in new if x not in side]
                assert not (q_new.holds(side) and q_old.holds([x for x in other if x in old]))


def test_a_local_cluster_counts_the_configured_coordinators() -> None:
    assert confchange.member_votes(None, 3) == 3
    assert confchange.member_votes(ClusterConfig(1, ("n1", "n2", "n3", "n4")), 3) == 4
    assert confchange.member_votes(ClusterConfig(1, ("n1", "n2")), 0) == 0
    bus = Votes(1, 1)
    assert confchange.votes(ClusterConfig(1, ("a", "b", "c", "d")), bus, True) == bus  # one Corosync: unchanged
    assert confchange.votes(ClusterConfig(1, ("a", "b", "c", "d")), bus, False) == Votes(3, 4, "", frozenset())


# ---- on the bus -------------------------------------------------------------------------------

def test_configure_and_the_configured_set_of_requests_and_answers_travel() -> None:
    m = bp.Configure("n1", "r1", 3, ("n1", "n2", "n4"), "")
    assert bp.decode(bp.encode(m)) == m
    q = bp.GidRequest("n2", "q", "u", 5, config_version=2, config_nodes=("n1", "n2"), config_tie="")
    assert bp.decode(bp.encode(q)) == q
    plain = bp.GidRequest("n2", "q", "u", 5)
    assert bp.decode(bp.encode(plain)) == plain  # no configured set: what was sent before it existed
    g = bp.GidReply("n4", "q", "4:1", "u", 9, 9, (("n1", "1:1"),), (), b"", config_version=1,
                    config_nodes=("n1", "n4"))
    assert bp.decode(bp.encode(g)) == g
    with pytest.raises(bp.BusProtoError):
        bp.decode(bp.encode(m)[:-3])


def test_the_state_file_keeps_the_configured_set(tmp_path: Any) -> None:
    path = str(tmp_path / "state.json")
    st = NodeState("n2", "u", 7, config=ClusterConfig(2, ("n3", "n1", "n2")), removed="")
    save_state(path, st)
    back = load_state(path, "n2")
    assert back.config == ClusterConfig(2, ("n1", "n2", "n3")) and back.removed == ""
    save_state(path, st.with_(config=None, removed="removed at GID 9"))
    assert load_state(path, "n2").config is None and load_state(path, "n2").removed == "removed at GID 9"


# ---- the configured set in the replicator ---------------------------------------------------

class Bus:
    """One total order for simulated nodes (each name its own bus member). ``shared``: they all
    share one Corosync (a local cluster): votes count coordinators, ``bus.members`` = ``votes``."""

    def __init__(self, names: list[str], shared: bool = True, votes: int = 0) -> None:
        self.shared = shared
        self.votes = votes or len(names)
        self.nodes: dict[str, Replicator] = {}
        self.order: deque[tuple[str, bytes]] = deque()
        self.answers: dict[str, list[Reconfigured]] = {}
        self.removed: dict[str, str] = {}
        self.saved: dict[str, ClusterConfig] = {}
        self.committed: dict[str, list[int]] = {}  # GIDs released to commit or apply, per node
        self.mute: set[str] = set()  # nodes whose delivery reports (Received) are lost
        self.members: list[str] = []
        self.view_id = 0
        self.now = 0.0
        for n in names:
            self.add(n, bootstrap=(n == names[0]))

    def add(self, name: str, bootstrap: bool = False) -> Replicator:
        r = Replicator(name, "", 0, bootstrap=bootstrap, member_votes=self.votes if self.shared else 0)
        self.nodes[name] = r
        return r

    def act(self, node: str, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, Send):
                self.order.append((node, bp.encode(a.message)))
            elif isinstance(a, Reconfigured):
                self.answers.setdefault(node, []).append(a)
            elif isinstance(a, Removed):
                self.removed[node] = a.reason
            elif isinstance(a, Reconfigure):
                self.saved[node] = a.config
            elif isinstance(a, LocalVerdict) and a.ok:
                self.committed.setdefault(node, []).append(a.gid)
            elif isinstance(a, Apply):
                self.committed.setdefault(node, []).append(a.gid)

    def view(self, members: list[str], quorum: int = 1, expected: int = 0) -> None:
        self.view_id += 1
        before, self.members = self.members, list(members)
        for n in members:
            v = View(self.view_id, tuple(members), tuple(m for m in members if m not in before),
                     tuple(m for m in before if m not in members), n, True, quorum, expected)
            self.act(n, self.nodes[n].on_view(v, self.now))
        self.drain()

    def tick(self, times: int = 5) -> None:
        for _ in range(times):
            self.now += 1.0
            for n in self.members:
                self.act(n, self.nodes[n].tick(self.now))
            self.drain()

    def drain(self) -> None:
        while self.order:
            sender, payload = self.order.popleft()
            if sender not in self.members or (sender in self.mute and isinstance(bp.decode(payload), bp.Received)):
                continue
            for n in self.members:
                self.act(n, self.nodes[n].on_delivery(Delivery(sender, payload)))

    def configure(self, by: str, version: int, nodes: tuple[str, ...]) -> Reconfigured:
        """``by`` sends the change; its answer (a version 0 does not parse: every node drops it)."""
        before = len(self.answers.get(by, []))
        self.order.append((by, bp.encode(bp.Configure(by, f"req{version}-{by}", version, nodes, "")) if version
                           else b"\x03C"))
        self.drain()
        got = self.answers.get(by, [])
        return got[-1] if len(got) > before else Reconfigured("", False, "dropped")

    def write(self, node: str, key: int) -> None:
        """A local writeset of ``node`` updating row ``key``."""
        t = wire.Table("public", "t", (wire.Column("id", "integer"),), (0,))
        ws = wire.Writeset(1, 1, self.nodes[node].last_certified, (t,), (wire.Row("U", 0, (str(key).encode(),),
                                                                                  (str(key).encode(),)),),
                           (wire.Key(wire.KeyMode.UPDATE, (b"public", b"t", b"id", str(key).encode())),))
        self.order.append((node, bp.encode(bp.WritesetMsg(node, key, wire.encode(ws)))))
        self.drain()

    def catch_up(self, name: str) -> None:
        r = self.nodes[name]
        if r.phase == Phase.RECOVERING:
            r.held_released()
            self.act(name, r.recovered(r.last_certified))
            self.drain()


def formed(names: list[str], shared: bool = True, quorum: int = 1, expected: int = 0) -> Bus:
    b = Bus(names, shared)
    b.view(names, quorum, expected)
    b.tick()
    assert all(r.phase == Phase.ONLINE for r in b.nodes.values())
    return b


def grown() -> Bus:
    """Three nodes online, then n4 added and joined."""
    b = formed(["n1", "n2", "n3"])
    ans = b.configure("n2", 1, ("n1", "n2", "n3", "n4"))
    assert ans.ok, ans.reason
    b.add("n4")
    b.view(["n1", "n2", "n3", "n4"])
    b.catch_up("n4")
    return b


def test_every_node_switches_to_the_new_configured_set_at_the_same_place() -> None:
    b = grown()
    for name, r in b.nodes.items():
        assert r.phase == Phase.ONLINE, name
        assert r.config == ClusterConfig(1, ("n1", "n2", "n3", "n4")), name  # n4 from its answer
        assert r.member_votes == 4
        assert set(r.online) == {"n1", "n2", "n3", "n4"}
    assert b.saved == {n: ClusterConfig(1, ("n1", "n2", "n3", "n4")) for n in ("n1", "n2", "n3", "n4")}
    assert len({r.gid for r in b.nodes.values()}) == 1


def test_quorum_counts_from_the_new_membership() -> None:
    """Three of four coordinators are a quorum; two of four are not, where two of three were."""
    b = grown()
    b.view(["n1", "n2", "n3"])
    assert all(b.nodes[n].accepts_writes for n in ("n1", "n2", "n3"))
    b.view(["n1", "n2"])
    assert all(not b.nodes[n].accepts_writes and b.nodes[n].phase == Phase.NON_PRIMARY for n in ("n1", "n2"))


def test_a_removed_node_is_dropped_everywhere_and_stops() -> None:
    b = grown()
    ans = b.configure("n1", 2, ("n1", "n2", "n3"))
    assert ans.ok, ans.reason
    assert "n4" in b.removed and "removed" in b.removed["n4"]
    assert b.nodes["n4"].phase == Phase.NEEDS_RECOVERY and not b.nodes["n4"].accepts_writes
    for n in ("n1", "n2", "n3"):
        r = b.nodes[n]
        assert set(r.online) == {"n1", "n2", "n3"} and r.member_votes == 3 and "n4" not in r.records
    b.view(["n1", "n2"])  # two of three again
    assert b.nodes["n1"].accepts_writes and b.nodes["n2"].accepts_writes


def test_a_removed_node_cannot_join_again_until_it_is_added() -> None:
    b = grown()
    assert b.configure("n1", 2, ("n1", "n2", "n3")).ok
    b.removed.clear()
    b.view(["n1", "n2", "n3"])  # its coordinator stopped
    b.nodes["n4"] = Replicator("n4", b.nodes["n1"].cluster_uuid, b.nodes["n1"].gid, member_votes=4)
    b.view(["n1", "n2", "n3", "n4"])  # it starts again (with an old bus.members)
    assert "n4" not in b.nodes["n1"].online
    assert b.nodes["n4"].phase == Phase.NEEDS_RECOVERY and "not one of" in b.removed["n4"]
    # added again, it is admitted
    b.removed.clear()
    assert b.configure("n3", 3, ("n1", "n2", "n3", "n4")).ok
    b.view(["n1", "n2", "n3"])
    b.nodes["n4"] = Replicator("n4", b.nodes["n1"].cluster_uuid, b.nodes["n1"].gid, member_votes=3)
    b.view(["n1", "n2", "n3", "n4"])
    b.catch_up("n4")
    assert b.nodes["n4"].phase == Phase.ONLINE and "n4" in b.nodes["n1"].online and not b.removed
    assert b.nodes["n4"].member_votes == 4  # from the cluster's set, not its own bus.members


def test_refused_changes_change_nothing_on_any_node() -> None:
    b = formed(["n1", "n2", "n3"])
    for version, nodes, why in [(2, ("n1", "n2", "n3", "n4"), "version"),
                                (1, ("n1", "n2", "n3", "n4", "n5"), "one node at a time"),
                                (1, ("n1", "n2", "n4", "n5"), "one node at a time")]:
        ans = b.configure("n1", version, nodes)
        assert not ans.ok and why in ans.reason
    b.view(["n1", "n2"])
    ans = b.configure("n1", 1, ("n1", "n2", "n3", "n4"))  # 2 of 4 would be online
    assert not ans.ok and "not a quorum" in ans.reason
    ans = b.configure("n1", 1, ("n1", "n3"))  # removing n2 leaves n1 alone of two
    assert not ans.ok and "not a quorum" in ans.reason
    assert all(r.config is None and r.member_votes == 3 for r in b.nodes.values())
    assert not b.saved and not b.removed
    assert b.nodes["n1"].accepts_writes and b.nodes["n2"].accepts_writes


def test_a_configure_only_counts_from_a_member() -> None:
    b = formed(["n1", "n2", "n3"])
    # sent by n3's bus member in n1's name: nobody applies it
    b.order.append(("n3", bp.encode(bp.Configure("n1", "x", 1, ("n1", "n2", "n3", "n4")))))
    b.drain()
    assert all(r.config is None for r in b.nodes.values())


def test_with_one_corosync_per_node_the_configured_votes_replace_votequorums() -> None:
    """Corosync's expected votes are read apart from the order; after a change every node counts
    the configured set's: a view of two bus nodes is not quorate with four configured, even if
    votequorum still says two of three are."""
    b = formed(["n1", "n2", "n3"], shared=False, quorum=2, expected=3)
    b.mute = {"n3"}
    b.write("n1", 6)
    assert b.nodes["n1"].last_certified in b.committed.get("n1", [])  # two of three configured
    b.mute = set()
    assert b.configure("n1", 1, ("n1", "n2", "n3", "n4")).ok
    assert b.nodes["n1"].votes == Votes(3, 4, "")
    # uniform commit counts the four: two reports (n1's, n2's) released a writeset with three
    # configured; now it waits for a third
    b.mute = {"n3"}
    b.write("n2", 7)
    gid = b.nodes["n2"].last_certified
    # (n3 knows three have it: itself and the two reports it got)
    assert not any(gid in b.committed.get(n, []) for n in ("n1", "n2")), b.committed
    b.mute = set()
    b.tick(2)  # n3 reports again (a report not back after a tick is sent again)
    assert all(gid in b.committed.get(n, []) for n in ("n1", "n2", "n3")), b.committed
    b.view(["n1", "n2"], quorum=2, expected=3)  # a stale votequorum
    assert not b.nodes["n1"].accepts_writes and not b.nodes["n2"].accepts_writes


def test_re_forming_waits_only_for_configured_nodes() -> None:
    """After n4 is removed, a cluster that lost its primary component re-forms from n1..n3 without
    waiting for n4 (its member record is gone from the configured nodes' view)."""
    b = grown()
    assert b.configure("n1", 2, ("n1", "n2", "n3")).ok
    b.view(["n1", "n2", "n3"])
    # every node restarts at once (their state files: records, epochs, the configured set)
    old = b.nodes
    b.nodes = {}
    for n in ("n1", "n2", "n3"):
        r0 = old[n]
        b.nodes[n] = Replicator(n, r0.cluster_uuid, r0.gid, member_votes=3, epochs=r0.epochs,
                                records=dict(r0.records), config=r0.config)
        b.nodes[n].records["n4"] = old["n1"].records.get("n1")  # a stale record of n4 as a member
    b.members = []
    b.view(["n1", "n2", "n3"])
    b.tick()
    assert all(r.phase == Phase.ONLINE for r in b.nodes.values()), [r.reform for r in b.nodes.values()]


def test_a_removed_coordinator_started_again_is_no_vote_for_re_forming() -> None:
    """After n4 is removed, n1 alone with n4's coordinator started again (one Corosync for all:
    two coordinators in the view of three configured) is not a quorum to re-form from."""
    b = grown()
    assert b.configure("n1", 2, ("n1", "n2", "n3")).ok
    b.view(["n1", "n2", "n3"])
    r1 = b.nodes["n1"]
    # n2 and n3 left where n1 holds: n1 would win a re-form if it had a quorum
    left = {n: MemberRecord(r1.membership.epoch_number, r1.gid, False) for n in ("n2", "n3")}
    b.nodes = {"n1": Replicator("n1", r1.cluster_uuid, r1.gid, member_votes=3, epochs=r1.epochs,
                                records={"n1": MemberRecord(r1.membership.epoch_number, r1.gid, True), **left},
                                config=r1.config),
               "n4": Replicator("n4", r1.cluster_uuid, r1.gid, member_votes=4, epochs=r1.epochs)}
    b.members = []
    b.view(["n1", "n4"])
    b.tick()
    assert b.nodes["n1"].phase != Phase.ONLINE and not b.nodes["n1"].accepts_writes


@pytest.mark.parametrize("seed", range(20))
def test_random_changes_leave_every_member_with_the_same_set(seed: int) -> None:
    """Random changes, good and bad, asked by random members, with writes between them: every
    member of the primary component holds the same configured set, members and GID after each,
    and counts its votes from it."""
    import random

    rnd = random.Random(seed)
    b = formed(["n1", "n2", "n3"], shared=rnd.random() < 0.5, quorum=2, expected=3)
    for step in range(12):
        members = [n for n in b.members if b.nodes[n].phase == Phase.ONLINE]
        by = rnd.choice(members)
        current = list(b.nodes[by].config.nodes) if b.nodes[by].config else ["n1", "n2", "n3"]
        version = (b.nodes[by].config.version if b.nodes[by].config else 0) + rnd.choice([1, 1, 1, 0, 2])
        pick = rnd.random()
        if pick < 0.4 and len(current) > 1:
            new = [n for n in current if n != rnd.choice(current)]
        elif pick < 0.8:
            new = current + [f"x{step}"]
        else:
            new = current[:-1] + [f"y{step}", f"z{step}"]
        b.configure(by, version, tuple(new))
        b.write(rnd.choice([n for n in b.members if b.nodes[n].phase == Phase.ONLINE]), rnd.randrange(50))
        online = [b.nodes[n] for n in b.members if b.nodes[n].phase == Phase.ONLINE]
        assert len({(r.config, tuple(sorted(r.online)), r.gid, r.member_votes, r.votes) for r in online}) == 1
        cfg = online[0].config
        if cfg is not None:
            assert set(online[0].online) <= set(cfg.nodes)
            assert 2 * len(online) > len(cfg.nodes)  # a change never leaves the members without a quorum
