"""Which node holds what of the one history (chorus/history.py; docs/RECOVERY.md, "The cluster
comes back by itself"; docs/ARCHITECTURE.md invariants 8 and 9)."""

from __future__ import annotations

from chorus.history import (Candidate, Epoch, MemberRecord, add_epoch, decide, donor_problem, merge, prefix_problem,
                            shared_upto)

E1 = Epoch(1, 0, "n1")
E2 = Epoch(2, 100, "n3")  # n3 re-formed the cluster at GID 100
E2b = Epoch(2, 80, "n2")  # ... or, on another branch (a forced bootstrap), n2 at GID 80


def cand(node: str, gid: int, records: dict[str, MemberRecord], uuid: str = "c", epochs: tuple[Epoch, ...] = (E1,),
         log: tuple[int, int] = (0, 0)) -> Candidate:
    return Candidate(node, uuid, gid, epochs, log[0], log[1], records)


def test_the_newest_record_of_a_node_wins_and_leaving_is_after_joining_at_one_place() -> None:
    a = {"n3": MemberRecord(1, 50, True)}
    b = {"n3": MemberRecord(1, 70, False), "n2": MemberRecord(1, 10, True)}
    c = {"n3": MemberRecord(2, 5, True)}
    assert merge(a, b) == {"n3": MemberRecord(1, 70, False), "n2": MemberRecord(1, 10, True)}
    assert merge(a, b, c)["n3"] == MemberRecord(2, 5, True)  # a later epoch is later, whatever its GIDs
    assert merge({"x": MemberRecord(1, 9, True)}, {"x": MemberRecord(1, 9, False)})["x"].member is False


def test_the_node_that_holds_most_re_forms_once_every_member_of_the_last_primary_is_back() -> None:
    """The issue's story: n3 re-formed and committed alone while n1 and n2 caught up; n3's host
    died. n1 and n2 remember n3 as a member: they wait for it, whatever they hold."""
    member = MemberRecord(1, 100, True)
    records = {"n1": member, "n2": member, "n3": member}
    d = decide([cand("n1", 65247, records), cand("n2", 65279, records)])
    assert d.winner is None and [n for n, _ in d.waiting_for] == ["n3"]
    assert "may hold acknowledged writesets" in d.waiting_for[0][1]
    d = decide([cand("n1", 65247, records), cand("n2", 65279, records), cand("n3", 65376, records)])
    assert d.winner == "n3" and d.gid == 65376 and d.epoch == Epoch(2, 65376, "n3")


def test_a_node_that_left_where_the_present_ones_hold_is_not_waited_for() -> None:
    """A node that left the primary component at GID L committed nothing after L: a present node
    holding L holds everything it did (Galera's pc.recovery waits only for the last component)."""
    records = {"n1": MemberRecord(1, 5, True), "n2": MemberRecord(1, 5, True), "n3": MemberRecord(1, 400, False)}
    assert decide([cand("n1", 399, records), cand("n2", 420, records)]).winner == "n2"
    d = decide([cand("n1", 380, records), cand("n2", 390, records)])
    assert d.winner is None and d.waiting_for[0][0] == "n3" and "left the primary component at GID 400" in \
        d.waiting_for[0][1]


def test_equal_gids_prefer_the_log_that_reaches_furthest_back_then_the_lowest_name() -> None:
    records = {n: MemberRecord(1, 0, True) for n in ("n1", "n2", "n3")}
    d = decide([cand("n1", 50, records, log=(40, 50)), cand("n2", 50, records, log=(10, 50)),
                cand("n3", 50, records, log=(10, 50))])
    assert d.winner == "n2"
    # a log that does not reach the node's GID (a host crash cut its tail) serves nothing of it
    d = decide([cand("n1", 50, records, log=(0, 20)), cand("n2", 50, records, log=(30, 50)),
                cand("n3", 49, records, log=(0, 49))])
    assert d.winner == "n2"


def test_no_re_form_across_clusters_and_nodes_that_never_joined_hold_nothing() -> None:
    records = {"n1": MemberRecord(1, 0, True), "n2": MemberRecord(1, 0, True)}
    assert decide([cand("n1", 5, records, uuid="a"), cand("n2", 9, records, uuid="b")]).winner is None
    assert decide([cand("n1", 5, records), cand("n2", 9, records), cand("n4", 0, {}, uuid="")]).winner == "n2"
    assert decide([cand("n4", 0, {}, uuid="")]).winner is None


def test_epochs_are_numbered_past_every_one_known() -> None:
    records = {"n1": MemberRecord(3, 0, True), "n2": MemberRecord(3, 0, True)}
    d = decide([cand("n1", 5, records, epochs=(E1, E2)), cand("n2", 9, records, epochs=(E1,))])
    assert d.epoch == Epoch(3, 9, "n2")
    assert add_epoch((E1, E2), Epoch(3, 9, "n2")) == (E1, E2, Epoch(3, 9, "n2"))
    assert len(add_epoch(tuple(Epoch(i, i, "n") for i in range(100)), Epoch(100, 100, "n"))) == 64


def test_shared_history_ends_where_the_epoch_lists_part() -> None:
    assert shared_upto((E1,), 90, (E1, E2), 300) == 90
    assert shared_upto((E1,), 120, (E1, E2), 300) == 100  # it went on in epoch 1 past the re-form point
    assert shared_upto((E1, E2b), 150, (E1, E2), 300) == 80  # two branches: they part at the earlier start
    assert shared_upto((Epoch(7, 5, "x"),), 9, (E1, E2), 300) is None


def test_a_joiner_whose_data_is_not_a_prefix_is_told_exactly_why() -> None:
    assert prefix_problem("n2", 90, (E1,), (E1, E2), 300) is None
    assert prefix_problem("n2", 0, (), (E1, E2), 300) is None
    why = prefix_problem("n2", 120, (E1,), (E1, E2), 300)
    assert why is not None and "GIDs 101..120" in why and "epoch 2 at GID 100 on n3" in why
    why = prefix_problem("n2", 350, (E1, E2), (E1, E2), 300)
    assert why is not None and "GIDs 301..350" in why
    why = prefix_problem("n2", 90, (E1, E2b), (E1, E2), 300)
    assert why is not None and "GIDs 81..90" in why


def test_a_donor_behind_the_joiner_would_drop_gids() -> None:
    assert donor_problem("n3", 100, "n1", 100) is None
    why = donor_problem("n3", 65376, "n1", 65247)
    assert why is not None and "65248..65376" in why and "n1" in why


def test_chorus_node_join_total_refuses_a_donor_behind_the_node_unless_forced() -> None:
    import pytest

    from chorus.cli.common import ChorusCliError
    from chorus.cli.total import check_donor

    check_donor("n3", 100, "n1", 120, force=False)  # a donor ahead: nothing to drop
    with pytest.raises(ChorusCliError) as e:
        check_donor("n3", 65376, "n1", 65247, force=False)
    assert "65248..65376" in str(e.value) and "--force" in str(e.value)
    check_donor("n3", 65376, "n1", 65247, force=True)  # said, and done
