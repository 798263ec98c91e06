"""What a node shows of its links (chorus/link/status.py; docs/LINKS.md section 9): the rows of
``chorus link status``, ``chorus.link_status`` and the ``chorus_link_*`` metrics, made from the
facts the shell gathers; the sender's counts of what it sent, filtered and did not send back; the
receiver's oldest transaction waiting; the view's JSON and the metrics."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from chorus import nodestatus, wire
from chorus.bus import proto as bp
from chorus.config import LinkConfig
from chorus.endpoints import Endpoints
from chorus.link import position as lp
from chorus.link import status as ls
from chorus.link.events import ClockEvent, RemoteTransaction
from chorus.link.proto import Position
from chorus.link.rules import RuleSet, TableRule
from chorus.link.site import Inbound
from chorus.wslog import FLAG_DDL_SKIPPED, LogRecord

from chorus.link.sender import Outbound
from test_endpoints import status
from test_link_sender import Regions, facts, ws


def receiving(**kw: Any) -> ls.Receiving:
    base: dict[str, Any] = dict(running=True, broken=None, connected="10.0.0.1:9433", peer_clock=41,
                                max_replicated=17, oldest_waiting=None, oldest_waited_s=0.0, received=12, applied=12)
    base.update(kw)
    return ls.Receiving(**base)


DURABLE = ls.Durable(35, 36, 15, 1.7e9, {("app.items", "took-remote"): 2, ("app.items", "kept-local"): 1,
                                         ("app.other", "rejected"): 4})


def test_a_receiver_caught_up_has_no_lag() -> None:
    r = ls.in_row("east-west", "west", "east", 90, "w1", "w1", receiving(), DURABLE)
    assert (r["state"], r["receiver_node"], r["sender"]) == ("streaming", "w1", "10.0.0.1:9433")
    # the peer's latest GID is one below its clock; everything received is applied
    assert (r["peer_gid"], r["applied_gid"], r["lag_gids"], r["lag_seconds"]) == (40, 40, 0, 0.0)
    assert (r["own_clock"], r["peer_clock"], r["max_replicated"], r["position_gid"]) == (90, 41, 17, 35)
    assert r["conflicts"] == 7
    assert r["conflicts_by"] == [{"table": "app.items", "decision": "kept-local", "count": 1},
                                 {"table": "app.items", "decision": "took-remote", "count": 2},
                                 {"table": "app.other", "decision": "rejected", "count": 4}]
    json.dumps(r)  # what the admin socket and the view carry


def test_a_receiver_behind_counts_from_its_oldest_waiting_transaction() -> None:
    r = ls.in_row("l", "west", "east", 90, "w1", "w1", receiving(oldest_waiting=33, oldest_waited_s=2.25), DURABLE)
    # applied through 32 (what was filtered between the last applied and 33 needed nothing)
    assert (r["peer_gid"], r["applied_gid"], r["lag_gids"], r["lag_seconds"]) == (40, 32, 8, 2.25)
    # the durable row is ahead of what the receiver heard (it resumed): no negative lag
    r = ls.in_row("l", "west", "east", 90, "w1", "w1", receiving(peer_clock=10), DURABLE)
    assert (r["peer_gid"], r["lag_gids"]) == (35, 0)


def test_states_of_the_in_direction() -> None:
    assert ls.in_row("l", "w", "e", 1, "w1", "w1", receiving(connected=None), DURABLE)["state"] == "reconnecting"
    broken = ls.in_row("l", "w", "e", 1, "w1", "w1", receiving(running=False, broken="link broken: GIDs 3..9 are gone"),
                       DURABLE)
    assert broken["state"] == "broken" and "3..9" in broken["why"]
    # another node runs the receiver: this one knows the durable row, not the peer's latest GID
    other = ls.in_row("l", "w", "e", 1, "w2", "w1", None, DURABLE)
    assert (other["state"], other["receiver_node"], other["applied_gid"], other["peer_gid"], other["lag_gids"],
            other["lag_seconds"]) == ("elsewhere", "w2", 35, None, None, None)
    assert other["conflicts"] == 7  # every node holds the same exceptions
    none = ls.in_row("l", "w", "e", 1, None, "w1", None, ls.Durable())
    assert (none["state"], none["applied_gid"], none["conflicts"], none["conflicts_by"]) == ("idle", None, 0, [])


def test_the_out_direction() -> None:
    s = ls.Sending((("10.0.0.2:5000", 80), ("10.0.0.3:5000", 85)), None, 20, 3, 5)
    r = ls.out_row("l", "east", "west", 90, "e1", s)
    assert (r["state"], r["sender"], r["receivers"], r["applied_gid"], r["lag_gids"]) == (
        "streaming", "e1", ["10.0.0.2:5000", "10.0.0.3:5000"], 85, 5)
    assert (r["sent"], r["filtered"], r["returned"], r["conflicts"]) == (20, 3, 5, None)
    idle = ls.out_row("l", "east", "west", 90, "e1", ls.Sending((), None, 0, 0, 0))
    assert (idle["state"], idle["lag_gids"]) == ("idle", None)
    broken = ls.out_row("l", "east", "west", 90, "e1", ls.Sending((), "link broken: GIDs 1..4", 0, 0, 0))
    assert (broken["state"], broken["why"]) == ("broken", "link broken: GIDs 1..4")
    # a stream open but stopped at a transaction its rules cannot route is broken, not streaming
    stopped = ls.out_row("l", "east", "west", 90, "e1",
                         ls.Sending((("10.0.0.2:5000", 80),), "GID 81 cannot be sent: bad filter", 20, 3, 5))
    assert (stopped["state"], stopped["why"], stopped["applied_gid"]) == ("broken", "GID 81 cannot be sent: bad filter", 80)


def test_the_sender_counts_what_it_sent_filtered_and_did_not_send_back() -> None:
    rules = RuleSet(tables=(TableRule("public.t", row_filter="region = 'eu'"),))
    o = Outbound("A", "B", Position(0, 0), rules, Regions(), facts, clock_interval=0.0)
    o.take(LogRecord(1, "n1", 0, ws((1, "eu"))), now=0.0)
    o.take(LogRecord(2, "n1", 0, ws((2, "us"))), now=0.0)  # the row filter drops it
    o.take(LogRecord(3, "link:B:7", 0, ws((3, "eu"))), now=0.0)  # the peer's own: only its reflection
    o.take(LogRecord(4, "n1", FLAG_DDL_SKIPPED, ws((4, "eu"))), now=0.0)
    assert (o.sent, o.filtered, o.returned, o.position) == (1, 2, 1, 4)


def test_the_inbound_says_its_oldest_waiting_transaction() -> None:
    link = LinkConfig(name="l", site="west", peer_site="east", peers=("127.0.0.1:1",), tls_cert="c", tls_key="k",
                      peer_cert="p", secret_file="s")
    sent: list[bp.Message] = []

    async def main() -> None:
        async def read() -> None:
            return None
        inbound = Inbound("w1", link, sent.append, read, window=8)
        assert inbound.waiting() == (None, 0.0)
        await inbound.position()
        await inbound.sink(ClockEvent("east", 5))
        await inbound.sink(RemoteTransaction("east", 6, 0, wire_ws()))
        await inbound.sink(RemoteTransaction("east", 9, 0, wire_ws()))
        oldest, waited = inbound.waiting()
        assert oldest == 6 and 0 <= waited < 5
        first = sent[0]
        assert isinstance(first, bp.LinkWriteset)
        inbound.committed(first.ticket, lp.Decision.APPLY)
        assert inbound.waiting()[0] == 9 and (inbound.sent, inbound.applied, inbound.peer_clock) == (2, 1, 10)
    asyncio.run(main())


def test_the_lag_in_seconds_counts_from_the_peers_commit() -> None:
    """With the peer's commit times in the stream, the oldest waiting transaction's lag is now
    (this node's wall clock) minus its commit on the peer, not the time since it arrived here."""
    link = LinkConfig("l", "west", "east", "c", "k", "pc", "s", peers=("h:1",))
    sent: list[bp.Message] = []
    now = [1_790_000_100.0]

    async def main() -> None:
        async def read() -> None:
            return None
        inbound = Inbound("w1", link, sent.append, read, window=8, wall=lambda: now[0])
        await inbound.position()
        await inbound.sink(RemoteTransaction("east", 6, 1_790_000_000_000_000, wire_ws()))
        assert inbound.waiting() == (6, 100.0)
        now[0] += 2.5
        assert inbound.waiting() == (6, 102.5)
    asyncio.run(main())


def wire_ws() -> wire.Writeset:
    return wire.decode(ws((1, "eu")))


ROWS = [ls.in_row("east-west", "west", "east", 90, "w1", "w1", receiving(oldest_waiting=33, oldest_waited_s=1.5),
                  DURABLE),
        ls.out_row("east-west", "west", "east", 90, "w1", ls.Sending((("10.0.0.2:1", 88),), None, 20, 3, 5))]


def test_the_view_carries_the_rows_without_the_conflicts() -> None:
    doc = json.loads(nodestatus.info("links", lambda: status(links=ROWS), lambda: []))
    assert [(r["link"], r["direction"], r["state"], r["lag_gids"]) for r in doc] == [
        ("east-west", "in", "streaming", 8), ("east-west", "out", "streaming", 2)]
    assert set(doc[0]) == set(nodestatus.LINK_VIEW_FIELDS)  # the view counts conflicts itself, in SQL


def test_metrics_of_links() -> None:
    ep = Endpoints(lambda: status(links=ROWS), lambda: False, lambda: True)
    m: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(generate_latest(ep.registry).decode()):
        for s in family.samples:
            m[(s.name, tuple(sorted(s.labels.items())))] = s.value
    d_in = (("direction", "in"), ("link", "east-west"))
    assert m[("chorus_link_state", (("chorus_link_state", "streaming"),) + d_in)] == 1
    assert m[("chorus_link_state", (("chorus_link_state", "broken"),) + d_in)] == 0
    assert m[("chorus_link_lag_gids", d_in)] == 8
    assert m[("chorus_link_lag_seconds", d_in)] == 1.5
    assert m[("chorus_link_gid", d_in[:1] + (("kind", "max_replicated"),) + d_in[1:])] == 17
    assert m[("chorus_link_gid", d_in[:1] + (("kind", "peer"),) + d_in[1:])] == 40
    assert m[("chorus_link_conflicts_total", (("decision", "took-remote"), ("link", "east-west"),
                                              ("table", "app.items")))] == 2
    d_out = (("direction", "out"), ("link", "east-west"))
    assert m[("chorus_link_lag_gids", d_out)] == 2
    assert m[("chorus_link_records_total", d_out[:1] + d_out[1:] + (("what", "filtered"),))] == 3
    assert ("chorus_link_lag_seconds", d_out) not in m  # not known for that direction
    # a node without links shows none of these series
    assert not any(k[0].startswith("chorus_link") for k in _samples(Endpoints(lambda: status(), lambda: False,
                                                                               lambda: True)))


def _samples(ep: Endpoints) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items())))
            for f in text_string_to_metric_families(generate_latest(ep.registry).decode()) for s in f.samples}


