"""The writeset scan in C (coordinator/chorus/dataplane/native/scan.c with the extension's reader,
extension/chorus_wsread.c, and blake2b.c) against the Python reference, wire.read_python
(docs/NATIVE.md sections 3.2 and 4.5: a key digest that differs is a split brain in
certification, a writeset one reader takes and the other refuses is a verdict that differs).

Compared on the golden writesets (tests/golden/), on writesets Hypothesis makes (tables, every
kind of row and value, schema change items, keys of any bytes, each header flag), on the writeset
that breaks each rule of wire.RULES, and on damaged ones (cut, bytes changed, inserted, any
bytes): the same header fields, key modes, parts and digests, or the same refusal, naming the
same rule. The C scan returns an error code for every malformed input; a build with
AddressSanitizer scans a corpus of damaged writesets from buffers of their exact size, so that
any read past the end stops it."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chorus import wire
from chorus.dataplane import native

from test_wire_rules import BROKEN

SCALE = int(os.environ.get("CHORUS_FUZZ_SCALE", "1"))
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("native_core")


def python_rule(buf: bytes) -> Optional[str]:
    """The rule wire.read_python refuses ``buf`` by (None: it reads it)."""
    try:
        wire.read_python(buf, False)
    except (struct.error, IndexError):  # wire.scan words these "writeset truncated: ..."
        return "TRUNCATED"
    except wire.WireError as e:
        said = str(e)
        for r in wire.RULES:
            if re.search(r.says, said):
                return r.name
        raise AssertionError(f"a refusal no rule states: {said}")
    return None


def same(buf: bytes) -> Optional[str]:
    """Scan ``buf`` with both; assert they agree; the rule both refuse it by, or None."""
    want = python_rule(buf)
    try:
        got = native.scan(buf)
    except native.ScanError as e:
        assert e.rule == want, (e, want)
        return want
    assert want is None, f"C took what Python refuses by {want}"
    ws = wire.read_python(buf, False)
    assert (got.xid, got.pid, got.last_seen, got.flags, got.encoding) == (
        ws.xid, ws.pid, ws.last_seen, ws.flags, ws.encoding)
    assert (got.ntables, got.nschema) == (len(ws.tables), len(ws.statements))
    assert [(k.mode, k.parts, k.digest) for k in got.keys] == [(k.mode, k.parts, k.digest) for k in ws.keys]
    assert all(k.digest == wire.key_hash(k.parts) for k in got.keys)
    return None


@given(st.binary(max_size=600), st.sampled_from([1, 8, 16, 32, 64]))
@settings(max_examples=200 * SCALE, deadline=None)
def test_blake2b_is_hashlibs(data: bytes, size: int) -> None:
    assert native.blake2b(data, size) == hashlib.blake2b(data, digest_size=size).digest()


def test_blake2b_at_block_edges() -> None:
    for n in (0, 1, 127, 128, 129, 255, 256, 257, 1000, 100_000):
        data = bytes(range(256)) * (n // 256 + 1)
        assert native.blake2b(data[:n]) == hashlib.blake2b(data[:n], digest_size=16).digest(), n


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.ws")), ids=lambda p: p.stem)
def test_golden_writesets(path: Path) -> None:
    buf = path.read_bytes()
    assert same(buf) is None
    # and every cut of it is refused alike
    for n in range(len(buf)):
        assert same(buf[:n]) is not None


@pytest.mark.parametrize("rule", wire.RULES, ids=lambda r: r.name)
def test_each_rule_broken(rule: wire.Rule) -> None:
    assert same(BROKEN[rule.name]()) == rule.name


# ---- writesets Hypothesis makes -------------------------------------------------------------------

names = st.sampled_from(["public", "t", "a\"b", "é", "x" * 40, ""])
columns = st.lists(st.builds(wire.Column, names, st.sampled_from(["integer", "text"]), st.sampled_from([0, 1, 2, 3])),
                   max_size=3)
values = st.one_of(st.none(), st.binary(max_size=12), st.binary(max_size=6).map(wire.Binary), st.just(wire.UNCHANGED))
part = st.one_of(st.binary(max_size=10), st.sampled_from([b"public", b"pgbench_accounts", b"\xe9t\xe9", b"\xff\xfe"]))
keys = st.lists(st.builds(lambda m, p: wire.Key(m, tuple(p)), st.sampled_from(list(wire.KeyMode)),
                          st.lists(part, min_size=1, max_size=5)), max_size=6)
schema_items = st.builds(lambda settings, role, statement: wire.Schema(tuple(settings), role, statement),
                         st.lists(st.tuples(names, names), max_size=2), names, st.binary(max_size=30))


@st.composite
def tables_and_rows(draw: Any) -> tuple[tuple[wire.Table, ...], tuple[wire.Item, ...]]:
    tables = []
    for _ in range(draw(st.integers(0, 3))):
        cols = tuple(draw(columns))
        ident = tuple(draw(st.lists(st.integers(0, len(cols) - 1), max_size=len(cols)))) if cols else ()
        tables.append(wire.Table(draw(names), draw(names), cols, ident, draw(st.booleans())))
    rows: list[wire.Item] = []
    for _ in range(draw(st.integers(0, 5))):
        if not tables or draw(st.integers(0, 5)) == 0:
            rows.append(draw(schema_items))
            continue
        ti = draw(st.integers(0, len(tables) - 1))
        t = tables[ti]
        op = draw(st.sampled_from("IUDT"))
        old = tuple(draw(values) for _ in t.identity) if op in "UD" else ()
        new = tuple(draw(values) for _ in t.columns) if op in "IU" else ()
        rows.append(wire.Row(op, ti, old, new, draw(st.sampled_from([0, 1])) if op == "T" else 0))
    return tuple(tables), tuple(rows)


@st.composite
def writesets(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["plain", "plain", "toi", "concurrent"]))
    header = dict(xid=draw(st.integers(0, 2**32 - 1)), pid=draw(st.integers(0, 2**32 - 1)),
                  last_seen=draw(st.integers(0, 2**64 - 1)), encoding=draw(st.sampled_from([6, 8, 0])))
    if kind == "plain":
        tables, rows = draw(tables_and_rows())
        return wire.encode(wire.Writeset(tables=tables, rows=rows, keys=tuple(draw(keys)), **header))
    flags = wire.FLAG_TOI if kind == "toi" else wire.FLAG_CONCURRENT | wire.FLAG_DDL
    return wire.encode(wire.Writeset(tables=(), rows=(draw(schema_items),), keys=tuple(draw(keys)), flags=flags,
                                     **header))


@given(writesets())
@settings(max_examples=300 * SCALE, deadline=None)
def test_generated_writesets(buf: bytes) -> None:
    assert same(buf) is None


def damage(rnd: random.Random, buf: bytes) -> bytes:
    """One or a few changes: cut, bytes set to any value, bytes inserted or removed."""
    b = bytearray(buf)
    for _ in range(rnd.randint(1, 3)):
        what = rnd.randrange(5)
        at = rnd.randrange(len(b) + 1)
        if what == 0:
            del b[at:]
        elif what == 1 and b:
            b[min(at, len(b) - 1)] = rnd.randrange(256)
        elif what == 2:
            b[at:at] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 4)))
        elif what == 3:
            del b[at:at + rnd.randint(1, 4)]
        elif b:
            b[min(at, len(b) - 1)] ^= 1 << rnd.randrange(8)
    return bytes(b)


@given(writesets(), st.integers(0, 2**32))
@settings(max_examples=500 * SCALE, deadline=None)
def test_damaged_writesets(buf: bytes, seed: int) -> None:
    same(damage(random.Random(seed), buf))


@given(st.binary(max_size=200))
@settings(max_examples=300 * SCALE, deadline=None)
def test_any_bytes(buf: bytes) -> None:
    same(b"CW\x02" + buf)
    same(buf)


def test_many_keys_need_a_second_call() -> None:
    """More keys than the caller's first array holds: scanned again with room for all."""
    ks = tuple(wire.Key(wire.KeyMode.UPDATE, (b"p", b"t", b"id", str(i).encode())) for i in range(300))
    buf = wire.encode(wire.Writeset(1, 2, 3, (), (), ks))
    assert same(buf) is None and len(native.scan(buf).keys) == 300


