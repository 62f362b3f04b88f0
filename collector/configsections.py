"""The settings of `probe collector`, declared by concern (fabricprobe.core.settings).

Each section is a dataclass of its own that turns its fields into the part of the
server's configuration it is about; `CollectorSettings` (collector/config.py) is all of
them in one. The sections are not nested tables: the settings system gives a command one
flat table (`[collector]`), whose keys are also the variables' and flags' names, so a
`[collector.http]` table would rename every key. Sections only group the declarations.
Their order (CollectorSettings' bases, last first) is the fields' order, which is the
order `probe collector --help` lists them in.
"""

from __future__ import annotations

import ipaddress
import re
import ssl
from dataclasses import dataclass

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

from fabricprobe.collector.assign import DEFAULT_KINDS, PROBE_KINDS, PlanConfig
from fabricprobe.collector.attribution.engines.common import HOST_ATTRIBUTES
from fabricprobe.collector.attribution.linking import MatchConfig
from fabricprobe.collector.auth import (
    Authenticator,
    GateConfig,
    Insecure,
    MutualTls,
    TokenAuth,
    read_token_file,
    server_ssl,
)
from fabricprobe.collector.detail import DetailConfig
from fabricprobe.collector.drift import MAX_WAIVERS, parse_waivers
from fabricprobe.collector.exposition import load_web_config
from fabricprobe.collector.fabric.localize import LocalizeConfig
from fabricprobe.collector.fabric.service import FabricConfig
from fabricprobe.collector.fabric.topology import Topology, TopologyError
from fabricprobe.collector.kvshape import KvShape, parse_kv_models
from fabricprobe.collector.rawstore import RawStoreConfig
from fabricprobe.collector.shard import ShardConfig
from fabricprobe.core.errors import ConfigError
from fabricprobe.core.settings import (
    FILE,
    LISTEN,
    LISTEN_OR_OFF,
    NAME,
    NETWORK,
    PEER,
    Check,
    setting,
)
from fabricprobe.core.shards import parse_endpoints
from fabricprobe.core.web import Limits

GATES = ("open", "any", "off")  # who may call health and reflection: anyone, the authenticated


def _rewrite_rule(rule: list[str]) -> None:
    if len(rule) != 2:
        raise ValueError(f"{rule!r}: each rule is [regex, replacement]")
    try:
        re.compile(rule[0])
    except re.error as e:
        raise ValueError(f"{rule[0]!r}: {e}") from None


REWRITE = Check(_rewrite_rule, "RULE")


def _label_ok(text: str) -> None:
    if len(text) > 128 or any(c.isspace() for c in text):
        raise ValueError(f"{text[:40]!r}: no spaces, 128 characters at most")


def _waiver(item: object) -> None:
    try:
        parse_waivers([item], where="")
    except ConfigError as e:
        raise ValueError(str(e).removeprefix("[0]: ")) from None


WAIVER = Check(_waiver, "TABLE")
ENDPOINTS = Check(parse_endpoints, "HOST:PORT,...", empty_ok=True)
PEER_OR_EMPTY = Check(PEER.test, "HOST:PORT", empty_ok=True)


@dataclass
class ListenSettings:
    """Where the collector listens: the agent API, /metrics, OTLP over HTTP."""

    listen: str = setting("0.0.0.0:4794", "Agent API address.", check=LISTEN)
    metrics_listen: str = setting(
        "0.0.0.0:9794", "Where /metrics is served; '' serves none.", check=LISTEN_OR_OFF
    )
    otlp_http_listen: str = setting(
        "",
        "OTLP over HTTP (POST /v1/traces) for engines' spans; 0.0.0.0:4318 is usual.",
        check=LISTEN_OR_OFF,
        shown="off",
    )