def test_a_reinstantiation_shows_its_progress_until_the_receiver_runs_again() -> None:
    running = ls.Copying(True, "copying", 70, 1, 1500, 4, 3, 12.5, None)
    r = ls.in_row("l", "w", "e", 90, "w1", "w1", receiving(running=False), DURABLE, running)
    assert r["state"] == "copying"
    assert r["copy"] == {"state": "copying", "peer_gid": 70, "tables": 1, "rows": 1500, "batches": 4, "applied": 3,
                         "seconds": 12.5, "error": None}
    json.dumps(r)
    refused = ls.Copying(False, "refused", None, 0, 0, 0, 0, 0.1, "link l goes both ways and settles ...")
    r = ls.in_row("l", "w", "e", 90, "w1", "w1", receiving(running=False), DURABLE, refused)
    assert (r["state"], r["copy"]["state"], r["why"]) == ("idle", "refused", refused.error)
    # the receiver streams again: the copy done before is no longer shown
    done = ls.Copying(False, "done", 70, 2, 3000, 8, 8, 30.0, None)
    r = ls.in_row("l", "w", "e", 90, "w1", "w1", receiving(), DURABLE, done)
    assert (r["state"], r["copy"], r["why"]) == ("streaming", None, None)
    # the metrics of a running copy
    row = ls.in_row("l", "w", "e", 90, "w1", "w1", None, DURABLE, running)
    ep = Endpoints(lambda: status(links=[row]), lambda: False, lambda: True)
    m = {(s.name, tuple(sorted(s.labels.items()))): s.value
         for f in text_string_to_metric_families(generate_latest(ep.registry).decode()) for s in f.samples}
    key = (("direction", "in"), ("link", "l"))
    assert m[("chorus_link_copy", key + (("what", "rows"),))] == 1500
    assert m[("chorus_link_copy", key + (("what", "running"),))] == 1
    assert m[("chorus_link_state", (("chorus_link_state", "copying"),) + key)] == 1
    assert json.loads(nodestatus.info("links", lambda: status(links=[row]), lambda: []))[0]["state"] == "copying"
