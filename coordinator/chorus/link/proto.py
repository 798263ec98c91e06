"""The link stream's wire format, version 4 (docs/LINKS.md section 2; the sender and the
receiver are sender.py and receiver.py). Each frame has a ``write_X`` beside its reading in
:func:`decode`, as recoveryproto.py has for the recovery stream, whose record framing it reuses.

Inside TLS (each site verifies the other's certificate), frames ``u8 kind, u32 length, body``,
kinds in :class:`FrameKind`, integers big-endian, names as ``u8 length, UTF-8``:

- receiver: HELLO ``u16 version, link, receiver site, sender site, u64 applied GID, u64 peer
  clock, nonce[16]``: stream the sender site's transactions after the last one applied here,
  never sending a clock value below the one last seen (a :class:`Position`);
- sender: PROOF ``nonce[16], mac[32]`` or ERROR; receiver: PROOF ``nonce[16], mac[32]``
  repeating its HELLO nonce. A mac is HMAC-SHA256 with the link secret over the role, the link
  name, both site UUIDs and both nonces (:func:`proof`), so a stream can be neither replayed
  nor taken to another link or between other sites;
- sender, for as long as the connection lasts: RECORD or PART frames (one transaction each:
  recovery's record frames, the GID as the record's GID, the origin site as its origin, the
  payload ``u64 commit time, writeset``), CLOCK ``site, u64 value`` frames (section 4), and at
  the end one END ``u64 last GID passed`` (the sender stops serving) or one ERROR (UTF-8);
- receiver, from version 2, for as long as the connection lasts: APPLIED ``u64 GID``, the last
  transaction of the sending site applied here (committed in this site's order), so the sender's
  site keeps its log from there (its pin, docs/LINKS.md section 2). Version 1 (no APPLIED) is
  still served;
- from version 3 the HELLO ends with ``u8 mode``: :data:`STREAM` (the above) or :data:`COPY`, a
  re-instantiation (docs/LINKS.md section 10): after the proofs the sender pins its log at its
  snapshot's GID G and sends SNAPSHOT ``u64 G, u8 receives, u64 applied`` (whether the sending
  site receives the link too, and then the receiving site's last GID it had applied as of G), then the rows the link carries as of G, each
  table's in the order of its key's text (bytewise), as RECORD or PART frames of GID G whose
  writeset holds one table and INSERTs of a batch of its rows (a writeset of the table without
  rows: the table is complete), and at the end COPIED ``u64 G, u64 rows sent``; or ERROR;
- from version 4 a RECORD's origin may be a third site: a transaction the sending site applied
  from another of its links and forwards (a chain A-B-C, docs/LINKS.md section 10), never the
  receiving site itself; the frames are laid out as in version 3. A sender that forwards
  refuses a receiver of an earlier version (ERROR), which would take such a record for a
  protocol error.

Every length is bounded (:data:`MAX_BODY` per kind, names at most :data:`MAX_NAME` bytes of
``[A-Za-z0-9_.:-]``) and anything malformed raises :class:`LinkProtocolError`.
"""

from __future__ import annotations

import asyncio
import enum
import re
import ssl
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Union

from chorus import recoveryproto as rp
from chorus import wire
from chorus.link.events import ClockEvent, RemoteTransaction, SiteId
from chorus.recovery import read_secret, tls_context
from chorus.recoveryproto import RecoveryError
from chorus.spool import Spool, SpooledBuffer
from chorus.wslog import LogRecord

PROTOCOL = 4  # 2: APPLIED frames from the receiver; 3: the HELLO's mode, the copy (SNAPSHOT, COPIED);
# 4: RECORDs of a third site's transactions, forwarded
PROTOCOLS = (1, 2, 3, 4)  # the versions a sender serves
FORWARDED = 4  # the first version whose receivers take a third site's transactions
STREAM, COPY = 0, 1  # a HELLO's mode (version 3): stream the log, or copy the tables (re-instantiation)
NONCE_BYTES = 16
MAC_BYTES = 32
MAX_NAME = 64
MAX_ERROR = 4096
HANDSHAKE_TIMEOUT_S = rp.HANDSHAKE_TIMEOUT_S
BROKEN = "link-broken:"  # an ERROR's text: the sender's log no longer holds what the receiver needs

