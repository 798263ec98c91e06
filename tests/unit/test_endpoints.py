"""The coordinator's HTTP endpoints (chorus/endpoints.py) and the extension's views
(nodestatus.info): metrics as Prometheus parses them, health verdicts, answers over real HTTP,
and requests of any shape."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from chorus import nodestatus
from chorus.endpoints import Endpoints, health
from chorus.nodestatus import NodeStatus

FIELDS = {f.name: f.type for f in dataclasses.fields(NodeStatus)}


def status(**changes: Any) -> NodeStatus:
    """A node's status: online in a 3-node cluster, with a little traffic, and ``changes``."""
    base: dict[str, Any] = {
        "node": "n1", "state": "online", "reason": "joined", "accepts_writes": True, "cluster_uuid": "u-1",
        "bus_member": "1:1", "members": ["n1", "n2", "n3"], "member_committed_gid": {"n1": 40, "n2": 38, "n3": 40},
        "bus_members": ["1:1", "1:2", "1:3"], "bus_version": 4, "bus_versions": [3, 4],
        "member_bus_versions": {"n1": [3, 4], "n2": [3, 4], "n3": [3, 4]}, "quorate": True, "quorum_votes": 2, "tie_breaker": "",
        "released_gid": 41, "held_for_quorum": 0, "committed_gid": 40, "delivered_gid": 44, "certified_gid": 41,
        "lag_gids": 1, "lag_ms": 2.5, "local_commits": 30, "certification_failures": 3,
        "local_certification_failures": 1, "certification_failures_by_table": {"public.acc": 2, "": 1},
        "applied": 10, "apply_transactions": 9, "replayed": 0, "apply_retries": 0, "apply_queue": 0, "send_queue": 0,
        "flow_control": {"requested_by_this_node": False, "paused_by": ["n3"]}, "pending": 1, "pending_head": [],
        "workers": 4, "commit_lanes": 1, "workers_busy": 1, "max_workers_busy": 2, "overlapped_applies": 0,
        "already_committed": 0, "last_apply_ms": 0.4, "certification_index_keys": 12, "certification_horizon": 0,
        "refused": 0, "local_aborts_for_appliers": 0, "malformed_frames": 0, "bus_batches": 30,
        "bus_writesets": 31, "bus_messages_sent": 50, "bus_bytes_sent": 9000, "bus_messages_received": 140,
        "bus_bytes_received": 27000, "uptime_s": 12.0, "event_loop": "uvloop", "impl": "c",
        "recovery": None, "concurrent_index_changes": {},
        "writeset_log": {"low_gid": 1, "high_gid": 40, "holds_after_gid": 0, "bytes": 64 << 20},
        "synced_members": ["n1", "n2", "n3"], "epochs": [[1, 0, "n1"]], "reform": None,
        "config_version": 0, "configured_nodes": [], "configured_ids": {}, "configured_votes": 3, "links": [],
    }
    assert set(base) == set(FIELDS), set(FIELDS) ^ set(base)
    base.update(changes)
    return NodeStatus(**base)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(ep: Endpoints) -> str:
    from prometheus_client import generate_latest
    return generate_latest(ep.registry).decode()


def test_metrics_parse_and_carry_the_status() -> None:
    ep = Endpoints(lambda: status(), lambda: False, lambda: True)
    m = samples(scrape(ep))
    assert m[("chorus_phase", (("chorus_phase", "online"),))] == 1
    assert m[("chorus_phase", (("chorus_phase", "non-primary"),))] == 0
    assert m[("chorus_accepts_writes", ())] == 1
    assert m[("chorus_gid", (("kind", "committed"),))] == 40
    assert m[("chorus_member_committed_gid", (("member", "n2"),))] == 38
    assert m[("chorus_certification_failures_total", (("table", "public.acc"),))] == 2
    assert m[("chorus_certification_failures_total", (("table", ""),))] == 1
    assert m[("chorus_apply_lag_seconds", ())] == 0.0025
    assert m[("chorus_bus_bytes_received_total", ())] == 27000
    assert m[("chorus_flow_control_paused_by", ())] == 1
    assert m[("chorus_wslog_gid", (("end", "high"),))] == 40
    assert m[("chorus_node_info", (("cluster_uuid", "u-1"), ("event_loop", "uvloop"), ("impl", "c"),
                                   ("node", "n1")))] == 1
    rec = {"state": "streaming", "gids_to_go": 500, "bytes_received": 1 << 20}
    m = samples(scrape(Endpoints(lambda: status(state="recovering", recovery=rec), lambda: False, lambda: True)))
    assert m[("chorus_recovery_active", ())] == 1 and m[("chorus_recovery_gids_to_go", ())] == 500
    assert m[("chorus_phase", (("chorus_phase", "recovering"),))] == 1


