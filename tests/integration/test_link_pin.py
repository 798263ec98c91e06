"""The pin of the sending site's writeset log (docs/LINKS.md section 2, issue 38): site "east"
(one node, a log ring of two 1 MiB segments) streams to site "west" (one node) through a relay
the test cuts; while it is cut, east writes more than its ring holds. Within ``max_retain_mb``
the ring grows rather than reuse what west has not applied, and the link resumes losing nothing;
past it the link is broken: east's ``chorus link status``, its view and its metrics say so with
the GIDs lost, and west gets nothing more (nothing skipped silently).

Every wait is bounded; the clusters stop exactly the processes they started (by pid)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from typing import Any

import pytest

from linksites import Site, pinned_sites, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 400
ROW = "x" * 20_000  # each transaction: a row of about 20 KB in the log


def _sites(east_port: int, west_port: int, max_retain_mb: int) -> Any:
    return pinned_sites(east_port, west_port, max_retain_mb)


def _write(site: Site, first: int, count: int) -> None:
    with site.connect() as c:
        for i in range(first, first + count):
            c.execute("INSERT INTO app.items VALUES (%s, %s, 0)", (i, ROW))


def _ids(site: Site) -> list[int]:
    return [r[0] for r in site.rows(0, "SELECT id FROM app.items ORDER BY id")]


def _pinned(east: Site, west: Site) -> bool:
    """East's log is pinned at what west applied (west's receiver said so: APPLIED frames)."""
    path = east.cluster.node_dir(east.info[0]["name"]) / "wslog" / "pins.json"
    applied = west.position(0)[0][2]
    return path.exists() and json.loads(path.read_text())["pins"].get("link:east-west", [None])[0] == applied


def _status(site: Site) -> dict[str, Any]:
    """East's ``out`` row of ``chorus link status --json``."""
    name = site.info[0]["name"]
    p = subprocess.run([sys.executable, "-m", "chorus", "link", "status", "--dir", site.cluster.dir.as_posix(), name,
                        "--json"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    (row,) = [r for r in json.loads(p.stdout)["links"] if r["direction"] == "out"]
    return dict(row)


def test_a_cut_link_within_max_retain_resumes_losing_nothing() -> None:
    with _sites(BASE, BASE + 2, max_retain_mb=64) as (east, west, relay):
        _write(east, 1, 10)
        wait("east's first rows on west", lambda: _ids(west) == list(range(1, 11)))
        wait("east's log pinned at what west applied", lambda: _pinned(east, west))
        relay.cut()
        _write(east, 11, 200)  # about 4 MiB: twice the ring
        assert _status(east)["state"] != "broken"
        relay.restore()
        wait("every row of east on west", lambda: _ids(west) == list(range(1, 211)), timeout=180)
        assert west.rows(0) == east.rows(0)
        wait("west's position at east's committed GID", lambda: west.position(0)[0][2] == east.committed())
        assert _status(east)["state"] == "streaming"


def test_a_cut_link_past_max_retain_is_broken_visibly() -> None:
    with _sites(BASE + 30, BASE + 32, max_retain_mb=3) as (east, west, relay):
        _write(east, 1, 10)
        wait("east's first rows on west", lambda: _ids(west) == list(range(1, 11)))
        wait("west's position at east's committed GID", lambda: west.position(0)[0][2] == east.committed())
        wait("east's log pinned at what west applied", lambda: _pinned(east, west))
        applied = west.position(0)[0][2]
        relay.cut()
        _write(east, 11, 200)  # about 4 MiB: past the 3 MiB the link may keep
        wait("east's link broken", lambda: _status(east)["state"] == "broken")
        why = _status(east)["why"]
        assert why.startswith(f"link broken: GIDs {applied + 1}..") and why.endswith("are gone from the log"), why
        with east.connect() as c:
            (state,) = c.execute("SELECT state FROM chorus.link_status WHERE direction = 'out'").fetchone() or ("?",)
        assert state == "broken"
        with urllib.request.urlopen(east.info[0]["http"] + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert 'chorus_link_state{chorus_link_state="broken",direction="out",link="east-west"} 1.0' in metrics
        relay.restore()  # west connects again and is refused: it keeps what it had, and gets nothing more
        log = west.cluster.node_dir(west.info[0]["name"]) / "coordinator.log"
        wait("west's receiver told the link is broken", lambda: "link broken: GIDs" in log.read_text(errors="replace"))
        assert _ids(west) == list(range(1, 11)) and west.position(0)[0][2] == applied
