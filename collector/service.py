"""The agent API: a thin gRPC servicer over plain objects, and the server around it.

`AgentApi` does the work (register, assignments, take a report) and knows nothing of
gRPC; `CollectorServicer` checks who is calling, hands each message to it and turns
its errors into status codes whose details say what was wrong. `CollectorServer`
wires the servicer, health, reflection, /metrics and graceful shutdown together.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from fabricprobe.collector.assign import HostSpec, PlanConfig, Planner
from fabricprobe.collector.attribution.exporter import attach_attribution
from fabricprobe.collector.attribution.linking import MatchConfig
from fabricprobe.collector.attribution.otlp_http import serve_otlp_http
from fabricprobe.collector.attribution.settle import WHY_REQUESTS
from fabricprobe.collector.auth import (
    HOST,
    INGEST,
    READER,
    Authenticator,
    Gate,
    GateConfig,
    Insecure,
    Policy,
    http_guard,
    identity_of,
    peer_address,
)
from fabricprobe.collector.detail import DetailConfig, DetailSelector
from fabricprobe.collector.drift import DriftBook, DriftCollector, Waiver
from fabricprobe.collector.exporter import FabricCollector
from fabricprobe.collector.exposition import ScrapeStats, WebConfig, load_web_config, serve_metrics
from fabricprobe.collector.fabric.links import FabricLinks
from fabricprobe.collector.fabric.service import FabricConfig, attach_links
from fabricprobe.collector.kvshape import KvShape
from fabricprobe.collector.price import PriceConfig, kv_cost_route
from fabricprobe.collector.rails import RailCollector, check_device, rail_nics
from fabricprobe.collector.rawstore import RawStoreCollector, RawStoreConfig, RawWindowWriter
from fabricprobe.collector.rpcstats import RpcStats, TimingInterceptor
from fabricprobe.collector.shard import Shard, ShardCollector, ShardConfig
from fabricprobe.collector.store import HostState, ReportError, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc
from fabricprobe.core.shards import Member
from fabricprobe.core.web import Limits, Route, WebStats
from fabricprobe.probes.trace import CLASS_KINDS

log = logging.getLogger("fabricprobe.collector")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Collector"].full_name
QUERY_SERVICE = pb.DESCRIPTOR.services_by_name["Query"].full_name
TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
MAX_MESSAGE_BYTES = 4 << 20  # a window of 32 peers x 3 kinds is ~100 KiB; 4 MiB is ample
MAX_ADDRESSES = 16
MAX_DEVICES = 32
MAX_PORTS = 16  # per device
MAX_GIDS = 256  # per port
MAX_KINDS = 32
MAX_LABEL = 128  # topology, version, device and kind names: they become label values


class AddressRefused(ReportError):
    """A registration naming an address that is not the host's."""


def _is_local(ip: str) -> bool:
    """Whether IP is assigned to this machine (binding to it succeeds only then)."""
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def check_addresses(
    info: pb.HostInfo,
    owned: frozenset[str],
    source: str,
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...],
    trust_local: bool = False,
) -> None:
    """Each address INFO registers must be the host's: the connection's SOURCE, an IP its
    certificate names (OWNED), inside one of the fleet's NETWORKS, or, with TRUST_LOCAL
    only, for a caller on this machine (a loopback source), one of this machine's
    addresses. Off by default: any local process (a container sharing the host's
    network, a compromised engine) could otherwise register this machine's addresses
    for any host name its credential holds. A name is taken only when it is the host's
    own name. AddressRefused says which address failed."""
    try:
        src = ipaddress.ip_address(source) if source else None
    except ValueError:
        src = None
    for text in info.addresses:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            if text == info.host:
                continue
            raise AddressRefused(
                f"address {text[:64]!r} is neither an IP nor the host's name"
            ) from None
        if ip == src or str(ip) in owned or any(ip in n for n in networks):
            continue
        local = src is not None and src.is_loopback
        if trust_local and local and (ip.is_loopback or _is_local(str(ip))):
            continue
        raise AddressRefused(
            f"address {ip} is not this host's: not the connection's source ({source or '?'}),"
            " not in its certificate, not in the fleet's networks (fleet_networks)"
        )


