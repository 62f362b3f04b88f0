"""The agent API: a thin gRPC servicer over plain objects, and the server around it.

`AgentApi` does the work (register, assignments, take a report) and knows nothing of
gRPC; `CollectorServicer` checks who is calling, hands each message to it and turns
its errors into status codes whose details say what was wrong. `CollectorServer`
wires the servicer, health, reflection, /metrics and graceful shutdown together.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from fabricprobe.collector.assign import HostSpec, PlanConfig, Planner
from fabricprobe.collector.attribution_exporter import attach_attribution
from fabricprobe.collector.auth import Authenticator, AuthError, Insecure
from fabricprobe.collector.exporter import FabricCollector
from fabricprobe.collector.exposition import serve_metrics
from fabricprobe.collector.linking import MatchConfig
from fabricprobe.collector.otlp_http import serve_otlp_http
from fabricprobe.collector.rpcstats import RpcStats, TimingInterceptor
from fabricprobe.collector.store import ReportError, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc

log = logging.getLogger("fabricprobe.collector")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Collector"].full_name
MAX_MESSAGE_BYTES = 4 << 20  # a window of 32 peers x 3 kinds is ~100 KiB; 4 MiB is ample
MAX_ADDRESSES = 16
MAX_DEVICES = 32


class RateLimited(Exception):
    """A host sent more reports than its rate allows."""


class _Bucket:
    """Token bucket: RATE per second, up to BURST at once."""

    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst, self.tokens, self.last = rate, burst, burst, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class ApiConfig:
    report_interval_ms: int = 10_000
    reports_per_second: float = 50.0  # per host; replays after an outage come in bursts
    report_burst: float = 500.0
    plan: PlanConfig = field(default_factory=PlanConfig)


def host_spec(info: pb.HostInfo) -> HostSpec:
    """The planner's view of a registering host: its first address, and the RoCE v2 GID
    that maps one of its addresses (else its first RoCE v2 GID)."""
    device = gid = ""
    mapped = {f"0000:0000:0000:0000:0000:ffff:{_v4_hex(a)}": a for a in info.addresses}
    for d in info.devices:
        for p in d.ports:
            for g in p.gids:
                if g.type != "RoCE v2":
                    continue
                if g.gid in mapped:
                    device, gid = d.name, g.gid
                    break
                if not gid:
                    device, gid = d.name, g.gid
    return HostSpec(
        name=info.host,
        topology=info.topology,
        address=info.addresses[0] if info.addresses else info.host,
        port=info.probe_port,
        kinds=frozenset(info.probe_kinds),
        device=device,
        gid=gid,
    )


class AgentApi:
    """Register, assignments and reports, without gRPC (tests and benchmarks use it bare)."""

    def __init__(self, store: WindowStore, planner: Planner, cfg: ApiConfig) -> None:
        self.store, self.planner, self.cfg = store, planner, cfg
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()
        self._sent: dict[str, pb.Assignments] = {}  # host -> its current assignments

    def register(self, info: pb.HostInfo) -> pb.RegisterResponse:
        _check_host_info(info)
        self.store.register(info)
        self.planner.upsert(host_spec(info))
        return pb.RegisterResponse(
            report_interval_ms=self.cfg.report_interval_ms,
            assignments=self.assignments(info.host),
        )

    def assignments(self, host: str) -> pb.Assignments:
        """HOST's assignments, built once per generation."""
        gen = self.planner.generation(host)
        with self._lock:
            cached = self._sent.get(host)
        if cached is not None and cached.generation == gen:
            return cached
        gen, targets = self.planner.assignments(host)
        msg = pb.Assignments(
            host=host,
            generation=gen,
            probe_budget=self.cfg.plan.bursts_per_second,
            targets=[
                pb.ProbeTarget(
                    dst=t.dst,
                    address=t.address,
                    port=t.port,
                    kind=t.kind,
                    size=t.size,
                    interval_ms=t.interval_ms,
                    count=t.exchanges,
                    device=t.device,
                    gid=t.gid,
                )
                for t in targets
            ],
        )
        with self._lock:
            self._sent[host] = msg
        return msg

    def report(self, report: pb.WindowReport) -> pb.Ack:
        """Take one report; raises RateLimited or ReportError."""
        with self._lock:
            bucket = self._buckets.get(report.host)
            if bucket is None:
                bucket = self._buckets[report.host] = _Bucket(
                    self.cfg.reports_per_second, self.cfg.report_burst
                )
            allowed = bucket.take()
        if not allowed:
            raise RateLimited(
                f"host {report.host} exceeds {self.cfg.reports_per_second:g} reports/s"
            )
        res = self.store.take(report)
        return pb.Ack(
            epoch=report.epoch,
            seq=report.seq,
            duplicate=res.duplicate,
            assignment_generation=self.planner.generation(report.host),
        )

    def expire(self) -> list[str]:
        """Forget hosts silent too long and replan without them; return their names."""
        gone = self.store.forget_idle()
        stale = [h for h in self.planner.hosts() if h not in self.store.hosts]
        self.planner.remove([*gone, *stale])
        with self._lock:
            for h in [*gone, *stale]:
                self._sent.pop(h, None)
                self._buckets.pop(h, None)
        return gone