@dataclass
class EngineSettings:
    """How engine spans name the agents' hosts, the KV shapes of the models they serve, and
    how many settled requests `probe why` reads (collector/attribution/settle.py)."""

    host_attributes: list[str] = setting(
        list(HOST_ATTRIBUTES),
        "Span attribute naming an engine's host, in order.",
        flag="--host-attribute",
        check=NAME,
    )
    host_aliases: dict[str, str] = setting(
        {},
        "Engine host value = agent host.",
        flag="--host-alias",
        metavar="ENGINE=AGENT",
        check=NAME,
    )
    host_rewrite: list[list[str]] = setting(
        [],
        "[regex, replacement] rules from engine host values to agent hosts.",
        flag=None,
        check=REWRITE,
    )
    kv_models: dict[str, str] = setting(
        {},
        "Served model = KV shape: a preset (probe workload's) or layers=,kv_heads=,"
        "head_dim=,dtype=, and block= tokens.",
        flag="--kv-model",
        metavar="MODEL=SHAPE",
    )
    why_requests: int = setting(
        10_000,
        "Settled requests `probe why` reads, the newest kept (/metrics reads the fold).",
        lo=100,
        hi=1_000_000,
    )

    def match_config(self) -> MatchConfig:
        """How engine spans' host attributes name agents' hosts
        (collector/attribution/linking.py)."""
        rules = []
        for rule in self.host_rewrite:
            ok = isinstance(rule, list) and len(rule) == 2
            if not (ok and all(isinstance(x, str) for x in rule)):
                raise ConfigError("host_rewrite: each rule is [regex, replacement]")
            try:
                re.compile(rule[0])
            except re.error as e:
                raise ConfigError(f"host_rewrite: {rule[0]!r}: {e}") from None
            rules.append((rule[0], rule[1]))
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.host_aliases.items()):
            raise ConfigError("host_aliases: names map to names")
        return MatchConfig(
            attributes=tuple(self.host_attributes),
            aliases=dict(self.host_aliases),
            rewrite=tuple(rules),
        )

    def kv_shapes(self) -> dict[str, KvShape]:
        """The served models' KV shapes (collector/kvshape.py)."""
        try:
            return parse_kv_models(self.kv_models)
        except ValueError as e:
            raise ConfigError(str(e)) from None


@dataclass
class PlanSettings:
    """What agents are told to probe, how often, and how long a silent host stays planned."""

    report_interval_s: float = setting(10.0, "Window seconds.", lo=0.1, hi=3600)
    budget: int = setting(16, "Peers each host probes.", lo=1, hi=1024)
    intra_share: float = setting(0.5, "Share of the budget under the host's own ToR.", lo=0, hi=1)
    probe_interval_s: float = setting(10.0, "Seconds between bursts to a peer.", lo=0.1, hi=3600)
    probe_count: int = setting(10, "Exchanges per burst.", lo=1, hi=10_000)
    # 1 MiB: the largest message the TCP and RDMA RC probes take (probes/tcp.py, rdma/rc.py)
    sizes: list[int] = setting(
        [64],
        "Probe message size in bytes.",
        flag="--size",
        lo=1,
        hi=1 << 20,
        min_items=1,
        max_items=16,
    )
    kinds: list[str] = setting(
        list(DEFAULT_KINDS),
        "Probe kind to plan (tcp_bw is off by default).",
        flag="--kind",
        choices=PROBE_KINDS,
        min_items=1,
    )
    bursts_per_second: int = setting(20, "Rate budget handed to each agent.", lo=1, hi=10_000)
    stale_after_s: float = setting(30.0, "Host stale after this many seconds.", lo=1, hi=86400)
    forget_after_s: float = setting(
        600.0, "Host forgotten after this many seconds.", lo=1, hi=366 * 86400
    )

    def plan_config(self) -> PlanConfig:
        """The planner's settings (collector/assign.py)."""
        try:
            return PlanConfig(
                budget=self.budget,
                intra_share=self.intra_share,
                interval_ms=int(self.probe_interval_s * 1000),
                count=self.probe_count,
                sizes=tuple(self.sizes),
                kinds=tuple(self.kinds),
                bursts_per_second=self.bursts_per_second,
            )
        except ValueError as e:
            raise ConfigError(str(e)) from None


