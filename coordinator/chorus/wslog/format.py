"""The writeset log's on-disk format (docs/WSLOG.md): constants, errors, the segment header
and the record header, and the check of one record. Pure functions over bytes."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any, Optional, Union

import crc32c as _crc32c

FORMAT_VERSION = 3  # what this code writes
READ_VERSIONS = (1, 2, 3)  # version 2 added pieces: a record may span segments; 3 commit times
SEGMENT_MAGIC = b"CHORUSWL"
RECORD_MAGIC = b"WR"
SEGMENT_SUFFIX = ".wsl"

FLAG_DDL_SKIPPED = 0x01  # a schema change whose origin failed: commit the GID, skip the change
KNOWN_FLAGS = FLAG_DDL_SKIPPED  # the flags of a record, as appends give them and readers return them
# on disk only (version 3): the origin field begins with the origin's commit time, u64 little-endian
# µs since the Unix epoch, which the origin length counts (readers return it as LogRecord.commit_time)
FLAG_COMMIT_TIME = 0x02
TIME = struct.Struct("<Q")
FLAG_PIECE = 0x80  # on disk only: this is one piece of a record that spans segments (version 2)
DISK_FLAGS = KNOWN_FLAGS | FLAG_PIECE
TIMED_VERSION = 3  # the first format whose records may carry a commit time

MAX_ORIGIN_BYTES = 255
MAX_PAYLOAD_BYTES = 0xFFFFFFFF  # of one record on disk (a whole record, or one piece)
MAX_RECORD_BYTES = (1 << 63) - 1  # of a record's whole payload, over all its pieces
MIN_SEGMENT_BYTES = 4096

SEGMENT_HEAD = struct.Struct("<8sHHIQQQQQ")  # everything before the header CRC
U32 = struct.Struct("<I")
SEGMENT_HEADER_SIZE = 64
DATA_START = SEGMENT_HEADER_SIZE

RECORD = struct.Struct("<I2sBBIQQ")  # crc, magic, flags, origin length, payload length, gid, seq
RECORD_REST = struct.Struct("<2sBBIQQ")  # the same without the CRC: what the CRC starts with
RECORD_HEADER_SIZE = RECORD.size
PIECE = struct.Struct("<QQ")  # after the origin of a piece: the record's whole payload length, this piece's offset in it
END_MARK = bytes(8)  # what follows the last record
FREE_HEADER = bytes(SEGMENT_HEADER_SIZE)

Buffer = Union[bytes, bytearray, memoryview]


class LogError(Exception):
    """Base of the writeset log's errors."""


class LogCorrupt(LogError):
    """The files are not a valid log: a damaged header, a bad directory, a record that fails its check."""


class LogVersionError(LogCorrupt):
    """A segment written in a format version this code does not read."""


class LogRangeUnavailable(LogError):
    """The log does not (or no longer) hold the records asked for."""


@dataclass(frozen=True)
class LogRecord:
    gid: int
    origin: str  # the node that originated the writeset (utf-8, at most 255 bytes)
    flags: int  # u8, FLAG_DDL_SKIPPED
    payload: Any  # the encoded writeset, opaque to the log: bytes, or a mapped or pieced payload
    # (spool.SpooledBuffer, reader.PiecedPayload) that len() and bytes() take
    commit_time: int = 0  # the origin's commit time, µs since the Unix epoch (0: unknown)


def origin_field(origin: str, commit_time: int) -> tuple[bytes, int]:
    """The origin field of a record on disk and the flag it needs: with a commit time (version
    3), the time then the origin."""
    origin_b = origin.encode("utf-8")
    if commit_time:
        return TIME.pack(commit_time) + origin_b, FLAG_COMMIT_TIME
    return origin_b, 0


def split_origin(buf: Union[memoryview, mmap.mmap], start: int, length: int, flags: int) -> tuple[str, int]:
    """(origin, commit time) of the origin field at ``start`` of a record with ``flags``."""
    if flags & FLAG_COMMIT_TIME:
        if length < TIME.size:
            raise UnicodeDecodeError("utf-8", b"", 0, 0, "an origin field too short for its commit time")
        return origin_text(buf, start + TIME.size, length - TIME.size), int(TIME.unpack_from(buf, start)[0])
    return origin_text(buf, start, length), 0


