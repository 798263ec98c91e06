"""The node state file (seed 8.2): cluster UUID, last GID, bootstrap flags.

Written atomically: write a temporary file, fsync it, rename it over the old one, fsync the
directory. Mode 0600.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

from chorus.confchange import ClusterConfig
from chorus.history import Epoch, MemberRecord


class StateError(Exception):
    pass


@dataclass(frozen=True)
class NodeState:
    node: str
    cluster_uuid: str = ""
    last_gid: int = 0
    bootstrap: bool = False  # `chorus bootstrap` asked this node to start a cluster
    safe_to_bootstrap: bool = False  # this node was the last to leave the cluster
    # why an inconsistency vote put this node out (its data differs from the cluster's): it
    # does not start again until total recovery rebuilds it (docs/MEMBERSHIP.md)
    left_by_vote: str = ""
    # what the node knows of the history (chorus/history.py): the epochs its data followed,
    # oldest first, and for each node it was in the primary component with, where it was last
    # known a member or where it left
    epochs: tuple[Epoch, ...] = ()
    records: dict[str, MemberRecord] = field(default_factory=dict)
    # the cluster's configured nodes since the last `chorus node add`/`remove` this node saw
    # (chorus/confchange; None: its configuration's)
    config: Optional[ClusterConfig] = None
    # why this node is not one of the cluster's configured nodes (it was removed): it does not
    # start again until `chorus node add` has added it back and rebuilt it
    removed: str = ""

    def with_(self, **changes: object) -> "NodeState":
        return replace(self, **changes)  # type: ignore[arg-type]


def load_state(path: str, node: str) -> NodeState:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        return NodeState(node)
    except (OSError, json.JSONDecodeError) as e:
        raise StateError(f"cannot read state file {path}: {e}") from e
    try:
        return NodeState(
            node=str(raw.get("node", node)),
            cluster_uuid=str(raw.get("cluster_uuid", "")),
            last_gid=int(raw.get("last_gid", 0)),
            bootstrap=bool(raw.get("bootstrap", False)),
            safe_to_bootstrap=bool(raw.get("safe_to_bootstrap", False)),
            left_by_vote=str(raw.get("left_by_vote", "")),
            epochs=tuple(Epoch(int(n), int(g), str(node)) for n, g, node in raw.get("epochs", [])),
            records={str(name): MemberRecord(int(e), int(g), bool(m))
                     for name, (e, g, m) in dict(raw.get("records", {})).items()},
            config=_config(raw.get("config")),
            removed=str(raw.get("removed", "")),
        )
    except (TypeError, ValueError, KeyError) as e:
        raise StateError(f"state file {path} is invalid: {e}") from e


def _config(raw: object) -> Optional[ClusterConfig]:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TypeError("config is not an object")
    # "ids": each node's Corosync node id, as known (absent in a set recorded before ids were kept:
    # learned again in the total order, confchange.learned)
    return ClusterConfig(int(raw["version"]), tuple(str(n) for n in raw["nodes"]), str(raw.get("tie_breaker", "")),
                         tuple((str(n), str(i)) for n, i in dict(raw.get("ids", {})).items()))


def save_state(path: str, state: NodeState) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        raw = asdict(state)
        raw["epochs"] = [[e.number, e.start, e.node] for e in state.epochs]
        raw["records"] = {name: [r.epoch, r.gid, r.member] for name, r in sorted(state.records.items())}
        raw["config"] = (None if state.config is None else
                         {"version": state.config.version, "nodes": list(state.config.nodes),
                          "tie_breaker": state.config.tie_breaker, "ids": dict(state.config.ids)})
        os.write(fd, (json.dumps(raw, indent=2, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