@dataclass
class AccessSettings:
    """Who may call and how much: the limits per identity, the roles certificates grant,
    the workers, and the addresses a host may register."""

    reports_per_second: float = setting(
        50.0, "Calls and stream messages per identity per second.", lo=0.001, hi=1e6
    )
    report_burst: float = setting(500.0, "Burst above that rate.", lo=1, hi=1e7)
    streams_per_identity: int = setting(4, "Open streams per identity.", lo=1, hi=512)
    stream_idle_s: float = setting(60.0, "Idle stream closed after seconds.", lo=1, hi=86400)
    health: str = setting("open", "gRPC health: open, any (authenticated) or off.", choices=GATES)
    reflection: str = setting("any", "gRPC reflection: open, any or off.", choices=GATES)
    reader_names: list[str] = setting(
        [], "Mutual TLS: a client name allowed to Query.", flag="--reader-name", check=NAME
    )
    ingest_names: list[str] = setting(
        [], "Mutual TLS: a client name allowed to send OTLP.", flag="--ingest-name", check=NAME
    )
    workers: int = setting(64, "gRPC worker threads.", lo=4, hi=1024)
    fleet_networks: list[str] = setting(
        [],
        "A network the fleet's addresses lie in; probes go nowhere else.",
        flag="--fleet-network",
        check=NETWORK,
    )
    trust_loopback: bool = setting(
        False, "Let callers on this machine register any of its addresses (loopback fleets)."
    )

    def gate_config(self) -> GateConfig:
        """The authentication layer's limits (collector/auth.py); streams may hold at most
        half the workers."""
        return GateConfig(
            rate=self.reports_per_second,
            burst=self.report_burst,
            streams_per_identity=self.streams_per_identity,
            max_streams=self.workers // 2,
            stream_idle_s=self.stream_idle_s,
            health=self.health,
            reflection=self.reflection,
        )

    def check_streams(self) -> None:
        if self.streams_per_identity > self.workers // 2:
            raise ConfigError("streams_per_identity must be at most workers / 2")

    def networks(self) -> list[str]:
        """The fleet's networks, each in its canonical form."""
        out = []
        for n in self.fleet_networks:
            try:
                out.append(str(ipaddress.ip_network(n, strict=False)))
            except ValueError as e:
                raise ConfigError(f"fleet_networks: {e}") from None
        return out


@dataclass
class HttpSettings:
    """The HTTP servers (/metrics and OTLP/HTTP): /metrics' web config and both servers'
    bounds."""

    web_config: str = setting(
        "", "TLS and basic auth for /metrics (exporter-toolkit's web-config YAML).", check=FILE
    )
    # the HTTP servers' bounds (OTLP/HTTP and /metrics; fabricprobe.core.web.Limits)
    http_header_timeout_s: float = setting(
        10.0, "HTTP: seconds from a request's first byte to the end of its headers.", lo=0.1, hi=600
    )
    http_body_timeout_s: float = setting(
        30.0, "HTTP: seconds a request's body may take after its headers.", lo=0.1, hi=3600
    )
    http_idle_timeout_s: float = setting(
        15.0, "HTTP: seconds an idle keep-alive connection is kept.", lo=0.1, hi=3600
    )
    http_max_connections: int = setting(
        512, "HTTP: connections open at once, per server.", lo=1, hi=100_000
    )
    http_per_source: int = setting(
        32, "HTTP: connections open at once from one address.", lo=1, hi=100_000
    )
    http_body_budget: int = setting(
        32 << 20,
        "HTTP: bytes of request bodies held at once.",
        lo=1 << 16,
        hi=1 << 40,
        shown="32 MiB",
    )

    def check_web_config(self) -> None:
        """Read web_config once now, so that a bad file fails at start."""
        if self.web_config:
            try:
                load_web_config(self.web_config)
            except (OSError, ValueError, ssl.SSLError) as e:
                raise ConfigError(f"web_config: {e}") from None

    def http_limits(self) -> Limits:
        """The bounds both HTTP servers keep (fabricprobe.core.web)."""
        try:
            return Limits(
                header_s=self.http_header_timeout_s,
                body_s=self.http_body_timeout_s,
                idle_s=self.http_idle_timeout_s,
                max_connections=self.http_max_connections,
                per_source=self.http_per_source,
                body_budget=self.http_body_budget,
            )
        except ValueError as e:
            raise ConfigError(f"http: {e}") from None