@dataclass
class ApiConfig:
    report_interval_ms: int = 10_000
    plan: PlanConfig = field(default_factory=PlanConfig)
    # networks every registered address may lie in, and the only ones probes are sent
    # to (empty: an address must be the caller's own, see check_addresses)
    fleet_networks: tuple[str, ...] = ()
    # a caller on this machine (loopback source) may register this machine's addresses
    # (loopback fleets in tests and labs); off: every address goes through the check
    trust_local_registration: bool = False


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
        rails=rail_nics(info),
    )


class AgentApi:
    """Register, assignments and reports, without gRPC (tests and benchmarks use it bare)."""

    def __init__(self, store: WindowStore, planner: Planner, cfg: ApiConfig) -> None:
        self.store, self.planner, self.cfg = store, planner, cfg
        self.networks = tuple(ipaddress.ip_network(n) for n in cfg.fleet_networks)
        self._lock = threading.Lock()
        self._sent: dict[str, pb.Assignments] = {}  # host -> its current assignments
        self.targets_dropped = 0  # targets outside the fleet's networks never sent
        self.links: FabricLinks | None = None  # the known fabric's, when there is one
        # as one shard of many (collector/shard.py): hosts other shards hold, which the
        # planner keeps, and where a registration is published for the others
        self.remote: Callable[[], frozenset[str]] = frozenset
        self.on_register: Callable[[pb.HostInfo], None] | None = None

    def register(
        self, info: pb.HostInfo, *, owned: frozenset[str] = frozenset(), source: str | None = None
    ) -> pb.RegisterResponse:
        """Add or refresh INFO's host. With SOURCE (the caller's address; the gRPC edge
        always gives it) each address must be the host's (check_addresses)."""
        _check_host_info(info)
        if source is not None:
            check_addresses(info, owned, source, self.networks, self.cfg.trust_local_registration)
        self.store.register(info)
        self.planner.upsert(host_spec(info))
        if self.on_register is not None:
            self.on_register(info)
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
        if self.networks:  # the fleet's probes go nowhere else
            kept = tuple(t for t in targets if self._in_fleet(t.address))
            with self._lock:
                self.targets_dropped += len(targets) - len(kept)
            targets = kept
        classes = self.links.ecmp_classes if self.links is not None else 0
        msg = pb.Assignments(
            host=host,
            generation=gen,
            probe_budget=self.cfg.plan.bursts_per_second,
            list_qps=self.links is not None,
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
                    ecmp_classes=classes if t.kind in CLASS_KINDS else 0,
                    rail=t.rail,
                    src_device=t.src_device,
                )
                for t in targets
            ],
        )
        with self._lock:
            self._sent[host] = msg
        return msg

    def _in_fleet(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in n for n in self.networks)

    def report(self, report: pb.WindowReport) -> pb.Ack:
        """Take one report; raises ReportError. Its ECMP class windows and paths go to
        the links, which may ask for traces on the Ack."""
        res = self.store.take(report)
        ack = pb.Ack(
            epoch=report.epoch,
            seq=report.seq,
            duplicate=res.duplicate,
            assignment_generation=self.planner.generation(report.host),
        )
        if self.links is not None:
            if not res.duplicate:
                self.links.take(report.host, report)
            ack.retrace.extend(self.links.retraces(report.host))
        return ack

    def expire(self, released: Callable[[str, HostState], bool] | None = None) -> list[str]:
        """Forget hosts silent too long (and those RELEASED picks) and replan without them;
        return their names."""
        gone = self.store.forget_idle(also=released)
        elsewhere = self.remote() - set(gone)
        here = set(self.store.host_names())
        stale = [h for h in self.planner.hosts() if h not in here and h not in elsewhere]
        self.planner.remove([*gone, *stale])
        with self._lock:
            for h in [*gone, *stale]:
                self._sent.pop(h, None)
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
    if any(len(a) > 253 for a in info.addresses):
        raise ReportError("an address over 253 characters")
    if not 0 <= info.probe_port < 65536:
        raise ReportError("probe_port out of range")
    if max(len(info.topology), len(info.version), len(info.role)) > MAX_LABEL:
        raise ReportError(f"topology, role and version are at most {MAX_LABEL} characters")
    if len(info.probe_kinds) > MAX_KINDS or any(len(k) > MAX_LABEL for k in info.probe_kinds):
        raise ReportError(f"at most {MAX_KINDS} probe kinds of {MAX_LABEL} characters")
    for d in info.devices:
        if len(d.name) > MAX_LABEL or len(d.driver) > MAX_LABEL or len(d.ports) > MAX_PORTS:
            raise ReportError(f"device {d.name[:40]!r}: name, driver or ports out of bounds")
        check_device(d)
        for p in d.ports:
            if len(p.gids) > MAX_GIDS or len(p.state) > MAX_LABEL or len(p.link_layer) > 64:
                raise ReportError(f"device {d.name[:40]!r} port {p.number}: out of bounds")
            if any(len(g.gid) > 64 or len(g.type) > 32 or len(g.netdev) > 64 for g in p.gids):
                raise ReportError(f"device {d.name[:40]!r} port {p.number}: bad GID entry")


