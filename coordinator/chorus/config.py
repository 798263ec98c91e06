"""The node configuration file read by ``chorus run --config FILE`` (TOML).

```toml
[node]
name = "n1"
data_dir = "/d/nodes/n1"
state_file = "/d/nodes/n1/state.json"
socket_path = "/d/nodes/n1/run/chorus.sock"   # also PostgreSQL's chorus.socket_path
admin_socket = "/d/nodes/n1/run/admin.sock"
log_level = "info"
[postgres]
dsn = "host=/d/nodes/n1/run port=5433 dbname=postgres user=postgres"
[bus]
group = "chorus"
members = 0                  # coordinators sharing one Corosync (a local cluster): quorum counts them
[apply]
workers = 4
run = 8                      # consecutive remote writesets ready together: applied as one transaction
commit_lanes = 1             # 1: every commit in GID order; more: independent ones may pass (docs/APPLY.md)
catchup_batch = 32           # partial recovery: writesets applied per transaction
[log]                        # the writeset log (docs/RECOVERY.md)
dir = "/d/nodes/n1/wslog"
segment_mb = 64
total_mb = 4096
[recovery]                   # partial recovery: streams between nodes over TLS
listen = "127.0.0.1:7433"
advertise = "127.0.0.1:7433"  # where the others connect (default: listen)
tls_cert = "/d/keys/cluster.crt"
tls_key = "/d/keys/cluster.key"
secret_file = "/d/keys/cluster.secret"
partners = ["n2"]            # preferred recovery partners, in order (default: least loaded)
auto_total = false           # `chorus node join`: total recovery when no member's log holds the gap
[metrics]                    # HTTP: /metrics (Prometheus), /health, /writable, /ready (docs/OPERATIONS.md)
listen = "127.0.0.1:9433"    # default: none
[[link]]                     # a link to another site (docs/LINKS.md); one table per link
name = "east-west"           # the same on both sites
site = "east"                # this site's name, and the peer's ([A-Za-z0-9_.:-], at most 64)
peer_site = "west"
listen = "0.0.0.0:7533"      # serve this site's changes to the peer (its receiver connects here)
peers = ["west1:7533", "west2:7533"]  # receive the peer's changes from these senders, in turn
nodes = ["n1", "n2"]         # the nodes that may run the receiver (default: any member): the
                             # lowest-named synced member among them does
window = 64                  # received transactions in flight on the bus at most
max_retain_mb = 16384        # the writeset log kept for the peer while it has not applied it (the
                             # ring grows past log.total_mb up to this); past it the link is broken
tls_cert = "/d/keys/cluster.crt"       # the certificate this site presents, and its key
tls_key = "/d/keys/cluster.key"
peer_cert = "/d/keys/west.crt"         # the only certificate accepted from the peer
subset = false               # true when the peer's rules filter rows (a [[link.table]] filter there):
                             # an UPDATE of a row absent here inserts it, a DELETE of one is nothing
forward = false              # true: this site's sender also passes on what it applied from its other
                             # links (a chain A-B-C: B forwards A's changes to C), never back
secret_file = "/d/keys/east-west.secret"  # the link's shared secret (at least 32 bytes)
ddl = false                  # schema changes: send this site's that name only tables the lists
                             # below carry, and apply the peer's (docs/LINKS.md section 8.1)
ddl_roles = []               # with ddl: the roles whose schema changes go both ways, e.g. ["admin"]:
                             # roles that are the same, with the same rights, on both sites
# What this site SENDS on the link (docs/LINKS.md section 8), checked when this file is read:
include = ["hr.*", "sales.orders"]  # tables sent: shell patterns on "schema.table" (default: all)
exclude = ["hr.secret_*"]    # never sent, whatever include says (schema chorus never is)
rules_dsn = "host=/d/nodes/n1/run port=5433 dbname=postgres user=chorus_rules"  # the session that
                             # evaluates the rules' SQL, read-only; required when they have SQL
                             # parts; the role it names must not be a superuser
rules_timeout_ms = 1000      # each evaluation's statement_timeout (and each call of this site's
                             # conflict function, policy "function")
[[link.table]]               # rules of the tables matching name (the first [[link.table]] that does)
name = "hr.emp"              # a shell pattern on "schema.table"
filter = "region = 'eu'"     # the rows sent: a SQL predicate over the row's columns (NULL: not sent);
                             # an UPDATE leaving the subset is sent as a DELETE of its key
rename = "public.staff"      # then, in this order: 1. the table's name at the peer
rename_columns = { salary = "pay" }  # 2. columns renamed
drop = ["ssn"]               # 3. columns not sent (names after step 2; never a key column)
compute = [{ column = "pay_k", type = "integer", sql = "pay * 1000" }]  # 4. columns added: SQL over
                             # the row as it is after step 3 (search_path is pg_catalog: qualify names)
function = "hr.mask"         # 5. a function f(jsonb) returns jsonb over the row (NULL: not sent)
```
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Sequence


class ChorusConfigError(Exception):
    """The configuration file is missing, unreadable or invalid."""


@dataclass(frozen=True)
class LinkConfig:
    """One ``[[link]]`` table: a link to another site as this node takes part in it."""

    name: str
    site: str
    peer_site: str
    tls_cert: str
    tls_key: str
    peer_cert: str
    secret_file: str
    listen: str = ""  # host:port of this node's sender; "" = this node serves no sender
    peers: tuple[str, ...] = ()  # the peer's senders; () = this site does not receive on this link
    nodes: tuple[str, ...] = ()  # the nodes that may run the receiver; () = any member
    window: int = 64
    # the most of this site's writeset log the link may keep for its peer, in MiB, while the peer
    # has not applied it (docs/LINKS.md section 2): the ring grows past log.total_mb up to this
    # much; past it the link is broken
    max_retain_mb: int = 16384
    # conflicts on the receiving side (docs/LINKS.md sections 6-7; link/settle.py): the same on
    # every node of the site, which decide alike with them
    policy: str = "latest-commit-wins"  # or primary-wins
    primary: str = ""  # the primary site of primary-wins
    detection: str = "row"  # row (NDB$EPOCH) or transaction (NDB$EPOCH_TRANS)
    table_policy: tuple[tuple[str, str], ...] = ()  # ("schema.table", policy), overriding policy
    subset: bool = False  # the peer's rules filter rows: an UPDATE of an absent row inserts it, a DELETE is nothing
    # policy delta's counters, ("schema.table", (column, ...)): settled here, captured with their
    # old values where this site sends (chorus.link_old_columns, old_columns_setting)
    delta_columns: tuple[tuple[str, tuple[str, ...]], ...] = ()
    delta_fallback: str = "latest-commit-wins"  # the policy of a delta table's other columns
    conflict_function: str = ""  # "schema.function" of policy function (docs/LINKS.md section 7.1)
    # what this site sends (docs/LINKS.md section 8; link/rules.py): the sender's rules
    include: tuple[str, ...] = ("*.*",)
    exclude: tuple[str, ...] = ()  # schema chorus is never sent, whatever these say
    tables: tuple["LinkTable", ...] = ()  # [[link.table]], in order: the first matching one applies
    rules_dsn: str = ""  # the session evaluating the rules' SQL; "" = [postgres] dsn
    rules_timeout_ms: int = 1000
    # what this site's sender passes on (docs/LINKS.md section 10): off, only this site's own
    # changes; on, also what this site applied from its other links (a chain A-B-C), never to the
    # site a change came from nor to its origin
    forward: bool = False
    # schema changes (docs/LINKS.md section 8.1): this site sends those naming only tables its
    # lists carry, and applies the peer's (each site of a link says so for what it receives)
    ddl: bool = False
    # the roles whose schema changes the link carries, both ways (required with ddl): roles that
    # are the same, with the same rights, on both sites; another role's is neither sent nor applied
    ddl_roles: tuple[str, ...] = ()


@dataclass(frozen=True)
class LinkTable:
    """One ``[[link.table]]`` of a link: the rules of the tables matching ``name`` (a shell
    pattern on ``schema.table``): a row filter, then transformations in a fixed order: rename
    the table, rename columns, drop columns, computed columns, a row function."""

    name: str
    filter: str = ""
    rename: str = ""  # "schema.table" at the peer
    rename_columns: tuple[tuple[str, str], ...] = ()  # (old, new), in the file's order
    drop: tuple[str, ...] = ()
    compute: tuple[tuple[str, str, str], ...] = ()  # (column, type, sql)
    function: str = ""  # schema.function, f(jsonb) returns jsonb


_LINK_KEYS: dict[str, tuple[type, bool]] = {
    "name": (str, True), "site": (str, True), "peer_site": (str, True), "tls_cert": (str, True),
    "tls_key": (str, True), "peer_cert": (str, True), "secret_file": (str, True), "listen": (str, False),
    "peers": (list, False), "nodes": (list, False), "window": (int, False),
    "max_retain_mb": (int, False), "policy": (str, False), "primary": (str, False), "detection": (str, False),
    "table_policy": (dict, False),
    "include": (list, False), "exclude": (list, False), "table": (list, False), "rules_dsn": (str, False),
    "rules_timeout_ms": (int, False), "subset": (bool, False), "delta_columns": (dict, False),
    "delta_fallback": (str, False), "conflict_function": (str, False), "forward": (bool, False),
    "ddl": (bool, False), "ddl_roles": (list, False)}
_TABLE_KEYS: dict[str, Any] = {"name": str, "filter": str, "rename": str, "rename_columns": dict, "drop": list,
                                "compute": list, "function": str}
_QUALIFIED = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*\Z")
_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_ .,()\[\]]*\Z")


def link_rules(link: LinkConfig) -> Any:
    """The rules of what this site sends on ``link`` (link/rules.py ``RuleSet``); ValueError
    (a RuleError) if they cannot work, as far as the file tells without the tables: a name used
    twice, a column renamed, dropped or computed twice, a function not schema-qualified. A key
    column dropped or computed is refused when the sender meets the table (the link then stops
    there, with that reason)."""
    from chorus.link import rules as lr
    tables: list[lr.TableRule] = []
    for t in link.tables:
        where = f"[[link.table]] {t.name!r}"
        if not t.name:
            raise lr.RuleError("a [[link.table]] needs a name (a pattern on schema.table)")
        if t.name in {r.pattern for r in tables}:
            raise lr.RuleError(f"two [[link.table]] named {t.name!r}")
        steps: list[lr.Transformation] = []
        if t.rename:
            schema, dot, table = t.rename.partition(".")
            if not (schema and dot and table) or "." in table:
                raise lr.RuleError(f"{where}: rename must be schema.table, not {t.rename!r}")
            steps.append(lr.RenameTable(schema, table))
        olds = [old for old, _ in t.rename_columns]
        news = [new for _, new in t.rename_columns]
        for name in news:
            if news.count(name) > 1:
                raise lr.RuleError(f"{where}: two columns renamed to {name}")
        steps += [lr.RenameColumn(old, new) for old, new in t.rename_columns if old != new]
        names = set(news)  # the names the file knows the table has after step 2
        for column in t.drop:
            if t.drop.count(column) > 1:
                raise lr.RuleError(f"{where}: column {column} dropped twice")
            if column in olds and column not in news:
                raise lr.RuleError(f"{where}: column {column} is renamed, then dropped: drop names the new name")
            steps.append(lr.DropColumn(column))
        names -= set(t.drop)
        for column, typ, sql in t.compute:
            if not column or not sql.strip():
                raise lr.RuleError(f"{where}: a computed column needs a column name and sql")
            if not _TYPE.match(typ):
                raise lr.RuleError(f"{where}: computed column {column} needs a type (such as integer or text), "
                                   f"not {typ!r}")
            if column in names:
                raise lr.RuleError(f"{where}: computed column {column} is the name of another column")
            names.add(column)
            steps.append(lr.ComputedColumn(column, typ, sql))
        if t.function:
            if not _QUALIFIED.match(t.function):
                raise lr.RuleError(f"{where}: function must be a schema-qualified name (schema.function), "
                                   f"not {t.function!r}: it is looked up with search_path pg_catalog")
            steps.append(lr.RowFunction(t.function))
        if t.filter is not None and t.filter != "" and not t.filter.strip():
            raise lr.RuleError(f"{where}: filter is empty")
        tables.append(lr.TableRule(t.name, t.filter or None, tuple(steps)))
    for pattern in link.include + link.exclude:
        if not pattern:
            raise lr.RuleError("an empty pattern in include or exclude")
    rules = lr.RuleSet(include=link.include, exclude=("chorus.*",) + link.exclude, tables=tuple(tables),
                       ddl=link.ddl, ddl_roles=link.ddl_roles)
    if rules.needs_sql and not link.rules_dsn:
        # The SQL of a filter, a computed column or a row function may call functions their owners
        # can change; run by the node's own (superuser) session they would run with its rights.
        raise lr.RuleError("rules with SQL (a filter, a computed column, a row function) need rules_dsn: a session "
                           "of a role that is not a superuser and holds no more than the rules need")
    return rules


def _link_table(path: str, link: str, raw: Any) -> LinkTable:
    if not isinstance(raw, dict):
        raise ChorusConfigError(f"{path}: link {link}: [[link.table]] must be tables")
    values: dict[str, Any] = {}
    value: Any
    for key, value in raw.items():
        typ: Any = _TABLE_KEYS.get(key)
        if typ is None:
            raise ChorusConfigError(f"{path}: link {link}: unknown key link.table.{key}")
        if not isinstance(value, typ):
            raise ChorusConfigError(f"{path}: link {link}: link.table.{key} must be a {typ.__name__}")
        if key == "rename_columns":
            if not all(isinstance(v, str) and v for v in value.values()):
                raise ChorusConfigError(f"{path}: link {link}: link.table.rename_columns maps old names to new ones")
            value = tuple(value.items())
        elif key == "drop":
            if not all(isinstance(v, str) and v for v in value):
                raise ChorusConfigError(f"{path}: link {link}: link.table.drop must be a list of column names")
            value = tuple(value)
        elif key == "compute":
            out = []
            for c in value:
                if not (isinstance(c, dict) and set(c) == {"column", "type", "sql"}
                        and all(isinstance(v, str) for v in c.values())):
                    raise ChorusConfigError(f"{path}: link {link}: each of link.table.compute is "
                                            "{ column = \"name\", type = \"type\", sql = \"expression\" }")
                out.append((c["column"], c["type"], c["sql"]))
            value = tuple(out)
        values[key] = value
    if "name" not in values:
        raise ChorusConfigError(f"{path}: link {link}: a [[link.table]] needs a name (a pattern on schema.table)")
    return LinkTable(**values)


def link_settings(link: LinkConfig, links: Sequence[LinkConfig] = ()) -> Any:
    """The link's conflict settings (link/settle.py ``Settings``); ValueError if they cannot decide.
    ``links``: every link of the site (a site with others stamps every row its peer's changes
    leave, docs/LINKS.md section 10)."""
    from chorus.link.conflict import Detection
    from chorus.link.settle import Settings
    try:
        detection = Detection(link.detection)
    except ValueError:
        raise ValueError(f"detection must be row or transaction, not {link.detection!r}") from None
    if link.conflict_function and not _QUALIFIED.match(link.conflict_function):
        raise ValueError(f"conflict_function must be a schema-qualified name (schema.function), not "
                         f"{link.conflict_function!r}: it is looked up with search_path pg_catalog")
    return Settings(link.site, link.peer_site, link.policy, link.primary, detection, dict(link.table_policy),
                    link.subset, delta_columns=dict(link.delta_columns), delta_fallback=link.delta_fallback,
                    function=link.conflict_function, function_timeout_ms=link.rules_timeout_ms,
                    chained=any(k.name != link.name for k in links))


_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*\Z")


def _delta_columns(path: str, value: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``delta_columns = {"schema.table" = ["column", ...]}``, checked: names as the extension's
    chorus.link_old_columns list can hold them."""
    out = []
    for table, columns in sorted(value.items()):
        if not _QUALIFIED.match(table):
            raise ChorusConfigError(f"{path}: link.delta_columns: {table!r} is not schema.table")
        if isinstance(columns, tuple):
            columns = list(columns)
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and _COLUMN.match(c)
                                                                   for c in columns):
            raise ChorusConfigError(f"{path}: link.delta_columns of {table} must be a list of column names")
        out.append((table, tuple(columns)))
    return tuple(out)