@dataclass
class ApiPortSettings:
    """The agent API port's credentials (mutual TLS, tokens or plain text) and its drain."""

    grace_s: float = setting(5.0, "Seconds calls may finish in at shutdown.", lo=0, hi=600)
    insecure: bool = setting(False, "Accept plain text, no identity.")
    token_file: str = setting("", "`HOST TOKEN` lines.", check=FILE)
    tls_cert: str = setting("", "Server certificate (PEM).", check=FILE)
    tls_key: str = setting("", "Server key (PEM).", check=FILE)
    client_ca: str = setting("", "CA of agent certificates.", check=FILE)

    def credentials(
        self, readers: frozenset[str] = frozenset(), ingest: frozenset[str] = frozenset()
    ) -> Authenticator:
        """The authentication mode asked for, plain text only with `insecure`; READERS and
        INGEST: the certificate names granted those roles under mutual TLS."""
        tls = [bool(self.tls_cert), bool(self.tls_key)]
        if any(tls) and not all(tls):
            raise ConfigError("tls_cert and tls_key go together")
        try:
            if self.client_ca:
                if not all(tls):
                    raise ConfigError("client_ca needs tls_cert and tls_key")
                return MutualTls.from_files(
                    self.tls_cert, self.tls_key, self.client_ca, readers=readers, ingest=ingest
                )
            if self.token_file:
                creds = None
                http_tls = None
                if all(tls):
                    with open(self.tls_key, "rb") as k, open(self.tls_cert, "rb") as c:
                        creds = grpc.ssl_server_credentials([(k.read(), c.read())])
                    http_tls = server_ssl(self.tls_cert, self.tls_key)
                elif not self.insecure:
                    raise ConfigError(
                        "tokens over plain text: give tls_cert/tls_key, or insecure to accept it"
                    )
                return TokenAuth(read_token_file(self.token_file), creds, http_tls)
        except ssl.SSLError as e:  # before OSError, which it is a kind of
            raise ConfigError(f"tls_cert/tls_key: {e}") from None
        except OSError as e:
            raise ConfigError(f"{e.filename}: {e.strerror}") from None
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(str(e)) from None
        if not self.insecure:
            raise ConfigError(
                "no authentication: give --client-ca (mutual TLS) or --token-file, "
                "or --insecure for plain text"
            )
        return Insecure()


@dataclass
class WindowsSettings:
    """Raw windows kept on disk as Parquet (collector/rawstore.py)."""

    windows_dir: str = setting(
        "", "Keep every raw window here as Parquet (`probe windows` reads it).", metavar="DIR"
    )
    windows_max_bytes: int = setting(
        1 << 30, "Disk budget of the windows.", lo=1 << 20, hi=1 << 50, shown="1 GiB"
    )
    windows_max_age_s: float = setting(
        7 * 86400.0, "Oldest window kept, seconds.", lo=3600, hi=366 * 86400
    )

    def raw_config(self, flush_s: float) -> RawStoreConfig | None:
        """The raw windows' files, flushed every FLUSH_S seconds; None when not kept."""
        if not self.windows_dir:
            return None
        return RawStoreConfig(
            self.windows_dir,
            max_bytes=self.windows_max_bytes,
            max_age_s=self.windows_max_age_s,
            flush_s=flush_s,
        )


@dataclass
class DetailSettings:
    """What /metrics shows path by path (collector/detail.py); the rest is in the aggregates."""

    detail_worst_k: int = setting(
        10, "Worst paths by p99 per probe kind, and by loss, shown each scrape.", lo=0, hi=10_000
    )
    detail_hold_s: float = setting(
        300.0, "Seconds a path stays shown after it last qualified.", lo=0, hi=86400
    )
    detail_max_paths: int = setting(500, "Paths shown one by one, at most.", lo=0, hi=1_000_000)
    detail_max_hosts: int = setting(
        32, "Hosts whose counters and agent figures are shown, at most.", lo=0, hi=100_000
    )
    detail_max_tor_pairs: int = setting(3000, "ToR pairs shown, at most.", lo=0, hi=1_000_000)

    def detail_config(self, fresh_s: float) -> DetailConfig:
        """The bounds of the detail; a path whose newest window is older than FRESH_S is
        not ranked."""
        return DetailConfig(
            worst_k=self.detail_worst_k,
            hold_s=self.detail_hold_s,
            max_paths=self.detail_max_paths,
            max_hosts=self.detail_max_hosts,
            max_tor_pairs=self.detail_max_tor_pairs,
            fresh_s=fresh_s,
        )


@dataclass
class DriftSettings:
    """How hosts that differ from their group are found (collector/drift.py)."""

    drift_min_group: int = setting(
        3, "Hosts of one ToR or role before any is called different.", lo=2, hi=100_000
    )
    # { host = "gpu-node-4*", check = "firmware", reason = "canary", until = 2027-01-31 }
    drift_waivers: list[dict[str, object]] = setting(
        [],
        "Known differences, shown but not alerted on.",
        flag=None,
        check=WAIVER,
        max_items=MAX_WAIVERS,
    )


