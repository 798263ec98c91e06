# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled codecs of the commit path's frames: the backend socket's frame parser and
verdict frame (commit/backendproto.py: ``PyFrameParser``, ``py_verdict_frame``), and the bus messages
that carry writesets (bus/proto.py: ``py_encode_writesets``, ``py_decode_writesets``). Each is the
same reading and writing as its pure-Python reference, compiled with Cython; the modules pick one
at import (``CHORUS_IMPL=python|c``). tests/unit/test_impl_proto.py checks with Hypothesis that
both give the same frames and messages and refuse the same bytes.

It raises the modules' own exceptions and makes their own objects, which they hand it
(:func:`bind_backend`, :func:`bind_bus`): this module imports no other module of Chorus. Their
constants come the same way, into C variables (no Python object on the hot path): the frame types,
sizes and versions. Only the verdict frame's field offsets are compiled in (a ``cdef enum``), and
tests/unit/test_wire_rules.py checks them against backendproto's struct.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef object Frame, FrameError, TYPES, FIXED
cdef uint32_t MAX_FRAME
cdef Py_ssize_t RAN_HEAD  # a DDL_RAN frame's fixed part (backendproto._RAN_HEAD)
cdef Py_ssize_t VERDICT_HEAD  # a verdict frame before its message (backendproto._VERDICT.size)
cdef uint8_t FRAME_WRITESET, FRAME_VERDICT  # type bytes (backendproto.FrameType)
cdef object BusProtoError
cdef int BUS_VERSION, BUS_MIN, BUS_TIMED
cdef uint8_t T_WRITESET, T_BATCH

# The verdict frame's fields (backendproto._VERDICT: length, type, verdict, gid, wait_for, prev,
# the message's length; the message follows at VERDICT_HEAD), as offsets from its start.
cdef enum:
    V_TYPE = 4
    V_VERDICT = 5
    V_GID = 6
    V_WAIT_FOR = 14
    V_PREV = 22
    V_MSGLEN = 30


def bind_backend(backendproto) -> None:
    """Take backendproto's classes and constants (once, at its import)."""
    global Frame, FrameError, TYPES, FIXED, MAX_FRAME, RAN_HEAD, VERDICT_HEAD, FRAME_WRITESET, FRAME_VERDICT
    Frame, FrameError = backendproto.Frame, backendproto.FrameError
    TYPES, FIXED, MAX_FRAME = backendproto._TYPES, backendproto._FIXED, backendproto.MAX_FRAME
    RAN_HEAD, VERDICT_HEAD = backendproto._RAN_HEAD, backendproto._VERDICT.size
    FRAME_WRITESET = backendproto.FrameType.WRITESET.value[0]
    FRAME_VERDICT = backendproto.FrameType.VERDICT.value[0]


def bind_bus(proto) -> None:
    """Take bus/proto.py's exception and constants (once, at its import)."""
    global BusProtoError, BUS_VERSION, BUS_MIN, BUS_TIMED, T_WRITESET, T_BATCH
    BusProtoError, BUS_VERSION, BUS_MIN = proto.BusProtoError, proto.VERSION, proto.MIN_VERSION
    BUS_TIMED = proto.TIMED
    T_WRITESET = proto.MessageType.WRITESET.value[0]
    T_BATCH = proto.MessageType.WRITESET_BATCH.value[0]


cdef inline uint32_t be32(const uint8_t *p):
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline uint64_t be64(const uint8_t *p):
    return (<uint64_t>be32(p) << 32) | <uint64_t>be32(p + 4)


cdef inline void put32(uint8_t *p, uint32_t v):
    p[0] = v >> 24
    p[1] = v >> 16
    p[2] = v >> 8
    p[3] = v


cdef inline void put64(uint8_t *p, uint64_t v):
    put32(p, <uint32_t>(v >> 32))
    put32(p + 4, <uint32_t>v)


