"""Total recovery with real authentication and TLS (docs/RECOVERY.md, "Authentication and TLS").

The cluster's PostgreSQL accepts TCP connections only over TLS, with a SCRAM password and a
client certificate (``hostssl ... scram-sha-256 clientcert=verify-full``; ``hostnossl ... reject``);
Unix-socket connections stay ``peer`` for the coordinators (the local cluster's map). ``chorus node join --total --config
FILE --donor-dsn DSN`` rebuilds a node with the donor's DSN carrying password, ``sslmode``,
``sslrootcert``, ``sslcert`` and ``sslkey``, the joiner's TCP side from the libpq environment and
a password file. A wrong password or a missing CA
fails at once, with the reason, and changes nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest
from psycopg import sql

from conftest import Cluster, chorus, extra_cluster
from test_total_recovery import join_config_node

pytest.importorskip("pyspark")

PASSWORD = "tls s3cret 'quoted'"
HBA = """local all all peer map=chorus
hostssl all all 127.0.0.1/32 scram-sha-256 clientcert=verify-full
hostnossl all all 0.0.0.0/0 reject
hostnossl all all ::/0 reject
"""


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _make_pki(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate for user postgres."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"),
             "-days", "2", "-subj", "/CN=chorus test CA")
    for name, cn, ext in (("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                          ("client", "postgres", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / f"{name}.key"), "-out",
                 str(d / f"{name}.csr"), "-subj", f"/CN={cn}")
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
                 "-CAcreateserial", "-out", str(d / f"{name}.crt"), "-days", "2", "-extfile", str(d / f"{name}.ext"))
    for f in d.iterdir():
        os.chmod(f, 0o600 if f.suffix == ".key" else 0o644)


def _require_tls(c: Cluster, pki: Path) -> None:
    for node in c.info["nodes"]:
        pgdata = Path(c.dir) / "nodes" / node["name"] / "pgdata"
        for name in ("server.crt", "server.key", "ca.crt"):
            shutil.copy(pki / name, pgdata / name)
            if os.geteuid() == 0:
                shutil.chown(pgdata / name, "postgres", "postgres")
        os.chmod(pgdata / "server.key", 0o600)
        with open(pgdata / "postgresql.conf", "a") as f:
            f.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_ca_file = 'ca.crt'\n"
                    "password_encryption = 'scram-sha-256'\n")
        (pgdata / "pg_hba.conf").write_text(HBA)
        with psycopg.connect(node["socket_dsn"], autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
    time.sleep(1)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    pki = tmp_path_factory.mktemp("pki")
    os.chmod(pki, 0o700)
    _make_pki(pki)
    with extra_cluster("chorus-tls-", 85) as c:
        with psycopg.connect(c.info["nodes"][0]["socket_dsn"], autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(PASSWORD))  # replicated to every node
        _require_tls(c, pki)
        info = dict(c.info, nodes=[dict(n, dsn=n["socket_dsn"]) for n in c.info["nodes"]])
        yield Cluster(c.dir, info), pki


def _tcp(port: int, pki: Path, **kw: str) -> str:
    p = {"host": "127.0.0.1", "port": str(port), "dbname": "postgres", "user": "postgres", "password": PASSWORD,
         "sslmode": "verify-full", "sslrootcert": str(pki / "ca.crt"), "sslcert": str(pki / "client.crt"),
         "sslkey": str(pki / "client.key"), **kw}
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in p.items() if v})


def _rows(c: Cluster, i: int) -> Any:
    with c.connect(i) as conn:
        return conn.execute("SELECT count(*), sum(hashtext(note)) FROM tls_t").fetchone()


def test_tcp_needs_tls_a_password_and_a_client_certificate(tls_cluster: tuple[Cluster, Path]) -> None:
    c, pki = tls_cluster
    port = c.info["nodes"][0]["port"]
    with psycopg.connect(_tcp(port, pki), autocommit=True) as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
    for bad in (dict(sslmode="disable"), dict(password="wr0ng-pw-x"), dict(sslcert="", sslkey="")):
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(_tcp(port, pki, **bad)).close()


def test_total_recovery_over_tls(tls_cluster: tuple[Cluster, Path], tmp_path: Path) -> None:
    c, pki = tls_cluster
    with c.connect(0) as conn:
        conn.execute("CREATE TABLE tls_t (id bigint PRIMARY KEY, note text)")
        conn.execute("INSERT INTO tls_t SELECT g, 'row ' || g FROM generate_series(1, 2000) g")
    c.quiesce()
    node = c.info["nodes"][2]
    assert chorus("local", "kill", "--dir", c.dir, node["name"], "--what", "coordinator").returncode == 0
    off = "-c chorus.capture=off -c chorus.replicate_ddl=off"
    with psycopg.connect(c.dsn(2), autocommit=True, options=off) as conn:  # drift behind Chorus's back
        conn.execute("DELETE FROM tls_t WHERE id <= 100")
        conn.execute("UPDATE tls_t SET note = 'drifted' WHERE id BETWEEN 500 AND 510")
    before = _rows(c, 2)
    donor_port = c.info["nodes"][0]["port"]
    args = [sys.executable, "-m", "chorus", "node", "join", "--total", "--config", node["config"],
            "--range-rows", "500", "--json", "--timeout", "300", "--donor-dsn"]
    passfile = tmp_path / "pgpass"
    passfile.write_text("127.0.0.1:*:*:postgres:" + PASSWORD.replace("\\", "\\\\").replace(":", "\\:") + "\n")
    os.chmod(passfile, 0o600)
    # the joiner's own TCP side (the JDBC reads, the executors' COPY) from libpq's environment
    env = dict(os.environ, PGPASSFILE=str(passfile), PGSSLMODE="verify-full", PGSSLROOTCERT=str(pki / "ca.crt"),
               PGSSLCERT=str(pki / "client.crt"), PGSSLKEY=str(pki / "client.key"))

    for dsn, reason in ((_tcp(donor_port, pki, password="wr0ng-pw-x"), "password authentication failed"),
                        (_tcp(donor_port, pki, sslrootcert=str(tmp_path / "missing-ca.crt")), "root certificate file")):
        r = subprocess.run(args + [dsn], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode != 0, r.stderr[-2000:]
        assert reason in r.stderr and "cannot connect to the donor" in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and PASSWORD not in r.stderr and "wr0ng-pw-x" not in r.stderr, r.stderr[-2000:]
        assert _rows(c, 2) == before  # nothing lost, nothing changed

    out, log = join_config_node(c.dir, node["name"], args + [_tcp(donor_port, pki)], env)
    assert PASSWORD not in log
    assert json.loads(out)["state"] == "online"
    c.assert_identical()
    assert _rows(c, 2) == _rows(c, 0)
