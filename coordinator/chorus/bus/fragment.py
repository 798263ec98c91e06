"""Fragmentation of bus messages larger than one frame, and reassembly in delivery order.

Frame header (10 bytes, big-endian): ``u8 version (1)``, ``u8 flags`` (bit 0 FIRST, bit 1 LAST),
``u32 message sequence`` (per sender), ``u32 fragment index``. Frames of one sender arrive in
the order it sent them (agreed order is FIFO per sender), so a message is whole when its LAST
frame arrives, and it takes the position of that frame in the total order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterator, Optional, Union

from chorus.spool import SPOOL_AT, Spool, SpooledBuffer, SpoolWriter

VERSION = 1
FIRST = 1
LAST = 2
HEADER = struct.Struct(">BBII")
DEFAULT_FRAME_LIMIT = 512 * 1024


class FragmentError(ValueError):
    """A frame that does not fit the sender's message in progress."""


class SpoolError(Exception):
    """A large message could not be kept in its spool file (a full disk): this member can no
    longer follow the group and must leave it."""


def fragments(payload: bytes, seq: int, frame_limit: int = DEFAULT_FRAME_LIMIT) -> Iterator[bytes]:
    """Frames of one message, each at most ``frame_limit`` bytes including the header."""
    chunk = frame_limit - HEADER.size
    if chunk <= 0:
        raise ValueError("frame limit smaller than the frame header")
    n = max(1, -(-len(payload) // chunk))
    for i in range(n):
        flags = (FIRST if i == 0 else 0) | (LAST if i == n - 1 else 0)
        yield HEADER.pack(VERSION, flags, seq & 0xFFFFFFFF, i) + payload[i * chunk:(i + 1) * chunk]


def whole_frame(payload: bytes, seq: int) -> bytes:
    """The one frame of a message that fits in a frame."""
    return HEADER.pack(VERSION, FIRST | LAST, seq & 0xFFFFFFFF, 0) + payload


@dataclass
class _Partial:
    seq: int
    next_index: int
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    spooled: Optional[SpoolWriter] = None  # past spool_at, the parts go to a spool file


class Reassembler:
    """Per-sender reassembly. Feed frames in delivery order. With a ``spool``, a message larger
    than ``spool_at`` is gathered in a spool file and delivered as a
    :class:`~chorus.spool.SpooledBuffer` (mapped, not in memory); others as bytes."""

    def __init__(self, max_message: int = 5 << 30, spool: Optional[Spool] = None, spool_at: int = SPOOL_AT) -> None:
        self._partial: dict[str, _Partial] = {}
        self.max_message = max_message
        self.spool = spool
        self.spool_at = spool_at

    def feed(self, sender: str, frame: bytes) -> Optional[Union[bytes, SpooledBuffer]]:
        """Returns the whole message when ``frame`` completes one, else None."""
        if len(frame) < HEADER.size:
            self.drop(sender)
            raise FragmentError(f"frame of {len(frame)} bytes from {sender} is shorter than its header")
        version, flags, seq, index = HEADER.unpack_from(frame)
        if version != VERSION:
            self.drop(sender)
            raise FragmentError(f"unsupported frame version {version} from {sender}")
        body = frame[HEADER.size:]
        p = self._partial.get(sender)
        if flags == FIRST | LAST and p is None and index == 0:
            return body  # a message in one frame (the usual case)
        if flags & FIRST:
            if index != 0:
                raise FragmentError(f"first frame with index {index} from {sender}")
            if p is not None:
                self.drop(sender)
                raise FragmentError(f"{sender} started message {seq} before finishing {p.seq}")
            p = _Partial(seq, 0)
        elif p is None or p.seq != seq or p.next_index != index:
            self.drop(sender)
            raise FragmentError(f"out-of-order frame {index} of message {seq} from {sender}")
        p.next_index += 1
        p.size += len(body)
        if p.size > self.max_message:
            self._partial[sender] = p
            self.drop(sender)
            raise FragmentError(f"message from {sender} exceeds {self.max_message} bytes")
        try:
            if p.spooled is None and self.spool is not None and p.size > self.spool_at:
                p.spooled = self.spool.writer()
                for part in p.parts:
                    p.spooled.write(part)
                p.parts = []
            if p.spooled is not None:
                p.spooled.write(body)
            else:
                p.parts.append(body)
            if flags & LAST:
                self._partial.pop(sender, None)
                return p.spooled.finish() if p.spooled is not None else b"".join(p.parts)
        except OSError as e:
            self._partial[sender] = p
            self.drop(sender)
            raise SpoolError(f"message {seq} from {sender}: {e}") from e
        self._partial[sender] = p
        return None

    def drop(self, sender: str) -> None:
        """The sender left (or sent something wrong): forget its partial message."""
        p = self._partial.pop(sender, None)
        if p is not None and p.spooled is not None:
            p.spooled.discard()

    def pending(self) -> int:
        return len(self._partial)
