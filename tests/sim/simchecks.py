"""The invariants the simulation holds the cluster to, after every step (docs/ARCHITECTURE.md invariants 1, 3, 5, 8, 9;
docs/RECOVERY.md, "Invariants").

- **One order, identical committed prefixes.** A GID committed anywhere has one chain value
  (its history up to it) on every node that holds it; a GID may name another writeset later only
  once no database holds it any more (it was never acknowledged: its origin lost it too).
- **No acknowledged transaction lost.** Whenever a database loses commits (a crash, a total
  recovery), every acknowledged GID is still held, as acknowledged, by some database.
- **The watermark only over a contiguous prefix.** A node's commit book never counts a GID
  committed that its database has not (and the database commits only at its turn: simworld).
- **Quorum from the configured nodes.** Once `chorus node add`/`remove` changed them, a node
  online in the primary component has a strict majority of the configured nodes it holds in its
  view (the removed node not counted, the added one counted before it joins).
- **Safe advice.** A node told that it needs total recovery holds nothing that a synced member
  does not hold or will not commit.
- After the faults stop (simrun.py): every node online within a bounded time, every database
  identical, every acknowledged transaction everywhere, every failed one nowhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chorus.actions import Phase, PhaseChange
from chorus.bus import bus_node

if TYPE_CHECKING:
    from simworld import Coord, Host, Sim, Txn

from simworld import Violation


class Checker:
    def __init__(self, sim: "Sim") -> None:
        self.sim = sim
        self.canon: dict[int, tuple[int, set[str]]] = {}  # GID -> (chain value, the hosts holding it)
        self.acked: dict[int, int] = {}  # GID -> the acknowledged writeset's identity
        self.advice: list[str] = []  # every "total recovery" advice given, for the report

    def committed(self, host: "Host", gids: list[int]) -> None:
        for g in gids:
            self._no_lost_update(host, g)
            c = host.db.chain[g]
            have = self.canon.get(g)
            if have is None:
                self.canon[g] = (c, {host.name})
            elif have[0] != c:
                holders = ", ".join(sorted(have[1]))
                raise Violation(f"two histories: GID {g} committed on {host.name} as {host.db.ident[g]} "
                                f"differs from what {holders} hold")
            else:
                have[1].add(host.name)

    def _no_lost_update(self, host: "Host", g: int) -> None:
        """GID ``g`` changed each of its rows as the GID before it in the order left it (snapshot
        isolation's first-committer-wins): its origin's client read the row at that version. A
        change written over a version it never saw loses that version's change (the lab's seed
        20: a transfer's debit lost)."""
        db = host.db
        read = self.sim.reads.get(db.ident[g], {})
        for k, before in db.before.get(g, {}).items():
            if k in read and read[k] < before:
                raise Violation(f"lost update: GID {g} ({db.ident[g]}) on {host.name} changed row {k} as GID "
                                f"{read[k]} left it, over GID {before}'s change it never saw")

    def lost(self, host: "Host", gids: list[int]) -> None:
        """``host``'s database no longer holds ``gids``."""
        for g in gids:
            have = self.canon.get(g)
            if have is not None:
                have[1].discard(host.name)
                if not have[1]:
                    del self.canon[g]
        self._acked_held([g for g in gids if g in self.acked])

    def replaced(self, host: "Host", old: list[int]) -> None:
        """Total recovery replaced ``host``'s database (which held ``old``)."""
        self.lost(host, [g for g in old if g])
        self.committed(host, host.db.order[1:])

    def _acked_held(self, gids: list[int]) -> None:
        for g in gids:
            ident = self.acked[g]
            have = self.canon.get(g)
            if have is None or not any(self.sim.hosts[h].db.ident.get(g) == ident for h in have[1]):
                raise Violation(f"acknowledged transaction {ident} (GID {g}) is lost: no database holds it")

    def ack(self, txn: "Txn") -> None:
        self.acked[txn.gid] = txn.xid

    def tick(self, c: "Coord") -> None:
        db = c.host.db
        if c.db_ok and db.up and c.book.watermark > db.last:
            raise Violation(f"{c.name}: the commit book counts GID {c.book.watermark} committed, the database "
                            f"only {db.last}")
        r = c.r
        if r.phase == Phase.ONLINE and r.config is not None:
            here = {f"n{bus_node(m)}" for m in r.members} & set(r.config.nodes)
            if 2 * len(here) <= len(r.config.nodes):
                raise Violation(f"{c.name} is online with {sorted(here)} of its configured nodes "
                                f"{list(r.config.nodes)} (version {r.config.version}) in its view: no majority")

    def phase_changed(self, host: "Host", a: PhaseChange) -> None:
        if a.phase != Phase.NEEDS_RECOVERY or "total recovery" not in a.reason:
            return
        self.advice.append(f"{host.name} at GID {host.db.last}: {a.reason}")
        synced = [c for c in self.sim.coords() if c.r.phase == Phase.ONLINE and c.host is not host]
        best = max((max(c.host.db.last, c.r.released) for c in synced), default=-1)
        if host.db.last > best:
            raise Violation(f"{host.name} is told to rebuild by total recovery while it holds GIDs up to "
                            f"{host.db.last}, past every synced member (at most {best}): {a.reason}")
