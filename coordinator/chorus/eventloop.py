"""Which asyncio event loop the coordinator runs on: uvloop (libuv, in C) when it is installed,
else the standard one. ``CHORUS_LOOP=uvloop|asyncio`` forces one; ``chorus status`` says which
runs. Both run the same code: the coordinator uses only the asyncio API (readers on file
descriptors, Unix and TCP servers, tasks)."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")

CHOICES = ("uvloop", "asyncio")


class LoopChoiceError(Exception):
    pass


def choose() -> str:
    """The loop to run: the environment's choice, or the best one installed."""
    want = os.environ.get("CHORUS_LOOP", "").strip().lower()
    if want and want not in CHOICES:
        raise LoopChoiceError(f"CHORUS_LOOP={want!r}: expected one of {', '.join(CHOICES)}")
    if want == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError as e:
        if want == "uvloop":
            raise LoopChoiceError("CHORUS_LOOP=uvloop, but uvloop is not installed") from e
        return "asyncio"
    return "uvloop"


def factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "uvloop":
        import uvloop
        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Callable[[], Coroutine[Any, Any, T]], name: str) -> T:
    """Run ``main()`` to completion on a new loop of kind ``name``."""
    with asyncio.Runner(loop_factory=factory(name)) as runner:
        return runner.run(main())