class CollectorServicer(pb_grpc.CollectorServicer):
    """gRPC edge of AgentApi. Who may call, and for which host, the server's Gate
    (collector/auth.py) has decided before any of these runs."""

    def __init__(self, api: AgentApi, drift: DriftBook | None = None) -> None:
        self.api = api
        self.drift = drift

    def Register(
        self, request: pb.RegisterRequest, context: grpc.ServicerContext
    ) -> pb.RegisterResponse:
        ident = identity_of(context)
        try:
            resp = self.api.register(
                request.host,
                owned=ident.addresses if ident is not None else frozenset(),
                source=peer_address(context),
            )
        except AddressRefused as e:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"register: {e}")
        except ReportError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"register: {e}")
        log.info("registered host=%s addresses=%s", request.host.host, list(request.host.addresses))
        return resp

    def GetAssignments(
        self, request: pb.AssignmentsRequest, context: grpc.ServicerContext
    ) -> pb.Assignments:
        if not self.api.store.has_host(request.host):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{request.host}: register first")
        return self.api.assignments(request.host)

    def Report(
        self, request_iterator: Iterator[pb.WindowReport], context: grpc.ServicerContext
    ) -> Iterator[pb.Ack]:
        for report in request_iterator:
            yield self._take(report, context)

    def ReportWindow(self, request: pb.WindowReport, context: grpc.ServicerContext) -> pb.Ack:
        return self._take(request, context)

    def ReportChecks(self, request: pb.CheckReport, context: grpc.ServicerContext) -> pb.CheckAck:
        if self.drift is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "checks: this collector keeps none")
            raise AssertionError("context.abort returned")  # pragma: no cover
        try:
            kept = self.drift.take(request)
        except ReportError as e:
            _refuse(context, e, "checks")
        return pb.CheckAck(kept=len(kept.checks))

    def _take(self, report: pb.WindowReport, context: grpc.ServicerContext) -> pb.Ack:
        try:
            return self.api.report(report)
        except ReportError as e:
            _refuse(context, e, f"report seq {report.seq}")


def _refuse(context: grpc.ServicerContext, e: ReportError, what: str) -> NoReturn:
    """Abort the call for E: FAILED_PRECONDITION when the host must register first (the
    agent registers again), INVALID_ARGUMENT for a report that is wrong."""
    code = (
        grpc.StatusCode.FAILED_PRECONDITION
        if "not registered" in str(e)
        else grpc.StatusCode.INVALID_ARGUMENT
    )
    context.abort(code, f"{what}: {e}")
    raise AssertionError("context.abort returned") from None  # pragma: no cover


def _collector_method(name: str) -> str:
    return f"/{SERVICE_NAME}/{name}"


def policy(gate: GateConfig) -> Policy:
    """The role each service on the port needs, and the host each agent call names."""
    return Policy(
        roles={
            SERVICE_NAME: HOST,
            TRACE_SERVICE: INGEST,
            QUERY_SERVICE: READER,
            health.SERVICE_NAME: gate.health,
            reflection.SERVICE_NAME: gate.reflection,
        },
        claims={
            _collector_method("Register"): lambda r: str(r.host.host),
            _collector_method("GetAssignments"): lambda r: str(r.host),
            _collector_method("Report"): lambda r: str(r.host),
            _collector_method("ReportWindow"): lambda r: str(r.host),
            _collector_method("ReportChecks"): lambda r: str(r.host),
        },
    )


