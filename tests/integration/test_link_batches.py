"""Batches of a link against real sites (docs/LINKS.md section 3.1, issue 38): site "east" (one
node) streams to site "west" (two nodes) with a window of one link writeset, through a relay the
test cuts; what east wrote meanwhile arrives at once when it is restored, so west's receiver sends
it on in batches. Every row arrives once, the same on both of west's nodes, in fewer of west's GIDs
than east's transactions; the link's position is at east's committed GID on both nodes; rows
changed twice within the burst (a batch's later transaction reading after the earlier one's
apply) end as east has them.

Every wait is bounded; the clusters stop exactly the processes they started (by pid)."""

from __future__ import annotations

import os

import pytest

from linksites import LISTEN_OFFSET, RELAY_OFFSET, TABLE, Relay, Site, link_table, two_sites, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BASE = int(os.environ.get("CHORUS_TEST_PORT_BASE", "25433")) + 440


def test_a_burst_is_applied_in_batches_losing_nothing_alike_on_every_node() -> None:
    east_port, west_port = BASE, BASE + 3
    relay = Relay(east_port + RELAY_OFFSET, east_port + LISTEN_OFFSET)
    try:
        with two_sites((1, east_port, lambda d: link_table(d, "east", "west", listen_offset=LISTEN_OFFSET)),
                       (2, west_port, lambda d: link_table(d, "west", "east", window=1,
                                                           peers=[f"127.0.0.1:{east_port + RELAY_OFFSET}"])),
                       prefix="chorus-batch-") as (east, west, _, _):
            for site in (east, west):  # links carry no schema change: each site makes the table
                site.sql("CREATE SCHEMA app")
                site.sql(TABLE)
            with east.connect() as c:
                c.execute("INSERT INTO app.items VALUES (0, 'first', 0)")
            wait("east's first row on west", lambda: all(west.rows(i) == east.rows(0) for i in (0, 1)))
            relay.cut()
            before = west.committed(0)
            sent_before = east.committed()
            with east.connect() as c:
                for i in range(1, 201):
                    c.execute("INSERT INTO app.items VALUES (%s, 'v', 0)", (i,))
                    if i % 10 == 0:  # a row changed again a few transactions later
                        c.execute("UPDATE app.items SET n = n + 1, v = 'again' WHERE id = %s", (i - 5,))
            transactions = east.committed() - sent_before
            relay.restore()
            want = east.rows(0)
            wait("every row of east on both of west's nodes",
                 lambda: all(west.rows(i) == want for i in (0, 1)), timeout=300)
            wait("west's position at east's committed GID on both nodes",
                 lambda: all(west.position(i)[0][2] == east.committed() for i in (0, 1)))
            assert west.position(0) == west.position(1)
            used = west.committed(0) - before
            assert used < transactions, (used, transactions)  # batched: fewer GIDs than transactions
            stamps = "SELECT key, site, clock, commit_time FROM chorus.link_stamp ORDER BY key"
            assert west.rows(0, stamps) == west.rows(1, stamps)
    finally:
        relay.close()
