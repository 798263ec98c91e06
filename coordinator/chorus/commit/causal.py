"""Causal reads (docs/ISOLATION.md): a backend asks, before it reads, for the GID certified
before a marker this node sends through the bus after its request; once the node has committed
up to that GID the read sees every write acknowledged anywhere before it began. Requests that
arrive while a marker is on the bus share the next one."""

from __future__ import annotations

from typing import Callable, Protocol

from chorus.commit import backendproto as bpf
from chorus.bus import proto as bp
from chorus.actions import SyncReached


class Reader(Protocol):
    """A backend waiting for its answer (commit/backends.py)."""
    closed: bool

    def send(self, frame: bytes) -> None: ...


class CausalReads:
    def __init__(self, node: str, send: Callable[[bp.Message], None]) -> None:
        self.node = node
        self._send = send
        self._waiting: list[Reader] = []  # readers waiting for the next marker
        self._on_bus: dict[int, list[Reader]] = {}  # marker token -> its readers
        self._token = 0

    def request(self, b: Reader) -> None:
        self._waiting.append(b)
        if not self._on_bus:
            self._send_marker()

    def reached(self, s: SyncReached) -> None:
        """Marker ``s.token`` was delivered: its readers learn the GID certified before it."""
        for b in self._on_bus.pop(s.token, []):
            if b.closed:
                continue
            if s.ok:
                b.send(bpf.verdict_frame(bpf.VERDICT_COMMIT, s.gid, 0, ""))
            else:
                b.send(bpf.verdict_frame(bpf.VERDICT_REFUSED, 0, 0, "this node left the primary component"))
        if self._waiting and not self._on_bus:
            self._send_marker()

    def view_changed(self) -> None:
        """Markers not delivered yet never will be: send a new one for their readers."""
        for token in sorted(self._on_bus):
            self._waiting = self._on_bus.pop(token) + self._waiting
        if self._waiting:
            self._send_marker()

    def _send_marker(self) -> None:
        self._token += 1
        self._on_bus[self._token] = self._waiting
        self._waiting = []
        self._send(bp.SyncMarker(self.node, self._token))
