"""A local development cluster: N PostgreSQL instances, one shared Corosync, N coordinators.

Everything lives under one directory; ``cluster.json`` records the pid of every process the
cluster started, so ``down``/``stop``/``kill`` act on exactly those (by pid, never by name).
Run as root, PostgreSQL and the coordinators run as the ``postgres`` OS user.

Nobody else may read any of it or connect without the password (chorus.localauth): PostgreSQL
takes SCRAM passwords over TCP and peer authentication on its socket; every file is 0600 and
every directory 0700, but for the two that the service user must pass through (0750, group
``postgres``, owned by the user who runs ``chorus local``, so the service user cannot replace
what that user reads there).

```
DIR/                           (0750 root:postgres)
DIR/cluster.json, pgpass       (0600: the processes; the postgres role's password, a libpq password file)
DIR/corosync/corosync.conf, corosync.log   (0700: only when the cluster starts its own Corosync)
DIR/nodes/                     (0750 root:postgres)
DIR/nodes/<name>/              (0700 postgres: pgdata, postgres.log, coordinator.log, chorus.toml, state.json)
DIR/nodes/<name>/run/          (0700: PostgreSQL's socket, chorus.sock, admin.sock)
DIR/nodes/<name>/wslog/        (0700: the writeset log)
DIR/keys/                      (0700: the cluster's recovery certificate, key and secret)
```

A node's recovery server listens on 127.0.0.1, port = its PostgreSQL port - 1000, and its HTTP
endpoints (metrics, health checks) on 127.0.0.1, port = its PostgreSQL port + 1000. The ports
are best chosen below the kernel's ephemeral range (32768-60999 on Linux): a port in it may be
held by any outgoing connection at the moment a node starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from chorus import localauth
from chorus.config import LinkConfig, NodeConfig, parse_link, write_config
from chorus.recovery import generate_keys
from chorus.state import load_state, save_state

# The PostgreSQL 15 binaries local clusters run: Debian's, or (CHORUS_PGBIN) a copy of them with
# its own extension directory, as a second checkout's tests use beside the first's.
PGBIN = Path(os.environ.get("CHORUS_PGBIN", "/usr/lib/postgresql/15/bin"))
SERVICE_USER = "postgres"
# Test-only: a directory where the first initdb of each kind is kept and later ones are copied
# from (tests/conftest.py sets it for a test run; see init_pgdata)
INITDB_CACHE = "CHORUS_INITDB_CACHE"


class LocalClusterError(Exception):
    pass


@dataclass
class NodeMeta:
    name: str
    port: int
    pg_pid: int = 0
    coordinator_pid: int = 0
    number: int = 0  # chorus.node_number (0: its place in the list, as before nodes could be added)
    # the directory of the PostgreSQL binaries this node runs ("": PGBIN, the cluster's). Set by
    # `chorus local start --pgbin DIR` while the node is stopped: a minor upgrade of one node
    # (docs/DEPLOY.md, "PostgreSQL minor upgrades")
    pgbin: str = ""


@dataclass
class Meta:
    group: str
    nodes: list[NodeMeta] = field(default_factory=list)
    corosync_pid: int = 0
    corosync_ours: bool = False
    log_segment_mb: int = 32
    log_total_mb: int = 2048
    commit_lanes: int = 1
    encoding: str = "UTF8"  # the databases' encoding (initdb -E)
    # [[link]] tables every node's configuration holds (config.LinkConfig's fields); a node's
    # sender listens on 127.0.0.1 at its port plus "listen_offset" (none without it)
    links: list[dict[str, Any]] = field(default_factory=list)
    # the highest chorus.node_number ever given (a removed node's is not given again: its
    # sequences' residue class may hold values already)
    numbers_used: int = 0


def _alive(pid: int, needle: str) -> bool:
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(") ", 1)[1].startswith("Z"):
                return False
    except OSError:
        return False
    # an empty command line: the process is between two execs (the lab's `ip netns exec ...`)
    return needle in cmd or not cmd.strip()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalCluster:
    def __init__(self, directory: str, log: Callable[[str], None] = lambda s: None) -> None:
        self.dir = Path(directory).resolve()
        self.meta_path = self.dir / "cluster.json"
        self.log = log
        self.as_root = os.geteuid() == 0
        self.venv_chorus = str(Path(sys.executable).parent / "chorus")

    # ---- metadata -----------------------------------------------------------------------

    def load(self) -> Meta:
        try:
            raw = json.loads(self.meta_path.read_text())
        except FileNotFoundError as e:
            raise LocalClusterError(f"no local cluster in {self.dir} (run `chorus local up`)") from e
        return Meta(raw["group"], [NodeMeta(**n) for n in raw["nodes"]], raw.get("corosync_pid", 0),
                    raw.get("corosync_ours", False), raw.get("log_segment_mb", 32), raw.get("log_total_mb", 512),
                    raw.get("commit_lanes", 1), raw.get("encoding", "UTF8"), raw.get("links", []),
                    raw.get("numbers_used", 0))

    def save(self, meta: Meta) -> None:
        localauth.write_private(self.meta_path, json.dumps(asdict(meta), indent=2))

    @property
    def passfile(self) -> Path:
        """The libpq password file with the postgres role's password, for connections over TCP."""
        return self.dir / "pgpass"

    def password(self, meta: Meta) -> str:
        """The postgres role's password: the password file's, or a new one written there (a new
        cluster, or one made before clusters had passwords)."""
        try:
            found = localauth.password_in(self.passfile.read_text())
        except FileNotFoundError:
            found = None
        if found is None:
            found = localauth.new_password()
            localauth.write_private(self.passfile, localauth.passfile_text([n.port for n in meta.nodes], found))
        localauth.restrict(self.passfile, 0o600)
        return found

    @staticmethod
    def pgbin(n: NodeMeta) -> Path:
        """The PostgreSQL binaries node ``n`` runs: its own (NodeMeta.pgbin) or the cluster's."""
        return Path(n.pgbin) if n.pgbin else PGBIN

    def node_dir(self, name: str) -> Path:
        return self.dir / "nodes" / name

    def run_dir(self, name: str) -> Path:
        return self.node_dir(name) / "run"

    def config(self, meta: Meta, n: NodeMeta) -> NodeConfig:
        d = self.node_dir(n.name)
        run = self.run_dir(n.name)
        keys = self.dir / "keys"
        listen = f"127.0.0.1:{n.port - 1000}"
        return NodeConfig(
            name=n.name, dsn=f"host={run} port={n.port} dbname=postgres user=postgres",
            socket_path=str(run / "chorus.sock"), admin_socket=str(run / "admin.sock"),
            state_file=str(d / "state.json"), data_dir=str(d), cluster_group=meta.group,
            log_segment_mb=meta.log_segment_mb, log_total_mb=meta.log_total_mb, commit_lanes=meta.commit_lanes,
            bus_members=len(meta.nodes),
            recovery_listen=listen, recovery_advertise=listen,
            tls_cert=str(keys / "cluster.crt"), tls_key=str(keys / "cluster.key"),
            secret_file=str(keys / "cluster.secret"),
            metrics_listen=f"127.0.0.1:{n.port + 1000}",
            links=tuple(_link(link, n.port) for link in meta.links))

    def describe(self, meta: Meta) -> list[dict[str, Any]]:
        """Each node: ``dsn`` (over TCP, naming the password file), ``socket_dsn`` (the
        coordinator's: peer authentication), its admin socket, configuration, HTTP endpoints, pids."""
        out = []
        for n in meta.nodes:
            cfg = self.config(meta, n)
            out.append({
                "name": n.name, "port": n.port,
                "dsn": localauth.tcp_dsn(n.port, self.passfile),
                "socket_dsn": cfg.dsn, "admin": cfg.admin_socket,
                "config": str(self.node_dir(n.name) / "chorus.toml"),
                "http": f"http://{cfg.metrics_listen}",
                "pg_pid": n.pg_pid if _alive(n.pg_pid, "postgres") else 0,
                "coordinator_pid": n.coordinator_pid if _alive(n.coordinator_pid, "chorus") else 0,
                "pgbin": str(self.pgbin(n)),
            })
        return out

    # ---- processes ----------------------------------------------------------------------

    def _as_service(self) -> dict[str, Any]:
        if not self.as_root:
            return {}
        return {"user": SERVICE_USER, "group": SERVICE_USER, "extra_groups": []}

    def _service_owner(self) -> Optional[tuple[int, int]]:
        """(uid, gid) of the service user when it is not this process's, else None."""
        if not self.as_root:
            return None
        pw = pwd.getpwnam(SERVICE_USER)
        return pw.pw_uid, pw.pw_gid

    def _chown(self, path: Path) -> None:
        _chown_tree(path, self._service_owner())

    def _peer_users(self) -> list[str]:
        """The OS users who connect as postgres over a node's socket: the service user and this one."""
        me = pwd.getpwuid(os.geteuid()).pw_name
        return [SERVICE_USER, me] if self.as_root else [me]

    def _wrap(self, node: Optional[str], cmd: list[str]) -> tuple[list[str], dict[str, Any]]:
        """How to run ``cmd`` for ``node`` as the service user (the lab adds its namespace)."""
        return cmd, self._as_service()

    def _run(self, cmd: list[str], what: str, timeout: float = 120, node: Optional[str] = None,
             stdin: Optional[str] = None) -> str:
        """Run a program as the service user, files it makes 0600; ``stdin`` is its input
        (secrets go there, never on a command line). Its output."""
        cmd, kw = self._wrap(node, cmd)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=stdin, umask=0o077, **kw)
        if p.returncode != 0:
            raise LocalClusterError(f"{what} failed:\n{p.stderr.strip() or p.stdout.strip()}")
        return str(p.stdout)

    def _corosync_reachable(self) -> bool:
        tool = shutil.which("corosync-quorumtool") or "/usr/sbin/corosync-quorumtool"
        try:
            return subprocess.run([tool, "-s"], capture_output=True, timeout=10).returncode in (0, 2)
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _start_bus(self, meta: Meta, names: Optional[list[str]] = None) -> None:
        """Make the group bus reachable for the nodes ``names`` (all when None): here one
        Corosync daemon on loopback shared by every node."""
        if meta.corosync_ours and _alive(meta.corosync_pid, "corosync"):
            return
        if self._corosync_reachable():
            self.log("reusing the corosync daemon already running on this machine")
            meta.corosync_ours, meta.corosync_pid = False, 0
            return
        if not self.as_root:
            raise LocalClusterError("corosync is not running and only root can start it")
        cdir = self.dir / "corosync"
        cdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        localauth.restrict(cdir, 0o700)
        conf = cdir / "corosync.conf"
        localauth.write_private(conf, COROSYNC_CONF.format(name=meta.group, log=cdir / "corosync.log",
                                                           user=SERVICE_USER))
        os.close(localauth.open_log(cdir / "corosync.log"))  # Corosync appends to it as it is
        binary = shutil.which("corosync") or "/usr/sbin/corosync"
        with os.fdopen(localauth.open_log(cdir / "corosync.out"), "ab") as out:
            p = subprocess.Popen([binary, "-f", "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True, umask=0o077)
        meta.corosync_pid, meta.corosync_ours = p.pid, True
        self.save(meta)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise LocalClusterError(f"corosync exited:\n{_tail(cdir / 'corosync.out')}\n{_tail(cdir / 'corosync.log')}")
            if self._corosync_reachable():
                self.log(f"corosync started (pid {p.pid})")
                return
            time.sleep(0.2)
        raise LocalClusterError(f"corosync did not become ready:\n{_tail(cdir / 'corosync.log')}")

    def _init_node(self, meta: Meta, n: NodeMeta) -> None:
        d = self.node_dir(n.name)
        run = self.run_dir(n.name)
        service_dir(d.parent)
        d.mkdir(mode=0o700, exist_ok=True)
        run.mkdir(mode=0o700, exist_ok=True)
        self._chown(d)
        pgdata = d / "pgdata"
        if not (pgdata / "PG_VERSION").exists():
            self.log(f"{n.name}: initdb")
            locale = "C.UTF-8" if meta.encoding.upper() in ("UTF8", "UTF-8") else "C"
            # no connection is accepted until _secure_node has written pg_hba.conf
            init_pgdata(lambda argv: self._run(argv, f"initdb of {n.name}"), self.pgbin(n) / "initdb", pgdata,
                        meta.encoding, locale, self._service_owner())
            localauth.append_text(pgdata / "postgresql.conf",
                                  PG_CONF.format(port=n.port, run=run, number=_number(meta, n)))
        cfg = self.config(meta, n)
        toml = d / "chorus.toml"
        write_config(cfg, str(toml))
        # a site that receives a link stamps its rows (docs/LINKS.md section 5), every node alike:
        # the coordinator sets chorus.link_site (and the delta policy's chorus.link_old_columns) from its
        # links when it starts (NodeDatabase.settle_settings)
        sites = sorted({link.site for link in cfg.links if link.peers})
        if len(sites) > 1:
            raise LocalClusterError(f"{n.name}: links name more than one site for this one: {', '.join(sites)}")
        self._chown(d)
        self._secure_node(n)

    def _secure_node(self, n: NodeMeta) -> None:
        """Make a node's files private and its PostgreSQL's authentication the local cluster's
        (chorus.localauth): on a new node, and on one made before clusters had passwords (its
        pg_hba.conf said ``trust``), which a running PostgreSQL takes at once (reload)."""
        d = self.node_dir(n.name)
        pgdata = d / "pgdata"
        for path in (d, self.run_dir(n.name), d / "wslog"):
            localauth.restrict(path, 0o700)
        for path in (d / "coordinator.log", d / "postgres.log", d / "chorus.toml", d / "state.json"):
            localauth.restrict(path, 0o600)
        changed = localauth.secure_pgdata(pgdata, self._peer_users(), self._service_owner())
        if changed and _alive(n.pg_pid, "postgres"):
            self.log(f"{n.name}: PostgreSQL takes passwords over TCP and peer authentication on its socket now")
            self._run([str(self.pgbin(n) / "pg_ctl"), "-D", str(pgdata), "reload"], f"reloading PostgreSQL of {n.name}",
                      node=n.name)

    def _start_postgres(self, n: NodeMeta) -> None:
        """Start the node's PostgreSQL unless it runs; either way make sure it has the extension
        and the password of the cluster's password file (set only when the one it has is not
        that: a restart writes nothing)."""
        if not _alive(n.pg_pid, "postgres"):
            self._start_postmaster(n)
        psql = [str(self.pgbin(n) / "psql"), "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-h", str(self.run_dir(n.name)),
                "-p", str(n.port), "-U", "postgres", "-d", "postgres", "-f", "-"]
        stored = self._run(psql, f"CREATE EXTENSION chorus on {n.name} (is the extension installed? run "
                                 "scripts/setup.sh)", node=n.name,
                           stdin="CREATE EXTENSION IF NOT EXISTS chorus;\n"
                                 "SELECT rolpassword FROM pg_catalog.pg_authid WHERE rolname = 'postgres';\n")
        password = self.password(self.load())
        if not localauth.scram_matches(stored.strip(), password):
            self._run(psql, f"setting the postgres role's password on {n.name}", node=n.name,
                      stdin=localauth.set_password_sql(password))

    def _start_postmaster(self, n: NodeMeta) -> None:
        d = self.node_dir(n.name)
        self._check_port(n.port, n.name)
        self.log(f"{n.name}: starting PostgreSQL on port {n.port}")
        # after a SIGKILL of the postmaster its backends take a moment to notice and exit
        # ("pre-existing shared memory block is still in use"): tried again every 0.25 s for 6 s
        # (the start is refused at once then; waiting 2 s between tries held most restarts 2 s)
        deadline = time.monotonic() + 6
        while True:
            try:
                self._run([str(self.pgbin(n) / "pg_ctl"), "-D", str(d / "pgdata"), "-l", str(d / "postgres.log"),
                           "-w", "-t", "60", "start"], f"starting PostgreSQL of {n.name}", node=n.name)
                break
            except LocalClusterError as e:
                if time.monotonic() >= deadline:
                    raise LocalClusterError(f"{e}\n{_tail(d / 'postgres.log')}") from None
                time.sleep(0.25)
        n.pg_pid = int((d / "pgdata" / "postmaster.pid").read_text().split()[0])

    def _check_port(self, port: int, what: str) -> None:
        _port_free_or_fail(port, what)

    def _start_coordinator(self, n: NodeMeta) -> None:
        if _alive(n.coordinator_pid, "chorus"):
            return
        self._check_port(n.port - 1000, f"{n.name}'s recovery server")
        self._check_port(n.port + 1000, f"{n.name}'s metrics and health checks")
        d = self.node_dir(n.name)
        self.log(f"{n.name}: starting the coordinator")
        cmd, kw = self._wrap(n.name, [self.venv_chorus, "run", "--config", str(d / "chorus.toml")])
        # 0600: it holds failed statements' text
        with os.fdopen(localauth.open_log(d / "coordinator.log", self._service_owner()), "ab") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, cwd=str(d), umask=0o077, **kw)
        n.coordinator_pid = p.pid

    def _plan_bootstrap(self, meta: Meta, fresh: bool) -> None:
        """A fresh cluster bootstraps on its first node. A restarted cluster with no coordinator
        running bootstraps on the node that left last, else on the one with the highest GID."""
        running = [n for n in meta.nodes if _alive(n.coordinator_pid, "chorus")]
        if running:
            return
        states = {n.name: load_state(self.config(meta, n).state_file, n.name) for n in meta.nodes}
        if fresh or not any(s.cluster_uuid for s in states.values()):
            chosen = meta.nodes[0].name
        elif any(s.safe_to_bootstrap for s in states.values()):
            chosen = next(s for s in states.values() if s.safe_to_bootstrap).node
            self.log(f"restarting the cluster from {chosen}, the node that left last")
        else:
            chosen = max(states.values(), key=lambda s: (s.last_gid, -int(s.node[1:] or 0))).node
            self.log(f"no node left the cluster last; bootstrapping from {chosen} (highest GID)")
        n = next(x for x in meta.nodes if x.name == chosen)
        path = self.config(meta, n).state_file
        save_state(path, states[chosen].with_(bootstrap=True))
        self._chown(Path(path).parent)

    def wait_online(self, meta: Meta, names: Optional[list[str]] = None, timeout: float = 60) -> None:
        from chorus.admin import admin_request

        deadline = time.monotonic() + timeout
        pending = [n for n in meta.nodes if names is None or n.name in names]
        last: dict[str, str] = {}
        while pending and time.monotonic() < deadline:
            for n in list(pending):
                if not _alive(n.coordinator_pid, "chorus"):
                    raise LocalClusterError(f"{n.name}: the coordinator exited:\n"
                                            f"{_tail(self.node_dir(n.name) / 'coordinator.log')}")
                try:
                    st = admin_request(self.config(meta, n).admin_socket, timeout=2)["status"]
                    last[n.name] = f"{st['state']}: {st['reason']}"
                    if st["state"] == "online":
                        pending.remove(n)
                except (OSError, ValueError, KeyError):
                    last[n.name] = "not answering yet"
            time.sleep(0.2)
        if pending:
            raise LocalClusterError("nodes not online in time: " + "; ".join(
                f"{n.name} ({last.get(n.name, '?')})" for n in pending))

    # ---- commands -----------------------------------------------------------------------

    def up(self, nodes: int, port_base: int, log_segment_mb: int = 32, log_total_mb: int = 2048,
           commit_lanes: Optional[int] = None, encoding: str = "UTF8",
           links: Optional[list[dict[str, Any]]] = None) -> list[dict[str, Any]]:
        """Create or restart the cluster. ``commit_lanes`` (kept for later restarts) sets
        apply.commit_lanes on every node (docs/APPLY.md); ``encoding`` is the databases' (when
        creating); ``links`` (kept too) the [[link]] tables of every node (Meta.links)."""
        fresh = not self.meta_path.exists()
        if fresh:
            if len(str(self.dir)) > 70:
                raise LocalClusterError(f"directory path too long for Unix sockets: {self.dir}")
            service_dir(self.dir)
            group = "chorus-" + hashlib.sha1(str(self.dir).encode()).hexdigest()[:10]
            meta = Meta(group, [NodeMeta(f"n{i + 1}", port_base + i) for i in range(nodes)],
                        log_segment_mb=log_segment_mb, log_total_mb=log_total_mb, encoding=encoding)
            self.save(meta)
        else:
            meta = self.load()
        if commit_lanes is not None:
            meta.commit_lanes = commit_lanes
            self.save(meta)
        if links is not None:
            meta.links = links
            self.save(meta)
        self._secure(meta)
        self._start_bus(meta)
        generate_keys(str(self.dir / "keys"))
        self._chown(self.dir / "keys")
        for n in meta.nodes:
            self._init_node(meta, n)
            self._start_postgres(n)
            self.save(meta)
        self._plan_bootstrap(meta, fresh)
        for n in meta.nodes:
            self._start_coordinator(n)
            self.save(meta)
        self.wait_online(meta)
        return self.describe(meta)

    def _secure(self, meta: Meta) -> None:
        """The cluster directory's own modes and its password file (a cluster made before
        clusters had passwords gets them here)."""
        service_dir(self.dir)
        localauth.restrict(self.meta_path, 0o600)
        self.password(meta)

    def start(self, name: str, wait: bool = True, pgbin: Optional[str] = None) -> None:
        """Start node ``name``; with ``pgbin``, from the PostgreSQL binaries in that directory
        from now on (refused unless its PostgreSQL is stopped: replacing the binaries under a
        running server is not an upgrade)."""
        meta = self.load()
        n = self._node(meta, name)
        if pgbin is not None:
            self._use_binaries(meta, n, pgbin)
        self._secure(meta)
        self._secure_node(n)
        self._start_bus(meta, [name])
        self._start_postgres(n)
        self._start_coordinator(n)
        self.save(meta)
        if wait:
            self.wait_online(meta, [name], timeout=300)

    def _use_binaries(self, meta: Meta, n: NodeMeta, pgbin: str) -> None:
        path = Path(pgbin).resolve()
        if _alive(n.pg_pid, "postgres"):
            raise LocalClusterError(f"{n.name}'s PostgreSQL runs: stop the node first (`chorus local stop`)")
        for program in ("postgres", "pg_ctl", "psql", "initdb"):
            if not os.access(path / program, os.X_OK):
                raise LocalClusterError(f"{path}: no PostgreSQL binaries there ({program} missing)")
        major = subprocess.run([str(path / "postgres"), "--version"], capture_output=True, text=True, timeout=30)
        if major.returncode != 0 or " 15." not in major.stdout:
            raise LocalClusterError(f"{path}/postgres is not PostgreSQL 15 ({(major.stdout or major.stderr).strip()}): a "
                                    "major version needs a migration (docs/MIGRATION.md), not new binaries")
        n.pgbin = "" if path == PGBIN.resolve() else str(path)
        self.save(meta)
        self.log(f"{n.name}: PostgreSQL binaries from {path} from now on")

    def stop(self, name: str) -> None:
        meta = self.load()
        n = self._node(meta, name)
        self._stop_coordinator(n)
        self._stop_postgres(n)
        self.save(meta)

    def kill(self, name: str, what: str) -> None:
        meta = self.load()
        n = self._node(meta, name)
        if what in ("coordinator", "all") and _alive(n.coordinator_pid, "chorus"):
            os.kill(n.coordinator_pid, signal.SIGKILL)
            _wait_gone(n.coordinator_pid, "chorus", 10)
        if what in ("postgres", "all") and _alive(n.pg_pid, "postgres"):
            os.kill(n.pg_pid, signal.SIGKILL)
            _wait_gone(n.pg_pid, "postgres", 10)

    def down(self) -> None:
        if not self.meta_path.exists():
            return
        meta = self.load()
        for n in meta.nodes:  # one at a time: the last to leave may bootstrap next time
            self._stop_coordinator(n)
        # the PostgreSQLs, with no coordinator left, side by side (each pg_ctl waits for its own)
        with ThreadPoolExecutor(max_workers=len(meta.nodes) or 1) as pool:
            list(pool.map(self._stop_postgres, meta.nodes))
        if meta.corosync_ours and _alive(meta.corosync_pid, "corosync"):
            _terminate(meta.corosync_pid, "corosync", 15)
        meta.corosync_pid, meta.corosync_ours = 0, False
        self.save(meta)

    # ---- adding and removing nodes (docs/MEMBERSHIP.md, "Adding and removing nodes") ------------

    def configured(self, meta: Meta) -> tuple[dict[str, Any], list[str]]:
        """An online node's status and the cluster's configured nodes as it holds them (the
        nodes of cluster.json until the first change)."""
        from chorus.admin import admin_request

        for n in meta.nodes:
            try:
                st: dict[str, Any] = admin_request(self.config(meta, n).admin_socket, timeout=5)["status"]
            except (OSError, ValueError, KeyError):
                continue
            if st.get("state") == "online" and st.get("accepts_writes"):
                nodes = list(st.get("configured_nodes") or []) if st.get("config_version") else \
                    [x.name for x in meta.nodes]
                return st, nodes
        raise LocalClusterError("no node of the cluster is online and writable: a change of its nodes goes through "
                                "an online node")

    def _reconfigure(self, meta: Meta, st: dict[str, Any], nodes: list[str]) -> str:
        """Send the new configured nodes through node ``st``'s coordinator; every node switches to
        them at one place of the total order (or every node refuses)."""
        from chorus.admin import admin_request

        by = self._node(meta, st["node"])
        try:
            resp = admin_request(self.config(meta, by).admin_socket, "configure", timeout=30,
                                 nodes=sorted(nodes), ids=self._corosync_ids(nodes),
                                 version=int(st.get("config_version") or 0) + 1)
        except (OSError, ValueError) as e:
            raise LocalClusterError(f"{by.name}: the change could not be asked: {e}") from e
        if not resp.get("ok"):
            raise LocalClusterError(f"the cluster refused the change: {resp.get('error')}")
        return str(resp.get("result", ""))

    def _corosync_ids(self, nodes: list[str]) -> dict[str, str]:
        """Each node's Corosync node id, as its corosync.conf says (a change sends them, as `chorus
        node add` on hosts does). None here: every node of a local cluster shares one Corosync."""
        return {}

    def _nodes_changed(self, meta: Meta, removed: Optional[NodeMeta]) -> None:
        """The configured nodes changed to ``meta.nodes`` (``removed``: the node that left): the
        bus learns them. Nothing here: every node of a local cluster shares one Corosync."""

    def tcp_dsn(self, n: NodeMeta) -> str:
        """Node ``n``'s database over TCP from this machine (total recovery's diff reads it so)."""
        return localauth.tcp_dsn(n.port, self.passfile)

    def _free_name(self, meta: Meta, nodes: list[str]) -> str:
        """The name a node added without one gets."""
        used = {x.name for x in meta.nodes} | set(nodes)
        return next(f"n{i}" for i in range(1, 10_000) if f"n{i}" not in used and not self.node_dir(f"n{i}").exists())

    def _passfile(self, meta: Meta) -> None:
        """The password file with a line for every node's port (the same password)."""
        localauth.write_private(self.passfile, localauth.passfile_text([x.port for x in meta.nodes],
                                                                       self.password(meta)))

    def _rewrite_configs(self, meta: Meta) -> None:
        """Every node's chorus.toml with bus.members = the nodes now (for their next start; the
        running coordinators count from the configured set they switched to)."""
        for n in meta.nodes:
            if (self.node_dir(n.name) / "chorus.toml").exists():
                write_config(self.config(meta, n), str(self.node_dir(n.name) / "chorus.toml"))
                self._chown(self.node_dir(n.name) / "chorus.toml")

    def add_node(self, name: Optional[str] = None, port: Optional[int] = None) -> NodeMeta:
        """Add a node to the running cluster: its PostgreSQL is made and started (nothing else
        changes if that fails), then the cluster's configured nodes grow by it through the total
        order. It is left stopped, to be rebuilt and started by total recovery (``chorus node
        join --total``, which ``chorus node add`` runs). Refused (nothing changed) for a name or
        port the cluster has."""
        meta = self.load()
        st, nodes = self.configured(meta)
        if name is None:
            name = self._free_name(meta, nodes)
        if not NAME.match(name):
            raise LocalClusterError(f"node name {name!r}: 1 to 63 of [A-Za-z0-9_.-]")
        if name in nodes or any(x.name == name for x in meta.nodes):
            raise LocalClusterError(f"node {name} is in the cluster already (nodes: {', '.join(sorted(nodes))})")
        if self.node_dir(name).exists():
            raise LocalClusterError(f"{self.node_dir(name)} exists (a node removed earlier?): move it away first")
        port = port or max(x.port for x in meta.nodes) + 1
        if any(x.port == port for x in meta.nodes):
            raise LocalClusterError(f"port {port} is node {next(x.name for x in meta.nodes if x.port == port)}'s")
        n = NodeMeta(name, port, number=max([meta.numbers_used] + [_number(meta, x) for x in meta.nodes]) + 1)
        if n.number > MAX_NODES:
            raise LocalClusterError(f"node number {n.number} is above chorus.max_nodes ({MAX_NODES}): sequences "
                                    "would collide")
        meta.nodes.append(n)
        self._passfile(meta)
        try:
            self._init_node(meta, n)
            self._start_postgres(n)
        except LocalClusterError:
            self._stop_postgres(n)
            meta.nodes.remove(n)
            self.save(meta)
            raise
        meta.nodes.remove(n)
        self.save(meta)
        self.log(f"{name}: adding it to the configured nodes ({', '.join(sorted(nodes + [name]))})")
        try:
            self.log(self._reconfigure(meta, st, nodes + [name]))
        except LocalClusterError:
            self._stop_postgres(n)
            self.save(meta)
            raise
        meta.nodes.append(n)
        meta.numbers_used = n.number
        self.save(meta)
        self._rewrite_configs(meta)
        self._nodes_changed(meta, None)
        return n

    def remove_node(self, name: str) -> str:
        """Remove a node from the running cluster: the cluster's configured nodes shrink by it
        through the total order (the node, still running, finds itself removed there and stops
        taking writes), then its coordinator and PostgreSQL stop; its directory stays (renamed
        ``nodes/NAME.removed-<time>``). Refused (nothing changed) for a node that is not
        configured, or when the nodes online without it would not be a quorum of those left.
        The change goes first, as on hosts (cli/members.py): stopped first, the node would take
        its vote with it before the change, and a 2-node cluster could never shrink to one."""
        meta = self.load()
        n = self._node(meta, name)
        st, nodes = self.configured(meta)
        if name not in nodes:
            raise LocalClusterError(f"node {name} is not one of the configured nodes ({', '.join(sorted(nodes))})")
        rest = [x for x in nodes if x != name]
        online = [x for x in st.get("members", []) if x in rest]
        if 2 * len(online) <= len(rest):
            raise LocalClusterError(f"removing {name} leaves {len(online)} of {len(rest)} configured nodes online "
                                    f"({', '.join(online) or 'none'}): not a quorum, the cluster would stop writing")
        if st["node"] == name:  # ask another node: this one stops
            others = [x for x in meta.nodes if x.name != name]
            st, _ = self.configured(Meta(meta.group, others))
        self.log(f"{name}: removing it from the configured nodes ({', '.join(sorted(rest))})")
        result = self._reconfigure(meta, st, rest)  # refused: nothing changed
        self.log(f"{name}: stopping it")
        self._stop_coordinator(n)
        self.save(meta)
        self._stop_postgres(n)
        meta.numbers_used = max([meta.numbers_used] + [_number(meta, x) for x in meta.nodes])
        meta.nodes.remove(n)
        self.save(meta)
        self._rewrite_configs(meta)
        self._passfile(meta)
        self._nodes_changed(meta, n)
        gone = self.node_dir(name).with_name(f"{name}.removed-{int(time.time())}")
        self.node_dir(name).rename(gone)
        self.log(f"{name}: removed ({result}); its files are in {gone}")
        return result

    def _node(self, meta: Meta, name: str) -> NodeMeta:
        for n in meta.nodes:
            if n.name == name:
                return n
        raise LocalClusterError(f"no node {name!r} in {self.dir} (nodes: {', '.join(x.name for x in meta.nodes)})")

    def _stop_coordinator(self, n: NodeMeta) -> None:
        if _alive(n.coordinator_pid, "chorus"):
            _terminate(n.coordinator_pid, "chorus", 15)
        n.coordinator_pid = 0

    def _stop_postgres(self, n: NodeMeta) -> None:
        d = self.node_dir(n.name)
        if _alive(n.pg_pid, "postgres"):
            try:
                self._run([str(self.pgbin(n) / "pg_ctl"), "-D", str(d / "pgdata"), "-m", "fast", "-w", "-t", "30",
                           "stop"], f"stopping PostgreSQL of {n.name}", timeout=60, node=n.name)
            except (LocalClusterError, subprocess.TimeoutExpired):
                if _alive(n.pg_pid, "postgres"):
                    os.kill(n.pg_pid, signal.SIGKILL)
        n.pg_pid = 0


MAX_NODES = 16  # chorus.max_nodes' default (docs/DDL.md)
NAME = re.compile(r"[A-Za-z0-9_.-]{1,63}\Z")


def _number(meta: Meta, n: NodeMeta) -> int:
    """A node's chorus.node_number: the one it was given, or its place in the list (a node of a
    cluster from before nodes could be added; such a cluster never removed any)."""
    return n.number or meta.nodes.index(n) + 1


def _link(table: dict[str, Any], port: int) -> LinkConfig:
    """A link of Meta.links as the node on ``port`` has it."""
    t = dict(table)
    offset = t.pop("listen_offset", 0)
    if offset:
        t["listen"] = f"127.0.0.1:{port + offset}"
    return parse_link("the local cluster's links", t)


def _wait_gone(pid: int, needle: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid, needle):
            return True
        time.sleep(0.05)
    return False


def _terminate(pid: int, needle: str, timeout: float) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if not _wait_gone(pid, needle, timeout):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _wait_gone(pid, needle, 5)


def _port_free_or_fail(port: int, name: str, patience_s: float = 5.0) -> None:
    """Fail clearly when ``port`` is taken on loopback. A port in the kernel's ephemeral range may
    be held for a moment by some client connection's local end, so a taken port is asked again
    for ``patience_s`` before it counts as in use."""
    deadline = time.monotonic() + patience_s
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                return
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise LocalClusterError(f"{name}: port {port} is in use ({e}); choose another --port-base") from e
        time.sleep(0.2)


PG_CONF = """
# --- chorus local cluster ---
port = {port}
listen_addresses = '127.0.0.1'
unix_socket_directories = '{run}'
shared_preload_libraries = 'chorus'
chorus.socket_path = '{run}/chorus.sock'
chorus.node_number = {number}
include_if_exists = 'chorus_link.conf'
max_connections = 100
max_replication_slots = 10
shared_buffers = 128MB
log_line_prefix = '%m [%p] '
"""

# shared by the local cluster and the lab (chorus.testkit.lab.rig): corosync logs to its own file
COROSYNC_LOGGING = """logging {{
  to_stderr: no
  to_logfile: yes
  logfile: {log}
  to_syslog: no
  timestamp: on
}}
"""

COROSYNC_CONF = """# sched_rr off: a realtime corosync would starve PostgreSQL on a machine they share.
# udpu on loopback: every node of a local cluster is on this host, so knet's link management,
# heartbeats and crypto buy nothing here and cost half of corosync's CPU (measured with
# bench/pgbench_compare.py); the multi-host lab rig uses knet with crypto.
# seqno_unchanged_const 1: the token is held after one rotation without messages instead of 30.
# On a ring of one node every rotation is a UDP round trip to itself, and the commit path sends a
# message for each few transactions: with the default Corosync spent ~100 us of CPU per
# transaction turning the token, with 1 about 33 us (a held token is released at once when a
# message is queued).
system {{
  sched_rr: no
}}
totem {{
  version: 2
  cluster_name: {name}
  transport: udpu
  token: 1000
  seqno_unchanged_const: 1
}}
""" + COROSYNC_LOGGING + """quorum {{
  provider: corosync_votequorum
}}
nodelist {{
  node {{
    name: local
    nodeid: 1
    ring0_addr: 127.0.0.1
  }}
}}
uidgid {{
  uid: {user}
  gid: {user}
}}
"""


class PlainPostgres:
    """A plain PostgreSQL with the local cluster's settings, without Chorus: the benchmarks'
    baseline, and the reference the checker's tests hold a single PostgreSQL to. With
    ``extension``: the chorus extension preloaded but no coordinator, for tests of the apply
    function on one PostgreSQL. It authenticates as a local cluster does (chorus.localauth):
    ``dsn`` names its password file, ``password`` is the postgres role's password (for clients
    that take one, such as pytest-postgresql's)."""

    def __init__(self, root: Path, port: int, extension: bool = False, password: Optional[str] = None) -> None:
        self.dir = root / ("chorus-pg" if extension else "plain")
        self.port = port
        self.extension = extension
        self.password = password or localauth.new_password()
        self.passfile = root / f"{self.dir.name}.pgpass"  # beside the server's directory: not the server's to replace
        self.dsn = localauth.tcp_dsn(port, self.passfile)

    def start(self) -> None:
        run = self.dir / "run"
        run.mkdir(mode=0o700, parents=True, exist_ok=True)
        owner = None
        if os.geteuid() == 0:
            pw = pwd.getpwnam(SERVICE_USER)
            owner = (pw.pw_uid, pw.pw_gid)
            for path in (self.dir, run):
                os.chown(path, *owner, follow_symlinks=False)
        localauth.restrict(self.dir, 0o700)
        localauth.write_private(self.passfile, localauth.passfile_text([self.port], self.password))
        pgdata = self.dir / "pgdata"
        if not pgdata.exists():
            init_pgdata(_as_postgres, PGBIN / "initdb", pgdata, "UTF8", "C.UTF-8", owner)
            conf = PG_CONF.format(port=self.port, run=run, number=0)
            if not self.extension:  # (the directories' names may say chorus: only the settings go)
                conf = "\n".join(line for line in conf.splitlines()
                                 if not line.startswith(("shared_preload_libraries", "chorus.")))
            localauth.append_text(pgdata / "postgresql.conf", conf + "\n")
        me = pwd.getpwuid(os.geteuid()).pw_name
        localauth.secure_pgdata(pgdata, [SERVICE_USER, me] if owner else [me], owner)
        _as_postgres([str(PGBIN / "pg_ctl"), "-D", str(pgdata), "-l", str(self.dir / "postgres.log"), "-w", "start"])
        sql = localauth.set_password_sql(self.password)
        _as_postgres([str(PGBIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(run), "-p", str(self.port),
                      "-U", "postgres", "-d", "postgres", "-f", "-"], stdin=sql)

    def stop(self) -> None:
        _as_postgres([str(PGBIN / "pg_ctl"), "-D", str(self.dir / "pgdata"), "-m", "fast", "stop"], check=False)


@contextmanager
def temporary_postgres(prefix: str, port: int, extension: bool = False,
                       password: Optional[str] = None) -> Iterator[PlainPostgres]:
    """A PlainPostgres in a fresh directory under /tmp, started; stopped and removed at the end."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    service_dir(root)  # the server runs as postgres
    pg = PlainPostgres(root, port, extension, password)
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def init_pgdata(run: Callable[[list[str]], object], initdb: Path, pgdata: Path, encoding: str, locale: str,
                owner: Optional[tuple[int, int]]) -> None:
    """``initdb`` of a new data directory ``pgdata`` (superuser postgres, no connection accepted
    until pg_hba.conf is written), ``run`` running it as the service user, whose (uid, gid) is
    ``owner`` where it is not this process's.

    Test-only: where the environment names a directory in INITDB_CACHE (the test suites' conftest
    does), the first initdb of a kind (binary, encoding, locale) is kept there and each later one
    is a copy of it. initdb makes the same files every time but for the system identifier, which
    Chorus reads nowhere; a copy takes a fraction of initdb's seconds, and every test cluster
    makes three."""
    args = ["-U", "postgres", "--auth-local=reject", "--auth-host=reject", "-E", encoding, f"--locale={locale}"]
    cache = os.environ.get(INITDB_CACHE)
    if not cache:
        run([str(initdb), "-D", str(pgdata), *args])
        return
    st = initdb.stat()
    key = hashlib.sha1(repr((str(initdb), st.st_size, st.st_mtime_ns, args)).encode()).hexdigest()[:16]
    template = Path(cache) / key
    if not (template / "PG_VERSION").exists():
        work = Path(cache) / f"{key}.{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(mode=0o700)
        if owner is not None:
            os.chown(work, *owner)
        run([str(initdb), "-D", str(work), *args])
        try:
            os.rename(work, template)
        except OSError:  # another process kept its own first
            shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, pgdata, symlinks=True, dirs_exist_ok=True)
    _chown_tree(pgdata, owner)


def _chown_tree(path: Path, owner: Optional[tuple[int, int]]) -> None:
    """Give ``path`` and everything below it to ``owner`` (uid, gid); nothing when None."""
    if owner is not None:
        for root, dirs, files in os.walk(path):
            os.chown(root, *owner, follow_symlinks=False)
            for f in dirs + files:  # a link is changed itself, never what it points at
                os.chown(os.path.join(root, f), *owner, follow_symlinks=False)


def service_dir(path: Path) -> None:
    """A directory of this user that the service user passes through (0750, the service user's
    group; 0700 when they are the same user)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, -1, pwd.getpwnam(SERVICE_USER).pw_gid, follow_symlinks=False)
        localauth.restrict(path, 0o750)
    else:
        localauth.restrict(path, 0o700)


def _as_postgres(cmd: list[str], check: bool = True, stdin: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL program as the postgres user (when root: the server refuses root); the
    files it makes are 0600."""
    extra: dict[str, Any] = {"user": "postgres", "group": "postgres", "extra_groups": []} if os.geteuid() == 0 else {}
    return subprocess.run(cmd, capture_output=True, text=True, check=check, input=stdin, umask=0o077, **extra)
