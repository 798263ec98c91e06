"""The CPU one CPG member spends per message, for each member of bus/corosync.py: the Python
engine's (cffi ABI mode, a Python callback per frame) and the C engine's (native/bus_cpg.c, one
batch per cpg_dispatch). docs/NATIVE.md, "Step 2, first part".

One process per member and round joins a group alone on a Corosync of its own, sends MESSAGES
messages of SIZE bytes (``send_nowait``, ``send`` when the bus says try again) while it takes
its deliveries as the coordinator's bus loop does (``batches``), and reports its own CPU (user
and system, the process's threads) per message from the first send to the last delivery, and
its voluntary context switches. Rounds alternate the members. Run as root in a network and
mount namespace of its own (it starts Corosync with the local cluster's configuration):

    unshare --net --mount sh -c 'mount -t tmpfs -o mode=0755 tmpfs /run && ip link set lo up &&
      exec .venv/bin/python bench/cpg_member.py --rounds 5'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MEMBER = r"""
import asyncio, json, os, resource, sys, time
from chorus.bus import View
from chorus.bus.corosync import CorosyncBus
from chorus.dataplane import native

async def main(n, size):
    b = CorosyncBus("chorus-cpg-bench", native=native.cpg_module())
    await b.join()
    got = 0
    done = asyncio.get_running_loop().create_future()
    async def reader():
        nonlocal got
        async for batch in b.batches():
            for ev in batch:
                if not isinstance(ev, View):
                    got += 1
            if got >= n and not done.done():
                done.set_result(None)
    task = asyncio.create_task(reader())
    await asyncio.sleep(0.5)  # the first view
    payload = os.urandom(size)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    for i in range(n):
        if not b.send_nowait(payload):
            await b.send(payload)
        if i % 64 == 63:
            await asyncio.sleep(0)  # let deliveries in, as the coordinator's loop does
    await done
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(json.dumps({"impl": b.impl, "cpu_us": cpu * 1e6 / n, "vcsw": (r1.ru_nvcsw - r0.ru_nvcsw) / n,
                      "wall_us": (t1 - t0) * 1e6 / n}), flush=True)
    task.cancel()
    await b.leave()

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--size", type=int, default=200)
    args = ap.parse_args()
    from chorus.testkit.localcluster import COROSYNC_CONF, SERVICE_USER
    work = Path(tempfile.mkdtemp(prefix="chorus-cpgbench-"))
    conf = work / "corosync.conf"
    conf.write_text(COROSYNC_CONF.format(name="cpgbench", log=work / "corosync.log", user=SERVICE_USER))
    binary = shutil.which("corosync") or "/usr/sbin/corosync"
    daemon = subprocess.Popen([binary, "-f", "-c", str(conf)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(3)
        results: dict[str, list[dict[str, float]]] = {"python": [], "c": []}
        for _ in range(args.rounds):
            for impl in results:
                out = subprocess.run([sys.executable, "-c", MEMBER, str(args.messages), str(args.size)],
                                     env={**os.environ, "CHORUS_IMPL": impl}, capture_output=True, text=True,
                                     timeout=300, check=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                assert r["impl"] == impl, r
                results[impl].append(r)
                print(impl, json.dumps(r), file=sys.stderr)
        for impl, rs in results.items():
            print(f"{impl:7} cpu µs/message median {statistics.median(r['cpu_us'] for r in rs):6.1f}"
                  f"  vcsw/message {statistics.median(r['vcsw'] for r in rs):5.3f}"
                  f"  wall µs/message {statistics.median(r['wall_us'] for r in rs):6.1f}"
                  f"  rounds (cpu µs) {[round(r['cpu_us'], 1) for r in rs]}")
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
