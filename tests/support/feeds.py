"""What the dashboards need that loopback agents cannot make: `ethtool -S` text whose pause
counters rise, RDMA windows of a fixture host pair, check verdicts of a fixture ToR, and
stage spans from the OpenTelemetry SDK."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fabricprobe.collector.service import CollectorServer
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch
from fabricprobe.probes.ethtool import CommandResult
from tests.support.fleet import FIXTURES

RDMA_HOSTS = ("rdma-a", "rdma-b")


def rising_ethtool() -> Any:
    """`ethtool -S` text of a real mlx5 port whose PFC pause counters rise on every read."""
    text = (FIXTURES / "ethtool" / "mlx5_core.txt").read_text()
    reads = [0]

    def run(argv: Sequence[str], timeout: float) -> CommandResult:
        reads[0] += 1
        bumped = re.sub(
            r"^(\s*(?:rx|tx)_prio3_pause(?:_duration)?: )(\d+)$",
            lambda m: f"{m.group(1)}{int(m.group(2)) + reads[0] * 200_000}",
            text,
            flags=re.M,
        )
        return CommandResult(0, bumped)

    return run


def fixture_rdma_windows(
    server: CollectorServer | Callable[[str], CollectorServer], seq: int
) -> None:
    """Windows of a fixture host pair that probes over RDMA (RC SEND, UD, WRITE bandwidth)
    and TCP, with its engines' NIXL telemetry: the figures loopback cannot measure, sent
    through the collector's API. SERVER is the collector, or gives the one (shard) each
    host reports to; a host that collector does not know yet registers first."""
    now = time.time_ns()
    for src, dst in (("rdma-a", "rdma-b"), ("rdma-b", "rdma-a")):
        to = server if isinstance(server, CollectorServer) else server(src)
        if src not in to.store.hosts:
            to.api.register(pb.HostInfo(host=src, addresses=["127.0.0.9"], topology="tor-b"))
        report = pb.WindowReport(
            host=src, epoch=7, seq=seq, window_start_unix_ns=now - 10**9, window_end_unix_ns=now
        )
        for transport, op, base in (("rdma", "send", 4_000), ("tcp", "pingpong", 30_000)):
            sk = LatencySketch()
            for i in range(200):
                sk.record(base + 13 * i)
            report.probes.add(dst=dst, transport=transport, op=op, size=64, rtt=to_wire(sk))
        report.probes.add(
            dst=dst,
            transport="rdma",
            op="write",
            size=65536,
            bytes_moved=5 * 2**30 * seq,
            busy_seconds=0.5 * seq,
        )
        # NIXL's telemetry of an engine on each host: 2 transfers of 8 MiB a window, each
        # 4 ms in the transfer library (agent/nixl.py's readings)
        for name, per_window in (
            ("transfers", 2),
            ("bytes", 2 * (8 << 20)),
            ("xfer_time_us", 8_000),
            ("post_time_us", 200),
            ("errors", 0),
        ):
            report.counters.add(
                kind="nixl", device="engine", name=name, value=per_window * seq, width=64
            )
        to.api.report(report)


def fixture_checks(server: CollectorServer) -> None:
    """Scheduled `probe validate` verdicts of four fixture hosts on one ToR, one with
    MTU 1500 among 9000 (a FAIL, and a difference from its ToR), through the API."""
    for i in range(4):
        host = f"cfg-{i}"
        server.api.register(pb.HostInfo(host=host, addresses=["127.0.0.9"], topology="tor-c"))
        mtu = "1500/1024" if i == 3 else "9000/4096"
        report = pb.CheckReport(host=host, taken_unix_ns=time.time_ns(), policy="p")
        report.checks.add(check="pfc", device="mlx5_0", port=1, status="PASS", value="3")
        report.checks.add(
            check="mtu", device="mlx5_0", port=1, status="FAIL" if i == 3 else "PASS", value=mtu
        )
        server.drift.take(report)


def send_spans(
    endpoint: str, src: str, dst: str, n: int, batch: int = 0, transport: str = "tcp"
) -> None:
    """Requests as our workload sends them: a vLLM-style request span and stage children,
    the KV transfer naming its path and TRANSPORT; request ids carry BATCH."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "prom-test"}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=10))
    )
    tracer = provider.get_tracer("test")
    first = time.time_ns() - 8 * 10**9  # spread over several probe windows
    for i in range(n):
        t = first + i * (8 * 10**9 // n)
        stages = {
            "queue": 1_000_000,
            "prefill": 20_000_000,
            "kv_transfer": 3_000_000 + i * 50_000,
            "decode": 40_000_000,
            "detokenize": 500_000,
            "deliver": 200_000,
        }
        ttft = sum(list(stages.values())[:3])
        rid = f"req-{transport}-{batch}-{i}"
        root = tracer.start_span(
            "llm_request",
            start_time=t,
            attributes={
                "gen_ai.request.id": rid,
                "gen_ai.usage.prompt_tokens": 128,
                "gen_ai.usage.completion_tokens": 16,
                "gen_ai.latency.time_to_first_token": ttft / 1e9,
                "gen_ai.latency.e2e": sum(stages.values()) / 1e9,
            },
        )
        ctx = trace.set_span_in_context(root)
        for stage, dur in stages.items():
            attrs: dict[str, Any] = {"gen_ai.request.id": rid}
            if stage == "kv_transfer":
                attrs |= {
                    "fabricprobe.src.host": src,
                    "fabricprobe.dst.host": dst,
                    "fabricprobe.transport": transport,
                    "fabricprobe.bytes": 8 << 20,
                }
            span = tracer.start_span(stage, context=ctx, start_time=t, attributes=attrs)
            t += dur
            span.end(end_time=t)
        root.end(end_time=t)
    provider.force_flush(10_000)
    provider.shutdown()


def live_feed(
    stop: threading.Event,
    spans_to: Callable[[], str],
    windows_to: CollectorServer | Callable[[str], CollectorServer],
    src: str,
    dst: str,
    seq: int = 1,
) -> threading.Thread:
    """A live fleet until STOP: every 2 s, 20 requests over SRC->DST whose spans go to the
    OTLP endpoint SPANS_TO() gives (asked each time), a round of the fixture RDMA pair's
    windows (fixture_rdma_windows, to WINDOWS_TO), their seq from SEQ up, and 5 requests
    over that pair's RDMA path, whose measured bandwidth lets the join say what the
    fabric explains of their KV wait (the loopback agents plan no bandwidth probe)."""

    def feed() -> None:
        n = seq
        while not stop.is_set():
            send_spans(spans_to(), src, dst, 20, batch=n)
            fixture_rdma_windows(windows_to, n)
            send_spans(spans_to(), RDMA_HOSTS[0], RDMA_HOSTS[1], 5, batch=n, transport="rdma")
            n += 1
            stop.wait(2.0)

    feeder = threading.Thread(target=feed, name="feed", daemon=True)
    feeder.start()
    return feeder
