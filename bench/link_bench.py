"""A link between two sites (docs/LINKS.md, issue 38): its lag and throughput with 0 ms and
50 ms between the sites, and the cost it adds to a site's own commits.

    .venv/bin/python bench/link_bench.py [--seconds 10] [--rounds 3] [--clients 4] [--scale 1]
                                         [--delays 0,50] [--port-base 57433]

Two local sites of one node each ("east" and "west", linked both ways; two nodes each is too
heavy for this 2-core machine next to the load). pgbench -N runs on east; west only receives.

**Delay between the sites.** The sites run on this host, not in network namespaces (the lab's
namespaces hold the nodes of one cluster; two sites in the lab are not built), and netem on
loopback would delay every process's traffic on the machine. Only the link crosses between
the sites, so each direction of the link goes through a relay of this process
(tests/integration/linksites.py) that holds every chunk of bytes for the delay before passing it
on, in order, both ways: ``--delays 50`` is 50 ms
one way, a 100 ms round trip on the link, nothing inside a site.

**Lag and throughput** (per delay, medians of rounds): east's TPS; west's link transactions
applied per second while the load ran; the lag sampled every 100 ms as east's committed GID
minus the east GID west has applied through (true lag: the bench sees both sites), and as west's
receiver sees it (``chorus link status``: GIDs received not applied yet, and how long the oldest
has waited); the drain: from pgbench's end until west applied east's last GID.

**Cost on east's own commits** (0 ms): rounds alternate between the link on (streaming both
ways, east stamping its rows: ``chorus.link_site``) and off (the relays cut, ``chorus.link_site``
emptied), same clusters, same run; pgbench -N TPS, medians, and their ratio. On one host the
ratio also holds west's apply: it runs flat out while the link is on and idles while it is off,
on the same cores as east; on separate hosts it would not count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "coordinator"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import psycopg  # noqa: E402

from chorus.admin import admin_request  # noqa: E402
from linksites import Relay, linked_both_ways  # noqa: E402
from pgbench_compare import pgbench_init, pgbench_run  # noqa: E402

SAMPLE_S = 0.1


def link_row(admin: str, direction: str) -> dict[str, Any]:
    """The node's row of its link in ``direction``; the admin socket is asked again while it does
    not answer (a coordinator busy catching up on a loaded machine)."""
    for attempt in range(10):
        try:
            rows = admin_request(admin, "links", timeout=20.0)["links"]
            break
        except TimeoutError:
            if attempt == 9:
                raise
    else:
        raise AssertionError
    (r,) = [r for r in rows if r["direction"] == direction]
    out: dict[str, Any] = r
    return out


def committed(admin: str) -> int:
    return int(admin_request(admin, timeout=20.0)["status"]["committed_gid"])


def wait_for(what: str, ok: Callable[[], bool], timeout: float = 600.0) -> float:
    t0 = time.monotonic()
    while not ok():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.02)
    return time.monotonic() - t0


def caught_up(east_admin: str, west_admin: str) -> Callable[[], bool]:
    def ok() -> bool:
        r = link_row(west_admin, "in")
        return r["state"] == "streaming" and (r["applied_gid"] or 0) >= committed(east_admin)
    return ok


def lag_round(east: dict[str, Any], west: dict[str, Any], clients: int, seconds: int, logdir: Path) -> dict[str, float]:
    """pgbench -N on east; west's link sampled while it runs, then its drain."""
    samples: list[tuple[int, int, float]] = []
    running = threading.Event()
    running.set()

    def sampler() -> None:
        while running.is_set():
            r = link_row(west["admin"], "in")
            true_lag = max(0, committed(east["admin"]) - (r["applied_gid"] or 0))
            samples.append((true_lag, r["lag_gids"] or 0, r["lag_seconds"] or 0.0))
            time.sleep(SAMPLE_S)

    applied0 = link_row(west["admin"], "in")["applied"]
    t = threading.Thread(target=sampler)
    t0 = time.monotonic()
    t.start()
    try:
        res = pgbench_run([east["dsn"]], clients, seconds, logdir)
    finally:
        elapsed = time.monotonic() - t0
        applied1 = link_row(west["admin"], "in")["applied"]
        running.clear()
        t.join()
    drain = wait_for("west drained", caught_up(east["admin"], west["admin"]))
    true = sorted(s[0] for s in samples)
    seen = sorted(s[1] for s in samples)
    secs = sorted(s[2] for s in samples)
    return {"tps": res["tps"], "link_tps": (applied1 - applied0) / elapsed,
            "lag_gids_median": float(statistics.median(true)), "lag_gids_max": float(true[-1]),
            "receiver_lag_gids_median": float(statistics.median(seen)),
            "receiver_lag_s_median": statistics.median(secs), "receiver_lag_s_max": secs[-1], "drain_s": drain}


