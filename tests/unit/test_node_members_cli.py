"""``chorus node add`` / ``chorus node remove`` on hosts (chorus/cli/members.py), through
click's CliRunner against a stand-in coordinator on a real admin socket and a corosync.conf in a
temporary directory: a refused change leaves the file alone and sends nothing; an accepted one
rewrites the file, reloads Corosync and sends the change once."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner

from chorus.cli import members
from chorus.cli.main import cli
from chorus.confchange.corosync_conf import read_nodes
from test_confchange import CONF  # three hosts n1..n3 at 10.0.0.1..3


class Coordinator:
    """A stand-in for n1's coordinator: answers ``status`` with ``status`` and records every
    ``configure`` (accepting it)."""

    def __init__(self, path: str, status: dict[str, Any]) -> None:
        self.path = path
        self.status = status
        self.configured: list[dict[str, Any]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                req = json.loads(buf)
                if req["cmd"] == "status":
                    resp: dict[str, Any] = {"ok": True, "status": self.status}
                elif req["cmd"] == "configure":
                    self.configured.append(req)
                    resp = {"ok": True, "result": f"configured nodes: {', '.join(req['nodes'])}"}
                else:
                    resp = {"ok": False, "error": "unknown"}
                conn.sendall(json.dumps(resp).encode() + b"\n")

    def close(self) -> None:
        self.sock.close()


ONLINE = {"node": "n1", "state": "online", "reason": "", "accepts_writes": True, "members": ["n1", "n2", "n3"],
          "config_version": 0, "configured_nodes": []}


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Coordinator, list[list[str]]]]:
    with tempfile.TemporaryDirectory(prefix="chorus-members-", dir="/tmp") as d:
        root = Path(d)
        (root / "corosync.conf").write_text(CONF)
        (root / "chorus.toml").write_text(
            f'[node]\nname = "n1"\ndata_dir = "{d}"\nstate_file = "{d}/state.json"\n'
            f'socket_path = "{d}/c.sock"\nadmin_socket = "{d}/a.sock"\n[postgres]\ndsn = "dbname=x"\n')
        coord = Coordinator(os.path.join(d, "a.sock"), dict(ONLINE))
        ran: list[list[str]] = []
        monkeypatch.setattr(members, "_run", ran.append)
        try:
            yield root, coord, ran
        finally:
            coord.close()


def _chorus(root: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, [*args, "--config", str(root / "chorus.toml"), "--corosync-conf",
                                    str(root / "corosync.conf")])


def test_adding_a_node_rewrites_the_file_reloads_corosync_and_sends_the_change(host: Any) -> None:
    root, coord, ran = host
    r = _chorus(root, "node", "add", "n4", "--address", "10.0.0.4")
    assert r.exit_code == 0, r.output
    assert [n.name for n in read_nodes((root / "corosync.conf").read_text())] == ["n1", "n2", "n3", "n4"]
    assert (root / "corosync.conf.bak").read_text() == CONF
    assert ran == [["corosync-cfgtool", "-R"]]
    assert [(c["nodes"], c["version"]) for c in coord.configured] == [(["n1", "n2", "n3", "n4"], 1)]
    # every node's Corosync node id from the node list: only those count toward quorum
    assert coord.configured[0]["ids"] == {"n1": "1", "n2": "2", "n3": "3", "n4": "4"}


def test_removing_a_node_after_a_change_counts_from_the_clusters_set(host: Any) -> None:
    root, coord, ran = host
    coord.status.update(config_version=1, configured_nodes=["n1", "n2", "n3", "n4"],
                        members=["n1", "n2", "n3", "n4"])
    r = _chorus(root, "node", "remove", "n3")
    assert r.exit_code == 0, r.output
    assert [n.name for n in read_nodes((root / "corosync.conf").read_text())] == ["n1", "n2"]
    assert [(c["nodes"], c["version"]) for c in coord.configured] == [(["n1", "n2", "n4"], 2)]
    assert coord.configured[0]["ids"] == {"n1": "1", "n2": "2"}  # (n4's: the members know it)


@pytest.mark.parametrize("args, status, why", [
    (("node", "add", "n2", "--address", "10.0.0.9"), {}, "name n2 already"),
    (("node", "add", "n2", "--address", "10.0.0.2", "--nodeid", "2"), {}, "one of the configured nodes already"),
    (("node", "add", "n9", "--address", "10.0.0.2"), {}, "address 10.0.0.2 already"),
    (("node", "add", "n4", "--address", "10.0.0.4"), {"members": ["n1", "n2"]}, "not a quorum"),
    (("node", "add", "n4", "--address", "10.0.0.4"), {"state": "non-primary", "accepts_writes": False},
     "run this on a node that is online"),
    (("node", "remove", "n9"), {}, "not one of the configured nodes"),
    (("node", "remove", "n1"), {}, "run it on another node"),
    (("node", "remove", "n3"), {"members": ["n1", "n3"]}, "not a quorum"),
    (("node", "remove", "n2"), {"config_version": 2, "configured_nodes": ["n1", "n3"], "members": ["n1", "n3"]},
     "not one of the configured nodes"),
    (("node", "add", "n4", "--address", "10.0.0.4"), {"members": ["n1", "n2", "x7"]}, "not named in corosync.conf"),
])
def test_bad_changes_are_refused_with_nothing_changed(host: Any, args: tuple[str, ...], status: dict[str, Any],
                                                      why: str) -> None:
    root, coord, ran = host
    coord.status.update(status)
    r = _chorus(root, *args)
    assert r.exit_code != 0 and why in r.output, r.output
    assert (root / "corosync.conf").read_text() == CONF
    assert not (root / "corosync.conf.bak").exists()
    assert ran == [] and coord.configured == []


def test_conf_only_rewrites_this_hosts_file_and_a_second_run_keeps_it(host: Any) -> None:
    root, coord, ran = host
    r = _chorus(root, "node", "add", "n4", "--address", "10.0.0.4", "--conf-only")
    assert r.exit_code == 0, r.output
    once = (root / "corosync.conf").read_text()
    assert ran == [] and coord.configured == []
    r = _chorus(root, "node", "add", "n4", "--address", "10.0.0.4")  # then the change itself, on this host
    assert r.exit_code == 0, r.output
    assert (root / "corosync.conf").read_text() == once
    assert len(coord.configured) == 1