@dataclass
class FabricSettings:
    """The known fabric's links and the tomography that names them (collector/fabric)."""

    fabric_file: str = setting(
        "", "Fabric file (JSON: routers, links, host uplinks); '' names no links.", check=FILE
    )
    ecmp_classes: int = setting(4, "ECMP classes per rdma_ud target.", lo=1, hi=16)
    link_min_rise_s: float = setting(
        0.0002, "A class's RTT rise below this is never bad.", lo=0, hi=10
    )
    link_min_loss: float = setting(
        0.0, "Loss rate of a link's classes below this is never a finding.", lo=0, hi=0.99
    )
    link_refresh_s: float = setting(600.0, "Class paths traced again after.", lo=10, hi=86400)

    def fabric_config(self, window_s: float) -> FabricConfig | None:
        """The links' configuration (None without a fabric file); a class's newest window
        counts for two windows of WINDOW_S."""
        if not self.fabric_file:
            return None
        try:
            Topology.load(self.fabric_file)
        except TopologyError as e:
            raise ConfigError(f"fabric_file: {e}") from None
        return FabricConfig(
            self.fabric_file,
            LocalizeConfig(
                min_rise_s=self.link_min_rise_s,
                min_loss=self.link_min_loss,
                fresh_s=max(2 * window_s, 1.0),
            ),
            refresh_s=self.link_refresh_s,
            ecmp_classes=self.ecmp_classes,
        )


@dataclass
class ShardSettings:
    """One collector shard of many (collector/shard.py): membership in etcd, agents find
    their shard."""

    etcd: str = setting(
        "", "etcd endpoints: run as one collector shard of many; '' runs alone.", check=ENDPOINTS
    )
    etcd_prefix: str = setting("/fabricprobe/", "Key prefix of the shards in etcd.", metavar="KEY")
    shard_name: str = setting(
        "", "This shard's name in etcd (unique).", check=Check(_label_ok, "NAME", empty_ok=True)
    )
    shard_ttl_s: int = setting(3, "Seconds a dead shard stays a member (its lease).", lo=2, hi=60)
    shard_span_hold_s: float = setting(
        10.0,
        "Seconds an engine trace's spans wait, on the shard owning the trace, for the side"
        " that names their path (then each side goes by its own host).",
        lo=0.5,
        hi=600,
    )
    advertise: str = setting(
        "", "Agent API address other hosts reach this shard at.", check=PEER_OR_EMPTY
    )
    advertise_metrics: str = setting(
        "", "/metrics address Prometheus reaches this shard at.", check=PEER_OR_EMPTY
    )
    shard_token_file: str = setting(
        "", "Bearer token (ingest role) this shard forwards spans to the others with.", check=FILE
    )
    shard_ca_file: str = setting("", "CA of the other shards' certificates (TLS).", check=FILE)
    etcd_ca_file: str = setting("", "CA of etcd's certificate (https).", check=FILE)
    etcd_cert_file: str = setting("", "Client certificate for etcd (PEM).", check=FILE)
    etcd_key_file: str = setting("", "Client key for etcd (PEM).", check=FILE)

    def shard_at(self, listen: str) -> ShardConfig | None:
        """The shard's settings for an agent API on LISTEN, or None without etcd."""
        if not self.etcd:
            return None
        if not self.shard_name:
            raise ConfigError("etcd needs shard_name (unique among the shards)")
        if bool(self.etcd_cert_file) != bool(self.etcd_key_file):
            raise ConfigError("etcd_cert_file and etcd_key_file go together")
        if self.etcd_cert_file and not self.etcd_ca_file:
            raise ConfigError("etcd_cert_file needs etcd_ca_file (a client certificate is https)")
        host = listen.rpartition(":")[0].strip("[]")
        if not self.advertise and host in ("", "0.0.0.0", "::"):
            raise ConfigError("listening on every address: give advertise (HOST:PORT for agents)")
        return ShardConfig(
            etcd=parse_endpoints(self.etcd),
            name=self.shard_name,
            advertise_api=self.advertise,
            advertise_metrics=self.advertise_metrics,
            ttl_s=self.shard_ttl_s,
            refresh_s=1.0,
            span_hold_s=self.shard_span_hold_s,
            prefix=self.etcd_prefix,
            token_file=self.shard_token_file,
            ca_file=self.shard_ca_file,
            etcd_ca_file=self.etcd_ca_file,
            etcd_cert_file=self.etcd_cert_file,
            etcd_key_file=self.etcd_key_file,
        )
