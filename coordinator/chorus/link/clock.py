"""Each site's logical clock and the conflict window of one link direction (docs/LINKS.md
section 4; [epoch] "Tracking conflict windows with a logical clock").

A site stamps each change of a linked row with its clock value. Its clock events travel in its
stream to the peer, are written into the peer's log where the peer applied them, and come back in
the peer's stream: the highest own value seen coming back is *max replicated*, and a row whose
stamp is at or above it has a window still open. :class:`LinkWindow` is that state for one site
reading one peer's stream; it takes the stream's items in order and says what to pass through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from chorus.link.events import ClockEvent, RemoteTransaction, SiteId, Stamp


class ClockError(ValueError):
    """A stream item that cannot be right: a clock going back, an event of a third site."""


class SiteClock:
    """A site's logical clock: a non-decreasing integer. With the GID clock (docs/LINKS.md) the
    coordinator sets it to each GID (:meth:`advance`); the seed's coarse clock ticks periodically
    (:meth:`tick`). Either way :meth:`stamp` gives what a change made now records."""

    def __init__(self, site: SiteId, value: int = 0) -> None:
        self.site = site
        self.value = value

    def tick(self) -> ClockEvent:
        """Advance by one: the event to write into the stream before any change stamped with the
        new value ([epoch]: all events of value X precede those of X+1)."""
        self.value += 1
        return ClockEvent(self.site, self.value)

    def advance(self, to: int) -> Optional[ClockEvent]:
        """Move to ``to`` (never back); the event to write, or None if it did not move."""
        if to < self.value:
            raise ClockError(f"site {self.site}'s clock cannot go back from {self.value} to {to}")
        if to == self.value:
            return None
        self.value = to
        return ClockEvent(self.site, to)

    def stamp(self, commit_time: int) -> Stamp:
        return Stamp(self.site, self.value, commit_time)


@dataclass(frozen=True)
class WindowState:
    """The durable part of a :class:`LinkWindow` (a row of ``chorus.link_position``, written in
    the same transaction as each applied item)."""

    local: SiteId
    peer: SiteId
    max_replicated: int  # every own change stamped below it had been applied by the peer
    peer_clock: int  # the peer's clock value last seen in its stream


class LinkWindow:
    """Site ``local`` reading the stream of site ``peer``.

    ``unique_clock``: every transaction of the peer has a clock value of its own (the GID clock),
    so applying one means every peer change below ``clock + 1`` has been applied here; with a
    coarse clock only the peer's tick events say that (more changes with the same value may
    follow).
    """

    def __init__(self, local: SiteId, peer: SiteId, max_replicated: int = 0, peer_clock: int = 0,
                 unique_clock: bool = True) -> None:
        if local == peer:
            raise ClockError("a link joins two different sites")
        self.local = local
        self.peer = peer
        self.max_replicated = max_replicated
        self.peer_clock = peer_clock
        self.unique_clock = unique_clock

    @classmethod
    def restore(cls, state: WindowState, unique_clock: bool = True) -> "LinkWindow":
        return cls(state.local, state.peer, state.max_replicated, state.peer_clock, unique_clock)

    @property
    def state(self) -> WindowState:
        return WindowState(self.local, self.peer, self.max_replicated, self.peer_clock)

    def observe(self, event: ClockEvent) -> Optional[ClockEvent]:
        """Take a clock event of the peer's stream. One of ours coming back raises max
        replicated (it only grows: a late or repeated one changes nothing) and is not passed on;
        one of the peer's is passed through: the event to write into our own log at the point
        where everything before it has been applied, or None when it says nothing new."""
        if event.site == self.local:
            if event.value > self.max_replicated:
                self.max_replicated = event.value
            return None
        if event.site != self.peer:
            raise ClockError(f"site {self.local} reading {self.peer}'s stream met a clock event of {event.site}")
        if event.value < self.peer_clock:
            raise ClockError(f"{self.peer}'s clock went back from {self.peer_clock} to {event.value}")
        if event.value == self.peer_clock:
            return None
        self.peer_clock = event.value
        return event

    def applied(self, txn: RemoteTransaction) -> Optional[ClockEvent]:
        """The peer's transaction ``txn`` is applied (or settled) here: the reflection to write
        with it into our log, or None (a coarse clock reflects on its tick events only)."""
        if txn.site != self.peer:
            raise ClockError(f"site {self.local} reading {self.peer}'s stream met a transaction of {txn.site}")
        if txn.clock < self.peer_clock:
            raise ClockError(f"{self.peer}'s transaction at clock {txn.clock} after clock {self.peer_clock}")
        if not self.unique_clock:
            return None
        return self.observe(ClockEvent(self.peer, txn.clock + 1))

    def in_conflict(self, stamp: Optional[Stamp]) -> bool:
        """NDB$EPOCH's test for an incoming change of the peer to a row stamped ``stamp``: the row's
        last change was ours and its window is open ([epoch]: "in_conflict = row_clockval >=
        maximum_replicated_clockval"). A row last changed by the peer's stream is ordered before
        this change on both sides; a row without a stamp has no open window."""
        return stamp is not None and stamp.site != self.peer and stamp.clock >= self.max_replicated

    def closed(self, stamp: Stamp) -> bool:
        """The stamp can never be in conflict again through this link (max replicated only
        grows): it may be purged, by any node, at any time."""
        return stamp.site == self.peer or stamp.clock < self.max_replicated