def segment_name(seq: int) -> str:
    return f"{seq:08d}{SEGMENT_SUFFIX}"


@dataclass(frozen=True)
class SegmentHeader:
    seq: int
    epoch: int
    segment_bytes: int
    prev_gid: int
    first_gid: int
    version: int = FORMAT_VERSION

    def encode(self) -> bytes:
        head = SEGMENT_HEAD.pack(SEGMENT_MAGIC, FORMAT_VERSION, SEGMENT_HEADER_SIZE, 0, self.seq,
                                  self.epoch, self.segment_bytes, self.prev_gid, self.first_gid)
        return head + U32.pack(_crc32c.crc32c(head)) + bytes(SEGMENT_HEADER_SIZE - SEGMENT_HEAD.size - 4)


def decode_segment_header(raw: bytes) -> Optional[SegmentHeader]:
    """The header at the start of ``raw``; None for a free segment (an all-zero header).

    Raises :class:`LogVersionError` for a format version other than 1 and :class:`LogCorrupt`
    for anything else wrong.
    """
    if len(raw) < SEGMENT_HEADER_SIZE:
        raise LogCorrupt(f"{len(raw)} bytes, too short for a segment header ({SEGMENT_HEADER_SIZE} bytes)")
    raw = raw[:SEGMENT_HEADER_SIZE]
    if raw == FREE_HEADER:
        return None
    magic, version, header_size, flags, seq, epoch, segment_bytes, prev_gid, first_gid = SEGMENT_HEAD.unpack_from(raw)
    if magic != SEGMENT_MAGIC:
        raise LogCorrupt(f"not a writeset log segment header (magic {magic!r})")
    if version not in READ_VERSIONS:
        raise LogVersionError(f"segment format version {version}; this Chorus reads versions "
                              f"{', '.join(map(str, READ_VERSIONS))} only (written by a newer Chorus?)")
    (crc,) = U32.unpack_from(raw, SEGMENT_HEAD.size)
    if crc != _crc32c.crc32c(raw[:SEGMENT_HEAD.size]):
        raise LogCorrupt("segment header checksum mismatch")
    if header_size != SEGMENT_HEADER_SIZE or flags != 0 or seq == 0:
        raise LogCorrupt(f"segment header has header size {header_size}, flags {flags:#x}, seq {seq}: not valid in version {version}")
    return SegmentHeader(seq, epoch, segment_bytes, prev_gid, first_gid, version)


def encode_record_header(gid: int, origin: bytes, payload: Buffer, flags: int, seq: int) -> bytes:
    """The header of a record; the origin and the payload follow it."""
    rest = RECORD_REST.pack(RECORD_MAGIC, flags, len(origin), len(payload), gid, seq)
    crc = _crc32c.crc32c(payload, _crc32c.crc32c(origin, _crc32c.crc32c(rest)))
    return U32.pack(crc) + rest


def encode_piece_header(gid: int, origin: bytes, piece: Buffer, flags: int, seq: int, total: int,
                        offset: int) -> tuple[bytes, bytes]:
    """The header of one piece of a record of ``total`` payload bytes, and what follows its
    origin (the piece's place in the record); the piece's bytes follow those."""
    where = PIECE.pack(total, offset)
    rest = RECORD_REST.pack(RECORD_MAGIC, flags | FLAG_PIECE, len(origin), len(piece), gid, seq)
    crc = _crc32c.crc32c(piece, _crc32c.crc32c(where, _crc32c.crc32c(origin, _crc32c.crc32c(rest))))
    return U32.pack(crc) + rest, where


@dataclass(frozen=True)
class Piece:
    """Where a piece sits in its record (``total`` payload bytes; this piece holds
    ``[offset, offset + length)``)."""

    total: int
    offset: int
    length: int

    @property
    def first(self) -> bool:
        return self.offset == 0

    @property
    def last(self) -> bool:
        return self.offset + self.length == self.total


