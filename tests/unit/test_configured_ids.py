"""Quorum counts only the configured nodes' Corosync ids (confchange.py, docs/MEMBERSHIP.md "Only
configured nodes' Corosync ids count"): a node left in corosync.conf by a failed `chorus node add`
whose Corosync is started anyway has no vote, so two disjoint views never both count a majority;
the ids travel with the configured set, and a set recorded before they were kept learns them in
the total order (counting zero until then)."""

from __future__ import annotations

import itertools
from typing import Any

from chorus import confchange
from chorus.actions import Phase
from chorus.bus import View, Votes
from chorus.bus import proto as bp
from chorus.confchange import ClusterConfig, with_ids
from chorus.membership import view_quorum
from chorus.replicator import Replicator
from chorus.state import NodeState, load_state, save_state

from test_confchange import Bus, formed

THREE = ClusterConfig(2, ("n1", "n2", "n3"), "", (("n1", "1"), ("n2", "2"), ("n3", "3")))


def test_two_disjoint_views_never_both_count_a_majority_of_the_configured_ids() -> None:
    """Three configured (Corosync ids 1..3), a fourth Corosync node (4) in the views: {1, 4} and
    {2, 3} cannot both be quorate, nor can any two disjoint sets of the four."""
    votes = confchange.votes(THREE, Votes(3, 4), False)
    assert not votes.holds({"1", "4"}) and votes.holds({"2", "3"})
    for k in range(5):
        for side in itertools.combinations("1234", k):
            other = set("1234") - set(side)
            assert not (votes.holds(set(side)) and votes.holds(other)), (side, other)
    # a set whose ids are not known counts nobody: safe until they are learned
    assert not confchange.votes(ClusterConfig(2, ("n1", "n2", "n3")), Votes(), False).holds({"1", "2", "3"})
    assert confchange.votes(THREE, Votes(2, 3), True) == Votes(2, 3)  # one Corosync for all: unchanged


def _on_view(r: Replicator, members: tuple[str, ...], local: str, vid: int = 9) -> None:
    # votequorum's own count would include node 4, listed in corosync.conf: 3 of 4
    r.on_view(View(vid, members, (), (), local, True, 3, 4), 0.0)


def test_a_split_with_an_unconfigured_corosync_node_leaves_at_most_one_side_quorate() -> None:
    """The replicators of the two sides, as they count the views {n1, n4} and {n2, n3}."""
    sides = {"n1": (("1:10", "4:10"), "1:10"), "n2": (("2:10", "3:10"), "2:10"), "n3": (("2:10", "3:10"), "3:10")}
    quorate = {}
    for name, (members, local) in sides.items():
        r = Replicator(name, "c", 5, config=THREE)
        _on_view(r, members, local)
        quorate[name] = r.quorate
    assert quorate == {"n1": False, "n2": True, "n3": True}
    view = View(1, ("1:10", "4:10"), (), (), "1:10", True, 2, 3, "", THREE.voters)
    assert view_quorum(view, {"1:10", "4:10", "2:10", "3:10"}, 0) == (False, True)


def unconfigured_fourth() -> Bus:
    """Three nodes with one Corosync each, configured (n4 added, then removed before it ever
    came), online; then n4's coordinator is started anyway and is in the view with them."""
    b = formed(["n1", "n2", "n3"], shared=False, quorum=2, expected=3)
    assert b.configure("n1", 1, ("n1", "n2", "n3", "n4")).ok
    assert b.configure("n2", 2, ("n1", "n2", "n3")).ok
    for r in b.nodes.values():
        assert r.config == ClusterConfig(2, ("n1", "n2", "n3"), "", (("n1", "n1"), ("n2", "n2"), ("n3", "n3")))
    b.add("n4")
    b.view_id += 1
    members = ("n1", "n2", "n3", "n4")
    for n in members:  # delivered to all, and the partition comes before n4's GID request is answered
        b.nodes[n].on_view(View(b.view_id, members, ("n4",), (), n, True, 3, 4), b.now)
    b.order.clear()
    return b


