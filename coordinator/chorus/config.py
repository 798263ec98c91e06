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
[apply]
workers = 4
```
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from typing import Any


class ChorusConfigError(Exception):
    """The configuration file is missing, unreadable or invalid."""


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
    apply_method: str = "c"  # "c": chorus.apply_writeset in the extension; "sql": statements from Python


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
    "bus": {"group": ("cluster_group", str, False)},
    "apply": {"workers": ("apply_workers", int, False),
              "idle_blocker_grace_ms": ("idle_blocker_grace_ms", int, False),
              "flow_pause_at": ("flow_pause_at", int, False),
              "flow_resume_at": ("flow_resume_at", int, False),
              "method": ("apply_method", str, False)},
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
            values[fieldname] = value
    for section, keys in _SCHEMA.items():
        for key, (fieldname, _, required) in keys.items():
            if required and fieldname not in values:
                raise ChorusConfigError(f"{path}: missing {section}.{key}")
    if values.get("apply_workers", 1) < 1:
        raise ChorusConfigError(f"{path}: apply.workers must be at least 1")
    if not 0 <= values.get("flow_resume_at", 10) < values.get("flow_pause_at", 50):
        raise ChorusConfigError(f"{path}: apply.flow_resume_at must be below apply.flow_pause_at")
    if values.get("apply_method", "c") not in ("c", "sql"):
        raise ChorusConfigError(f"{path}: apply.method must be \"c\" or \"sql\"")
    if values.get("log_level", "info").lower() not in ("debug", "info", "warning", "error"):
        raise ChorusConfigError(f"{path}: node.log_level must be debug, info, warning or error")
    return NodeConfig(**values)


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
        "[apply]\n"
        f"workers = {cfg.apply_workers}\n"
        f"idle_blocker_grace_ms = {cfg.idle_blocker_grace_ms}\n"
        f"flow_pause_at = {cfg.flow_pause_at}\n"
        f"flow_resume_at = {cfg.flow_resume_at}\n"
        f"method = {_toml_str(cfg.apply_method)}\n"
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