def old_columns_setting(links: Sequence[LinkConfig]) -> str:
    """The value of chorus.link_old_columns for a node with these links: the delta columns of
    every link, whose old values its changes then carry ("schema.table:column,column; ...")."""
    tables: dict[str, set[str]] = {}
    for link in links:
        for table, columns in link.delta_columns:
            tables.setdefault(table, set()).update(columns)
    return "; ".join(f"{t}:{','.join(sorted(c))}" for t, c in sorted(tables.items()))


_LINK_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")


def _links(path: str, raw: Any) -> tuple[LinkConfig, ...]:
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ChorusConfigError(f"{path}: [[link]] must be tables, one per link")
    out: list[LinkConfig] = []
    for t in raw:
        link = parse_link(path, t)
        if link.name in {x.name for x in out}:
            raise ChorusConfigError(f"{path}: two links named {link.name}")
        out.append(link)
    if any(k.forward for k in out) and any(k.ddl for k in out):
        # what a forwarded schema change would do at the far site is not built nor tested
        raise ChorusConfigError(f"{path}: a site that forwards (link.forward) cannot carry schema changes "
                                "(link.ddl) yet: make them on each site of the chain")
    if any(k.forward for k in out) and any(k.delta_columns for k in out):
        # a forwarded change carries the rows as this site committed them, without the old values
        # the far site's delta policy would add (docs/LINKS.md section 10)
        raise ChorusConfigError(f"{path}: a site that forwards (link.forward) cannot settle counters by delta "
                                "(link.delta_columns) yet: a forwarded change carries no old values")
    return tuple(out)


