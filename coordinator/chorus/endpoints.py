"""The coordinator's HTTP endpoints (``[metrics] listen``; docs/OPERATIONS.md): Prometheus
metrics and health checks for load balancers and orchestrators.

- ``/metrics``: the node's status as Prometheus metrics (prometheus_client), read when scraped:
  nothing on the commit path counts for them beyond the status counters it keeps anyway.
- ``/health``: 200 while the coordinator runs, is connected to its PostgreSQL and has not
  failed, whatever its phase (a liveness probe); 503 otherwise.
- ``/writable``: 200 when the node takes writes now (online, in the primary component, its
  database connected): the check for a load balancer that sends writes (HAProxy, PgBouncer).
- ``/ready``: 200 when the node is online and holds the cluster's data (a readiness probe, and
  reads); ``?lag=N`` also asks that it be at most N GIDs behind what it certified.

Every answer to a health check is a small JSON object (the node, its phase, why, its lag), so a
person with curl sees why a node is out. All of them answer 503 once the coordinator is
stopping.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Optional

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, StateSetMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from chorus.link import status as link_status
from chorus.nodestatus import NodeStatus

PHASES = ("starting", "connecting", "joining", "recovering", "online", "non-primary", "needs-recovery", "failed")


class StatusCollector(Collector):
    """The node's status (``status()``, a :class:`NodeStatus`) as metrics, made at each scrape."""

    def __init__(self, status: Callable[[], NodeStatus]) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        s = self._status()
        yield InfoMetricFamily("chorus_node", "This node", value={
            "node": s.node, "cluster_uuid": s.cluster_uuid, "impl": s.impl, "event_loop": s.event_loop})
        yield StateSetMetricFamily("chorus_phase", "The node's phase (docs/MEMBERSHIP.md)",
                                   {p: s.state == p for p in PHASES})

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, value=value)

        yield gauge("chorus_accepts_writes", "1 if the node takes writes now", s.accepts_writes)
        yield gauge("chorus_quorate", "1 if the node is in the primary component", s.quorate)
        yield gauge("chorus_members_online", "Nodes online in this node's view", len(s.members))
        yield gauge("chorus_uptime_seconds", "Seconds since the coordinator started", s.uptime_s)
        gids = GaugeMetricFamily("chorus_gid", "Positions in the total order", labels=["kind"])
        for kind, value in (("delivered", s.delivered_gid), ("certified", s.certified_gid),
                            ("released", s.released_gid), ("committed", s.committed_gid)):
            gids.add_metric([kind], value)
        yield gids
        member = GaugeMetricFamily("chorus_member_committed_gid",
                                   "Each online member's committed GID, as it last reported it", labels=["member"])
        for name, gid in s.member_committed_gid.items():
            member.add_metric([name], gid)
        yield member
        yield gauge("chorus_apply_lag_gids", "Certified here but not committed here yet, in GIDs", s.lag_gids)
        yield gauge("chorus_apply_lag_seconds", "How long the oldest such writeset has waited", s.lag_ms / 1000)
        yield counter("chorus_local_commits", "Local transactions certified and committed", s.local_commits)
        failures = CounterMetricFamily("chorus_certification_failures",
                                       "Writesets that failed certification, by the table of the key they "
                                       "conflicted on (\"\": snapshot too old)", labels=["table"])
        for table, n in sorted(s.certification_failures_by_table.items()):
            failures.add_metric([table], n)
        yield failures
        yield counter("chorus_local_certification_failures", "This node's transactions that failed certification",
                      s.local_certification_failures)
        yield counter("chorus_applied_writesets", "Remote writesets applied here", s.applied)
        yield counter("chorus_apply_transactions", "Transactions that applied remote writesets", s.apply_transactions)
        yield counter("chorus_replayed_writesets", "Certified local writesets applied again after their "
                      "backend was lost", s.replayed)
        yield counter("chorus_apply_retries", "Applies retried", s.apply_retries)
        yield counter("chorus_refused_writesets", "Local writesets refused (node not taking writes, too large)",
                      s.refused)
        yield counter("chorus_local_aborts_for_appliers", "Local sessions aborted in an applier's way",
                      s.local_aborts_for_appliers)
        yield counter("chorus_malformed_frames", "Malformed frames from backends", s.malformed_frames)
        yield gauge("chorus_apply_queue", "Writesets waiting for an apply session", s.apply_queue)
        yield gauge("chorus_pending_writesets", "Certified writesets not committed here yet", s.pending)
        yield gauge("chorus_apply_workers_busy", "Apply sessions busy", s.workers_busy)
        yield gauge("chorus_apply_workers", "Apply sessions", s.workers)
        yield gauge("chorus_send_queue", "Local writesets waiting to be sent on the bus", s.send_queue)
        flow = s.flow_control
        yield gauge("chorus_flow_control_requested", "1 if this node asks the cluster to slow down",
                    bool(flow.get("requested_by_this_node")))
        yield gauge("chorus_flow_control_paused_by", "Nodes asking the cluster to slow down",
                    len(flow.get("paused_by", [])))
        yield counter("chorus_bus_messages_sent", "Bus messages sent", s.bus_messages_sent)
        yield counter("chorus_bus_bytes_sent", "Bytes of bus messages sent", s.bus_bytes_sent)
        yield counter("chorus_bus_messages_received", "Bus messages delivered here", s.bus_messages_received)
        yield counter("chorus_bus_bytes_received", "Bytes of bus messages delivered here", s.bus_bytes_received)
        yield counter("chorus_bus_writesets_sent", "Local writesets sent", s.bus_writesets)
        yield gauge("chorus_certification_index_keys", "Keys in the certification index",
                    s.certification_index_keys)
        wl = s.writeset_log
        logged = GaugeMetricFamily("chorus_wslog_gid", "The writeset log's range", labels=["end"])
        logged.add_metric(["low"], wl.get("low_gid", 0))
        logged.add_metric(["high"], wl.get("high_gid", 0))
        yield logged
        yield gauge("chorus_wslog_bytes", "Bytes of the writeset log's segment files", wl.get("bytes", 0))
        rec = s.recovery or {}
        yield gauge("chorus_recovery_active", "1 while a partial recovery (catch-up) runs",
                    bool(rec) and rec.get("state") not in ("done", "failed"))
        yield gauge("chorus_recovery_gids_to_go", "GIDs the catch-up has still to apply", rec.get("gids_to_go", 0))
        yield counter("chorus_recovery_bytes_received", "Bytes the last catch-up received",
                      rec.get("bytes_received", 0))
        yield from link_metrics(s.links)


