"""Messages coordinators exchange over the bus, versions 3 to 6.

Every message starts with ``u8 version`` and ``u8 type``; readers reject versions outside the
range they speak and unknown types with :class:`BusProtoError`. Strings are ``u16``-length UTF-8,
blobs ``u32``-length.

Versions (rolling upgrades, docs/PROTOCOL.md section 5): this code speaks :data:`MIN_VERSION` to
:data:`VERSION`; it reads every version in that range and writes the one it is told (the
cluster's, bus/versions.py). Version 4 adds the protocol negotiation to the join handshake:
``GidRequest.speaks`` (the requester's range) and ``GidReply.version`` / ``GidReply.speaks`` (the
cluster's version and every member's range at the request's place). Version 3 has no place for
them: written at version 3 they ride in the two strings a version-3 reader carries without
reading them (:func:`_fold`), so a node of this code joins a cluster of the release before and
the cluster moves to 4 once its last version-3 node is gone. Version 5 adds the origin's commit
time to the writeset messages (``W``, ``M``: a ``u64`` after the ticket, after the origin); a
message written at 3 or 4 has none (read as 0, unknown), and a node that speaks up to 4 refuses a
version-5 message as a version it does not read. Version 6 adds batches to the link writeset
(``K``: a ``u32`` count of peer transactions before its writeset, then each; 0: one, as before);
a link's receiver batches only while its cluster runs at 6.

| type | message | who sends it |
| --- | --- | --- |
| ``W`` | :class:`WritesetMsg` | a node committing a local transaction; consumes a GID |
| ``M`` | :class:`WritesetBatch` | several local writesets of one node sent together; one GID each, in order |
| ``Q`` | :class:`GidRequest` | a node outside the primary component (seed 8.1): "answer with the GID at this message"; also its part in a re-form (what it holds) |
| ``G`` | :class:`GidReply` | the lowest synced member, answering a ``Q`` |
| ``B`` | :class:`Bootstrap` | a node told to start a new cluster, or the one that re-forms it (a new epoch) |
| ``P`` | :class:`Progress` | every online node, periodically: its committed GID (purge horizon); a recovering node's first one says it is synced |
| ``X`` | :class:`Leave` | a member that leaves the primary component by itself (it gave up catching up): every node drops it there |
| ``F`` | :class:`FlowControl` | a node whose apply queue is too long (pause) or drained again (resume) |
| ``D`` | :class:`DdlResult` | the origin of a schema change: it ran (with its content, which every node applies) or failed (all skip it) |
| ``S`` | :class:`SyncMarker` | a node serving causal reads: how far to catch up |
| ``L`` | :class:`LogQuery` | a recovering node: which GID ranges do your writeset logs hold? |
| ``I`` | :class:`LogInfo` | every member (synced or recovering), answering an ``L``: its log's range, what it committed, load and recovery address |
| ``O`` | :class:`Vote` | a node that failed to apply a certified writeset, then every node: its outcome for that GID (inconsistency voting) |
| ``R`` | :class:`Received` | a following node whose Corosync is one of several: it has delivered every GID up to this one (uniform commit) |
| ``K`` | :class:`LinkWriteset` | the node running a link's receiver: a transaction of the peer site (from version 6 several: a batch), applied through this site's order (docs/LINKS.md section 3); consumes a GID |
| ``N`` | :class:`LinkApplied` | a node serving a link's sender: the last GID of this site the peer site applied, as its receiver said (docs/LINKS.md section 2): every node pins its writeset log there |
| ``Y`` | :class:`Speaks` | every member of version 4 or later, after a member of a release before admitted a node without saying the members' versions: the versions it speaks (bus/versions.py) |
| ``C`` | :class:`Configure` | a member asked by ``chorus node add``/``remove``: the cluster's configured nodes from this place of the order on (docs/MEMBERSHIP.md) |

``Q`` and ``G`` end, at version 4, with the configured set their sender holds (version, nodes,
tie breaker, and the Corosync node id of each node whose id it knows): optional, absent while the
cluster's nodes were never changed (read as none). The ids end the set, optional too (absent:
none known, as a set written before they were kept).
``C`` is a version-4 message: a cluster with a member of a release before cannot change its nodes.

The messages that carry writesets (``W`` and ``M``) have a compiled codec beside the pure-Python
reference (``py_encode_writesets``, ``py_decode_writesets``; ``chorus/_cproto.pyx``), chosen by
``CHORUS_IMPL`` (:data:`IMPL`); tests/unit/test_impl_proto.py holds them alike.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import struct
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, Union

from chorus import impl
from chorus.spool import Concat, SpooledBuffer

# 3: re-forming without a synced member (epochs, member records, Leave). LinkWriteset (K) came
# later within 3: a coordinator of an earlier release refuses it as an unknown type.
# 4: the join handshake carries the protocol versions each node speaks (module docstring).
# 5: writeset messages (W, M) carry their origin's commit time (docs/LINKS.md section 5.1).
MIN_VERSION = 3  # the lowest version this code reads and writes
VERSION = 6  # the highest
TIMED = 5  # the first version whose writeset messages carry a commit time
BATCHED_LINKS = 6  # the first version whose link writesets may carry several peer transactions
SPEAKS = (MIN_VERSION, VERSION)
RangeT = tuple[int, int]  # (lowest, highest) bus protocol version a node speaks
LEGACY = (3, 3)  # what a node that says nothing of its versions speaks (a release before 4)


class MessageType(bytes, enum.Enum):
    """A bus message's type byte (the table above). Backend frames and recovery-stream frames
    have type bytes of their own, some the same letters: commit/backendproto.py, recoveryproto.py."""
    WRITESET = b"W"
    WRITESET_BATCH = b"M"
    GID_REQUEST = b"Q"
    GID_REPLY = b"G"
    BOOTSTRAP = b"B"
    PROGRESS = b"P"
    RECEIVED = b"R"
    FLOW_CONTROL = b"F"
    DDL_RESULT = b"D"
    SYNC_MARKER = b"S"
    VOTE = b"O"
    LOG_QUERY = b"L"
    LOG_INFO = b"I"
    LEAVE = b"X"
    LINK_WRITESET = b"K"
    LINK_APPLIED = b"N"
    SPEAKS = b"Y"
    CONFIGURE = b"C"


class BusProtoError(ValueError):
    """A malformed or unsupported bus message."""


@dataclass(frozen=True)
class WritesetMsg:
    origin: str  # node name
    ticket: int  # origin-local id matching the waiting backend
    writeset: bytes
    # the origin's commit time: its coordinator's wall clock when it sent the message, µs since the
    # Unix epoch (version 5; 0: unknown, a message of version 3 or 4). Every node reads the same.
    commit_time: int = 0


@dataclass(frozen=True)
class WritesetBatch:
    """Writesets a coordinator collected while its previous send was in flight: one bus
    message, so the bus's per-message cost is shared (they take consecutive positions)."""

    origin: str
    items: tuple[tuple[int, bytes], ...]  # (ticket, writeset)
    commit_time: int = 0  # every item's (WritesetMsg.commit_time)

    def messages(self) -> list[WritesetMsg]:
        return [WritesetMsg(self.origin, t, w, self.commit_time) for t, w in self.items]