@dataclass
class ServerConfig:
    listen: str = "127.0.0.1:4794"
    metrics_listen: str = "127.0.0.1:9794"  # "" serves no /metrics
    otlp_http_listen: str = ""  # OTLP over HTTP (POST /v1/traces); "" serves none
    match: MatchConfig = field(default_factory=MatchConfig)  # engine sides -> agent hosts
    # served model name -> KV shape (collector/kvshape.py): a request's bytes, where no
    # span gives them
    kv_models: dict[str, KvShape] = field(default_factory=dict)
    why_requests: int = WHY_REQUESTS  # settled requests `probe why` reads (attribution/)
    web_config: str = ""  # TLS and basic auth for /metrics (collector/exposition.py)
    metrics_threads: int = 8  # /metrics renders (and password checks) run at once
    http: Limits = field(default_factory=Limits)  # deadlines and caps of both HTTP servers
    metrics_cache_s: float = 1.0  # one render serves every GET within this
    workers: int = 64  # the gRPC worker pool; streams may hold at most half of it
    grace: float = 5.0
    stale_after: float = 30.0
    forget_after: float = 600.0
    api: ApiConfig = field(default_factory=ApiConfig)
    raw: RawStoreConfig | None = None  # keep every window in Parquet files (rawstore.py)
    drift_min_group: int = 3  # hosts of one ToR or role before any is called different
    drift_waivers: tuple[Waiver, ...] = ()
    gate: GateConfig = field(default_factory=GateConfig)
    detail: DetailConfig = field(default_factory=DetailConfig)  # collector/detail.py
    shard: ShardConfig | None = None  # one shard of many, membership in etcd
    fabric: FabricConfig | None = None  # the known fabric's links (collector/fabric)