cdef class FrameParser:
    """Splits the bytes a backend sends into frames (backendproto.PyFrameParser, compiled)."""
    cdef bytearray _buf

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data):
        cdef bytearray buf = self._buf
        cdef list out = []
        cdef Py_ssize_t pos = 0, n
        cdef uint32_t length
        cdef const uint8_t *p
        buf += data
        n = len(buf)
        p = <const uint8_t *><char *>buf
        while n - pos >= 4:
            length = be32(p + pos)
            if length < 1 or length > MAX_FRAME:
                raise FrameError(f"frame length {length} out of range")
            if n - pos < 5:
                break  # the type byte has not arrived yet
            ftype = PyBytes_FromStringAndSize(<char *>p + pos + 4, 1)
            if ftype not in TYPES:
                raise FrameError(f"unknown frame type {ftype!r}")
            fixed = FIXED.get(ftype)
            if fixed is not None and length != fixed:
                raise FrameError(f"frame {ftype!r} has {length - 1} payload bytes, expected {fixed - 1}")
            if ftype == b"R" and length - 1 < RAN_HEAD:
                raise FrameError(f"frame b'R' has {length - 1} payload bytes, expected at least {RAN_HEAD}")
            if <uint64_t>(n - pos - 4) < length:
                break
            out.append(Frame(ftype, PyBytes_FromStringAndSize(<char *>p + pos + 5, length - 1)))
            pos += 4 + length
        if pos:
            del buf[:pos]
        return out

    def take_large(self, Py_ssize_t threshold):
        """backendproto.PyFrameParser.take_large, compiled."""
        cdef bytearray buf = self._buf
        cdef const uint8_t *p
        cdef uint32_t length
        if len(buf) < 5:
            return None
        p = <const uint8_t *><char *>buf
        if p[4] != FRAME_WRITESET:
            return None
        length = be32(p)
        if <Py_ssize_t>length - 1 <= threshold:
            return None
        data = bytes(buf)
        del buf[:]
        return length, data


def verdict_frame(int verdict, uint64_t gid, uint64_t wait_for, str message, prev=None):
    """The answer to a backend (commit.backendproto.py_verdict_frame, compiled)."""
    cdef bytes msg = message.encode("utf-8")[:65535]
    cdef Py_ssize_t m = len(msg)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, VERDICT_HEAD + m)
    cdef uint8_t *p = <uint8_t *>PyBytes_AS_STRING(out)
    cdef uint64_t before = wait_for if prev is None else <uint64_t>prev
    if verdict < 0 or verdict > 255:
        raise OverflowError("verdict out of range")
    put32(p, <uint32_t>(VERDICT_HEAD - 4 + m))
    p[V_TYPE] = FRAME_VERDICT
    p[V_VERDICT] = <uint8_t>verdict
    put64(p + V_GID, gid)
    put64(p + V_WAIT_FOR, wait_for)
    put64(p + V_PREV, before)
    p[V_MSGLEN] = <uint8_t>(m >> 8)
    p[V_MSGLEN + 1] = <uint8_t>m
    if m:
        memcpy(p + VERDICT_HEAD, PyBytes_AS_STRING(msg), m)
    return out


cdef bytes origin_bytes(str origin):
    cdef bytes b = origin.encode("utf-8")
    if len(b) > 0xFFFF:
        raise BusProtoError("string too long for a bus message")
    return b