@dataclass(frozen=True)
class LinkWriteset:
    """A transaction of a peer site, received over link ``link`` by ``node`` (which must be a
    member of the primary component at its place in the order): every node of the site gives it
    a GID, certifies it and applies it, moving ``chorus.link_position`` in the same transaction
    (docs/LINKS.md section 3). It is the peer's transaction ``peer_gid``; ``after`` is the peer
    GID the receiver passed just before it on this link (or resumed from), so the peer GIDs in
    (after, peer_gid] are this one and records the peer's sender filtered out. ``peer_clock`` and
    ``max_replicated`` are the link's window as the receiver saw it with this transaction;
    ``commit_time`` the peer's commit time and ``sent_at`` the receiver's wall clock when it sent
    it on (both µs since the Unix epoch; ``sent_at`` is what ``link_position.updated_at`` says,
    the same on every node). ``ticket`` is the receiver's own, to recognize it when delivered.
    ``settings`` is the fingerprint of the receiving node's conflict settings for the link
    (link/settle.py ``Settings.fingerprint``): a node whose own differ does not decide with them."""

    node: str
    ticket: int
    link: str
    peer_site: str
    after: int
    peer_gid: int
    peer_clock: int
    max_replicated: int
    commit_time: int
    sent_at: int
    writeset: bytes
    settings: str = ""
    # a batch (docs/LINKS.md section 3.1): the peer's consecutive transactions, each its own step,
    # the first following ``after``, each following the one before; then ``peer_gid``,
    # ``peer_clock``, ``max_replicated`` and ``commit_time`` are the last step's and ``writeset``
    # holds the keys of them all and no rows (what certification and the scheduler read). Empty:
    # one transaction, ``writeset`` itself.
    steps: tuple["LinkStep", ...] = ()


@dataclass(frozen=True)
class LinkStep:
    """One peer transaction of a batched :class:`LinkWriteset`: its GID, the link's window as the
    receiver saw it with it, its commit time and its writeset."""

    peer_gid: int
    peer_clock: int
    max_replicated: int
    commit_time: int
    writeset: bytes


@dataclass(frozen=True)
class Speaks:
    """The bus protocol versions ``node`` speaks (bus/versions.py). Sent by every member of
    version 4 or later when an answer that carried no versions (written by a node of a release
    before 4) admitted a node: there every node forgets what its members speak, and learns it
    again from these, so all know the same. A node of a release before 4 drops it as a message
    of an unknown type (and logs so); it knows no versions."""
    node: str
    speaks: RangeT


EpochT = tuple[int, int, str]  # history.Epoch: number, start GID, the node that opened it
RecordT = tuple[str, int, int, bool]  # history.MemberRecord of a node: name, epoch, GID, member


@dataclass(frozen=True)
class GidRequest:
    node: str
    request_id: str
    cluster_uuid: str  # "" for a node that never joined a cluster
    last_gid: int  # the GID its database holds (or will, once what it admitted commits)
    join: bool = True  # False: it stays out (needs recovery) and only takes part in a re-form
    epochs: tuple[EpochT, ...] = ()  # the epochs its data followed (history.py)
    log_after: int = 0  # its writeset log holds every GID after this one ...
    log_high: int = 0  # ... up to this one
    records: tuple[RecordT, ...] = ()  # what it remembers of the primary component's members
    speaks: RangeT = LEGACY  # the bus protocol versions it speaks (version 4)
    # the configured set it holds (confchange.ClusterConfig; version 0: none, the nodes' own)
    config_version: int = 0
    config_nodes: tuple[str, ...] = ()
    config_tie: str = ""
    config_ids: tuple[tuple[str, str], ...] = ()  # (node, its Corosync node id) for the ids it knows


