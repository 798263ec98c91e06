"""What a node shows of its site's links (docs/LINKS.md section 9, issue 38): ``chorus link status
--json``, the view ``chorus.link_status`` and ``/metrics``, on two real local sites linked both
ways, "east" (one node) and "west" (two nodes): the link streaming, its lag back at 0 once writes
arrived, a conflict counted by table and decision after one row changed on both sites while the
link was cut (linksites.Relay), and an ordinary role refused the view.

Every wait is bounded; the clusters stop exactly the processes they started (by pid)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from typing import Any

import psycopg
import pytest

from linksites import RELAY_OFFSET, Relay, Site, cut, make_tables, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]



class Sites:
    def __init__(self, east: Site, west: Site, relays: list[Relay]) -> None:
        self.east, self.west, self.relays = east, west, relays
        self.by_name = {"east": east, "west": west}

    def cli(self, site: str, i: int) -> list[dict[str, Any]]:
        """``chorus link status --json`` for node ``i`` of ``site``."""
        s = self.by_name[site]
        name = s.info[i]["name"]
        p = subprocess.run([sys.executable, "-m", "chorus", "link", "status", "--dir", s.cluster.dir.as_posix(), name,
                            "--json"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        answer = json.loads(p.stdout)
        assert answer["node"] == name
        rows: list[dict[str, Any]] = answer["links"]
        return rows

    def metrics(self, site: str, i: int) -> str:
        with urllib.request.urlopen(self.by_name[site].info[i]["http"] + "/metrics", timeout=10) as r:
            text: str = r.read().decode()
            return text


def row(rows: list[dict[str, Any]], direction: str) -> dict[str, Any]:
    (r,) = [r for r in rows if r["direction"] == direction]
    return r


def by_table(r: dict[str, Any], site: Site) -> list[dict[str, Any]]:
    """The conflicts of ``r`` (a status row) by decision on the site's table alone."""
    return [c for c in r["conflicts_by"] if c["table"] == site.quoted]


def view(site: Site, i: int) -> list[tuple[Any, ...]]:
    return site.rows(i, "SELECT direction, state, receiver_node, lag_gids, applied_gid, peer_gid, position_gid, "
                        "conflicts, conflicts_by FROM chorus.link_status ORDER BY direction")


@pytest.fixture(scope="module")
def sites(linked: tuple[Site, Site, list[Relay]]) -> Sites:
    """The session's linked sites (conftest.linked), this file's table app.status."""
    east, west, relays = linked
    return Sites(east.on("app.status"), west.on("app.status"), relays)


