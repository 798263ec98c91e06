"""The events the order/commit core takes and the actions it produces (docs/NATIVE.md, sections
2.2, 2.4 and 4.1): their codes, their records, and the codec of a record's body.

This is the boundary as the core is wired today (``dataplane/refcore.py``: the replicator, the
commit book, the scheduler, the certifier and the log feeder, wired as the simulation's
coordinator wires them), before step 0 splits ``Replicator`` and ``CommitPipeline``. Where the
set differs from NATIVE.md's tables, it is because today's core takes its inputs that way; each
record's docstring says what the shell saw.

Every record has a header besides its body:

- ``depth``: 0 for an event the shell fed between two others; n+1 for one fed while the core was
  carrying out an action of an event of depth n (a control-plane call or command made from a
  handoff's handler: NATIVE.md 2.5's ``CALL`` "at that position"). An action has the depth of
  the event that produced it.
- ``seq``: the number of the event (1, 2, ...); an action carries its event's.
- ``mono`` and ``wall``: the shell's times when the event was fed, as the float seconds the core
  reads (``Replicator.tick(now)``, ``Replicator.clock``): the simulation's clock is a float, and
  a rounded time could change a decision on replay.

Bodies are big-endian fields in the protocols' style: integers, ``str`` = u16 length + UTF-8,
``blob`` = u32 length + bytes, lists = u32 count + items. :func:`decode_body` refuses anything
that is not exactly one body of the record's code.
"""

from __future__ import annotations

import enum
import re
import struct
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, ClassVar, Union

MAX_STR = 0xFFFF
MAX_BLOB = 64 << 20  # a bus message or a writeset in a trace (larger ones are spooled: step 4)
MAX_ITEMS = 1 << 20


class TraceError(ValueError):
    """A trace (or one record of it) is malformed, truncated, of an unknown version or code."""


class ApplyOutcome(enum.IntEnum):
    """How an apply of a run ended, as the shell saw it (``APPLY_RESULT``)."""

    OK = 0  # applied and committed (or found committed already: CH001)
    GONE = 1  # a GID of the run is no longer pending (a restart, a replay meanwhile)
    DB_DOWN = 2  # PostgreSQL was gone
    FAILED = 3  # an error: the GIDs go again one by one, or a GID alone goes to the vote
    PARTLY = 4  # its first GIDs were committed here already (``committed``): pipeline.partly_committed


# ---- records ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One record of a trace: an event (code 0x01-0x3F) or an action (0x81-0xBF)."""

    CODE: ClassVar[int]
    SPEC: ClassVar[tuple[tuple[str, str], ...]]
    _: KW_ONLY
    depth: int = 0
    seq: int = 0
    mono: float = 0.0
    wall: float = 0.0
    # the live object behind an action (the Action of a handoff, the BackendRef of a verdict),
    # for the shell that carries it out; neither encoded nor compared
    obj: Any = field(default=None, compare=False, repr=False)

    @property
    def is_event(self) -> bool:
        return self.CODE < 0x80

    @property
    def name(self) -> str:
        return _NAMES[self.CODE]


# -- events


@dataclass(frozen=True)
class Start(Record):
    """The core is created: its configuration and starting state, as JSON (node, member,
    cluster_uuid, last_gid, bootstrap, epochs, records, workers, run, lanes, and the log's
    capacity, base, max_payload and the GIDs it holds)."""

    CODE = 0x01
    SPEC = (("config", "str"),)
    config: str


@dataclass(frozen=True)
class ViewEv(Record):
    """A membership change of the bus (``bus.View``)."""

    CODE = 0x02
    SPEC = (("view_id", "u64"), ("members", "strs"), ("joined", "strs"), ("left", "strs"), ("local", "str"),
            ("quorate", "bool"), ("quorum", "u32"), ("expected", "u32"), ("tie_breaker", "str"))
    view_id: int
    members: tuple[str, ...]
    joined: tuple[str, ...]
    left: tuple[str, ...]
    local: str
    quorate: bool
    quorum: int
    expected: int
    tie_breaker: str


