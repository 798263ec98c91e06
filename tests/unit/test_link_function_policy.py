"""The ``function`` conflict policy (docs/LINKS.md section 7.1): its configuration, the calls a
settlement asks for (both versions in canonical order: the arbiter's first, on both sites), the
answer read back, and what fails. Two sites are replayed as in test_link_settle.py, the
function played by Python (the real call against PostgreSQL: tests/integration/
test_link_function_call.py and test_link_function.py)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import pytest

from chorus import wire
from chorus.bus import proto as bp
from chorus.config import ChorusConfigError, LinkConfig, link_settings, parse_link
from chorus.link import position as lp
from chorus.link.events import Version
from chorus.link.funcall import FunctionCall, FunctionCalls, FunctionError, answer, call_sql, result_row
from chorus.link.settle import Settlement
from test_link_settle import LINK, T, SiteSim, exchange, update

Merge = Callable[[FunctionCall], Optional[tuple[wire.Value, ...]]]


def concat(call: FunctionCall) -> Optional[tuple[wire.Value, ...]]:
    """v joined in the order given, n added; an absent side gives the other."""
    a, b = call.first.values, call.second.values
    if a is None or b is None:
        return a if b is None else b
    return (a[0], bytes(a[1] or b"") + b"+" + bytes(b[1] or b""), b"%d" % (int(bytes(a[2] or b"0"))
                                                                           + int(bytes(b[2] or b"0"))))


class FunctionSite(SiteSim):
    """A site whose apply makes the conflict function's calls as the pipeline does
    (funcall.decide_calls), each answered by ``merge``, and records them."""

    def __init__(self, name: str, peer: str, merge: Merge = concat, **conflict: Any) -> None:
        super().__init__(name, peer, **conflict)
        self.merge = merge
        self.calls: list[FunctionCall] = []

    def apply_link(self, msg: bp.LinkWriteset) -> lp.Decision:
        self.gid += 1
        current = lp.PositionRow.of(self.position)
        decision = lp.decide(msg, current)
        assert decision == lp.Decision.APPLY
        plan = Settlement(msg, wire.decode(msg.writeset), current, self.gid, self.settings)
        stamps = [(k, *self.stamps[k]) for k in plan.stamp_keys() if k in self.stamps]
        values = {k.hashed(): self.rows.get(params[0].encode()) for _t, k, params in plan.wanted(stamps)}
        while todo := plan.function_calls(stamps, values):
            for call in todo:
                self.calls.append(call)
                plan.functions.answers[call] = self.merge(call)
        final = plan.final(stamps, values)
        self.decisions.append(plan)
        self._apply_rows(wire.decode(final))
        self.log.append(lp_record(self.gid, final))
        return decision


def lp_record(gid: int, final: bytes) -> Any:
    from chorus.wslog import LogRecord
    return LogRecord(gid, lp.origin(LINK), 0, final)


FUNC = {"policy": "function", "conflict_function": "app.merge"}


def function_sites(merge: Merge = concat, **conflict: Any) -> tuple[FunctionSite, FunctionSite]:
    a, b = FunctionSite("A", "B", merge, **FUNC, **conflict), FunctionSite("B", "A", merge, **FUNC, **conflict)
    a.commit(wire.Writeset(1, 1, 0, (T,), (wire.Row("I", 0, (), (b"x", b"start", b"0")),),
                           (wire.Key(wire.KeyMode.EXCLUSIVE, (b"app", b"items", b"id", b"x")),)))
    exchange(a, b)
    assert a.conflicts() == [] and b.conflicts() == [] and a.rows == b.rows
    return a, b


def test_both_sites_call_the_function_with_the_arbiters_version_first_and_merge_alike() -> None:
    a, b = function_sites()
    assert a.settings.arbiter == "A"
    a.commit(update("x", "from A", 1))
    b.commit(update("x", "from B", 2))
    exchange(a, b)
    # each site called it once, with the same arguments: A's version (the arbiter's) first
    (ca,), (cb,) = a.calls, b.calls
    assert (ca.first.site, ca.second.site) == (cb.first.site, cb.second.site) == ("A", "B")
    assert ca.first.values == cb.first.values == (b"x", b"from A", b"1")
    assert ca.second.values == cb.second.values == (b"x", b"from B", b"2")
    assert (ca.first.clock, ca.second.clock) == (cb.first.clock, cb.second.clock)
    assert a.rows == b.rows and a.value("x") == b"from A+from B"
    assert a.conflicts() == b.conflicts() == [('"app"."items" (id)=(x)', "row", "merged")]
    for e in a.exceptions + b.exceptions:
        assert e[15] == b"function app.merge" and e[17] == b'{"id":"x","v":"from A+from B","n":"3"}'


@pytest.mark.parametrize("pick,outcomes", [("first", ("kept-local", "took-remote")),
                                           ("second", ("took-remote", "kept-local"))])
def test_an_answer_that_is_one_version_is_that_versions_decision(pick: str, outcomes: tuple[str, str]) -> None:
    a, b = function_sites(lambda c: getattr(c, pick).values)
    a.commit(update("x", "from A"))
    b.commit(update("x", "from B"))
    exchange(a, b)
    want = b"from A" if pick == "first" else b"from B"
    assert a.value("x") == b.value("x") == want
    assert (a.conflicts()[0][2], b.conflicts()[0][2]) == outcomes


def test_an_absent_answer_deletes_the_row_on_both_sites() -> None:
    a, b = function_sites(lambda c: None)
    a.commit(update("x", "from A"))
    b.commit(update("x", "from B"))
    exchange(a, b)
    assert "x" not in {k.decode() for k in a.rows} and a.rows == b.rows
    assert a.conflicts() == b.conflicts() == [('"app"."items" (id)=(x)', "row", "merged")]


def test_a_settlement_decides_only_once_every_call_is_answered() -> None:
    """The apply's failure semantics start here: a call not made (the function raised, so the
    shell never answered it) leaves the link writeset undecided; the apply fails alike on every
    node."""
    a, b = function_sites()
    a.commit(update("x", "from A"))
    b.commit(update("x", "from B"))
    msg = None

    def keep(m: bp.Message) -> None:
        nonlocal msg
        assert isinstance(m, bp.LinkWriteset)
        msg = m
    b.inbound.send = keep  # type: ignore[method-assign]
    b.receive(a.serve(a.gid))
    assert msg is not None
    current = lp.PositionRow.of(b.position)
    plan = Settlement(msg, wire.decode(msg.writeset), current, b.gid + 1, b.settings)
    stamps = [(k, *b.stamps[k]) for k in plan.stamp_keys() if k in b.stamps]
    values = {k.hashed(): b.rows.get(params[0].encode()) for _t, k, params in plan.wanted(stamps)}
    with pytest.raises(FunctionError, match="not called yet"):
        plan.final(stamps, values)
    assert len(plan.function_calls(stamps, values)) == 1


def test_a_table_policy_of_function_applies_to_that_table_alone() -> None:
    s = link_settings(LinkConfig(LINK, "A", "B", "c", "k", "pc", "s", listen="h:1",
                                 table_policy=(("app.items", "function"),), conflict_function="app.merge"))
    assert s.policy_for(T, FunctionCalls()).name == "function app.merge"
    other = wire.Table("app", "other", T.columns, (0,))
    assert s.policy_for(other, FunctionCalls()).name == "latest-commit-wins"


@pytest.mark.parametrize("conflict,says", [
    ({"policy": "function"}, "needs conflict_function"),
    ({"policy": "function", "conflict_function": "merge"}, "schema-qualified"),
    ({"policy": "function", "conflict_function": "app.merge; DROP"}, "schema-qualified"),
    ({"conflict_function": "app.merge"}, "no table's policy is function"),
    ({"policy": "function", "conflict_function": 3}, "link.conflict_function must be a str"),
])
def test_configuration_errors(conflict: dict[str, Any], says: str) -> None:
    t = {"name": LINK, "site": "A", "peer_site": "B", "tls_cert": "c", "tls_key": "k", "peer_cert": "pc",
         "secret_file": "s", "listen": "h:1", **conflict}
    with pytest.raises(ChorusConfigError, match=says):
        parse_link("/etc/chorus.toml", t)


def test_the_configuration_is_read_written_and_fingerprinted() -> None:
    from chorus.config import _link_toml
    import tomllib
    t = {"name": LINK, "site": "A", "peer_site": "B", "tls_cert": "c", "tls_key": "k", "peer_cert": "pc",
         "secret_file": "s", "listen": "h:1", **FUNC}
    link = parse_link("f", t)
    assert link.conflict_function == "app.merge"
    assert link_settings(parse_link("f", {**t, "rules_timeout_ms": 250})).function_timeout_ms == 250
    again = parse_link("f", tomllib.loads(_link_toml(link))["link"][0])
    assert again == link
    other = parse_link("f", {**t, "conflict_function": "app.other"})
    plain = parse_link("f", {k: v for k, v in t.items() if k not in FUNC})
    prints = {link_settings(x).fingerprint for x in (link, other, plain)}
    assert len(prints) == 3  # a node with another function does not decide with it


# -- what a call sends and reads (pure; the SQL itself runs in the integration tests)

ITEM_TYPES = [("id", "integer"), ("v", "text"), ("n", "integer")]
CALL = FunctionCall("app.merge", T, Version("A", 7, 0, (wire.Binary(b"\0\0\0\1"), b"a", b"1")),
                    Version("B", 9, 0, (b"1", b"b", b"2")))


def test_the_call_passes_the_first_version_first_in_binary_or_text_form() -> None:
    sql, params = call_sql(CALL, ITEM_TYPES)
    assert "chorus.link_conflict_eval(" in sql and sql.count("%s") == len(params) == 7
    fn, table, build, read, types, args, binary = params
    assert fn == ("app.merge(pg_catalog.regclass, pg_catalog.jsonb, pg_catalog.text, pg_catalog.jsonb, "
                  "pg_catalog.text, pg_catalog.jsonb, pg_catalog.jsonb)") and table == '"app"."items"'
    # the first version: present, then each column's name and value, the integer in binary form
    assert args[:7] == [b"t", b"id", b"\0\0\0\1", b"v", b"a", b"n", b"1"]
    assert types[:7] == ["pg_catalog.bool", "pg_catalog.text", "integer", "pg_catalog.text", "text",
                         "pg_catalog.text", "integer"]
    assert binary[:7] == [False, False, True, False, False, False, False]
    assert args[7:14] == [b"t", b"id", b"1", b"v", b"b", b"n", b"2"] and not any(binary[7:])
    assert args[14:] == [b"A", b"B", b'{"clock":7,"commit_time":"1970-01-01 00:00:00.000000+00"}',
                         b'{"clock":9,"commit_time":"1970-01-01 00:00:00.000000+00"}']
    assert len(types) == len(args) == len(binary) == 18
    # the build statement's parameters are all its own, numbered in order; the read one takes $1..$3
    assert f"${len(args)}" in build and f"${len(args) + 1}" not in build and "%" not in build
    assert "$3" in read and "$4" not in read and 'NULL::"app"."items"' in read
    with pytest.raises(FunctionError, match="column n of the peer's"):
        call_sql(CALL, ITEM_TYPES[:2])


def test_the_answer_row_is_read_from_the_calls_texts() -> None:
    assert result_row(["object", '["id", "v"]', "1", None]) == ["object", ["id", "v"], "1", None]
    assert result_row([None, None, None]) == [None, None, None]


def row(kind: Optional[str], keys: Optional[list[str]], a: list[Any], b: list[Any], r: list[Any]) -> list[Any]:
    return [kind, keys, *a, *b, *r]


def test_the_answer_is_a_version_itself_or_the_merged_texts() -> None:
    keys = ["id", "v", "n"]
    assert answer(CALL, row("object", keys, ["1", "a", "1"], ["1", "b", "2"], ["1", "a", "1"])) is CALL.first.values
    assert answer(CALL, row("object", keys, ["1", "a", "1"], ["1", "b", "2"], ["1", "b", "2"])) is CALL.second.values
    assert answer(CALL, row("object", keys, ["1", "a", "1"], ["1", "b", "2"], ["1", "ab", None])) == (
        b"1", b"ab", None)
    assert answer(CALL, row(None, None, ["1", "a", "1"], ["1", "b", "2"], [None] * 3)) is None
    assert answer(CALL, row("null", None, ["1", "a", "1"], ["1", "b", "2"], [None] * 3)) is None


@pytest.mark.parametrize("kind,keys,says", [
    ("array", None, "a JSON array, not an object"),
    ("string", None, "a JSON string"),
    ("object", ["id", "v", "n", "color"], "the table lacks: color"),
    ("object", ["id", "v"], "without column\\(s\\) n"),
])
def test_an_answer_that_is_no_row_of_the_table_fails(kind: str, keys: Optional[list[str]], says: str) -> None:
    with pytest.raises(FunctionError, match=says):
        answer(CALL, row(kind, keys, ["1", "a", "1"], ["1", "b", "2"], [None] * 3))


def test_a_version_without_a_value_that_was_not_sent_is_refused() -> None:
    call = FunctionCall("app.merge", T, CALL.first, Version("B", 9, 0, (b"1", wire.UNCHANGED, b"2")))
    with pytest.raises(FunctionError, match="lacks the value of column v"):
        call_sql(call, ITEM_TYPES)


@pytest.mark.parametrize("arbiter_twice", [True, False])
def test_a_function_that_is_not_commutative_over_several_changes_is_settled_by_the_arbiters_realignment(
        arbiter_twice: bool) -> None:
    """Joining strings is not commutative: one site changing the row twice while the other
    changes it once, the sites merge different pairs (A merges a2 with b1, B merges a1 with b1,
    then a2 with that). The arbiter (A) realigns each row it merged; afterwards both sites hold
    its last decision. Without the realignment they differ."""
    a, b = function_sites()
    if arbiter_twice:
        a.commit(update("x", "a1", 1))
        a.commit(update("x", "a2", 1))
        b.commit(update("x", "b1", 2))
    else:
        a.commit(update("x", "a1", 1))
        b.commit(update("x", "b1", 2))
        b.commit(update("x", "b2", 2))
    exchange(a, b, rounds=4)
    assert a.rows == b.rows
    assert a.value("x") == (b"a2+b1" if arbiter_twice else b"a1+b1+b2")