def test_status_view_and_metrics_show_the_link(sites: Sites) -> None:
    east, west = sites.east, sites.west
    # conflicts other tests of the session's sites had, before this one's (on its own table)
    before = {site: row(sites.cli(site, 0), "in")["conflicts"] for site in ("east", "west")}
    make_tables(east, west)
    with east.connect() as c:
        for i in range(1, 31):
            c.execute("INSERT INTO app.status VALUES (%s, 'east', 0)", (i,))
    w1 = west.info[0]["name"]
    east_port = int(str(psycopg.conninfo.conninfo_to_dict(east.dsns[0])["port"]))

    def caught_up() -> bool:
        r = row(sites.cli("west", 0), "in")
        return r["state"] == "streaming" and r["lag_gids"] == 0 and r["applied_gid"] >= east.committed() \
            and all(len(west.rows(i)) == 30 for i in west.nodes())
    wait("west's receiver streaming and caught up", caught_up)
    r = row(sites.cli("west", 0), "in")
    assert (r["site"], r["peer_site"], r["receiver_node"], r["lag_seconds"]) == ("west", "east", w1, 0.0)
    assert r["sender"] == f"127.0.0.1:{east_port + RELAY_OFFSET}"  # the peer's address it streams from
    assert r["peer_gid"] >= east.committed() - 1 and r["received"] >= 30 and r["applied"] >= 30
    assert r["own_clock"] == west.committed(0) or r["own_clock"] <= west.committed(0)
    assert r["conflicts"] == before["west"] and not by_table(r, west)
    # west's other node does not run the receiver: it says which does, and the durable position
    other = row(sites.cli("west", 1), "in")
    assert (other["state"], other["receiver_node"], other["lag_gids"]) == ("elsewhere", w1, None)
    wait("the position on west's other node", lambda: row(sites.cli("west", 1), "in")["position_gid"]
         == east.committed())
    # east serves its sender to west's receiver: nothing left to send; west's changes come back filtered
    out = row(sites.cli("east", 0), "out")
    assert out["state"] == "streaming" and len(out["receivers"]) == 1
    wait("east's sender has sent everything", lambda: row(sites.cli("east", 0), "out")["lag_gids"] == 0)
    assert row(sites.cli("east", 0), "out")["sent"] >= 30

    # the view shows the same, read as a role with pg_read_all_stats
    wait("the view caught up", lambda: view(west, 0)[0][:5] == ("in", "streaming", w1, 0, east.committed()))
    (v,) = [x for x in view(west, 1) if x[0] == "in"]
    assert v[1:3] == ("elsewhere", w1) and v[3] is None and v[6] == east.committed() and v[7] == before["west"]
    # and /metrics
    m = sites.metrics("west", 0)
    assert 'chorus_link_state{chorus_link_state="streaming",direction="in",link="east-west"} 1.0' in m
    assert 'chorus_link_lag_gids{direction="in",link="east-west"} 0.0' in m

    # one row changed on both sites while the link is cut: a conflict on each site, counted
    with cut(sites.relays):
        wait("west sees the link down", lambda: row(sites.cli("west", 0), "in")["state"] == "reconnecting",
             timeout=60)
        east.sql("UPDATE app.status SET v = 'east, concurrent' WHERE id = 2")
        west.sql("UPDATE app.status SET v = 'west, concurrent' WHERE id = 2", i=1)
    wait("the conflict counted on west", lambda: row(sites.cli("west", 0), "in")["conflicts"] == before["west"] + 1,
         timeout=120)
    r = row(sites.cli("west", 0), "in")
    assert by_table(r, west) == [{"table": '"app"."status"', "decision": "kept-local", "count": 1}]
    wait("the conflict counted on east", lambda: by_table(row(sites.cli("east", 0), "in"), east)
         == [{"table": '"app"."status"', "decision": "took-remote", "count": 1}], timeout=120)
    assert row(sites.cli("east", 0), "in")["conflicts"] == before["east"] + 1
    (v,) = [x for x in view(west, 1) if x[0] == "in"]
    assert v[7] == before["west"] + 1
    assert [c for c in v[8] if c["table"] == west.quoted] == [{"table": '"app"."status"', "decision": "kept-local",
                                                               "count": 1}]
    wait("the conflict in west's metrics", lambda: 'chorus_link_conflicts_total{decision="kept-local",'
         'link="east-west",table="\\"app\\".\\"status\\""} 1.0' in sites.metrics("west", 0))
    wait("the lag back at 0", lambda: row(sites.cli("west", 0), "in")["lag_gids"] == 0
         and row(sites.cli("east", 0), "in")["lag_gids"] == 0)


def test_an_ordinary_role_cannot_read_the_links_state(sites: Sites) -> None:
    west = sites.west
    west.sql("DROP ROLE IF EXISTS hostile")
    west.sql("CREATE ROLE hostile LOGIN PASSWORD 'hostile-pw'")
    dsn = psycopg.conninfo.make_conninfo(west.dsns[0], user="hostile", password="hostile-pw", passfile="")
    with psycopg.connect(dsn, autocommit=True) as c:
        for q in ("SELECT * FROM chorus.link_status", "SELECT chorus.cluster_info('links')",
                  "SELECT chorus.cluster_info('links ')", "SELECT * FROM chorus.link_exceptions",
                  "SELECT * FROM chorus.link_position"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(q)
        # what every role may read still answers
        assert c.execute("SELECT name FROM chorus.node").fetchone() is not None
    west.sql("GRANT pg_read_all_stats TO hostile")
    with psycopg.connect(dsn, autocommit=True) as c:
        assert {r[0] for r in c.execute("SELECT direction FROM chorus.link_status").fetchall()} == {"in", "out"}
    west.sql("DROP ROLE hostile")
