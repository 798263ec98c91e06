"""A stand-in for ``time.sleep`` in the client helpers' retry tests: it records the waits."""

from __future__ import annotations


class Clock:
    """Stands in for time.sleep: records the waits."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
