"""One statement of the writeset's validity (chorus/wire.py: RULES, LIMITS) and the three
readers held to it: the Python reference (wire.read_python), the compiled reader
(chorus/_cwire.pyx) and the extension's C reader (extension/chorus_wsread.c, through
extension/tools/wsdump.c). Each rule is broken by a writeset that breaks it alone, and each
reader must refuse it, saying so; the constants the C header and the compiled modules hold
copies of are read from their sources and compared with the table."""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path
from typing import Callable, Optional

import pytest

from chorus import impl, wire
from chorus.commit import backendproto as bpf

from wire_sources import c_reader_failures, c_reader_texts, header_defines, pyx_enum

_T = wire.Table("public", "t", (wire.Column("id", "integer"),), (0,))
_KEY = wire.Key(wire.KeyMode.UPDATE, (b"public", b"t", b"id", b"1"))


def _ws(tables: tuple[wire.Table, ...] = (_T,), rows: tuple[wire.Item, ...] = (wire.Row("I", 0, (), (b"1",)),),
        keys: tuple[wire.Key, ...] = (_KEY,), flags: int = 0) -> bytes:
    return wire.encode(wire.Writeset(1, 2, 3, tables, rows, keys, flags))


def _set(buf: bytes, at: int, data: bytes) -> bytes:
    return buf[:at] + data + buf[at + len(data):]


_TRUNCATE = _ws(rows=(wire.Row("T", 0),), keys=())  # its last 4 bytes: op, table (u16), flags
_ONE_NULL = _ws(rows=(wire.Row("I", 0, (), (None,)),), keys=())  # its last byte: the value's kind
_KEY_ONLY = _ws(tables=(), rows=(), keys=(_KEY,))  # the key at HEAD_SIZE: mode, parts (u16)
_EMPTY = _ws(tables=(), rows=(), keys=())

# For each rule, a writeset that breaks it and no rule checked before it.
BROKEN: dict[str, Callable[[], bytes]] = {
    "TRUNCATED": lambda: _ws()[:-1],
    "BAD_MAGIC": lambda: _set(_ws(), 0, b"XX"),
    "BAD_VERSION": lambda: _set(_ws(), 2, bytes([wire.VERSION + 1])),
    "UNKNOWN_FLAGS": lambda: _set(_ws(), 3, bytes([0x80])),
    "COUNTS": lambda: _set(_ws(), 28, struct.pack(">I", 0xFFFFFFFF)),
    "COLUMN_FLAGS": lambda: _ws(tables=(wire.Table("public", "t", (wire.Column("id", "integer", 0x80),), (0,)),)),
    "IDENTITY_RANGE": lambda: _ws(tables=(wire.Table("public", "t", (wire.Column("id", "integer"),), (1,)),)),
    "TABLE_FLAGS": lambda: _set(_ws(rows=(), keys=()), len(_ws(rows=(), keys=())) - 1, bytes([0x80])),
    "UNKNOWN_OP": lambda: _set(_TRUNCATE, len(_TRUNCATE) - 4, b"X"),
    "TABLE_RANGE": lambda: _set(_TRUNCATE, len(_TRUNCATE) - 3, struct.pack(">H", 1)),
    "TRUNCATE_FLAGS": lambda: _set(_TRUNCATE, len(_TRUNCATE) - 1, bytes([0x80])),
    "WIDTH": lambda: _ws(rows=(wire.Row("I", 0, (), (b"1", b"2")),)),
    "VALUE_KIND": lambda: _set(_ONE_NULL, len(_ONE_NULL) - 1, b"z"),
    "KEY_MODE": lambda: _set(_KEY_ONLY, wire.HEAD_SIZE, bytes([max(wire.LIMITS["KEY_MODES"]) + 1])),
    "KEY_PARTS": lambda: _set(_KEY_ONLY, wire.HEAD_SIZE + 1, struct.pack(">H", 0)),
    "TOI_SHAPE": lambda: _set(_EMPTY, 3, bytes([wire.FLAG_TOI])),
    "CONCURRENT_SHAPE": lambda: _set(_EMPTY, 3, bytes([wire.FLAG_CONCURRENT | wire.FLAG_DDL])),
    "DDL_FLAG": lambda: _set(_EMPTY, 3, bytes([wire.FLAG_DDL])),  # the flag, and no schema change item
    "TRAILING": lambda: _ws() + b"\0",
}

_cwire = impl.compiled("_cwire")


def _python_refusal(read: Callable[[bytes, bool], wire.Writeset], buf: bytes) -> Optional[str]:
    try:
        read(buf, True)
    except wire.WireError as e:
        return str(e)
    return None


