"""The memory processes hold, from /proc: for the benchmarks and the tests that bound it.

``RssAnon`` is what a process itself holds (its heap); the pages of files it maps (the writeset
log, spool files) are not counted: the kernel can drop them.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable


def anon_kb(pid: int) -> int:
    """The anonymous memory process ``pid`` holds now, in kB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
    except (OSError, StopIteration):
        return 0


def children(ppid: int) -> list[int]:
    """The processes whose parent is ``ppid`` (a postmaster's backends)."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == ppid:
                        out.append(int(p))
            except OSError:
                pass
    return out


class PeakMemory:
    """While it is open, samples every few milliseconds the anonymous memory of groups of
    processes (each group found again every half second: backends come and go); ``peak_kb`` is
    the most any one process of a group held, ``growth_kb`` how far that rose above where the
    process stood when first seen."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]], every: float = 0.002) -> None:
        self.groups = groups
        self.every = every
        self.peak_kb = dict.fromkeys(groups, 0)
        self.growth_kb = dict.fromkeys(groups, 0)
        self._start: dict[int, int] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        pids: dict[str, list[int]] = {}
        found = 0.0
        while not self._done.is_set():
            if time.monotonic() - found > 0.5:
                pids = {name: find() for name, find in self.groups.items()}
                found = time.monotonic()
            for name, group in pids.items():
                for pid in group:
                    kb = anon_kb(pid)
                    start = self._start.setdefault(pid, kb)
                    self.peak_kb[name] = max(self.peak_kb[name], kb)
                    self.growth_kb[name] = max(self.growth_kb[name], kb - start)
            time.sleep(self.every)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        time.sleep(self.every * 3)  # a first look at every process before the work starts
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def mb(self, which: str = "peak") -> dict[str, float]:
        kb = self.peak_kb if which == "peak" else self.growth_kb
        return {name: round(v / 1024, 1) for name, v in kb.items()}
