"""Migrations work unchanged (issue 19): schema changes inside transaction blocks, functions, DO
blocks and event triggers replicate with their data as one unit, certified at commit like any
writeset (seed 10.1, option 2). Checked with the fidelity harness (chorus/testkit/fidelity.py)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import psycopg
import pytest

from chorus.testkit import fidelity
from conftest import Cluster, commit_all

pytestmark = pytest.mark.integration


def _check(c: Cluster) -> None:
    diff = fidelity.check(c.nodes)
    assert diff is None, str(diff)


class _Writers:
    """Threads that each write through one node until stopped, counting their commits per node
    (a certification loss, 40001, is not a commit)."""

    def __init__(self, c: Cluster, nodes: Sequence[int], write: Callable[[psycopg.Connection[Any], int, random.Random], object]
                 ) -> None:
        self.c, self.write = c, write
        self.stop = threading.Event()
        self.commits = [0] * len(c.nodes)
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in nodes]

    def _run(self, i: int) -> None:
        rnd = random.Random(i)
        with self.c.connect(i) as conn:
            while not self.stop.is_set():
                try:
                    self.write(conn, i, rnd)
                    self.commits[i] += 1
                except psycopg.errors.SerializationFailure:
                    pass

    def __enter__(self) -> "_Writers":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def _side_load(c: Cluster) -> _Writers:
    """Writes on nodes n2 and n3 while a migration runs on n1 (a table it does not touch)."""
    with c.connect(1) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS side_load (id bigserial PRIMARY KEY, node text, at timestamptz)")
    c.quiesce()
    return _Writers(c, (1, 2), lambda conn, i, rnd: conn.execute(
        "INSERT INTO side_load (node, at) VALUES (%s, now())", (f"n{i + 1}",)))


def _table_load(c: Cluster, table: str, rows: int) -> _Writers:
    """Updates random rows of ``table`` on every node at once."""
    return _Writers(c, range(len(c.nodes)), lambda conn, i, rnd: conn.execute(
        f"UPDATE {table} SET v = v + 1 WHERE id = %s", (rnd.randrange(1, rows),)))


ALEMBIC_ENV = '''
from alembic import context
from sqlalchemy import create_engine

config = context.config
engine = create_engine(config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
'''

REVISIONS = {
    "a1_accounts": ('None', '''
        op.create_table("account",
                        sa.Column("id", sa.Integer, primary_key=True),
                        sa.Column("name", sa.String(50), nullable=False),
                        sa.Column("kind", sa.String(10), server_default="person"))
        op.create_index("ix_account_name", "account", ["name"])
        t = sa.table("account", sa.column("id", sa.Integer), sa.column("name", sa.String))
        op.bulk_insert(t, [{"id": i, "name": f"user {i}"} for i in range(1, 201)])
        op.execute("UPDATE account SET kind = 'org' WHERE id % 10 = 0")
    ''', '''
        op.drop_index("ix_account_name", "account")
        op.drop_table("account")
    '''),
    "a2_columns": ('"a1_accounts"', '''
        op.add_column("account", sa.Column("created", sa.DateTime(timezone=True),
                                           server_default=sa.text("now()"), nullable=False))
        op.add_column("account", sa.Column("active", sa.Boolean, server_default=sa.true(), nullable=False))
        op.alter_column("account", "name", new_column_name="display_name")
        op.create_table("note",
                        sa.Column("id", sa.Integer, primary_key=True),
                        sa.Column("account_id", sa.Integer, sa.ForeignKey("account.id"), nullable=False),
                        sa.Column("body", sa.Text))
        op.execute("INSERT INTO note (id, account_id, body) SELECT id, id, 'hello ' || display_name FROM account")
    ''', '''
        op.drop_table("note")
        op.alter_column("account", "display_name", new_column_name="name")
        op.drop_column("account", "active")
        op.drop_column("account", "created")
    '''),
    "a3_rename": ('"a2_columns"', '''
        op.rename_table("note", "account_note")
        op.execute("UPDATE account SET display_name = upper(display_name) WHERE kind = 'org'")
    ''', '''
        op.rename_table("account_note", "note")
    '''),
}


def _alembic_project(tmp: Path, url: str) -> Path:
    (tmp / "versions").mkdir(parents=True)
    (tmp / "env.py").write_text(ALEMBIC_ENV)
    (tmp / "script.py.mako").write_text("")
    for rev, (down, up, downgrade) in REVISIONS.items():
        (tmp / "versions" / f"{rev}.py").write_text(
            f"import sqlalchemy as sa\nfrom alembic import op\n\nrevision = {rev!r}\ndown_revision = {down}\n"
            "branch_labels = None\ndepends_on = None\n\n\ndef upgrade():\n" + textwrap.indent(textwrap.dedent(up), "    ")
            + "\n\ndef downgrade():\n" + textwrap.indent(textwrap.dedent(downgrade), "    "))
    ini = tmp / "alembic.ini"
    ini.write_text(f"[alembic]\nscript_location = {tmp}\nsqlalchemy.url = {url}\n")
    return ini


def _alembic(ini: Path, *args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "alembic", "-c", str(ini), *args], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_alembic_migrations_in_transactions_under_load(schema_cluster: Cluster, tmp_path: Path) -> None:
    """A revision chain run by `alembic upgrade head` through n1 (PostgreSQL migrations run in
    one transaction), then `downgrade base` and `upgrade head` again, while n2 and n3 write."""
    port = schema_cluster.dsn(0).split("port=")[1].split()[0]
    ini = _alembic_project(tmp_path,
                           f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres?passfile={schema_cluster.passfile}")
    with _side_load(schema_cluster) as load:
        _alembic(ini, "upgrade", "head")
        _alembic(ini, "downgrade", "base")
        _alembic(ini, "upgrade", "head")
    assert sum(load.commits) > 0
    _check(schema_cluster)
    with schema_cluster.connect(2) as c:
        assert c.execute("SELECT count(*), count(*) FILTER (WHERE display_name = upper(display_name)) "
                         "FROM account").fetchone() == (200, 20)
        assert c.execute("SELECT version_num FROM alembic_version").fetchone() == ("a3_rename",)


DJANGO_SETTINGS = '''
SECRET_KEY = "chorus-test"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                  "django.contrib.sessions", "django.contrib.messages"]
MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware",
              "django.contrib.auth.middleware.AuthenticationMiddleware",
              "django.contrib.messages.middleware.MessageMiddleware"]
TEMPLATES = [{{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
               "OPTIONS": {{"context_processors": ["django.template.context_processors.request",
                                                   "django.contrib.auth.context_processors.auth",
                                                   "django.contrib.messages.context_processors.messages"]}}}}]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.postgresql", "NAME": "postgres", "USER": "postgres",
                           "HOST": "127.0.0.1", "PORT": "{port}", "OPTIONS": {{"passfile": "{passfile}"}}}}}}
'''

DJANGO_FIXTURE = '''[
 {"model": "auth.group", "pk": 1, "fields": {"name": "editors", "permissions": []}},
 {"model": "auth.user", "pk": 1, "fields": {"username": "ann", "password": "!", "is_staff": true,
  "date_joined": "2020-04-03T10:11:12Z", "groups": [1]}},
 {"model": "auth.user", "pk": 2, "fields": {"username": "bob", "password": "!", "is_staff": false,
  "date_joined": "2021-05-06T07:08:09Z", "groups": []}}
]'''


def test_django_migrate_and_loaddata(schema_cluster: Cluster, tmp_path: Path) -> None:
    port = schema_cluster.dsn(0).split("port=")[1].split()[0]
    (tmp_path / "chorus_settings.py").write_text(DJANGO_SETTINGS.format(port=port, passfile=schema_cluster.passfile))
    (tmp_path / "users.json").write_text(DJANGO_FIXTURE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "DJANGO_SETTINGS_MODULE": "chorus_settings"}
    for cmd in (["migrate", "--noinput"], ["loaddata", str(tmp_path / "users.json")]):
        r = subprocess.run([sys.executable, "-m", "django", *cmd], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    _check(schema_cluster)
    with schema_cluster.connect(1) as c:
        assert c.execute("SELECT count(*) FROM auth_user").fetchone() == (2,)
        assert c.execute("SELECT count(*) FROM django_migrations WHERE app = 'auth'").fetchone()[0] > 5


def test_a_schema_change_and_a_write_elsewhere_one_of_them_loses(schema_cluster: Cluster) -> None:
    """n1 alters a table in a transaction while n2 writes it: exactly one fails with 40001,
    whichever commits first, and every node ends identical."""
    with schema_cluster.connect(0) as c:
        c.execute("CREATE TABLE raced (id int PRIMARY KEY, v int)")
        c.execute("INSERT INTO raced VALUES (1, 1)")
    schema_cluster.quiesce()
    for first in ("ddl", "write"):
        ddl = schema_cluster.connect(0, autocommit=False)
        ddl.execute("ALTER TABLE raced ADD COLUMN IF NOT EXISTS extra int DEFAULT 7")
        write = schema_cluster.connect(1, autocommit=False)
        write.execute("UPDATE raced SET v = v + 1 WHERE id = 1")
        outcomes = commit_all([ddl, write] if first == "ddl" else [write, ddl])
        assert sorted(outcomes) == ["40001", "ok"], (first, outcomes)
        schema_cluster.quiesce()
        with schema_cluster.connect(0) as c:
            c.execute("ALTER TABLE raced DROP COLUMN IF EXISTS extra")
    _check(schema_cluster)


def test_savepoints_do_blocks_and_event_triggers(schema_cluster: Cluster) -> None:
    script = """
    BEGIN;
    CREATE TABLE sp_kept (id int PRIMARY KEY);
    INSERT INTO sp_kept VALUES (1);
    SAVEPOINT s;
    CREATE TABLE sp_gone (id int);
    INSERT INTO sp_gone VALUES (1);
    ALTER TABLE sp_kept ADD COLUMN gone int;
    ROLLBACK TO SAVEPOINT s;
    ALTER TABLE sp_kept ADD COLUMN kept int DEFAULT 2;
    COMMIT;
    DO $$
    BEGIN
        FOR i IN 1..3 LOOP
            EXECUTE format('CREATE TABLE do_t%s (id int PRIMARY KEY, v text)', i);
            EXECUTE format('INSERT INTO do_t%s VALUES (%s, %L)', i, i, 'from a DO block');
        END LOOP;
        BEGIN
            CREATE TABLE do_failed (id int);
            RAISE EXCEPTION 'undo this block';
        EXCEPTION WHEN raise_exception THEN NULL;
        END;
    END $$;
    CREATE FUNCTION make_table(n text) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN EXECUTE format('CREATE TABLE %I (id serial PRIMARY KEY, at date DEFAULT %L)', n, '03/04/2020'); END $$;
    SET datestyle = 'SQL, DMY';
    SELECT make_table('from_function');
    CREATE TABLE ddl_audit (id serial PRIMARY KEY, tag text, object text);
    CREATE FUNCTION audit_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
    DECLARE r record;
    BEGIN
        FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
            INSERT INTO ddl_audit (tag, object) VALUES (r.command_tag, r.object_identity);
        END LOOP;
    END $$;
    CREATE EVENT TRIGGER audit_ddl ON ddl_command_end EXECUTE FUNCTION audit_ddl();
    CREATE TABLE audited_alone (id int PRIMARY KEY);
    BEGIN;
    CREATE TABLE audited_in_block (id int PRIMARY KEY);
    INSERT INTO audited_in_block VALUES (1);
    COMMIT;
    DROP EVENT TRIGGER audit_ddl;
    """
    r = fidelity.run_sql(schema_cluster.dsn(0), script)
    assert r.returncode == 0 and "ERROR" not in r.stderr, r.stderr
    _check(schema_cluster)
    with schema_cluster.connect(2) as c:
        assert c.execute("SELECT to_regclass('sp_gone'), to_regclass('do_failed')").fetchone() == (None, None)
        assert c.execute("SELECT count(*) FROM ddl_audit WHERE tag = 'CREATE TABLE' "
                         "AND object LIKE 'public.audited%'").fetchone() == (2,)
        assert c.execute("SELECT column_default FROM information_schema.columns "
                         "WHERE table_name = 'from_function' AND column_name = 'at'").fetchone() == (
            "'2020-04-03'::date",)


def _index_states(c: Cluster, name: str) -> list[object]:
    """Per node: None if index ``name`` is absent, else whether it is valid."""
    out: list[object] = []
    for i in range(len(c.nodes)):
        with c.connect(i) as conn:
            row = conn.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                               "WHERE c.relname = %s", (name,)).fetchone()
            out.append(None if row is None else row[0])
    return out


def _wait_index(c: Cluster, name: str, want: object, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    states = _index_states(c, name)
    while states != [want] * len(c.nodes):
        assert time.monotonic() < deadline, f"index {name}: {states}, want {want} everywhere"
        time.sleep(0.2)
        states = _index_states(c, name)


def test_create_and_drop_index_concurrently_under_load(schema_cluster: Cluster) -> None:
    """CREATE INDEX CONCURRENTLY on n1 while every node writes the table: writes go on on every
    node, each other node builds the index in a session of its own, and it ends valid
    everywhere; REINDEX CONCURRENTLY on n3 rebuilds it everywhere; DROP INDEX CONCURRENTLY on n2
    removes it everywhere. A unique build that meets
    duplicates fails on its origin and leaves the index invalid on every node, as PostgreSQL
    leaves it."""
    rows = 200_000
    with schema_cluster.connect(0) as c:
        c.execute("CREATE TABLE cic_t (id int PRIMARY KEY, v int NOT NULL, pad text)")
        for start in range(1, rows + 1, 50_000):
            c.execute("INSERT INTO cic_t SELECT g, g %% 1000, md5(g::text) FROM generate_series(%s, %s) g",
                      (start, min(rows, start + 49_999)))
    schema_cluster.quiesce()
    before = [schema_cluster.status(i)["concurrent_index_changes"]["succeeded"] for i in range(3)]
    with _table_load(schema_cluster, "cic_t", rows) as load:
        time.sleep(0.5)
        at_start = list(load.commits)
        with schema_cluster.connect(0) as c:
            c.execute("CREATE INDEX CONCURRENTLY cic_ix ON cic_t (md5(pad || v::text), v)")
        _wait_index(schema_cluster, "cic_ix", True)
        during = [n - s for n, s in zip(load.commits, at_start)]
        time.sleep(0.3)
    assert all(d > 0 for d in during), f"writes per node while the index was built: {during}"
    after = [schema_cluster.status(i)["concurrent_index_changes"]["succeeded"] for i in range(3)]
    # the origin's backend built it; every other node in a session of its own
    assert [a - b for a, b in zip(after, before)] == [0, 1, 1], (before, after)

    # REINDEX CONCURRENTLY from n3: the others rebuild beside the order too
    with _table_load(schema_cluster, "cic_t", rows):
        with schema_cluster.connect(2) as c:
            c.execute("REINDEX INDEX CONCURRENTLY cic_ix")
        _wait_index(schema_cluster, "cic_ix", True)
    deadline = time.monotonic() + 60
    while [schema_cluster.status(i)["concurrent_index_changes"]["succeeded"] - after[i] for i in range(3)] != [1, 1, 0]:
        assert time.monotonic() < deadline, "REINDEX CONCURRENTLY did not run on n1 and n2"
        time.sleep(0.2)

    with _table_load(schema_cluster, "cic_t", rows):
        with schema_cluster.connect(1) as c:
            c.execute("DROP INDEX CONCURRENTLY cic_ix")
        _wait_index(schema_cluster, "cic_ix", None)

    with schema_cluster.connect(0) as c:
        c.execute("CREATE TABLE cic_dup (id int PRIMARY KEY, v int)")
        c.execute("INSERT INTO cic_dup SELECT g, g % 10 FROM generate_series(1, 100) g")
    schema_cluster.quiesce()
    failed = [schema_cluster.status(i)["concurrent_index_changes"]["failed"] for i in range(3)]
    with schema_cluster.connect(0) as c:
        with pytest.raises(psycopg.errors.UniqueViolation):
            c.execute("CREATE UNIQUE INDEX CONCURRENTLY cic_dup_ix ON cic_dup (v)")
    _wait_index(schema_cluster, "cic_dup_ix", False)
    deadline = time.monotonic() + 30
    while [schema_cluster.status(i)["concurrent_index_changes"]["failed"] - failed[i] for i in (1, 2)] != [1, 1]:
        assert time.monotonic() < deadline, "the failed build is not reported on n2 and n3"
        time.sleep(0.2)
    recent = schema_cluster.status(1)["concurrent_index_changes"]["recent"][-1]
    assert not recent["ok"] and recent["error"].startswith("23505"), recent
    with schema_cluster.connect(2) as c:
        c.execute("DROP INDEX cic_dup_ix")
    _wait_index(schema_cluster, "cic_dup_ix", None)
    _check(schema_cluster)


def test_a_local_transaction_in_the_way_of_a_schema_change_loses(schema_cluster: Cluster) -> None:
    """n2 reads a table in a transaction and keeps it open (its lock stays); n1 alters the table
    in a migration. At its GID n2 applies the change as PostgreSQL would, with its lock: the local
    transaction in the way is aborted with 40001 (a busy one at once, an idle one after the
    grace period), not the change, and every node ends identical."""
    with schema_cluster.connect(0) as c:
        c.execute("CREATE TABLE in_the_way (id int PRIMARY KEY, v int)")
        c.execute("INSERT INTO in_the_way VALUES (1, 1)")
    schema_cluster.quiesce()
    local = schema_cluster.connect(1, autocommit=False)
    assert local.execute("SELECT count(*) FROM in_the_way").fetchone() == (1,)  # holds its lock, idle
    with schema_cluster.connect(0, autocommit=False) as c:
        c.execute("ALTER TABLE in_the_way ADD COLUMN w int DEFAULT 5")
        c.execute("INSERT INTO in_the_way VALUES (2, 2, 2)")
        c.commit()
    schema_cluster.quiesce(timeout=60)  # n2 got through: the local transaction was ended
    with pytest.raises(psycopg.Error) as exc:
        local.execute("SELECT 1")
        local.commit()
    assert exc.value.sqlstate in ("40001", None), exc.value  # None: libpq saw only the closed socket
    local.close()
    assert schema_cluster.status(1)["local_aborts_for_appliers"] >= 1
    with schema_cluster.connect(1) as c:
        assert c.execute("SELECT id, v, w FROM in_the_way ORDER BY id").fetchall() == [(1, 1, 5), (2, 2, 2)]
    _check(schema_cluster)
