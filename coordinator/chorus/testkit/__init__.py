"""Tooling for testing Chorus and for running labs: never imported by the daemon (tests/unit/test_layering.py).

``localcluster`` starts and stops a cluster of local nodes (``chorus local``); ``lab/`` a cluster of
network namespaces with faults injected (``chorus lab``); ``workload`` and ``appendload`` run
histories that ``check`` and ``elle`` verify; ``fidelity`` compares whole nodes; ``procmem``
samples a process tree's memory.
"""