def set_link(on: bool, relays: list[Relay], east: dict[str, Any], west: dict[str, Any]) -> None:
    """The link on (relays open, east stamps its rows) or off (relays cut, no stamps)."""
    with psycopg.connect(east["dsn"], autocommit=True) as c:
        c.execute("ALTER SYSTEM RESET chorus.link_site" if on else "ALTER SYSTEM SET chorus.link_site = ''")
        c.execute("SELECT pg_catalog.pg_reload_conf()")
        want = "east" if on else ""
        wait_for("chorus.link_site reloaded",
                 lambda: c.execute("SHOW chorus.link_site").fetchone() == (want,), timeout=30)
    for r in relays:
        if on:
            r.restore()
        else:
            r.cut()
    if on:
        wait_for("the link streaming and caught up", caught_up(east["admin"], west["admin"]))
        wait_for("east's receiver streaming", lambda: link_row(east["admin"], "in")["state"] == "streaming")
    else:
        wait_for("the link down", lambda: link_row(west["admin"], "in")["state"] != "streaming", timeout=60)


def prepare(dsn: str, scale: int) -> None:
    """pgbench's tables on one site, loaded locally (not replicated: chorus.capture = off, so
    both sites start alike without the load crossing the link), and a key for pgbench_history
    (a link's rows are matched by key)."""
    pgbench_init(dsn, scale)
    with psycopg.connect(dsn, autocommit=True, options="-c chorus.capture=off") as c:
        c.execute("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--delays", default="0,50", help="milliseconds one way between the sites, comma-separated")
    ap.add_argument("--port-base", type=int, default=57433)
    ap.add_argument("--cost-rounds", type=int, default=None, help="rounds of the cost on east's commits "
                    "(default: --rounds; 0: not measured)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results: dict[str, Any] = {"lag": {}, "cost": {"link": [], "no link": []}}
    sites = linked_both_ways("chorus-lb", args.port_base, 1, args.port_base + 2, 1, logs=False)
    with sites as (east_site, west_site, relays):
        (east,), (west,) = east_site.info, west_site.info
        for n in (east, west):
            prepare(n["dsn"], args.scale)
        wait_for("the link streaming", caught_up(east["admin"], west["admin"]))
        logdir = east_site.cluster.dir / "pgbench-logs"
        for delay in [int(d) for d in args.delays.split(",")]:
            for r in relays:
                r.delay = delay / 1000
            time.sleep(1.0)
            rounds = [lag_round(east, west, args.clients, args.seconds, logdir) for _ in range(args.rounds)]
            results["lag"][delay] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
            print(f"{delay} ms: {json.dumps(results['lag'][delay])}", file=sys.stderr, flush=True)
        for r in relays:
            r.delay = 0.0
        cost_rounds = args.rounds if args.cost_rounds is None else args.cost_rounds
        for _ in range(cost_rounds):
            for on in (True, False):
                set_link(on, relays, east, west)
                res = pgbench_run([east["dsn"]], args.clients, args.seconds, logdir)
                results["cost"]["link" if on else "no link"].append(res["tps"])
                print(f"link {'on' if on else 'off'}: {res['tps']:.0f} TPS", file=sys.stderr, flush=True)
        if cost_rounds:
            set_link(True, relays, east, west)
    report(results, args)


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"A link east -> west (and back), one node a site; pgbench -N on east, {args.clients} clients, "
          f"scale {args.scale}, {args.seconds} s x {args.rounds} rounds (medians)\n")
    head = ["delay (one way)", "east TPS", "link applied/s", "lag GIDs med", "lag GIDs max", "receiver lag GIDs med",
            "receiver lag s med", "receiver lag s max", "drain s"]
    rows = [[f"{d} ms", f"{v['tps']:.0f}", f"{v['link_tps']:.0f}", f"{v['lag_gids_median']:.0f}",
             f"{v['lag_gids_max']:.0f}", f"{v['receiver_lag_gids_median']:.0f}",
             f"{v['receiver_lag_s_median']:.3f}", f"{v['receiver_lag_s_max']:.3f}", f"{v['drain_s']:.2f}"]
            for d, v in results["lag"].items()]
    _table(head, rows)
    if not results["cost"]["link"]:
        return
    on = statistics.median(results["cost"]["link"])
    off = statistics.median(results["cost"]["no link"])
    print("\nThe link's cost on east's own commits (pgbench -N, alternating rounds, 0 ms)\n")
    _table(["", "TPS rounds", "median"],
           [["link on", " ".join(f"{x:.0f}" for x in results["cost"]["link"]), f"{on:.0f}"],
            ["link off", " ".join(f"{x:.0f}" for x in results["cost"]["no link"]), f"{off:.0f}"],
            ["on / off", "", f"{on / off:.3f}" if off else "-"]])


def _table(head: list[str], rows: list[list[str]]) -> None:
    cells = [head] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    for n, r in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