def parse_link(path: str, t: dict[str, Any]) -> LinkConfig:
    """One ``[[link]]`` table as TOML reads it, checked (ChorusConfigError naming ``path``)."""
    values: dict[str, Any] = {}
    value: Any
    for key, value in t.items():
        if key not in _LINK_KEYS:
            raise ChorusConfigError(f"{path}: unknown key link.{key}")
        typ: Any = _LINK_KEYS[key][0]
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, typ) or isinstance(value, bool) and typ is int:
            raise ChorusConfigError(f"{path}: link.{key} must be a {typ.__name__}")
        if key == "table":
            values["tables"] = tuple(_link_table(path, str(t.get("name", "?")), x) for x in value)
            continue
        if key == "delta_columns":
            values[key] = _delta_columns(path, value)
            continue
        if isinstance(value, list):
            if not all(isinstance(v, str) for v in value):
                raise ChorusConfigError(f"{path}: link.{key} must be a list of strings")
            value = tuple(value)
        if isinstance(value, dict):
            if not all(isinstance(v, str) for v in value.values()):
                raise ChorusConfigError(f"{path}: link.{key} must map table names to policy names")
            value = tuple(sorted(value.items()))
        values[key] = value
    for key, (_, required) in _LINK_KEYS.items():
        if required and key not in values:
            raise ChorusConfigError(f"{path}: missing link.{key}" + (f" in link {values['name']}" if "name" in values else ""))
    link = LinkConfig(**values)
    for what in ("name", "site", "peer_site"):
        if not _LINK_NAME.match(getattr(link, what)):
            raise ChorusConfigError(f"{path}: link.{what} {getattr(link, what)!r} must be 1 to 64 of "
                                    "[A-Za-z0-9_.:-]")
    if link.site == link.peer_site:
        raise ChorusConfigError(f"{path}: link {link.name} joins site {link.site} to itself")
    if not link.listen and not link.peers:
        raise ChorusConfigError(f"{path}: link {link.name} has neither listen (a sender) nor peers (a receiver)")
    if link.window < 1:
        raise ChorusConfigError(f"{path}: link.window must be at least 1")
    if not 1 <= link.max_retain_mb <= 1 << 30:
        raise ChorusConfigError(f"{path}: link {link.name}: max_retain_mb must be at least 1 (MiB of writeset log "
                                f"kept for the peer), not {link.max_retain_mb}")
    if link.rules_timeout_ms < 1:
        raise ChorusConfigError(f"{path}: link {link.name}: rules_timeout_ms must be at least 1")
    if link.ddl and not link.ddl_roles:
        # a schema change runs on the receiving site as its role there: only roles the operator
        # says are the same on both sites (an ordinary role of the peer could otherwise run code
        # here with another role's rights, or make nodes here fail alike; docs/SECURITY.md 3.1)
        raise ChorusConfigError(f"{path}: link {link.name}: ddl = true needs ddl_roles, the roles whose schema "
                                "changes the link carries: roles that are the same, with the same rights, on both "
                                "sites (e.g. ddl_roles = [\"admin\"])")
    if any(not r for r in link.ddl_roles):
        raise ChorusConfigError(f"{path}: link {link.name}: an empty name in ddl_roles")
    for address in (link.listen, *link.peers):
        host, _, port = address.rpartition(":")
        if address and not (host and port.isdigit() and 0 < int(port) < 65536):
            raise ChorusConfigError(f"{path}: link {link.name}: {address!r} is not host:port")
    for check in (link_settings, link_rules):  # the conflict settings, the rules of what it sends
        try:
            check(link)
        except ValueError as e:
            raise ChorusConfigError(f"{path}: link {link.name}: {e}") from None
    return link


