"""How total recovery and verify reach a node's database: every libpq parameter of its
connection string, for psycopg (the coordinator's sessions and the diff's tasks) and for the
PostgreSQL programs (pg_dump, pg_dumpall, psql), which get the password in their environment,
never on a command line (docs/RECOVERY.md, "Authentication and TLS").

The mapping is pure (a connection string and an environment in, parameters out) so it is tested
without a server; the only I/O is reading the password file and :func:`write_private` for files
that hold secrets.

libpq semantics are kept: a parameter missing from the connection string is taken from its
environment variable (``PGPASSWORD``, ``PGSSLMODE``, ...), then a password from the password file
(``passfile``, ``PGPASSFILE`` or ``~/.pgpass``), then the default client certificate and key
(``~/.postgresql/postgresql.crt``, ``.key``) and root certificate (``root.crt``) if they exist.
The resolved values travel with the diff's tasks, which may run on executors of another host,
in another environment.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from chorus_spark.conninfo import SECRET, program_args  # noqa: F401 (program_args: also this module's API)


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


def write_private(path: Path, data: bytes | str) -> None:
    """Write a file only its owner can read (it may hold a password or a key)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.chmod(path, 0o600)


@dataclass(frozen=True)
class Endpoint:
    """A node's database as total recovery and verify reach it: ``params`` are every libpq
    parameter of its connection string, with the environment's and the password file's as libpq
    would use them. The diff's tasks may run on Spark executors on other hosts, so it is reached
    over TCP: a Unix-socket host (a directory) becomes ``127.0.0.1`` on the same port (and the
    password file is looked up for that host)."""

    name: str
    host: str
    port: int
    dbname: str = "postgres"
    user: str = "postgres"
    params: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    @property
    def libpq(self) -> dict[str, str]:
        if self.params:
            return dict(self.params)
        return {"host": self.host, "port": str(self.port), "dbname": self.dbname, "user": self.user}

    @property
    def dsn(self) -> str:
        """The connection string for psycopg (secrets included: never print it; see :func:`redact`)."""
        return make_conninfo("", **self.libpq)

    def program(self, options: str = "") -> tuple[str, dict[str, str]]:
        """(``--dbname`` value, environment to add) for pg_dump, pg_dumpall and psql."""
        return program_args(self.libpq, options)

    @classmethod
    def from_dsn(cls, name: str, dsn: str, env: Optional[Mapping[str, str]] = None) -> "Endpoint":
        """An endpoint from a libpq connection string, with libpq's environment defaults."""
        env = os.environ if env is None else env
        raw = parse_dsn(dsn)
        host = raw.get("host") or env.get("PGHOST", "")
        if not host or host.startswith("/") or "," in host:
            host = raw.get("hostaddr") or "127.0.0.1"
        raw = {k: v for k, v in raw.items() if k != "hostaddr"}
        raw["host"] = host
        params = with_environment(raw, env)
        try:
            port = int(params.get("port") or 5432)
        except ValueError as e:
            raise ConnectionSettingsError(f"the connection string {redact(dsn)!r} has a bad port") from e
        params["port"] = str(port)
        params.setdefault("user", "postgres")
        params.setdefault("dbname", params["user"])
        if "password" not in params:  # the host changed: look the password file up for this one
            found = passfile_password(params.get("passfile") or os.path.join(
                env.get("HOME", os.path.expanduser("~")), ".pgpass"), params)
            if found is not None:
                params["password"] = found
        return cls(name, host, port, params["dbname"], params["user"], tuple(sorted(params.items())))


def make_private_dir(prefix: str) -> Path:
    """A 0700 temporary directory (``tempfile.mkdtemp`` makes it so; said here on purpose)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o700)
    return d
