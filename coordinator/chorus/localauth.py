"""Who may connect to a local cluster's PostgreSQL (and to the benchmarks' plain one), and how
the files that hold its secrets are written (docs/OPERATIONS.md, "Local clusters: access").

- **TCP** (PostgreSQL listens on 127.0.0.1 only): ``scram-sha-256``. The ``postgres`` role's
  password is generated when the cluster is made (or first started by a version that has this
  module) and kept in a libpq password file in the cluster's directory, 0600, owned by the user
  who runs ``chorus local``: the DSNs the cluster prints name it (``passfile=...``, or
  ``PGPASSFILE=...`` before ``psql``). The server is sent the SCRAM verifier, never the password.
- **Unix socket**: ``peer``, through the ident map ``chorus``: the service user (the
  coordinators, as ``postgres``) and the user who runs ``chorus local`` (root, whose commands
  such as ``chorus sql`` use the socket) connect as the ``postgres`` role, nobody else; the
  socket's directory is 0700 besides.

What can be is text in, text out (tested without a server); the I/O is writing files privately.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import shlex
from pathlib import Path
from typing import Iterable, Optional

from psycopg.conninfo import make_conninfo

IDENT_MAP = "chorus"
HBA_MARKER = "# --- chorus local cluster: authentication ---"
IDENT_MARKER = "# --- chorus local cluster: who connects as postgres over the Unix socket ---"

HBA = f"""{HBA_MARKER}
# Unix socket: peer, and only the OS users of pg_ident.conf's map "{IDENT_MAP}" (the service user,
# the user who runs `chorus local`) as the postgres role; the socket's directory is 0700 too.
local   all          all                         peer map={IDENT_MAP}
local   replication  all                         peer map={IDENT_MAP}
# TCP on loopback: a SCRAM password (the postgres role's is in the cluster's password file).
host    all          all          127.0.0.1/32   scram-sha-256
host    replication  all          127.0.0.1/32   scram-sha-256
"""

# appended to postgresql.conf: the socket's own mode (its directory is 0700 already); passwords
# stored as SCRAM verifiers (PostgreSQL 15's default, said here on purpose)
PG_ACCESS_MARKER = "# --- chorus local cluster: access ---"
PG_ACCESS_CONF = f"""
{PG_ACCESS_MARKER}
unix_socket_permissions = 0700
password_encryption = 'scram-sha-256'
"""

# the lines of an older pg_hba.conf that the block above replaces: every Unix-socket line and
# every TCP line for loopback (initdb's `trust` lines); other lines (a lab's network) are kept
_LOOPBACK = {"127.0.0.1/32", "::1/128", "localhost", "samehost", "127.0.0.1"}


def hba(old: str) -> str:
    """pg_hba.conf with the local cluster's rules: ``old`` unchanged if it has them already (an
    operator may have edited it since), else the rules followed by what ``old`` said about
    other addresses."""
    if HBA_MARKER in old:
        return old
    kept = []
    for line in old.splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if fields[0] == "local" or (fields[0].startswith("host") and len(fields) > 3 and fields[3] in _LOOPBACK):
            continue
        kept.append(line)
    return HBA + ("# kept from the earlier pg_hba.conf\n" + "\n".join(kept) + "\n" if kept else "")


def ident(old: str, os_users: Iterable[str]) -> str:
    """pg_ident.conf with the map that lets each of ``os_users`` connect as postgres over the
    socket (the lines it lacks are added)."""
    lines = [f"{IDENT_MAP}  {u}  postgres" for u in dict.fromkeys(os_users)]
    missing = [ln for ln in lines if ln.split() not in [x.split() for x in old.splitlines()]]
    if not missing:
        return old
    head = "" if IDENT_MARKER in old else IDENT_MARKER + "\n"
    return old + ("" if not old or old.endswith("\n") else "\n") + head + "\n".join(missing) + "\n"


def new_password() -> str:
    """A random password of 256 bits, in characters a password file and a DSN take as they are."""
    return secrets.token_urlsafe(32)


def passfile_text(ports: Iterable[int], password: str) -> str:
    """A libpq password file giving ``password`` to the postgres role on 127.0.0.1 at ``ports``
    (the password has no ``:`` or ``\\`` to escape)."""
    return "".join(f"127.0.0.1:{p}:*:postgres:{password}\n" for p in ports)


def password_in(text: str) -> Optional[str]:
    """The postgres role's password in a password file's text (its first line for postgres)."""
    for line in text.splitlines():
        fields = line.split(":", 4)
        if len(fields) == 5 and fields[3] == "postgres" and not line.lstrip().startswith("#") and fields[4]:
            return fields[4]
    return None


def scram_verifier(password: str, salt: Optional[bytes] = None, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802, RFC 7677), as
    libpq's PQencryptPasswordConn makes it: ``ALTER ROLE ... PASSWORD`` given a verifier stores
    it as it is, so the password itself never reaches the server or its log. (No SASLprep: the
    passwords made here are ASCII.)"""
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    salt64, stored64, server64 = (base64.b64encode(b).decode() for b in (salt, stored_key, server_key))
    return f"SCRAM-SHA-256${iterations}:{salt64}${stored64}:{server64}"