@dataclass(frozen=True)
class Deliver(Record):
    """A bus message delivered in total order."""

    CODE = 0x03
    SPEC = (("sender", "str"), ("payload", "blob"))
    sender: str
    payload: bytes


@dataclass(frozen=True)
class Flush(Record):
    """The shell's send point: the end of a read of the bus, or the pump after a backend's
    writeset (``BusSender.pump``). NATIVE.md's ``FLUSH`` also flushes the log feeder and
    dispatches; today's core does those at the end of each event instead."""

    CODE = 0x04
    SPEC = ()


@dataclass(frozen=True)
class WritesetEv(Record):
    """A backend's ``W`` frame: its writeset, taken for the bus (the core numbers the ticket)."""

    CODE = 0x05
    SPEC = (("payload", "blob"),)
    payload: bytes


@dataclass(frozen=True)
class Committed(Record):
    """A local backend committed certified GID ``gid`` (its ``C`` frame)."""

    CODE = 0x06
    SPEC = (("gid", "u64"),)
    gid: int


@dataclass(frozen=True)
class Tick(Record):
    """The 200 ms timer (``Replicator.tick``)."""

    CODE = 0x07
    SPEC = ()


@dataclass(frozen=True)
class DbCommitted(Record):
    """The tick's query: the database's committed GID (NATIVE.md's ``DB_PROGRESS``, committed half)."""

    CODE = 0x08
    SPEC = (("gid", "u64"),)
    gid: int


@dataclass(frozen=True)
class DbDurable(Record):
    """The tick's query: the database's durable GID (``DB_PROGRESS``, durable half)."""

    CODE = 0x09
    SPEC = (("gid", "u64"),)
    gid: int


@dataclass(frozen=True)
class DbLost(Record):
    """The database connection was lost."""

    CODE = 0x0A
    SPEC = ()


@dataclass(frozen=True)
class DbBack(Record):
    """PostgreSQL is back, holding everything up to ``durable`` (NATIVE.md's ``RESTART``)."""

    CODE = 0x0B
    SPEC = (("durable", "u64"),)
    durable: int


@dataclass(frozen=True)
class DbUp(Record):
    """State the shell pushes: whether the database is up (it gates dispatch)."""

    CODE = 0x0C
    SPEC = (("up", "bool"),)
    up: bool


@dataclass(frozen=True)
class ApplyResult(Record):
    """An apply the core dispatched (``APPLY``) ended: how (:class:`ApplyOutcome`); ``committed``:
    the GID found committed (PARTLY); ``error``: what the shell says failed (FAILED)."""

    CODE = 0x0D
    SPEC = (("outcome", "u8"), ("replay", "bool"), ("epoch", "u32"), ("run", "u64s"), ("committed", "u64"),
            ("error", "str"))
    outcome: int
    replay: bool
    epoch: int
    run: tuple[int, ...]
    committed: int
    error: str


@dataclass(frozen=True)
class Send(Record):
    """The control plane sends a bus message (NATIVE.md's ``SEND``): it goes through the core's
    sender, so lost-message detection sees every message of the node."""

    CODE = 0x0E
    SPEC = (("payload", "blob"),)
    payload: bytes


@dataclass(frozen=True)
class Skip(Record):
    """Inconsistency voting: GID ``gid`` commits empty here (``SKIP``)."""

    CODE = 0x0F
    SPEC = (("gid", "u64"),)
    gid: int


@dataclass(frozen=True)
class HoldLive(Record):
    """State the shell pushes: whether a catch-up holds the live stream (``HOLD_LIVE``)."""

    CODE = 0x10
    SPEC = (("on", "bool"),)
    on: bool


@dataclass(frozen=True)
class AdmitHeld(Record):
    """A catch-up admits the live writesets it held (``ADMIT`` after ``HELD``): each
    (gid, prev, origin, settle, payload)."""

    CODE = 0x11
    SPEC = (("applies", "applies"),)
    applies: tuple[tuple[int, int, str, bool, bytes], ...]