# ---- the words of a key (native/text.c) -----------------------------------------------------------

utf8ish = st.one_of(st.binary(max_size=12), st.text(max_size=6).map(lambda x: x.encode("utf-8", "surrogatepass")),
                    st.lists(st.sampled_from([b"\xe0", b"\xa0", b"\xed", b"\x9f", b"\xbf", b"\xf0", b"\x90", b"\xf4",
                                              b"\x8f", b"\xc2", b"\x80", b"\xff", b"'", b'"', b"\\", b"a", b"\n"]),
                             max_size=8).map(b"".join))


@given(st.lists(utf8ish, min_size=1, max_size=6))
@settings(max_examples=1000 * SCALE, deadline=None)
def test_key_describe_is_pythons(parts: list[bytes]) -> None:
    """Key.describe in C: CPython's UTF-8 replacement, quote_ident, and the repr of one part."""
    assert native.describe_key(parts) == wire.Key(wire.KeyMode.UPDATE, tuple(parts)).describe()


def test_key_describe_every_short_sequence() -> None:
    """Every sequence of up to three bytes from each class of UTF-8's lead and continuation bytes
    (the edges of the ranges a lead byte allows its next byte), in a value and in a name."""
    edge = [0x00, 0x22, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC,
            0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]
    seqs = [bytes([a]) for a in edge] + [bytes([a, b]) for a in edge for b in edge]
    seqs += [bytes([a, b, c]) for a in edge if a >= 0xE0 for b in edge if 0x80 <= b <= 0xBF for c in edge]
    for seq in seqs:
        for parts in ([b"s", b"t", b"c", seq + b"\x80\xf0\x90\x80"], [seq, b"t"]):
            assert native.describe_key(parts) == wire.Key(wire.KeyMode.UPDATE, tuple(parts)).describe(), parts


