"""In the lane, as in the demo: the guest's CPU computes the request view right, and a
workload moving its KV caches over RDMA shows each stage where it belongs.

The first test is the lane's own canary. Under QEMU 7.2's TCG an emulated AVX2 made
numpy's argsort return permutations that do not sort, and pandas then put one request's
KV transfer in another request's deliver column (lane/run.sh turns AVX off for it)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import numpy as np
import pytest

from fabricprobe.collector.attribution.join import request_breakdown, requests_frame, stages_frame
from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.models import PRESETS
from fabricprobe.probes.responder import Responder
from fabricprobe.workload.pipeline import Host, WorkloadConfig, run_pipeline
from fabricprobe.workload.spans import SpanSender
from tests.support.fleet import open_responder
from tests.support.stages import scrambled_requests, view_mismatches


def test_the_guest_cpu_sorts_and_pivots_right(lane_hosts) -> None:
    rng = random.Random(5)
    wrong = []
    for dtype in (np.int64, np.int32, np.uint64, np.float64):
        for n in (17, 48, 100, 1000):
            values = [rng.randrange(50) for _ in range(n)]
            a = np.array(values, dtype=dtype)
            if a[np.argsort(a)].tolist() != sorted(a.tolist()):
                wrong.append(f"argsort {dtype.__name__} n={n}")
    assert wrong == [], "numpy's argsort is wrong on this CPU (check lane/run.sh's -cpu)"
    stages, requests, want = scrambled_requests(40)
    got = request_breakdown(stages_frame(stages), requests_frame(requests)).set_index("request_id")
    bad = [
        (rid, col)
        for rid, row in want.items()
        for col, seconds in row.items()
        if got.loc[rid, col] != pytest.approx(seconds, rel=1e-12, abs=1e-12)
    ]
    assert bad == []


@pytest.fixture
def responder() -> Iterator[Responder]:
    """An in-process responder on every lane address (no second interpreter to start
    under emulation); the kv_sink's RDMA WRITEs need nothing from its side."""
    with open_responder("0.0.0.0") as r:
        yield r


def test_rdma_workload_stages_equal_the_spans_it_sent(lane_hosts, responder) -> None:
    a, b, c = (Host(h.name, h.ip) for h in lane_hosts[:3])
    server = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen=""))
    server.start()
    try:
        for h in (a, b, c):
            server.api.register(pb.HostInfo(host=h.name, addresses=[h.address]))
        cfg = WorkloadConfig(
            model=PRESETS["Llama-3.1-8B"],
            prompt_tokens=16,  # 2 MiB of KV cache: a second or less under TCG
            output_tokens=4,
            decode_step_s=0.005,
            requests=8,  # as the demo: with fewer, a wrong sort can still land right
            transport="rdma",
            port=responder.port,
        )
        sender = SpanSender(f"127.0.0.1:{server.port}")
        t0 = time.monotonic()
        results = run_pipeline(
            [(a, b), (a, c)], cfg, on_request=lambda r: sender.emit(r, cfg.model.name)
        )
        sender.close()
        # soft-RoCE on an overloaded emulated VM can end a transfer in an error completion
        # (a retried WRITE answered with a NAK): one of eight is let go, and said
        ok = [r for r in results if not r.error]
        failed = [r.error for r in results if r.error]
        assert len(failed) <= 1, f"KV transfers failed: {failed}"
        view = server.attribution.analyse(max_age_s=0, window_s=600).requests
        kv = [f"{r.seconds('kv_transfer') * 1e3:.1f}" for r in ok]
        print(
            f"\nRDMA workload: {len(results)} requests in {time.monotonic() - t0:.1f} s, "
            f"KV ms {kv}; failed: {failed or 'none'}"
        )
        assert view_mismatches(ok, view) == []
    finally:
        server.stop(0)