@dataclass(frozen=True)
class AdmitRun(Record):
    """A catch-up admits a run of log records, committed as one (``ADMIT_RUN``): each
    (gid, origin, flags, payload), logged already."""

    CODE = 0x12
    SPEC = (("prev", "u64"), ("records", "logrecs"))
    prev: int
    records: tuple[tuple[int, str, int, bytes], ...]


@dataclass(frozen=True)
class AdmitOne(Record):
    """A catch-up admits one log record alone (``ADMIT``)."""

    CODE = 0x13
    SPEC = (("prev", "u64"), ("records", "logrecs"))
    prev: int
    records: tuple[tuple[int, str, int, bytes], ...]


@dataclass(frozen=True)
class LogRec(Record):
    """A catch-up record goes to this node's log (its run is admitted later)."""

    CODE = 0x14
    SPEC = (("records", "logrecs"),)
    records: tuple[tuple[int, str, int, bytes], ...]


@dataclass(frozen=True)
class Call(Record):
    """A call of the control plane into the order core (``CALL``): ``progress``,
    ``held_released``, ``recovered`` (``number``: the committed GID it passed),
    ``recovery_failed`` (``text``: why) or ``backend_gone`` (``number``: the ticket whose backend
    closed its socket before its verdict). Its actions are carried out at once."""

    CODE = 0x15
    SPEC = (("call", "str"), ("number", "u64"), ("text", "str"))
    call: str
    number: int
    text: str


@dataclass(frozen=True)
class Dispatch(Record):
    """The shell's deferred dispatch (``CommitPipeline.dispatch_soon``) came due."""

    CODE = 0x16
    SPEC = ()


@dataclass(frozen=True)
class Stopped(Record):
    """The shell stopped the process (a vote put the node out): the core acts no more."""

    CODE = 0x17
    SPEC = ()


@dataclass(frozen=True)
class Random(Record):
    """128 random bits the core drew (``uuid.uuid4``: a request id, a new cluster's UUID), at the
    point it drew them: an input, so that a replay draws the same."""

    CODE = 0x18
    SPEC = (("bits", "blob"),)
    bits: bytes


# -- actions


@dataclass(frozen=True)
class Verdict(Record):
    """The ``V`` frame to the backend of ``ticket``: committed at ``gid`` after ``prev``, its
    commit waiting for ``wait_for``; or failed (``reason``), ``unknown`` when the outcome is."""

    CODE = 0x81
    SPEC = (("ticket", "u64"), ("ok", "bool"), ("unknown", "bool"), ("gid", "u64"), ("prev", "u64"),
            ("wait_for", "u64"), ("reason", "str"))
    ticket: int
    ok: bool
    unknown: bool
    gid: int
    prev: int
    wait_for: int
    reason: str


@dataclass(frozen=True)
class BusSend(Record):
    """A message to the bus, with the tickets of the local writesets it carries."""

    CODE = 0x82
    SPEC = (("payload", "blob"), ("tickets", "u64s"))
    payload: bytes
    tickets: tuple[int, ...]


@dataclass(frozen=True)
class LogAppend(Record):
    """Records appended to the writeset log, in one write: each (gid, origin, flags, payload).
    The on-disk header (CRC32C, segment seq) comes with NATIVE.md's log window."""

    CODE = 0x83
    SPEC = (("records", "logrecs"),)
    records: tuple[tuple[int, str, int, bytes], ...]


@dataclass(frozen=True)
class LogReset(Record):
    """The log starts again after ``gid`` (a record larger than the ring)."""

    CODE = 0x84
    SPEC = (("gid", "u64"),)
    gid: int


@dataclass(frozen=True)
class ApplyRun(Record):
    """Apply ``run`` (one GID for a replay of a local writeset) in one session; its commit waits
    for ``wait_for``. ``epoch``: the restarts of PostgreSQL seen, for ``APPLY_RESULT``."""

    CODE = 0x85
    SPEC = (("replay", "bool"), ("epoch", "u32"), ("wait_for", "u64"), ("run", "u64s"))
    replay: bool
    epoch: int
    wait_for: int
    run: tuple[int, ...]


