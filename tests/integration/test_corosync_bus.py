"""The Corosync binding against a real daemon: three members (three processes, as CPG needs)
see the same views and the same order of messages, including a fragmented 3 MB message."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import Cluster

pytestmark = pytest.mark.integration

MEMBER = textwrap.dedent("""
    import asyncio, hashlib, json, os, sys
    from chorus.bus.corosync import CorosyncBus
    from chorus.bus import View

    async def main(idx, n, group):
        b = CorosyncBus(group)
        await b.join()
        seen, views = [], []
        async def reader():
            async for ev in b.events():
                if isinstance(ev, View):
                    views.append([len(ev.members), ev.quorate])
                else:
                    seen.append(hashlib.md5(ev.payload).hexdigest())
        t = asyncio.create_task(reader())
        while not views or views[-1][0] < n:
            await asyncio.sleep(0.02)
        sends = [b.send(b"m%d-%d" % (idx, i)) for i in range(100)]
        if idx == 0:
            sends.append(b.send(os.urandom(3_000_000)))
        await asyncio.gather(*sends)
        while len(seen) < 100 * n + 1:
            await asyncio.sleep(0.02)
        print(json.dumps({"order": hashlib.md5("".join(seen).encode()).hexdigest(),
                          "count": len(seen), "quorate": views[-1][1]}), flush=True)
        await asyncio.sleep(0.5)
        await b.leave()

    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
""")


def test_three_members_agree_on_order(cluster: Cluster) -> None:  # the cluster fixture runs corosync
    procs = [subprocess.Popen([sys.executable, "-c", MEMBER, str(i), "3", "chorus-bus-test"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert len({o["order"] for o in outs}) == 1
    assert all(o["count"] == 301 and o["quorate"] for o in outs)
