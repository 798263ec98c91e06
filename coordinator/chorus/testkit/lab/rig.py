"""A multi-host Chorus cluster on one machine: each host a network namespace.

Every host has its own network stack (a TAP device on the lab's user-space switch, its own
address), its own Corosync daemon (knet, authenticated and encrypted with a cluster key the lab
generates and copies to each host), its own PostgreSQL and coordinator. The hosts find each
other only over the switch, so partitions, delay, loss and duplication between them are real
network faults as Corosync and the recovery streams see them. See docs/LAB.md.

```
DIR/cluster.json, DIR/nodes/<name>/...   as for `chorus local` (chorus.testkit.localcluster)
DIR/lab.json                             the lab: id, subnet, switch and corosync pids
DIR/switch.sock, switch.log              the switch's control socket (0600) and log
DIR/nodes/<name>/corosync/               corosync.conf, authkey (0400), corosync.log
DIR/keys/corosync.authkey                the cluster's knet key (0400)
```

Host i (1-based) is namespace ``chorus-<id>-<i>`` with address ``<subnet>.<i>``; the machine
itself is ``<subnet>.254`` on port 0 of the switch. Everything the lab starts is recorded by pid
and stopped by pid; ``down`` removes the namespaces and (by closing the switch) the devices.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from chorus.config import NodeConfig
from chorus.testkit.lab import switch as sw
from chorus.testkit.localcluster import (COROSYNC_LOGGING, SERVICE_USER, LocalCluster, LocalClusterError, Meta, NodeMeta,
                                 _alive, _tail, _terminate, _wait_gone)

COROSYNC = "/usr/sbin/corosync"


class LabError(LocalClusterError):
    pass


@dataclass
class LabMeta:
    lab_id: str
    subnet: str
    hosts: int
    switch_pid: int = 0
    # namespaces and switch ports made beyond ``hosts`` at `lab up --spare`: `chorus lab add`
    # takes one for a node added to the running cluster (the switch's ports are fixed at start)
    spare: int = 0
    corosync: dict[str, int] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


class Lab(LocalCluster):
    def __init__(self, directory: str, log: Callable[[str], None] = lambda s: None) -> None:
        super().__init__(directory, log)
        self.lab_path = self.dir / "lab.json"
        self.control_path = str(self.dir / "switch.sock")

    # ---- lab metadata -------------------------------------------------------------------

    def lab(self) -> LabMeta:
        try:
            return LabMeta(**json.loads(self.lab_path.read_text()))
        except FileNotFoundError as e:
            raise LabError(f"no lab in {self.dir} (run `chorus lab up`)") from e

    def save_lab(self, lm: LabMeta) -> None:
        tmp = self.lab_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(lm), indent=2))
        tmp.replace(self.lab_path)

    def namespace(self, lm: LabMeta, name: str) -> str:
        return f"chorus-{lm.lab_id}-{self._index(name)}"

    def address(self, lm: LabMeta, name: str) -> str:
        return f"{lm.subnet}.{self._index(name)}"

    @staticmethod
    def _index(name: str) -> int:
        return int(name.lstrip("n"))

    # ---- LocalCluster hooks -------------------------------------------------------------

    def _wrap(self, node: Optional[str], cmd: list[str]) -> tuple[list[str], dict[str, Any]]:
        if node is None:
            return super()._wrap(node, cmd)
        prefix = ["ip", "netns", "exec", self.namespace(self.lab(), node)]
        if self.as_root:
            prefix += ["setpriv", f"--reuid={SERVICE_USER}", f"--regid={SERVICE_USER}", "--init-groups", "--"]
        return prefix + cmd, {}

    def _check_port(self, port: int, what: str) -> None:
        pass  # each host has its own network stack

    def _corosync_ids(self, nodes: list[str]) -> dict[str, str]:
        return {n: str(self._index(n)) for n in nodes}  # (LAB_NODE's nodeid)

    def config(self, meta: Meta, n: NodeMeta) -> NodeConfig:
        listen = f"{self.address(self.lab(), n.name)}:{n.port - 1000}"
        # one Corosync per host: votes count hosts, not coordinators (bus.members is for a local cluster)
        return replace(super().config(meta, n), recovery_listen=listen, recovery_advertise=listen, bus_members=0,
                       metrics_listen=f"{self.address(self.lab(), n.name)}:{n.port + 1000}")

    def describe(self, meta: Meta) -> list[dict[str, Any]]:
        lm = self.lab()
        out = super().describe(meta)
        for d in out:
            d["dsn"] = f"host={self.address(lm, d['name'])} port={d['port']} dbname=postgres user=postgres"
            d["namespace"] = self.namespace(lm, d["name"])
            d["corosync_pid"] = lm.corosync.get(d["name"], 0) if _alive(lm.corosync.get(d["name"], 0), "corosync") else 0
        return out

    def _init_node(self, meta: Meta, n: NodeMeta) -> None:
        super()._init_node(meta, n)
        conf = self.node_dir(n.name) / "pgdata" / "postgresql.conf"
        marker = "# --- chorus lab host ---"
        if marker not in conf.read_text():
            with open(conf, "a") as f:
                f.write(f"{marker}\nlisten_addresses = '127.0.0.1,{self.address(self.lab(), n.name)}'\n")
            # the lab's network is private to this machine; trust it as the local cluster trusts loopback
            with open(conf.parent / "pg_hba.conf", "a") as f:
                f.write(f"{marker}\nhost all all {self.lab().subnet}.0/24 trust\n")

    def _start_bus(self, meta: Meta, names: Optional[list[str]] = None) -> None:
        lm = self.lab()
        self._network(lm)
        key = self._authkey()
        wanted = [n for n in meta.nodes if names is None or n.name in names]
        for n in wanted:
            self._start_host_corosync(lm, meta, n, key)
        deadline = time.monotonic() + 30
        for n in wanted:
            while not self._corosync_ready(lm, n.name):
                if time.monotonic() > deadline or not _alive(lm.corosync.get(n.name, 0), "corosync"):
                    raise LabError(f"{n.name}: corosync did not start:\n"
                                   f"{_tail(self.node_dir(n.name) / 'corosync' / 'corosync.log')}")
                time.sleep(0.2)

    # ---- network ------------------------------------------------------------------------

    def _network(self, lm: LabMeta) -> None:
        if _alive(lm.switch_pid, "chorus.testkit.lab.switch"):
            return
        taps = [f"chl{lm.lab_id}h{i}" for i in range(lm.hosts + lm.spare + 1)]
        ready = self.dir / "switch.ready"
        ready.unlink(missing_ok=True)
        with open(self.dir / "switch.log", "ab") as out:
            p = subprocess.Popen([sys.executable, "-m", "chorus.testkit.lab.switch", "--control", self.control_path,
                                  "--ready", str(ready), *taps], stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        lm.switch_pid = p.pid
        self.save_lab(lm)
        deadline = time.monotonic() + 15
        while not ready.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"the lab switch did not start:\n{_tail(self.dir / 'switch.log')}")
            time.sleep(0.05)
        _ip("addr", "add", f"{lm.subnet}.254/24", "dev", taps[0])
        _ip("link", "set", taps[0], "up")
        for i in range(1, lm.hosts + lm.spare + 1):
            ns = f"chorus-{lm.lab_id}-{i}"
            if ns not in lm.namespaces:
                _ip("netns", "add", ns)
                lm.namespaces.append(ns)
                self.save_lab(lm)
            _ip("link", "set", taps[i], "netns", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{lm.subnet}.{i}/24", "dev", taps[i])
            _ip("-n", ns, "link", "set", taps[i], "up")
        self.log(f"lab network up: {lm.hosts} hosts (and {lm.spare} spare) on {lm.subnet}.0/24 (switch pid {p.pid})")

    def _authkey(self) -> Path:
        keys = self.dir / "keys"
        keys.mkdir(mode=0o700, exist_ok=True)
        key = keys / "corosync.authkey"
        if not key.exists():
            p = subprocess.run(["corosync-keygen", "-k", str(key)], capture_output=True, text=True, timeout=60)
            if p.returncode != 0:
                raise LabError(f"corosync-keygen failed: {p.stderr.strip()}")
        os.chmod(key, 0o400)
        return key

    def _start_host_corosync(self, lm: LabMeta, meta: Meta, n: NodeMeta, key: Path) -> None:
        if _alive(lm.corosync.get(n.name, 0), "corosync"):
            return
        cdir = self.node_dir(n.name) / "corosync"
        (cdir / "state").mkdir(parents=True, exist_ok=True)
        os.chmod(cdir, 0o700)
        host_key = cdir / "authkey"
        if host_key.exists():
            os.chmod(host_key, 0o600)
        shutil.copyfile(key, host_key)
        os.chmod(host_key, 0o400)
        conf = self._write_corosync_conf(lm, meta, n)
        # corosync takes a lock at /var/run/corosync.pid: give each daemon its own /run
        script = f"mount -t tmpfs -o mode=0755 tmpfs /run && exec {COROSYNC} -f -c {conf}"
        with open(cdir / "corosync.out", "ab") as out:
            p = subprocess.Popen(["ip", "netns", "exec", self.namespace(lm, n.name), "unshare", "--mount",
                                  "--propagation", "private", "sh", "-c", script],
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        lm.corosync[n.name] = p.pid
        self.save_lab(lm)
        self.log(f"{n.name}: corosync started (pid {p.pid}) in {self.namespace(lm, n.name)}")

    def _write_corosync_conf(self, lm: LabMeta, meta: Meta, n: NodeMeta) -> Path:
        """Host ``n``'s corosync.conf: the node list of every node of the cluster."""
        cdir = self.node_dir(n.name) / "corosync"
        nodes = "\n".join(LAB_NODE.format(id=self._index(x.name), name=x.name, addr=self.address(lm, x.name))
                          for x in meta.nodes)
        conf = cdir / "corosync.conf"
        conf.write_text(LAB_COROSYNC_CONF.format(name=meta.group[:30], key=cdir / "authkey", log=cdir / "corosync.log",
                                                 state=cdir / "state", nodes=nodes, user=SERVICE_USER))
        return conf

    def _corosync_ready(self, lm: LabMeta, name: str) -> bool:
        p = subprocess.run(["ip", "netns", "exec", self.namespace(lm, name), "corosync-quorumtool", "-s"],
                           capture_output=True, timeout=10)
        return p.returncode in (0, 2)

    # ---- lab commands -------------------------------------------------------------------

    def create(self, hosts: int, port_base: int, spare: int = 0, **kw: Any) -> list[dict[str, Any]]:
        if not self.as_root:
            raise LabError("the lab needs root (network namespaces, TAP devices)")
        if not 2 <= hosts <= 9 or not 0 <= spare <= 9 - hosts:
            raise LabError("a lab has 2 to 9 hosts, spare ones included")
        if not self.lab_path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha1(str(self.dir).encode()).digest()
            self.save_lab(LabMeta(lab_id=digest.hex()[:4], subnet=f"10.{200 + digest[2] % 50}.{digest[3]}",
                                  hosts=hosts, spare=spare))
        lm = self.lab()
        if self.meta_path.exists() and len(self.load().nodes) > lm.hosts + lm.spare:
            raise LabError(f"the lab in {self.dir} has {lm.hosts} hosts and {lm.spare} spare")
        return self.up(lm.hosts, port_base, **kw)

    # ---- adding and removing hosts (LocalCluster.add_node / remove_node) --------------------

    def tcp_dsn(self, n: NodeMeta) -> str:
        return f"host={self.address(self.lab(), n.name)} port={n.port} dbname=postgres user=postgres"

    def _free_name(self, meta: Meta, nodes: list[str]) -> str:
        lm = self.lab()
        used = {x.name for x in meta.nodes} | set(nodes)
        for i in range(1, lm.hosts + lm.spare + 1):
            if f"n{i}" not in used and not self.node_dir(f"n{i}").exists():
                return f"n{i}"
        raise LabError(f"no spare host left in the lab ({lm.hosts + lm.spare} namespaces; `chorus lab up --spare N` "
                       "makes more when the lab is created)")

    def add_node(self, name: Optional[str] = None, port: Optional[int] = None) -> NodeMeta:
        """A node on a spare host (its namespace and switch port were made at `lab up --spare`):
        ``name`` is n<i> for host i."""
        meta = self.load()
        lm = self.lab()
        if name is not None and (not name.startswith("n") or not name[1:].isdigit()
                                 or not 1 <= self._index(name) <= lm.hosts + lm.spare):
            raise LabError(f"a lab host is n1 to n{lm.hosts + lm.spare}, not {name}")
        if name is None:
            name = self._free_name(meta, [])
        self._network(lm)
        return super().add_node(name, port or min(x.port for x in meta.nodes) + self._index(name) - 1)

    def _nodes_changed(self, meta: Meta, removed: Optional[NodeMeta]) -> None:
        """Every running Corosync gets the new node list (each host's corosync.conf rewritten,
        then `corosync-cfgtool -R` reloads them all); a removed host's Corosync stops first."""
        lm = self.lab()
        if removed is not None:
            pid = lm.corosync.pop(removed.name, 0)
            if _alive(pid, "corosync"):
                _terminate(pid, "corosync", 20)
            self.save_lab(lm)
        running = [n for n in meta.nodes if _alive(lm.corosync.get(n.name, 0), "corosync")]
        for n in running:
            self._write_corosync_conf(lm, meta, n)
        if running:
            p = subprocess.run(["ip", "netns", "exec", self.namespace(lm, running[0].name), "corosync-cfgtool", "-R"],
                               capture_output=True, text=True, timeout=60)
            if p.returncode != 0:
                raise LabError(f"corosync-cfgtool -R failed: {(p.stderr or p.stdout).strip()}")
            self.log(f"corosync reloaded on {', '.join(n.name for n in running)}: nodes "
                     f"{', '.join(n.name for n in meta.nodes)}")

    def partition(self, groups: list[list[int]]) -> dict[str, Any]:
        return sw.control(self.control_path, {"cmd": "partition", "groups": groups})

    def heal(self) -> dict[str, Any]:
        return sw.control(self.control_path, {"cmd": "heal"})

    def netem(self, spec: str) -> dict[str, Any]:
        n = sw.parse_netem(spec)
        return sw.control(self.control_path, {"cmd": "netem", **asdict(n)})

    def switch_state(self) -> dict[str, Any]:
        return sw.control(self.control_path, {"cmd": "stats"})

    def _host_pids(self, name: str) -> list[int]:
        meta, lm = self.load(), self.lab()
        n = self._node(meta, name)
        pids = []
        for pid, needle in ((lm.corosync.get(name, 0), "corosync"), (n.coordinator_pid, "chorus")):
            if _alive(pid, needle):
                pids.append(pid)
        if _alive(n.pg_pid, "postgres"):
            pids += _descendants(n.pg_pid)
        return pids

    def freeze(self, name: str) -> None:
        """SIGSTOP every process of the host, as a hung machine or a long GC pause would."""
        self._signal_host(name, signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        self._signal_host(name, signal.SIGCONT)

    def _signal_host(self, name: str, sig: signal.Signals) -> None:
        for pid in self._host_pids(name):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass  # a backend that ended since the host's processes were listed

    def kill_host(self, name: str) -> None:
        """SIGKILL the host's coordinator, PostgreSQL and corosync: a crashed machine."""
        self.thaw(name)
        self.kill(name, "all")
        self.kill_bus(name)

    def kill_bus(self, name: str) -> None:
        """SIGKILL the host's corosync alone (its coordinator then stops: it lost the bus)."""
        pid = self.lab().corosync.get(name, 0)
        if _alive(pid, "corosync"):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, "corosync", 10)

    def restart_host(self, name: str, wait: bool = True) -> None:
        self.start(name, wait=wait)

    def heal_all(self) -> None:
        """Undo every fault: the network healed and clean, every host thawed, every host with a
        process down restarted (not waited for)."""
        self.heal()
        self.netem("")
        meta = self.load()
        for n in meta.nodes:
            self.thaw(n.name)
        for d in self.describe(self.load()):
            if not (d["pg_pid"] and d["coordinator_pid"] and d["corosync_pid"]):
                self.restart_host(d["name"], wait=False)

    def down(self) -> None:
        if not self.lab_path.exists():
            return super().down()
        lm = self.lab()
        for name in lm.corosync:
            try:
                self.thaw(name)
            except LocalClusterError:
                pass
        try:
            super().down()
        finally:
            for name, pid in lm.corosync.items():
                if _alive(pid, "corosync"):
                    _terminate(pid, "corosync", 20)
            lm.corosync = {}
            if _alive(lm.switch_pid, "chorus.testkit.lab.switch"):
                _terminate(lm.switch_pid, "chorus.testkit.lab.switch", 10)
            lm.switch_pid = 0
            for ns in lm.namespaces:
                _ip("netns", "del", ns, check=False)
            lm.namespaces = []
            self.save_lab(lm)