@dataclass(frozen=True)
class Handoff(Record):
    """An action the core hands to the control plane (a ``Replicator`` action other than a
    verdict, an apply or a send): its kind and its text."""

    CODE = 0x86
    SPEC = (("kind", "str"), ("body", "str"))
    kind: str
    body: str


@dataclass(frozen=True)
class Notify(Record):
    """An unordered notification: ``HELD`` (a live writeset a catch-up holds), ``COMMITTED``
    (for voting), ``APPLY_FAILED`` (``text``: why), ``DISPATCH_SOON``."""

    CODE = 0x87
    SPEC = (("kind", "str"), ("gid", "u64"), ("text", "str"))
    kind: str
    gid: int
    text: str


EVENTS: tuple[type[Record], ...] = (Start, ViewEv, Deliver, Flush, WritesetEv, Committed, Tick, DbCommitted,
                                    DbDurable, DbLost, DbBack, DbUp, ApplyResult, Send, Skip, HoldLive, AdmitHeld,
                                    AdmitRun, AdmitOne, LogRec, Call, Dispatch, Stopped, Random)
ACTIONS: tuple[type[Record], ...] = (Verdict, BusSend, LogAppend, LogReset, ApplyRun, Handoff, Notify)
BY_CODE: dict[int, type[Record]] = {cls.CODE: cls for cls in (*EVENTS, *ACTIONS)}
_NAMES = {cls.CODE: re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__.removesuffix("Ev")).upper() for cls in BY_CODE.values()}
assert len(BY_CODE) == len(EVENTS) + len(ACTIONS)
assert all(c.CODE < 0x40 for c in EVENTS) and all(0x80 < c.CODE < 0xC0 for c in ACTIONS)


# ---- the body codec -------------------------------------------------------------------------

_U8, _U16, _U32, _U64 = struct.Struct(">B"), struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">Q")
Field = Union[int, bool, str, bytes, tuple[Any, ...]]


def _put_str(out: bytearray, s: str) -> None:
    b = s.encode("utf-8", "surrogateescape")
    if len(b) > MAX_STR:
        raise TraceError(f"string of {len(b)} bytes: at most {MAX_STR}")
    out += _U16.pack(len(b)) + b


def _put_blob(out: bytearray, b: bytes) -> None:
    if len(b) > MAX_BLOB:
        raise TraceError(f"blob of {len(b)} bytes: at most {MAX_BLOB}")
    out += _U32.pack(len(b))
    out += b


def _put_int(out: bytearray, st: struct.Struct, v: int) -> None:
    try:
        out += st.pack(v)
    except struct.error as e:
        raise TraceError(f"integer {v} out of range: {e}") from None


def _put(out: bytearray, kind: str, v: Any) -> None:
    if kind == "u8":
        _put_int(out, _U8, v)
    elif kind == "bool":
        out += b"\x01" if v else b"\x00"
    elif kind == "u32":
        _put_int(out, _U32, v)
    elif kind == "u64":
        _put_int(out, _U64, v)
    elif kind == "str":
        _put_str(out, v)
    elif kind == "blob":
        _put_blob(out, bytes(v))
    elif kind in ("u64s", "strs", "applies", "logrecs"):
        if len(v) > MAX_ITEMS:
            raise TraceError(f"list of {len(v)} items: at most {MAX_ITEMS}")
        out += _U32.pack(len(v))
        for item in v:
            if kind == "u64s":
                _put_int(out, _U64, item)
            elif kind == "strs":
                _put_str(out, item)
            elif kind == "applies":
                gid, prev, origin, settle, payload = item
                _put_int(out, _U64, gid)
                _put_int(out, _U64, prev)
                _put_str(out, origin)
                out += b"\x01" if settle else b"\x00"
                _put_blob(out, payload)
            else:
                gid, origin, flags, payload = item
                _put_int(out, _U64, gid)
                _put_str(out, origin)
                _put_int(out, _U8, flags)
                _put_blob(out, payload)
    else:  # pragma: no cover - a SPEC names a kind this codec does not have
        raise AssertionError(kind)