_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,%d}\Z" % MAX_NAME)


class LinkError(Exception):
    """The link's stream failed (network, authentication, protocol); the receiver tries again."""


class LinkProtocolError(LinkError):
    """A frame that is not valid link protocol (the only error decoding raises)."""


class LinkBroken(LinkError):
    """The sender's log no longer holds GIDs the receiver has not applied: the link must be
    instantiated again (docs/LINKS.md section 10), never skip them."""

    def __init__(self, first: int, last: int) -> None:
        super().__init__(f"link broken: GIDs {first}..{last} are gone from the log")
        self.first, self.last = first, last


class FrameKind(bytes, enum.Enum):
    """A link frame's kind byte (RECORD, PART, END and ERROR as in recovery's stream)."""
    HELLO = b"H"
    PROOF = b"A"
    RECORD = b"R"
    PART = b"P"
    CLOCK = b"C"
    END = b"E"
    ERROR = b"X"
    APPLIED = b"V"
    SNAPSHOT = b"S"
    COPIED = b"D"


_RECORD_HEAD = 8 + 1 + 2 + MAX_NAME  # recovery's record head with a site as origin
MAX_BODY = {
    FrameKind.HELLO: 2 + 3 * (1 + MAX_NAME) + 16 + NONCE_BYTES + 1,
    FrameKind.PROOF: NONCE_BYTES + MAC_BYTES,
    FrameKind.RECORD: _RECORD_HEAD + rp.PART_BYTES,
    FrameKind.PART: _RECORD_HEAD + 16 + rp.PART_BYTES,
    FrameKind.CLOCK: 1 + MAX_NAME + 8,
    FrameKind.END: 8,
    FrameKind.ERROR: MAX_ERROR,
    FrameKind.APPLIED: 8,
    FrameKind.SNAPSHOT: 17,
    FrameKind.COPIED: 16,
}

_HEAD = struct.Struct(">cI")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_PART = struct.Struct(">QQ")


@dataclass(frozen=True)
class Position:
    """Where a receiver resumes (``chorus.link_position``, docs/LINKS.md section 3): the last
    GID of the sending site it applied, and the sending site's clock value it last saw
    (clock.WindowState.peer_clock: a CLOCK frame may have taken it past that GID)."""

    applied_gid: int
    peer_clock: int = 0


@dataclass(frozen=True)
class Hello:
    link: str
    receiver: SiteId
    sender: SiteId
    position: Position
    nonce: bytes
    version: int = PROTOCOL
    mode: int = STREAM  # COPY: a re-instantiation (version 3 on)


@dataclass(frozen=True)
class Proof:
    nonce: bytes
    mac: bytes


@dataclass(frozen=True)
class Record:
    """One transaction of the sending site: its GID there (its clock), origin site and commit
    time (µs since the Unix epoch), and its writeset as the rules left it, encoded (bytes, or a
    spooled buffer when it was gathered in a spool file)."""

    gid: int
    site: SiteId
    commit_time: int
    writeset: Any


@dataclass(frozen=True)
class Part:
    """One PART frame, checked; a :class:`Reassembler` joins them into a :class:`Record`."""

    body: bytes


@dataclass(frozen=True)
class End:
    gid: int  # the last GID the sender passed (sent, or filtered out)


@dataclass(frozen=True)
class Error:
    text: str


@dataclass(frozen=True)
class Applied:
    gid: int  # the last GID of the sending site the receiving site applied


@dataclass(frozen=True)
class Snapshot:
    gid: int  # the sending site's GID the copy is as of (its log is pinned there)
    receives: bool = False  # the sending site receives this link too (it goes both ways)
    applied: int = 0  # then: the receiving site's last GID it had applied as of ``gid`` (its link_position)


@dataclass(frozen=True)
class Copied:
    gid: int  # the snapshot's GID
    rows: int  # the rows sent (after the link's rules)


Frame = Union[Hello, Proof, Record, Part, ClockEvent, End, Error, Applied, Snapshot, Copied]


