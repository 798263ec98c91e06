"""Large transactions on a 3-node cluster: past ``chorus.max_row_keys_per_table`` row keys of one
table, a writeset certifies the table as a whole (one table key in exclusive mode), so its key
list and every node's certification index stay bounded; a conflict is never missed, a false one is
possible (docs/ISOLATION.md). A writeset larger than a log segment is logged in pieces and served
to a returning node (docs/WSLOG.md). An UPDATE leaves unchanged out-of-line values where they are."""

from __future__ import annotations

import json
import os

import psycopg
import pytest

from chorus import wire
from chorus.wire import KeyMode
from conftest import Cluster, chorus, peak_anon_growth_kb

pytestmark = pytest.mark.integration

TABLE = (b"public", b"big_esc")


def _setup(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS big_esc (id integer PRIMARY KEY, v integer NOT NULL)")
        c.execute("DELETE FROM big_esc")
        c.execute("INSERT INTO big_esc SELECT g, 0 FROM generate_series(1, 500) g")
    cluster.quiesce()


def _writeset_of(cluster: Cluster, statements: list[str], limit: int | None) -> wire.Writeset:
    """The writeset node n1 sent for one transaction of ``statements`` (run with the given limit)."""
    before = int(cluster.status(0)["committed_gid"])
    with cluster.connect(0, autocommit=False) as c:
        if limit is not None:
            c.execute(f"SET chorus.max_row_keys_per_table = {limit}")
        for statement in statements:
            c.execute(statement)
        c.commit()
    cluster.quiesce()
    after = int(cluster.status(0)["committed_gid"])
    mine = [r for r in cluster.log_records(before, after) if r.origin == "n1"]
    assert len(mine) == 1
    return wire.decode(mine[0].payload)


def test_row_keys_past_the_limit_become_one_exclusive_table_key(cluster: Cluster) -> None:
    _setup(cluster)
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS small_esc (id integer PRIMARY KEY, v integer NOT NULL)")
        c.execute("DELETE FROM small_esc")
        c.execute("INSERT INTO small_esc SELECT g, 0 FROM generate_series(1, 20) g")
    cluster.quiesce()
    ws = _writeset_of(cluster, ["UPDATE big_esc SET v = v + 1 WHERE id <= 200"], None)
    assert len([k for k in ws.keys if k.parts[:2] == TABLE and len(k.parts) > 2]) == 200  # under the default
    ws = _writeset_of(cluster, ["UPDATE big_esc SET v = v + 1 WHERE id <= 200",
                                "UPDATE small_esc SET v = v + 1 WHERE id <= 10"], 50)
    mine = [k for k in ws.keys if k.parts[:2] == TABLE]
    assert sorted((int(k.mode), k.parts) for k in mine) == [(int(KeyMode.REFERENCE), TABLE),
                                                            (int(KeyMode.EXCLUSIVE), TABLE)]
    # the table under the limit in the same writeset keeps its row keys; every row still travels
    assert len([k for k in ws.keys if k.parts[:2] == (b"public", b"small_esc") and len(k.parts) > 2]) == 10
    assert len(ws.rows) == 210
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT sum(v) FROM big_esc").fetchone() == (400,)


def test_a_writeset_of_many_tables_counts_each_table_apart(cluster: Cluster) -> None:
    """Past a few tables the counters are found by name in a hash table (chorus_keylimit.c): with
    20 tables, each has its table key in reference mode once, the escalated ones their exclusive
    key and no row keys, the others their row keys, also for a table written again after the
    hash table was made."""
    with cluster.connect(0) as c:
        for i in range(20):
            c.execute(f"CREATE TABLE IF NOT EXISTS many_esc_{i} (id integer PRIMARY KEY, v integer NOT NULL)")
            c.execute(f"DELETE FROM many_esc_{i}")
            c.execute(f"INSERT INTO many_esc_{i} SELECT g, 0 FROM generate_series(1, 3) g")
    cluster.quiesce()
    statements = [f"UPDATE many_esc_{i} SET v = v + 1 WHERE id <= {3 if i % 2 == 0 else 1}" for i in range(20)]
    statements += ["UPDATE many_esc_0 SET v = v + 1 WHERE id = 1", "UPDATE many_esc_3 SET v = v + 1 WHERE id = 2"]
    ws = _writeset_of(cluster, statements, 2)
    for i in range(20):
        table = (b"public", f"many_esc_{i}".encode())
        mine = [(int(k.mode), k.parts) for k in ws.keys if k.parts[:2] == table]
        tables = sorted(m for m, parts in mine if len(parts) == 2)
        rows = {parts[3] for m, parts in mine if len(parts) > 2}
        if i % 2 == 0:
            assert tables == [int(KeyMode.REFERENCE), int(KeyMode.EXCLUSIVE)] and rows == set(), (i, mine)
        else:
            assert tables == [int(KeyMode.REFERENCE)] and rows == ({b"1", b"2"} if i == 3 else {b"1"}), (i, mine)
    cluster.assert_identical()


@pytest.mark.parametrize("limit, loses", [(50, True), (1000, False)], ids=["escalated", "row-keys"])
def test_a_large_transaction_conflicts_with_every_concurrent_writer_of_its_table(
        cluster: Cluster, limit: int, loses: bool) -> None:
    """Escalated, a large transaction loses certification to a concurrent one that changed
    another row of its table (a false conflict, never a missed one); with its row keys it
    commits. Whichever outcome, every node reaches the same one."""
    _setup(cluster)
    big = cluster.connect(0, autocommit=False)
    try:
        big.execute(f"SET chorus.max_row_keys_per_table = {limit}")
        big.execute("UPDATE big_esc SET v = v + 1 WHERE id <= 200")
        with cluster.connect(1) as small:  # another row, committed first
            small.execute("UPDATE big_esc SET v = v + 10 WHERE id = 400")
        cluster.quiesce()
        if loses:
            with pytest.raises(psycopg.errors.SerializationFailure):
                big.commit()
        else:
            big.commit()
    finally:
        big.close()
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT sum(v) FILTER (WHERE id <= 200), max(v) FILTER (WHERE id = 400) "
                         "FROM big_esc").fetchone() == ((0 if loses else 200), 10)
    # and the other way round: the large one first, then a small one whose snapshot missed it
    _setup(cluster)
    small = cluster.connect(1, autocommit=False)
    try:
        small.execute("UPDATE big_esc SET v = v + 10 WHERE id = 400")
        with cluster.connect(0) as c:
            c.execute(f"SET chorus.max_row_keys_per_table = {limit}")
            c.execute("UPDATE big_esc SET v = v + 1 WHERE id <= 200")
        cluster.quiesce()
        if loses:
            with pytest.raises(psycopg.errors.SerializationFailure):
                small.commit()
        else:
            small.commit()
    finally:
        small.close()
    cluster.assert_identical()


