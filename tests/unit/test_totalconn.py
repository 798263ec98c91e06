"""Total recovery's connection settings (chorus.total.conn) and schema comparison
(chorus.total.schema), without a server: a libpq connection string, with libpq's environment and
password file, reaches psycopg and the PostgreSQL programs whole, and secrets never reach a
command line (docs/RECOVERY.md, "Authentication and TLS")."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from chorus.total.conn import (ConnectionSettingsError, Endpoint, match_passfile, parse_dsn, passfile_password,
                              program_args, redact, with_environment, write_private)
from chorus_spark.merkle import _psql_dsn
from chorus.total.schema import differences, normalise, restorable, role_statements, table_entries

TLS_DSN = ("host=db1.example port=6432 dbname=app user=alice password='p w\\'d' sslmode=verify-full "
           "sslrootcert=/etc/ca.crt sslcert=/etc/c.crt sslkey=/etc/c.key application_name=x connect_timeout=5")


def test_every_parameter_is_kept() -> None:
    ep = Endpoint.from_dsn("d", TLS_DSN, env={"HOME": "/nonexistent"})
    assert parse_dsn(ep.dsn) == parse_dsn(TLS_DSN)
    assert (ep.host, ep.port, ep.dbname, ep.user) == ("db1.example", 6432, "app", "alice")


def test_a_unix_socket_becomes_tcp_with_its_own_password(tmp_path: Path) -> None:
    """The diff's tasks may run on other hosts: a node is reached over TCP, and the password file
    is read for the TCP host."""
    f = tmp_path / "pgpass"
    f.write_text("localhost:5433:*:postgres:viasocket\n127.0.0.1:5433:*:postgres:viatcp\n")
    os.chmod(f, 0o600)
    ep = Endpoint.from_dsn("j", "host=/run/pg port=5433 user=postgres sslmode=require",
                           env={"PGPASSFILE": str(f), "HOME": "/x"})
    assert parse_dsn(ep.dsn) == {"host": "127.0.0.1", "port": "5433", "user": "postgres", "dbname": "postgres",
                                 "sslmode": "require", "passfile": str(f), "password": "viatcp"}


def test_the_environment_fills_what_the_string_lacks() -> None:
    env = {"PGPASSWORD": "envpw", "PGSSLMODE": "require", "PGSSLROOTCERT": "/ca", "PGUSER": "bob",
           "HOME": "/nonexistent"}
    got = with_environment({"host": "h", "sslmode": "verify-ca"}, env)
    assert got == {"host": "h", "sslmode": "verify-ca", "password": "envpw", "sslrootcert": "/ca", "user": "bob"}


def test_passfile_rules() -> None:
    text = "# comment\nother:5432:*:alice:no\nh\\:x:*:*:alice:a\\:b\\\\c\n*:5432:app:*:star\n"
    assert match_passfile(text, {"host": "h:x", "port": "1", "user": "alice"}) == "a:b\\c"
    assert match_passfile(text, {"host": "z", "dbname": "app", "user": "carol"}) == "star"
    assert match_passfile(text, {"host": "z", "dbname": "other", "user": "carol"}) is None
    # a Unix socket matches "localhost"; the database defaults to the user name
    assert match_passfile("localhost:5432:bob:bob:sock", {"host": "/run", "user": "bob"}) == "sock"


def test_a_passfile_others_can_read_is_ignored(tmp_path: Path) -> None:
    f = tmp_path / "pgpass"
    f.write_text("*:*:*:*:secret\n")
    os.chmod(f, 0o644)
    assert passfile_password(str(f), {"host": "h"}) is None
    os.chmod(f, 0o600)
    assert passfile_password(str(f), {"host": "h"}) == "secret"
    got = with_environment({"host": "h"}, {"PGPASSFILE": str(f), "HOME": str(tmp_path)})
    assert got["password"] == "secret"


def test_default_client_files_are_found_in_home(tmp_path: Path) -> None:
    (tmp_path / ".postgresql").mkdir()
    for name in ("postgresql.crt", "postgresql.key", "root.crt"):
        (tmp_path / ".postgresql" / name).write_text("x")
    got = with_environment({"host": "h", "sslkey": "/mine.key"}, {"HOME": str(tmp_path)})
    assert got["sslkey"] == "/mine.key"
    assert got["sslcert"] == str(tmp_path / ".postgresql" / "postgresql.crt")
    assert got["sslrootcert"] == str(tmp_path / ".postgresql" / "root.crt")


def test_programs_get_the_password_in_their_environment_only() -> None:
    ep = Endpoint.from_dsn("d", TLS_DSN, env={"HOME": "/nonexistent"})
    dbname, env = ep.program("-c chorus.capture=off")
    assert "p w'd" not in dbname and "password" not in parse_dsn(dbname)
    assert env == {"PGPASSWORD": "p w'd"}
    got = parse_dsn(dbname)
    assert got["sslmode"] == "verify-full" and got["sslkey"] == "/etc/c.key"
    assert got["options"] == "-c chorus.capture=off"
    merged, _ = program_args({"host": "h", "options": "-c a=b"}, "-c c=d")
    assert parse_dsn(merged)["options"] == "-c a=b -c c=d"
    # the diff's own psql (the donor's rows) likewise
    dbname, env = _psql_dsn(ep.dsn)
    assert "password" not in parse_dsn(dbname) and env["PGPASSWORD"] == "p w'd"
    assert parse_dsn(dbname)["sslkey"] == "/etc/c.key"


def test_messages_hide_the_password() -> None:
    assert "p w'd" not in redact(TLS_DSN) and "***" in redact(TLS_DSN)
    with pytest.raises(ConnectionSettingsError) as e:
        parse_dsn("host=h password=hunter2 nosuchparam=1")
    assert "hunter2" not in str(e.value)


def test_private_files(tmp_path: Path) -> None:
    p = tmp_path / "plan.json"
    write_private(p, '{"password": "x"}')
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600


DUMP = """--
-- PostgreSQL database dump
--