def test_every_rule_is_broken_by_one_writeset() -> None:
    assert set(BROKEN) == {r.name for r in wire.RULES}
    assert wire.read_python(_ws(), True) is not None  # the writesets they start from are good
    for buf in (_TRUNCATE, _ONE_NULL, _KEY_ONLY, _EMPTY):
        wire.read_python(buf, True)


@pytest.mark.parametrize("rule", wire.RULES, ids=lambda r: r.name)
def test_the_python_readers_refuse_what_breaks_a_rule_saying_so(rule: wire.Rule) -> None:
    buf = BROKEN[rule.name]()
    said = _python_refusal(wire.read_python, buf)
    assert said is not None and re.search(rule.says, said), said
    if _cwire is not None:
        compiled = _python_refusal(_cwire.read, buf)
        assert compiled is not None and re.search(rule.says, compiled), compiled


def test_the_c_reader_refuses_what_breaks_each_rule_saying_so(wsdump: Path, tmp_path: Path) -> None:
    paths = []
    for rule in wire.RULES:
        path = tmp_path / f"{rule.name}.ws"
        path.write_bytes(BROKEN[rule.name]())
        paths.append(str(path))
    proc = subprocess.run([str(wsdump), *paths], capture_output=True, text=True)
    said = [json.loads(line).get("error") for line in proc.stdout.splitlines()]
    assert said == [r.c_says for r in wire.RULES]


def test_the_rules_are_the_c_readers_failures() -> None:
    """Every failure of the C reader is a rule of the table, in the order both check them, and
    the C reader words each as the table says."""
    assert c_reader_failures() == [r.name for r in wire.RULES]
    texts = c_reader_texts()
    assert {r.name: texts[r.name] for r in wire.RULES} == {r.name: r.c_says for r in wire.RULES}


def test_the_c_header_states_the_limits() -> None:
    d = header_defines()
    limits = wire.LIMITS
    assert (d["CHORUS_WS_MAGIC"], d["CHORUS_WS_VERSION"], d["CHORUS_WS_HEAD_SIZE"]) == (
        limits["MAGIC"], limits["VERSION"], limits["HEAD_SIZE"])
    assert (d["CHORUS_WS_FLAGS_KNOWN"], d["CHORUS_COL_FLAGS_KNOWN"], d["CHORUS_TABLE_FLAGS_KNOWN"],
            d["CHORUS_TRUNCATE_FLAGS_KNOWN"]) == (limits["FLAGS_KNOWN"], limits["COL_FLAGS_KNOWN"],
                                                  limits["TABLE_FLAGS_KNOWN"], limits["TRUNCATE_FLAGS_KNOWN"])
    assert tuple(str(d[f"CHORUS_OP_{n}"]).encode() for n in ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "SCHEMA")) == \
        limits["OPS"]
    assert tuple(ord(str(d[f"CHORUS_VAL_{n}"])) for n in ("NULL", "TEXT", "BINARY", "UNCHANGED")) == \
        limits["VALUE_KINDS"]
    assert tuple(d[f"CHORUS_KEY_{n}"] for n in ("REFERENCE", "UPDATE", "EXCLUSIVE")) == limits["KEY_MODES"]
    assert d["CHORUS_KEY_MAX_PARTS"] == limits["MAX_PARTS"]


def test_the_compiled_reader_states_the_limits() -> None:
    """chorus/_cwire.pyx compiles in the header's size, the magic, the value kinds, the ops and
    the key modes (the rest it takes from wire.py at import: bind)."""
    e = pyx_enum("_cwire")
    limits = wire.LIMITS
    assert e["HEAD"] == limits["HEAD_SIZE"]
    assert bytes([e["MAGIC_0"], e["MAGIC_1"]]) == limits["MAGIC"]
    assert (e["VAL_NULL"], e["VAL_TEXT"], e["VAL_BINARY"], e["VAL_UNCHANGED"]) == limits["VALUE_KINDS"]
    assert tuple(bytes([e[f"OP_{n}"]]) for n in ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "SCHEMA")) == limits["OPS"]
    assert tuple(range(e["KEY_MODE_FIRST"], e["KEY_MODE_LAST"] + 1)) == limits["KEY_MODES"]


def test_the_compiled_frames_lay_out_the_verdict_as_backendproto_does() -> None:
    """chorus/_cproto.pyx takes the frame types and sizes from backendproto at import; the
    verdict's field offsets it compiles in are those of backendproto's struct."""
    e = pyx_enum("_cproto")
    fields = bpf._VERDICT.format.lstrip(">")
    offsets = [struct.calcsize(">" + fields[:i]) for i in range(1, len(fields))]
    assert [e[f"V_{n}"] for n in ("TYPE", "VERDICT", "GID", "WAIT_FOR", "PREV", "MSGLEN")] == offsets