@dataclass(frozen=True)
class NodeConfig:
    name: str
    dsn: str
    socket_path: str
    admin_socket: str
    state_file: str
    data_dir: str
    cluster_group: str = "chorus"
    apply_workers: int = 4
    log_level: str = "info"
    idle_blocker_grace_ms: int = 1000
    flow_pause_at: int = 50  # certified writesets not committed here yet: ask the cluster to pause
    flow_resume_at: int = 10  # ... and release the request at or below this
    apply_method: str = "c"  # "c": chorus.apply_writeset in the extension (the only one left)
    catchup_batch: int = 32  # partial recovery applies runs of up to this many writesets as one transaction
    apply_run: int = 8  # live apply: up to this many consecutive remote writesets ready together, one transaction
    commit_lanes: int = 1  # 1: commits in GID order; n > 1: GID g commits after the previous one of lane g % n
    log_dir: str = ""  # default: <data_dir>/wslog
    log_segment_mb: int = 64
    log_total_mb: int = 4096  # about a day of moderate traffic (100 writesets/s of ~400 bytes)
    recovery_listen: str = ""  # host:port; "" = no recovery server (this node cannot be a partner)
    recovery_advertise: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    secret_file: str = ""
    recovery_partners: tuple[str, ...] = ()
    auto_total: bool = False  # `chorus node join`: rebuild by total recovery when no log can catch the node up
    # The coordinators of the cluster when they all share one Corosync (a local cluster): a view
    # is quorate only with a majority of them. 0: quorum counts Corosync's nodes (every real
    # deployment, one Corosync per node).
    bus_members: int = 0
    metrics_listen: str = ""  # host:port of the HTTP endpoints (endpoints.py); "" = none
    links: tuple[LinkConfig, ...] = ()  # [[link]]: links to other sites (docs/LINKS.md)

    @property
    def wslog_dir(self) -> str:
        return self.log_dir or os.path.join(self.data_dir, "wslog")

    @property
    def spool_dir(self) -> str:
        """Large writesets for the server to apply from (spool.py)."""
        return os.path.join(self.data_dir, "spool")