@pytest.mark.parametrize("limit", [50, 1000], ids=["escalated", "row-keys"])
def test_a_large_delete_of_parents_conflicts_with_a_new_child(cluster: Cluster, limit: int) -> None:
    """A child inserted on another node, pointing at a parent a large transaction deletes, makes
    the large transaction lose, escalated or not: the child's reference names the parent table
    too, so no orphan is left anywhere."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS esc_parent (id integer PRIMARY KEY)")
        c.execute("CREATE TABLE IF NOT EXISTS esc_child (id integer PRIMARY KEY, "
                  "parent integer REFERENCES esc_parent)")
        c.execute("DELETE FROM esc_child")
        c.execute("DELETE FROM esc_parent")
        c.execute("INSERT INTO esc_parent SELECT generate_series(1, 500)")
    cluster.quiesce()
    big = cluster.connect(0, autocommit=False)
    try:
        big.execute(f"SET chorus.max_row_keys_per_table = {limit}")
        big.execute("DELETE FROM esc_parent WHERE id <= 200")
        with cluster.connect(1) as small:
            small.execute("INSERT INTO esc_child VALUES (1, 150)")
        cluster.quiesce()
        with pytest.raises(psycopg.errors.SerializationFailure):
            big.commit()
    finally:
        big.close()
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT count(*) FROM esc_child c JOIN esc_parent p ON p.id = c.parent").fetchone() == (1,)


def test_an_update_leaves_large_values_where_they_are(cluster: Cluster) -> None:
    """An UPDATE of a small column of rows holding 10 MB values sends a small writeset: each
    unchanged out-of-line value travels as a marker, and every node keeps its own copy (seed
    12.7). A value the UPDATE does change travels whole."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS toasty (id integer PRIMARY KEY, n integer, big text, other text)")
        c.execute("DELETE FROM toasty")
        for i in (1, 2):  # random hex: PostgreSQL can hardly compress it, so it is stored out of line
            c.execute("INSERT INTO toasty SELECT %s, 0, string_agg(md5(random()::text), ''), 'x' "
                      "FROM generate_series(1, 320000)", (i,))
    cluster.quiesce()
    before = int(cluster.status(0)["committed_gid"])
    with cluster.connect(0) as c:
        c.execute("UPDATE toasty SET n = n + 1")
    cluster.quiesce()
    after = int(cluster.status(0)["committed_gid"])
    [rec] = [r for r in cluster.log_records(before, after) if r.origin == "n1"]
    assert len(rec.payload) < 4096, len(rec.payload)
    ws = wire.decode(rec.payload)
    assert all(isinstance(r.new[2], wire.Unchanged) for r in ws.rows if isinstance(r, wire.Row))
    sums = []
    for i in range(3):
        with cluster.connect(i) as c:
            sums.append(c.execute("SELECT id, n, length(big), md5(big), other FROM toasty ORDER BY id").fetchall())
    assert sums[0] == sums[1] == sums[2] and [(r[0], r[1], r[2]) for r in sums[0]] == [(1, 1, 10240000),
                                                                                       (2, 1, 10240000)]
    # a changed large value travels
    with cluster.connect(1) as c:
        c.execute("UPDATE toasty SET big = big || 'tail', n = n + 1 WHERE id = 2")
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT length(big), right(big, 4) FROM toasty WHERE id = 2").fetchone() == (10240004, "tail")
    # a schema change whose rows are shipped (a volatile USING) sends its large values whole
    with cluster.connect(0) as c:
        c.execute("ALTER TABLE toasty ALTER COLUMN other TYPE text USING other || md5(random()::text)")
        c.execute("ALTER TABLE toasty ALTER COLUMN big TYPE text USING big || md5(random()::text)")
    cluster.assert_identical()