def test_an_unconfigured_node_in_the_view_gives_the_other_side_no_majority() -> None:
    """The split brain of docs/MEMBERSHIP.md: {n1, n4} | {n2, n3} with three configured. n4's
    vote used to count before it was refused (both sides two of three); it counts zero."""
    b = unconfigured_fourth()
    b.view_id += 1
    for side in (("n1", "n4"), ("n2", "n3")):
        for n in side:
            b.nodes[n].on_view(View(b.view_id, side, (), tuple(m for m in b.nodes if m not in side), n, True, 3, 4),
                               b.now)
    writing = [n for n in ("n1", "n2", "n3") if b.nodes[n].accepts_writes]
    assert writing == ["n2", "n3"]
    assert b.nodes["n1"].phase == Phase.NON_PRIMARY


def test_an_unconfigured_node_is_refused_and_the_configured_ones_go_on() -> None:
    b = unconfigured_fourth()
    b.view(["n1", "n2", "n3", "n4"], quorum=3, expected=4)
    assert "not one of" in b.removed["n4"]
    assert all(b.nodes[n].accepts_writes for n in ("n1", "n2", "n3"))
    assert "n4" not in b.nodes["n1"].online


def test_the_ids_travel_with_the_configured_set_and_a_set_without_them_still_reads() -> None:
    ids = (("n1", "1"), ("n2", "2"), ("n3", "3"))
    req = bp.GidRequest("n1", "r~v3-4", "c", 5, speaks=(3, 4), config_version=2, config_nodes=("n1", "n2", "n3"),
                        config_ids=ids)
    assert bp.decode(bp.encode(req, 4)) == req
    change = bp.Configure("n1", "r", 3, ("n1", "n2", "n3", "n4"), "", ids + (("n4", "4"),))
    assert bp.decode(bp.encode(change, 4)) == change
    old = bp.encode(bp.Configure("n1", "r", 3, ("n1", "n2")), 4)  # as written before ids were kept
    assert bp.decode(old) == bp.Configure("n1", "r", 3, ("n1", "n2"))
    raw = bp.encode(change, 4)
    bad = raw.replace(b"\x00\x02n4\x00\x014", b"\x00\x02n5\x00\x014")  # an id of a node not in the set
    try:
        bp.decode(bad)
    except bp.BusProtoError as e:
        assert "outside it" in str(e)
    else:
        raise AssertionError("an id of a node outside the set was read")


def test_the_state_file_keeps_the_ids_and_reads_a_set_recorded_before_them(tmp_path: Any) -> None:
    path = str(tmp_path / "state.json")
    save_state(path, NodeState("n1", config=THREE))
    assert load_state(path, "n1").config == THREE
    save_state(path, NodeState("n1", config=ClusterConfig(2, ("n1", "n2", "n3"))))
    text = open(path).read().replace(', "ids": {}', "").replace('"ids": {},', "")
    assert '"ids"' not in text.replace('"ids": {}', "")
    open(path, "w").write(text)
    assert load_state(path, "n1").config == ClusterConfig(2, ("n1", "n2", "n3"))


def test_a_change_takes_the_ids_the_members_know_and_refuses_wrong_ones() -> None:
    online = {"n1": "1:10", "n2": "2:10", "n3": "3:10"}
    new, problem = with_ids(ClusterConfig(3, ("n1", "n2", "n3", "n4"), "", (("n4", "4"),)), THREE, online, False)
    assert problem is None and new.ids == THREE.ids + (("n4", "4"),)
    # corosync.conf gives n2 another id than its Corosync's
    _, problem = with_ids(ClusterConfig(3, ("n1", "n2", "n3", "n4"), "", (("n2", "7"),)), THREE, online, False)
    assert problem is not None and "n2" in problem and "7" in problem
    _, problem = with_ids(ClusterConfig(3, ("n1", "n2", "n3", "n4"), "", (("n4", "3"),)), THREE, online, False)
    assert problem is not None and "one Corosync node id" in problem
    new, problem = with_ids(ClusterConfig(3, ("n1", "n2", "n3", "n4"), "", (("n4", "4"),)), THREE, online, True)
    assert problem is None and new.ids == ()  # a local cluster counts coordinators