_SCHEMA: dict[str, dict[str, tuple[str, type, bool]]] = {
    # section -> key -> (field, type, required)
    "node": {
        "name": ("name", str, True),
        "data_dir": ("data_dir", str, True),
        "state_file": ("state_file", str, True),
        "socket_path": ("socket_path", str, True),
        "admin_socket": ("admin_socket", str, True),
        "log_level": ("log_level", str, False),
    },
    "postgres": {"dsn": ("dsn", str, True)},
    "bus": {"group": ("cluster_group", str, False), "members": ("bus_members", int, False)},
    "apply": {"workers": ("apply_workers", int, False),
              "idle_blocker_grace_ms": ("idle_blocker_grace_ms", int, False),
              "flow_pause_at": ("flow_pause_at", int, False),
              "flow_resume_at": ("flow_resume_at", int, False),
              "method": ("apply_method", str, False),
              "catchup_batch": ("catchup_batch", int, False),
              "run": ("apply_run", int, False),
              "commit_lanes": ("commit_lanes", int, False)},
    "log": {"dir": ("log_dir", str, False),
            "segment_mb": ("log_segment_mb", int, False),
            "total_mb": ("log_total_mb", int, False)},
    "recovery": {"listen": ("recovery_listen", str, False),
                 "advertise": ("recovery_advertise", str, False),
                 "tls_cert": ("tls_cert", str, False),
                 "tls_key": ("tls_key", str, False),
                 "secret_file": ("secret_file", str, False),
                 "partners": ("recovery_partners", list, False),
                 "auto_total": ("auto_total", bool, False)},
    "metrics": {"listen": ("metrics_listen", str, False)},
}


