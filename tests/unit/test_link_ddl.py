"""Schema changes over links (docs/LINKS.md section 8.1): which of a site's schema changes its
sender carries (link/rules.py ``ddl_refusal``, ``route``), how they are counted when not
(sender.py ``Outbound``, status.py), the ``ddl`` setting, and the receiver refusing them where
this site does not apply them."""

from __future__ import annotations

import asyncio
from typing import Optional

import pytest

from chorus import config, wire
from chorus.link import status as ls
from chorus.link.events import RemoteTransaction
from chorus.link.proto import Position
from chorus.link.rules import (SCHEMA_KEY, DropColumn, RenameTable, RowFunction, RuleError, RuleSet, TableRule,
                               ddl_refusal, ddl_tables, route)
from chorus.link.sender import Outbound, Provenance
from chorus.wslog import LogRecord

ITEMS = wire.Table("app", "items", (wire.Column("id", "int4"), wire.Column("v", "text")), (0,))
ALTER = wire.Schema((("search_path", "app"),), "alice", b"ALTER TABLE items ADD c int")


def tkey(schema: str, table: str) -> wire.Key:
    return wire.Key(wire.KeyMode.EXCLUSIVE, (schema.encode(), table.encode()))


def ddl(*tables: tuple[str, str], rows: bool = False, flags: int = wire.FLAG_DDL) -> wire.Writeset:
    """A schema change as the origin's log holds it: its statement, an exclusive key on each table
    it names, the key every schema change holds; with ``rows``, a row of app.items after it."""
    items: list[wire.Item] = [ALTER]
    keys = [tkey(s, t) for s, t in tables] + [wire.Key(wire.KeyMode.EXCLUSIVE, SCHEMA_KEY)]
    if rows:
        items.append(wire.Row(wire.OP_INSERT, 0, (), (b"1", b"x")))
        keys.append(wire.Key(wire.KeyMode.EXCLUSIVE, (b"app", b"items", b"id", b"1")))
    return wire.Writeset(1, 2, 3, (ITEMS,) if rows else (), tuple(items), tuple(keys), flags)


class NoSql:
    def predicate(self, table: wire.Table, values: tuple[wire.Value, ...], predicate: str) -> bool:
        return True

    def expression(self, table: wire.Table, values: tuple[wire.Value, ...], expression: str) -> wire.Value:
        raise AssertionError("no computed columns here")

    def row_function(self, table: wire.Table, values: tuple[wire.Value, ...],
                     function: str) -> Optional[tuple[wire.Value, ...]]:
        return values


ON = RuleSet(include=("app.*",), exclude=("chorus.*", "app.secret*"), ddl=True, ddl_roles=("alice",))


def test_the_tables_a_schema_change_names_are_its_exclusive_table_keys() -> None:
    w = ddl(("app", "items"), ("app", "other"), rows=True)
    assert ddl_tables(w) == [("app", "items"), ("app", "other")]  # not the row key, not the schema key


def test_off_by_default_a_schema_change_is_not_sent_and_its_rows_are() -> None:
    assert not RuleSet().ddl
    out = route(RuleSet(), ddl(("app", "items"), rows=True), NoSql())
    assert out is not None and not out.has_schema and len(out.rows) == 1
    assert route(RuleSet(), ddl(("app", "items")), NoSql()) is None
    assert ddl_refusal(RuleSet(), ddl(("app", "items"))) == "ddl is off for this link"


def test_a_schema_change_of_a_carried_table_is_sent_as_written_with_its_keys() -> None:
    w = ddl(("app", "items"), rows=True)
    assert ddl_refusal(ON, w) is None
    out = route(ON, w, NoSql())
    assert out is not None and out.has_schema and not out.toi
    assert out.rows == w.rows  # the statement first, then the row, as on the origin
    assert out.keys == w.keys  # the table's and the one every schema change holds (chorus is excluded)


