"""The totally ordered group bus.

One interface, two implementations: :class:`chorus.bus.corosync.CorosyncBus` (Corosync CPG,
the real daemon) and :class:`chorus.bus.simulated.SimulatedBus` (deterministic, in-process, for
unit tests of pure logic only).

Guarantees every implementation gives (the seed's GCS requirements, section 11):

* **Agreed order.** Every member delivers the same messages in the same order.
* **Self-delivery.** A member receives its own messages, in that order too.
* **Virtual synchrony of views.** Membership changes (:class:`View`) are delivered in the same
  order relative to messages on every member that stays connected.
* **Whole messages.** ``send`` accepts payloads of any size up to ``MAX_MESSAGE``; larger ones
  are fragmented below this interface and delivered once, whole, at the position of their
  last fragment. A partly received message of a member that leaves is dropped.

What travels on it is :mod:`chorus.bus.proto` (the message types, each encoded and decoded side by
side); :mod:`chorus.bus.sender` is a node's outbox.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator, Collection, Optional, Union

if TYPE_CHECKING:
    from chorus.spool import Spool, SpooledBuffer

MAX_MESSAGE = 1 << 30


class BusError(Exception):
    """The bus failed (daemon gone, member evicted); the coordinator must rejoin."""


@dataclass(frozen=True)
class View:
    """A membership change, delivered in total order with messages.

    Member ids are strings ``"<nodeid>:<pid>"`` (Corosync) or the simulated member's name;
    :func:`bus_node` gives the part that names the member's bus node (one vote each).
    ``quorum`` is how many votes (bus nodes) make a majority of the configured cluster;
    ``expected`` is the configured number of votes and ``tie_breaker`` the bus node whose half
    wins an even split ("" when ties are not broken). :meth:`votes` combines them.
    """

    view_id: int
    members: tuple[str, ...]
    joined: tuple[str, ...]
    left: tuple[str, ...]
    local: str
    quorate: bool
    quorum: int = 1
    expected: int = 0
    tie_breaker: str = ""
    voters: Optional[frozenset[str]] = None  # Votes.voters (None: every bus node has a vote)

    @property
    def votes(self) -> "Votes":
        return Votes(self.quorum, self.expected, self.tie_breaker, self.voters)


@dataclass(frozen=True)
class Votes:
    """Which sets of bus nodes make a primary component.

    A set is a quorum when it holds a strict majority of the configured votes, or, with a tie
    breaker, exactly half of them including the tie-breaking node. Any two quorums share a
    node, which is what uniform commit and the cut-off rule rely on (docs/MEMBERSHIP.md).
    The tie breaker is fixed by configuration (the lowest configured node id by default), never
    by who happens to be present, so two halves can never both win.

    ``voters``: the bus nodes that have a vote (the configured nodes' Corosync ids once `chorus node
    add`/`remove` changed them: confchange.votes); any other bus node in a set counts zero. None:
    every bus node has one (Corosync's own count: votequorum gives a vote to each node it lists).
    """

    quorum: int = 1
    expected: int = 0
    tie_breaker: str = ""
    voters: Optional[frozenset[str]] = None

    def holds(self, nodes: Collection[str]) -> bool:
        counted = set(nodes) if self.voters is None else set(nodes) & self.voters
        n = len(counted)
        if n >= self.quorum:
            return True
        return bool(self.tie_breaker) and 2 * n == self.expected and self.tie_breaker in counted


def bus_node(member: str) -> str:
    """The bus node (Corosync node id) a member runs on: members on one node share a vote."""
    return member.split(":", 1)[0]


@dataclass(frozen=True)
class Delivery:
    """One whole message, in agreed order."""

    sender: str
    payload: Union[bytes, "SpooledBuffer"]  # a large message, with a spool in use: mapped from its file


Event = Union[View, Delivery]


class Bus(abc.ABC):
    """A connection of one member to one group."""

    @property
    @abc.abstractmethod
    def local_id(self) -> str:
        """This member's id (valid after :meth:`join`)."""

    @abc.abstractmethod
    async def join(self) -> None:
        """Connect and join the group. The first event after it is a :class:`View` that
        includes this member."""

    @abc.abstractmethod
    async def send(self, payload: bytes) -> None:
        """Multicast ``payload`` in agreed order (fragmenting if needed). Retries with back-off
        while the bus says "try again"; raises :class:`BusError` when it cannot send."""

    @abc.abstractmethod
    def events(self) -> AsyncIterator[Event]:
        """Deliveries and views in agreed order. Raises :class:`BusError` if the connection
        to the bus is lost."""

    def send_nowait(self, payload: bytes) -> bool:
        """Multicast ``payload`` at once if the bus takes it without waiting; False (nothing
        sent) otherwise: the caller then uses :meth:`send`. Never reorders: it sends nothing
        while a :meth:`send` is under way. The commit path uses it to avoid a task per message."""
        return False

    def use_spool(self, spool: "Spool") -> None:
        """Gather messages larger than spool.SPOOL_AT in files of ``spool``: they are delivered
        as :class:`~chorus.spool.SpooledBuffer` (mapped), not as bytes."""
        reassembler = getattr(self, "_reassembler", None) or getattr(self, "reassembler", None)
        if reassembler is not None:
            reassembler.spool = spool

    async def batches(self) -> AsyncIterator[list[Event]]:
        """The events of :meth:`events`, in the same order, handed over in lists: everything
        that arrived together (one read of the bus) comes at once."""
        async for ev in self.events():
            yield [ev]

    @abc.abstractmethod
    async def leave(self) -> None:
        """Leave the group and release the connection. Idempotent."""