def link_metrics(rows: list[dict[str, Any]]) -> Iterator[Any]:
    """The links this node has a part in (link/status.py rows), by link and direction."""
    by = ["link", "direction"]
    state = StateSetMetricFamily("chorus_link_state", "Each link direction's state on this node (docs/LINKS.md "
                                 "section 9)", labels=by)
    lag = GaugeMetricFamily("chorus_link_lag_gids", "in: the peer's latest GID known here minus the peer GID "
                            "applied through; out: this site's committed GID minus the GID the stream passed",
                            labels=by)
    lag_s = GaugeMetricFamily("chorus_link_lag_seconds", "in: how long the oldest received peer transaction not "
                              "applied yet has waited here", labels=by)
    gids = GaugeMetricFamily("chorus_link_gid", "Positions of a link: own (this site's committed GID), peer (the "
                             "peer's latest GID known here), applied (the peer GID applied through; out: the GID "
                             "the stream passed), position (chorus.link_position.applied_gid), max_replicated "
                             "(the highest of this site's GIDs the peer reflected)", labels=by + ["kind"])
    records = CounterMetricFamily("chorus_link_records", "Records of a link's stream on this node: received and "
                                  "applied (in); sent, filtered by the rules, returned (the peer's own, not "
                                  "sent back) and ddl_skipped (schema changes not sent, ddl on) (out)", labels=by + ["what"])
    copies = GaugeMetricFamily("chorus_link_copy", "in: this node's last re-instantiation of the link "
                               "(docs/LINKS.md section 10.1): rows received, tables copied whole, batches sent on "
                               "and applied, and running (1 while it runs)", labels=by + ["what"])
    conflicts = CounterMetricFamily("chorus_link_conflicts", "Conflicts this site's apply of a link met "
                                    "(chorus.link_exceptions), by table and decision",
                                    labels=["link", "table", "decision"])
    for r in rows:
        key = [r["link"], r["direction"]]
        state.add_metric(key, {st: r["state"] == st for st in link_status.STATES})
        if r.get("lag_gids") is not None:
            lag.add_metric(key, r["lag_gids"])
        if r.get("lag_seconds") is not None:
            lag_s.add_metric(key, r["lag_seconds"])
        for kind, name in (("own", "own_clock"), ("peer", "peer_gid"), ("applied", "applied_gid"),
                           ("position", "position_gid"), ("max_replicated", "max_replicated")):
            if r.get(name) is not None:
                gids.add_metric(key + [kind], r[name])
        for what in ("received", "applied", "sent", "filtered", "returned", "ddl_skipped"):
            if r.get(what) is not None:
                records.add_metric(key + [what], r[what])
        copy = r.get("copy")
        if copy is not None:
            for what in ("rows", "tables", "batches", "applied"):
                copies.add_metric(key + [what], copy[what])
            copies.add_metric(key + ["running"], int(r["state"] == "copying"))
        for c in r.get("conflicts_by") or []:
            conflicts.add_metric([r["link"], c["table"], c["decision"]], c["count"])
    yield from (state, lag, lag_s, gids, records, copies, conflicts)


