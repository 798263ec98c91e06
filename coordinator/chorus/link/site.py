"""A node's part in its site's links (docs/LINKS.md sections 3 and 10): the thin I/O shell the
coordinator runs for the ``[[link]]`` tables of its configuration.

- **Senders**: every node with a link's ``listen`` serves this site's writeset log to the peer's
  receiver (link/sender.py's :class:`LinkServer`), from the position the receiver asks for.
- **The receiver**: of the nodes that may run it (``nodes``, or any member), the lowest-named
  synced member of the primary component runs it (:func:`receiver_node`); every node decides so
  from the membership it sees, and starts or stops its receiver when that changes (a failover:
  the next node resumes from ``chorus.link_position``; an old and a new receiver sending the same
  range for a moment is harmless, the apply commits the second copy empty).
- :class:`Inbound` is the receiver's sink and position: each received transaction goes on this
  site's bus as a link writeset (bus/proto.py ``LinkWriteset``), which every node applies at its
  GID (link/position.py); the position is the link's committed row.

Why a window rather than one transaction at a time: a link writeset waits for its GID's commit
here (a bus round trip, then its turn), and the stream is one site's commits in order; with up to
``window`` of them on the bus at once the link keeps up with a busy peer. Nothing is lost by it:
each link writeset names the peer GID it follows (``after``), and the apply takes it only where
the link's position is exactly that (link/position.py), so if one is not applied (its message
lost with a membership change, or refused), every later one commits empty too, and the receiver,
which waits for each outcome, starts the stream again from the position. While ``window`` wait,
what arrives is held and sent on as one batch (bus version 6) when an outcome frees a place, so a
receiver that falls behind catches up a batch per GID (docs/LINKS.md section 3.1).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional, Sequence

from chorus import wire
from chorus.bus import proto as bp
from chorus.config import LinkConfig, link_rules, link_settings
from chorus.link import copy as lc
from chorus.link import position as lp
from chorus.link import proto as lproto
from chorus.link import status as ls
from chorus.link.events import ClockEvent, RemoteTransaction, StreamItem
from chorus.link.proto import LinkEnd, LinkError, LinkKeys, Position
from chorus.link.receiver import LinkReceiver
from chorus.link.rules import RuleError, RuleSet, foreign_roles
from chorus.link.sender import LinkServer, Provenance, pin_name
from chorus.link.settle import realignment
from chorus.link.sqleval import PgEvaluator
from chorus.spool import Spool
from chorus.wslog import LogRecord, WritesetLog

log = logging.getLogger("chorus.link")

# what status reads of the links this site receives (refresh())
POSITIONS_SQL = ("SELECT link, applied_gid, peer_clock, max_replicated, "
                 "pg_catalog.date_part('epoch', updated_at) FROM chorus.link_position")
EXCEPTIONS_AT_SQL = "SELECT pg_catalog.max(gid) FROM chorus.link_exceptions"
CONFLICTS_SQL = ("SELECT link, table_name, decision, pg_catalog.count(*) FROM chorus.link_exceptions "
                 "GROUP BY link, table_name, decision")

OUTCOME_TIMEOUT_S = 60.0  # a link writeset not committed here by then is taken as lost: resume from the position
DRAIN_TIMEOUT_S = 30.0  # how long a reconnect waits for the outcomes of what is in flight
# a receiver that found its link broken is started again after this long, not at every membership
# tick: the link shows broken here meanwhile, and is tried again in case it was instantiated anew
BROKEN_RETRY_S = 60.0
# a batch of peer transactions sent on as one link writeset (docs/LINKS.md section 3.1): at most
# this many bytes of writesets (a larger transaction goes alone) and this many transactions
BATCH_BYTES = 1 << 20
BATCH_MAX = 1024


def receiver_node(link: LinkConfig, synced: Iterable[str]) -> Optional[str]:
    """The node that runs ``link``'s receiver: the lowest-named synced member of the primary
    component among those that may (docs/LINKS.md section 10); None if no such member."""
    allowed = set(synced) & set(link.nodes) if link.nodes else set(synced)
    return min(allowed) if allowed else None


class NoSql:
    """The rules evaluator of a link whose rules have no SQL part (no row filter, no computed
    column, no row function): routing never asks it, so being asked is an error."""

    def predicate(self, table: wire.Table, values: tuple[wire.Value, ...], predicate: str) -> bool:
        raise RuleError("this link's rules have no SQL evaluator")

    def expression(self, table: wire.Table, values: tuple[wire.Value, ...], expression: str) -> wire.Value:
        raise RuleError("this link's rules have no SQL evaluator")

    def row_function(self, table: wire.Table, values: tuple[wire.Value, ...],
                     function: str) -> Optional[tuple[wire.Value, ...]]:
        raise RuleError("this link's rules have no SQL evaluator")


def evaluator(link: LinkConfig, rules: RuleSet, dsn: str) -> "NoSql | PgEvaluator":
    """The evaluator of ``link``'s rules: in PostgreSQL (link/sqleval.py) when they have SQL
    parts, through ``rules_dsn``, whose role must not be a superuser (config.link_rules requires it:
    a function the rules call runs with the session's rights, and its owner may change it)."""
    if not rules.needs_sql:
        return NoSql()
    return PgEvaluator(link.rules_dsn or dsn, link.rules_timeout_ms, strict=True, name=link.name)


def provenance(link: LinkConfig, links: Sequence[LinkConfig] = ()) -> Callable[[LogRecord], Provenance]:
    """What the sender of ``link`` knows of a record: one a link applied here has its link's
    origin (link/position.py) and is not sent back; one of this link carries its reflection, the
    peer's clock value this site had applied when it committed (the link's row it wrote), which
    the sender passes back so the peer's ``max_replicated`` moves; on the link's arbiter, also
    the realignment its exceptions call for (link/settle.py ``realignment``, docs/LINKS.md
    section 7.1), which the sender sends as this site's change at that GID. A record of this
    site's own carries the commit time its log record kept (the bus message's, the same on every
    node; 0 for one logged by a release before); a realignment carries 0, as the stamps of the
    rows it realigns on this site say (link/settle.py). A record another of this site's ``links``
    applied (a third site's change, sent on where ``link.forward``, docs/LINKS.md section 10)
    names the site it came from (that link's peer) and the site where it was made (the origin its
    writeset names, else that peer), with the commit time its log record kept (the origin's, of
    the last transaction it holds)."""
    own = lp.origin(link.name)
    others = {lp.origin(k.name): k.peer_site for k in links if k.name != link.name}
    try:
        arbiter = link_settings(link).arbiter == link.site
    except ValueError:  # settings that cannot decide: the apply of every link writeset fails with the reason
        arbiter = False

    def facts(record: LogRecord) -> Provenance:
        if record.origin == own:
            ws = wire.decode(bytes(record.payload))
            row = lp.reflected_in(ws)
            if row is None or row.link != link.name:  # committed empty: nothing applied, nothing to reflect
                return Provenance(0, applied_from=link.peer_site)
            return Provenance(0, applied_from=link.peer_site, reflection=ClockEvent(link.peer_site, row.peer_clock),
                              realign=realignment(ws) if arbiter else None)
        if lp.is_link_origin(record.origin):  # another link's: a third site's change
            frm = others.get(record.origin, record.origin)
            made = lp.origin_in(wire.decode(bytes(record.payload))) if link.forward else None
            return Provenance(record.commit_time, applied_from=frm, origin=made or frm)
        return Provenance(record.commit_time)
    return facts


@dataclass
class _Flight:
    msg: bp.LinkWriteset
    sent: float
    count: int = 1  # peer transactions in it
    done: "asyncio.Future[Optional[lp.Decision]]" = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Inbound:
    """The sink and position of this node's receiver of one link.

    :meth:`sink` sends each :class:`RemoteTransaction` on as a link writeset and returns once
    fewer than ``window`` are waiting for their outcome here; a clock event of the peer moves
    the peer clock, one of this site passed back moves ``max_replicated`` (both go with the next
    link writeset). :meth:`committed` hears each outcome. An outcome other than "applied" (or a
    duplicate of what is applied), or none within ``outcome_timeout``, makes the next
    :meth:`sink` call raise :class:`LinkError`: the receiver then connects again and
    :meth:`position` (after waiting for what is still in flight) reads where the link is.
    """

    def __init__(self, node: str, link: LinkConfig, send: Callable[[bp.Message], None],
                 read: Callable[[], Awaitable[Optional[lp.PositionRow]]], window: int = 64,
                 outcome_timeout: float = OUTCOME_TIMEOUT_S, drain_timeout: float = DRAIN_TIMEOUT_S,
                 wall: Callable[[], float] = time.time, batch_bytes: int = BATCH_BYTES,
                 batch_max: int = BATCH_MAX, batches: Callable[[], bool] = lambda: True,
                 direct: Optional[Mapping[str, str]] = None) -> None:
        self.node = node
        # the sites this site receives from over its other links (site: link): a change of one of
        # them that this link's peer forwards would be applied twice (docs/LINKS.md section 10)
        self.direct = dict(direct or {})
        self.held_origin: Optional[str] = None  # the origin of what is held (a batch has one)
        self.link = link
        self.send = send
        self.read = read
        self.window = window
        self.outcome_timeout = outcome_timeout
        self.drain_timeout = drain_timeout
        self.wall = wall
        self.after = 0  # the peer GID the next link writeset follows
        self.peer_clock = 0
        self.max_replicated = 0
        self.failed: Optional[str] = None
        self.flights: OrderedDict[int, _Flight] = OrderedDict()
        self._ticket = secrets.randbits(62)  # tickets of an earlier run of this node are not taken for these
        self.sent = 0  # transactions received and sent on
        self.applied = 0
        # transactions received while ``window`` link writesets wait for their outcome: sent on
        # together, as one batch, when one of those commits or the batch is full (docs/LINKS.md
        # section 3.1)
        self.held: list[bp.LinkWriteset] = []
        self.held_bytes = 0
        self.batch_bytes = batch_bytes
        self.batch_max = min(batch_max, bp.MAX_LINK_STEPS)
        self.batches = batches  # the site's bus carries batches (version 6): every member reads them
        self.settings = link_settings(link).fingerprint  # (every node compares it with its own)

    async def position(self) -> Position:
        """Where the link resumes: its committed row, once what is in flight has an outcome."""
        self.held, self.held_bytes = [], 0  # not sent on: the stream sends them again from the position
        await self._drain()
        row = await self.read()
        self.after = row.applied_gid if row is not None else 0
        self.peer_clock = row.peer_clock if row is not None else 0
        self.max_replicated = row.max_replicated if row is not None else 0
        self.failed = None
        return Position(self.after, self.peer_clock)

    async def sink(self, item: StreamItem) -> None:
        self._check()
        if isinstance(item, ClockEvent):
            if item.site == self.link.peer_site:
                self.peer_clock = max(self.peer_clock, item.value)
            else:
                self.max_replicated = max(self.max_replicated, item.value)
            return
        assert isinstance(item, RemoteTransaction)
        ws = item.writeset
        if ws.has_schema and not self.link.ddl:
            raise LinkError(f"link {self.link.name}: peer GID {item.clock} holds a schema change, which this site "
                            "does not apply: set ddl = true in its [[link]] to apply the peer's schema changes")
        foreign = foreign_roles(self.link.ddl_roles, ws) if ws.has_schema else []
        if foreign:  # it would run here as that role, which this site does not trust as the peer's
            raise LinkError(f"link {self.link.name}: peer GID {item.clock} holds a schema change made by role(s) "
                            f"{', '.join(foreign)}, not in this site's ddl_roles: it is not applied here. Make it "
                            "here yourself and add the role to ddl_roles only if it is the same, with the same "
                            "rights, on both sites")
        if ws.toi or ws.concurrent:
            raise LinkError(f"link {self.link.name}: peer GID {item.clock} is a schema change's ordering request or a "
                            "concurrent index change, which links do not carry")
        raw = ws.raw or wire.encode(ws)
        if lp.origin_in(ws) is not None:  # (a sender never sends schema chorus: the mark is this site's to add)
            raise LinkError(f"link {self.link.name}: peer GID {item.clock} carries a chorus.link_origin mark")
        if item.origin is not None:  # a third site's change, forwarded by the peer (a chain)
            if item.origin == self.link.site:
                raise LinkError(f"link {self.link.name}: site {self.link.peer_site} sent a change of this site's "
                                f"back (peer GID {item.clock})")
            if item.origin in self.direct:
                raise LinkError(
                    f"link {self.link.name}: site {self.link.peer_site} forwards site {item.origin}'s changes, which "
                    f"this site receives directly over link {self.direct[item.origin]}: each would be applied "
                    f"twice. Set forward = false on site {self.link.peer_site}'s link {self.link.name}, or remove "
                    f"link {self.direct[item.origin]} (a chain is A-B-C without a link A-C)")
            raw = wire.encode(lp.with_origin(ws, item.origin))
        if self.held and item.origin != self.held_origin:  # a batch is of one origin (its record names one)
            await self._room()
            self._flush()
        self.held_origin = item.origin
        self.peer_clock = max(self.peer_clock, item.clock + 1)
        msg = bp.LinkWriteset(self.node, 0, self.link.name, self.link.peer_site, self.after, item.clock,
                              self.peer_clock, self.max_replicated, item.commit_time, int(self.wall() * 1e6),
                              raw, self.settings)
        self.after = item.clock
        self.sent += 1
        alone = not (self.batches() and lp.batchable(ws)) or len(msg.writeset) >= self.batch_bytes
        if alone and self.held:
            await self._room()
            self._flush()
        self.held.append(msg)
        self.held_bytes += len(msg.writeset)
        if (alone or len(self.held) >= self.batch_max or self.held_bytes >= self.batch_bytes
                or len(self.flights) < self.window):
            await self._room()
            self._flush()

    async def _room(self) -> None:
        """Wait until what is held can be sent on (fewer than ``window`` link writesets wait for
        their outcome), or was (an outcome sent it)."""
        while self.held and len(self.flights) >= self.window:
            await self._wait_oldest()
            self._check()

    def _flush(self) -> None:
        """Send what is held on as one link writeset (a batch of them all, or one alone)."""
        if not self.held:
            return
        held, self.held, self.held_bytes = self.held, [], 0
        self._ticket += 1
        msg = dataclasses.replace(lp.batch(held), ticket=self._ticket, sent_at=int(self.wall() * 1e6))
        self.flights[msg.ticket] = _Flight(msg, time.monotonic(), len(held))
        self.send(msg)

    def applied_through(self) -> Optional[int]:
        """The last peer GID this site applied in order, as far as this node knows: the one the
        oldest link writeset in flight follows, else the last one sent on (all of them had their
        outcome, applied or duplicates); None once one failed (the position is read again)."""
        if self.failed is not None:
            return None
        for f in self.flights.values():
            return f.msg.after
        for m in self.held:
            return m.after
        return self.after

    def waiting(self) -> tuple[Optional[int], float]:
        """The peer GID of the oldest transaction sent on and not applied yet, and how long ago the
        peer committed it (its commit time, by this node's wall clock: the two sites' clocks'
        skew is in it), or, when its time is unknown (a peer of a release before), how long ago
        this receiver sent it on (None, 0: none waits)."""
        for f in self.flights.values():
            first = lp.steps(f.msg)[0]
            if first.commit_time > 0:
                return first.peer_gid, max(0.0, self.wall() - first.commit_time / 1e6)
            return first.peer_gid, time.monotonic() - f.sent
        return None, 0.0

    def committed(self, ticket: int, decision: Optional[lp.Decision], applied: Optional[int] = None) -> None:
        """Link writeset ``ticket`` of this node committed here, as ``decision`` decided
        (position.outcome: a batch's), ``applied`` of its peer transactions applied (None: all of
        them if it applied, else none). Sends on what was held meanwhile."""
        f = self.flights.pop(ticket, None)
        if f is None:
            return
        if decision == lp.Decision.APPLY:
            self.applied += f.count if applied is None else applied
        elif decision != lp.Decision.DUPLICATE and self.failed is None:
            self.failed = (f"link {self.link.name}: peer GID {f.msg.peer_gid} after {f.msg.after} committed empty "
                           f"({decision.value if decision else 'skipped'}): resuming from the link's position")
        if not f.done.done():
            f.done.set_result(decision)
        if self.held and self.failed is None and len(self.flights) < self.window:
            self._flush()

    def _check(self) -> None:
        now = time.monotonic()
        for f in self.flights.values():
            if now - f.sent > self.outcome_timeout and self.failed is None:
                self.failed = (f"link {self.link.name}: peer GID {f.msg.peer_gid} not committed here after "
                               f"{self.outcome_timeout:.0f} s: resuming from the link's position")
            break  # the oldest decides
        if self.failed is not None:
            raise LinkError(self.failed)

    async def _wait_oldest(self) -> None:
        f = next(iter(self.flights.values()))
        left = max(0.0, self.outcome_timeout - (time.monotonic() - f.sent))
        try:
            await asyncio.wait_for(asyncio.shield(f.done), left + 0.01)
        except asyncio.TimeoutError:
            pass

    async def _drain(self) -> None:
        """Wait (at most ``drain_timeout``) for the outcomes of what is in flight; forget them."""
        if self.flights:
            waits = [asyncio.shield(f.done) for f in self.flights.values()]
            await asyncio.wait(waits, timeout=self.drain_timeout)
        self.flights.clear()


class Reinstantiation:
    """One re-instantiation of a link run by this node (docs/LINKS.md section 10): its progress,
    and the copy's link writesets waiting for their outcome here (at most ``window``)."""

    def __init__(self, link: str, node: str, window: int = 4, outcome_timeout: float = OUTCOME_TIMEOUT_S) -> None:
        self.link = link
        self.node = node
        self.window = max(1, min(window, 8))
        self.outcome_timeout = outcome_timeout
        self.state = "starting"
        self.peer: Optional[str] = None
        self.gid: Optional[int] = None
        self.tables = 0
        self.rows = 0
        self.batches = 0  # link writesets sent on
        self.applied = 0  # and committed here
        self.error: Optional[str] = None
        self.started = time.time()
        self.ticket = secrets.randbits(62)
        self.task: Optional["asyncio.Task[None]"] = None
        self.flights: OrderedDict[int, tuple[bp.LinkWriteset, "asyncio.Future[Optional[lp.Decision]]"]] = OrderedDict()

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def report(self) -> dict[str, Any]:
        return {"ok": True, "link": self.link, "node": self.node, "state": self.state, "peer": self.peer,
                "gid": self.gid, "tables": self.tables, "rows": self.rows, "batches": self.batches,
                "applied": self.applied, "error": self.error, "seconds": round(time.time() - self.started, 1)}

    def progress(self) -> ls.Copying:
        """What ``chorus link status`` shows of it (link/status.py)."""
        return ls.Copying(self.running, self.state, self.gid, self.tables, self.rows, self.batches, self.applied,
                          round(time.time() - self.started, 1), self.error)

    async def send(self, send: Callable[[bp.Message], None], msg: bp.LinkWriteset) -> None:
        """Put one of the copy's link writesets on the bus, once fewer than ``window`` wait."""
        while len(self.flights) >= self.window:
            await self._oldest()
        self.flights[msg.ticket] = (msg, asyncio.get_running_loop().create_future())
        self.batches += 1
        send(msg)

    async def drain(self) -> None:
        while self.flights:
            await self._oldest()

    async def _oldest(self) -> None:
        ticket, (msg, done) = next(iter(self.flights.items()))
        try:
            decision = await asyncio.wait_for(asyncio.shield(done), self.outcome_timeout)
        except asyncio.TimeoutError:
            raise LinkError(f"a batch of the copy was not committed here after {self.outcome_timeout:.0f} s") from None
        self.flights.pop(ticket, None)
        if decision != lp.Decision.COPY:
            raise LinkError(f"a batch of the copy committed empty ({decision.value if decision else 'failed'}): "
                            "see this site's log")
        self.applied += 1

    def committed(self, ticket: int, decision: Optional[lp.Decision]) -> bool:
        """One of the copy's link writesets committed here (False: not one of them)."""
        f = self.flights.get(ticket)
        if f is None:
            return False
        if not f[1].done():
            f[1].set_result(decision)
        return True


class SiteLinks:
    """This node's links: their senders, and the receivers it runs (docs/LINKS.md section 10).

    ``committed`` is this node's committed GID (a sender serves nothing past it); ``send`` puts
    a message on this site's bus; ``query`` reads from this node's database (rows)."""

    def __init__(self, node: str, links: tuple[LinkConfig, ...], wslog: WritesetLog, committed: Callable[[], int],
                 send: Callable[[bp.Message], None],
                 query: Callable[[str, tuple[Any, ...]], Awaitable[list[tuple[Any, ...]]]],
                 spool: Optional[Spool] = None, dsn: str = "",
                 bus_version: Callable[[], int] = lambda: bp.VERSION) -> None:
        self.node = node
        self.bus_version = bus_version  # the site's bus version: batches from version 6
        self.dsn = dsn  # the node's database: the rules' evaluator connects there without rules_dsn
        self.links = links
        self.wslog = wslog
        self.committed_gid = committed
        self.send = send
        self.query = query
        self.spool = spool
        self.servers: dict[str, LinkServer] = {}
        self.inbound: dict[str, Inbound] = {}
        self.receivers: dict[str, "asyncio.Task[None]"] = {}
        self.receiving: dict[str, LinkReceiver] = {}
        self.broken: dict[str, str] = {}  # link -> why its receiver here stopped (broken), until it receives again
        self._broken_at: dict[str, float] = {}  # link -> when (time.monotonic()) its receiver here stopped so
        self.receiver_nodes: dict[str, Optional[str]] = {}  # link -> the node running its receiver, as last seen
        self.durable: dict[str, ls.Durable] = {}  # link -> its row and conflicts here (refresh())
        self._exceptions_at: Optional[int] = -1  # the last GID of chorus.link_exceptions counted
        self._conflicts: dict[str, dict[tuple[str, str], int]] = {}
        self.copies: dict[str, Reinstantiation] = {}  # link -> its last re-instantiation run here

    async def start(self) -> None:
        """Start the senders this node serves (the coordinator made chorus.link_old_columns what
        its links' delta columns say before: NodeDatabase.settle_settings); drop the log's pins of
        links this node no longer serves."""
        served = {pin_name(link.name) for link in self.links if link.listen}
        for pin in (set(self.wslog.pins()) | set(self.wslog.broken_pins())) - served:
            log.info("writeset log: dropping the pin %s (no such link served here now)", pin)
            self.wslog.unpin(pin)
        for link in self.links:
            if not link.listen:
                continue
            end = LinkEnd(link.name, link.site, link.peer_site, _keys(link))
            rules: RuleSet = link_rules(link)
            server = LinkServer(self.wslog, end, self.committed_gid, rules, evaluator(link, rules, self.dsn),
                                provenance(link, self.links), max_retain=link.max_retain_mb << 20,
                                announce=functools.partial(self._announce, link.name), copy_dsn=self.dsn or None,
                                receives=bool(link.peers), forward=link.forward)
            await server.start(link.listen)
            self.servers[link.name] = server
            log.info("link %s: serving site %s's changes to site %s on %s", link.name, link.site, link.peer_site,
                     link.listen)

    def _announce(self, link: str, gid: int) -> None:
        self.send(bp.LinkApplied(self.node, link, gid))

    def pinned(self, node: str, link: str, gid: int) -> None:
        """Member ``node``'s sender said the peer applied this site's GIDs up to ``gid`` (a
        bp.LinkApplied, in this site's order): this node, which may serve the link's sender too,
        keeps its log from there (docs/LINKS.md section 2). Its own streams' receivers decide
        where they are open; the pin only moves forward (what the peer applied only grows)."""
        server = self.servers.get(link)
        if node == self.node or server is None or server.applied:
            return
        pin = pin_name(link)
        held = self.wslog.pins().get(pin)
        lost = self.wslog.broken(pin)
        if lost is not None and gid >= self.wslog.base_gid:
            # the link was instantiated again (docs/LINKS.md section 10): the peer has this site's
            # changes up to ``gid``, which this log can serve from; what it lost is not needed
            log.info("link %s: the peer applied up to GID %d (instantiated again): this node's pin, broken at "
                     "GIDs %d..%d, holds from there", link, gid, *lost)
            self.wslog.unpin(pin)
        elif lost is not None or (held is not None and held >= gid):
            return
        if gid < self.wslog.base_gid:  # this log never held it (it started later): it cannot serve from there
            log.info("link %s: the peer applied up to GID %d; this node's log starts after GID %d, and cannot "
                     "serve the link from there", link, gid, self.wslog.base_gid)
            return
        self.wslog.pin(pin, gid, server.max_retain)

    def membership(self, synced: Iterable[str], online: bool) -> None:
        """The primary component's synced members now (``online``: this node is one of them and
        takes writes): start the receivers this node is to run, stop the others."""
        synced = set(synced)
        for link in self.links:
            if not link.peers:
                continue
            node = receiver_node(link, synced)
            self.receiver_nodes[link.name] = node
            runs = online and node == self.node
            copy = self.copies.get(link.name)
            if copy is not None and copy.running:  # a re-instantiation holds the link here
                continue
            task = self.receivers.get(link.name)
            if runs and (task is None or task.done()) and not self._resting(link.name):
                self._start_receiver(link)
            elif not runs and task is not None and not task.done():
                log.info("link %s: this node no longer runs the receiver", link.name)
                task.cancel()

    def committed(self, msg: bp.LinkWriteset, decision: Optional[lp.Decision], applied: Optional[int] = None) -> None:
        """A link writeset committed here (any node's: only this node's receiver waits)."""
        if msg.node != self.node:
            return
        copy = self.copies.get(msg.link)
        if copy is not None and copy.committed(msg.ticket, decision):
            return
        inbound = self.inbound.get(msg.link)
        if inbound is not None:
            inbound.committed(msg.ticket, decision, applied)

    def _resting(self, name: str) -> bool:
        """Whether link ``name``'s receiver found it broken here less than BROKEN_RETRY_S ago."""
        at = self._broken_at.get(name)
        return at is not None and time.monotonic() - at < BROKEN_RETRY_S

    def _start_receiver(self, link: LinkConfig) -> None:
        inbound = self.inbound[link.name] = Inbound(
            self.node, link, self.send, self._reader(link), link.window,
            batches=lambda: self.bus_version() >= bp.BATCHED_LINKS,
            direct={k.peer_site: k.name for k in self.links if k.peers and k.name != link.name})
        end = LinkEnd(link.name, link.site, link.peer_site, _keys(link))

        async def sink(item: StreamItem) -> None:
            self.broken.pop(link.name, None)  # it streams again: no longer broken
            await inbound.sink(item)
        receiver = self.receiving[link.name] = LinkReceiver(end, link.peers, inbound.position, sink,
                                                             self.spool, applied=inbound.applied_through)
        log.info("link %s: this node runs the receiver of site %s's changes (from %s)", link.name, link.peer_site,
                 ", ".join(link.peers))
        self.receivers[link.name] = asyncio.get_running_loop().create_task(self._receive(link, receiver),
                                                                           name=f"link {link.name}")

    async def _receive(self, link: LinkConfig, receiver: LinkReceiver) -> None:
        try:
            await receiver.run()
        except LinkError as e:  # broken: every sender said the log lost what the link needs
            self.broken[link.name] = str(e)
            self._broken_at[link.name] = time.monotonic()
            log.error("link %s is broken and stops (tried again in %.0f s): %s", link.name, BROKEN_RETRY_S, e)

    async def reinstantiate(self, name: str, force: bool = False) -> dict[str, Any]:
        """Start re-instantiating link ``name`` here (docs/LINKS.md section 10), or say how far
        the one running got. Refused (``ValueError``, with why) where this node does not run the
        link's receiver, or where the link is neither broken nor new and ``force`` is not given."""
        link = next((k for k in self.links if k.name == name), None)
        if link is None or not link.peers:
            raise ValueError(f"node {self.node} has no [[link]] {name!r} that it receives (with peers)")
        running = self.copies.get(name)
        if running is not None and running.running:
            return running.report()
        if link.listen:  # this node serves the link's other way: it goes both ways (else the peer says so)
            lc.refuse_both_ways(name, link.policy, dict(link.table_policy))
        runner = self.receiver_nodes.get(name)
        if runner != self.node:
            raise ValueError(f"link {name}'s receiver runs on node {runner or '(none now)'}, not here: "
                             "re-instantiate it there")
        row = await self._reader(link)()
        if name not in self.broken and row is not None and not force:
            raise ValueError(f"link {name} is not broken (its position is peer GID {row.applied_gid}) and not new: "
                             "a copy would realign every table it carries; give --force to do it anyway")
        copy = self.copies[name] = Reinstantiation(name, self.node, link.window)
        task = self.receivers.pop(name, None)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        copy.task = asyncio.get_running_loop().create_task(self._reinstantiate(link, copy),
                                                           name=f"link {name} re-instantiation")
        return copy.report()

    async def _reinstantiate(self, link: LinkConfig, copy: "Reinstantiation") -> None:
        """Copy the peer's rows of the link through this site's order, then move the position
        (link/copy.py); the receiver starts again at the next membership tick."""
        end = LinkEnd(link.name, link.site, link.peer_site, _keys(link))
        reader = self._reader(link)

        async def position() -> Position:
            row = await reader()
            return Position(row.applied_gid if row else 0, row.peer_clock if row else 0)

        async def nothing(item: StreamItem) -> None:
            raise LinkError("a copy takes no stream")

        receiver = LinkReceiver(end, link.peers, position, nothing, self.spool)
        settings = link_settings(link).fingerprint
        ranges: Optional[lc.Ranges] = None
        hint = 0

        def message(b: lc.Batch) -> bp.LinkWriteset:
            copy.ticket += 1
            return bp.LinkWriteset(self.node, copy.ticket, link.name, link.peer_site, b.gid - 1, b.gid, b.gid + 1,
                                   hint, 0, int(time.time() * 1e6), wire.encode(lc.encode(b, link.name)), settings)

        async def snapshot(s: lproto.Snapshot) -> None:
            nonlocal ranges, hint
            if s.gid < 1:
                raise LinkError(f"site {link.peer_site} has committed nothing yet: nothing to copy")
            if s.receives:  # the peer receives the link too: it goes both ways (whichever nodes serve it here)
                lc.refuse_both_ways(link.name, link.policy, dict(link.table_policy))
            ranges = lc.Ranges(s.gid, s.receives)
            hint = s.applied + 1 if s.receives and s.applied else 0
            copy.gid, copy.state = s.gid, "copying"
            log.info("link %s: re-instantiation: site %s copies its rows as of its GID %d", link.name,
                     link.peer_site, s.gid)

        async def sink(ws: wire.Writeset) -> None:
            assert ranges is not None
            b = ranges.take(ws)
            if b.upper is None:
                copy.tables += 1
            copy.rows = ranges.rows
            await copy.send(self.send, message(b))

        try:
            errors = []
            for address in link.peers:
                copy.state, copy.peer = "connecting", address
                try:
                    done = await receiver.copy(address, snapshot, sink)
                    break
                except lc.BothWays:
                    raise
                except lc.CopyError as e:
                    raise LinkError(str(e)) from e
                except LinkError as e:
                    if copy.gid is not None:
                        raise  # it had started: the copy is run again whole
                    errors.append(f"{address}: {e}")
            else:
                raise LinkError(f"site {link.peer_site} is unreachable: {'; '.join(errors)}")
            assert ranges is not None
            if done.rows != ranges.rows:
                raise LinkError(f"the peer sent {ranges.rows} rows and says it sent {done.rows}")
            await copy.send(self.send, message(lc.Batch(done.gid, None, (), None, None, True, ranges.both)))
            copy.state = "finishing"
            await copy.drain()
            copy.state = "done"
            self.broken.pop(link.name, None)
            self._broken_at.pop(link.name, None)
            log.info("link %s: re-instantiated at site %s's GID %d (%d rows, %d tables): it streams from there",
                     link.name, link.peer_site, done.gid, copy.rows, copy.tables)
        except asyncio.CancelledError:
            copy.state, copy.error = "failed", "stopped"
            raise
        except lc.BothWays as e:
            copy.state, copy.error = "refused", str(e)
            log.error("link %s: re-instantiation refused: %s", link.name, e)
        except (LinkError, OSError) as e:
            copy.state, copy.error = "failed", f"{e} (nothing is lost: run it again)"
            log.error("link %s: re-instantiation failed: %s", link.name, copy.error)
        except Exception as e:  # a psycopg error reading the position, anything else: said, not raised
            copy.state, copy.error = "failed", f"{type(e).__name__}: {e} (nothing is lost: run it again)"
            log.exception("link %s: re-instantiation failed", link.name)

    def _reader(self, link: LinkConfig) -> Callable[[], Awaitable[Optional[lp.PositionRow]]]:
        async def read() -> Optional[lp.PositionRow]:
            rows = await self.query(lp.READ_SQL, (link.name,))
            return lp.PositionRow.of(rows[0]) if rows else None
        return read

    async def refresh(self) -> None:
        """Read what this node's database holds of the links it receives (for status): their rows
        of ``chorus.link_position``, and their conflicts by table and decision, counted again
        only when ``chorus.link_exceptions`` has rows of a GID not counted yet (its rows are only
        ever added, each link writeset's at a new GID). Raises psycopg.Error."""
        if not any(link.peers for link in self.links):
            return
        rows = await self.query(POSITIONS_SQL, ())
        last = (await self.query(EXCEPTIONS_AT_SQL, ()))[0][0]
        if last != self._exceptions_at:
            counted: dict[str, dict[tuple[str, str], int]] = {}
            for link, table, decision, n in await self.query(CONFLICTS_SQL, ()):
                counted.setdefault(str(link), {})[(str(table), str(decision))] = int(n)
            self._conflicts, self._exceptions_at = counted, last
        positions = {str(r[0]): r for r in rows}
        out = {}
        for link in self.links:
            r = positions.get(link.name)
            out[link.name] = ls.Durable(
                int(r[1]), int(r[2]), int(r[3]), float(r[4]), dict(self._conflicts.get(link.name, {}))
            ) if r is not None else ls.Durable(conflicts=dict(self._conflicts.get(link.name, {})))
        self.durable = out

    def status(self) -> list[dict[str, Any]]:
        """This node's rows of ``chorus link status`` (link/status.py): for each link, ``in`` if
        this site receives it, ``out`` if this node serves its sender."""
        own = self.committed_gid()
        out: list[dict[str, Any]] = []
        for link in self.links:
            if link.peers:
                task = self.receivers.get(link.name)
                inbound = self.inbound.get(link.name)
                receiver = self.receiving.get(link.name)
                here = None
                if inbound is not None and receiver is not None:
                    oldest, waited = inbound.waiting()
                    here = ls.Receiving(task is not None and not task.done(), self.broken.get(link.name),
                                        receiver.connected, inbound.peer_clock, inbound.max_replicated, oldest,
                                        waited, inbound.sent, inbound.applied)
                copy = self.copies.get(link.name)
                out.append(ls.in_row(link.name, link.site, link.peer_site, own, self.receiver_nodes.get(link.name),
                                     self.node, here, self.durable.get(link.name, ls.Durable()),
                                     copy.progress() if copy is not None else None))
            server = self.servers.get(link.name)
            if server is not None:
                streams, broken, sent, filtered, returned = server.sending()
                out.append(ls.out_row(link.name, link.site, link.peer_site, own, self.node,
                                      ls.Sending(streams, broken, sent, filtered, returned, *server.ddl_skipped())))
        return out

    async def close(self) -> None:
        tasks = [t for t in self.receivers.values() if not t.done()]
        tasks += [c.task for c in self.copies.values() if c.task is not None and not c.task.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in self.servers.values():
            await s.close()
            close = getattr(s.evaluator, "close", None)
            if close is not None:
                await asyncio.to_thread(close)


def _keys(link: LinkConfig) -> LinkKeys:
    return LinkKeys(link.tls_cert, link.tls_key, link.peer_cert, link.secret_file)
