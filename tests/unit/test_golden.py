"""The golden writesets (tests/golden/*.ws), written by the extension's C writer and captured
by tests/integration/test_golden_writesets.py, read by the Python reader: each decodes to the
description kept beside it, and the scan the live path uses agrees with the full decode on
everything it reads. (The C reader's test reads the same files.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chorus import wire

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
FILES = sorted(GOLDEN.glob("*.ws"))


def test_there_are_golden_writesets() -> None:
    names = {p.stem for p in FILES}
    assert {"insert_typed", "update_typed", "delete_typed", "multi_row", "no_key", "truncate",
            "schema_in_transaction", "schema_alone", "schema_concurrently"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_python_reads_the_golden_writeset(path: Path) -> None:
    raw = path.read_bytes()
    ws = wire.decode(raw)
    assert wire.describe(ws) == json.loads(path.with_suffix(".json").read_text())
    scanned = wire.scan(raw)
    assert (scanned.flags, scanned.tables, scanned.keys, scanned.statements) == (ws.flags, ws.tables, ws.keys,
                                                                                 ws.statements)
    assert scanned.changed_tables == ws.changed_tables
    assert wire.encode(ws) == raw  # the Python writer writes what the C writer wrote
