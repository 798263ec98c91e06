"""Causal reads: a read on one node waits for what the cluster committed before it began."""

from __future__ import annotations

import time
from typing import Callable, Iterator

import psycopg
import pytest

from conftest import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def write_while_node_3_lags(cluster: Cluster) -> Iterator[Callable[[int, str], None]]:
    """Hold up applies on node 3 (a local session keeps a SHARE lock on the table: readers pass,
    writers wait; it stays idle in transaction, so it is closed only after the grace period) and
    give the test a way to write a row on node 1 meanwhile."""
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS causal_t (id integer PRIMARY KEY, v text)")
    cluster.quiesce()
    blocker = cluster.connect(2, autocommit=False)
    blocker.execute("LOCK TABLE causal_t IN SHARE MODE")

    def write(key: int, value: str) -> None:
        with cluster.connect(0) as c:
            c.execute("INSERT INTO causal_t VALUES (%s, %s)", (key, value))

    try:
        yield write
    finally:
        blocker.close()
    cluster.quiesce()


def test_causal_read_sees_the_write_the_plain_read_misses(
        cluster: Cluster, write_while_node_3_lags: Callable[[int, str], None]) -> None:
    write_while_node_3_lags(1, "written on n1")
    with cluster.connect(2) as plain:
        assert plain.execute("SELECT v FROM causal_t WHERE id = 1").fetchall() == [], \
            "node 3 was expected to lag behind while its applier is held up"
    with cluster.connect(2) as causal:
        causal.execute("SET chorus.causal_reads = on")
        t0 = time.monotonic()
        rows = causal.execute("SELECT v FROM causal_t WHERE id = 1").fetchall()
        waited = time.monotonic() - t0
    assert rows == [("written on n1",)], rows
    assert waited < 10, waited


def test_causal_read_times_out_with_a_clear_error(
        cluster: Cluster, write_while_node_3_lags: Callable[[int, str], None]) -> None:
    write_while_node_3_lags(2, "x")
    with cluster.connect(2) as causal:
        causal.execute("SET chorus.causal_reads = on")
        causal.execute("SET chorus.causal_reads_timeout = 50")
        with pytest.raises(psycopg.errors.QueryCanceled, match="causal read timed out"):
            causal.execute("SELECT v FROM causal_t WHERE id = 2")


def test_sync_wait_before_a_repeatable_read_transaction(
        cluster: Cluster, write_while_node_3_lags: Callable[[int, str], None]) -> None:
    write_while_node_3_lags(3, "rr")
    with cluster.connect(2, autocommit=True) as reader:
        reader.execute("SELECT chorus.sync_wait()")
        with reader.transaction():
            reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            assert reader.execute("SELECT v FROM causal_t WHERE id = 3").fetchall() == [("rr",)]