def admit(info: pb.HostInfo) -> HostSpec:
    """A registration another shard published: checked as our own are, then planned."""
    _check_host_info(info)
    return host_spec(info)


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
        workers = max(4, cfg.workers)
        gate_cfg = replace(cfg.gate, max_streams=min(cfg.gate.max_streams, max(1, workers // 2)))
        self.gate = Gate(self.auth, policy(gate_cfg), gate_cfg)
        self.scrapes = ScrapeStats()
        self.http_stats = {"otlp": WebStats(), "metrics": WebStats()}  # by listener
        self.web = load_web_config(cfg.web_config) if cfg.web_config else WebConfig()
        self.detail = DetailSelector(cfg.detail)
        self.drift = DriftBook(
            self.store, min_group=cfg.drift_min_group, waivers=tuple(cfg.drift_waivers)
        )
        self.shard = self._shard(cfg.shard) if cfg.shard is not None else None
        self.raw = RawWindowWriter(cfg.raw) if cfg.raw is not None else None
        if self.raw is not None:
            self.store.listeners.append(self.raw)
        self.registry = self._registry()
        self.health = health.HealthServicer()
        self.port = 0
        self.metrics_port = 0
        self.otlp_http_port = 0
        self._server: grpc.Server | None = None
        self._http: Any = None
        self._otlp_http: Any = None
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    def _shard(self, cfg: ShardConfig) -> Shard:
        """This collector as one shard of many: the agent API learns the other shards'
        hosts from it and publishes registrations through it."""
        shard = Shard(
            cfg,
            self.store,
            self.planner,
            admit,
            match=self.cfg.match,
            forget_after=self.cfg.forget_after,
        )
        self.api.remote = shard.remote_hosts
        self.api.on_register = shard.publish
        return shard

    def _registry(self) -> CollectorRegistry:
        """/metrics' collectors, in the order they are written (the attribution's joins
        them at start())."""
        registry = CollectorRegistry()
        registry.register(
            FabricCollector(
                self.store,
                self.rpc_stats,
                self.gate,
                self.scrapes,
                detail=self.detail,
                topology=self.planner.topology,  # peers this collector does not hold
                http=self.http_stats,
            )
        )
        registry.register(DriftCollector(self.drift))
        registry.register(RailCollector(self.store))
        if self.shard is not None:
            registry.register(ShardCollector(self.shard))
        if self.raw is not None:
            registry.register(RawStoreCollector(self.raw))
        self.api.links = attach_links(self.cfg.fabric, registry)
        return registry

    def start(self) -> None:
        workers = max(4, self.cfg.workers)
        opts = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # one collector per port: without this gRPC sets SO_REUSEPORT, and a second
            # collector would bind the same port and take half the fleet
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc"),
            options=opts,
            # timing first, so that calls the gate refuses are counted by code too
            interceptors=[TimingInterceptor(self.rpc_stats), self.gate],
            # calls beyond this are refused at once (RESOURCE_EXHAUSTED), never queued long
            maximum_concurrent_rpcs=workers * 2,
        )
        pb_grpc.add_CollectorServicer_to_server(CollectorServicer(self.api, self.drift), server)
        # OTLP stage spans joined with the fabric (collector/attribution/), and Query
        self.attribution = attach_attribution(
            server,
            self.store,
            self.registry,
            self._stop,
            match=self.cfg.match,
            drift=self.drift,
            kv_models=self.cfg.kv_models,
            links=self.api.links,
            why_requests=self.cfg.why_requests,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, QUERY_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        host, port = split_hostport(self.cfg.listen)
        try:
            self.port = self.auth.add_port(server, f"{host}:{port}")
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise OSError(
                f"cannot listen on {self.cfg.listen}: the address is in use"
                " (another collector?) or not local"
            )
        if self.cfg.metrics_listen:  # before the API serves: a failure here leaves nothing up
            mhost, mport = split_hostport(self.cfg.metrics_listen)
            try:
                self._http = serve_metrics(
                    mhost,
                    mport,
                    self.registry,
                    web=self.web,
                    stats=self.scrapes,
                    max_threads=self.cfg.metrics_threads,
                    cache_s=self.cfg.metrics_cache_s,
                    limits=self.cfg.http,
                    web_stats=self.http_stats["metrics"],
                )
            except OSError as e:
                server.stop(0)
                raise OSError(f"cannot serve /metrics on {self.cfg.metrics_listen}: {e}") from e
            self.metrics_port = int(self._http.server_address[1])
        server.start()
        self._server = server
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.cfg.otlp_http_listen:
            ohost, oport = split_hostport(self.cfg.otlp_http_listen)
            try:
                self._otlp_http = serve_otlp_http(
                    ohost,
                    oport,
                    self.attribution.ingest,
                    guard=http_guard(self.auth),  # the gRPC port's tokens, roles, certificates
                    ssl_context=self.auth.http_ssl(),
                    limits=self.cfg.http,
                    stats=self.http_stats["otlp"],
                    routes=[self._kv_cost_route()],
                )
            except OSError as e:
                self.stop(0)
                raise OSError(f"cannot serve OTLP/HTTP on {self.cfg.otlp_http_listen}: {e}") from e
            self.otlp_http_port = int(self._otlp_http.server_address[1])
        if self.shard is not None:
            self.attribution.ingest.router = self.shard.spans.route
            self.shard.spans.local = self.attribution.ingest.export_local
            self.attribution.fleet = self.shard.fleet_addresses
            sc = self.shard.cfg
            api = sc.advertise_api or f"{host}:{self.port}"
            mhost = self.cfg.metrics_listen.rpartition(":")[0].strip("[]")
            if mhost in ("", "0.0.0.0", "::"):  # every address: the one agents reach
                mhost = api.rpartition(":")[0]
            metrics = sc.advertise_metrics or (f"{mhost}:{self.metrics_port}" if self._http else "")
            try:
                self.shard.start(Member(sc.name, api, sc.advertise_otlp, metrics))
            except Exception:
                self.stop(0)
                raise
        self._reaper = threading.Thread(target=self._reap, name="reaper", daemon=True)
        self._reaper.start()
        if self.raw is not None:
            self.raw.start()
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
            self.gate.cancel_idle()
            released = None
            if self.shard is not None:
                # a host that registered with another shard is let go of here once it
                # has been silent for three windows (before stale_after calls it down)
                quiet = min(self.cfg.stale_after / 2, 3 * self.cfg.api.report_interval_ms / 1000)
                released = self.shard.released(quiet)
            gone = self.api.expire(released)
            if gone:
                log.info("forgot silent or moved hosts=%s", gone)
                if self.shard is not None:
                    self.shard.forget(gone)

    def _kv_cost_route(self) -> Route:
        """`GET /v1/kv-cost` beside OTLP/HTTP, for the reader role (as the Query API's
        KvCost), with the Query API's rule that figures older than a stale host's are no
        price."""
        cfg = PriceConfig(max_age_s=self.store.stale_after)
        return kv_cost_route(self.store, cfg, self.attribution.price_answers, READER)

    def stop(self, grace: float | None = None) -> None:
        """Drain: report NOT_SERVING, finish running calls within the grace, close."""
        self._stop.set()
        if self.shard is not None:
            self.shard.stop()  # out of the member set first: agents move while we drain
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
        if self.raw is not None:
            self.raw.stop()  # the last rows, after the last report
        log.info("collector stopped")

    def wait(self, until: Callable[[], bool]) -> None:
        while not until() and not self._stop.is_set():
            time.sleep(0.2)