def load_config(path: str) -> NodeConfig:
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError as e:
        raise ChorusConfigError(f"{path}: no such configuration file") from e
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ChorusConfigError(f"{path}: {e}") from e
    values: dict[str, Any] = {}
    for section, body in raw.items():
        if section == "link":
            values["links"] = _links(path, body)
            continue
        if section not in _SCHEMA:
            raise ChorusConfigError(f"{path}: unknown section [{section}]")
        if not isinstance(body, dict):
            raise ChorusConfigError(f"{path}: [{section}] must be a table")
        for key, value in body.items():
            if key not in _SCHEMA[section]:
                raise ChorusConfigError(f"{path}: unknown key {section}.{key}")
            fieldname, typ, _ = _SCHEMA[section][key]
            if not isinstance(value, typ) or isinstance(value, bool) and typ is int:
                raise ChorusConfigError(f"{path}: {section}.{key} must be a {typ.__name__}")
            if isinstance(value, list):
                if not all(isinstance(v, str) for v in value):
                    raise ChorusConfigError(f"{path}: {section}.{key} must be a list of strings")
                value = tuple(value)
            values[fieldname] = value
    for section, keys in _SCHEMA.items():
        for key, (fieldname, _, required) in keys.items():
            if required and fieldname not in values:
                raise ChorusConfigError(f"{path}: missing {section}.{key}")
    if not 1 <= values.get("commit_lanes", 1) <= 16:
        raise ChorusConfigError(f"{path}: apply.commit_lanes must be 1 to 16")
    if values.get("apply_run", 1) < 1:
        raise ChorusConfigError(f"{path}: apply.run must be at least 1")
    if values.get("catchup_batch", 1) < 1:
        raise ChorusConfigError(f"{path}: apply.catchup_batch must be at least 1")
    if values.get("apply_workers", 1) < 1:
        raise ChorusConfigError(f"{path}: apply.workers must be at least 1")
    if not 0 <= values.get("flow_resume_at", 10) < values.get("flow_pause_at", 50):
        raise ChorusConfigError(f"{path}: apply.flow_resume_at must be below apply.flow_pause_at")
    if values.get("apply_method", "c") != "c":
        raise ChorusConfigError(f"{path}: apply.method must be \"c\" (the extension applies writesets; "
                                "the \"sql\" method was removed: it could not carry binary values)")
    if values.get("log_segment_mb", 64) < 1 or values.get("log_total_mb", 4096) < 2 * values.get("log_segment_mb", 64):
        raise ChorusConfigError(f"{path}: log.total_mb must hold at least two segments of log.segment_mb")
    if values.get("recovery_listen") and not all(values.get(k) for k in ("tls_cert", "tls_key", "secret_file")):
        raise ChorusConfigError(f"{path}: recovery.listen needs recovery.tls_cert, tls_key and secret_file")
    listen = values.get("metrics_listen", "")
    host, _, port = listen.rpartition(":")
    if listen and not (host and port.isdigit() and 0 < int(port) < 65536):
        raise ChorusConfigError(f"{path}: metrics.listen must be host:port, not {listen!r}")
    if values.get("log_level", "info").lower() not in ("debug", "info", "warning", "error"):
        raise ChorusConfigError(f"{path}: node.log_level must be debug, info, warning or error")
    return NodeConfig(**values)


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _link_toml(link: LinkConfig) -> str:
    def strs(xs: tuple[str, ...]) -> str:
        return "[" + ", ".join(_toml_str(x) for x in xs) + "]"
    return ("[[link]]\n" + "".join(f"{k} = {_toml_str(v)}\n" for k, v in (
        ("name", link.name), ("site", link.site), ("peer_site", link.peer_site), ("listen", link.listen),
        ("tls_cert", link.tls_cert), ("tls_key", link.tls_key), ("peer_cert", link.peer_cert),
        ("secret_file", link.secret_file)) if v)
        + f"peers = {strs(link.peers)}\nnodes = {strs(link.nodes)}\nwindow = {link.window}\n"
        + f"max_retain_mb = {link.max_retain_mb}\n"
        + f"policy = {_toml_str(link.policy)}\ndetection = {_toml_str(link.detection)}\n"
        + (f"primary = {_toml_str(link.primary)}\n" if link.primary else "")
        + (f"conflict_function = {_toml_str(link.conflict_function)}\n" if link.conflict_function else "")
        + f"subset = {'true' if link.subset else 'false'}\n"
        + f"forward = {'true' if link.forward else 'false'}\n"
        + ("ddl = true\n" if link.ddl else "")
        + (f"ddl_roles = {strs(link.ddl_roles)}\n" if link.ddl_roles else "")
        + ("table_policy = {" + ", ".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in link.table_policy) + "}\n")
        + ("delta_columns = {" + ", ".join(f"{_toml_str(k)} = {strs(v)}" for k, v in link.delta_columns) + "}\n"
           f"delta_fallback = {_toml_str(link.delta_fallback)}\n" if link.delta_columns else "")
        + f"include = {strs(link.include)}\nexclude = {strs(link.exclude)}\n"
        + (f"rules_dsn = {_toml_str(link.rules_dsn)}\n" if link.rules_dsn else "")
        + f"rules_timeout_ms = {link.rules_timeout_ms}\n"
        + "".join(_link_table_toml(t) for t in link.tables))