# ---- keys ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkKeys:
    """What a site holds for one link (docs/LINKS.md section 2): the certificate and key it
    presents (its cluster's), the peer site's certificate (the only one it accepts) and the
    secret both sites share for the link (a file of at least 32 bytes)."""

    cert: str
    key: str
    peer_cert: str
    secret_file: str

    def secret(self) -> bytes:
        return read_secret(self.secret_file)

    def context(self, server: bool) -> ssl.SSLContext:
        return tls_context(self.cert, self.key, self.peer_cert, server)


@dataclass(frozen=True)
class LinkEnd:
    """One site's end of a link, what both the sender and the receiver prove: the link's name,
    this site's UUID, the peer site's UUID and the keys."""

    link: str
    site: SiteId
    peer: SiteId
    keys: LinkKeys

    def __post_init__(self) -> None:
        for name in (self.link, self.site, self.peer):
            _name(name)
        if self.site == self.peer:
            raise ValueError("a link joins two different sites")


def proof(secret: bytes, role: bytes, link: str, sender: SiteId, receiver: SiteId, first: bytes,
          second: bytes) -> bytes:
    """The mac ``role`` (b"sender" or b"receiver") proves holding the link secret with: over
    the link name, both sites and both nonces (the prover's peer's first)."""
    return bytes.fromhex(rp.proof(secret, role, link, sender, receiver, first.hex(), second.hex(),
                                  protocol=b"chorus-link"))


def valid_name(name: str) -> bool:
    """A link name or site UUID the protocol carries (and the proof joins with ``|``)."""
    return _NAME.match(name) is not None


# ---- writing ------------------------------------------------------------------------------


def _frame(kind: FrameKind, body: bytes) -> bytes:
    return _HEAD.pack(kind.value, len(body)) + body


def _name(s: str) -> bytes:
    if not valid_name(s):
        raise ValueError(f"{s!r} is not a valid link or site name (at most {MAX_NAME} of A-Z a-z 0-9 _ . : -)")
    b = s.encode()
    return bytes([len(b)]) + b


def write_hello(h: Hello) -> bytes:
    if len(h.nonce) != NONCE_BYTES:
        raise ValueError(f"a nonce has {NONCE_BYTES} bytes")
    if h.mode not in (STREAM, COPY) or (h.mode != STREAM and h.version < 3):
        raise ValueError(f"HELLO mode {h.mode} in link protocol version {h.version}")
    return _frame(FrameKind.HELLO, _U16.pack(h.version) + _name(h.link) + _name(h.receiver) + _name(h.sender)
                  + _U64.pack(h.position.applied_gid) + _U64.pack(h.position.peer_clock) + h.nonce
                  + (bytes([h.mode]) if h.version >= 3 else b""))


def write_proof(p: Proof) -> bytes:
    if len(p.nonce) != NONCE_BYTES or len(p.mac) != MAC_BYTES:
        raise ValueError(f"a proof has a {NONCE_BYTES}-byte nonce and a {MAC_BYTES}-byte mac")
    return _frame(FrameKind.PROOF, p.nonce + p.mac)


def write_record(r: Record) -> Iterator[bytes]:
    """The frames of one transaction: one RECORD frame, or PART frames of at most
    recoveryproto.PART_BYTES payload bytes each for a larger one."""
    _name(r.site)
    payload = _U64.pack(r.commit_time) + bytes(r.writeset)
    return rp.encode_record_frames(LogRecord(r.gid, r.site, 0, payload))


def write_clock(e: ClockEvent) -> bytes:
    return _frame(FrameKind.CLOCK, _name(e.site) + _U64.pack(e.value))


def write_end(e: End) -> bytes:
    return _frame(FrameKind.END, _U64.pack(e.gid))


def write_applied(a: Applied) -> bytes:
    return _frame(FrameKind.APPLIED, _U64.pack(a.gid))


def write_snapshot(s: Snapshot) -> bytes:
    return _frame(FrameKind.SNAPSHOT, _U64.pack(s.gid) + bytes([int(s.receives)]) + _U64.pack(s.applied))


