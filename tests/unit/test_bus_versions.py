"""Rolling upgrades: the cluster's bus protocol version (bus/versions.py, docs/PROTOCOL.md section 5).

The fixture is this code and a copy of it made different in the messages of one version: a node
built with ``speaks=(3, 3)`` reads and writes version 3 only, as the release before did (its GID
request and its answers carry no versions; it refuses version-4 messages), while the others speak
3..4 (version 4 adds the negotiation's fields to the GID request and its answer). Both run the real
replicator on simulated nodes fed one total order, each writing at its own send version.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
import random

import pytest

from chorus import impl
from chorus.actions import Phase, PhaseChange, Send
from chorus.bus import Delivery
from chorus.bus import proto as bp
from chorus.bus import versions
from chorus.replicator import Replicator
from test_fuzz_boundaries import SAMPLES
from test_replicator import Cluster, writeset

import proto_v3_release as old

OLD = (3, 3)  # the release before: version 3 only


class Mixed(Cluster):
    """test_replicator's cluster, each node writing at its own version and reading its own range;
    ``wire`` keeps every (sender, version byte, message type) delivered.

    A node that speaks 3 only stands for the release before: what it sends says nothing of
    versions (its GID requests and answers as that release writes them, echoing request ids as
    that release's reader, proto_v3_release, read them), and it is delivered only what that
    reader reads; the rest it drops."""

    def __init__(self, speaks: dict[str, bp.RangeT], bootstrap: str = "n1") -> None:
        super().__init__(bootstrap, list(speaks))
        self.nodes = {n: Replicator(n, "", 0, bootstrap=(n == bootstrap), speaks=s) for n, s in speaks.items()}
        self.wire: list[tuple[str, int, bytes]] = []
        self.refused: dict[str, str] = {}
        self.dropped: dict[str, list[bytes]] = {n: [] for n in speaks}
        self.raw_ids: dict[str, str] = {}  # request id -> as the release before read it
        self.payloads: list[bytes] = []

    def act(self, node: str, actions: list) -> None:  # type: ignore[type-arg]
        for a in actions:
            if isinstance(a, Send):
                m = a.message
                if self.nodes[node].membership.own == OLD and isinstance(m, bp.GidRequest):
                    m = dataclasses.replace(m, speaks=bp.LEGACY)
                elif self.nodes[node].membership.own == OLD and isinstance(m, bp.GidReply):
                    # that release echoes request ids as it read them: with what rode in them
                    m = dataclasses.replace(m, version=3, speaks=(), request_id=self.raw_ids.get(m.request_id, m.request_id),
                                            requests=tuple((n, self.raw_ids.get(r, r), b) for n, r, b in m.requests))
                self.order.append((node, bp.encode(m, a.version or self.nodes[node].send_version)))
            elif isinstance(a, PhaseChange) and a.phase == Phase.NEEDS_RECOVERY:
                self.refused[node] = a.reason
        super().act(node, [a for a in actions if not isinstance(a, Send)])

    def drain(self) -> None:
        while self.order:
            sender, payload = self.order.popleft()
            self.wire.append((sender, payload[0], payload[1:2]))
            self.payloads.append(payload)
            if payload[:2] == b"\x03Q":
                raw = old.decode(payload)
                assert isinstance(raw, old.GidRequest)
                self.raw_ids[raw.request_id.partition("~")[0]] = raw.request_id
            for n, r in self.nodes.items():
                if r.membership.own == OLD:
                    try:
                        old.decode(payload)
                    except old.BusProtoError:
                        self.dropped.setdefault(n, []).append(payload[:2])
                        continue
                self.act(n, r.on_delivery(Delivery(sender, payload)))

    def submit(self, node: str, last_seen: int, key: int) -> None:
        self.ticket += 1
        msg = bp.WritesetMsg(node, self.ticket, writeset(last_seen, key))
        self.order.append((node, bp.encode(msg, self.nodes[node].send_version)))

    def settle(self) -> None:
        self.drain()
        for _ in range(5):
            self.tick(1.0)

    def versions(self, names: list[str]) -> set[int]:
        return {self.nodes[n].cluster_version for n in names}


def mixed(speaks: dict[str, bp.RangeT]) -> Mixed:
    c = Mixed(speaks)
    c.view(list(speaks))
    c.settle()
    return c


# ---- the wire: version 4's fields, and version 3 carrying them ------------------------------

REQ = bp.GidRequest("n2", "ab12~v3-4", "c", 7, True, ((1, 0, "n1"),), 1, 7, (("n1", 1, 0, True),), (3, 4))
REPLY = bp.GidReply("n2", "ab12~v3-4", "m2", "c", 9, 9, (("n1", "m1"), ("n2", "m2")), (("n1", 9),), b"cert",
                    compat="UTF8 15", synced=("n1",), requests=(("n2", "ab12~v3-4", "m2"),), version=3,
                    speaks=(("n1", 3, 4), ("n2", 3, 4), ("ñ;:~v", 3, 3)))


@pytest.mark.parametrize("version", [3, 4])
def test_the_negotiation_fields_travel_at_either_version(version: int) -> None:
    for m in (REQ, REPLY, bp.Speaks("n2", (3, 4))):
        raw = bp.encode(m, version)
        assert raw[0] == version
        assert bp.decode(raw) == m
    # N (a link's pin, docs/LINKS.md section 2.1) came after that release: a node of it drops the
    # message as one it cannot read (Replicator.on_delivery logs it), and only its log is not pinned
    with pytest.raises(old.BusProtoError, match="unknown bus message type"):
        old.decode(bp.encode(bp.LinkApplied("n1", "east-west", 7), 3))


def test_the_release_before_reads_what_this_one_writes_at_version_3_and_refuses_version_4() -> None:
    """proto_v3_release is bus/proto.py of the release before: the folded fields ride in strings it
    only compares, echoes and (the answer's ``compat``, only in an answer to a node of version 4)
    does not read; it refuses version 4 and the message type it does not know."""
    req = old.decode(bp.encode(REQ, 3))
    assert isinstance(req, old.GidRequest) and req.request_id == REQ.request_id  # the same id for both
    # a request made without the versions in its id gets them there at version 3
    assert old.decode(bp.encode(dataclasses.replace(REQ, request_id="ab12"), 3)).request_id == "ab12~v3-4"
    assert (req.node, req.cluster_uuid, req.last_gid, req.epochs, req.records) == (
        REQ.node, REQ.cluster_uuid, REQ.last_gid, REQ.epochs, REQ.records)
    assert bp.decode(old.encode(req)) == REQ  # echoed as it is, this code reads it whole
    reply = old.decode(bp.encode(REPLY, 3))
    assert isinstance(reply, old.GidReply) and reply.online == REPLY.online and reply.gid == REPLY.gid
    assert bp.decode(old.encode(reply)) == REPLY
    for m in (REQ, REPLY, bp.Progress("n1", 5), bp.WritesetMsg("n2", 1, writeset(0, 1))):
        with pytest.raises(old.BusProtoError, match="unsupported bus message version 4"):
            old.decode(bp.encode(m, 4))
    with pytest.raises(old.BusProtoError, match="unknown bus message type"):
        old.decode(bp.encode(bp.Speaks("n2", (3, 4)), 3))


def test_a_configured_set_travels_at_version_4_only() -> None:
    """``chorus node add``/``remove`` (confchange.py): the configured set at the end of a GID request
    and its answer, and the Configure message, are version 4. At version 3 the set is left out (a
    reader of the release before refuses trailing bytes), and Configure is not written at all: a
    member of the release before could not switch its configured nodes with the others."""
    cfg = dict(config_version=2, config_nodes=("n1", "n2", "n3", "n4"), config_tie="")
    for m in (dataclasses.replace(REQ, **cfg), dataclasses.replace(REPLY, version=4, **cfg)):
        assert bp.decode(bp.encode(m, 4)) == m
        at3 = bp.decode(bp.encode(m, 3))
        assert (at3.config_version, at3.config_nodes) == (0, ())
        assert old.decode(bp.encode(m, 3)).node == m.node  # the release before reads it
    change = bp.Configure("n1", "r1", 2, ("n1", "n2", "n3", "n4"))
    assert bp.decode(bp.encode(change, 4)) == change
    with pytest.raises(bp.BusProtoError, match="version 4 message"):
        bp.encode(change, 3)
    with pytest.raises(bp.BusProtoError, match="version 4 message"):
        bp.decode(b"\x03" + bp.encode(change, 4)[1:])


def test_a_node_holding_a_configured_set_asks_at_version_4_outside_a_primary_component() -> None:
    """Outside a primary component a node writes the lowest version it speaks, 3, except once it
    holds a configured set: its GID requests must carry the set, or a re-form won by a node that
    missed the last change counts from the older set (the simulation's seed 44: a node added since
    was refused as not configured)."""
    from chorus.confchange import ClusterConfig

    plain = Replicator("n1", "", 0)
    assert plain.send_version == 3
    changed = Replicator("n1", "c", 5, config=ClusterConfig(2, ("n1", "n2", "n3", "n4")))
    assert changed.send_version == 4
    req = changed.membership.request("r1", "c", changed._holding(), False, 0.0)
    back = bp.decode(bp.encode(req, changed.send_version))
    assert (back.config_version, back.config_nodes) == (2, ("n1", "n2", "n3", "n4"))
    # a node of the release before, which speaks 3 only, is never among the configured nodes
    legacy = Replicator("n1", "c", 5, config=ClusterConfig(2, ("n1", "n2")))
    legacy.membership.own = bp.LEGACY
    assert legacy.send_version == 3


def test_every_message_of_both_releases_reads_alike_at_version_3() -> None:
    plain = [m for m in map(bp.decode, SAMPLES)
             if not isinstance(m, (bp.Speaks, bp.LinkApplied)) and getattr(m, "speaks", ()) in ((), bp.LEGACY)]
    assert len(plain) >= 12
    for m in plain:
        raw = bp.encode(m, 3)
        theirs = old.decode(raw)
        assert theirs.__dict__ == {k: v for k, v in m.__dict__.items() if k in theirs.__dict__}, m
        assert old.encode(theirs) == raw
        assert bp.decode(raw) == m


def test_versions_are_checked_on_both_sides() -> None:
    with pytest.raises(bp.BusProtoError, match=f"cannot write bus protocol version {bp.VERSION + 1}"):
        bp.encode(bp.Progress("n1", 1), bp.VERSION + 1)
    with pytest.raises(bp.BusProtoError, match="cannot write bus protocol version 2"):
        bp.py_encode_writesets("n1", [(1, b"x")], 2)
    with pytest.raises(bp.BusProtoError, match=f"unsupported bus message version {bp.VERSION + 1}"):
        bp.decode(bytes([bp.VERSION + 1]) + b"P" + bp.encode(bp.Progress("n1", 1))[2:])
    # a node of the release before (versions 3..4) refuses a version-5 writeset message clearly
    with pytest.raises(bp.BusProtoError, match="unsupported bus message version 5: this node reads versions 3..4"):
        bp.decode(bp.encode(bp.WritesetMsg("n1", 1, writeset(0, 1), 7), 5), (3, 4))
    with pytest.raises(bp.BusProtoError, match="not a range"):
        bp.decode(bp.encode(bp.Speaks("n1", (3, 4)))[:-2] + bytes([4, 3]))
    # an answer at cluster version 4 has no version-3 form without its members' versions
    with pytest.raises(bp.BusProtoError, match="cannot be written at version 3"):
        bp.encode(bp.GidReply("n2", "r", "m", "c", 1, 1, (), (), b"", version=4), 3)


@pytest.mark.parametrize("version", [3, 4])
def test_writeset_messages_have_one_layout_in_versions_3_and_4_and_both_codecs(version: int) -> None:
    items = [(1, writeset(0, 1)), (2, writeset(0, 2))]
    raw = bp.py_encode_writesets("n1", items, version, 123)
    assert raw[0] == version and raw[1:] == bp.py_encode_writesets("n1", items, 3)[1:]
    assert bp.py_decode_writesets(raw) == ("n1", items, 0)  # no commit time before version 5
    cproto = impl.compiled("_cproto")
    if cproto is not None:
        assert cproto.encode_writesets("n1", items, version, 123) == raw
        assert cproto.decode_writesets(raw) == ("n1", items, 0)
        if version == 4:
            with pytest.raises(bp.BusProtoError, match="reads versions 3..3"):
                cproto.decode_writesets(raw, OLD)
        with pytest.raises(bp.BusProtoError, match="cannot write bus protocol version 9"):
            cproto.encode_writesets("n1", items, 9)


def test_writeset_messages_carry_the_origin_commit_time_from_version_5(tmp_path: Path) -> None:
    """Version 5: ``W`` and ``M`` carry the origin's commit time (a u64 after the ticket, after
    the origin), read alike by both codecs and from a spooled message; at 3 and 4 it is left out
    and read as 0 (unknown)."""
    from chorus.spool import SpooledBuffer

    when = 1_790_000_000_123_456
    items = [(1, writeset(0, 1)), (2, writeset(0, 2))]
    single = bp.WritesetMsg("n1", 7, writeset(0, 3), when)
    batch = bp.WritesetBatch("n1", tuple(items), when)
    for m in (single, batch):
        raw = bp.encode(m, 5)
        assert raw[0] == 5 and bp.decode(raw) == m
        assert bp.decode(bp.encode(m, 4)) == dataclasses.replace(m, commit_time=0)
    assert [x.commit_time for x in batch.messages()] == [when, when]
    raw = bp.py_encode_writesets("n1", items, 5, when)
    assert len(raw) == len(bp.py_encode_writesets("n1", items, 4, when)) + 8
    assert bp.py_decode_writesets(raw) == ("n1", items, when)
    assert bp.py_decode_writesets(bp.encode(single, 5)) == ("n1", [(7, single.writeset)], when)
    for cut in (5, len(bp.encode(single, 5)) - len(single.writeset) - 1):
        with pytest.raises(bp.BusProtoError, match="truncated"):
            bp.py_decode_writesets(bp.encode(single, 5)[:cut])
    (tmp_path / "m").write_bytes(bp.encode(single, 5))
    back = bp.decode(SpooledBuffer.of_file(str(tmp_path / "m")))
    assert isinstance(back, bp.WritesetMsg) and back.commit_time == when
    assert bytes(back.writeset[:]) == single.writeset
    cproto = impl.compiled("_cproto")
    if cproto is not None:
        assert cproto.encode_writesets("n1", items, 5, when) == raw
        assert cproto.decode_writesets(raw) == ("n1", items, when)
        assert cproto.decode_writesets(bp.encode(single, 5)) == ("n1", [(7, single.writeset)], when)
        for cut in (5, len(bp.encode(single, 5)) - len(single.writeset) - 1):
            with pytest.raises(bp.BusProtoError, match="truncated"):
                cproto.decode_writesets(bp.encode(single, 5)[:cut])


# ---- the decision ------------------------------------------------------------------------

def test_the_cluster_version_is_the_highest_every_member_speaks() -> None:
    assert versions.agreed([(3, 4), (3, 4)]) == 4
    assert versions.agreed([(3, 4), (3, 3), (2, 5)]) == 3
    assert versions.agreed([(3, 3), (4, 5)]) is None
    assert versions.agreed([]) is None
    assert versions.moved(3, {"a": (3, 4), "b": (4, 5)}) == 4
    assert versions.moved(4, {"a": (3, 4), "b": (3, 3)}) == 4  # never down (it was not admitted)
    why = versions.refusal("n4", (3, 3), 4, {"n1": (3, 4), "n2": (4, 5)})
    assert why is not None and "3..3" in why and "version 4" in why and "n1 3..4, n2 4..5" in why
    assert versions.refusal("n4", (3, 4), 4, {}) is None


def test_nodes_of_one_release_run_at_its_highest_version() -> None:
    c = mixed({"n1": (3, 4), "n2": (3, 4), "n3": (3, 4)})
    assert c.versions(["n1", "n2", "n3"]) == {4}
    c.submit("n2", 0, 1)
    c.drain()
    # the requests go at the lowest version (anyone may answer); from the answer on, 4
    assert {v for s, v, t in c.wire if t in (b"W", b"G", b"P")} == {4}
    assert {v for s, v, t in c.wire if t == b"Q"} == {3}


def test_a_new_node_joins_an_old_cluster_which_moves_up_when_its_last_old_node_leaves() -> None:
    """The rolling upgrade: n1 is of the release before (and answers every request, as the lowest
    synced member); n2 and n3 are new. The cluster runs at 3 while n1 is a member; the view that
    drops n1 moves every node to 4 at the same place; n1, upgraded, joins at 4."""
    c = mixed({"n1": OLD, "n2": (3, 4), "n3": (3, 4)})
    assert c.versions(["n1", "n2", "n3"]) == {3}
    assert all(r.send_version == 3 for r in c.nodes.values())
    assert set(c.dropped["n1"]) == {b"\x03Y"}  # the Speaks after each of its answers, which it drops
    # the release before counts a joiner in only if the answer echoes the id it read in the request
    asked = {old.decode(p).request_id for p in c.payloads if p[:2] == b"\x03Q"}
    answers = [old.decode(p) for p in c.payloads if p[:2] == b"\x03G"]
    assert answers and all(a.request_id in asked for a in answers)
    for k in range(20):
        c.submit(["n1", "n2", "n3"][k % 3], max(0, c.nodes["n1"].gid - 1), k % 4)
    c.settle()
    assert {v for _, v, _ in c.wire} == {3}  # n1 read everything
    gids = {r.gid for r in c.nodes.values()}
    assert len(gids) == 1 and all(r.phase == Phase.ONLINE for r in c.nodes.values())
    certified = [sorted(g for g, ok in c.log[n] if ok) for n in ("n1", "n2", "n3")]
    assert certified[0] == certified[1] == certified[2]

    # n1 stops to be upgraded: the remaining members move to 4 at the view that drops it
    del c.nodes["n1"]
    before = len(c.wire)
    c.view(["n2", "n3"])
    assert c.versions(["n2", "n3"]) == {4}
    c.submit("n3", c.nodes["n3"].gid, 9)
    c.settle()
    assert {v for _, v, _ in c.wire[before:]} == {4}

    # n1 comes back on the new release and joins at 4 (n2 answers)
    c.nodes["n1"] = Replicator("n1", c.nodes["n2"].cluster_uuid, c.nodes["n2"].last_certified, speaks=(3, 4))
    c.log["n1"], c.applied["n1"] = [], []
    c.view(["n1", "n2", "n3"])
    c.settle()
    assert c.nodes["n1"].phase == Phase.ONLINE and c.versions(["n1", "n2", "n3"]) == {4}
    assert all(r.membership.speaks == {n: (3, 4) for n in ("n1", "n2", "n3")} for r in c.nodes.values())


def test_writesets_carry_commit_times_once_the_cluster_moves_to_5() -> None:
    """The upgrade from the release that speaks 3..4: while one of its nodes is a member the
    cluster runs at 4 and writeset messages carry no commit time (every node takes 0, unknown,
    alike); once it is gone the rest move to 5 and every node hands the same origin time on."""
    from chorus.actions import Apply, LocalVerdict

    c = mixed({"n1": (3, 4), "n2": bp.SPEAKS, "n3": bp.SPEAKS})
    assert c.versions(["n1", "n2", "n3"]) == {4}
    seen: dict[str, list[int]] = {n: [] for n in c.nodes}
    orig = c.act

    def act(node: str, actions: list) -> None:  # type: ignore[type-arg]
        seen[node] += [a.commit_time for a in actions
                       if isinstance(a, Apply) or (isinstance(a, LocalVerdict) and a.ok)]
        orig(node, actions)

    c.act = act  # type: ignore[method-assign]

    def write(node: str, when: int, key: int) -> None:
        c.ticket += 1
        msg = bp.WritesetMsg(node, c.ticket, writeset(c.nodes[node].gid, key), when)
        c.order.append((node, bp.encode(msg, c.nodes[node].send_version)))
        c.settle()

    write("n2", 1_790_000_000_000_001, 1)
    assert seen == {n: [0] for n in ("n1", "n2", "n3")}  # written at 4: no time, on every node
    del c.nodes["n1"]
    c.view(["n2", "n3"])
    assert c.versions(["n2", "n3"]) == {bp.VERSION}
    write("n3", 1_790_000_000_000_002, 2)
    assert seen["n2"][1:] == seen["n3"][1:] == [1_790_000_000_000_002]


def test_an_old_node_is_refused_by_a_cluster_that_moved_on_with_both_ranges_named() -> None:
    c = mixed({"n1": (3, 4), "n2": (3, 4)})
    assert c.versions(["n1", "n2"]) == {4}
    old = c.nodes["n3"] = Replicator("n3", c.nodes["n1"].cluster_uuid, c.nodes["n1"].gid, speaks=OLD)
    c.log["n3"], c.applied["n3"] = [], []
    c.view(["n1", "n2", "n3"])
    c.settle()
    assert old.phase == Phase.NEEDS_RECOVERY
    assert "speaks bus protocol versions 3..3, the cluster runs version 4" in c.refused["n3"]
    assert "n1 3..4, n2 3..4" in c.refused["n3"]
    # every node leaves it out alike, and goes on at 4
    assert all("n3" not in c.nodes[n].online for n in ("n1", "n2"))
    assert c.versions(["n1", "n2"]) == {4}
    c.submit("n1", c.nodes["n1"].gid, 3)
    c.settle()
    assert c.nodes["n1"].gid == c.nodes["n2"].gid and c.nodes["n3"].gid != c.nodes["n1"].gid


def test_a_newer_node_that_no_longer_speaks_the_clusters_version_is_refused() -> None:
    c = mixed({"n1": (3, 4), "n2": OLD})
    assert c.versions(["n1", "n2"]) == {3}
    c.nodes["n3"] = Replicator("n3", c.nodes["n1"].cluster_uuid, c.nodes["n1"].gid, speaks=(4, 4))
    c.log["n3"], c.applied["n3"] = [], []
    c.view(["n1", "n2", "n3"])
    c.settle()
    # n1 answers it at a version it reads; n2, of the release before, drops both
    assert c.nodes["n3"].phase == Phase.NEEDS_RECOVERY
    assert "speaks bus protocol versions 4..4, the cluster runs version 3" in c.refused["n3"]
    assert "n1 3..4, n2 3..3" in c.refused["n3"]
    assert all("n3" not in c.nodes[n].online for n in ("n1", "n2"))
    assert b"\x04Q" in c.dropped["n2"] and b"\x04G" in c.dropped["n2"]


def test_the_joiner_decides_as_the_members_after_an_old_node_answered() -> None:
    """n1 (old) answers n2 and then n3: every node forgets the members' versions at each answer
    and learns them again from their Speaks, so n3 (which never saw n2's request) decides as n2."""
    c = mixed({"n1": OLD, "n2": (3, 4), "n3": (3, 4)})
    assert c.nodes["n2"].membership.speaks == c.nodes["n3"].membership.speaks == {"n2": (3, 4), "n3": (3, 4)}
    assert any(t == b"Y" for _, _, t in c.wire)


def test_a_re_form_opens_at_the_version_every_node_that_asked_speaks() -> None:
    """Every node restarts at once; no member is synced: the one that holds the most re-forms,
    at the highest version every node of the view speaks, so the old node can join it."""
    c = mixed({"n1": OLD, "n2": (3, 4), "n3": (3, 4)})
    for k in range(5):
        c.submit("n2", c.nodes["n2"].gid, k)
    c.settle()
    uuid, gid = c.nodes["n2"].cluster_uuid, c.nodes["n2"].last_certified
    records = dict(c.nodes["n2"].records)
    epochs = c.nodes["n2"].epochs
    c.nodes = {n: Replicator(n, uuid, gid if n == "n2" else gid - 1, member_votes=3, epochs=epochs,
                             records=records, speaks=OLD if n == "n1" else (3, 4)) for n in ("n1", "n2", "n3")}
    c.log = {n: [] for n in c.nodes}
    c.applied = {n: [] for n in c.nodes}
    c.view(["n1", "n2", "n3"])
    c.settle()
    assert all(r.phase in (Phase.ONLINE, Phase.RECOVERING) for r in c.nodes.values()), \
        {n: (r.phase, c.refused.get(n)) for n, r in c.nodes.items()}
    assert c.versions(["n2", "n3"]) == {3}


def test_a_node_restarted_while_an_old_member_is_there_joins_at_the_clusters_version() -> None:
    """Nothing is stored: a restarted node of the new release takes the version from the answer
    (3 while n1, of the release before, is a member), not the highest it speaks."""
    c = mixed({"n1": OLD, "n2": (3, 4), "n3": (3, 4)})
    del c.nodes["n3"]
    c.view(["n1", "n2"])
    c.settle()
    c.nodes["n3"] = Replicator("n3", c.nodes["n1"].cluster_uuid, c.nodes["n1"].last_certified)
    c.log["n3"], c.applied["n3"] = [], []
    c.view(["n1", "n2", "n3"])
    c.settle()
    assert c.nodes["n3"].phase == Phase.ONLINE and c.versions(["n1", "n2", "n3"]) == {3}
    assert {v for s, v, t in c.wire if s == "n3" and t != b"Q"} == {3}


@pytest.mark.parametrize("seed", range(int(os.environ.get("CHORUS_UPGRADE_SEEDS", "12"))))
def test_every_node_decides_the_same_version_through_random_restarts_and_upgrades(seed: int) -> None:
    """Nodes stop and come back, each coming back on the new release or (until it was upgraded
    once) the old one. After every step the members agree on the cluster version, every
    one of them speaks it, it is the highest they all speak, and a node that cannot speak it
    stays out."""
    rnd = random.Random(seed)
    names = ["n1", "n2", "n3", "n4"]
    speaks: dict[str, bp.RangeT] = {n: rnd.choice([OLD, (3, 4)]) for n in names}
    c = mixed(speaks)
    live = list(names)
    for step in range(25):
        n = rnd.choice(names)
        if n in live and len(live) > 2 and any(c.nodes[m].phase == Phase.ONLINE for m in live if m != n):
            live.remove(n)
            del c.nodes[n]
        elif n not in live:
            if speaks[n] == OLD and rnd.random() < 0.6:
                speaks[n] = (3, 4)  # upgraded while it was down; never back
            anchor = next(c.nodes[m] for m in live if c.nodes[m].phase == Phase.ONLINE)
            c.nodes[n] = Replicator(n, anchor.cluster_uuid, anchor.last_certified, speaks=speaks[n])
            c.log[n], c.applied[n] = [], []
            live.append(n)
        live.sort()
        c.view(live)
        c.settle()
        writers = [m for m in live if c.nodes[m].phase == Phase.ONLINE]
        if writers and rnd.random() < 0.5:
            writer = rnd.choice(writers)
            c.submit(writer, c.nodes[writer].gid, step)
            c.settle()
        online = [m for m in live if c.nodes[m].phase in (Phase.ONLINE, Phase.RECOVERING)]  # the members
        assert online, {m: c.nodes[m].phase for m in live}
        ranges = {m: speaks[m] for m in online}
        versions_seen = c.versions(online)
        assert len(versions_seen) == 1, (step, {m: c.nodes[m].cluster_version for m in online})
        v = versions_seen.pop()
        assert all(lo <= v <= hi for lo, hi in ranges.values()), (step, v, ranges, {m: (c.nodes[m].phase, sorted(c.nodes[m].online), c.nodes[m].membership.speaks) for m in live})
        assert v == versions.agreed(ranges.values()), (step, v, ranges)
        for m in live:
            if m not in online:
                assert not speaks[m][0] <= v <= speaks[m][1], (m, speaks[m], v, c.nodes[m].phase, c.refused.get(m), step)
        assert len({c.nodes[m].gid for m in online}) == 1