def test_a_writeset_larger_than_a_log_segment_reaches_every_node_and_one_that_was_away(cluster: Cluster) -> None:
    """The session cluster's log segments are 32 MB: a 45 MB writeset (it was refused before
    records could span segments) commits everywhere, is logged in pieces on every node, and a
    node that was away while it committed gets it through partial recovery."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS big_span (id integer PRIMARY KEY, pad text NOT NULL)")
    cluster.quiesce()
    name = cluster.nodes[2].name
    r = chorus("node", "leave", "--dir", cluster.dir, name)
    assert r.returncode == 0, r.stderr
    with cluster.connect(0) as c:
        c.execute("INSERT INTO big_span SELECT g, repeat(md5(g::text), 31) FROM generate_series(1, 45000) g")
    gid = int(cluster.status(0)["committed_gid"])
    r = chorus("node", "join", "--dir", cluster.dir, name, "--json")
    assert r.returncode == 0, r.stderr + r.stdout
    rec = json.loads(r.stdout)["recovery"]
    assert rec is not None and rec["state"] == "done" and rec["bytes_received"] > 45_000_000, rec
    cluster.assert_identical()
    with cluster.connect(2) as c:
        assert c.execute("SELECT count(*), sum(length(pad)) FROM big_span").fetchone() == (45000, 45000 * 992)
    for n in cluster.info["nodes"]:
        r = chorus("log", "verify", os.path.join(os.path.dirname(n["config"]), "wslog"), "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        segments = json.loads(r.stdout)["segments"]
        assert any(s["continued"] == gid for s in segments) and any(s["continues"] == gid for s in segments), segments


def test_a_large_writeset_spills_to_a_temporary_file_with_bounded_backend_memory(cluster: Cluster) -> None:
    """Past chorus.capture_work_mem the origin backend's rows go to a temporary file and reach the
    coordinator from there: a 60 MB transaction takes a few MB of the backend's memory, against
    several times its size when it is held in memory."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS big_spill (id integer PRIMARY KEY, pad text NOT NULL)")
        c.execute("TRUNCATE big_spill")
    cluster.quiesce()
    peaks = {}
    for work_mem, first in (("1MB", 1), ("1GB", 200_001)):
        with cluster.connect(0, autocommit=False) as c:
            pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
            c.execute(f"SET chorus.capture_work_mem = '{work_mem}'")
            c.commit()

            def load() -> None:
                c.execute("INSERT INTO big_spill SELECT g, repeat(md5(g::text), 15) FROM generate_series(%s::int, %s::int) g",
                          (first, first + 119_999))
                c.commit()
            peaks[work_mem] = peak_anon_growth_kb(pid, load)
    cluster.quiesce()
    print(f"origin backend: extra anonymous memory at its peak, by chorus.capture_work_mem: {peaks} kB")
    assert peaks["1MB"] < 16_000, peaks  # the 1 MB buffer, send chunks, and what PostgreSQL itself holds
    assert peaks["1GB"] > 40_000, peaks  # the same 60 MB held in memory: the bound above is real
    cluster.assert_identical()