def _v4_hex(address: str) -> str:
    """`10.0.0.2` -> `0a00:0002`, the tail of an IPv4-mapped GID as sysfs prints it."""
    try:
        raw = bytes(int(x) for x in address.split("."))
    except ValueError:
        return "-"
    return f"{raw[:2].hex()}:{raw[2:].hex()}" if len(raw) == 4 else "-"


def _check_host_info(info: pb.HostInfo) -> None:
    if not info.host or len(info.host) > 253 or any(c.isspace() for c in info.host):
        raise ReportError(f"bad host name {info.host[:60]!r}")
    if len(info.addresses) > MAX_ADDRESSES or len(info.devices) > MAX_DEVICES:
        raise ReportError("too many addresses or devices")
    if not 0 <= info.probe_port < 65536:
        raise ReportError("probe_port out of range")


class CollectorServicer(pb_grpc.CollectorServicer):
    """gRPC edge: authenticate, check the caller speaks for itself, delegate to AgentApi."""

    def __init__(self, api: AgentApi, auth: Authenticator) -> None:
        self.api, self.auth = api, auth

    def _caller(self, context: grpc.ServicerContext, claimed: str) -> None:
        try:
            self.auth.check(context, claimed)
        except AuthError as e:
            context.abort(e.code, str(e))

    def Register(
        self, request: pb.RegisterRequest, context: grpc.ServicerContext
    ) -> pb.RegisterResponse:
        self._caller(context, request.host.host)
        try:
            resp = self.api.register(request.host)
        except ReportError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"register: {e}")
        log.info("registered host=%s addresses=%s", request.host.host, list(request.host.addresses))
        return resp

    def GetAssignments(
        self, request: pb.AssignmentsRequest, context: grpc.ServicerContext
    ) -> pb.Assignments:
        self._caller(context, request.host)
        if request.host not in self.api.store.hosts:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{request.host}: register first")
        return self.api.assignments(request.host)

    def Report(
        self, request_iterator: Iterator[pb.WindowReport], context: grpc.ServicerContext
    ) -> Iterator[pb.Ack]:
        for report in request_iterator:
            yield self._take(report, context)

    def ReportWindow(self, request: pb.WindowReport, context: grpc.ServicerContext) -> pb.Ack:
        return self._take(request, context)

    def _take(self, report: pb.WindowReport, context: grpc.ServicerContext) -> pb.Ack:
        self._caller(context, report.host)
        try:
            return self.api.report(report)
        except RateLimited as e:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except ReportError as e:
            code = (
                grpc.StatusCode.FAILED_PRECONDITION
                if "not registered" in str(e)
                else grpc.StatusCode.INVALID_ARGUMENT
            )
            context.abort(code, f"report seq {report.seq}: {e}")
        raise AssertionError("context.abort returned")  # pragma: no cover