def test_key_describe_long() -> None:
    parts = [b"public", b"t", b"id", b"x" * 1000]
    assert native.describe_key(parts) == wire.Key(wire.KeyMode.UPDATE, tuple(parts)).describe()


# ---- no read past the end, under AddressSanitizer -------------------------------------------------

_ASAN_RUNNER = r"""
import ctypes, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("chorus.dataplane._native", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
ffi, lib = m.ffi, m.lib
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
info, keys = ffi.new("ch_scan_info *"), ffi.new("ch_scan_key[]", 4)
codes = {}
for line in open(sys.argv[2]):
    data = bytes.fromhex(line.strip())
    p = libc.malloc(max(len(data), 1))  # exactly its size: a read past it is caught
    ctypes.memmove(p, data, len(data))
    rc = lib.ch_scan(ffi.cast("uint8_t *", p), len(data), info, keys, 4)
    libc.free(p)
    codes[str(rc)] = codes.get(str(rc), 0) + 1
print(json.dumps(codes))
"""


def test_no_overread_under_address_sanitizer(tmp_path: Path) -> None:
    from chorus.dataplane import build

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc for AddressSanitizer")
    asan = subprocess.run([gcc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not asan or not Path(asan).exists():
        pytest.skip("no libasan")
    try:
        module = build.compile_into(tmp_path / "asan", sanitize=True)
    except Exception as e:  # noqa: BLE001 - a toolchain without the sanitizer's runtime
        pytest.skip(f"cannot build with AddressSanitizer: {e}")
    rnd = random.Random(37)
    good = [p.read_bytes() for p in sorted(GOLDEN.glob("*.ws"))] + [BROKEN[r.name]() for r in wire.RULES]
    corpus = []
    for buf in good:
        corpus += [buf[:n] for n in range(len(buf) + 1)]
        corpus += [damage(rnd, buf) for _ in range(200 * SCALE)]
    (tmp_path / "corpus").write_text("\n".join(b.hex() for b in corpus) + "\n")
    (tmp_path / "run.py").write_text(_ASAN_RUNNER)
    env = dict(os.environ, LD_PRELOAD=asan, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0", PYTHONMALLOC="malloc")
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(module), str(tmp_path / "corpus")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads(proc.stdout.splitlines()[-1])
    assert sum(codes.values()) == len(corpus)
    assert set(codes) <= {"0", "-2", "-6"}, codes  # good, more keys than 4, malformed
    assert codes.get("-6", 0) > len(corpus) // 2


def test_old_columns_are_scanned_as_decoded() -> None:
    """An old image with a value per column (TABLE_OLD_COLUMNS) is read by the C scan as by
    the Python reader; the identity's width is refused by both alike."""
    t = wire.Table("public", "counters", (wire.Column("id", "integer"), wire.Column("hits", "bigint")), (0,),
                   old_columns=True)
    old = (wire.Binary(b"\0\0\0\1"), wire.Binary(b"\0" * 7 + b"\5"))
    keys = (wire.Key(wire.KeyMode.UPDATE, (b"public", b"counters", b"id", b"1")),)
    ok = wire.Writeset(1, 2, 3, (t,), (wire.Row("U", 0, old, old), wire.Row("D", 0, old)), keys)
    assert same(wire.encode(ok)) is None
    narrow = wire.Writeset(1, 2, 3, (t,), (wire.Row("D", 0, old[:1]),), keys)
    assert same(wire.encode(narrow)) == "WIDTH"