def encode_body(rec: Record) -> bytes:
    out = bytearray()
    for name, kind in rec.SPEC:
        _put(out, kind, getattr(rec, name))
    return bytes(out)


class _Reader:
    """Reads fields from ``buf[pos:end]``; every read past ``end`` is a TraceError."""

    def __init__(self, buf: bytes, pos: int, end: int) -> None:
        self.buf, self.pos, self.end = buf, pos, end

    def take(self, n: int) -> bytes:
        if n > self.end - self.pos:
            raise TraceError(f"record body truncated: {n} bytes wanted, {self.end - self.pos} left")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def num(self, st: struct.Struct) -> int:
        v: int = st.unpack(self.take(st.size))[0]
        return v

    def flag(self) -> bool:
        b = self.num(_U8)
        if b > 1:
            raise TraceError(f"boolean byte {b}: expected 0 or 1")
        return b == 1

    def text(self) -> str:
        raw = self.take(self.num(_U16))
        try:
            return raw.decode("utf-8", "surrogateescape")
        except UnicodeDecodeError as e:  # pragma: no cover - surrogateescape decodes any bytes
            raise TraceError(f"string not UTF-8: {e}") from None

    def blob(self) -> bytes:
        n = self.num(_U32)
        if n > MAX_BLOB:
            raise TraceError(f"blob of {n} bytes: at most {MAX_BLOB}")
        return self.take(n)

    def count(self, smallest: int) -> int:
        n = self.num(_U32)
        if n > MAX_ITEMS or n * smallest > self.end - self.pos:
            raise TraceError(f"list of {n} items does not fit the {self.end - self.pos} bytes left")
        return n

    def field(self, kind: str) -> Field:
        if kind == "u8":
            return self.num(_U8)
        if kind == "bool":
            return self.flag()
        if kind == "u32":
            return self.num(_U32)
        if kind == "u64":
            return self.num(_U64)
        if kind == "str":
            return self.text()
        if kind == "blob":
            return self.blob()
        if kind == "u64s":
            return tuple(self.num(_U64) for _ in range(self.count(8)))
        if kind == "strs":
            return tuple(self.text() for _ in range(self.count(2)))
        if kind == "applies":
            return tuple((self.num(_U64), self.num(_U64), self.text(), self.flag(), self.blob())
                         for _ in range(self.count(23)))
        if kind == "logrecs":
            return tuple((self.num(_U64), self.text(), self.num(_U8), self.blob()) for _ in range(self.count(15)))
        raise AssertionError(kind)  # pragma: no cover


def decode_body(code: int, buf: bytes, pos: int, end: int, depth: int, seq: int, mono: float,
                wall: float) -> Record:
    """The record of ``code`` whose body is exactly ``buf[pos:end]``."""
    cls = BY_CODE.get(code)
    if cls is None:
        raise TraceError(f"unknown record code 0x{code:02x}")
    r = _Reader(buf, pos, end)
    values = [r.field(kind) for _, kind in cls.SPEC]
    if r.pos != end:
        raise TraceError(f"{_NAMES[code]} record has {end - r.pos} bytes after its body")
    return cls(*values, depth=depth, seq=seq, mono=mono, wall=wall)


def _short(v: Any) -> str:
    if isinstance(v, bytes) and len(v) > 16:
        return f"<{len(v)} bytes {v[:12].hex()}…>"
    if isinstance(v, tuple):
        return "(" + ", ".join(_short(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return repr(v)


def describe(rec: Record, width: int = 160) -> str:
    """One line for a person: the header and the body, long bytes shortened."""
    parts = [f"{name}={_short(getattr(rec, name))}" for name, _ in rec.SPEC]
    line = f"{'  ' * rec.depth}{rec.name}#{rec.seq} @{rec.mono:.6f} " + " ".join(parts)
    return line if len(line) <= width else line[:width - 1] + "…"
