"""The C and Python owners of the wire formats agree (extension/chorus_wire.h against
chorus/wire.py and chorus/commit/backendproto.py): every constant is read from the header and compared,
so neither side can change one alone."""

from __future__ import annotations

import re
import struct

from chorus.commit import applier
from chorus.commit import backendproto as bpf
from chorus import wire

from wire_sources import HEADER, header_defines as _defines

def test_writeset_constants_match() -> None:
    d = _defines()
    assert d["CHORUS_WS_MAGIC"] == wire.MAGIC
    assert d["CHORUS_WS_VERSION"] == wire.VERSION
    assert d["CHORUS_WS_HEAD_SIZE"] == wire.HEAD_SIZE
    assert (d["CHORUS_WS_FLAG_DDL"], d["CHORUS_WS_FLAG_TOI"], d["CHORUS_WS_FLAG_CONCURRENT"],
            d["CHORUS_WS_FLAGS_KNOWN"]) == (wire.FLAG_DDL, wire.FLAG_TOI, wire.FLAG_CONCURRENT, wire.FLAGS_KNOWN)
    assert (d["CHORUS_COL_IDENTITY"], d["CHORUS_COL_GENERATED"], d["CHORUS_COL_FLAGS_KNOWN"]) == (
        wire.COL_IDENTITY, wire.COL_GENERATED, wire.COL_FLAGS_KNOWN)
    assert (d["CHORUS_TABLE_FULL_IDENTITY"], d["CHORUS_TABLE_FLAGS_KNOWN"]) == (
        wire.TABLE_FULL_IDENTITY, wire.TABLE_FLAGS_KNOWN)
    assert [d[f"CHORUS_OP_{n}"] for n in ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "SCHEMA")] == [
        wire.OP_INSERT, wire.OP_UPDATE, wire.OP_DELETE, wire.OP_TRUNCATE, wire.OP_SCHEMA]
    assert (d["CHORUS_TRUNCATE_RESTART"], d["CHORUS_TRUNCATE_FLAGS_KNOWN"]) == (
        wire.TRUNCATE_RESTART, wire.TRUNCATE_FLAGS_KNOWN)
    assert [ord(str(d[f"CHORUS_VAL_{n}"])) for n in ("NULL", "TEXT", "BINARY", "UNCHANGED")] == [
        wire.VAL_NULL, wire.VAL_TEXT, wire.VAL_BINARY, wire.VAL_UNCHANGED]
    assert [d[f"CHORUS_KEY_{m.name}"] for m in wire.KeyMode] == [int(m) for m in wire.KeyMode]
    assert d["CHORUS_KEY_MAX_PARTS"] == wire.MAX_PARTS


def test_frame_constants_match() -> None:
    d = _defines()
    assert [d[f"CHORUS_VERDICT_{n}"] for n in ("COMMIT", "CONFLICT", "REFUSED", "UNKNOWN", "TOO_LARGE", "UNDONE")] == [
        bpf.VERDICT_COMMIT, bpf.VERDICT_CONFLICT, bpf.VERDICT_REFUSED, bpf.VERDICT_UNKNOWN, bpf.VERDICT_TOO_LARGE,
        bpf.VERDICT_UNDONE]
    frames = {str(d[f"CHORUS_FRAME_{n}"]).encode() for n in ("WRITESET", "COMMITTED", "ABORTED", "RAN", "SYNC", "INFO")}
    assert frames == set(bpf._TYPES)
    assert d["CHORUS_FRAME_DONE_SIZE"] == bpf._FIXED[b"C"] == bpf._FIXED[b"A"]
    assert d["CHORUS_VERDICT_BODY_SIZE"] == bpf._VERDICT.size - 4
    assert str(d["CHORUS_FRAME_VERDICT"]).encode() == bpf._VERDICT.pack(0, b"V", 0, 0, 0, 0, 0)[4:5]
    assert d["CHORUS_FRAME_LENGTH_SIZE"] == bpf._LEN.size
    assert d["CHORUS_FRAME_RAN_HEAD_SIZE"] == bpf._RAN_HEAD


def test_verdict_offsets_match() -> None:
    """The backend reads each field of a verdict at the offset the coordinator packs it at:
    offsets count from the type byte, which follows the length."""
    d = _defines()
    fmt = bpf._VERDICT.format
    fields = fmt.lstrip(">")
    assert fields[0] == "I" and fields[1] == "c"

    def offset(i: int) -> int:
        return struct.calcsize(">" + fields[:i]) - bpf._LEN.size

    for i, name in enumerate(("VERDICT", "GID", "WAIT_FOR", "PREV", "MSGLEN"), start=2):
        assert d[f"CHORUS_VERDICT_OFF_{name}"] == offset(i), name
    assert offset(len(fields)) == d["CHORUS_VERDICT_BODY_SIZE"]


def test_apply_constants_match() -> None:
    """The SQLSTATE of an apply whose GID is already committed, as the header names it and as
    the extension raises it (chorus_shmem.h), is the one the applier recognises; the run framing's length size too."""
    d = _defines()
    assert d["CHORUS_SQLSTATE_ALREADY_COMMITTED"] == applier.ALREADY_COMMITTED.encode()
    headers = "".join(h.read_text() for h in sorted(HEADER.parent.glob("*.h")))
    raised = re.search(r"ERRCODE_CHORUS_ALREADY_COMMITTED MAKE_SQLSTATE\(([^)]*)\)", headers)
    assert raised is not None
    assert "".join(c.strip().strip("'") for c in raised.group(1).split(",")) == applier.ALREADY_COMMITTED
    assert d["CHORUS_RUN_LENGTH_SIZE"] == applier._U32.size

