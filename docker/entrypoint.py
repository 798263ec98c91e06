"""The entrypoint of a Chorus node container (docs/DOCKER.md).

``entrypoint.py`` (no argument) runs the node: it writes Corosync's configuration, PostgreSQL's
settings and ``chorus.toml`` from the environment, initialises PostgreSQL on the first start,
then starts Corosync (as root), PostgreSQL and the coordinator (as ``postgres``) and watches
them. SIGTERM or SIGINT stops them in the reverse order, each by its pid: the coordinator first
(it leaves the group gracefully), then PostgreSQL (fast shutdown), then Corosync. If one of them
exits on its own the others are stopped too and the container exits (its restart policy decides
what happens next); a coordinator that left the cluster on request (exit status 0) ends the
container with status 0.

``entrypoint.py ready`` exits 0 when the node's coordinator is online (for a health check),
``entrypoint.py config`` prints the files the entrypoint would write, without writing them.

It runs as root (PID 1): Corosync needs it, and the entrypoint reaps every orphan the container
collects. The settings are read by :func:`settings_from_env` and the files rendered by pure
functions, tested without a container in tests/unit/test_docker_entrypoint.py.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Optional

from chorus.config import ChorusConfigError, NodeConfig, load_config, write_config
from chorus.state import load_state, save_state

PGBIN = Path("/usr/lib/postgresql/15/bin")
SERVICE_USER = "postgres"
COROSYNC = "/usr/sbin/corosync"
METRICS_MARK = "# added by the container entrypoint because CHORUS_METRICS_LISTEN is set"


class EntrypointError(Exception):
    """The environment or the node's files do not allow it to start (said in the message)."""


class Stop(Exception):
    """SIGTERM or SIGINT arrived while the node was starting."""


@dataclass(frozen=True)
class Peer:
    node_id: int
    name: str
    address: str


@dataclass(frozen=True)
class Settings:
    name: str
    node_id: int
    peers: tuple[Peer, ...]
    cluster_name: str = "chorus"
    bootstrap: bool = False
    pg_port: int = 5432
    recovery_port: int = 7433
    metrics_listen: str = ""
    recovery_partners: tuple[str, ...] = ()
    log_level: str = "info"
    apply_workers: int = 4
    log_segment_mb: int = 64
    log_total_mb: int = 4096
    authkey_file: str = "/run/secrets/corosync-authkey"
    tls_cert_file: str = "/run/secrets/chorus-cluster.crt"
    tls_key_file: str = "/run/secrets/chorus-cluster.key"
    secret_file: str = "/run/secrets/chorus-cluster.secret"
    password_file: str = "/run/secrets/postgres-password"
    data_root: str = "/var/lib/chorus"
    run_dir: str = "/run/chorus"
    config_dir: str = "/etc/chorus"
    corosync_dir: str = "/etc/corosync"

    @property
    def me(self) -> Peer:
        return next(p for p in self.peers if p.node_id == self.node_id)

    @property
    def pgdata(self) -> str:
        return os.path.join(self.data_root, "pgdata")

    @property
    def node_dir(self) -> str:
        """The coordinator's data_dir: state file, writeset log, spool."""
        return os.path.join(self.data_root, "node")

    @property
    def keys_dir(self) -> str:
        return os.path.join(self.config_dir, "keys")

    @property
    def config_path(self) -> str:
        return os.path.join(self.config_dir, "chorus.toml")


