"""Loading a dump into a cluster (docs/MIGRATION.md), two ways.

- **Replicated** (:func:`replicated`): ``pg_restore`` through one node while every node is online.
  Every row is captured, certified, logged and applied on every other node: the restore is an
  application like any other, and the cluster takes writes throughout. It costs what a
  replicated bulk load costs (bench/bulk_load.py, bench/restore_load.py).
- **Through one node, then total recovery** (:func:`through_one_node`, ``chorus load --fast``),
  as Galera users load one node and let SST copy it: the other nodes leave; the dump is
  restored into the one node with capture and schema replication off (nothing goes through the
  bus or the writeset log); then each other node is rebuilt from it by total recovery, which
  copies tables at COPY speed (docs/RECOVERY.md). The cluster takes no writes until every node is
  back: the loaded node alone is not a primary component, and the cluster re-forms at the loaded
  node's GID once every configured node is there (docs/RECOVERY.md, bootstrap safety).

Roles are global to a PostgreSQL instance: a dump of one database does not carry them. Create
them first, through any node while all are online (``pg_dumpall --roles-only`` of the source,
then ``psql`` through a node), so that every node has them with the same attributes.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional

from chorus.testkit.localcluster import PGBIN

Say = Callable[[str], None]

# the loaded node's sessions: nothing captured, no schema change ordered (the others are rebuilt)
LOCAL_ONLY = "-c chorus.capture=off -c chorus.replicate_ddl=off -c chorus.replicate_roles=off"


class LoadError(Exception):
    pass


def pg_restore(dsn: str, dump: str, jobs: int, options: str = "", extra: Optional[list[str]] = None) -> float:
    """Run ``pg_restore -j jobs`` of ``dump`` into ``dsn`` (stopping at the first error); its
    seconds. ``options``: PGOPTIONS for every session it opens."""
    args = [str(PGBIN / "pg_restore"), "--exit-on-error", f"--jobs={jobs}", "-d", dsn, *(extra or []), dump]
    env = dict(os.environ)
    if options:
        env["PGOPTIONS"] = (env.get("PGOPTIONS", "") + " " + options).strip()
    t0 = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise LoadError(f"pg_restore failed: {r.stderr.strip()[-2000:]}")
    return time.monotonic() - t0


def replicated(dsn: str, dump: str, jobs: int = 4, extra: Optional[list[str]] = None) -> dict[str, Any]:
    """Restore through the node at ``dsn``, replicated as any application's writes."""
    return {"mode": "replicated", "restore_s": round(pg_restore(dsn, dump, jobs, extra=extra), 2)}


def through_one_node(directory: str, dump: str, node: str, say: Say, rebuild: Callable[[str, str], None],
                     wait_online: Callable[[str], dict[str, Any]], jobs: int = 4,
                     extra: Optional[list[str]] = None) -> dict[str, Any]:
    """The fast way on a local cluster: the others leave, ``dump`` is restored into ``node``
    alone, each other node is rebuilt from it by total recovery and rejoins. The CLI's
    operations do the rebuilding (``rebuild(node, donor)``: ``chorus node join --total``) and
    the waiting (``wait_online(admin_socket)``: a node's status once online or out of time).
    Returns the seconds of each step."""
    from chorus.testkit.localcluster import LocalCluster

    c = LocalCluster(directory, log=say)
    meta = c.load()
    target = c._node(meta, node)
    others = [n.name for n in meta.nodes if n.name != node]
    out: dict[str, Any] = {"mode": "through one node", "node": node, "rebuilt": others}
    t0 = time.monotonic()
    for name in others:
        say(f"{name}: leaves the cluster while {node} loads")
        c.stop(name)
    out["leave_s"] = round(time.monotonic() - t0, 2)
    say(f"{node}: pg_restore --jobs={jobs} {Path(dump).name}, capture and schema replication off")
    out["restore_s"] = round(pg_restore(c.config(meta, target).dsn, dump, jobs, LOCAL_ONLY, extra), 2)
    out["total_recovery_s"] = {}
    for name in others:
        t1 = time.monotonic()
        say(f"{name}: rebuilt from {node} by total recovery")
        # it starts, and waits: no member is online until every configured node is back, at
        # the same GID, and the cluster re-forms (docs/RECOVERY.md, bootstrap safety)
        rebuild(name, node)
        out["total_recovery_s"][name] = round(time.monotonic() - t1, 2)
    t1 = time.monotonic()
    for n in meta.nodes:
        st = wait_online(c.config(meta, n).admin_socket)
        if st.get("state") != "online":
            raise LoadError(f"{n.name} did not come back online: {st.get('state')}")
    out["reform_s"] = round(time.monotonic() - t1, 2)
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out