@pytest.mark.parametrize("tables, why", [
    ((("app", "secret_pay"),), "app.secret_pay, which the link does not carry"),  # excluded
    ((("app", "items"), ("hr", "emp")), "hr.emp, which the link does not carry"),  # one outside include
    ((), "names no table"),  # CREATE FUNCTION, CREATE TYPE, CREATE ROLE, GRANT on a function...
])
def test_a_schema_change_naming_a_table_outside_the_lists_or_none_is_not_sent(
        tables: tuple[tuple[str, str], ...], why: str) -> None:
    w = ddl(*tables, rows=True)
    reason = ddl_refusal(ON, w)
    assert reason is not None and why in reason
    out = route(ON, w, NoSql())
    assert out is not None and not out.has_schema and not out.flags & wire.FLAG_DDL
    assert [type(i) for i in out.rows] == [wire.Row]  # its rows still go by the lists
    assert all(k.parts != SCHEMA_KEY for k in out.keys)


def test_a_concurrent_index_change_is_not_sent() -> None:
    w = wire.Writeset(1, 2, 3, (), (wire.Schema((), "alice", b"CREATE INDEX CONCURRENTLY i ON app.items (v)"),),
                      (wire.Key(wire.KeyMode.EXCLUSIVE, SCHEMA_KEY),), wire.FLAG_DDL | wire.FLAG_CONCURRENT)
    assert "CONCURRENTLY" in (ddl_refusal(ON, w) or "")
    assert route(ON, w, NoSql()) is None


@pytest.mark.parametrize("steps", [(RenameTable("app", "things"),), (DropColumn("v"),)])
def test_a_schema_change_of_a_reshaped_table_stops_the_link(steps: tuple[RenameTable | DropColumn, ...]) -> None:
    rules = RuleSet(include=("app.*",), tables=(TableRule("app.items", None, steps),), ddl=True, ddl_roles=("alice",))
    with pytest.raises(RuleError, match="reshapes"):
        route(rules, ddl(("app", "items")), NoSql())


def test_a_row_filter_or_a_row_function_lets_a_schema_change_go() -> None:
    rules = RuleSet(include=("app.*",), tables=(TableRule("app.items", "v = 'x'", (RowFunction("app.f"),)),),
                    ddl=True, ddl_roles=("alice",))
    out = route(rules, ddl(("app", "items")), NoSql())
    assert out is not None and out.has_schema


def test_the_sender_counts_and_says_what_it_does_not_send() -> None:
    o = Outbound("A", "B", Position(0), ON, NoSql(), lambda r: Provenance(r.gid * 10))
    sent = o.take(LogRecord(1, "n1", 0, wire.encode(ddl(("app", "items")))), now=0.0)
    assert len(sent) == 1 and wire.decode(getattr(sent[0], "writeset")).has_schema
    o.take(LogRecord(2, "n1", 0, wire.encode(ddl(("app", "secret_x")))), now=0.0)
    o.take(LogRecord(3, "n1", 0, wire.encode(ddl(("app", "secret_y"), rows=True))), now=0.0)
    assert o.ddl_skipped == 2 and o.ddl_skipped_last is not None and o.ddl_skipped_last[0] == 3
    assert o.sent == 2 and o.filtered == 1  # GID 3's row went
    off = Outbound("A", "B", Position(0), RuleSet(), NoSql(), lambda r: Provenance(r.gid * 10))
    off.take(LogRecord(1, "n1", 0, wire.encode(ddl(("app", "items")))), now=0.0)
    assert off.ddl_skipped == 0 and off.filtered == 1  # ddl off: not a refusal to report
    row = ls.out_row("l", "A", "B", 3, "n1", ls.Sending((), None, 2, 1, 0, o.ddl_skipped,
                                                        f"GID {o.ddl_skipped_last[0]}: {o.ddl_skipped_last[1]}"))
    assert row["ddl_skipped"] == 2 and "GID 3: it names app.secret_y" in row["ddl_skipped_last"]
    from chorus.endpoints import link_metrics
    samples = [(s.labels, s.value) for m in link_metrics([row]) for s in m.samples
               if s.name.startswith("chorus_link_records")]
    assert ({"link": "l", "direction": "out", "what": "ddl_skipped"}, 2.0) in samples


