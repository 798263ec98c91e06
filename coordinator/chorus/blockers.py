"""Local loses to remote (docs/ARCHITECTURE.md invariant 6): which local sessions to abort, and how, when they
hold a lock that a certified writeset waits for.

The policy is here, without I/O: the coordinator's blocker loop asks PostgreSQL what blocks the
sessions of certified writesets (``pg_blocking_pids``), hands the rows to
:meth:`BlockerWatch.decide` with the time, and carries out the answer with
``chorus.abort_local``.

A local transaction that is not certified and holds a lock a certified writeset needs comes later
in the total order and would lose anyway: a statement waiting for a lock is cancelled at once
(40001); one still running after the grace period too; a session idle in transaction is flagged
(40001 at its next statement or COMMIT) and closed if still idle after the grace (PostgreSQL
cannot abort an idle transaction and keep the connection). Appliers are never touched. A
certified local transaction is touched only when it comes later in the order than the writeset
waiting for it: it waits for that one's commit turn while that one waits for its lock (a lock
taken without writing the row, e.g. SELECT FOR UPDATE); its session is ended after the grace,
and its writeset is committed from the coordinator (invariant 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional


@dataclass(frozen=True)
class Blocking:
    """Session ``pid`` (in ``state``, its transaction started at ``xact_start``) blocks session
    ``waiter``."""

    waiter: int
    pid: int
    state: Optional[str]
    xact_start: Any


@dataclass(frozen=True)
class Abort:
    """Call ``chorus.abort_local(pid, gid, how)``: ``how`` is flag, cancel, interrupt, close or
    terminate. ``counts``: a local transaction aborted for an applier, counted once it is done.
    ``note``: what to log (``warning`` says at which level), empty for nothing."""

    pid: int
    gid: int
    how: str
    counts: bool = False
    note: str = ""
    warning: bool = False


@dataclass
class BlockerWatch:
    """What the blocker loop remembers between its rounds: when each blocking transaction was first
    seen in the way of each GID, and which certified sessions it has ended."""

    grace: float  # seconds
    first_seen: dict[tuple[int, int, Any], float] = field(default_factory=dict)  # (gid, pid, xact_start)
    ended: set[tuple[int, int]] = field(default_factory=set)  # (gid, pid)

    def forget(self, live: Iterable[int]) -> None:
        """Drop what concerns GIDs no longer waiting."""
        gids = set(live)
        for k in [k for k in self.first_seen if k[0] not in gids]:
            del self.first_seen[k]
        self.ended = {e for e in self.ended if e[0] in gids}

    def decide(self, rows: Iterable[Blocking], waiting: Mapping[int, int], appliers: set[int],
               certified: Mapping[int, int], now: float) -> list[Abort]:
        """The aborts for one round. ``waiting``: waiting session pid -> its GID; ``appliers``: the
        apply sessions' pids; ``certified``: local backend pid -> the GID it holds."""
        out: list[Abort] = []
        for b in rows:
            gid = waiting[b.waiter]
            if b.pid in appliers:
                continue
            key = (gid, b.pid, b.xact_start)
            first = key not in self.first_seen
            since = self.first_seen.setdefault(key, now)
            late = now - since >= self.grace
            if b.pid in certified:
                later = certified[b.pid]
                if later > gid and late and (gid, b.pid) not in self.ended:
                    self.ended.add((gid, b.pid))
                    out.append(Abort(b.pid, gid, "terminate", note=(
                        f"GID {gid} waits for a lock of local backend {b.pid} whose certified GID {later} comes "
                        f"later: ending that session, GID {later} is committed from its writeset"), warning=True))
                continue
            idle = b.state is not None and b.state.startswith("idle")
            if not (first or not idle or late):
                continue  # idle and flagged already: closed once the grace is over
            how = ("close" if late else "flag") if idle else ("interrupt" if late else "cancel")
            note = ""
            if first or how == "close":
                note = (f"GID {gid} waits for local backend {b.pid} ({b.state}, not certified): "
                        + ("closing the session" if how == "close" else "aborting its transaction"))
            out.append(Abort(b.pid, gid, how, counts=first, note=note))
        return out
