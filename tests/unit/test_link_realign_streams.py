"""Two sites replayed through the real apply (test_link_settle.SiteSim: ``Settlement``, the
sender's ``Outbound`` with the arbiter's realignment, the receiver's ``Inbound``) under random
programs: transactions of one or two rows on either site, deliveries in either direction at any
point. With NDB$EPOCH_TRANS the arbiter rejects transactions and realigns their rows (docs/LINKS.md
section 7.1); after quiescence both sites hold the same rows, and no apply meets a row in a
state its change cannot be applied to (an INSERT of a row that is there, an UPDATE or DELETE of
one that is not), as PostgreSQL would refuse."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from chorus import wire

from test_link_settle import T, SiteSim, exchange, key

KEYS = ("k0", "k1", "k2", "k3")


class StrictSite(SiteSim):
    """SiteSim whose table refuses what PostgreSQL would."""

    def _apply_rows(self, ws: wire.Writeset) -> None:
        for item in ws.rows:
            assert isinstance(item, wire.Row)
            if ws.tables[item.table].relname == "items":
                k = bytes((item.new if item.op == "I" else item.old)[0] or b"")
                there = k in self.rows
                assert there == (item.op != "I"), f"{self.name}: {item.op} of {k!r}, {'there' if there else 'absent'}"
        super()._apply_rows(ws)


def _txn(site: SiteSim, keys: list[str], delete: bool, n: int) -> wire.Writeset:
    rows: list[wire.Item] = []
    ks: list[wire.Key] = []
    for i, k in enumerate(dict.fromkeys(keys)):
        kb = k.encode()
        if kb not in site.rows:
            rows.append(wire.Row("I", 0, (), (kb, f"{site.name}{n}".encode(), b"0")))
            ks.append(key(k, wire.KeyMode.EXCLUSIVE))
        elif delete and i == 0:
            rows.append(wire.Row("D", 0, (kb,)))
            ks.append(key(k, wire.KeyMode.EXCLUSIVE))
        else:
            rows.append(wire.Row("U", 0, (kb,), (kb, f"{site.name}{n}".encode(), b"0")))
            ks.append(key(k))
    return wire.Writeset(1, 1, 0, (T,), tuple(rows), tuple(ks))


write = st.tuples(st.just("w"), st.sampled_from("AB"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=2),
                  st.booleans())
send = st.tuples(st.just("d"), st.sampled_from("AB"), st.just([]), st.just(False))
programs = st.lists(st.one_of(write, send), max_size=30)


def _run(program: list[tuple[str, str, list[str], bool]], **conflict: Any) -> tuple[SiteSim, SiteSim]:
    a, b = StrictSite("A", "B", **conflict), StrictSite("B", "A", **conflict)
    sites = {"A": (a, b), "B": (b, a)}
    for n, (kind, name, keys, flag) in enumerate(program):
        me, other = sites[name]
        if kind == "w":
            me.commit(_txn(me, keys, flag, n))
        else:
            other.receive(me.serve(me.gid))
    for _ in range(8):  # quiescence: realignments and reflections go round
        before = (a.gid, b.gid)
        exchange(a, b, rounds=1)
        if (a.gid, b.gid) == before:
            break
    else:
        raise AssertionError("the sites did not go quiet")
    return a, b


@settings(max_examples=150, deadline=None)
@given(programs, st.sampled_from("AB"))
def test_epoch_trans_with_realignment_converges(program: list[tuple[str, str, list[str], bool]], primary: str) -> None:
    a, b = _run(program, policy="primary-wins", primary=primary, detection="transaction")
    assert a.rows == b.rows


@settings(max_examples=150, deadline=None)
@given(programs)
def test_epoch_trans_latest_commit_wins_converges(program: list[tuple[str, str, list[str], bool]]) -> None:
    a, b = _run(program, detection="transaction")
    assert a.rows == b.rows


@settings(max_examples=100, deadline=None)
@given(programs, st.sampled_from("AB"))
def test_row_detection_with_realignment_converges(program: list[tuple[str, str, list[str], bool]], primary: str) -> None:
    a, b = _run(program, policy="primary-wins", primary=primary)
    assert a.rows == b.rows