def scram_matches(verifier: str, password: str) -> bool:
    """Whether a stored SCRAM-SHA-256 verifier is one of ``password`` (anything else: no)."""
    try:
        method, rest = verifier.split("$", 1)
        head, keys = rest.split("$")
        iterations, salt = head.split(":")
        stored, server = keys.split(":")
        mine = scram_verifier(password, base64.b64decode(salt, validate=True), int(iterations))
    except ValueError:  # binascii.Error is one
        return False
    return method == "SCRAM-SHA-256" and hmac.compare_digest(mine.split("$", 2)[2], f"{stored}:{server}")


def set_password_sql(password: str) -> str:
    """SQL that gives the postgres role ``password`` (as a verifier: see :func:`scram_verifier`)
    on this server only: a Chorus node does not replicate it (each keeps a verifier of its own),
    and a server with the extension but no coordinator need not ask one."""
    return f"SET chorus.replicate_ddl = off;\nALTER ROLE postgres PASSWORD '{scram_verifier(password)}';\n"


def tcp_dsn(port: int, passfile: Path, dbname: str = "postgres") -> str:
    """The DSN of a node over TCP, its password from ``passfile``."""
    return make_conninfo(host="127.0.0.1", port=port, dbname=dbname, user="postgres", passfile=str(passfile))


def psql_line(port: int, passfile: Path) -> str:
    """A shell line that opens psql on a node, as the cluster prints it for people."""
    dsn = make_conninfo(host="127.0.0.1", port=port, dbname="postgres", user="postgres")
    return f"PGPASSFILE={shlex.quote(str(passfile))} psql {shlex.quote(dsn)}"


def secure_pgdata(pgdata: Path, peer_users: Iterable[str], owner: Optional[tuple[int, int]]) -> bool:
    """Give a data directory the local cluster's authentication (pg_hba.conf, pg_ident.conf, the
    settings of :data:`PG_ACCESS_CONF`), its files owned by ``owner`` when given. True if
    pg_hba.conf or pg_ident.conf changed (a running server takes them on a reload). The data
    directory is the service user's: a link planted in it is refused, never followed (what
    pg_hba.conf said is kept in the new one)."""
    changed = False
    for name, render in (("pg_hba.conf", hba), ("pg_ident.conf", lambda old: ident(old, peer_users))):
        path = pgdata / name
        old = read_text(path) if path.exists() else ""
        new = render(old)
        if new != old:
            write_private(path, new, owner)
            changed = True
    conf = pgdata / "postgresql.conf"
    if PG_ACCESS_MARKER not in read_text(conf):  # unix_socket_permissions: from the next start
        append_text(conf, PG_ACCESS_CONF)
    return changed


def read_text(path: Path) -> str:
    """A file's text, never through a link (OSError: it is one)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        return f.read()


def append_text(path: Path, text: str) -> None:
    """Append to an existing file, never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def write_private(path: Path, text: str, owner: Optional[tuple[int, int]] = None) -> None:
    """Replace ``path`` by a file only its owner reads (0600), owned by ``owner`` (uid, gid) when
    given: written beside it and renamed over it, so a link planted at ``path`` is replaced, never
    followed."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
        os.fchmod(fd, 0o600)
        if owner is not None:
            os.fchown(fd, *owner)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def open_log(path: Path, owner: Optional[tuple[int, int]] = None) -> int:
    """A log file opened for appending, 0600 (made so if it was not), owned by ``owner`` when
    given; never through a link. The descriptor is the caller's to close."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    if owner is not None:
        os.fchown(fd, *owner)
    return fd


def restrict(path: Path, mode: int) -> None:
    """chmod ``path`` (a file or a directory, not a link) to ``mode`` if it exists."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