@dataclass(frozen=True)
class GidReply:
    node: str  # the requester
    request_id: str
    member: str  # the requester's bus member id
    cluster_uuid: str
    gid: int  # GID counter at the request's position in the order
    certified: int  # the last certified GID at that position (what a synced node has committed)
    online: tuple[tuple[str, str], ...]  # (node name, bus member id) online at that position
    progress: tuple[tuple[str, int], ...]  # reported committed GIDs at that position
    certifier: bytes  # certification index at that position
    paused: tuple[str, ...] = ()  # nodes holding flow control at that position
    compat: str = ""  # the answering node's database encoding and PostgreSQL major version
    synced: tuple[str, ...] = ()  # the members of ``online`` that are synced (the others catch up)
    epochs: tuple[EpochT, ...] = ()  # the cluster's epochs
    records: tuple[RecordT, ...] = ()  # the members' records at that position
    # Uniform commit: the answering node released every GID up to ``released``; the writesets
    # it certified after that and has not released yet come with the answer, (GID, the GID
    # certified before it, origin, writeset), so the joiner delivers them here and can vouch
    # for them (docs/MEMBERSHIP.md)
    released: int = 0
    unstable: tuple[tuple[int, int, str, bytes], ...] = ()
    # every node's latest GID request at that position, (node, request id, bus member): an answer
    # to an earlier one than a node's latest is stale, and every node ignores it
    requests: tuple[tuple[str, str, str], ...] = ()
    # the cluster's protocol version at that position and every member's range, the requester's
    # too (version 4; bus/versions.py). A requester that cannot speak ``version`` is not admitted.
    version: int = 3
    speaks: tuple[tuple[str, int, int], ...] = ()
    # the configured set at that position (confchange.ClusterConfig; version 0: none yet)
    config_version: int = 0
    config_nodes: tuple[str, ...] = ()
    config_tie: str = ""
    config_ids: tuple[tuple[str, str], ...] = ()  # (node, its Corosync node id) for the ids it knows


@dataclass(frozen=True)
class Configure:
    """``chorus node add``/``remove``: from this place of the order on, the cluster's configured
    nodes are ``nodes`` (configuration ``version``, the one before plus one; ``tie_breaker`` the
    bus node whose half wins an even split, "" for none). ``node`` is the member that sends it
    for the operator, ``request_id`` its own, to answer the operator with the outcome. Every
    member applies it or refuses it alike (confchange.change_problem)."""
    node: str
    request_id: str
    version: int
    nodes: tuple[str, ...]
    tie_breaker: str = ""
    # (node, its Corosync node id): what the operator's corosync.conf says (the node added is not
    # online yet); the members add the ids they know (confchange.with_ids)
    ids: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Bootstrap:
    node: str
    cluster_uuid: str
    gid: int
    epoch: int = 1  # the epoch it opens at ``gid``


@dataclass(frozen=True)
class Leave:
    """A member leaves the primary component by itself (it cannot catch up): every node drops it
    at this place of the order (docs/RECOVERY.md)."""
    node: str
    reason: str = ""


@dataclass(frozen=True)
class LinkApplied:
    """The peer site of link ``link`` applied this site's GIDs up to ``gid`` (its receiver said so
    to ``node``'s sender): every node keeps its writeset log from there (docs/LINKS.md section 2)."""
    node: str
    link: str
    gid: int


@dataclass(frozen=True)
class Progress:
    node: str
    committed_gid: int


@dataclass(frozen=True)
class Received:
    """The sender delivered every message up to GID ``gid``. A writeset commits (anywhere)
    only once Corosync nodes with a quorum of votes have delivered it (docs/MEMBERSHIP.md)."""
    node: str
    gid: int


@dataclass(frozen=True)
class FlowControl:
    node: str
    pause: bool


@dataclass(frozen=True)
class DdlResult:
    node: str
    gid: int
    ok: bool
    error: str = ""
    content: bytes = b""  # when it ran: the writeset every node applies at GID gid


@dataclass(frozen=True)
class Vote:
    """Inconsistency voting (Galera 4): the sender's outcome for certified writeset ``gid``.
    A node that fails to apply it sends one; then every node does, and the majority's outcome
    stands (docs/MEMBERSHIP.md)."""
    node: str
    gid: int
    ok: bool  # applied (or committed as its origin)
    reason: str = ""  # why it failed


@dataclass(frozen=True)
class SyncMarker:
    """Causal reads: its position in the total order tells the sender how far to catch up."""
    node: str
    token: int


@dataclass(frozen=True)
class LogQuery:
    node: str  # the recovering node
    request_id: str


@dataclass(frozen=True)
class LogInfo:
    node: str  # the recovering node that asked
    request_id: str
    partner: str  # the answering node
    address: str  # host:port of its recovery server
    after_min: int  # it can stream every certified GID after this one ...
    high: int  # ... up to this one (the last in its log)
    committed: int  # its committed GID
    load: int  # writesets it has certified and not yet committed (how busy it is)


