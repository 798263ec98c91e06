"""A randomized nemesis for the lab (issue 23; docs/LAB.md): for a bounded time, at random
moments, one fault after another on random hosts, each undone after a random while: partitions
(random halves, one host cut off, every host alone), kill -9 of a host's PostgreSQL, of its
coordinator, of its Corosync, or of the whole host, a crash of every host at once, freezing a host, delay and
loss on every link. Then everything is healed and restarted. The schedule comes from a seed: a
run that found something can be run again.

It only breaks things and says what it did; the workloads and the checks are the caller's
(tests/cluster/test_nemesis.py, ``chorus lab nemesis``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Optional

from chorus.testkit.lab.rig import Lab

FAULTS = ("partition-halves", "isolate-one", "all-alone", "kill-postgres", "kill-coordinator", "kill-corosync",
          "kill-host", "crash-all", "freeze", "netem")
WEIGHTS = (3, 3, 1, 2, 2, 1, 2, 1, 2, 2)


@dataclass(frozen=True)
class Event:
    at: float  # seconds since the nemesis started
    what: str  # the fault, "undo <fault>", or "heal all"
    target: str

    def as_dict(self) -> dict[str, object]:
        return {"at": round(self.at, 2), "what": self.what, "target": self.target}


class Nemesis:
    def __init__(self, lab: Lab, names: list[str], seed: int, say: Optional[Callable[[str], None]] = None,
                 hold: tuple[float, float] = (2.0, 6.0), rest: tuple[float, float] = (1.0, 4.0)) -> None:
        self.lab = lab
        self.names = names
        self.rnd = random.Random(seed)
        self.say = say or (lambda line: None)
        self.hold = hold  # how long a fault lasts
        self.rest = rest  # how long between faults
        self.events: list[Event] = []
        self._t0 = 0.0

    def run(self, seconds: float) -> list[Event]:
        """Faults for ``seconds``, then everything healed and restarted (not waited for)."""
        self._t0 = time.monotonic()
        try:
            while time.monotonic() - self._t0 < seconds:
                fault = self.rnd.choices(FAULTS, WEIGHTS)[0]
                undo = self._apply(fault)
                time.sleep(self.rnd.uniform(*self.hold))
                undo()
                time.sleep(self.rnd.uniform(*self.rest))
        finally:
            self.heal_all()
        return self.events

    def heal_all(self) -> None:
        self._note("heal all", "*")
        self.lab.heal_all()

    # ---- the faults ----------------------------------------------------------------------

    def _note(self, what: str, target: str) -> None:
        e = Event(time.monotonic() - self._t0, what, target)
        self.events.append(e)
        self.say(f"{e.at:7.1f} s  {what} {target}")

    def _apply(self, fault: str) -> Callable[[], None]:
        """Start ``fault``; what undoes it."""
        n = len(self.names)
        host = self.rnd.choice(self.names)
        if fault in ("partition-halves", "isolate-one", "all-alone"):
            order = list(range(1, n + 1))
            self.rnd.shuffle(order)
            if fault == "partition-halves":
                cut = self.rnd.randint(1, n - 1)
                groups = [sorted(order[:cut]), sorted(order[cut:])]
            elif fault == "isolate-one":
                groups = [[order[0]], sorted(order[1:])]
            else:
                groups = [[i] for i in order]
            self._note(fault, "|".join(",".join(f"n{i}" for i in g) for g in groups))
            self.lab.partition(groups)
            return lambda: self._undo(fault, "", self.lab.heal)
        if fault in ("kill-postgres", "kill-coordinator"):
            what = fault.split("-")[1]
            self._note(fault, host)
            self.lab.kill(host, what)
            return lambda: self._undo(fault, host, lambda: self.lab.restart_host(host, wait=False))
        if fault in ("kill-corosync", "kill-host"):
            self._note(fault, host)
            (self.lab.kill_bus if fault == "kill-corosync" else self.lab.kill_host)(host)
            return lambda: self._undo(fault, host, lambda: self.lab.restart_host(host, wait=False))
        if fault == "crash-all":
            self._note(fault, "*")
            for h in self.names:
                self.lab.kill_host(h)

            def restart() -> None:
                for h in self.names:
                    self.lab.restart_host(h, wait=False)
            return lambda: self._undo(fault, "*", restart)
        if fault == "freeze":
            self._note(fault, host)
            self.lab.freeze(host)
            return lambda: self._undo(fault, host, lambda: self.lab.thaw(host))
        spec = f"delay {self.rnd.choice([5, 20, 50])}ms {self.rnd.choice([1, 5])}ms loss {self.rnd.choice([1, 5])}%"
        self._note("netem", spec)
        self.lab.netem(spec)
        return lambda: self._undo(fault, "", lambda: self.lab.netem(""))

    def _undo(self, fault: str, target: str, action: Callable[[], object]) -> None:
        self._note(f"undo {fault}", target)
        action()