def _int(env: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EntrypointError(f"{key}={raw!r}: expected a whole number") from None
    if not low <= value <= high:
        raise EntrypointError(f"{key}={value}: expected {low} to {high}")
    return value


def _flag(env: Mapping[str, str], key: str) -> bool:
    raw = env.get(key, "").strip().lower()
    if raw in ("", "0", "no", "false", "off"):
        return False
    if raw in ("1", "yes", "true", "on"):
        return True
    raise EntrypointError(f"{key}={raw!r}: expected 1 or 0")


def parse_peers(text: str) -> tuple[Peer, ...]:
    """``CHORUS_PEERS``: every node of the cluster, this one too, as ``ID:NAME:ADDRESS`` items
    separated by commas or spaces (an IPv6 address may follow the second colon as it is)."""
    peers: list[Peer] = []
    for item in text.replace(",", " ").split():
        parts = item.split(":", 2)
        if len(parts) != 3 or not all(parts):
            raise EntrypointError(f"CHORUS_PEERS: {item!r} is not ID:NAME:ADDRESS")
        raw_id, name, address = parts
        try:
            node_id = int(raw_id)
        except ValueError:
            raise EntrypointError(f"CHORUS_PEERS: {item!r}: the node id must be a whole number") from None
        if not 1 <= node_id <= 1024:
            raise EntrypointError(f"CHORUS_PEERS: {item!r}: node ids are 1 to 1024")
        if not name.replace("-", "").replace("_", "").isalnum():
            raise EntrypointError(f"CHORUS_PEERS: {item!r}: a node name is letters, digits, '-' and '_'")
        if address.startswith("[") and address.endswith("]"):
            address = address[1:-1]
        peers.append(Peer(node_id, name, address))
    if not peers:
        raise EntrypointError("CHORUS_PEERS is empty: list every node as ID:NAME:ADDRESS")
    for what, values in (("node id", [p.node_id for p in peers]), ("name", [p.name for p in peers]),
                         ("address", [p.address for p in peers])):
        dup = {v for v in values if values.count(v) > 1}
        if dup:
            raise EntrypointError(f"CHORUS_PEERS: {what} {sorted(map(str, dup))[0]} appears twice")
    return tuple(sorted(peers, key=lambda p: p.node_id))


def settings_from_env(env: Mapping[str, str]) -> Settings:
    """The node's settings from the container's environment (docs/DOCKER.md lists them)."""
    name = env.get("CHORUS_NODE_NAME", "").strip()
    if not name:
        raise EntrypointError("CHORUS_NODE_NAME is not set (this node's name, e.g. n1)")
    if "CHORUS_NODE_ID" not in env:
        raise EntrypointError("CHORUS_NODE_ID is not set (this node's number, 1 to 16: its Corosync "
                              "node id and its sequence residue class)")
    node_id = _int(env, "CHORUS_NODE_ID", 0, 1, 16)
    peers = parse_peers(env.get("CHORUS_PEERS", ""))
    mine = [p for p in peers if p.node_id == node_id]
    if not mine:
        raise EntrypointError(f"CHORUS_PEERS has no entry for this node's id {node_id}")
    if mine[0].name != name:
        raise EntrypointError(f"CHORUS_PEERS names node {node_id} {mine[0].name!r}, CHORUS_NODE_NAME says {name!r}")
    if max(p.node_id for p in peers) > 16:
        raise EntrypointError("CHORUS_PEERS: node ids are 1 to 16 (chorus.max_nodes)")
    cluster = env.get("CHORUS_CLUSTER_NAME", "chorus").strip() or "chorus"
    if len(cluster) > 30 or not cluster.replace("-", "").replace("_", "").isalnum():
        raise EntrypointError(f"CHORUS_CLUSTER_NAME={cluster!r}: up to 30 letters, digits, '-' and '_'")
    level = env.get("CHORUS_LOG_LEVEL", "info").strip().lower() or "info"
    if level not in ("debug", "info", "warning", "error"):
        raise EntrypointError(f"CHORUS_LOG_LEVEL={level!r}: expected debug, info, warning or error")
    segment = _int(env, "CHORUS_LOG_SEGMENT_MB", 64, 1, 1024)
    total = _int(env, "CHORUS_LOG_TOTAL_MB", 4096, 2, 1 << 20)
    if total < 2 * segment:
        raise EntrypointError("CHORUS_LOG_TOTAL_MB must hold at least two segments of CHORUS_LOG_SEGMENT_MB")
    partners = tuple(p for p in env.get("CHORUS_RECOVERY_PARTNERS", "").replace(",", " ").split())
    unknown = [p for p in partners if p not in {x.name for x in peers}]
    if unknown:
        raise EntrypointError(f"CHORUS_RECOVERY_PARTNERS: {unknown[0]!r} is not in CHORUS_PEERS")
    s = Settings(
        name=name, node_id=node_id, peers=peers, cluster_name=cluster,
        bootstrap=_flag(env, "CHORUS_BOOTSTRAP"),
        recovery_port=_int(env, "CHORUS_RECOVERY_PORT", 7433, 1, 65535),
        metrics_listen=env.get("CHORUS_METRICS_LISTEN", "").strip(),
        recovery_partners=partners, log_level=level,
        apply_workers=_int(env, "CHORUS_APPLY_WORKERS", 4, 1, 64),
        log_segment_mb=segment, log_total_mb=total,
    )
    files = {"authkey_file": "CHORUS_COROSYNC_AUTHKEY_FILE", "tls_cert_file": "CHORUS_TLS_CERT_FILE",
             "tls_key_file": "CHORUS_TLS_KEY_FILE", "secret_file": "CHORUS_SECRET_FILE",
             "password_file": "POSTGRES_PASSWORD_FILE"}
    return replace(s, **{field: env[key] for field, key in files.items() if env.get(key)})


# ---- the files ------------------------------------------------------------------------------


def corosync_conf(s: Settings) -> str:
    """Corosync over knet, encrypted and authenticated with the cluster's key; logs to stderr
    (the container's log). Options as in the lab rig (chorus/testkit/lab/rig.py), which explains them."""
    nodes = "".join(f"  node {{\n    nodeid: {p.node_id}\n    name: {p.name}\n    ring0_addr: {p.address}\n  }}\n"
                    for p in s.peers)
    return (
        "# written by the Chorus container entrypoint at every start (from CHORUS_PEERS)\n"
        "system {\n  sched_rr: no\n"
        f"  state_dir: {os.path.join(s.data_root, 'corosync')}\n}}\n"
        "totem {\n  version: 2\n"
        f"  cluster_name: {s.cluster_name}\n"
        "  transport: knet\n  crypto_cipher: aes256\n  crypto_hash: sha256\n"
        f"  keyfile: {os.path.join(s.corosync_dir, 'authkey')}\n"
        "  token: 3000\n  token_retransmits_before_loss_const: 8\n"
        "  interface {\n    linknumber: 0\n    knet_ping_interval: 250\n    knet_ping_timeout: 2500\n"
        "    knet_pong_count: 1\n  }\n}\n"
        "logging {\n  to_stderr: yes\n  to_logfile: no\n  to_syslog: no\n  timestamp: on\n}\n"
        "quorum {\n  provider: corosync_votequorum\n  auto_tie_breaker: 1\n  auto_tie_breaker_node: lowest\n}\n"
        f"nodelist {{\n{nodes}}}\n"
        f"uidgid {{\n  uid: {SERVICE_USER}\n  gid: {SERVICE_USER}\n}}\n"
    )


def postgres_conf(s: Settings) -> str:
    """The settings Chorus needs, in a file postgresql.conf includes (rewritten at every start;
    change other settings with ALTER SYSTEM or in postgresql.conf on the volume)."""
    return (
        "# written by the Chorus container entrypoint at every start\n"
        "listen_addresses = '*'\n"
        f"port = {s.pg_port}\n"
        f"unix_socket_directories = '{s.run_dir}'\n"
        "shared_preload_libraries = 'chorus'\n"
        f"chorus.socket_path = '{os.path.join(s.run_dir, 'chorus.sock')}'\n"
        f"chorus.node_number = {s.node_id}\n"
        "password_encryption = 'scram-sha-256'\n"
    )


PG_HBA = """# written by the Chorus container entrypoint when it created the database
# TYPE  DATABASE  USER  ADDRESS    METHOD
local   all       all              peer
host    all       all   0.0.0.0/0  scram-sha-256
host    all       all   ::/0       scram-sha-256
"""


def node_config(s: Settings) -> NodeConfig:
    me = s.me
    advertise = f"[{me.address}]:{s.recovery_port}" if ":" in me.address else f"{me.address}:{s.recovery_port}"
    keys = s.keys_dir
    return NodeConfig(
        name=s.name, dsn=f"host={s.run_dir} port={s.pg_port} dbname=postgres user=postgres",
        socket_path=os.path.join(s.run_dir, "chorus.sock"), admin_socket=os.path.join(s.run_dir, "admin.sock"),
        state_file=os.path.join(s.node_dir, "state.json"), data_dir=s.node_dir, cluster_group=s.cluster_name,
        apply_workers=s.apply_workers, log_level=s.log_level, log_segment_mb=s.log_segment_mb,
        log_total_mb=s.log_total_mb, recovery_listen=f"0.0.0.0:{s.recovery_port}", recovery_advertise=advertise,
        tls_cert=os.path.join(keys, "cluster.crt"), tls_key=os.path.join(keys, "cluster.key"),
        secret_file=os.path.join(keys, "cluster.secret"), recovery_partners=s.recovery_partners)


def metrics_section(listen: str) -> str:
    return f"\n{METRICS_MARK}\n[metrics]\nlisten = \"{listen}\"\n"


def write_chorus_toml(s: Settings, path: str, warn: Callable[[str], None]) -> None:
    """chorus.toml for this node; ``[metrics]`` only when CHORUS_METRICS_LISTEN is set and this
    coordinator's configuration accepts the section (it is checked by loading the file)."""
    write_config(node_config(s), path)
    if not s.metrics_listen:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(metrics_section(s.metrics_listen))
    try:
        load_config(path)
    except ChorusConfigError as e:
        write_config(node_config(s), path)
        warn(f"CHORUS_METRICS_LISTEN={s.metrics_listen} is ignored: this coordinator does not take a "
             f"[metrics] section ({e})")


# ---- processes ------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"chorus-entrypoint: {msg}", file=sys.stderr, flush=True)


class Supervisor:
    """Starts the node's processes, reaps every child of PID 1, stops them by pid."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.pw = pwd.getpwnam(SERVICE_USER)
        self.children: dict[str, int] = {}  # name -> pid, in start order
        # kept referenced: a Popen collected while its process runs is reaped by the next
        # subprocess call, and its exit would go unseen here
        self.procs: list[subprocess.Popen[bytes]] = []
        self.exited: dict[int, int] = {}  # pid -> exit status, of the tracked children
        self.stop_requested = False
        self.stop_signal = 0

    # -- signals and reaping
    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop_requested = True
        self.stop_signal = signum

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def reap(self) -> None:
        tracked = set(self.children.values())
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in tracked:
                self.exited[pid] = os.waitstatus_to_exitcode(status)

    def alive(self, name: str) -> bool:
        pid = self.children.get(name, 0)
        return pid > 0 and pid not in self.exited

    def _check(self) -> None:
        if self.stop_requested:
            raise Stop()
        self.reap()

    # -- running things
    def _as_service(self) -> dict[str, object]:
        return {"user": self.pw.pw_uid, "group": self.pw.pw_gid, "extra_groups": [],
                "env": {**os.environ, "HOME": self.pw.pw_dir, "USER": SERVICE_USER, "LOGNAME": SERVICE_USER}}

    def run(self, cmd: list[str], what: str, as_service: bool = True, timeout: float = 300) -> str:
        kw = self._as_service() if as_service else {}
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                           **kw)
        if p.returncode != 0:
            raise EntrypointError(f"{what} failed (exit {p.returncode}):\n{(p.stderr or p.stdout).strip()}")
        return str(p.stdout)

    def spawn(self, name: str, cmd: list[str], as_service: bool, cwd: Optional[str] = None) -> None:
        kw = self._as_service() if as_service else {}
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, cwd=cwd, **kw)
        self.procs.append(p)
        self.children[name] = p.pid
        log(f"started {name} (pid {p.pid})")

    def wait_for(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check()
            if not self.alive(name):
                raise EntrypointError(f"{name} exited during start-up (status {self.exited.get(self.children[name])})")
            if ready():
                return
            if time.monotonic() > deadline:
                raise EntrypointError(f"{name} was not ready after {timeout:.0f} s")
            time.sleep(0.3)

    # -- the node's files
    def _chown(self, path: str, mode: int) -> None:
        os.chown(path, self.pw.pw_uid, self.pw.pw_gid)
        os.chmod(path, mode)

    def _install_secret(self, src: str, dst: str, owner_service: bool, what: str) -> None:
        try:
            data = Path(src).read_bytes()
        except OSError as e:
            raise EntrypointError(f"{what}: cannot read {src} ({e.strerror}); see docs/DOCKER.md, \"Secrets\"") from None
        tmp = f"{dst}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if owner_service:
            os.chown(tmp, self.pw.pw_uid, self.pw.pw_gid)
        os.chmod(tmp, 0o400)
        os.replace(tmp, dst)

    def prepare(self) -> None:
        s = self.s
        for d, mode in ((s.data_root, 0o700), (s.node_dir, 0o700), (s.run_dir, 0o700)):
            os.makedirs(d, exist_ok=True)
            self._chown(d, mode)
        os.makedirs(os.path.join(s.data_root, "corosync"), mode=0o700, exist_ok=True)
        os.makedirs(s.corosync_dir, exist_ok=True)
        os.chmod(s.corosync_dir, 0o755)
        self._install_secret(s.authkey_file, os.path.join(s.corosync_dir, "authkey"), False,
                             "the cluster's Corosync key (CHORUS_COROSYNC_AUTHKEY_FILE)")
        conf = os.path.join(s.corosync_dir, "corosync.conf")
        Path(conf).write_text(corosync_conf(s))
        os.chmod(conf, 0o644)
        os.makedirs(s.keys_dir, exist_ok=True)
        self._chown(s.config_dir, 0o755)
        self._chown(s.keys_dir, 0o700)
        for src, name, what in ((s.tls_cert_file, "cluster.crt", "CHORUS_TLS_CERT_FILE"),
                                (s.tls_key_file, "cluster.key", "CHORUS_TLS_KEY_FILE"),
                                (s.secret_file, "cluster.secret", "CHORUS_SECRET_FILE")):
            self._install_secret(src, os.path.join(s.keys_dir, name), True,
                                 f"the cluster's recovery {name.split('.')[1]} ({what})")
        write_chorus_toml(s, s.config_path, log)
        self._chown(s.config_path, 0o600)
        if not os.path.exists(os.path.join(s.pgdata, "PG_VERSION")):
            self._initdb()
        pgconf = os.path.join(s.pgdata, "chorus-container.conf")
        Path(pgconf).write_text(postgres_conf(s))
        self._chown(pgconf, 0o600)

    def _initdb(self) -> None:
        s = self.s
        log(f"creating the database cluster in {s.pgdata}")
        cmd = [str(PGBIN / "initdb"), "-D", s.pgdata, "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8",
               "--auth-local=peer", "--auth-host=scram-sha-256"]
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o700)
            os.chown(tmp, self.pw.pw_uid, self.pw.pw_gid)
            if os.path.exists(s.password_file):
                pwfile = os.path.join(tmp, "pw")
                self._install_secret(s.password_file, pwfile, True, "POSTGRES_PASSWORD_FILE")
                cmd.append(f"--pwfile={pwfile}")
            else:
                log(f"no {s.password_file}: the postgres role has no password, so it cannot log in over TCP")
            self.run(cmd, "initdb")
        Path(s.pgdata, "pg_hba.conf").write_text(PG_HBA)
        self._chown(os.path.join(s.pgdata, "pg_hba.conf"), 0o600)
        with open(os.path.join(s.pgdata, "postgresql.conf"), "a", encoding="utf-8") as f:
            f.write("\n# Chorus: the settings the container entrypoint writes at every start\n"
                    "include = 'chorus-container.conf'\n")

    # -- start, watch, stop
    def start(self) -> None:
        s = self.s
        self.spawn("corosync", [COROSYNC, "-f", "-c", os.path.join(s.corosync_dir, "corosync.conf")], False)
        # 0: quorate, 2: running but not quorate yet
        self.wait_for("corosync", lambda: subprocess.run(["corosync-quorumtool", "-s"], capture_output=True,
                                                         timeout=10).returncode in (0, 2), 60)
        self.spawn("postgres", [str(PGBIN / "postgres"), "-D", s.pgdata], True)
        isready = [str(PGBIN / "pg_isready"), "-q", "-h", s.run_dir, "-p", str(s.pg_port), "-U", "postgres",
                   "-d", "postgres"]
        self.wait_for("postgres", lambda: subprocess.run(isready, timeout=10, **self._as_service()).returncode == 0,
                      3600)  # crash recovery may take long
        self.run([str(PGBIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", s.run_dir, "-p", str(s.pg_port),
                  "-U", "postgres", "-d", "postgres", "-c", "CREATE EXTENSION IF NOT EXISTS chorus"],
                 "CREATE EXTENSION chorus")
        self._plan_bootstrap()
        self.spawn("coordinator", [sys.executable, "-m", "chorus", "run", "--config", s.config_path], True,
                   cwd=s.node_dir)

    def _plan_bootstrap(self) -> None:
        """Bootstrap when CHORUS_BOOTSTRAP asks for it and the node never belonged to a cluster
        (its first start), or when the node left its cluster last (as `chorus local up` does)."""
        cfg = node_config(self.s)
        st = load_state(cfg.state_file, cfg.name)
        if st.left_by_vote:
            return  # the coordinator refuses to start and says why
        if (self.s.bootstrap and not st.cluster_uuid) or st.safe_to_bootstrap:
            why = "it left its cluster last" if st.cluster_uuid else "CHORUS_BOOTSTRAP is set and it is new"
            log(f"this node bootstraps the cluster when its coordinator starts ({why})")
            save_state(cfg.state_file, st.with_(bootstrap=True))
            self._chown(cfg.state_file, 0o600)

    def watch(self) -> int:
        """Until a signal or a child's exit; the container's exit status."""
        while True:
            if self.stop_requested:
                log(f"signal {signal.Signals(self.stop_signal).name}: stopping the node")
                self.stop()
                return 0
            self.reap()
            for name, pid in self.children.items():
                if pid in self.exited:
                    status = self.exited[pid]
                    log(f"{name} (pid {pid}) exited with status {status}: stopping the node")
                    self.stop()
                    return 0 if name == "coordinator" and status == 0 else 1
            time.sleep(0.2)

    def _signal(self, name: str, sig: int) -> None:
        if self.alive(name):
            try:
                os.kill(self.children[name], sig)
            except ProcessLookupError:
                pass

    def _stop_one(self, name: str, steps: list[tuple[int, float]]) -> None:
        for sig, wait in steps:
            if not self.alive(name):
                return
            self._signal(name, sig)
            deadline = time.monotonic() + wait
            while self.alive(name) and time.monotonic() < deadline:
                self.reap()
                time.sleep(0.1)
        if self.alive(name):
            log(f"{name} (pid {self.children[name]}) did not stop")

    def stop(self) -> None:
        # the coordinator first: it commits what is certified and leaves the group; PostgreSQL
        # fast shutdown (SIGINT), then immediate (SIGQUIT); Corosync last
        self._stop_one("coordinator", [(signal.SIGTERM, 40), (signal.SIGKILL, 5)])
        self._stop_one("postgres", [(signal.SIGINT, 60), (signal.SIGQUIT, 10), (signal.SIGKILL, 5)])
        self._stop_one("corosync", [(signal.SIGTERM, 20), (signal.SIGKILL, 5)])
        self.reap()
        log("stopped")


def ready(s: Settings) -> int:
    from chorus.admin import admin_request

    try:
        st = admin_request(node_config(s).admin_socket, timeout=3)["status"]
    except (OSError, ValueError, KeyError) as e:
        print(f"not ready: the coordinator does not answer ({e})")
        return 1
    print(f"{st['state']}: {st['reason']}")
    return 0 if st["state"] == "online" else 1


def show_config(s: Settings) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "chorus.toml")
        write_chorus_toml(s, path, log)
        toml = Path(path).read_text()
    for title, text in (("corosync.conf", corosync_conf(s)), ("chorus.toml", toml),
                        ("chorus-container.conf (PostgreSQL)", postgres_conf(s))):
        print(f"# ---- {title}\n{text}")
    return 0


def main(argv: list[str]) -> int:
    try:
        s = settings_from_env(os.environ)
    except EntrypointError as e:
        log(f"error: {e}")
        return 2
    command = argv[1] if len(argv) > 1 else "run"
    if command == "ready":
        return ready(s)
    if command == "config":
        return show_config(s)
    if command != "run":
        log(f"unknown command {command!r} (run, ready, config)")
        return 2
    if os.getuid() != 0:
        log("error: the entrypoint runs as root (it starts Corosync; PostgreSQL and the coordinator run as postgres)")
        return 2
    sup = Supervisor(s)
    sup.install_signals()
    log(f"node {s.name} (id {s.node_id}) of cluster {s.cluster_name}: "
        + json.dumps({p.name: p.address for p in s.peers}))
    try:
        sup.prepare()
        sup.start()
    except Stop:
        log("stopped while starting")
        sup.stop()
        return 0
    except (EntrypointError, OSError, subprocess.SubprocessError) as e:
        log(f"error: {e}")
        sup.stop()
        return 1
    return sup.watch()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