def test_a_set_recorded_before_ids_were_kept_learns_them_and_re_forms() -> None:
    """Every node restarts with a set without ids: the first view counts nobody (not quorate),
    their GID requests teach every node the ids, the view is counted again, and the cluster
    re-forms by itself (invariant 9). The set is written back with the ids."""
    b = formed(["n1", "n2", "n3"], shared=False, quorum=2, expected=3)
    assert b.configure("n1", 1, ("n1", "n2", "n3", "n4")).ok
    assert b.configure("n2", 2, ("n1", "n2", "n3")).ok
    old = b.nodes
    b.nodes = {n: Replicator(n, old[n].cluster_uuid, old[n].gid, epochs=old[n].epochs, records=dict(old[n].records),
                             config=ClusterConfig(2, ("n1", "n2", "n3")))
               for n in ("n1", "n2", "n3")}
    b.members = []
    b.saved.clear()
    # one node first: it alone learns its own id, and is no quorum
    b.view(["n1"], quorum=2, expected=3)
    assert not b.nodes["n1"].quorate and b.nodes["n1"].config is not None
    assert b.nodes["n1"].config.ids == (("n1", "n1"),)
    b.view(["n1", "n2", "n3"], quorum=2, expected=3)
    b.tick()
    assert all(r.phase == Phase.ONLINE and r.accepts_writes for r in b.nodes.values()), \
        [(r.phase, r.reform) for r in b.nodes.values()]
    full = (("n1", "n1"), ("n2", "n2"), ("n3", "n3"))
    assert all(r.config is not None and r.config.ids == full for r in b.nodes.values())
    assert all(c.ids == full for c in b.saved.values())


def test_a_configured_node_on_another_corosync_node_is_not_admitted() -> None:
    """The configured set says n3 runs on Corosync node 3; its coordinator asks from node 7
    (another host given its name): it is not admitted, and counts for nothing."""
    b = formed(["n1", "n2", "n3"], shared=False, quorum=2, expected=3)
    assert b.configure("n1", 1, ("n1", "n2", "n3", "n4")).ok
    assert b.configure("n2", 2, ("n1", "n2", "n3")).ok
    b.view(["n1", "n2"], quorum=2, expected=3)
    r3 = b.nodes["n3"]
    impostor = Replicator("n3", r3.cluster_uuid, r3.gid, config=r3.config)
    b.nodes["7"] = impostor
    b.view_id += 1
    members = ("n1", "n2", "7")
    for n, local in (("n1", "n1"), ("n2", "n2"), ("7", "7")):
        b.act(n, b.nodes[n].on_view(View(b.view_id, members, ("7",), (), local, True, 2, 3), b.now))
    b.members = list(members)
    b.drain()
    assert "n3" not in b.nodes["n1"].online
    assert impostor.phase == Phase.NEEDS_RECOVERY and not impostor.accepts_writes
    assert "n3" not in b.removed  # not removed: it may run again on its own Corosync node
    assert b.nodes["n1"].config is not None and b.nodes["n1"].config.id_of("n3") == "n3"


def test_a_cluster_shrunk_to_one_node_re_forms_alone_after_a_restart() -> None:
    """`chorus node remove` took a 2-node cluster down to n1 alone (configured set {n1}, its id
    1). n1 restarts: one expected vote re-forms nothing in general (a misconfigured lone node of a
    larger cluster), but this set, changed in the total order, is n1 alone, so it re-forms
    itself, at its GID, in a new epoch. Without that set it waits for `chorus bootstrap`."""
    from chorus.membership import Epoch, MemberRecord

    def restarted(config: Any) -> Replicator:
        r = Replicator("n1", "c-uuid", 7, epochs=(Epoch(1, 0, "n1"),),
                       records={"n1": MemberRecord(1, 7, True)}, config=config)
        sent: list[Any] = []
        for a in r.on_view(View(1, ("1:11",), ("1:11",), (), "1:11", True, 1, 1), 0.0):
            sent.append(a)
        for now in range(1, 4):
            while sent:
                a = sent.pop(0)
                if hasattr(a, "message"):
                    from chorus.bus import Delivery
                    sent += r.on_delivery(Delivery("1:11", bp.encode(a.message)))
            sent += r.tick(float(now))
        return r

    alone = restarted(ClusterConfig(3, ("n1",), "", (("n1", "1"),)))
    assert alone.phase == Phase.ONLINE and alone.gid == 7
    assert [e.number for e in alone.membership.epochs] == [1, 2]
    assert restarted(None).phase != Phase.ONLINE