def write_copied(c: Copied) -> bytes:
    return _frame(FrameKind.COPIED, _U64.pack(c.gid) + _U64.pack(c.rows))


def write_error(e: Error) -> bytes:
    return _frame(FrameKind.ERROR, e.text.encode()[:MAX_ERROR])


def broken(e: LinkBroken) -> Error:
    """The ERROR frame that tells the receiver its link is broken (:func:`error`)."""
    return Error(f"{BROKEN} {e.first} {e.last}")


# ---- reading ------------------------------------------------------------------------------


class _Body:
    """Reads one frame's body field by field; running past its end is a protocol error."""

    def __init__(self, kind: FrameKind, body: bytes) -> None:
        self.kind, self.body, self.at = kind, body, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.body):
            raise LinkProtocolError(f"{self.kind.name} frame truncated")
        out = self.body[self.at:self.at + n]
        self.at += n
        return out

    def u16(self) -> int:
        return int(_U16.unpack(self.take(2))[0])

    def u64(self) -> int:
        return int(_U64.unpack(self.take(8))[0])

    def name(self) -> str:
        raw = self.take(self.take(1)[0])
        text = raw.decode("utf-8", "replace")
        if not valid_name(text):
            raise LinkProtocolError(f"{self.kind.name} frame: {raw!r} is not a valid link or site name")
        return text

    def done(self) -> None:
        if self.at != len(self.body):
            raise LinkProtocolError(f"{self.kind.name} frame has {len(self.body) - self.at} bytes too many")


def frame_head(head: bytes) -> tuple[FrameKind, int]:
    """A frame's kind and body length from its 5-byte head; an unknown kind, or a length over
    the kind's bound, is refused."""
    kind, n = _HEAD.unpack(head)
    try:
        known = FrameKind(kind)
    except ValueError:
        raise LinkProtocolError(f"unknown frame type {kind!r}") from None
    if n > MAX_BODY[known]:
        raise LinkProtocolError(f"{known.name} frame of {n} bytes (at most {MAX_BODY[known]})")
    return known, n


def decode(kind: FrameKind, body: bytes) -> Frame:
    """The frame of kind ``kind`` with ``body``; :class:`LinkProtocolError` if it is malformed."""
    if len(body) > MAX_BODY[kind]:
        raise LinkProtocolError(f"{kind.name} frame of {len(body)} bytes (at most {MAX_BODY[kind]})")
    b = _Body(kind, body)
    frame: Frame
    if kind == FrameKind.HELLO:
        version = b.u16()
        if version not in PROTOCOLS:  # a later version may lay out the rest differently
            raise LinkProtocolError(f"link protocol version {version} is not spoken here (this site speaks "
                                    f"{', '.join(map(str, PROTOCOLS))})")
        link, receiver, sender = b.name(), b.name(), b.name()
        position, nonce = Position(b.u64(), b.u64()), b.take(NONCE_BYTES)
        mode = b.take(1)[0] if version >= 3 else STREAM
        if mode not in (STREAM, COPY):
            raise LinkProtocolError(f"HELLO frame: unknown mode {mode}")
        frame = Hello(link, receiver, sender, position, nonce, version, mode)
    elif kind == FrameKind.PROOF:
        frame = Proof(b.take(NONCE_BYTES), b.take(MAC_BYTES))
    elif kind == FrameKind.RECORD:
        return _record(_log_record(body))
    elif kind == FrameKind.PART:
        _check_part(_log_record(body))
        return Part(body)
    elif kind == FrameKind.CLOCK:
        frame = ClockEvent(b.name(), b.u64())
    elif kind == FrameKind.END:
        frame = End(b.u64())
    elif kind == FrameKind.APPLIED:
        frame = Applied(b.u64())
    elif kind == FrameKind.SNAPSHOT:
        gid, receives = b.u64(), b.take(1)[0]
        if receives > 1:
            raise LinkProtocolError(f"SNAPSHOT frame: flag {receives}")
        frame = Snapshot(gid, bool(receives), b.u64())
    elif kind == FrameKind.COPIED:
        frame = Copied(b.u64(), b.u64())
    else:
        return Error(body.decode("utf-8", "replace"))
    b.done()
    return frame