BASE = '''
[[link]]
name = "east-west"
site = "west"
peer_site = "east"
peers = ["e1:7533"]
tls_cert = "c"
tls_key = "k"
peer_cert = "p"
secret_file = "s"
'''


def test_the_ddl_setting_is_read_written_back_and_makes_the_rules() -> None:
    import tomllib
    link = config.parse_link("f", tomllib.loads(BASE + DDL)["link"][0])
    assert link.ddl and config.link_rules(link).ddl and config.link_rules(link).ddl_roles == ("alice",)
    again = config.parse_link("f", tomllib.loads(config._link_toml(link))["link"][0])
    assert again == link
    plain = config.parse_link("f", tomllib.loads(BASE)["link"][0])
    assert not plain.ddl and not config.link_rules(plain).ddl and "ddl" not in config._link_toml(plain)
    with pytest.raises(config.ChorusConfigError, match="link.ddl must be a bool"):
        config.parse_link("f", tomllib.loads(BASE + 'ddl = "yes"\n')["link"][0])


def test_the_receiver_refuses_a_schema_change_where_this_site_does_not_apply_them() -> None:
    """Both sites say ddl = true: the peer's schema changes run here as their roles, so a site
    applies them only when its own [[link]] says so; else the link stops there, visibly."""
    import tomllib

    from chorus.link.site import Inbound, LinkError
    w = ddl(("app", "items"))
    for text, refused in ((BASE, True), (BASE + DDL, False)):
        link = config.parse_link("f", tomllib.loads(text)["link"][0])
        sent: list[object] = []

        async def nothing() -> None:
            return None
        inbound = Inbound("n1", link, sent.append, nothing)
        item = RemoteTransaction("east", 5, 0, wire.decode(wire.encode(w)))
        if refused:
            with pytest.raises(LinkError, match="set ddl = true"):
                asyncio.run(inbound.sink(item))
            assert sent == []
        else:
            asyncio.run(inbound.sink(item))
            assert len(sent) == 1


DDL = 'ddl = true\nddl_roles = ["alice"]\n'


def test_ddl_needs_the_roles_it_carries_and_is_not_for_a_site_that_forwards() -> None:
    """A schema change runs on the receiving site as its role there: the link carries only those
    of the roles the operator names as the same, with the same rights, on both sites."""
    import tomllib
    with pytest.raises(config.ChorusConfigError, match="ddl = true needs ddl_roles"):
        config.parse_link("f", tomllib.loads(BASE + "ddl = true\n")["link"][0])
    with pytest.raises(config.ChorusConfigError, match="an empty name in ddl_roles"):
        config.parse_link("f", tomllib.loads(BASE + 'ddl = true\nddl_roles = [""]\n')["link"][0])
    chain = tomllib.loads("[[link]]\n" + BASE.split("[[link]]\n", 1)[1] + DDL + "forward = true\n")
    with pytest.raises(config.ChorusConfigError, match="cannot carry schema changes"):
        config._links("f", chain["link"])


def test_a_schema_change_of_a_role_not_in_ddl_roles_is_neither_sent_nor_applied() -> None:
    import tomllib

    from chorus.link.site import Inbound, LinkError
    other = wire.Writeset(1, 2, 3, (), (wire.Schema((), "mallory", b"CREATE TABLE app.x (id int)"),),
                          (tkey("app", "x"), wire.Key(wire.KeyMode.EXCLUSIVE, SCHEMA_KEY)), wire.FLAG_DDL)
    assert ddl_refusal(ON, other) == "made by role(s) mallory, not in the link's ddl_roles"
    assert ddl_refusal(ON, ddl(("app", "items"))) is None  # alice's
    link = config.parse_link("f", tomllib.loads(BASE + DDL)["link"][0])
    sent: list[object] = []

    async def nothing() -> None:
        return None
    inbound = Inbound("n1", link, sent.append, nothing)
    with pytest.raises(LinkError, match="made by role\\(s\\) mallory, not in this site's ddl_roles"):
        asyncio.run(inbound.sink(RemoteTransaction("east", 5, 0, wire.decode(wire.encode(other)))))
    assert sent == []
