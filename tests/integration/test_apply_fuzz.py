"""chorus.apply_writeset (the C apply path) rejects damaged writesets with an error, never a
crash: every mutation runs in a transaction that is rolled back, on a live node."""

from __future__ import annotations

import random

import psycopg
import pytest

from chorus import wire
from conftest import Cluster

pytestmark = pytest.mark.integration


def _sample() -> bytes:
    t = wire.Table("public", "fuzz_t", (wire.Column("id", "integer", 0), wire.Column("v", "text", 0)), (0,))
    one = wire.Binary(b"\x00\x00\x00\x01")  # integer 1 in its binary form
    rows = (wire.Row("I", 0, (), (one, b"a")), wire.Row("U", 0, (one,), (one, b"b")),
            wire.Row("D", 0, (one,), ()), wire.Row("T", 0, (), ()))
    return wire.encode(wire.Writeset(1, 1, 0, (t,), rows, (wire.Key(wire.KeyMode.EXCLUSIVE, (b"public", b"fuzz_t")),)))


def test_damaged_writesets_fail_cleanly(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        c.execute("CREATE TABLE IF NOT EXISTS fuzz_t (id integer PRIMARY KEY, v text)")
    cluster.quiesce()
    good = _sample()
    rnd = random.Random(7)
    with cluster.connect(0, autocommit=False) as c:
        c.execute("SET chorus.capture = off")
        c.commit()
        # the intact writeset applies (then is rolled back)
        assert c.execute("SELECT chorus.apply_writeset(%s, 0, %s)", (10**12, good)).fetchone() == (4,)
        c.rollback()
        errors = 0
        for i in range(300):
            buf = bytearray(good)
            if i % 3 == 0:
                buf = buf[:rnd.randrange(len(buf))]
            else:
                for _ in range(rnd.randint(1, 4)):
                    buf[rnd.randrange(len(buf))] = rnd.randrange(256)
            try:
                c.execute("SELECT chorus.apply_writeset(%s, 0, %s)", (10**12, bytes(buf)))
            except psycopg.OperationalError:
                raise
            except psycopg.Error:
                errors += 1
            c.rollback()
        assert errors > 100
        assert c.execute("SELECT 1").fetchone() == (1,)  # the backend survived
        c.rollback()
