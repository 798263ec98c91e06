"""A link's rules in ``[[link]]`` (config.py, docs/LINKS.md section 8 "As built"): what the
operator writes becomes the RuleSet the sender routes with; what cannot work is refused when the
file is read, naming the link and the problem; the file written back reads the same."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chorus import wire
from chorus.config import (ChorusConfigError, LinkTable, NodeConfig, link_rules, link_settings, load_config,
                           old_columns_setting, parse_link, write_config)
from chorus.link.rules import (ComputedColumn, DropColumn, RenameColumn, RenameTable, RowFunction, RuleError, RuleSet,
                               TableRule)
from chorus.link.site import NoSql, evaluator
from chorus.link.sqleval import PgEvaluator

from test_link_apply import LINK_TOML
from test_link_apply import _load as load_link

RULES = """include = ["hr.*", "sales.orders"]
exclude = ["hr.secret_*"]
rules_dsn = "host=/d port=5433 user=chorus_rules"
rules_timeout_ms = 250
[[link.table]]
name = "hr.emp"
filter = "region = 'eu'"
rename = "public.staff"
rename_columns = { salary = "pay", "Odd Name" = "odd" }
drop = ["ssn"]
compute = [{ column = "pay_k", type = "integer", sql = "pay * 1000" }]
function = "hr.mask"
[[link.table]]
name = "sales.*"
filter = "amount > 0"
"""


def _load(tmp_path: Path, text: str) -> NodeConfig:
    cfg: NodeConfig = load_link(tmp_path, LINK_TOML + text)
    return cfg


def test_the_rules_as_the_operator_writes_them(tmp_path: Path) -> None:
    link = _load(tmp_path, RULES).links[0]
    assert link.include == ("hr.*", "sales.orders") and link.exclude == ("hr.secret_*",)
    assert link.rules_dsn.endswith("user=chorus_rules") and link.rules_timeout_ms == 250
    rules = link_rules(link)
    assert rules == RuleSet(
        include=("hr.*", "sales.orders"), exclude=("chorus.*", "hr.secret_*"),
        tables=(TableRule("hr.emp", "region = 'eu'", (
            RenameTable("public", "staff"), RenameColumn("salary", "pay"), RenameColumn("Odd Name", "odd"),
            DropColumn("ssn"), ComputedColumn("pay_k", "integer", "pay * 1000"), RowFunction("hr.mask"))),
            TableRule("sales.*", "amount > 0")))
    assert rules.carries("hr", "emp") and not rules.carries("hr", "secret_pay") and not rules.carries("app", "x")
    assert not rules.carries("chorus", "link_position")  # the chorus schema never goes, whatever include says
    assert rules.needs_sql


def test_the_defaults_send_every_table_but_chorus_without_sql(tmp_path: Path) -> None:
    link = _load(tmp_path, "").links[0]
    rules = link_rules(link)
    assert rules == RuleSet() and not rules.needs_sql
    assert isinstance(evaluator(link, rules, "host=/d"), NoSql)
    # a rule set without SQL parts needs no evaluator either (renames and drops are the core's)
    link = _load(tmp_path, '[[link.table]]\nname = "hr.*"\ndrop = ["ssn"]\n').links[0]
    assert not link_rules(link).needs_sql


def test_the_evaluator_is_postgresql_through_rules_dsn_or_the_nodes(tmp_path: Path) -> None:
    link = _load(tmp_path, RULES).links[0]
    ev = evaluator(link, link_rules(link), "host=/d port=5433")
    assert isinstance(ev, PgEvaluator) and ev.strict and ev.dsn == link.rules_dsn and ev.timeout_ms == 250
    # never the node's own session (a superuser): a function the rules call runs with its rights
    with pytest.raises(RuleError, match="need rules_dsn"):
        link_rules(replace(link, rules_dsn=""))
    with pytest.raises(RuleError, match="need rules_dsn"):
        link_rules(replace(link, rules_dsn="", tables=(LinkTable("app.items", function="app.mask"),)))
    plain = replace(link, rules_dsn="", tables=(LinkTable("app.items", drop=("v",)),))
    assert isinstance(evaluator(plain, link_rules(plain), "host=/d port=5433"), NoSql)


def test_written_back_it_reads_the_same(tmp_path: Path) -> None:
    cfg = _load(tmp_path, RULES)
    cfg = replace(cfg, links=(replace(cfg.links[0], policy="primary-wins", primary="west", detection="transaction",
                                      table_policy=(("hr.emp", "latest-commit-wins"),)),))
    p = tmp_path / "again.toml"
    write_config(cfg, str(p))
    assert load_config(str(p)) == cfg


def test_the_local_clusters_links_are_read_alike() -> None:
    t: dict[str, Any] = {"name": "l", "site": "a", "peer_site": "b", "tls_cert": "c", "tls_key": "k", "peer_cert": "p",
                         "secret_file": "s", "peers": ["h:1"], "rules_dsn": "user=r",
                         "table": [{"name": "app.items", "filter": "n > 0", "drop": ["v"]}]}
    link = parse_link("test", t)
    assert link.peers == ("h:1",) and link.tables == (LinkTable("app.items", filter="n > 0", drop=("v",)),)


@pytest.mark.parametrize("text, says", [
    ('[[link.table]]\nfilter = "x"\n', "needs a name"),
    ('[[link.table]]\nname = "a.b"\n[[link.table]]\nname = "a.b"\n', "two \\[\\[link.table\\]\\] named 'a.b'"),
    ('[[link.table]]\nname = "a.b"\ncolour = "red"\n', "unknown key link.table.colour"),
    ('[[link.table]]\nname = "a.b"\ndrop = "ssn"\n', "link.table.drop must be a list"),
    ('[[link.table]]\nname = "a.b"\nrename = "staff"\n', "rename must be schema.table"),
    ('[[link.table]]\nname = "a.b"\nrename_columns = { a = "x", b = "x" }\n', "two columns renamed to x"),
    ('[[link.table]]\nname = "a.b"\ndrop = ["s", "s"]\n', "column s dropped twice"),
    ('[[link.table]]\nname = "a.b"\nrename_columns = { s = "t" }\ndrop = ["s"]\n', "drop names the new name"),
    ('[[link.table]]\nname = "a.b"\nrename_columns = { s = "t" }\n'
     'compute = [{ column = "t", type = "int", sql = "1" }]\n', "computed column t is the name of another column"),
    ('[[link.table]]\nname = "a.b"\ncompute = [{ column = "k", sql = "1" }]\n', "each of link.table.compute is"),
    ('[[link.table]]\nname = "a.b"\ncompute = [{ column = "k", type = "int; DROP", sql = "1" }]\n', "needs a type"),
    ('[[link.table]]\nname = "a.b"\ncompute = [{ column = "k", type = "int", sql = " " }]\n', "needs a column name and sql"),
    ('[[link.table]]\nname = "a.b"\nfunction = "mask"\n', "must be a schema-qualified name"),
    ('[[link.table]]\nname = "a.b"\nfunction = "hr.mask(jsonb)"\n', "must be a schema-qualified name"),
    ('include = ["a.*", ""]\n', "an empty pattern"),
    ('include = "a.*"\n', "link.include must be a list"),
    ("rules_timeout_ms = 0\n", "rules_timeout_ms must be at least 1"),
])
def test_rules_that_cannot_work_are_refused(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ChorusConfigError, match=says) as e:
        _load(tmp_path, text)
    assert "chorus.toml" in str(e.value)


def test_a_key_column_dropped_stops_the_link_when_met() -> None:
    """The file does not say which columns are keys: route refuses the table when it meets it
    (the sender then stops the link there, with that reason)."""
    from chorus.link.rules import RuleError, route
    link = parse_link("test", {"name": "l", "site": "a", "peer_site": "b", "tls_cert": "c", "tls_key": "k",
                               "peer_cert": "p", "secret_file": "s", "listen": "h:1",
                               "table": [{"name": "app.items", "drop": ["id"]}]})
    table = wire.Table("app", "items", (wire.Column("id", "integer"), wire.Column("v", "text")), (0,))
    ws = wire.Writeset(1, 2, 3, (table,), (wire.Row("I", 0, (), (b"1", b"x")),), ())
    with pytest.raises(RuleError, match="part of its key"):
        route(link_rules(link), ws, NoSql())


@pytest.mark.parametrize("text, says", [
    ('table_policy = { "app.c" = "delta" }\n', "table app.c has policy delta but no columns in delta_columns"),
    ('delta_columns = { "app.c" = ["hits"] }\n', "delta_columns lists table app.c, whose policy is not delta"),
    ('table_policy = { "app.c" = "delta" }\ndelta_columns = { "app.c" = [] }\n', "must be a list of column names"),
    ('table_policy = { "app.c" = "delta" }\ndelta_columns = { "app.c" = ["a:b"] }\n', "must be a list of column names"),
    ('table_policy = { "app.c" = "delta" }\ndelta_columns = { "c" = ["hits"] }\n', "'c' is not schema.table"),
    ('table_policy = { "app.c" = "delta" }\ndelta_columns = { "app.c" = ["h", "h"] }\n', "each once"),
    ('table_policy = { "app.c" = "delta" }\ndelta_columns = { "app.c" = ["h"] }\ndelta_fallback = "delta"\n',
     "delta_fallback must be one of"),
    ('table_policy = { "app.c" = "delta" }\ndelta_columns = { "app.c" = ["h"] }\ndelta_fallback = "primary-wins"\n',
     "policy primary-wins needs primary"),
])
def test_delta_settings_that_cannot_work_are_refused(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ChorusConfigError, match=says):
        _load(tmp_path, text)


def test_delta_columns_are_read_written_and_captured() -> None:
    base: dict[str, Any] = {"name": "l", "site": "a", "peer_site": "b", "tls_cert": "c", "tls_key": "k",
                            "peer_cert": "p", "secret_file": "s", "peers": ["h:1"]}
    one = parse_link("test", {**base, "table_policy": {"app.c": "delta", "app.d": "delta"},
                              "delta_columns": {"app.d": ["x"], "app.c": ["views", "hits"]}})
    assert one.delta_columns == (("app.c", ("views", "hits")), ("app.d", ("x",)))
    assert link_settings(one).policy_for(wire.Table("app", "c", (wire.Column("id", "integer"), wire.Column(
        "hits", "bigint"), wire.Column("views", "numeric")), (0,))).name == "delta"
    two = parse_link("test", {**base, "name": "m", "policy": "delta", "delta_columns": {"app.c": ["clicks"]}})
    assert old_columns_setting([one, two]) == "app.c:clicks,hits,views; app.d:x"
    assert old_columns_setting([]) == ""


def test_delta_columns_survive_a_written_configuration(tmp_path: Path) -> None:
    cfg = _load(tmp_path, 'table_policy = { "app.c" = "delta" }\ndelta_columns = { "app.c" = ["hits"] }\n'
                          'delta_fallback = "latest-commit-wins"\n')
    assert cfg.links[0].delta_columns == (("app.c", ("hits",)),)
    p = tmp_path / "again.toml"
    write_config(cfg, str(p))
    assert load_config(str(p)) == cfg
