"""How total recovery and verify reach a node's database: every libpq parameter of its
connection string, for psycopg, for the PostgreSQL programs (pg_dump, pg_dumpall, psql) and, as
pgjdbc properties, for the Spark job's JDBC reads (docs/RECOVERY.md, "Authentication and TLS").

The mapping is pure (a connection string and an environment in, parameters out) so it is tested
without a server; the only I/O is :func:`jdbc_properties` converting a PEM client key into the
PKCS-8 DER file pgjdbc reads, and :func:`write_private` for files that hold secrets.

libpq semantics are kept: a parameter missing from the connection string is taken from its
environment variable (``PGPASSWORD``, ``PGSSLMODE``, ...), then a password from the password file
(``passfile``, ``PGPASSFILE`` or ``~/.pgpass``), then the default client certificate and key
(``~/.postgresql/postgresql.crt``, ``.key``) and root certificate (``root.crt``) if they exist.
pgjdbc does none of this by itself, so the JDBC side gets the resolved values.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


class ConnectionSettingsError(Exception):
    """A connection string or one of its files cannot be used."""


# libpq's environment variables (libpq-envars), parameter -> variable
LIBPQ_ENV = {
    "host": "PGHOST", "hostaddr": "PGHOSTADDR", "port": "PGPORT", "dbname": "PGDATABASE", "user": "PGUSER",
    "password": "PGPASSWORD", "passfile": "PGPASSFILE", "channel_binding": "PGCHANNELBINDING",
    "service": "PGSERVICE", "options": "PGOPTIONS", "application_name": "PGAPPNAME",
    "sslmode": "PGSSLMODE", "sslcompression": "PGSSLCOMPRESSION", "sslcert": "PGSSLCERT", "sslkey": "PGSSLKEY",
    "sslrootcert": "PGSSLROOTCERT", "sslcrl": "PGSSLCRL", "sslcrldir": "PGSSLCRLDIR", "sslsni": "PGSSLSNI",
    "requirepeer": "PGREQUIREPEER", "ssl_min_protocol_version": "PGSSLMINPROTOCOLVERSION",
    "ssl_max_protocol_version": "PGSSLMAXPROTOCOLVERSION", "gssencmode": "PGGSSENCMODE",
    "krbsrvname": "PGKRBSRVNAME", "gsslib": "PGGSSLIB", "connect_timeout": "PGCONNECT_TIMEOUT",
    "client_encoding": "PGCLIENTENCODING", "target_session_attrs": "PGTARGETSESSIONATTRS",
}

# parameters that are secret: never on a command line, never in a message
SECRET = frozenset({"password", "sslpassword"})

# libpq parameter -> pgjdbc property, where the name differs or the value passes as is
# (pgjdbc 42.x, "Connection Parameters"); sslmode, sslkey and options are handled apart
_JDBC_SAME = {"user": "user", "password": "password", "sslrootcert": "sslrootcert", "sslcert": "sslcert",
              "sslpassword": "sslpassword", "application_name": "ApplicationName",
              "connect_timeout": "connectTimeout", "gssencmode": "gssEncMode", "krbsrvname": "kerberosServerName",
              "target_session_attrs": "targetServerType", "channel_binding": "channelBinding",
              "options": "options"}
_JDBC_SSLMODES = {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}
# libpq target_session_attrs -> pgjdbc targetServerType
_TARGET = {"any": "any", "read-write": "primary", "primary": "primary", "read-only": "secondary",
           "standby": "secondary", "prefer-standby": "preferSecondary"}


def parse_dsn(dsn: str) -> dict[str, str]:
    """A libpq connection string (key=value or URI) as a dict; the error names the string with
    its password hidden."""
    try:
        return {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    except psycopg.ProgrammingError as e:
        raise ConnectionSettingsError(f"cannot parse the connection string {redact(dsn)!r}: {e}") from e


def redact(dsn: str) -> str:
    """A connection string with its secrets replaced by ``***`` (for messages)."""
    try:
        d = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(a connection string that does not parse)"
    return make_conninfo("", **{k: ("***" if k in SECRET else v) for k, v in d.items()})


def with_environment(params: Mapping[str, str], env: Mapping[str, str], home: Optional[str] = None) -> dict[str, str]:
    """The parameters as libpq would use them: the connection string's, then for each one it
    does not set the environment variable's, then a password from the password file, then the
    default client certificate, key and root certificate files where they exist."""
    out = dict(params)
    for param, var in LIBPQ_ENV.items():
        if param not in out and env.get(var):
            out[param] = env[var]
    home = home if home is not None else env.get("HOME", os.path.expanduser("~"))
    if "password" not in out:
        passfile = out.get("passfile") or os.path.join(home, ".pgpass")
        found = passfile_password(passfile, out)
        if found is not None:
            out["password"] = found
    pgdir = os.path.join(home, ".postgresql")
    for param, name in (("sslcert", "postgresql.crt"), ("sslkey", "postgresql.key"), ("sslrootcert", "root.crt")):
        default = os.path.join(pgdir, name)
        if param not in out and os.path.exists(default):
            out[param] = default
    return out


def passfile_password(path: str, params: Mapping[str, str]) -> Optional[str]:
    """The password the libpq password file at ``path`` gives for these parameters, if any
    (``hostname:port:database:username:password``, ``*`` matches anything, ``\\`` escapes; a
    Unix-socket host matches ``localhost``). libpq ignores a file others can read; so does this."""
    try:
        st = os.stat(path)
        if st.st_mode & 0o077:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return match_passfile(text, params)


def match_passfile(text: str, params: Mapping[str, str]) -> Optional[str]:
    host = params.get("host") or "localhost"
    if host.startswith("/"):
        host = "localhost"
    want = [host, params.get("port") or "5432", params.get("dbname") or params.get("user") or "",
            params.get("user") or ""]
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = _passfile_fields(line)
        if len(fields) < 5:
            continue
        if all(f == "*" or f == w for f, w in zip(fields[:4], want)):
            return fields[4]
    return None


def _passfile_fields(line: str) -> list[str]:
    fields: list[str] = []
    cur: list[str] = []
    esc = False
    for ch in line:
        if esc:
            cur.append(ch)
            esc = False
        elif ch == "\\":
            esc = True
        elif ch == ":" and len(fields) < 4:
            fields.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    fields.append("".join(cur))
    return fields


def program_args(params: Mapping[str, str], options: str = "") -> tuple[str, dict[str, str]]:
    """How a PostgreSQL program (pg_dump, pg_dumpall, psql) gets these parameters: a connection
    string for ``--dbname`` without the secrets, and environment variables with them (an
    environment is readable only by the process's own user; a command line by everyone).
    ``options`` is added to the server options (``-c name=value ...``)."""
    visible = {k: v for k, v in params.items() if k not in SECRET}
    if options:
        visible["options"] = f"{visible['options']} {options}" if visible.get("options") else options
    env = {}
    if "password" in params:
        env["PGPASSWORD"] = params["password"]
    if "sslpassword" in params:  # libpq has no variable for it: keep it in the string then
        visible["sslpassword"] = params["sslpassword"]
    return make_conninfo(**visible), env


def jdbc_url(host: str, port: int, dbname: str) -> str:
    h = f"[{host}]" if ":" in host else host
    return f"jdbc:postgresql://{h}:{port}/{dbname}"


def jdbc_mapping(params: Mapping[str, str]) -> dict[str, str]:
    """pgjdbc properties for the libpq parameters (``sslkey`` as given: see
    :func:`jdbc_properties` for its conversion). Parameters pgjdbc has no equivalent for are
    left out; host, port and dbname are in the URL."""
    props: dict[str, str] = {}
    for k, v in params.items():
        if k in _JDBC_SAME:
            props[_JDBC_SAME[k]] = _TARGET.get(v, v) if k == "target_session_attrs" else v
    mode = params.get("sslmode")
    if mode is not None:
        if mode not in _JDBC_SSLMODES:
            raise ConnectionSettingsError(f"unknown sslmode {mode!r}")
        props["sslmode"] = mode
        props["ssl"] = "false" if mode == "disable" else "true"
    if "sslkey" in params:
        props["sslkey"] = params["sslkey"]
    return props


def write_private(path: Path, data: bytes | str) -> None:
    """Write a file only its owner can read (it may hold a password or a key)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.chmod(path, 0o600)


def jdbc_properties(params: Mapping[str, str], workdir: Path) -> dict[str, str]:
    """pgjdbc properties for these parameters. pgjdbc reads a client key only as PKCS-8 DER
    (``.pk8``) or PKCS-12 (``.p12``, ``.pfx``): a PEM key (libpq's format) is converted with
    ``openssl pkcs8`` into a 0600 file in ``workdir`` (decrypted with ``sslpassword`` if it has one)."""
    props = jdbc_mapping(params)
    key = props.get("sslkey")
    if key and not key.endswith((".pk8", ".p12", ".pfx", ".der")):
        out = workdir / f"client-{abs(hash(key)) % 10**8}.pk8"
        env = dict(os.environ, CHORUS_KEY_PASS=params.get("sslpassword", ""))
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)
        r = subprocess.run(["openssl", "pkcs8", "-topk8", "-inform", "PEM", "-outform", "DER", "-nocrypt",
                            "-passin", "env:CHORUS_KEY_PASS", "-in", key, "-out", str(out)],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise ConnectionSettingsError(f"cannot convert the client key {key} for JDBC: {r.stderr.strip()}")
        props["sslkey"] = str(out)
        props.pop("sslpassword", None)
    return props


@dataclass(frozen=True)
class Endpoint:
    """A node's database as total recovery and verify reach it. ``params`` are every libpq
    parameter of its connection string (the environment's and password file's included, as
    libpq would use them); psycopg and the PostgreSQL programs connect with them as they are. The
    JDBC reads need TCP: a Unix-socket host (a directory) becomes ``127.0.0.1`` on the same port
    for them (``host``), and the executors' COPY into the joiner goes there too."""

    name: str
    host: str
    port: int
    dbname: str = "postgres"
    user: str = "postgres"
    params: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    tcp_params: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    @property
    def libpq(self) -> dict[str, str]:
        """Every libpq parameter (the original host: a Unix socket stays one)."""
        if self.params:
            return dict(self.params)
        return {"host": self.host, "port": str(self.port), "dbname": self.dbname, "user": self.user}

    @property
    def dsn(self) -> str:
        """The connection string for psycopg (secrets included: never print it; see :func:`redact`)."""
        return make_conninfo(**self.libpq)

    @property
    def tcp(self) -> dict[str, str]:
        """The parameters with the TCP host the JDBC reads use (a password file looked up for
        that host)."""
        if self.tcp_params:
            return dict(self.tcp_params)
        return {**self.libpq, "host": self.host, "port": str(self.port)}

    @property
    def tcp_dsn(self) -> str:
        return make_conninfo(**self.tcp)

    def copy_dsn(self, options: str) -> str:
        """The connection string the Spark executors COPY into this node with (TCP, every
        parameter, ``options`` added to the server options)."""
        p = self.tcp
        p["options"] = f"{p['options']} {options}" if p.get("options") else options
        return make_conninfo(**p)

    @property
    def jdbc(self) -> str:
        return jdbc_url(self.host, self.port, self.dbname)

    def program(self, options: str = "") -> tuple[str, dict[str, str]]:
        """(``--dbname`` value, environment to add) for pg_dump, pg_dumpall and psql."""
        return program_args(self.libpq, options)

    @classmethod
    def from_dsn(cls, name: str, dsn: str, env: Optional[Mapping[str, str]] = None) -> "Endpoint":
        """An endpoint from a libpq connection string, with libpq's environment defaults."""
        env = os.environ if env is None else env
        raw = parse_dsn(dsn)
        params = with_environment(raw, env)
        host = params.get("host", "")
        tcp_host = host
        if not host or host.startswith("/") or "," in host:
            tcp_host = params.get("hostaddr") or "127.0.0.1"
        try:
            port = int(params.get("port") or 5432)
        except ValueError as e:
            raise ConnectionSettingsError(f"the connection string {redact(dsn)!r} has a bad port") from e
        params.setdefault("port", str(port))
        params.setdefault("user", "postgres")
        params.setdefault("dbname", params["user"])
        tcp = with_environment({**{k: v for k, v in raw.items() if k != "hostaddr"}, "host": tcp_host,
                                "port": str(port), "user": params["user"], "dbname": params["dbname"]}, env)
        return cls(name, tcp_host, port, params["dbname"], params["user"], tuple(sorted(params.items())),
                   tuple(sorted(tcp.items())))

    def source(self, workdir: Path, snap: Any = None) -> dict[str, Any]:
        """The Spark job's description of this side (its JDBC properties hold the password: the
        plan is written 0600 in a 0700 directory)."""
        props = jdbc_properties(self.tcp, workdir)
        return {"name": self.name, "url": self.jdbc, "user": self.user, "properties": props,
                "snapshot": snap.name if snap else None, "gid": snap.gid if snap else None,
                "snapshot_text": snap.text if snap else None}


def make_private_dir(prefix: str) -> Path:
    """A 0700 temporary directory (``tempfile.mkdtemp`` makes it so; said here on purpose)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o700)
    return d