@pytest.mark.parametrize("changes, stopping, db, expect", [
    ({}, False, True, (True, True, True)),
    ({"state": "non-primary", "accepts_writes": False, "quorate": False}, False, True, (True, False, False)),
    ({"state": "recovering", "accepts_writes": False}, False, True, (True, False, False)),
    ({"state": "joining", "accepts_writes": False}, False, True, (True, False, False)),
    ({"accepts_writes": False}, False, False, (False, False, False)),  # its PostgreSQL is gone
    ({}, True, True, (False, False, False)),  # stopping
    ({"state": "failed", "accepts_writes": False}, False, True, (False, False, False)),
])
def test_health_verdicts(changes: dict[str, Any], stopping: bool, db: bool, expect: tuple[bool, bool, bool]) -> None:
    v = health(status(**changes), stopping, db)
    assert (v["health"][0], v["writable"][0], v["ready"][0]) == expect
    assert all(why for _, why in v.values())


def _serving(status_of: Callable[[], NodeStatus], stopping: Callable[[], bool], db: Callable[[], bool],
             requests: Callable[[int], Any]) -> Any:
    """Start the endpoints on a free port, run ``requests(port)`` in a thread, stop."""
    async def main() -> Any:
        ep = Endpoints(status_of, stopping, db)
        await ep.start("127.0.0.1:0")
        try:
            return await asyncio.get_running_loop().run_in_executor(None, requests, ep.port)
        finally:
            await ep.close()
    return asyncio.run(main())


def get(port: int, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def test_health_checks_and_metrics_over_http() -> None:
    now: dict[str, Any] = {"s": status(), "stopping": False}

    def requests(port: int) -> None:
        code, ctype, body = get(port, "/metrics")
        assert code == 200 and ctype.startswith("text/plain") and "chorus_phase" in body
        for path in ("/health", "/writable", "/ready", "/ready?lag=5"):
            code, ctype, body = get(port, path)
            assert code == 200 and ctype.startswith("application/json"), (path, code, body)
            doc = json.loads(body)
            assert doc["ok"] and doc["node"] == "n1" and doc["phase"] == "online"
        assert get(port, "/ready?lag=0")[0] == 503  # 1 GID behind
        assert get(port, "/ready?lag=many")[0] == 400
        assert get(port, "/nothing")[0] == 404
        now["s"] = status(state="non-primary", accepts_writes=False, quorate=False,
                          reason="this node is outside the quorate partition")
        assert [get(port, p)[0] for p in ("/health", "/writable", "/ready")] == [200, 503, 503]
        assert "quorate partition" in json.loads(get(port, "/writable")[2])["why"]
        now["stopping"] = True
        code, _, body = get(port, "/health")
        assert code == 503 and json.loads(body)["why"] == "the coordinator is stopping"

    _serving(lambda: now["s"], lambda: bool(now["stopping"]), lambda: True, requests)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=60), min_size=1,
                max_size=8))
def test_requests_of_any_shape_get_an_answer_not_an_error(paths: list[str]) -> None:
    """Whatever the path and query, the server answers 200, 400, 404 or 503 (never 500) and goes on."""
    def requests(port: int) -> list[int]:
        codes = []
        for p in paths:
            target = "/" + urllib.parse.quote(p, safe="/?=&%")
            try:
                codes.append(get(port, target)[0])
            except (urllib.error.URLError, ValueError):
                codes.append(0)  # urllib refused to send it: nothing reached the server
        assert get(port, "/health")[0] == 200
        return codes

    codes = _serving(lambda: status(), lambda: False, lambda: True, requests)
    assert all(c in (0, 200, 400, 404, 405, 503) for c in codes), codes


def _conflict(gid: int, key: str = "(id)=(1)", reason: str = "certification conflict") -> dict[str, Any]:
    return {"at": 1.0, "gid": gid, "loser_node": "n2", "loser_xid": 700 + gid, "loser_pid": 9, "schema": "public",
            "table": "acc", "key": key, "winner_gid": gid - 1, "winner_node": "n1", "reason": reason}


def test_views_answer_json_and_conflicts_come_in_pages() -> None:
    s = status()
    node = json.loads(nodestatus.info("node", lambda: s, list))
    assert node["name"] == "n1" and node["lag_gids"] == 1 and node["flow_control_paused_by"] == ["n3"]
    members = json.loads(nodestatus.info("members", lambda: s, list))
    assert [(m["name"], m["this_node"], m["committed_gid"], m["lag_gids"]) for m in members] == [
        ("n1", True, 40, 1), ("n2", False, 38, 3), ("n3", False, 40, 1)]
    history = [_conflict(g, key="(k)=(" + "x" * 5000 + ")") for g in range(10, 1010)]
    got: list[dict[str, Any]] = []
    after, pages = 0, 0
    while True:
        page = json.loads(nodestatus.info(f"conflicts {after}", lambda: s, lambda: history))
        text = json.dumps(page, ensure_ascii=False)
        assert len(text.encode()) <= 0xFFFF
        got += page["rows"]
        pages += 1
        if not page["more"]:
            break
        after = page["rows"][-1]["gid"]
    assert [c["gid"] for c in got] == list(range(10, 1010)) and pages > 2
    assert all(len(c["key"]) <= 200 and c["key"].endswith("…") for c in got)
    for bad in ("", "nodes", "node x", "conflicts -1", "conflicts 1e3", "conflicts " + "9" * 30):
        with pytest.raises(ValueError):
            nodestatus.info(bad, lambda: s, list)
