"""The data plane: the per-transaction path, one core in C and its Python reference (issue 37,
docs/NATIVE.md).

What exists so far is the first piece of step 1: the C certification index and apply scheduler
(``native/cert.c``, ``native/sched.c``), bound with cffi (``build.py``, ``native.py``) and held to
``certifier.PyCertifier`` and ``commit/scheduler.PyScheduler`` by differential tests. Nothing on
the coordinator's path imports this package yet.
"""