def encode_writesets(str origin, items, int version=-1, uint64_t commit_time=0):
    """A WritesetBatch message (bus.proto.py_encode_writesets, compiled): origin, from version 5
    the commit time, count, and each (ticket, writeset), at bus protocol ``version`` (-1: the
    highest)."""
    if version == -1:
        version = BUS_VERSION
    if version < BUS_MIN or version > BUS_VERSION:
        raise BusProtoError(f"cannot write bus protocol version {version}: this node speaks "
                            f"{BUS_MIN}..{BUS_VERSION}")
    cdef bytes o = origin_bytes(origin)
    cdef Py_ssize_t timed = 8 if version >= BUS_TIMED else 0
    cdef Py_ssize_t size = 2 + 2 + len(o) + timed + 4, pos, olen = len(o), wlen
    cdef list ws = []
    cdef bytes out, w
    cdef uint8_t *p
    for ticket, w in items:
        ws.append((<uint64_t>ticket, w))
        size += 12 + len(w)
    out = PyBytes_FromStringAndSize(NULL, size)
    p = <uint8_t *>PyBytes_AS_STRING(out)
    p[0] = <uint8_t>version
    p[1] = T_BATCH
    p[2] = <uint8_t>(olen >> 8)
    p[3] = <uint8_t>olen
    memcpy(p + 4, PyBytes_AS_STRING(o), olen)
    pos = 4 + olen
    if timed:
        put64(p + pos, commit_time)
        pos += 8
    put32(p + pos, <uint32_t>len(ws))
    pos += 4
    for t, w in ws:
        wlen = len(w)
        if wlen > 0xFFFFFFFF:
            raise BusProtoError("writeset too long for a bus message")
        put64(p + pos, <uint64_t>t)
        put32(p + pos + 8, <uint32_t>wlen)
        memcpy(p + pos + 12, PyBytes_AS_STRING(w), wlen)
        pos += 12 + wlen
    return out


def decode_writesets(bytes b, tuple speaks=None):
    """(origin, [(ticket, writeset)], commit time) of a WritesetMsg or WritesetBatch message
    (bus.proto.py_decode_writesets, compiled); BusProtoError for anything else or malformed."""
    cdef Py_ssize_t n = len(b), pos, olen, count, i
    cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(b)
    cdef uint64_t ticket, commit_time = 0
    cdef bint timed
    cdef uint32_t wlen
    cdef list items = []
    if n < 1:
        raise BusProtoError("bus message truncated")
    lo, hi = (BUS_MIN, BUS_VERSION) if speaks is None else speaks
    if p[0] < lo or p[0] > hi:
        raise BusProtoError(f"unsupported bus message version {p[0]}: this node reads versions {lo}..{hi}")
    if n < 4:
        raise BusProtoError("bus message truncated")
    timed = p[0] >= BUS_TIMED
    if p[1] != T_WRITESET and p[1] != T_BATCH:
        raise BusProtoError(f"not a writeset message: type {b[1:2]!r}")
    olen = (<Py_ssize_t>p[2] << 8) | p[3]
    if 4 + olen > n:
        raise BusProtoError("bus message truncated")
    try:
        origin = (<char *>p)[4:4 + olen].decode("utf-8")
    except UnicodeDecodeError as e:
        raise BusProtoError("bus message string is not UTF-8") from e
    pos = 4 + olen
    if p[1] == T_WRITESET:
        if pos + 8 > n:
            raise BusProtoError("bus message truncated")
        ticket = be64(p + pos)
        pos += 8
        if timed:
            if pos + 8 > n:
                raise BusProtoError("bus message truncated")
            commit_time = be64(p + pos)
            pos += 8
        return origin, [(ticket, b[pos:])], commit_time
    if timed:
        if pos + 8 > n:
            raise BusProtoError("bus message truncated")
        commit_time = be64(p + pos)
        pos += 8
    if pos + 4 > n:
        raise BusProtoError("bus message truncated")
    count = be32(p + pos)
    pos += 4
    if count > n:
        raise BusProtoError("batch count exceeds the message length")
    for i in range(count):
        if pos + 12 > n:
            raise BusProtoError("bus message truncated")
        ticket = be64(p + pos)
        wlen = be32(p + pos + 8)
        pos += 12
        if pos + <Py_ssize_t>wlen > n:
            raise BusProtoError("bus message truncated")
        items.append((ticket, PyBytes_FromStringAndSize(<char *>p + pos, wlen)))
        pos += wlen
    if pos != n:
        raise BusProtoError("trailing bytes in bus message")
    return origin, items, commit_time
