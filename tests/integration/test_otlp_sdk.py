"""Spans from the real OpenTelemetry SDK and OTLP exporter reach the collector's receiver,
join with probe windows measured on loopback, and show on /metrics over HTTP."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import pytest

from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.models import PRESETS
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.responder import Responder
from fabricprobe.probes.tcp import run_pingpong
from fabricprobe.workload.pipeline import Host, WorkloadConfig, run_pipeline
from fabricprobe.workload.spans import SpanSender
from tests.support.fleet import open_responder, wait_for


@pytest.fixture
def collector() -> Iterator[CollectorServer]:
    server = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"))
    server.start()
    yield server
    server.stop(0)


@pytest.fixture
def responder() -> Iterator[Responder]:
    with open_responder() as r:
        yield r


def scrape(server: CollectorServer) -> dict[str, float]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_sdk_spans_arrive_join_and_show_on_metrics(
    collector: CollectorServer, responder: Responder
) -> None:
    a, b = Host("pre-a", "127.0.0.1"), Host("dec-b", "127.0.0.1")
    collector.api.register(pb.HostInfo(host="pre-a", addresses=["127.0.0.1"]))
    t0 = time.time_ns()
    cfg = WorkloadConfig(
        model=PRESETS["Qwen2.5-7B"],
        prompt_tokens=64,
        output_tokens=4,
        prefill_s_per_token=1e-5,
        decode_step_s=0.001,
        requests=6,
        transport="tcp",
        port=responder.port,
    )
    sender = SpanSender(f"127.0.0.1:{collector.port}")
    results = run_pipeline([(a, b)], cfg, on_request=lambda r: sender.emit(r, cfg.model.name))
    sender.close()
    assert [r.error for r in results] == [None] * 6
    assert {r.kv_bytes for r in results} <= {cfg.model.kv_bytes(n) for n in range(32, 97)}

    # the fabric figures of the same path, measured now, as an agent would report them
    rtt = run_pingpong(
        LinkParams("127.0.0.1", responder.port, bind="127.0.0.1"), iters=50, warmup=5
    )
    report = pb.WindowReport(
        host="pre-a", epoch=1, seq=1, window_start_unix_ns=t0, window_end_unix_ns=time.time_ns()
    )
    report.probes.add(dst="dec-b", transport="tcp", op="pingpong", size=64, rtt=to_wire(rtt.sketch))
    collector.api.report(report)

    # the requests' analysis shows once they settle: a few seconds after their last span
    wait_for(
        lambda: "fabricprobe_throughput_tokens_per_second" in scrape(collector),
        what="the settled requests on /metrics",
    )
    m = scrape(collector)
    assert m["fabricprobe_otlp_spans_received_total"] == 6 * 7
    assert m["fabricprobe_otlp_spans_rejected_total"] == 0
    assert m['fabricprobe_stage_duration_seconds_count{stage="kv_transfer"}'] == 6
    key = 'fabricprobe_kv_transfer_seconds_count{dst="dec-b",src="pre-a",transport="tcp"}'
    assert m[key] == 6
    assert m["fabricprobe_throughput_tokens_per_second"] > 0
    assert 'fabricprobe_path_fabric_bound{dst="dec-b",src="pre-a",transport="tcp"}' in m

    kv = collector.attribution.analyse(max_age_s=0).kv
    assert len(kv) == 6 and kv["rtt_p99_s"].notna().all()
    assert (kv["rtt_p99_s"] * 1e6).between(1, 100_000).all()  # a loopback RTT, in seconds
