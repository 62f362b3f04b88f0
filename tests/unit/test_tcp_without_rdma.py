"""The TCP probe on a host without RDMA: with fabricprobe.probes.rdma (and pyverbs) made
unimportable, the probe imports, a loopback ping-pong runs through the compiled socket
loop and the responder's compiled echo, and libibverbs is never mapped into the process.

It runs in a subprocess so that the blocker sees a fresh interpreter: this process has
long imported the RDMA packages through other tests."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import importlib.abc, json, sys

    BLOCKED = ("fabricprobe.probes.rdma", "pyverbs")

    class Blocker(importlib.abc.MetaPathFinder):
        asked = []

        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                self.asked.append(name)
                raise ImportError(f"{name} is blocked: no RDMA on this host")
            return None

    blocker = Blocker()
    sys.meta_path.insert(0, blocker)

    from fabricprobe.probes import native_loop, tcp
    from fabricprobe.probes.measure import LinkParams
    from fabricprobe.probes.responder import Responder

    with Responder("127.0.0.1", 0, idle_timeout=5, grace=0.5, sessions=tcp.SESSIONS,
                   auth=None) as r:
        res = tcp.run_pingpong(LinkParams(*r.address), size=64, iters=200, warmup=10)
    with open("/proc/self/maps") as f:
        maps = f.read()
    print(json.dumps({
        "engine": res.engine,
        "count": res.summary.count,
        "lost": res.summary.lost,
        "error": res.error,
        "p50_us": res.summary.p50_us,
        "echo_native": native_loop.available(),
        "rdma_loaded": sorted(m for m in sys.modules if m.startswith(BLOCKED)),
        "blocked_asks": blocker.asked,
        "ibverbs_mapped": "libibverbs" in maps,
    }))
    """
)


def test_tcp_pingpong_runs_with_the_rdma_package_unimportable() -> None:
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["rdma_loaded"] == [] and out["blocked_asks"] == []
    assert out["error"] is None and out["lost"] == 0
    assert out["count"] == 200 and out["p50_us"] > 0
    # the compiled loop timed it (scripts/build-native.sh builds it with the RDMA engine)
    assert out["echo_native"], "run scripts/build-native.sh"
    assert out["engine"] == "native"
    assert not out["ibverbs_mapped"]


def test_the_blocker_would_catch_an_rdma_import() -> None:
    """The same blocker refuses an import of the RDMA engine, so the test above can fail."""
    probe = SCRIPT.split("from fabricprobe.probes import native_loop")[0]
    probe += "from fabricprobe.probes.rdma import native\n"
    run = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0
    assert "fabricprobe.probes.rdma is blocked" in run.stderr
