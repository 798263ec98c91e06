"""The Corosync binding against a real daemon: three members (three processes, as CPG needs)
see the same views and the same order of messages, including a fragmented 3 MB message, with
either CPG member: the Python engine's (cffi ABI mode, a Python callback per frame) and the C
engine's (bus_cpg.c, one batch per dispatch), and both at once in one group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import Cluster

pytestmark = pytest.mark.integration

MEMBER = textwrap.dedent("""
    import asyncio, hashlib, json, os, sys
    from chorus.bus.corosync import CorosyncBus
    from chorus.dataplane import native
    from chorus.bus import View

    async def main(idx, n, group):
        b = CorosyncBus(group, native=native.cpg_module())
        assert b.impl == os.environ["CHORUS_IMPL"], b.impl
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
        sends = [b.send(b"m%d-%d" % (idx, i)) for i in range(90)]
        nowait = 0
        for i in range(90, 100):  # the sender's path: one frame, no wait, or through send()
            if b.send_nowait(b"m%d-%d" % (idx, i)):
                nowait += 1
            else:
                sends.append(b.send(b"m%d-%d" % (idx, i)))
        if idx == 0:
            sends.append(b.send(os.urandom(3_000_000)))
        await asyncio.gather(*sends)
        while len(seen) < 100 * n + 1:
            await asyncio.sleep(0.02)
        print(json.dumps({"order": hashlib.md5("".join(seen).encode()).hexdigest(),
                          "count": len(seen), "quorate": views[-1][1], "nowait": nowait}), flush=True)
        await asyncio.sleep(0.5)
        await b.leave()

    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
""")


@pytest.mark.parametrize("impls", [("python",) * 3, ("c",) * 3, ("c", "python", "c")],
                         ids=["python", "c", "mixed"])
def test_three_members_agree_on_order(cluster: Cluster, impls: tuple[str, ...]) -> None:
    # the cluster fixture runs corosync
    group = "chorus-bus-test-" + "-".join(impls)
    procs = [subprocess.Popen([sys.executable, "-c", MEMBER, str(i), "3", group],
                              env={**os.environ, "CHORUS_IMPL": impl},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, impl in enumerate(impls)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert len({o["order"] for o in outs}) == 1
    assert all(o["count"] == 301 and o["quorate"] for o in outs)
    assert any(o["nowait"] for o in outs)  # send_nowait's frames went out too