\\restrict {key}

SET statement_timeout = 0;
SELECT pg_catalog.set_config('search_path', '', false);

--
-- Name: chorus; Type: SCHEMA; Schema: -; Owner: postgres
--

CREATE SCHEMA chorus;

--
-- Name: chorus; Type: EXTENSION; Schema: -; Owner: -
--

CREATE EXTENSION IF NOT EXISTS chorus WITH SCHEMA chorus;

--
-- Name: citext; Type: EXTENSION; Schema: -; Owner: -
--

CREATE EXTENSION IF NOT EXISTS citext WITH SCHEMA public;

--
-- Name: s; Type: SEQUENCE; Schema: public; Owner: alice
--

CREATE SEQUENCE public.s
    START WITH {start}
    INCREMENT BY 16;

--
-- Name: t; Type: TABLE; Schema: public; Owner: alice
--

CREATE TABLE public.t (
    id bigint NOT NULL{extra}
);

--
-- Name: TABLE t; Type: ACL; Schema: public; Owner: alice
--

GRANT SELECT ON TABLE public.t TO bob;

\\unrestrict {key}
"""


def test_dumps_compare_without_chorus_comments_and_sequence_starts() -> None:
    a = DUMP.replace("{key}", "k1").replace("{start}", "1").replace("{extra}", "")
    b = DUMP.replace("{key}", "k2").replace("{start}", "3").replace("{extra}", "").replace("CREATE SCHEMA chorus;", "CREATE SCHEMA chorus; --")
    assert normalise(a) == normalise(b) and not differences(a, b)
    c = DUMP.replace("{key}", "k1").replace("{start}", "1").replace("{extra}", ",\n    note text")
    assert any("note text" in line for line in differences(a, c))
    assert table_entries(a)["public.t"] != table_entries(c)["public.t"]


def test_the_restored_dump_leaves_chorus_out_and_keeps_the_rest() -> None:
    a = DUMP.replace("{key}", "k1").replace("{start}", "1").replace("{extra}", "")
    r = restorable(a)
    assert "chorus" not in r.replace("citext", "")
    for stmt in ("SET statement_timeout = 0;", "CREATE EXTENSION IF NOT EXISTS citext WITH SCHEMA public;",
                 "GRANT SELECT ON TABLE public.t TO bob;", "START WITH 1"):
        assert stmt in r


ROLES = '''SET default_transaction_read_only = off;
CREATE ROLE alice;
ALTER ROLE alice WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB LOGIN PASSWORD 'SCRAM-SHA-256$4096:x';
CREATE ROLE "Mixed ""q""";
ALTER ROLE "Mixed ""q""" WITH NOLOGIN;
CREATE ROLE postgres;
ALTER ROLE postgres WITH SUPERUSER;
ALTER ROLE alice SET search_path TO app;
GRANT "Mixed ""q""" TO alice GRANTED BY postgres;
GRANT pg_read_all_data TO postgres GRANTED BY postgres;
'''


def test_only_missing_roles_are_created() -> None:
    got = role_statements(ROLES, {"alice", 'Mixed "q"'})
    assert got == [line for line in ROLES.splitlines() if "alice" in line or "Mixed" in line]
    assert not any("postgres WITH" in s for s in got)
    assert role_statements(ROLES, {"alice"}) == [line for line in ROLES.splitlines() if "alice" in line]


def test_a_failure_mid_way_ends_as_one_total_recovery_error() -> None:
    import psycopg

    from chorus.total.recover import TotalRecoveryError, _one_line_errors
    from chorus_spark import merkle

    @_one_line_errors
    def cut_stream() -> dict[str, Any]:
        raise merkle.DiffError("reading from the donor failed: server closed the connection")

    @_one_line_errors
    def server_gone() -> dict[str, Any]:
        raise psycopg.OperationalError("terminating connection due to administrator command")

    with pytest.raises(TotalRecoveryError, match="reading from the donor failed"):
        cut_stream()
    with pytest.raises(TotalRecoveryError, match="a database failed mid-way: terminating connection"):
        server_gone()