def _log_record(body: bytes) -> LogRecord:
    try:
        return rp.decode_record(body)
    except RecoveryError as e:
        raise LinkProtocolError(str(e)) from None


def _check_part(r: LogRecord) -> None:
    if r.flags or not valid_name(r.origin):
        raise LinkProtocolError(f"PART frame of GID {r.gid}: flags {r.flags:#x}, origin {r.origin!r}")
    if len(r.payload) <= _PART.size:
        raise LinkProtocolError(f"PART frame of GID {r.gid} too short")
    total, off = _PART.unpack_from(r.payload)
    if total > rp.MAX_RECORD or off + len(r.payload) - _PART.size > total:
        raise LinkProtocolError(f"PART frame of GID {r.gid}: bytes {off}.. of a {total}-byte record do not fit")


def _record(r: LogRecord) -> Record:
    if r.flags:
        raise LinkProtocolError(f"RECORD of GID {r.gid} has unknown flags {r.flags:#x}")
    if not valid_name(r.origin):
        raise LinkProtocolError(f"RECORD of GID {r.gid}: {r.origin!r} is not a valid site name")
    if len(r.payload) < _U64.size:
        raise LinkProtocolError(f"RECORD of GID {r.gid} has no commit time")
    commit_time = int(_U64.unpack(r.payload[:_U64.size])[0])
    rest = r.payload.sub(_U64.size) if isinstance(r.payload, SpooledBuffer) else r.payload[_U64.size:]
    return Record(r.gid, r.origin, commit_time, rest)


class Reassembler:
    """Joins the PART frames of one transaction at a time, in order (recovery's
    PartAssembler: with a ``spool``, a transaction larger than spool.SPOOL_AT is gathered in a
    spool file, not in memory)."""

    def __init__(self, spool: Optional[Spool] = None) -> None:
        self._parts = rp.PartAssembler(spool)

    @property
    def open(self) -> bool:
        """A transaction's parts are being received."""
        return self._parts.open

    def discard(self) -> None:
        self._parts.discard()

    def add(self, part: Part) -> Optional[Record]:
        """The whole transaction once its last part is in, else None."""
        try:
            whole = self._parts.add(part.body)
        except RecoveryError as e:
            self._parts.discard()
            raise LinkProtocolError(str(e)) from None
        return None if whole is None else _record(whole)


def error(e: Error) -> LinkError:
    """The exception an ERROR frame from the peer stands for."""
    words = e.text.split()
    if len(words) == 3 and words[0] == BROKEN and words[1].isdigit() and words[2].isdigit():
        return LinkBroken(int(words[1]), int(words[2]))
    return LinkError(f"the peer says: {e.text}")


def spoken(e: Error) -> Optional[tuple[int, ...]]:
    """The versions a sender speaks, when its ERROR says it does not speak the receiver's."""
    m = re.fullmatch(r"link protocol version \d+ is not spoken here \(this site speaks ([0-9, ]+)\)", e.text)
    return tuple(int(v) for v in m.group(1).split(", ") if v.isdigit()) if m else None


def transaction(r: Record) -> RemoteTransaction:
    """The transaction a record carries, its writeset decoded."""
    raw = bytes(r.writeset.view) if isinstance(r.writeset, SpooledBuffer) else bytes(r.writeset)
    try:
        ws = wire.decode(raw)
    except ValueError as e:  # WireError, or text that is not UTF-8
        raise LinkProtocolError(f"RECORD of GID {r.gid}: malformed writeset: {e}") from None
    return RemoteTransaction(r.site, r.gid, r.commit_time, ws)


async def read_frame(reader: asyncio.StreamReader) -> Frame:
    """The next frame; :class:`LinkProtocolError` for a malformed one, :class:`LinkError` when
    the connection ends inside it."""
    try:
        kind, n = frame_head(await reader.readexactly(_HEAD.size))
        body = await reader.readexactly(n)
    except asyncio.IncompleteReadError as e:
        raise LinkError("the connection closed" + (" inside a frame" if e.partial else "")) from None
    return decode(kind, body)
