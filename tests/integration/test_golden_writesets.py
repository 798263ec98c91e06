"""Golden writesets: what the extension's C writer produces for each kind of change, kept in
tests/golden/ and read by both readers (tests/unit/test_golden.py: Python; the C reader's test
reads the same files), so the writer and the readers cannot drift apart unseen (issue 20).

Each case runs on node n1; its writeset comes back through the partial-recovery stream from
n1's writeset log, byte for byte as the backend sent it. The header's transaction id, backend pid
and snapshot GID differ from run to run and are zeroed; everything else must equal the golden
file. ``CHORUS_WRITE_GOLDEN=1`` writes the files anew (after a deliberate change of the format).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chorus import wire
from conftest import Cluster

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).resolve().parents[1] / "golden"

SETUP = [
    "DROP SCHEMA IF EXISTS golden CASCADE",
    "CREATE SCHEMA golden",
    "CREATE TABLE golden.typed (id integer PRIMARY KEY, n numeric, ts timestamptz, d date, iv interval,"
    " inet inet, f float8, j jsonb, b bytea, t text, arr integer[], r int4range, flag boolean, nul text)",
    "CREATE TABLE golden.nokey (a integer, b text)",
    "CREATE TABLE golden.composite (k1 text, k2 bigint, v text, PRIMARY KEY (k1, k2))",
]

# name -> the statements of one transaction (one writeset each)
CASES: dict[str, list[str]] = {
    "insert_typed": [
        "INSERT INTO golden.typed VALUES (1, 12345.678, '2026-01-02 03:04:05.678+00', '2026-01-02',"
        " '1 day 2 hours', '10.1.2.3/24', 1.5, '{\"k\": [1, 2]}', '\\x00ff', 'héllo', '{1,NULL,3}',"
        " '[1,10)', true, NULL)"],
    "update_typed": ["UPDATE golden.typed SET t = 'changed', n = -0.5, nul = 'set' WHERE id = 1"],
    "multi_row": ["INSERT INTO golden.composite VALUES ('a', 1, 'x'), ('b', 2, NULL)",
                  "UPDATE golden.composite SET v = 'y' WHERE k1 = 'a'",
                  "DELETE FROM golden.composite WHERE k1 = 'b'"],
    "no_key": ["INSERT INTO golden.nokey VALUES (1, 'one'), (2, NULL)",
               "UPDATE golden.nokey SET b = 'uno' WHERE a = 1"],
    "delete_typed": ["DELETE FROM golden.typed WHERE id = 1"],
    "truncate": ["TRUNCATE golden.nokey"],
    "schema_in_transaction": ["ALTER TABLE golden.composite ADD COLUMN extra integer DEFAULT 7",
                              "INSERT INTO golden.composite (k1, k2) VALUES ('c', 3)"],
    # one statement outside a transaction block: its content, after it ran (total order isolation)
    "schema_alone": ["CREATE INDEX golden_typed_t ON golden.typed (t)"],
    "schema_concurrently": ["CREATE INDEX CONCURRENTLY golden_composite_v ON golden.composite (v)"],
}
ALONE = {"schema_alone", "schema_concurrently"}
# a schema change carries its session's settings: the same on every machine, whatever initdb chose
SESSION = "-c TimeZone=UTC -c DateStyle=ISO,MDY -c lc_monetary=C -c lc_numeric=C -c lc_time=C"


def zeroed(payload: bytes) -> bytes:
    """The writeset with its run-dependent header fields (xid, pid, last_seen) zeroed."""
    return payload[:4] + bytes(16) + payload[20:]


def _committed(cluster: Cluster) -> int:
    return int(cluster.status(0)["committed_gid"])


def test_the_c_writer_still_writes_the_golden_writesets(cluster: Cluster) -> None:
    with cluster.connect(0) as c:
        for s in SETUP:
            c.execute(s)
    cluster.quiesce()
    write = bool(os.environ.get("CHORUS_WRITE_GOLDEN"))
    captured: dict[str, bytes] = {}
    for name, statements in CASES.items():
        before = _committed(cluster)
        with cluster.connect(0, autocommit=name in ALONE, options=SESSION) as c:
            for s in statements:
                c.execute(s)
            if name not in ALONE:
                c.commit()
        cluster.quiesce()
        after = _committed(cluster)
        mine = [r for r in cluster.log_records(before, after) if r.origin == "n1"]
        assert len(mine) == 1, f"{name}: {len(mine)} writesets from n1 in GIDs {before + 1}..{after}"
        captured[name] = zeroed(mine[0].payload)
        wire.decode(captured[name])  # the Python reader takes it
    if write:
        GOLDEN.mkdir(exist_ok=True)
        for name, payload in captured.items():
            (GOLDEN / f"{name}.ws").write_bytes(payload)
            (GOLDEN / f"{name}.json").write_text(json.dumps(wire.describe(wire.decode(payload)), indent=1) + "\n")
        return
    for name, payload in captured.items():
        golden = (GOLDEN / f"{name}.ws").read_bytes()
        assert payload == golden, (f"{name}: the extension now writes {payload.hex()}; tests/golden/{name}.ws holds "
                                   f"{golden.hex()} (a deliberate format change: CHORUS_WRITE_GOLDEN=1)")
    with cluster.connect(0) as c:
        c.execute("DROP SCHEMA golden CASCADE")