def test_savepoints_rolled_back_across_the_spilled_rows(cluster: Cluster) -> None:
    """Rolled-back savepoints drop their rows whether those were spilled or still in memory; the
    rows after them overwrite the spilled ones; schema changes that ship rows spill too."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS sp_spill (id integer PRIMARY KEY, pad text NOT NULL)")
        c.execute("TRUNCATE sp_spill")
        c.execute("DROP TABLE IF EXISTS sp_ctas")
    cluster.quiesce()
    ins = "INSERT INTO sp_spill SELECT g, repeat(md5(g::text), 4) FROM generate_series(%s::int, %s::int) g"
    with cluster.connect(0, autocommit=False) as c:
        c.execute("SET chorus.capture_work_mem = 64")  # kB: a few hundred rows
        c.execute(ins, (1, 1000))  # spilled
        c.execute("SAVEPOINT a")
        c.execute(ins, (1001, 3000))  # spilled past a's mark
        c.execute("SAVEPOINT b")
        c.execute(ins, (3001, 3010))
        c.execute("ROLLBACK TO SAVEPOINT a")  # back into the spilled rows
        c.execute(ins, (5001, 5100))  # written over them
        c.execute("SAVEPOINT c")
        c.execute(ins, (6001, 6005))  # in memory only
        c.execute("ROLLBACK TO SAVEPOINT c")
        c.execute("SAVEPOINT d")
        c.execute(ins, (7001, 8000))
        c.execute("RELEASE SAVEPOINT d")
        c.execute("UPDATE sp_spill SET pad = 'changed' WHERE id % 10 = 0")
        c.execute("DELETE FROM sp_spill WHERE id % 7 = 0")
        c.execute("CREATE TABLE sp_ctas AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 5000) g")
        c.commit()
    cluster.assert_identical()
    expect = [g for g in list(range(1, 1001)) + list(range(5001, 5101)) + list(range(7001, 8001)) if g % 7]
    for i in range(3):
        with cluster.connect(i) as c:
            assert [r[0] for r in c.execute("SELECT id FROM sp_spill ORDER BY id")] == expect
            assert c.execute("SELECT count(*) FROM sp_spill WHERE pad = 'changed'").fetchone() == (
                len([g for g in expect if g % 10 == 0]),)
            assert c.execute("SELECT count(*), count(DISTINCT v) FROM sp_ctas").fetchone() == (5000, 5000)


def test_pgbench_init_through_one_node_with_bounded_memory_everywhere(cluster: Cluster) -> None:
    """``pgbench -i -s 20`` through n1 (2,000,000 rows, one COPY: a writeset of about 250 MB) ends
    identical on every node, and no process holds it: the origin backend spills it to a
    temporary file, every coordinator keeps it in a spool file (backend socket and bus alike),
    the other nodes' PostgreSQL maps it from there."""
    import subprocess

    from chorus.testkit.localcluster import PGBIN
    from chorus.testkit.procmem import PeakMemory, children

    r = chorus("local", "status", "--dir", cluster.dir, "--json")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    info = status["nodes"] if isinstance(status, dict) else status  # the processes running now
    assert all(n["pg_pid"] and n["coordinator_pid"] for n in info), info
    groups = {
        "origin backend": lambda: children(info[0]["pg_pid"]),
        "apply backends": lambda: [p for n in info[1:] for p in children(n["pg_pid"])],
        "coordinators": lambda: [n["coordinator_pid"] for n in info],
    }
    with PeakMemory(groups, every=0.005) as mem:
        subprocess.run([str(PGBIN / "pgbench"), "-i", "-q", "-s", "20", cluster.dsn(0)], check=True,
                       capture_output=True, timeout=600)
        cluster.quiesce(timeout=600)
    print(f"peak growth of anonymous memory (MB): {mem.mb('growth')}; peak (MB): {mem.mb()}")
    for i in range(3):
        with cluster.connect(i) as c:
            assert c.execute("SELECT count(*), sum(aid) FROM pgbench_accounts").fetchone() == (
                2_000_000, 2_000_000 * 2_000_001 // 2)
    cluster.assert_identical()
    growth = mem.mb("growth")
    assert all(mem.peak_kb.values()), mem.peak_kb  # every group was seen
    # (a backend's share includes building the primary keys at the end: maintenance_work_mem, 64 MB)
    assert growth["origin backend"] < 128, growth
    assert growth["apply backends"] < 128, growth
    assert growth["coordinators"] < 96, growth
    with cluster.connect(0) as c:
        c.execute("DROP TABLE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history")
