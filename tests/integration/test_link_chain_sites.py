"""A chain of three sites, "a" - "b" - "c", of one node each (docs/LINKS.md section 10, issue 38):
links a-b and b-c both ways, and b forwards (``forward = true`` on both of its links), so a's
changes reach c through b and c's reach a; there is no link a-c. Rows written on a arrive on c,
rows written on c arrive on a, every site ends identical, a's changes are named a on c (in the
exceptions) and nothing circulates: once quiet, no site's committed GID moves. A row changed on
a and on c while b hears neither (the relays of link a-b cut) is detected on b, between the
neighbours b and a, and settled alike on all three sites. A triangle a-b-c-a with b forwarding
is refused on c, which would get a's changes twice.

Three real local clusters on one Corosync, each started and stopped by :class:`LocalCluster`,
which stops exactly the processes it started (by pid); the relays are threads of this process.
Every wait is bounded."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from chorus.recovery import generate_keys
from chorus.testkit.localcluster import LocalCluster

from linksites import TABLE, Relay, Site, print_logs, remove, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 700
PORT = {"a": BASE, "b": BASE + 10, "c": BASE + 20}
SENDER = 3000  # a site's sender of its first link: its PostgreSQL port plus this (its second: plus 1)
RELAY = 4000


def _keys(dirs: dict[str, Path]) -> None:
    """Each site's cluster keys; per link a shared secret, and each end's copy of the other's
    certificate."""
    for d in dirs.values():
        os.chmod(d, 0o755)
        generate_keys(str(d / "keys"))
    for x, y in (("a", "b"), ("b", "c"), ("a", "c")):
        secret = os.urandom(32).hex() + "\n"
        for me, peer in ((x, y), (y, x)):
            keys = dirs[me] / "keys"
            (keys / f"{x}-{y}.secret").write_text(secret)
            shutil.copy(dirs[peer] / "keys" / "cluster.crt", keys / f"peer-{peer}.crt")
            for f in (f"{x}-{y}.secret", f"peer-{peer}.crt"):
                os.chmod(keys / f, 0o600)


def _link(d: Path, name: str, site: str, peer: str, listen: int, peers: int, **kw: Any) -> dict[str, Any]:
    keys = d / "keys"
    return {"name": name, "site": site, "peer_site": peer, "tls_cert": str(keys / "cluster.crt"),
            "tls_key": str(keys / "cluster.key"), "peer_cert": str(keys / f"peer-{peer}.crt"),
            "secret_file": str(keys / f"{name}.secret"), "listen": f"127.0.0.1:{listen}",
            "peers": [f"127.0.0.1:{peers}"], "window": 8, **kw}


@contextlib.contextmanager
def _three_sites(prefix: str, port: dict[str, int],
                 links: Callable[[dict[str, Path]], dict[str, list[dict[str, Any]]]]) -> Iterator[tuple[dict[str, Site], dict[str, Path]]]:
    """Sites a, b, c of one node each at ``port``, their [[link]] tables ``links`` (given the
    sites' directories, whose keys hold a secret per link of ``_keys``); stopped and removed at
    the end, the coordinators' last lines printed."""
    dirs = {s: Path(tempfile.mkdtemp(prefix=f"{prefix}{s}-", dir="/tmp")) for s in "abc"}
    _keys(dirs)
    tables = links(dirs)
    started: list[LocalCluster] = []
    try:
        sites = {}
        for s in "abc":
            cluster = LocalCluster(str(dirs[s]))
            started.append(cluster)
            sites[s] = Site(s, cluster, cluster.up(1, port[s], links=tables[s]))
        yield sites, dirs
    finally:
        print_logs(*dirs.values())
        for cl in reversed(started):
            cl.down()
        remove(*dirs.values())


@pytest.fixture(scope="module")
def chain() -> Iterator[tuple[dict[str, Site], list[Relay]]]:
    a, b, c = PORT["a"], PORT["b"], PORT["c"]
    # link a-b goes through relays (the test cuts them): a's receiver reaches b's sender through
    # one, b's receiver a's sender through the other
    relays = [Relay(a + RELAY, b + SENDER), Relay(b + RELAY, a + SENDER)]
    try:
        with _three_sites("chorus-chain-", PORT, lambda dirs: {
            "a": [_link(dirs["a"], "a-b", "a", "b", a + SENDER, a + RELAY)],
            "b": [_link(dirs["b"], "a-b", "b", "a", b + SENDER, b + RELAY, forward=True),
                  _link(dirs["b"], "b-c", "b", "c", b + SENDER + 1, c + SENDER, forward=True)],
            "c": [_link(dirs["c"], "b-c", "c", "b", c + SENDER, b + SENDER + 1)],
        }) as (sites, _):
            yield sites, relays
    finally:
        for r in relays:
            r.close()


def _alike(sites: dict[str, Site]) -> bool:
    want = sites["a"].rows(0)
    return all(sites[s].rows(0) == want for s in "bc")


def _quiet(sites: dict[str, Site]) -> None:
    """Nothing circulates: every site identical, and no committed GID moves for 3 s."""
    wait("every site alike", lambda: _alike(sites), timeout=120)
    before = {s: site.committed() for s, site in sites.items()}
    time.sleep(3.0)
    assert {s: site.committed() for s, site in sites.items()} == before
    assert _alike(sites)


def test_changes_go_along_the_chain_both_ways_and_stop(chain: tuple[dict[str, Site], list[Relay]]) -> None:
    sites, _ = chain
    for site in sites.values():  # links carry no schema change: each site makes the table
        site.sql("CREATE SCHEMA app")
        site.sql(TABLE)
    with sites["a"].connect() as conn:
        for i in range(1, 11):
            conn.execute("INSERT INTO app.items VALUES (%s, %s, 0)", (i, f"a {i}"))
    # c changes a's row 1 below: it must be there first (else the UPDATE finds no row)
    wait("a's row 1 on c", lambda: (1, "a 1", 0) in sites["c"].rows(0), timeout=120)
    with sites["c"].connect() as conn:
        for i in range(101, 111):
            conn.execute("INSERT INTO app.items VALUES (%s, %s, 0)", (i, f"c {i}"))
        conn.execute("UPDATE app.items SET v = 'c changed a''s', n = 1 WHERE id = 1")
    wait("a's rows on c", lambda: (2, "a 2", 0) in sites["c"].rows(0), timeout=120)
    wait("c's rows on a", lambda: (101, "c 101", 0) in sites["a"].rows(0), timeout=120)
    wait("c's change of a's row on a", lambda: (1, "c changed a's", 1) in sites["a"].rows(0), timeout=120)
    sites["b"].sql("DELETE FROM app.items WHERE id = 10")  # the middle's own change reaches both ends
    _quiet(sites)
    rows = sites["a"].rows(0)
    assert len(rows) == 19 and (10, "a 10", 0) not in rows
    # c's position is on its neighbour b's clock, a's on b's: each link's own
    assert [p[:2] for p in sites["c"].position(0)] == [("b-c", "b")]
    assert [p[:2] for p in sites["b"].position(0)] == [("a-b", "a"), ("b-c", "c")]
    # b, a site of two links, stamps every row it took, naming the neighbour it came from
    assert {s[1] for s in sites["b"].stamps(0)} == {"a", "b", "c"}


def test_a_conflict_of_the_two_ends_is_settled_alike_on_every_site(chain: tuple[dict[str, Site], list[Relay]]) -> None:
    sites, relays = chain
    _quiet(sites)
    for r in relays:
        r.cut()
    try:
        sites["a"].sql("UPDATE app.items SET v = 'a, concurrent', n = 7 WHERE id = 5")
        sites["c"].sql("UPDATE app.items SET v = 'c, concurrent', n = 8 WHERE id = 5")
        # c's change reaches b (and is applied there) while b cannot hear a
        wait("c's change on b", lambda: (5, "c, concurrent", 8) in sites["b"].rows(0), timeout=120)
    finally:
        time.sleep(1.0)
        for r in relays:
            r.restore()
    _quiet(sites)
    # b met a's change in conflict with the row it took from c (at a GID a had not applied), a met
    # c's change (forwarded before b had a's) in conflict with its own; latest-commit-wins: c's,
    # the later, on every site
    (row,) = [r for r in sites["a"].rows(0) if r[0] == 5]
    assert row == (5, "c, concurrent", 8)
    ex_b = sites["b"].on("app.items").exceptions(0)
    ex_a = sites["a"].on("app.items").exceptions(0)
    assert [e[1:6] for e in ex_b] == [("c", "a", "row", "latest-commit-wins", "kept-local")]
    assert [e[1:6] for e in ex_a] == [("a", "c", "row", "latest-commit-wins", "took-remote")]
    assert sites["c"].on("app.items").exceptions(0) == []  # a's change stopped at b


def test_a_triangle_that_forwards_is_refused_where_a_change_would_arrive_twice() -> None:
    """Sites a, b, c linked each to each (a-b, b-c, a-c), b forwarding: c receives a's changes
    over a-c and would receive them again through b. c applies them once, over a-c, and refuses
    the forwarded ones with the reason (its receiver of b-c stops there, visibly, and tries again);
    nothing circulates."""
    port = {s: p + 30 for s, p in PORT.items()}
    a, b, c = port["a"], port["b"], port["c"]
    with _three_sites("chorus-tri-", port, lambda dirs: {
        "a": [_link(dirs["a"], "a-b", "a", "b", a + SENDER, b + SENDER),
              _link(dirs["a"], "a-c", "a", "c", a + SENDER + 1, c + SENDER + 1)],
        "b": [_link(dirs["b"], "a-b", "b", "a", b + SENDER, a + SENDER, forward=True),
              _link(dirs["b"], "b-c", "b", "c", b + SENDER + 1, c + SENDER, forward=True)],
        "c": [_link(dirs["c"], "b-c", "c", "b", c + SENDER, b + SENDER + 1),
              _link(dirs["c"], "a-c", "c", "a", c + SENDER + 1, a + SENDER + 1)],
    }) as (sites, dirs):
        for site in sites.values():
            site.sql("CREATE SCHEMA app")
            site.sql(TABLE)
        sites["a"].sql("INSERT INTO app.items VALUES (1, 'a 1', 0)")
        wait("a's row on b and c", lambda: all(sites[s].rows(0) == [(1, "a 1", 0)] for s in "bc"), timeout=120)
        why = "site b forwards site a's changes, which this site receives directly over link a-c"
        log = dirs["c"] / "nodes" / "n1" / "coordinator.log"
        wait("c's refusal in its log", lambda: why in log.read_text(errors="replace"), timeout=120)
        time.sleep(2.0)
        assert all(sites[s].rows(0) == [(1, "a 1", 0)] for s in "abc")  # once, nothing twice
        # b's position on c did not pass a's forwarded change
        assert [p[:2] for p in sites["c"].position(0)] == [("a-c", "a")]