def _link_table_toml(t: LinkTable) -> str:
    return ("[[link.table]]\n" + "".join(f"{k} = {_toml_str(v)}\n" for k, v in (
        ("name", t.name), ("filter", t.filter), ("rename", t.rename), ("function", t.function)) if v)
        + ("rename_columns = {" + ", ".join(f"{_toml_str(a)} = {_toml_str(b)}" for a, b in t.rename_columns) + "}\n"
           if t.rename_columns else "")
        + (f"drop = [{', '.join(_toml_str(c) for c in t.drop)}]\n" if t.drop else "")
        + ("compute = [" + ", ".join(f"{{ column = {_toml_str(c)}, type = {_toml_str(ty)}, sql = {_toml_str(q)} }}"
                                     for c, ty, q in t.compute) + "]\n" if t.compute else ""))


def write_config(cfg: NodeConfig, path: str) -> None:
    text = (
        "[node]\n"
        f"name = {_toml_str(cfg.name)}\n"
        f"data_dir = {_toml_str(cfg.data_dir)}\n"
        f"state_file = {_toml_str(cfg.state_file)}\n"
        f"socket_path = {_toml_str(cfg.socket_path)}\n"
        f"admin_socket = {_toml_str(cfg.admin_socket)}\n"
        f"log_level = {_toml_str(cfg.log_level)}\n"
        "[postgres]\n"
        f"dsn = {_toml_str(cfg.dsn)}\n"
        "[bus]\n"
        f"group = {_toml_str(cfg.cluster_group)}\n"
        f"members = {cfg.bus_members}\n"
        "[apply]\n"
        f"workers = {cfg.apply_workers}\n"
        f"idle_blocker_grace_ms = {cfg.idle_blocker_grace_ms}\n"
        f"flow_pause_at = {cfg.flow_pause_at}\n"
        f"flow_resume_at = {cfg.flow_resume_at}\n"
        f"method = {_toml_str(cfg.apply_method)}\n"
        f"catchup_batch = {cfg.catchup_batch}\n"
        f"run = {cfg.apply_run}\n"
        f"commit_lanes = {cfg.commit_lanes}\n"
        "[log]\n"
        + (f"dir = {_toml_str(cfg.log_dir)}\n" if cfg.log_dir else "")
        + f"segment_mb = {cfg.log_segment_mb}\n"
        f"total_mb = {cfg.log_total_mb}\n"
        "[recovery]\n"
        + "".join(f"{k} = {_toml_str(v)}\n" for k, v in (
            ("listen", cfg.recovery_listen), ("advertise", cfg.recovery_advertise), ("tls_cert", cfg.tls_cert),
            ("tls_key", cfg.tls_key), ("secret_file", cfg.secret_file)) if v)
        + f"partners = [{', '.join(_toml_str(p) for p in cfg.recovery_partners)}]\n"
        + f"auto_total = {'true' if cfg.auto_total else 'false'}\n"
        + (f"[metrics]\nlisten = {_toml_str(cfg.metrics_listen)}\n" if cfg.metrics_listen else "")
        + "".join(_link_toml(link) for link in cfg.links)
    )
    # never through a link: `chorus local up` (root) writes it in the service user's directory
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