def health(s: NodeStatus, stopping: bool, database_ok: bool) -> dict[str, tuple[bool, str]]:
    """Each health check's verdict on status ``s``: (passes, why)."""
    if stopping:
        down = (False, "the coordinator is stopping")
        return {"health": down, "writable": down, "ready": down}
    if s.state == "failed":
        failed = (False, f"the coordinator failed: {s.reason}")
        return {"health": failed, "writable": failed, "ready": failed}
    alive = (True, "running") if database_ok else (False, "not connected to its database")
    writable = (True, "takes writes") if s.accepts_writes else (False, s.reason or f"phase {s.state}")
    ready = ((True, "online") if s.state == "online" and database_ok
             else (False, s.reason if s.state != "online" else "not connected to its database"))
    return {"health": alive, "writable": writable, "ready": ready}


class Endpoints:
    """The HTTP server: ``start(listen)``, ``close()``."""

    def __init__(self, status: Callable[[], NodeStatus], stopping: Callable[[], bool],
                 database_ok: Callable[[], bool]) -> None:
        self._status, self._stopping, self._database_ok = status, stopping, database_ok
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(StatusCollector(status))
        self._runner: Optional[web.AppRunner] = None
        self.port = 0  # the port listened on (for listen = "host:0")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        for check in ("health", "writable", "ready"):
            app.router.add_get(f"/{check}", self._check)
        return app

    async def start(self, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host.strip("[]"), int(port), reuse_address=True)
        await site.start()
        addresses = self._runner.addresses  # (host, port, ...) of each socket listened on
        self.port = int(addresses[0][1]) if addresses else int(port)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _check(self, request: web.Request) -> web.Response:
        s = self._status()
        check = request.path.strip("/")
        ok, why = health(s, self._stopping(), self._database_ok())[check]
        if ok and check == "ready" and "lag" in request.query:
            try:
                most = int(request.query["lag"])
            except ValueError:
                return web.json_response({"error": "lag must be a whole number of GIDs"}, status=400)
            if s.lag_gids > most:
                ok, why = False, f"{s.lag_gids} GIDs behind (at most {most} asked)"
        body = {"node": s.node, "check": check, "ok": ok, "why": why, "phase": s.state,
                "accepts_writes": s.accepts_writes, "lag_gids": s.lag_gids, "committed_gid": s.committed_gid}
        return web.Response(text=json.dumps(body) + "\n", status=200 if ok else 503,
                            content_type="application/json")
