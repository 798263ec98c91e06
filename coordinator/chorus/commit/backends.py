"""The local backends' socket (docs/PROTOCOL.md section 1): each backend sends its writeset at
COMMIT and waits for the verdict; it then reports its commit (or abort) of the certified GID,
asks for causal-read markers, and returns the content of a schema change it ran.

A backend's writeset gets a ticket and goes to the bus (bus/sender.py); the verdict comes back
from the replicator by ticket. A certified local writeset enters the commit pipeline
(pipeline.py) with its backend, which commits it; if the backend goes away first, the pipeline
replays it. What becomes of a certified writeset is the pipeline's decision
(``CommitPipeline.admit_local``, ``backend_gone``): this module sends the frames.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional, cast

from chorus.commit import backendproto as bpf
from chorus import wire
from chorus.bus import BusError
from chorus.bus.sender import BusSender
from chorus.commit.causal import CausalReads
from chorus.nodestatus import Counters
from chorus.commit.pipeline import CommitPipeline, Pending
from chorus.actions import LocalVerdict
from chorus.spool import SPOOL_AT, Spool, SpoolWriter

log = logging.getLogger("chorus.coordinator")


@dataclass
class Backend:
    transport: asyncio.WriteTransport
    pid: int = 0
    ticket: int = 0  # outstanding writeset ticket, 0 if none
    certified: set[int] = field(default_factory=set)  # certified GIDs not yet reported committed
    closed: bool = False

    def send(self, frame: bytes) -> None:
        if not self.closed:
            self.transport.write(frame)


class BackendConnection(asyncio.Protocol):
    """One backend's socket. Frames are handled as they arrive, in the callback that reads
    them: the commit path costs no task switch per frame."""

    def __init__(self, server: "BackendServer") -> None:
        self.server = server
        self.parser = bpf.FrameParser()
        self.backend: Optional[Backend] = None
        # a large writeset being received: its spool file, and how much of it is still to come
        self._spooling: Optional[SpoolWriter] = None
        self._left = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's is not a subclass of asyncio's classes)
        self.backend = Backend(cast(asyncio.WriteTransport, transport))

    def data_received(self, data: bytes) -> None:
        b = self.backend
        assert b is not None
        spool = self.server.spool
        try:
            while data:
                if self._spooling is not None:
                    data = self._spool_more(b, data)
                    continue
                for frame in self.parser.feed(data):
                    self.server.frame(b, frame)
                data = b""
                # a writeset larger than SPOOL_AT goes to a spool file as it arrives, not to memory
                large = self.parser.take_large(SPOOL_AT) if spool is not None else None
                if large is not None and spool is not None:
                    self._spooling, self._left = spool.writer(), large[0] - 1
                    data = large[1][5:]  # after the length and the type byte
        except OSError as e:  # the spool directory: the backend is told the coordinator failed
            log.error("closing backend connection (pid %d): cannot spool its writeset: %s", b.pid, e)
            if self._spooling is not None:
                self._spooling.discard()
                self._spooling = None
            b.transport.close()
        except (bpf.FrameError, wire.WireError) as e:
            self.server.counters.malformed_frames += 1
            log.warning("closing backend connection (pid %d): malformed frame: %s", b.pid, e)
            b.transport.close()

    def _spool_more(self, b: Backend, data: bytes) -> bytes:
        """Write the next bytes of the large writeset being received; what follows it is returned."""
        assert self._spooling is not None
        n = min(len(data), self._left)
        self._spooling.write(memoryview(data)[:n])
        self._left -= n
        if self._left == 0:
            whole, self._spooling = self._spooling.finish(), None
            self.server.frame(b, bpf.Frame(bpf.FrameType.WRITESET.value, whole))  # type: ignore[arg-type]
        return data[n:]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self._spooling is not None:
            self._spooling.discard()
            self._spooling = None
        if self.backend is not None:
            self.server.closed(self.backend)


class BackendServer:
    """Answers the backends. ``refusal()`` says why this node takes no writes now (None: it
    does); ``stale(last_seen)`` why a writeset whose snapshot saw GID ``last_seen`` must not be
    ordered (Replicator.stale_local), or None; ``expect(ticket, writeset)`` hands the replicator
    the scanned writeset its verdict will be about, so it is not parsed again when it comes back
    from the bus."""

    def __init__(self, node: str, max_writeset: int, counters: Counters, pipeline: CommitPipeline,
                 sender: BusSender, causal: CausalReads,
                 refusal: Callable[[], Optional[str]], expect: Callable[[int, wire.Writeset], None],
                 stale: Optional[Callable[[int], Optional[str]]] = None) -> None:
        self.node = node
        self.max_writeset = max_writeset  # what the writeset log holds: larger local writesets are refused
        self.counters = counters
        self.pipeline = pipeline
        self.sender = sender
        self.causal = causal
        self._refusal = refusal
        self._expect = expect
        self._stale = stale
        self.spool: Optional[Spool] = None  # where large writesets from backends go (set by the coordinator)
        self.info: Optional[Callable[[str], str]] = None  # the extension's views (nodestatus.info; set likewise)
        self.tickets: dict[int, Backend] = {}
        self._next_ticket = 1

    def protocol(self) -> BackendConnection:
        return BackendConnection(self)

    def frame(self, b: Backend, frame: bpf.Frame) -> None:
        t = frame.type
        if t == bpf.FrameType.WRITESET:
            self._writeset(b, frame.payload)
        elif t == bpf.FrameType.COMMITTED:
            gid, _ = bpf.parse_done(frame.payload)
            self.pipeline.local_done(gid)
        elif t == bpf.FrameType.SYNC:
            self._sync_request(b)
        elif t == bpf.FrameType.INFO:
            self._info(b, frame.payload)
        elif t == bpf.FrameType.DDL_RAN:
            gid, _, content = bpf.parse_ran(frame.payload)
            wire.scan(content)  # checked before it reaches the bus
            self.pipeline.ddl_ran(gid, b, content)
        else:  # FrameType.ABORTED
            gid, xid = bpf.parse_done(frame.payload)
            log.info("backend %d aborted certified GID %d (xid %d): replaying it", b.pid, gid, xid)
            self.pipeline.replay(gid)

    def closed(self, b: Backend) -> None:
        b.closed = True
        if b.ticket:
            self.tickets.pop(b.ticket, None)
        self.pipeline.backend_gone(b)

    def _writeset(self, b: Backend, payload: bytes) -> None:
        ws = wire.scan(payload)  # checked before it reaches the bus
        b.pid = ws.pid
        why = self._refusal()
        if why is not None:
            self.counters.refused += 1
            b.send(bpf.verdict_frame(bpf.VERDICT_REFUSED, 0, 0, f"this node does not accept writes: {why}"))
            return
        why = self._stale(ws.last_seen) if self._stale is not None else None
        if why is not None:
            # a serialization failure (40001), before any node sees it: a retry takes a newer snapshot
            self.counters.refused += 1
            b.send(bpf.verdict_frame(bpf.VERDICT_CONFLICT, 0, 0, why))
            return
        limit = self.max_writeset
        if len(payload) > limit:
            # every certified writeset must fit in the writeset log (partial recovery serves it)
            self.counters.refused += 1
            b.send(bpf.verdict_frame(
                bpf.VERDICT_TOO_LARGE, 0, 0,
                f"the transaction's writeset ({len(payload) / 1e6:.1f} MB) is larger than this node's writeset log "
                f"can hold ({limit / 1e6:.1f} MB): raise log.total_mb in the coordinator's configuration, or "
                "split the transaction"))
            return
        ticket = self._next_ticket
        self._next_ticket += 1
        b.ticket = ticket
        self.tickets[ticket] = b
        self._expect(ticket, ws)
        self.sender.queue_writeset(ticket, payload)

    def batch_failed(self, tickets: list[int], e: BusError) -> None:
        """The bus could not take these writesets: their backends are refused."""
        for ticket in tickets:
            b = self.tickets.pop(ticket, None)
            if b is not None and not b.closed:
                b.ticket = 0
                b.send(bpf.verdict_frame(bpf.VERDICT_REFUSED, 0, 0, f"the group bus failed: {e}"))

    def _info(self, b: Backend, what: bytes) -> None:
        """One of the extension's views (chorus.node, chorus.members, chorus.conflicts), as JSON
        in a COMMIT verdict's message; a REFUSED verdict says why not."""
        try:
            if self.info is None or len(what) > 256:
                raise ValueError("no such view")
            text = self.info(what.decode("utf-8"))
            if len(text.encode()) > 0xFFFF:
                raise ValueError("the answer is too large")
        except (ValueError, UnicodeDecodeError) as e:
            b.send(bpf.verdict_frame(bpf.VERDICT_REFUSED, 0, 0, str(e)))
            return
        b.send(bpf.verdict_frame(bpf.VERDICT_COMMIT, 0, 0, text))

    def _sync_request(self, b: Backend) -> None:
        why = self._refusal()
        if why is not None:
            b.send(bpf.verdict_frame(bpf.VERDICT_REFUSED, 0, 0, f"this node is not in the primary component: {why}"))
            return
        self.causal.request(b)

    def verdict(self, v: LocalVerdict) -> None:
        """The cluster certified (or refused) the writeset of ticket ``v.ticket``."""
        b = self.tickets.pop(v.ticket, None)
        if b is not None:
            b.ticket = 0
        if not v.ok:
            if b is not None and not b.closed:
                kind = (bpf.VERDICT_UNKNOWN if v.unknown else bpf.VERDICT_CONFLICT if v.gid
                        else bpf.VERDICT_REFUSED)
                b.send(bpf.verdict_frame(kind, v.gid, 0, v.reason))
            return
        p = self.pipeline.admit_local(v, b)
        if p is not None and b is not None:  # its backend commits it now
            # the message of a COMMIT verdict is the origin commit time the stamps record (docs/PROTOCOL.md 1)
            b.send(bpf.verdict_frame(bpf.VERDICT_COMMIT, v.gid, p.wait_for, _time_text(v.commit_time), prev=v.prev))

    @staticmethod
    def settled(p: Pending, ok: bool, failure: str) -> None:
        """Every node reported on this node's schema change ``p``: its waiting backend commits
        it, or fails with the error of the node that could not apply it (``failure``: "node:
        SQLSTATE message"), the change undone everywhere."""
        b = p.backend
        if not isinstance(b, Backend) or b.closed:
            return
        if ok:
            b.send(bpf.verdict_frame(bpf.VERDICT_COMMIT, p.gid, p.wait_for, _time_text(p.commit_time), prev=p.prev))
            return
        node, _, reason = failure.partition(": ")
        state, _, text = reason.partition(" ")
        if len(state) != 5 or not state.isalnum() or not state.isupper() and not state.isdigit():
            state, text = "XX000", reason
        b.send(bpf.verdict_frame(bpf.VERDICT_UNDONE, p.gid, p.wait_for, f"{state}{node}: {text}"[:60000],
                                 prev=p.prev))

    @staticmethod
    def ddl_outcome(p: Pending, ok: bool, error: str) -> None:
        """Tell a schema change's waiting backend how it went in the cluster."""
        b = p.backend
        if isinstance(b, Backend) and not b.closed:
            b.send(bpf.verdict_frame(bpf.VERDICT_COMMIT if ok else bpf.VERDICT_REFUSED, p.gid, p.prev, error))


def _time_text(commit_time: int) -> str:
    """A COMMIT verdict's message: the writeset's origin commit time in decimal µs ("" unknown),
    which the extension's stamps record (extension/chorus_coord.c chorus_verdict_commit_time)."""
    return str(commit_time) if commit_time > 0 else ""
