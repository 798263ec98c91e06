"""Run PostgreSQL 15's own regression scripts through node n1 of a local Chorus cluster (or through a
plain PostgreSQL for a baseline) and measure what happens.

For each test of the schedule, in order and one at a time, ``psql`` runs ``sql/<test>.sql`` the way
``pg_regress`` does (``-X -a -q``, input on stdin, stdout and stderr into ``results/<test>.out``, the
same environment: time zone, date style, interval style, message locale, the directory variables).
The output is compared with ``expected/<test>.out`` and its alternatives ``<test>_N.out``: a test
passes when one of them matches exactly, as pg_regress counts it.

With a cluster (``--dir``), after each test (``--check-every``) every node's coordinator is asked
for its state (a node that is no longer online is a finding: the test after which it stopped is
recorded with the last error lines of its logs), and after each test (``--compare-every``) the
online nodes are waited on until quiescent and compared with the first one: schema (as
``chorus.testkit.fidelity.schema_of`` prints it), roles, and every replicated table's rows (as
``chorus.testkit.fidelity._rows`` reads them). A difference that was not there before is attributed to the
test that just ran. At the end ``chorus.testkit.fidelity.compare`` runs on the online nodes.

With ``--plain-port`` the scripts run against a plain PostgreSQL on 127.0.0.1 instead (start it
yourself), for the baseline count of passing tests.

    .venv/bin/python bench/regress_fidelity.py --regress-dir /tmp/pgregress15/src/test/regress \\
        --dir /tmp/regress-cluster --out /tmp/regress-out-chorus
    .venv/bin/python bench/regress_fidelity.py --regress-dir /tmp/pgregress15/src/test/regress \\
        --plain-port 57533 --out /tmp/regress-out-plain

With ``--classify PLAIN_OUT CHORUS_OUT`` (no run), the two runs' results are compared test by
test, and every test a plain PostgreSQL passes that fails through Chorus is classified: as
*sequence values* when its output equals the plain one's once every number is masked, with the
column widths that follow from them (each node
draws from its own residue class, by design), else by the table of docs/FIDELITY.md, which says
for each such test what differs and why. A test neither explains is *unclassified*: the exit
status is then 1. The nodes' comparison (stops, divergences, stalls) of the Chorus run is
reported too: any of them is a failure of the run.

    .venv/bin/python bench/regress_fidelity.py --classify /tmp/regress-out-plain /tmp/regress-out-chorus

Nothing of PostgreSQL's source is part of this repository: point ``--regress-dir`` at an extracted
``src/test/regress`` of the same major version as the server (e.g. from the PostgreSQL 15 source
package or the REL_15_* tag). Tests that need ``regress.so`` (not installed by the server packages)
fail in both runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "coordinator"))

from chorus.testkit import fidelity  # noqa: E402
from chorus.testkit.check import CheckError, NodeRef, wait_quiescent  # noqa: E402
from chorus.admin import admin_request  # noqa: E402

PGBIN = os.environ.get("CHORUS_PGBIN", "/usr/lib/postgresql/15/bin")
CHORUS = str(HERE.parent / ".venv" / "bin" / "chorus")

# What pg_regress sets for its database (ALTER DATABASE ... SET) and its session (PGOPTIONS). Given
# here as startup options, so that nothing is changed on the nodes' databases.
PGOPTIONS = ("-c intervalstyle=postgres_verbose -c lc_messages=C -c lc_monetary=C -c lc_numeric=C "
             "-c lc_time=C -c bytea_output=hex -c timezone_abbreviations=Default")

_LOG_ERR = re.compile(r" (ERROR|CRITICAL) |Traceback|Error:|could not|vote|stopping|leaves|left the")
_PG_ERR = re.compile(r"\b(ERROR|FATAL|PANIC):  ")


def read_schedule(path: Path) -> list[tuple[str, bool]]:
    """(test, ignored) in schedule order."""
    tests: list[tuple[str, bool]] = []
    ignored: set[str] = set()
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("ignore:"):
            ignored.update(line.split(":", 1)[1].split())
        elif line.startswith("test:"):
            tests.extend((t, False) for t in line.split(":", 1)[1].split())
    return [(t, t in ignored) for t, _ in tests]


def expected_files(regress: Path, test: str) -> list[Path]:
    out = []
    base = regress / "expected" / f"{test}.out"
    if base.exists():
        out.append(base)
    for i in range(1, 10):
        p = regress / "expected" / f"{test}_{i}.out"
        if p.exists():
            out.append(p)
    return out


def diff_lines(a: Path, b: Path) -> int:
    r = subprocess.run(["diff", str(a), str(b)], capture_output=True)
    if r.returncode == 0:
        return 0
    return sum(1 for ln in r.stdout.splitlines() if ln[:1] in (b"<", b">"))


def psql_env(test: str, regress: Path, out: Path, libdir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(("PG", "LC_")) or k in ("LANG", "LANGUAGE"))}
    env.update(PGTZ="America/Los_Angeles", PGDATESTYLE="Postgres, MDY", PGOPTIONS=PGOPTIONS,
               LC_MESSAGES="C", LANG="C.UTF-8", PGAPPNAME=f"pg_regress/{test}",
               PG_ABS_SRCDIR=str(regress), PG_ABS_BUILDDIR=str(out), PG_LIBDIR=libdir, PG_DLSUFFIX=".so")
    return env


def terminate_sessions(dsn: str, test: str) -> None:
    subprocess.run([f"{PGBIN}/psql", "-X", "-q", "-d", dsn, "-c",
                    f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE application_name = 'pg_regress/{test}'"],
                   capture_output=True, timeout=30, env={**os.environ, "PGOPTIONS": ""})


def run_test(test: str, dsn: str, regress: Path, out: Path, libdir: str, timeout: float) -> dict[str, Any]:
    sqlfile = regress / "sql" / f"{test}.sql"
    result = out / "results" / f"{test}.out"
    args = [f"{PGBIN}/psql", "-X", "-a", "-q", "-d", dsn,
            "-v", "HIDE_TABLEAM=on", "-v", "HIDE_TOAST_COMPRESSION=on", "-v", "ON_ERROR_STOP=0",
            "-v", f"abs_srcdir={regress}", "-v", f"abs_builddir={out}",
            "-v", f"libdir={libdir}", "-v", "dlsuffix=.so"]
    t0 = time.monotonic()
    timed_out = False
    with open(sqlfile, "rb") as fin, open(result, "wb") as fout:
        try:
            subprocess.run(args, stdin=fin, stdout=fout, stderr=subprocess.STDOUT,
                           env=psql_env(test, regress, out, libdir), timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        try:
            terminate_sessions(dsn, test)
        except (OSError, subprocess.SubprocessError):
            pass
    exp = expected_files(regress, test)
    best: Optional[tuple[int, Path]] = None
    for e in exp:
        d = diff_lines(e, result)
        if best is None or d < best[0]:
            best = (d, e)
        if d == 0:
            break
    errors = sum(1 for ln in result.read_bytes().splitlines() if ln.startswith((b"ERROR:", b"psql:")))
    return {"test": test, "passed": bool(best and best[0] == 0), "diff_lines": best[0] if best else None,
            "expected": best[1].name if best else None, "timed_out": timed_out,
            "seconds": round(time.monotonic() - t0, 2), "error_lines": errors}


# ---- the cluster --------------------------------------------------------------------------------

def cluster_nodes(directory: str) -> list[dict[str, Any]]:
    r = subprocess.run([CHORUS, "local", "status", "--dir", directory, "--json"], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"chorus local status failed: {r.stderr.strip()}")
    nodes: list[dict[str, Any]] = json.loads(r.stdout)["nodes"]
    return nodes


def node_state(n: dict[str, Any]) -> str:
    try:
        return str(admin_request(n["admin"], timeout=5)["status"]["state"])
    except (OSError, ValueError, KeyError):
        return "down"


def stalled_nodes(nodes: list[NodeRef]) -> dict[str, dict[str, Any]]:
    """The nodes that have not committed everything delivered and make no progress for 10 s."""
    def committed() -> dict[str, tuple[int, dict[str, Any]]]:
        out = {}
        for n in nodes:
            try:
                st = admin_request(n.admin, timeout=5)["status"]
                out[n.name] = (int(st["committed_gid"]), st)
            except (OSError, ValueError, KeyError):
                pass
        return out
    before = committed()
    time.sleep(10)
    after = committed()
    top = max((st["delivered_gid"] for _, st in after.values()), default=0)
    return {name: {k: st.get(k) for k in ("state", "committed_gid", "delivered_gid", "pending", "apply_queue",
                                          "apply_retries", "pending_head")}
            for name, (gid, st) in after.items()
            if gid < top and before.get(name, (None,))[0] == gid}


@dataclass
class LogTail:
    """New lines of a log file since the last look."""
    path: Path
    offset: int = 0

    def skip(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def new(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        return data.decode("utf-8", "backslashreplace").splitlines()


def interesting_pg(lines: list[str], limit: int = 6) -> list[str]:
    """ERROR/FATAL/PANIC lines with the DETAIL/CONTEXT/STATEMENT lines after them."""
    out: list[str] = []
    i = 0
    while i < len(lines) and len(out) < limit * 4:
        if _PG_ERR.search(lines[i]):
            block = [lines[i]]
            j = i + 1
            while j < len(lines) and (re.search(r"\b(DETAIL|CONTEXT|STATEMENT|HINT):  ", lines[j])
                                      or lines[j].startswith(("\t", " "))):
                block.append(lines[j][:400])
                j += 1
            out.extend(block)
            i = j
        else:
            i += 1
    return out


def interesting_coord(lines: list[str], limit: int = 12) -> list[str]:
    return [ln[:600] for ln in lines if _LOG_ERR.search(ln)][:limit]


@dataclass
class Snapshot:
    schema: dict[str, list[str]] = field(default_factory=dict)  # node -> diff lines vs the first
    roles: dict[str, bool] = field(default_factory=dict)  # node -> roles differ
    tables: dict[str, dict[str, str]] = field(default_factory=dict)  # table -> node -> detail
    ntables: int = 0


def _digest(rows: list[bytes]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(r)
        h.update(b"\n")
    return f"{len(rows)}:{h.hexdigest()}"


def snapshot(nodes: list[NodeRef], detail_tables: bool = False) -> Snapshot:
    """How the other nodes differ from the first: schema diff lines, roles, differing tables."""
    import difflib

    s = Snapshot()
    base = nodes[0]
    schema0 = fidelity.schema_of(base.dsn)
    for n in nodes[1:]:
        other = fidelity.schema_of(n.dsn)
        if other != schema0:
            s.schema[n.name] = [ln for ln in difflib.unified_diff(schema0, other, lineterm="", n=0)
                                if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    conns = {n.name: fidelity._connect(n.dsn) for n in nodes}
    try:
        roles0 = conns[base.name].execute(fidelity._ROLES.encode()).fetchall()
        tables: dict[str, dict[str, str]] = {}
        for n in nodes:
            c = conns[n.name]
            if n is not base:
                s.roles[n.name] = c.execute(fidelity._ROLES.encode()).fetchall() != roles0
            for (t,) in c.execute(fidelity._TABLES.encode()).fetchall():
                try:
                    rows = fidelity._rows(c, str(t))
                    tables.setdefault(str(t), {})[n.name] = _digest(rows)
                except Exception as e:  # noqa: BLE001 - a table one node cannot read is a finding
                    tables.setdefault(str(t), {})[n.name] = f"unreadable: {e}"
        s.ntables = len(tables)
        for t, per in sorted(tables.items()):
            d0 = per.get(base.name, "missing")
            bad = {}
            for n in nodes[1:]:
                d = per.get(n.name, "missing")
                if d != d0:
                    bad[n.name] = f"{base.name} {d0.split(':')[0] if ':' in d0 else d0} rows, " \
                                  f"{n.name} {d.split(':')[0] if ':' in d else d} rows"
            if bad:
                s.tables[t] = bad
        if detail_tables:
            for t, bad in list(s.tables.items())[:10]:
                for name in bad:
                    try:
                        a = [x.decode("utf-8", "backslashreplace") for x in fidelity._rows(conns[base.name], t)]
                        b = [x.decode("utf-8", "backslashreplace") for x in fidelity._rows(conns[name], t)]
                        bad[name] += "\n" + fidelity._first_diff(a, b, 0)
                    except Exception as e:  # noqa: BLE001
                        bad[name] += f"\n(no rows to compare: {e})"
    finally:
        for c in conns.values():
            c.close()
    return s


# ---- classification of the differences ------------------------------------------------------------

FIDELITY_DOC = HERE.parent / "docs" / "FIDELITY.md"
_DOC_ROW = re.compile(r"^\|\s*`(?P<test>[\w.]+)`\s*\|\s*(?P<cls>[^|]+?)\s*\|\s*(?P<why>.*?)\s*\|\s*$")
_NUMBER = re.compile(r"\d+")
SEQUENCE_VALUES = "sequence values"


def documented_classes(doc: Path = FIDELITY_DOC) -> dict[str, tuple[str, str]]:
    """test -> (class, why), from the table rows of docs/FIDELITY.md (| `test` | class | why |)."""
    out: dict[str, tuple[str, str]] = {}
    for line in doc.read_text().splitlines():
        m = _DOC_ROW.match(line)
        if m:
            out[m["test"]] = (m["cls"], m["why"])
    return out


def numbers_only(plain: Path, chorus: Path) -> bool:
    """Do the two outputs differ in numbers only (the same text once every number is masked)?"""
    def masked(p: Path) -> list[str]:
        # numbers masked, and psql's column widths with them (padding, the header's dashes)
        return [re.sub(r"-{2,}", "--", re.sub(r" +", " ", _NUMBER.sub("N", ln))).strip()
                for ln in p.read_text(errors="backslashreplace").splitlines()]
    return masked(plain) == masked(chorus)


def classify(plain_out: Path, chorus_out: Path) -> int:
    """Print the classification of every test a plain PostgreSQL passes and Chorus does not;
    1 if one is unclassified or the Chorus run saw a node stop, diverge or stall."""
    plain = {r["test"]: r for r in json.loads((plain_out / "summary.json").read_text())["results"]}
    summary = json.loads((chorus_out / "summary.json").read_text())
    chorus = {r["test"]: r for r in summary["results"]}
    doc = documented_classes()
    rows: list[tuple[str, str, str]] = []
    for test, p in plain.items():
        c = chorus.get(test)
        if not p["passed"] or (c is not None and c["passed"]):
            continue
        if c is None:
            rows.append((test, "not run through Chorus", ""))
            continue
        if numbers_only(plain_out / "results" / f"{test}.out", chorus_out / "results" / f"{test}.out"):
            rows.append((test, SEQUENCE_VALUES, "the outputs differ in numbers only"))
        elif test in doc:
            rows.append((test, *doc[test]))
        else:
            rows.append((test, "UNCLASSIFIED", f"diff {plain_out}/results/{test}.out {chorus_out}/results/{test}.out"))
    both = sum(1 for t, p in plain.items() if p["passed"] and chorus.get(t, {}).get("passed"))
    only_chorus = [t for t, c in chorus.items() if c["passed"] and not plain.get(t, {}).get("passed", True)]
    print(f"plain PostgreSQL passes {sum(p['passed'] for p in plain.values())} of {len(plain)}; "
          f"through Chorus {sum(c['passed'] for c in chorus.values())} of {len(chorus)} run "
          f"({both} of the plain ones)")
    if only_chorus:
        print(f"passing through Chorus only: {', '.join(only_chorus)}")
    classes: dict[str, int] = {}
    for _, cls, _ in rows:
        classes[cls] = classes.get(cls, 0) + 1
    print("tests a plain PostgreSQL passes that fail through Chorus, by class: "
          + (", ".join(f"{k} {v}" for k, v in sorted(classes.items())) or "none"))
    for test, cls, why in rows:
        print(f"  {test:<24} {cls:<22} {why}")
    bad = [name for name in ("stops", "divergences", "stalls") if summary.get(name)]
    for name in bad:
        print(f"the Chorus run has {len(summary[name])} {name}: {summary[name]}")
    unclassified = [t for t, cls, _ in rows if cls in ("UNCLASSIFIED", "not run through Chorus")]
    return 1 if unclassified or bad else 0


# ---- the run ------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regress-dir", help="an extracted src/test/regress of PostgreSQL 15 (required for a run)")
    ap.add_argument("--dir", help="a chorus local cluster directory (scripts run through its node n1)")
    ap.add_argument("--plain-port", type=int, help="run against a plain PostgreSQL on 127.0.0.1:PORT instead")
    ap.add_argument("--dbname", default="postgres", help="database of the plain PostgreSQL (default postgres)")
    ap.add_argument("--schedule", default="parallel_schedule")
    ap.add_argument("--only", help="comma-separated test names (run in schedule order)")
    ap.add_argument("--exclude", help="comma-separated test names to leave out (e.g. one that stops a node)")
    ap.add_argument("--keep-going", action="store_true",
                    help="go on after n1 (the node the scripts run through) stopped being online; by "
                         "default the run ends there, since every later write fails")
    ap.add_argument("--check-every", type=int, default=1, help="check node states every N tests (0: never)")
    ap.add_argument("--compare-every", type=int, default=1,
                    help="wait for quiescence and compare the nodes every N tests (0: only at the end)")
    ap.add_argument("--quiesce-timeout", type=float, default=60)
    ap.add_argument("--timeout", type=float, default=120, help="seconds for each psql run")
    ap.add_argument("--libdir", default="/usr/lib/postgresql/15/lib")
    ap.add_argument("--out", help="output directory (default /tmp/regress-fidelity-{chorus,plain})")
    ap.add_argument("--classify", nargs=2, metavar=("PLAIN_OUT", "CHORUS_OUT"),
                    help="no run: classify the differences between two runs' outputs (docs/FIDELITY.md)")
    a = ap.parse_args()
    if a.classify:
        return classify(Path(a.classify[0]), Path(a.classify[1]))
    if bool(a.dir) == bool(a.plain_port):
        ap.error("give exactly one of --dir or --plain-port")
    if not a.regress_dir:
        ap.error("--regress-dir is required for a run")

    regress = Path(a.regress_dir).resolve()
    out = Path(a.out or f"/tmp/regress-fidelity-{'chorus' if a.dir else 'plain'}").resolve()
    (out / "results").mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o777)
    os.chmod(out / "results", 0o777)  # the server writes COPY TO and lo_export files there

    schedule = read_schedule(regress / a.schedule)
    if a.only:
        wanted = set(a.only.split(","))
        missing = wanted - {t for t, _ in schedule}
        if missing:
            ap.error(f"not in the schedule: {', '.join(sorted(missing))}")
        schedule = [(t, ig) for t, ig in schedule if t in wanted]
    if a.exclude:
        dropped = set(a.exclude.split(","))
        schedule = [(t, ig) for t, ig in schedule if t not in dropped]

    nodes_info: list[dict[str, Any]] = []
    refs: list[NodeRef] = []
    if a.dir:
        nodes_info = cluster_nodes(a.dir)
        refs = [NodeRef(n["name"], n["dsn"], n["admin"]) for n in nodes_info]
        dsn = nodes_info[0]["dsn"]
        states = {n["name"]: node_state(n) for n in nodes_info}
        if any(s != "online" for s in states.values()):
            print(f"warning: not every node is online at the start: {states}", file=sys.stderr)
    else:
        dsn = f"host=127.0.0.1 port={a.plain_port} dbname={a.dbname} user=postgres"
        states = {}

    cdir = Path(a.dir) if a.dir else None
    coord_logs = {n["name"]: LogTail(cdir / "nodes" / n["name"] / "coordinator.log") for n in nodes_info} if cdir else {}
    pg_logs = {n["name"]: LogTail(cdir / "nodes" / n["name"] / "postgres.log") for n in nodes_info} if cdir else {}
    for t in list(coord_logs.values()) + list(pg_logs.values()):
        t.skip()

    results: list[dict[str, Any]] = []
    stops: list[dict[str, Any]] = []
    divergences: list[dict[str, Any]] = []
    stalls: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []  # per test: new coordinator errors / apply errors on other nodes
    online = [n["name"] for n in nodes_info if states.get(n["name"]) == "online"]
    prev = Snapshot()
    t_start = time.monotonic()

    for i, (test, ignored) in enumerate(schedule, 1):
        r = run_test(test, dsn, regress, out, a.libdir, a.timeout)
        r["ignored"] = ignored
        results.append(r)
        mark = "ok" if r["passed"] else ("FAILED (ignored)" if ignored else "FAILED")
        line = f"[{i:3d}/{len(schedule)}] {test:<28} {mark:<16} {r['seconds']:7.1f}s"
        if r["timed_out"]:
            line += " TIMEOUT"
        if not cdir:
            print(line, flush=True)
            continue

        ev: dict[str, Any] = {"test": test}
        for name, tail in coord_logs.items():
            lines = interesting_coord(tail.new())
            if lines:
                ev.setdefault("coordinator", {})[name] = lines
        for name, tail in pg_logs.items():
            new = tail.new()
            if name == nodes_info[0]["name"]:
                # n1's errors are mostly the tests' own; keep only crashes and fatal ones
                new = [ln for ln in new if re.search(r"\b(PANIC|FATAL):  |terminated by signal|server process", ln)]
            lines = interesting_pg(new)
            if lines:
                ev.setdefault("postgres", {})[name] = lines
        if len(ev) > 1:
            events.append(ev)

        if a.check_every and (i % a.check_every == 0 or i == len(schedule)):
            for n in nodes_info:
                st = node_state(n)
                if states.get(n["name"]) == "stalled" and st == "online":
                    continue  # stays left out
                if states.get(n["name"]) in ("online", "stalled") and st != "online":
                    stop = {"test": test, "node": n["name"], "state": st,
                            "coordinator_log": interesting_coord(
                                (cdir / "nodes" / n["name"] / "coordinator.log").read_text(
                                    errors="backslashreplace").splitlines()[-400:], 20)}
                    stops.append(stop)
                    line += f"  node {n['name']} -> {st}"
                states[n["name"]] = st
            online = [n for n, s in states.items() if s == "online"]

        live = [ref for ref in refs if ref.name in online]
        if a.compare_every and i % a.compare_every == 0 and len(live) > 1 and live[0].name == refs[0].name:
            cur: Optional[Snapshot] = None
            try:
                wait_quiescent(live, a.quiesce_timeout)
            except CheckError as e:
                # a node that stays behind is a finding too (an apply that retries forever, a
                # lock it waits for): record it, leave it out from now on, compare the others
                lagging = stalled_nodes(live)
                for name, lag in lagging.items():
                    stalls.append({"test": test, "node": name, "status": lag,
                                   "coordinator_log": interesting_coord(
                                       (cdir / "nodes" / name / "coordinator.log").read_text(
                                           errors="backslashreplace").splitlines()[-400:], 20)
                                   or (cdir / "nodes" / name / "coordinator.log").read_text(
                                       errors="backslashreplace").splitlines()[-5:]})
                    states[name] = "stalled"
                    line += f"  node {name} STALLED at GID {lag.get('committed_gid')}"
                online = [n for n, s in states.items() if s == "online"]
                live = [ref for ref in refs if ref.name in online]
                if not lagging:
                    line += f"  (no comparison: {str(e).splitlines()[0][:120]})"
                    r["no_comparison"] = str(e)[:500]
                else:
                    try:
                        if len(live) > 1:
                            wait_quiescent(live, a.quiesce_timeout)
                    except CheckError as e2:
                        line += f"  (no comparison: {str(e2).splitlines()[0][:120]})"
                        r["no_comparison"] = str(e2)[:500]
                        live = []
            if len(live) > 1 and "no_comparison" not in r:
                try:
                    cur = snapshot(live)
                except Exception as e:  # noqa: BLE001 - FidelityError, a node gone
                    line += f"  (no comparison: {str(e).splitlines()[0][:120]})"
                    r["no_comparison"] = str(e)[:500]
        else:
            cur = None
        if cur is not None:
            new_tables = {t: d for t, d in cur.tables.items() if t not in prev.tables}
            new_schema = {n: [ln for ln in d if ln not in set(prev.schema.get(n, []))]
                          for n, d in cur.schema.items()}
            new_schema = {n: d for n, d in new_schema.items() if d}
            new_roles = [n for n, d in cur.roles.items() if d and not prev.roles.get(n)]
            if new_tables or new_schema or new_roles:
                divergences.append({"test": test, "tables": new_tables, "schema": new_schema,
                                    "roles": new_roles})
                line += f"  DIVERGED: {len(new_tables)} tables, schema lines {sum(len(d) for d in new_schema.values())}"
                if new_roles:
                    line += f", roles on {','.join(new_roles)}"
            prev = cur
        print(line, flush=True)
        if states and states.get(refs[0].name) != "online" and not a.keep_going:
            print(f"{refs[0].name} is {states.get(refs[0].name)}: ending the run (--keep-going to go on)",
                  flush=True)
            break

    # ---- the end ----
    summary: dict[str, Any] = {
        "mode": "chorus" if cdir else "plain", "tests_scheduled": len(schedule), "tests_run": len(results),
        "tests_passing": sum(r["passed"] for r in results),
        "failed": [r["test"] for r in results if not r["passed"]],
        "timed_out": [r["test"] for r in results if r["timed_out"]],
        "seconds": round(time.monotonic() - t_start, 1),
    }
    if cdir:
        final_states = {n["name"]: node_state(n) for n in nodes_info}
        stalled = {x["node"] for x in stalls}
        live = [ref for ref in refs if final_states[ref.name] == "online" and ref.name not in stalled]
        summary["nodes_online_at_end"] = f"{len(live)}/{len(refs)}"
        summary["node_states"] = final_states
        # compare the nodes whose PostgreSQL still answers, online or not
        comparable = []
        for ref in refs:
            if ref.name in stalled:
                continue
            try:
                fidelity._connect(ref.dsn).close()
                comparable.append(ref)
            except Exception:  # noqa: BLE001
                pass
        try:
            wait_quiescent(live, a.quiesce_timeout)
            summary["quiescent"] = True
        except CheckError as e:
            summary["quiescent"] = str(e)
        if len(comparable) > 1:
            final = snapshot(comparable, detail_tables=True)
            summary["tables_total"] = final.ntables
            summary["tables_identical"] = final.ntables - len(final.tables)
            summary["tables_differing"] = {t: d for t, d in final.tables.items()}
            summary["schema_identical"] = not final.schema
            summary["schema_diff_head"] = {n: d[:30] for n, d in final.schema.items()}
            summary["roles_identical"] = not any(final.roles.values())
            try:
                first = fidelity.compare(comparable)
                summary["fidelity_compare"] = str(first) if first else "identical"
            except Exception as e:  # noqa: BLE001
                summary["fidelity_compare"] = f"failed: {e}"
        summary["compared_nodes"] = [r.name for r in comparable]
        summary["stops"] = stops
        summary["divergences"] = divergences
        summary["stalls"] = stalls
        summary["events"] = events
    summary["results"] = results
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))

    print()
    print(f"{'mode':<28} {summary['mode']}")
    print(f"{'tests run':<28} {summary['tests_run']} of {summary['tests_scheduled']}")
    print(f"{'tests passing':<28} {summary['tests_passing']}")
    print(f"{'timed out':<28} {', '.join(summary['timed_out']) or '-'}")
    if cdir:
        print(f"{'nodes online at the end':<28} {summary['nodes_online_at_end']}  {summary['node_states']}")
        if "tables_total" in summary:
            print(f"{'tables identical/total':<28} {summary['tables_identical']}/{summary['tables_total']}"
                  f"  (nodes compared: {', '.join(summary['compared_nodes'])})")
            print(f"{'schema identical':<28} {'yes' if summary['schema_identical'] else 'no'}")
            print(f"{'roles identical':<28} {'yes' if summary['roles_identical'] else 'no'}")
            print(f"{'fidelity.compare':<28} {summary['fidelity_compare'].splitlines()[0]}")
        print(f"{'node stops':<28} {len(stops)}")
        for stop in stops:
            print(f"  after {stop['test']}: {stop['node']} -> {stop['state']}")
            for ln in stop["coordinator_log"][-6:]:
                print(f"      {ln}")
        print(f"{'stalled nodes':<28} {len(stalls)}")
        for stall in stalls:
            lag = stall["status"]
            print(f"  after {stall['test']}: {stall['node']} stalled at GID {lag.get('committed_gid')} "
                  f"(delivered {lag.get('delivered_gid')}, retries {lag.get('apply_retries')})")
            for ln in stall["coordinator_log"][-3:]:
                print(f"      {ln[:300]}")
        print(f"{'divergences':<28} {len(divergences)}")
        for dv in divergences:
            print(f"  after {dv['test']}: tables {', '.join(list(dv['tables'])[:8])}"
                  f"{' ...' if len(dv['tables']) > 8 else ''}; schema lines "
                  f"{sum(len(x) for x in dv['schema'].values())}; roles {dv['roles'] or '-'}")
            for n, lines in list(dv["schema"].items())[:1]:
                for ln in lines[:4]:
                    print(f"      {n}: {ln[:160]}")
        if "tables_differing" in summary:
            for t, per in list(summary["tables_differing"].items())[:5]:
                for n, detail in per.items():
                    print(f"  table {t} on {n}: " + detail.replace("\n", "\n      ")[:600])
    print(f"\nresults in {out}/results, summary in {out}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
