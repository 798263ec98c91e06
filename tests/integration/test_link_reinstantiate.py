"""Re-instantiation of a broken link (docs/LINKS.md sections 2.1 and 10, issue 38): site "east"
(one node, a log ring of two 1 MiB segments, ``max_retain_mb = 3``) streams to site "west" (two
nodes) through a relay the test cuts; while it is cut east writes more than it may keep, deletes
a row and changes another, and west changes a row and inserts one of its own, so the link
breaks (test_link_pin.py's setup). ``chorus link reinstantiate`` on west's receiving node copies
east's rows as of one GID: both of west's nodes end with exactly east's rows, the rows west had
changed that east never saw are recorded as conflicts, the link streams again from that GID and
new writes flow. Refused: while the link streams (without --force), and when the peer is
unreachable.

Every wait is bounded; the clusters stop exactly the processes they started (by pid)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from linksites import TABLE, Site, pinned_sites, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 600
ROW = "x" * 20_000  # each transaction: a row of about 20 KB in the log


def _sites(east_port: int, west_port: int) -> Any:
    return pinned_sites(east_port, west_port, max_retain_mb=3, west_nodes=2, prefix="chorus-reinst-",
                        tables=(TABLE, "CREATE TABLE app.other (a text, b int, v text, PRIMARY KEY (a, b))"))


def _write(site: Site, first: int, count: int, v: str = ROW) -> None:
    with site.connect() as c:
        for i in range(first, first + count):
            c.execute("INSERT INTO app.items VALUES (%s, %s, 0)", (i, v))


def _reinstantiate(west: Site, *extra: str) -> subprocess.CompletedProcess[str]:
    node = west.info[0]["name"]  # west's receiver runs on its lowest-named node
    return subprocess.run([sys.executable, "-m", "chorus", "link", "reinstantiate", "east-west", "--dir",
                           west.cluster.dir.as_posix(), "--node", node, *extra],
                          capture_output=True, text=True, timeout=600)


def _in_state(west: Site) -> Any:
    p = subprocess.run([sys.executable, "-m", "chorus", "link", "status", "--dir", west.cluster.dir.as_posix(),
                        west.info[0]["name"], "--json"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    (row,) = [r for r in json.loads(p.stdout)["links"] if r["direction"] == "in"]
    return row["state"]


OTHER = "SELECT a, b, v FROM app.other ORDER BY a COLLATE \"C\", b"


def test_a_broken_link_instantiated_again_streams_with_the_peers_rows() -> None:
    with _sites(BASE, BASE + 3) as (east, west, relay):
        _write(east, 1, 10, "a")
        with east.connect() as c:
            for i in range(700):  # a table of several batches, keyed by two columns
                c.execute("INSERT INTO app.other VALUES (%s, %s, 'e')", (f"k{i % 7}", i))
        wait("east's first rows on west", lambda: west.rows(0) == east.rows(0) and west.rows(1) == east.rows(0))
        wait("west's position at east's committed GID", lambda: west.position(0)[0][2] == east.committed())
        refused = _reinstantiate(west)
        assert refused.returncode != 0 and "is not broken" in refused.stderr and "--force" in refused.stderr
        relay.cut()
        _write(east, 11, 200)  # about 4 MiB: past the 3 MiB the link may keep
        east.sql("DELETE FROM app.items WHERE id = 3")
        east.sql("UPDATE app.items SET v = 'east' WHERE id = 4")
        east.sql("DELETE FROM app.other WHERE a = 'k1'")
        west.sql("UPDATE app.items SET v = 'west' WHERE id = 5")
        west.sql("INSERT INTO app.items VALUES (9999, 'west only', 0)", i=1)
        west.sql("INSERT INTO app.other VALUES ('zz', 1, 'west only')")
        relay.restore()
        wait("west's link broken", lambda: _in_state(west) == "broken", timeout=180)
        before = west.position(0)[0][2]

        done = _reinstantiate(west)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "copying" in done.stdout or "done" in done.stdout
        assert "streams again" in done.stdout, done.stdout

        wanted = east.rows(0)
        assert [r[0] for r in wanted][:5] == [1, 2, 4, 5, 6]
        for i in west.nodes():  # every node of west alike, and equal to east
            wait(f"west node {i} holds east's rows", lambda: west.rows(i) == wanted)
            assert west.rows(i, OTHER) == east.rows(0, OTHER)
        position = west.position(0)[0]
        assert position[2] > before and position == west.position(1)[0]
        # west's own changes east never saw are recorded, alike on both nodes, not silently lost
        ex = west.rows(0, "SELECT row_key, decision, policy, local_row->>'v', result_row->>'v' "
                          "FROM chorus.link_exceptions WHERE detection = 'copy' ORDER BY row_key")
        assert ex == west.rows(1, "SELECT row_key, decision, policy, local_row->>'v', result_row->>'v' "
                                  "FROM chorus.link_exceptions WHERE detection = 'copy' ORDER BY row_key")
        assert ex == [('"app"."items" (id)=(5)', "took-remote", "reinstantiate", "west", "a"),
                      ('"app"."items" (id)=(9999)', "took-remote", "reinstantiate", "west only", None),
                      ('"app"."other" (a, b)=(zz, 1)', "took-remote", "reinstantiate", "west only", None)], ex

        # the link streams again from the copy's GID: new writes of east arrive once
        wait("west's link streaming", lambda: _in_state(west) == "streaming", timeout=120)
        _write(east, 300, 5, "new")
        east.sql("UPDATE app.items SET v = 'newer' WHERE id = 6")
        for i in west.nodes():
            wait(f"east's new rows on west node {i}", lambda: west.rows(i) == east.rows(0))
        wait("west's position at east's committed GID", lambda: west.position(0)[0][2] == east.committed())

        # the peer unreachable: refused with the reason, and nothing changes
        relay.cut()
        gone = _reinstantiate(west, "--force")
        assert gone.returncode != 0 and "unreachable" in gone.stderr, gone.stdout + gone.stderr
        assert west.rows(0) == east.rows(0)
        relay.restore()
