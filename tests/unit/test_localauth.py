"""A local cluster's authentication files and private files (chorus.localauth), without a server:
what pg_hba.conf and pg_ident.conf become (new, and migrated from a cluster made with ``trust``),
the password file libpq reads, and files written so that a planted link is never followed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
from pathlib import Path

import pytest

from chorus import localauth
from chorus.total.conn import match_passfile, parse_dsn

# what initdb --auth=trust wrote for clusters made before (PostgreSQL 15's pg_hba.conf, comments cut)
INITDB_TRUST = """# TYPE  DATABASE        USER            ADDRESS                 METHOD
local   all             all                                     trust
host    all             all             127.0.0.1/32            trust
host    all             all             ::1/128                 trust
local   replication     all                                     trust
host    replication     all             127.0.0.1/32            trust
host    replication     all             ::1/128                 trust
"""


def _rules(text: str) -> list[list[str]]:
    return [ln.split("#", 1)[0].split() for ln in text.splitlines() if ln.split("#", 1)[0].strip()]


def test_a_trust_cluster_gets_peer_on_the_socket_and_scram_on_loopback() -> None:
    new = localauth.hba(INITDB_TRUST)
    rules = _rules(new)
    assert not any("trust" in r for r in rules), new
    assert ["local", "all", "all", "peer", f"map={localauth.IDENT_MAP}"] in rules
    assert ["host", "all", "all", "127.0.0.1/32", "scram-sha-256"] in rules
    assert all(r[0] == "local" and r[-2:] == ["peer", "map=chorus"] or r[-1] == "scram-sha-256" for r in rules), rules
    assert localauth.hba(new) == new  # once made, left as it is (an operator may edit it)


def test_other_networks_rules_are_kept_after_the_local_ones() -> None:
    """The lab trusts its private network (docs/LAB.md): that line stays, after the local rules
    (the first matching line decides)."""
    old = INITDB_TRUST + "# --- chorus lab host ---\nhost all all 10.210.7.0/24 trust\n"
    rules = _rules(localauth.hba(old))
    assert rules[-1] == ["host", "all", "all", "10.210.7.0/24", "trust"]
    assert [r for r in rules if "trust" in r] == [rules[-1]]


def test_ident_maps_the_service_user_and_root_to_postgres_once() -> None:
    text = localauth.ident("# MAPNAME SYSTEM-USERNAME PG-USERNAME\n", ["postgres", "root", "postgres"])
    assert _rules(text) == [["chorus", "postgres", "postgres"], ["chorus", "root", "postgres"]]
    assert localauth.ident(text, ["root", "postgres"]) == text
    more = localauth.ident(text, ["alice"])
    assert _rules(more)[-1] == ["chorus", "alice", "postgres"] and more.count(localauth.IDENT_MARKER) == 1


def test_the_password_file_gives_the_password_to_the_printed_dsns_only() -> None:
    pw = localauth.new_password()
    assert len(pw) >= 43 and not set(pw) & set(":\\ '\"") and localauth.new_password() != pw
    text = localauth.passfile_text([5433, 5434], pw)
    assert localauth.password_in(text) == pw
    passfile = Path("/c/pgpass")
    for port in (5433, 5434):  # libpq's matching rules, as the project's reader has them
        assert match_passfile(text, parse_dsn(localauth.tcp_dsn(port, passfile))) == pw
    assert match_passfile(text, parse_dsn(localauth.tcp_dsn(5435, passfile))) is None
    assert parse_dsn(localauth.tcp_dsn(5433, passfile))["passfile"] == "/c/pgpass"
    assert localauth.password_in("# nothing\n") is None


def test_the_psql_line_is_a_shell_line_that_names_the_password_file() -> None:
    assert localauth.psql_line(5433, Path("/tmp/my cluster/pgpass")) == (
        "PGPASSFILE='/tmp/my cluster/pgpass' psql 'host=127.0.0.1 port=5433 dbname=postgres user=postgres'")


def test_the_server_is_given_a_scram_verifier_not_the_password() -> None:
    pw = localauth.new_password()
    sql = localauth.set_password_sql(pw)
    assert pw not in sql and "\nALTER ROLE postgres PASSWORD 'SCRAM-SHA-256$4096:" in sql
    v = localauth.scram_verifier("pencil", salt=b"0123456789abcdef")
    head, keys = v.split("$", 1)[1].split("$")
    iterations, salt = head.split(":")
    stored, server = (base64.b64decode(k) for k in keys.split(":"))
    assert iterations == "4096" and base64.b64decode(salt) == b"0123456789abcdef"
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", b"0123456789abcdef", 4096)  # RFC 5802, section 3
    assert stored == hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    assert server == hmac.new(salted, b"Server Key", "sha256").digest()
    assert localauth.scram_verifier("pencil") != localauth.scram_verifier("pencil")  # a new salt each time


def test_a_stored_verifier_is_checked_against_the_password_files() -> None:
    """A restart sets the password only when the node's verifier is not one of it: it writes
    nothing otherwise (a write at every start took the transaction id a killed transaction had
    had, and commit_outcome answered for the wrong one)."""
    pw = localauth.new_password()
    v = localauth.scram_verifier(pw)
    assert localauth.scram_matches(v, pw) and localauth.scram_matches(localauth.scram_verifier(pw, iterations=10), pw)
    assert not localauth.scram_matches(v, pw + "x")
    for other in ("", "md5" + "0" * 32, "SCRAM-SHA-256$4096:!!$a:b", "SCRAM-SHA-256$x:AAAA$a:b", v.replace("$", "#")):
        assert not localauth.scram_matches(other, pw), other


def test_a_private_file_replaces_a_planted_link_and_is_0600(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    path = tmp_path / "pg_hba.conf"
    path.symlink_to(victim)
    localauth.write_private(path, "new\n")
    assert victim.read_text() == "keep me\n"
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and path.read_text() == "new\n"


def test_a_log_is_opened_0600_and_never_through_a_link(tmp_path: Path) -> None:
    log = tmp_path / "coordinator.log"
    log.write_text("old line\n")
    os.chmod(log, 0o644)  # as clusters made before created it
    os.close(localauth.open_log(log))
    assert stat.S_IMODE(log.stat().st_mode) == 0o600 and log.read_text() == "old line\n"
    link = tmp_path / "postgres.log"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        localauth.open_log(link)
    assert not (tmp_path / "elsewhere").exists()
    localauth.restrict(tmp_path / "missing", 0o600)  # nothing to do


def test_a_data_directory_with_a_planted_link_is_refused_not_read(tmp_path: Path) -> None:
    """pg_hba.conf's other rules are kept when it is rewritten: read through a link, a file only
    root may read would end up in the service user's pg_hba.conf."""
    secret = tmp_path / "shadow"
    secret.write_text("host all all 10.0.0.0/8 root-only-secret\n")
    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    (pgdata / "postgresql.conf").write_text("port = 5433\n")
    (pgdata / "pg_hba.conf").symlink_to(secret)
    with pytest.raises(OSError):
        localauth.secure_pgdata(pgdata, ["postgres"], None)
    assert (pgdata / "pg_hba.conf").is_symlink() and secret.read_text().endswith("root-only-secret\n")
    (pgdata / "pg_hba.conf").unlink()
    assert localauth.secure_pgdata(pgdata, ["postgres"], None)
    assert localauth.PG_ACCESS_MARKER in (pgdata / "postgresql.conf").read_text()
    assert not localauth.secure_pgdata(pgdata, ["postgres"], None)  # nothing left to change