LAB_NODE = """  node {{
    nodeid: {id}
    name: {name}
    ring0_addr: {addr}
  }}"""

# knet with crypto: the hosts talk over a (simulated) network that others could reach.
# token 2000 ms (retransmitted every 250 ms up to 8 times): a lost host is dropped within about
# 6 s, and a link with 100 ms round trips and 5 % loss does not lose the token. knet's own
# link check is made patient (a link is down after 2.5 s without an answer to pings sent every
# 250 ms): with the defaults (derived from the token: pings every 0.66 s, down after 1.3 s
# without two answers) one or two lost pings on a lossy link take the link down and the
# membership churns; a dead host is still dropped after the token timeout. These are options
# of an interface block: under totem itself Corosync ignores them.
# auto_tie_breaker: an even split leaves the half with the lowest node id (host 1) quorate;
# the coordinators read the same rule from cmap and count that half as a quorum for uniform
# commit too (docs/MEMBERSHIP.md).
LAB_COROSYNC_CONF = """system {{
  sched_rr: no
  state_dir: {state}
}}
totem {{
  version: 2
  cluster_name: {name}
  transport: knet
  crypto_cipher: aes256
  crypto_hash: sha256
  keyfile: {key}
  token: 2000
  token_retransmits_before_loss_const: 8
  interface {{
    linknumber: 0
    knet_ping_interval: 250
    knet_ping_timeout: 2500
    knet_pong_count: 1
  }}
}}
""" + COROSYNC_LOGGING + """quorum {{
  provider: corosync_votequorum
  auto_tie_breaker: 1
  auto_tie_breaker_node: lowest
}}
nodelist {{
{nodes}
}}
uidgid {{
  uid: {user}
  gid: {user}
}}
"""
