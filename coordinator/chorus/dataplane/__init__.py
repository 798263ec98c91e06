"""The data plane: the per-transaction path, one core in C and its Python reference (issue 37,
docs/NATIVE.md).

What exists so far:

- the first piece of step 1: the C certification index and apply scheduler (``native/cert.c``,
  ``native/sched.c``), bound with cffi (``build.py``, ``native.py``) and held to
  ``certifier.PyCertifier`` and ``commit/scheduler.PyScheduler`` by differential tests;
- the differential test's foundation (step 0, NATIVE.md 4.6): the core's events and actions
  (``events.py``), the trace format (``trace.py``), today's core behind that boundary as the
  simulation wires it (``refcore.py``; tests/sim records its traces) and the replayer
  (``replay.py``).

Nothing on the daemon's path imports this package yet.
"""