@dataclass(frozen=True)
class ParsedRecord:
    """A record (or a piece of one) checked at some offset of a segment."""

    gid: int
    flags: int  # without FLAG_PIECE
    origin_len: int
    size: int  # bytes on disk, header to end
    data_start: int  # offset of the payload bytes (of this piece) from the record's start
    piece: Optional[Piece]  # None for a record held whole
    origin: str = ""
    commit_time: int = 0  # the origin's commit time (0: none recorded)


class BadRecord(Exception):
    """What ends the records of a segment when it is not a clean end."""

    def __init__(self, kind: str, message: str, gid: Optional[int] = None, flags: Optional[int] = None,
                 origin: Optional[str] = None, size: Optional[int] = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.gid, self.flags, self.origin, self.size = gid, flags, origin, size


def origin_text(buf: Union[memoryview, mmap.mmap], start: int, length: int) -> str:
    return bytes(buf[start:start + length]).decode("utf-8")


def parse_record(mv: memoryview, off: int, limit: int, seq: int, after_gid: int,
                 version: int = FORMAT_VERSION) -> Optional[ParsedRecord]:
    """Check the record (or the piece) at ``off``; None at the end of the records.

    ``limit`` is the end of the segment, ``seq`` its sequence number and ``version`` its format
    version, ``after_gid`` the GID the record must follow (a piece that continues a record carries
    that record's GID, so it may equal ``after_gid``; whether it continues the right record is
    for the caller to check). Raises :class:`BadRecord` for anything but a valid record or the end.
    """
    room = limit - off
    if room <= 0:
        return None
    # the writer ends the records with END_MARK, or as much of it as the segment has room for;
    # what follows it may be a reused file's old bytes (a record never starts with zeros)
    if mv[off:off + min(room, len(END_MARK))] == END_MARK[:room]:
        return None
    if room < RECORD_HEADER_SIZE:
        raise BadRecord("torn", f"{room} bytes at the end of the segment are neither zero nor a record")
    crc, magic, flags, origin_len, payload_len, gid, rec_seq = RECORD.unpack_from(mv, off)
    if magic != RECORD_MAGIC:
        raise BadRecord("garbage", "no record here (bad record magic)")
    pieced = bool(flags & FLAG_PIECE) and version >= 2
    data_start = RECORD_HEADER_SIZE + origin_len + (PIECE.size if pieced else 0)
    size = data_start + payload_len
    if size > room:
        raise BadRecord("torn", f"a record of {size} bytes runs past the end of the segment", gid, flags, None, size)
    if rec_seq != seq:
        raise BadRecord("stale", f"the record carries segment seq {rec_seq}, not {seq} "
                         "(left over from an earlier use of the file)", gid, flags, None, size)
    if _crc32c.crc32c(mv[off + 4:off + size]) != crc:
        raise BadRecord("checksum", "CRC32C mismatch", gid, flags, None, size)
    if flags & FLAG_COMMIT_TIME and version < TIMED_VERSION:
        raise BadRecord("flags", f"record flags {flags:#x} in a version {version} segment", gid, flags, None, size)
    try:
        origin, commit_time = split_origin(mv, off + RECORD_HEADER_SIZE, origin_len, flags)
    except UnicodeDecodeError:
        raise BadRecord("origin", "the origin is not utf-8", gid, flags, None, size) from None
    if flags & ~(DISK_FLAGS | FLAG_COMMIT_TIME if version >= 2 else KNOWN_FLAGS):
        raise BadRecord("flags", f"unknown record flags {flags:#x}", gid, flags, origin, size)
    piece = None
    if pieced:
        total, offset = PIECE.unpack_from(mv, off + RECORD_HEADER_SIZE + origin_len)
        piece = Piece(total, offset, payload_len)
        if total > MAX_RECORD_BYTES or offset + payload_len > total or (payload_len == 0 and total != 0):
            raise BadRecord("piece", f"a piece of [{offset}, {offset + payload_len}) does not fit a record of "
                            f"{total} bytes", gid, flags, origin, size)
    if gid < after_gid or (gid == after_gid and (piece is None or piece.first)):
        raise BadRecord("order", f"GID {gid} does not follow GID {after_gid}", gid, flags, origin, size)
    return ParsedRecord(gid, flags & ~(FLAG_PIECE | FLAG_COMMIT_TIME), origin_len, size, data_start, piece, origin,
                        commit_time)