Message = Union[WritesetMsg, WritesetBatch, GidRequest, GidReply, Bootstrap, Progress, FlowControl,
                DdlResult, SyncMarker, LogQuery, LogInfo, Received, Vote, Leave, LinkWriteset, Speaks,
                Configure, LinkApplied]

_LINK_NUMBERS = struct.Struct(">QQQQQQQ")  # ticket, after, peer GID, peer clock, max replicated, commit time, sent at
MAX_LINK_NAME = 64  # link and site names (link/proto.py's bound)


class _R:
    def __init__(self, b: bytes) -> None:
        self.b = b
        self.p = 0

    def take(self, n: int) -> bytes:
        if self.p + n > len(self.b):
            raise BusProtoError("bus message truncated")
        out = self.b[self.p:self.p + n]
        self.p += n
        return out

    def u16(self) -> int:
        return int(struct.unpack(">H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def s(self) -> str:
        try:
            return self.take(self.u16()).decode("utf-8")
        except UnicodeDecodeError as e:
            raise BusProtoError("bus message string is not UTF-8") from e

    def blob(self) -> bytes:
        return self.take(self.u32())

    def end(self) -> None:
        if self.p != len(self.b):
            raise BusProtoError("trailing bytes in bus message")


def _s(x: str) -> bytes:
    b = x.encode("utf-8")
    if len(b) > 0xFFFF:
        raise BusProtoError("string too long for a bus message")
    return struct.pack(">H", len(b)) + b


def _blob(x: bytes) -> bytes:
    return struct.pack(">I", len(x)) + x


def _epochs(epochs: tuple[EpochT, ...]) -> bytes:
    return struct.pack(">H", len(epochs)) + b"".join(struct.pack(">QQ", n, g) + _s(node) for n, g, node in epochs)


def _records(records: tuple[RecordT, ...]) -> bytes:
    return struct.pack(">H", len(records)) + b"".join(
        _s(name) + struct.pack(">QQB", e, g, 1 if member else 0) for name, e, g, member in records)


def _read_epochs(r: "_R") -> tuple[EpochT, ...]:
    return tuple((r.u64(), r.u64(), r.s()) for _ in range(r.u16()))


def _read_records(r: "_R") -> tuple[RecordT, ...]:
    out = []
    for _ in range(r.u16()):
        name, e, g, member = r.s(), r.u64(), r.u64(), r.take(1)
        if member not in (b"\x00", b"\x01"):
            raise BusProtoError("member record flag is neither 0 nor 1")
        out.append((name, e, g, member == b"\x01"))
    return tuple(out)


ConfigT = tuple[int, tuple[str, ...], str, tuple[tuple[str, str], ...]]  # confchange.ClusterConfig.as_fields
_NO_CONFIG: ConfigT = (0, (), "", ())


def _config(version: int, nodes: tuple[str, ...], tie: str, ids: tuple[tuple[str, str], ...],
            optional: bool = True) -> bytes:
    """A configured set at a message's end; ``optional``: nothing for none (version 0), so a
    cluster whose nodes were never changed sends what it sent before. The nodes' Corosync ids
    follow it, when any is known: ``u16`` count, then (node, id) strings (a set written before
    ids were kept ends at its tie breaker)."""
    if optional and version == 0:
        return b""
    out = struct.pack(">QH", version, len(nodes)) + b"".join(_s(n) for n in nodes) + _s(tie)
    if ids:
        out += struct.pack(">H", len(ids)) + b"".join(_s(n) + _s(i) for n, i in ids)
    return out


def _read_config(r: "_R") -> ConfigT:
    """The optional configured set at a message's end: none if the message ends before it."""
    if r.p == len(r.b):
        return _NO_CONFIG
    version = r.u64()
    nodes = tuple(r.s() for _ in range(r.u16()))
    tie = r.s()
    ids = tuple((r.s(), r.s()) for _ in range(r.u16())) if r.p < len(r.b) else ()
    if any(n not in nodes or not i for n, i in ids) or len(dict(ids)) != len(ids):
        raise BusProtoError("a configured set's Corosync ids name a node outside it, twice, or no id")
    return version, nodes, tie, ids


_RID_FOLD = re.compile(r"~v([0-9]{1,3})-([0-9]{1,3})$")
_COMPAT_FOLD = re.compile(r"~v([0-9]{1,3})((?:;[0-9]{1,3}-[0-9]{1,3}:(?:[0-9a-f]{2})*)*)$")


def _range(lo: int, hi: int) -> RangeT:
    if not 1 <= lo <= hi <= 255:
        raise BusProtoError(f"protocol version range {lo}..{hi} is not a range of versions 1 to 255")
    return lo, hi


def _fold(m: Union[GidRequest, GidReply]) -> Union[GidRequest, GidReply]:
    """``m`` as version 3 carries it: its version-4 fields folded into the string a version-3
    reader carries without reading it (a GID request's id, which readers only compare and echo;
    an answer's ``compat``, which only the requester reads, and only a requester of version 4
    is sent a folded one). :func:`_unfold` reads them back."""
    if isinstance(m, GidRequest):
        if m.speaks == LEGACY or _RID_FOLD.search(m.request_id):
            return m  # (Membership.request makes its ids with the versions in them)
        return dataclasses.replace(m, request_id=f"{m.request_id}~v{m.speaks[0]}-{m.speaks[1]}", speaks=LEGACY)
    if not m.speaks:
        if m.version != 3:
            raise BusProtoError(f"an answer at cluster version {m.version} cannot be written at version 3")
        return m
    table = "".join(f";{lo}-{hi}:{name.encode().hex()}" for name, lo, hi in m.speaks)
    return dataclasses.replace(m, compat=f"{m.compat}~v{m.version}{table}", version=3, speaks=())


def _unfold(m: Message) -> Message:
    """A version-3 message with version-4 fields folded in (:func:`_fold`), unfolded (a request id
    keeps its suffix); a message of a version-3 node as it is."""
    if isinstance(m, GidRequest):
        # the id stays as every node read it: nodes of version 3 compare and echo it whole
        f = _RID_FOLD.search(m.request_id)
        if f is None:
            return m
        return dataclasses.replace(m, speaks=_range(int(f[1]), int(f[2])))
    if isinstance(m, GidReply):
        g = _COMPAT_FOLD.search(m.compat)
        if g is None:
            return m
        speaks = []
        for entry in g[2].split(";")[1:]:
            rng, name = entry.split(":")
            lo, hi = rng.split("-")
            try:
                speaks.append((bytes.fromhex(name).decode("utf-8"), *_range(int(lo), int(hi))))
            except UnicodeDecodeError as e:
                raise BusProtoError("folded member name is not UTF-8") from e
        return dataclasses.replace(m, compat=m.compat[:g.start()], version=int(g[1]), speaks=tuple(speaks))
    return m


def _version(version: int) -> int:
    if not MIN_VERSION <= version <= VERSION:
        raise BusProtoError(f"cannot write bus protocol version {version}: this node speaks "
                            f"{MIN_VERSION}..{VERSION}")
    return version


def encode(m: Message, version: int = VERSION) -> bytes:
    """``m`` at bus protocol ``version`` (one this code speaks; the cluster's, bus/versions.py)."""
    head = bytes([_version(version)])
    if version == 3 and isinstance(m, (GidRequest, GidReply)):
        m = _fold(m)
    if isinstance(m, WritesetMsg):
        prefix = head + MessageType.WRITESET.value + _s(m.origin) + struct.pack(">Q", m.ticket)
        if version >= TIMED:
            prefix += struct.pack(">Q", m.commit_time)
        if isinstance(m.writeset, SpooledBuffer):  # a large writeset: the bus slices it from its file
            return Concat(prefix, m.writeset)  # sliced like bytes by the bus
        return prefix + m.writeset
    if isinstance(m, WritesetBatch):
        return _encode_writesets(m.origin, m.items, version, m.commit_time)
    if isinstance(m, GidRequest):
        return (head + MessageType.GID_REQUEST.value + _s(m.node) + _s(m.request_id) + _s(m.cluster_uuid)
                + struct.pack(">QBQQ", m.last_gid, 1 if m.join else 0, m.log_after, m.log_high) + _epochs(m.epochs)
                + _records(m.records)
                + (bytes(m.speaks) + _config(m.config_version, m.config_nodes, m.config_tie, m.config_ids)
                   if version >= 4 else b""))
    if isinstance(m, GidReply):
        out = [head, MessageType.GID_REPLY.value, _s(m.node), _s(m.request_id), _s(m.member), _s(m.cluster_uuid), struct.pack(">QQH", m.gid, m.certified, len(m.online))]
        out += [_s(n) + _s(mid) for n, mid in m.online]
        out.append(struct.pack(">H", len(m.progress)))
        out += [_s(n) + struct.pack(">Q", g) for n, g in m.progress]
        out.append(_blob(m.certifier))
        out.append(struct.pack(">H", len(m.paused)))
        out += [_s(n) for n in m.paused]
        out.append(_s(m.compat))
        out.append(struct.pack(">H", len(m.synced)))
        out += [_s(n) for n in m.synced]
        out.append(_epochs(m.epochs))
        out.append(_records(m.records))
        out.append(struct.pack(">QI", m.released, len(m.unstable)))
        out += [struct.pack(">QQ", g, prev) + _s(origin) + _blob(ws) for g, prev, origin, ws in m.unstable]
        out.append(struct.pack(">H", len(m.requests)))
        out += [_s(n) + _s(rid) + _s(member) for n, rid, member in m.requests]
        if version >= 4:
            out.append(struct.pack(">BH", m.version, len(m.speaks)))
            out += [_s(n) + bytes([lo, hi]) for n, lo, hi in m.speaks]
            out.append(_config(m.config_version, m.config_nodes, m.config_tie, m.config_ids))
        return b"".join(out)
    if isinstance(m, Configure):
        if version < 4:  # (a node of a release before could not read it: it would not switch with the others)
            raise BusProtoError("a configuration change is a bus version 4 message: the cluster runs version 3 "
                                "while a member of a release before is in it")
        return (head + MessageType.CONFIGURE.value + _s(m.node) + _s(m.request_id)
                + _config(m.version, m.nodes, m.tie_breaker, m.ids, optional=False))
    if isinstance(m, Bootstrap):
        return head + MessageType.BOOTSTRAP.value + _s(m.node) + _s(m.cluster_uuid) + struct.pack(">QQ", m.gid, m.epoch)
    if isinstance(m, Leave):
        return head + MessageType.LEAVE.value + _s(m.node) + _s(m.reason[:4000])
    if isinstance(m, Progress):
        return head + MessageType.PROGRESS.value + _s(m.node) + struct.pack(">Q", m.committed_gid)
    if isinstance(m, LinkApplied):
        if len(m.link.encode()) > MAX_LINK_NAME:
            raise BusProtoError(f"link name {m.link[:80]!r} is longer than {MAX_LINK_NAME} bytes")
        return head + MessageType.LINK_APPLIED.value + _s(m.node) + _s(m.link) + struct.pack(">Q", m.gid)
    if isinstance(m, Received):
        return head + MessageType.RECEIVED.value + _s(m.node) + struct.pack(">Q", m.gid)
    if isinstance(m, FlowControl):
        return head + MessageType.FLOW_CONTROL.value + _s(m.node) + bytes([1 if m.pause else 0])
    if isinstance(m, DdlResult):
        return (head + MessageType.DDL_RESULT.value + _s(m.node) + struct.pack(">QB", m.gid, 1 if m.ok else 0)
                + _s(m.error[:4000]) + _blob(m.content))
    if isinstance(m, SyncMarker):
        return head + MessageType.SYNC_MARKER.value + _s(m.node) + struct.pack(">Q", m.token)
    if isinstance(m, Vote):
        return head + MessageType.VOTE.value + _s(m.node) + struct.pack(">QB", m.gid, 1 if m.ok else 0) + _s(m.reason[:4000])
    if isinstance(m, LogQuery):
        return head + MessageType.LOG_QUERY.value + _s(m.node) + _s(m.request_id)
    if isinstance(m, LogInfo):
        return (head + MessageType.LOG_INFO.value + _s(m.node) + _s(m.request_id) + _s(m.partner) + _s(m.address)
                + struct.pack(">QQQQ", m.after_min, m.high, m.committed, m.load))
    if isinstance(m, Speaks):
        return head + MessageType.SPEAKS.value + _s(m.node) + bytes(_range(*m.speaks))
    if isinstance(m, LinkWriteset):
        if not 0 <= m.after < m.peer_gid:
            raise BusProtoError(f"link writeset of peer GID {m.peer_gid} after {m.after}: not a range")
        if not (m.link and m.peer_site) or len(m.link) > MAX_LINK_NAME or len(m.peer_site) > MAX_LINK_NAME:
            raise BusProtoError("a link writeset names its link and peer site, each at most 64 characters")
        return (head + MessageType.LINK_WRITESET.value + _s(m.node) + _s(m.link) + _s(m.peer_site)
                + _LINK_NUMBERS.pack(m.ticket, m.after, m.peer_gid, m.peer_clock, m.max_replicated, m.commit_time,
                                     m.sent_at)
                # the receiving node's settings fingerprint: version 4 (a version-3 reader has no place for it)
                + (_s(m.settings[:MAX_LINK_NAME]) if version >= 4 else b"")
                + _link_steps(m, version))
    raise TypeError(f"not a bus message: {m!r}")


def py_encode_writesets(origin: str, items: Iterable[tuple[int, bytes]], version: int = VERSION,
                        commit_time: int = 0) -> bytes:
    """A WritesetBatch message: the origin, from version 5 the commit time, the count, and each
    (ticket, writeset)."""
    items = list(items)
    out = [bytes([_version(version)]), MessageType.WRITESET_BATCH.value, _s(origin)]
    if version >= TIMED:
        out.append(struct.pack(">Q", commit_time))
    out.append(struct.pack(">I", len(items)))
    out += [struct.pack(">Q", t) + _blob(w) for t, w in items]
    return b"".join(out)


def py_decode_writesets(b: bytes, speaks: RangeT = SPEAKS) -> tuple[str, list[tuple[int, bytes]], int]:
    """(origin, [(ticket, writeset)], commit time) of a WritesetMsg or a WritesetBatch message
    (the commit time 0 before version 5)."""
    r = _R(b)
    version = r.take(1)[0]
    _check_version(version, speaks)
    t = r.take(1)
    if t not in (MessageType.WRITESET.value, MessageType.WRITESET_BATCH.value):
        raise BusProtoError(f"not a writeset message: type {t!r}")
    origin = r.s()
    if t == MessageType.WRITESET.value:
        ticket = r.u64()
        commit_time = r.u64() if version >= TIMED else 0
        return origin, [(ticket, b[r.p:])], commit_time
    commit_time = r.u64() if version >= TIMED else 0
    n = r.u32()
    if n > len(b):
        raise BusProtoError("batch count exceeds the message length")
    items = [(r.u64(), r.blob()) for _ in range(n)]
    r.end()
    return origin, items, commit_time


_LINK_STEP = struct.Struct(">QQQQ")  # peer GID, peer clock, max replicated, commit time
MAX_LINK_STEPS = 4096  # transactions in one batched link writeset


def _check_steps(after: int, peer_gid: int, peer_clock: int, max_replicated: int, commit_time: int,
                 steps: Sequence[LinkStep]) -> None:
    """A batch's steps: at least two, at most MAX_LINK_STEPS, peer GIDs rising from ``after``, the
    message's numbers the last step's."""
    if not 2 <= len(steps) <= MAX_LINK_STEPS:
        raise BusProtoError(f"a batched link writeset holds 2 to {MAX_LINK_STEPS} transactions, not {len(steps)}")
    prev = after
    for st in steps:
        if not prev < st.peer_gid:
            raise BusProtoError(f"a batched link writeset's peer GID {st.peer_gid} does not follow {prev}")
        prev = st.peer_gid
    last = steps[-1]
    if (last.peer_gid, last.peer_clock, last.max_replicated, last.commit_time) != (
            peer_gid, peer_clock, max_replicated, commit_time):
        raise BusProtoError("a batched link writeset's numbers are not its last transaction's")


def _link_steps(m: LinkWriteset, version: int) -> bytes:
    """The writeset and, from version 6, a batch's steps: their count (0: one transaction) before
    the writeset, then each."""
    if version < BATCHED_LINKS:
        if m.steps:
            raise BusProtoError(f"a batched link writeset is a bus version {BATCHED_LINKS} message")
        return _blob(m.writeset)
    if m.steps:
        _check_steps(m.after, m.peer_gid, m.peer_clock, m.max_replicated, m.commit_time, m.steps)
    return struct.pack(">I", len(m.steps)) + _blob(m.writeset) + b"".join(
        _LINK_STEP.pack(st.peer_gid, st.peer_clock, st.max_replicated, st.commit_time) + _blob(st.writeset)
        for st in m.steps)


def _read_step(r: "_R") -> LinkStep:
    peer_gid, peer_clock, max_replicated, commit_time = _LINK_STEP.unpack(r.take(_LINK_STEP.size))
    return LinkStep(peer_gid, peer_clock, max_replicated, commit_time, r.blob())


def _read_link(r: "_R", version: int) -> LinkWriteset:
    node, link, site = r.s(), r.s(), r.s()
    if not (link and site) or len(link) > MAX_LINK_NAME or len(site) > MAX_LINK_NAME:
        raise BusProtoError("a link writeset names its link and peer site, each at most 64 characters")
    ticket, after, peer_gid, peer_clock, max_replicated, commit_time, sent_at = _LINK_NUMBERS.unpack(
        r.take(_LINK_NUMBERS.size))
    if after >= peer_gid:
        raise BusProtoError(f"link writeset of peer GID {peer_gid} after {after}: not a range")
    settings = r.s() if version >= 4 else ""  # (version 3: no fingerprint, nothing to compare)
    if len(settings) > MAX_LINK_NAME:
        raise BusProtoError("a link writeset's settings fingerprint is at most 64 characters")
    n = r.u32() if version >= BATCHED_LINKS else 0
    writeset = r.blob()
    steps: tuple[LinkStep, ...] = ()
    if n:  # a batch
        if not 2 <= n <= MAX_LINK_STEPS:
            raise BusProtoError(f"a batched link writeset holds 2 to {MAX_LINK_STEPS} transactions, not {n}")
        steps = tuple(_read_step(r) for _ in range(n))
        _check_steps(after, peer_gid, peer_clock, max_replicated, commit_time, steps)
    return LinkWriteset(node, ticket, link, site, after, peer_gid, peer_clock, max_replicated, commit_time, sent_at,
                        writeset, settings, steps)


def _check_version(version: int, speaks: RangeT) -> None:
    if not speaks[0] <= version <= speaks[1]:
        raise BusProtoError(f"unsupported bus message version {version}: this node reads versions "
                            f"{speaks[0]}..{speaks[1]}")


def _decode_spooled(b: SpooledBuffer, speaks: RangeT) -> Message:
    """A large message the bus gathered in a spool file: a writeset message reads its head only
    and keeps the writeset where it is; another kind (never this large in practice) is read."""
    r = _R(b[:4 + 0xFFFF + 16])
    version = r.take(1)[0]
    _check_version(version, speaks)
    if r.take(1) != MessageType.WRITESET.value:
        return decode(b[:], speaks)
    origin, ticket = r.s(), r.u64()
    commit_time = r.u64() if version >= TIMED else 0
    return WritesetMsg(origin, ticket, b.sub(r.p), commit_time)  # type: ignore[arg-type]


def carries_writesets(b: Union[bytes, SpooledBuffer]) -> bool:
    """Whether an encoded message is a WritesetMsg or WritesetBatch (its type byte), unread."""
    return b[1:2] in (MessageType.WRITESET.value, MessageType.WRITESET_BATCH.value)


def decode(b: Union[bytes, SpooledBuffer], speaks: RangeT = SPEAKS) -> Message:
    """The message ``b``, of any version in ``speaks`` (a range within this code's: a node
    simulating an older release reads less)."""
    if isinstance(b, SpooledBuffer):
        return _decode_spooled(b, speaks)
    r = _R(b)
    version = r.take(1)[0]
    _check_version(version, speaks)
    t = r.take(1)
    m: Message
    if t == MessageType.WRITESET:
        origin, items, commit_time = _decode_writesets(b, speaks)
        return WritesetMsg(origin, *items[0], commit_time)
    if t == MessageType.WRITESET_BATCH:
        origin, items, commit_time = _decode_writesets(b, speaks)
        return WritesetBatch(origin, tuple(items), commit_time)
    if t == MessageType.GID_REQUEST:
        node, rid, uuid, last_gid, join = r.s(), r.s(), r.s(), r.u64(), r.take(1)
        if join not in (b"\x00", b"\x01"):
            raise BusProtoError("GID request join flag is neither 0 nor 1")
        log_after, log_high = r.u64(), r.u64()
        epochs, records = _read_epochs(r), _read_records(r)
        rng = _range(*r.take(2)) if version >= 4 else LEGACY
        config = _read_config(r) if version >= 4 else _NO_CONFIG
        m = GidRequest(node, rid, uuid, last_gid, join == b"\x01", epochs, log_after, log_high, records, rng,
                       *config)
    elif t == MessageType.GID_REPLY:
        node, rid, member, uuid = r.s(), r.s(), r.s(), r.s()
        gid = r.u64()
        certified = r.u64()
        online = tuple((r.s(), r.s()) for _ in range(r.u16()))
        progress = tuple((r.s(), r.u64()) for _ in range(r.u16()))
        cert = r.blob()
        paused = tuple(r.s() for _ in range(r.u16()))
        compat = r.s()
        synced = tuple(r.s() for _ in range(r.u16()))
        epochs, records = _read_epochs(r), _read_records(r)
        released, n = r.u64(), r.u32()
        if n > len(b):
            raise BusProtoError("unstable writeset count exceeds the message length")
        unstable = tuple((r.u64(), r.u64(), r.s(), r.blob()) for _ in range(n))
        requests = tuple((r.s(), r.s(), r.s()) for _ in range(r.u16()))
        cluster_version = 3
        speaking: tuple[tuple[str, int, int], ...] = ()
        if version >= 4:
            cluster_version = r.take(1)[0]
            speaking = tuple((r.s(), *_range(*r.take(2))) for _ in range(r.u16()))
            if not 1 <= cluster_version <= 255:
                raise BusProtoError(f"cluster protocol version {cluster_version} is not a version")
        m = GidReply(node, rid, member, uuid, gid, certified, online, progress, cert, paused, compat, synced,
                     epochs, records, released, unstable, requests, cluster_version, speaking,
                     *(_read_config(r) if version >= 4 else _NO_CONFIG))
    elif t == MessageType.CONFIGURE:
        if version < 4:
            raise BusProtoError("a configuration change is a bus version 4 message")
        node, rid = r.s(), r.s()
        version, nodes, tie, ids = _read_config(r)
        if version == 0:
            raise BusProtoError("a configuration change to version 0")
        m = Configure(node, rid, version, nodes, tie, ids)
    elif t == MessageType.BOOTSTRAP:
        m = Bootstrap(r.s(), r.s(), r.u64(), r.u64())
    elif t == MessageType.LEAVE:
        m = Leave(r.s(), r.s())
    elif t == MessageType.PROGRESS:
        m = Progress(r.s(), r.u64())
    elif t == MessageType.LINK_APPLIED:
        node, link = r.s(), r.s()
        if not link or len(link.encode()) > MAX_LINK_NAME:
            raise BusProtoError(f"link name of {len(link.encode())} bytes")
        m = LinkApplied(node, link, r.u64())
    elif t == MessageType.RECEIVED:
        m = Received(r.s(), r.u64())
    elif t == MessageType.FLOW_CONTROL:
        m = FlowControl(r.s(), r.take(1) == b"\x01")
    elif t == MessageType.DDL_RESULT:
        node, gid, ok = r.s(), r.u64(), r.take(1) == b"\x01"
        m = DdlResult(node, gid, ok, r.s(), r.blob())
    elif t == MessageType.SYNC_MARKER:
        m = SyncMarker(r.s(), r.u64())
    elif t == MessageType.VOTE:
        voter, voted, outcome = r.s(), r.u64(), r.take(1)
        if outcome not in (b"\x00", b"\x01"):
            raise BusProtoError("vote outcome is neither 0 nor 1")
        m = Vote(voter, voted, outcome == b"\x01", r.s())
    elif t == MessageType.LOG_QUERY:
        m = LogQuery(r.s(), r.s())
    elif t == MessageType.LOG_INFO:
        m = LogInfo(r.s(), r.s(), r.s(), r.s(), r.u64(), r.u64(), r.u64(), r.u64())
    elif t == MessageType.LINK_WRITESET:
        m = _read_link(r, version)
    elif t == MessageType.SPEAKS:
        m = Speaks(r.s(), _range(*r.take(2)))
    else:
        raise BusProtoError(f"unknown bus message type {t!r}")
    r.end()
    return _unfold(m) if version == 3 else m


_cproto = impl.compiled("_cproto")
if _cproto is not None:
    _cproto.bind_bus(sys.modules[__name__])
IMPL = impl.chosen(_cproto)
_encode_writesets: Callable[[str, Iterable[tuple[int, bytes]], int, int], bytes] = py_encode_writesets
_decode_writesets: Callable[[bytes, RangeT], tuple[str, list[tuple[int, bytes]], int]] = py_decode_writesets
if IMPL == "c" and _cproto is not None:
    _encode_writesets, _decode_writesets = _cproto.encode_writesets, _cproto.decode_writesets
