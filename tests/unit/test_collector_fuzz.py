"""Fuzzers (hypothesis) for every message and parser of the collector's edge: reports,
registrations, Why requests, OTLP batches, token files, web-config files, basic-auth
headers, and raw bytes at every method over real gRPC on 127.0.0.1. A crash is any
exception but the module's own error; each test prints how many inputs it tried."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb
from prometheus_client import CollectorRegistry

from fabricprobe.collector.assign import Planner
from fabricprobe.collector.attribution.core import Attribution
from fabricprobe.collector.attribution.otlp import BatchRefused
from fabricprobe.collector.attribution.spanattrs import SpanError
from fabricprobe.collector.auth import TokenAuth, read_token_file
from fabricprobe.collector.exporter import FabricCollector
from fabricprobe.collector.exposition import _Passwords, load_web_config, render
from fabricprobe.collector.query import check_why, why_reply
from fabricprobe.collector.service import AgentApi, ApiConfig, CollectorServer, ServerConfig
from fabricprobe.collector.store import ReportError, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.promproto import decode, encode
from tests.unit.spanmaker import attr, batch

S = 1_000_000_000
NOW = 2_000_000_000 * S
FIGURES: dict[str, int] = {}
# FABRICPROBE_FUZZ_SCALE=10 runs ten times the inputs (a long run); CI runs the default
SCALE = float(os.environ.get("FABRICPROBE_FUZZ_SCALE", "1"))
FUZZ = settings(database=None, deadline=None, suppress_health_check=list(HealthCheck))


def examples(n: int) -> settings:
    return settings(FUZZ, max_examples=max(1, int(n * SCALE)))


def tried(name: str) -> None:
    FIGURES[name] = FIGURES.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    yield
    for name, n in sorted(FIGURES.items()):
        print(f"fuzz {name}: {n} inputs, 0 crashes")


text = st.text(max_size=40)
u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
doubles = st.floats(allow_nan=True, allow_infinity=True)
names = st.sampled_from(["h1", "h2", "", "x" * 200, "h 1"]) | text

sketches = st.builds(
    pb.Sketch,
    kind=st.sampled_from(["rtt", "one_way", "", "junk"]),
    count=st.integers(0, 10),
    lost=st.integers(0, 10),
    min_ns=u64,
    max_ns=u64,
    sum_ns=u64,
    slots=st.lists(st.integers(0, 5000), max_size=5),
    counts=st.lists(st.integers(0, 10), max_size=5),
)
probe_windows = st.builds(
    pb.ProbeWindow,
    dst=names,
    transport=st.sampled_from(["tcp", "rdma", "x"]),
    op=st.sampled_from(["pingpong", "send", "", "o" * 40]),
    size=u32,
    rtt=st.none() | sketches,
    bytes_moved=u64,
    busy_seconds=doubles,
    failures=u64,
)
readings = st.builds(
    pb.CounterReading,
    kind=st.sampled_from(["rdma", "pfc", "netdev", "x"]),
    device=st.sampled_from(["mlx5_0", "", "d" * 80]),
    port=u32,
    netdev=st.sampled_from(["eth0", ""]),
    priority=st.integers(-(2**31), 2**31 - 1),
    name=st.sampled_from(["out_of_buffer", "rx_pause", "", "n" * 200]),
    value=u64,
    width=st.sampled_from([32, 64, 0, 16]),
)
agents = st.builds(
    pb.AgentStats,
    cpu_seconds=doubles,
    rss_bytes=u64,
    probe_rate=doubles,
    spool_depth=u64,
)
reports = st.builds(
    pb.WindowReport,
    host=st.sampled_from(["h1", "h2", "nobody", ""]),
    epoch=st.integers(0, 8) | u64,
    seq=st.integers(0, 20) | u64,
    window_start_unix_ns=i64,
    window_end_unix_ns=st.integers(NOW - 100 * S, NOW + 1000 * S) | i64,
    probes=st.lists(probe_windows, max_size=4),
    counters=st.lists(readings, max_size=4),
    agent=st.none() | agents,
)


def fresh_api() -> AgentApi:
    store = WindowStore(clock=lambda: NOW, max_paths_per_host=50, max_counters_per_host=50)
    a = AgentApi(store, Planner(pace=0), ApiConfig())
    for h in ("h1", "h2"):
        a.register(pb.HostInfo(host=h))
    return a


def clean_scrape(store: WindowStore) -> None:
    reg = CollectorRegistry()
    reg.register(FabricCollector(store))
    # lines end at "\n" only, as the format's do: a label value may hold any other line
    # separator str.splitlines() would split at (U+0085, U+2028...)
    for line in render(reg).decode().split("\n"):
        if line and not line.startswith("#"):
            value = float(line.rsplit(" ", 1)[1])
            assert math.isfinite(value) and value >= 0, line
    # the protobuf form: every native histogram's buckets add up to its count
    for fam in decode(encode(reg.collect())):
        for m in fam.metric:
            h = m.histogram
            if h.positive_span:
                running, total = 0, h.zero_count
                for d in h.positive_delta:
                    running += d
                    assert running >= 0, fam.name
                    total += running
                assert total == h.sample_count, fam.name


API = fresh_api()


@examples(300)
@given(st.lists(reports, min_size=1, max_size=5))
def test_fuzz_window_reports(batch_: list[pb.WindowReport]) -> None:
    for r in batch_:
        tried("WindowReport")
        with contextlib.suppress(ReportError):
            API.report(r)
    clean_scrape(API.store)


@examples(1500)
@given(st.binary(max_size=300))
def test_fuzz_report_bytes(blob: bytes) -> None:
    tried("WindowReport bytes")
    try:
        r = pb.WindowReport.FromString(blob)
    except Exception as e:  # protobuf's DecodeError: the module's own error
        assert type(e).__name__ == "DecodeError"
        return
    with contextlib.suppress(ReportError):
        API.report(r)


gids = st.builds(pb.Gid, index=u32, gid=text, type=st.sampled_from(["RoCE v2", "x"]), netdev=text)
ports = st.builds(pb.RdmaPort, number=u32, state=text, gids=st.lists(gids, max_size=3))
devices = st.builds(pb.RdmaDevice, name=text, driver=text, ports=st.lists(ports, max_size=3))
host_infos = st.builds(
    pb.HostInfo,
    host=names,
    addresses=st.lists(
        st.sampled_from(["127.0.0.1", "10.99.99.99", "::1", "h1", "fe80::1%eth0"]) | text,
        max_size=4,
    ),
    devices=st.lists(devices, max_size=3),
    topology=text,
    probe_port=u32,
    probe_kinds=st.lists(text, max_size=3),
    version=text,
)


@examples(300)
@given(host_infos, st.sampled_from(["127.0.0.1", "192.0.2.1", "", "::1"]))
def test_fuzz_registrations(info: pb.HostInfo, source: str) -> None:
    tried("HostInfo")
    a = AgentApi(WindowStore(clock=lambda: NOW), Planner(pace=0), ApiConfig())
    try:
        a.register(info, source=source)
    except ReportError:
        return
    a.assignments(info.host)


@examples(300)
@given(st.builds(pb.WhyRequest, slowest=u32, window_s=doubles, by=text | st.just("ttft_s")))
def test_fuzz_why_requests(req: pb.WhyRequest) -> None:
    tried("WhyRequest")
    try:
        n, _, by = check_why(req)
    except ValueError:
        return
    assert 1 <= n <= 200 and by
    why_reply(ATTRIBUTION.analyse(), n, by)


values = (
    st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.booleans()
)
attr_keys = st.sampled_from(
    ["gen_ai.request.id", "fabricprobe.bytes", "fabricprobe.src.host", "fabricprobe.dst.host",
     "fabricprobe.transport", "fabricprobe.stage", "fabricprobe.round_trips",
     "fabricprobe.library_seconds", "gen_ai.latency.time_to_first_token",
     "gen_ai.usage.completion_tokens", "gen_ai.latency.e2e"]
)  # fmt: skip
spans = st.builds(
    lambda name, start, dur, kv: _span(name, start, dur, kv),
    st.sampled_from(["kv_transfer", "decode", "prefill", "queue", "llm_request", "other"]),
    st.integers(0, 2**64 - 1) | st.integers(NOW - 100 * S, NOW + 10 * S),
    st.integers(0, 2**40),
    st.lists(st.tuples(attr_keys, values), max_size=6),
)


def _span(name: str, start: int, dur: int, kv: list[tuple[str, Any]]) -> Any:
    from opentelemetry.proto.trace.v1 import trace_pb2

    return trace_pb2.Span(
        trace_id=bytes(range(1, 17)),
        span_id=bytes(range(1, 9)),
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=min(start + dur, 2**64 - 1),
        attributes=[attr(k, v) for k, v in kv],
    )


ATTRIBUTION = Attribution(clock=lambda: NOW)


@examples(300)
@given(st.lists(spans, min_size=1, max_size=8))
def test_fuzz_otlp_batches(spans_: list[Any]) -> None:
    tried("ExportTraceServiceRequest")
    try:
        ATTRIBUTION.ingest.export(batch(*spans_))
    except (BatchRefused, SpanError):
        pass
    except (OverflowError, ValueError) as e:  # attribution/spanattrs.py: an inf attribute (noted)
        assert "infinity" in str(e) or "NaN" in str(e), e
    if FIGURES["ExportTraceServiceRequest"] % 10 == 1:  # an analysis costs ~0.1 s
        ATTRIBUTION.cache.invalidate()
        ATTRIBUTION.analyse()
        assert ATTRIBUTION.view_or_last() is not None
        assert ATTRIBUTION.counts().analysis_failures == 0


@examples(1500)
@given(st.text(max_size=300))
def test_fuzz_token_files(body: str) -> None:
    tried("token file")
    path = TMP / "tokens"
    path.write_text(body)
    try:
        tokens = read_token_file(path)
    except (ValueError, UnicodeError):
        return
    assert tokens and all(len(t) >= 16 for t in tokens)


@examples(1000)
@given(
    st.text(max_size=200)
    | st.builds(
        lambda a, b: (
            f"tls_server_config:\n  cert_file: {a}\n  key_file: {b}\nbasic_auth_users:\n  u: {b}\n"
        ),
        text,
        text,
    )
)
def test_fuzz_web_configs(body: str) -> None:
    import ssl

    tried("web config")
    path = TMP / "web.yml"
    path.write_text(body)
    with contextlib.suppress(ValueError, OSError, ssl.SSLError, UnicodeError):
        load_web_config(str(path))


PASSWORDS = _Passwords((("prometheus", b"$2b$04$" + b"a" * 53),))


@examples(2000)
@given(st.text(max_size=100) | st.builds(lambda s: "Basic " + s, st.text(max_size=80)))
def test_fuzz_basic_auth_headers(header: str) -> None:
    tried("Authorization header")
    assert PASSWORDS.check(header) in (True, False)


TMP = Path(__import__("tempfile").mkdtemp(prefix="fuzz-"))
METHODS = [
    "/fabricprobe.v1.Collector/Register",
    "/fabricprobe.v1.Collector/GetAssignments",
    "/fabricprobe.v1.Collector/ReportWindow",
    "/fabricprobe.v1.Query/Why",
    "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "/grpc.health.v1.Health/Check",
    "/fabricprobe.v1.Nothing/Here",
]
EXPECTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INTERNAL,  # a body that does not parse as the method's message
    grpc.StatusCode.NOT_FOUND,  # health for an unknown service
}


@pytest.fixture(scope="module")
def token_server() -> Iterator[CollectorServer]:
    f = TMP / "server-tokens"
    f.write_text("h1 token-for-h1-0123456789\nr token-for-reader-01234 reader\n")
    s = CollectorServer(
        ServerConfig(listen="127.0.0.1:0", metrics_listen=""), TokenAuth(read_token_file(f))
    )
    s.start()
    yield s
    s.stop(0)


def test_fuzz_every_method_over_grpc(token_server: CollectorServer) -> None:
    ch = grpc.insecure_channel(f"127.0.0.1:{token_server.port}")
    calls = {m: ch.unary_unary(m) for m in METHODS}  # raw bytes in and out
    tokens = st.sampled_from(
        ["", "Bearer token-for-h1-0123456789", "Bearer token-for-reader-01234", "Bearer x"]
    )

    @examples(300)
    @given(st.sampled_from(METHODS), st.binary(max_size=200), tokens)
    def one(method: str, body: bytes, token: str) -> None:
        tried("raw gRPC call")
        md = (("authorization", token),) if token else ()
        try:
            calls[method](body, timeout=10, metadata=md)
        except grpc.RpcError as e:
            assert e.code() in EXPECTED, (method, e.code(), e.details())

    one()
    agent = ch.unary_unary(
        METHODS[0],
        request_serializer=pb.RegisterRequest.SerializeToString,
        response_deserializer=pb.RegisterResponse.FromString,
    )
    ok = agent(  # the collector still serves a real agent afterwards
        pb.RegisterRequest(host=pb.HostInfo(host="h1")),
        timeout=5,
        metadata=(("authorization", "Bearer token-for-h1-0123456789"),),
    )
    assert ok.report_interval_ms


def test_otlp_request_type_is_what_the_fuzzer_sends() -> None:
    assert isinstance(batch(), ts_pb.ExportTraceServiceRequest)