@dataclass
class ServerConfig:
    listen: str = "127.0.0.1:4794"
    metrics_listen: str = "127.0.0.1:9794"  # "" serves no /metrics
    otlp_http_listen: str = ""  # OTLP over HTTP (POST /v1/traces); "" serves none
    match: MatchConfig = field(default_factory=MatchConfig)  # engine sides -> agent hosts
    workers: int = 64
    grace: float = 5.0
    stale_after: float = 30.0
    forget_after: float = 600.0
    api: ApiConfig = field(default_factory=ApiConfig)


def split_hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r}: expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


class CollectorServer:
    """The running collector: gRPC API, health, reflection and /metrics."""

    def __init__(self, cfg: ServerConfig, auth: Authenticator | None = None) -> None:
        self.cfg = cfg
        self.auth = auth or Insecure()
        self.store = WindowStore(stale_after=cfg.stale_after, forget_after=cfg.forget_after)
        self.planner = Planner(cfg.api.plan)
        self.api = AgentApi(self.store, self.planner, cfg.api)
        self.rpc_stats = RpcStats()
        self.registry = CollectorRegistry()
        self.registry.register(FabricCollector(self.store, self.rpc_stats))
        self.health = health.HealthServicer()
        self.port = 0
        self.metrics_port = 0
        self._server: grpc.Server | None = None
        self._http: Any = None
        self._otlp_http: Any = None
        self.otlp_http_port = 0
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    def start(self) -> None:
        opts = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.cfg.workers, thread_name_prefix="grpc"),
            options=opts,
            interceptors=[TimingInterceptor(self.rpc_stats)],
            maximum_concurrent_rpcs=self.cfg.workers * 4,
        )
        pb_grpc.add_CollectorServicer_to_server(CollectorServicer(self.api, self.auth), server)
        # OTLP stage spans joined with the fabric (collector/attribution.py)
        self.attribution = attach_attribution(
            server, self.store, self.registry, self._stop, match=self.cfg.match
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        host, port = split_hostport(self.cfg.listen)
        self.port = self.auth.add_port(server, f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {self.cfg.listen}")
        server.start()
        self._server = server
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.cfg.metrics_listen:
            mhost, mport = split_hostport(self.cfg.metrics_listen)
            self._http = serve_metrics(mhost, mport, self.registry)
            self.metrics_port = int(self._http.server_address[1])
        if self.cfg.otlp_http_listen:
            ohost, oport = split_hostport(self.cfg.otlp_http_listen)
            self._otlp_http = serve_otlp_http(ohost, oport, self.attribution.ingest)
            self.otlp_http_port = int(self._otlp_http.server_address[1])
        self._reaper = threading.Thread(target=self._reap, name="reaper", daemon=True)
        self._reaper.start()
        log.info(
            "collector listening api=%s:%d metrics=%s",
            host,
            self.port,
            f"{self.cfg.metrics_listen.rpartition(':')[0]}:{self.metrics_port}"
            if self._http
            else "off",
        )

    def _reap(self) -> None:
        every = max(0.5, min(self.cfg.stale_after, 10.0))
        while not self._stop.wait(every):
            gone = self.api.expire()
            if gone:
                log.info("forgot silent hosts=%s", gone)

    def stop(self, grace: float | None = None) -> None:
        """Drain: report NOT_SERVING, finish running calls within the grace, close."""
        self._stop.set()
        self.health.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(self.cfg.grace if grace is None else grace).wait()
            self._server = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._otlp_http is not None:
            self._otlp_http.shutdown()
            self._otlp_http.server_close()
            self._otlp_http = None
        log.info("collector stopped")

    def wait(self, until: Callable[[], bool]) -> None:
        while not until() and not self._stop.is_set():
            time.sleep(0.2)
