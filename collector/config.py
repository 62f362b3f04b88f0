"""Collector settings: defaults, then a TOML file's [collector] table, then flags.

Example file::

    [collector]
    listen = "0.0.0.0:4794"
    metrics_listen = "0.0.0.0:9794"
    report_interval_s = 10.0
    budget = 16                 # peers per host
    probe_interval_s = 10.0
    probe_count = 10
    sizes = [64, 4096]
    kinds = ["tcp_lat", "rdma_rc_lat", "rdma_ud", "tcp_bw"]  # tcp_bw is off by default
    stale_after_s = 30.0
    otlp_http_listen = "0.0.0.0:4318"   # OTLP over HTTP beside the gRPC receiver
    host_attributes = ["host.name", "service.instance.id", "k8s.pod.ip", "server.address"]
    host_aliases = { "vllm-decode-0" = "gpu-node-17" }   # engine host value -> agent host
    host_rewrite = [["^(.*)-vllm-[0-9]+$", "\\1"]]       # regex, replacement
    tls_cert = "/etc/fabricprobe/collector.pem"
    tls_key = "/etc/fabricprobe/collector.key"
    client_ca = "/etc/fabricprobe/ca.pem"
    windows_dir = "/var/lib/fabricprobe-collector/windows"   # raw windows as Parquet
    windows_max_bytes = 1073741824
    drift_min_group = 3        # hosts of one ToR or role before any is called different
    drift_waivers = [          # known differences, shown but not alerted on
        { host = "gpu-node-4*", check = "firmware", reason = "canary", until = 2027-01-31 },
    ]
"""

from __future__ import annotations

import ipaddress
import re
import ssl
from dataclasses import dataclass, field

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

from fabricprobe.collector.assign import DEFAULT_KINDS, PlanConfig
from fabricprobe.collector.auth import (
    Authenticator,
    GateConfig,
    Insecure,
    MutualTls,
    TokenAuth,
    read_token_file,
)
from fabricprobe.collector.drift import parse_waivers
from fabricprobe.collector.engines import HOST_ATTRIBUTES
from fabricprobe.collector.exposition import load_web_config
from fabricprobe.collector.linking import MatchConfig
from fabricprobe.collector.rawstore import RawStoreConfig
from fabricprobe.collector.service import ApiConfig, ServerConfig
from fabricprobe.core.errors import ConfigError


@dataclass
class CollectorSettings:
    listen: str = "0.0.0.0:4794"
    metrics_listen: str = "0.0.0.0:9794"
    otlp_http_listen: str = ""
    host_attributes: list[str] = field(default_factory=lambda: list(HOST_ATTRIBUTES))
    host_aliases: dict[str, str] = field(default_factory=dict)
    host_rewrite: list[list[str]] = field(default_factory=list)
    report_interval_s: float = 10.0
    budget: int = 16
    intra_share: float = 0.5
    probe_interval_s: float = 10.0
    probe_count: int = 10
    sizes: list[int] = field(default_factory=lambda: [64])
    kinds: list[str] = field(default_factory=lambda: list(DEFAULT_KINDS))  # + "tcp_bw"
    bursts_per_second: int = 20
    stale_after_s: float = 30.0
    forget_after_s: float = 600.0
    reports_per_second: float = 50.0  # calls and stream messages per identity
    report_burst: float = 500.0
    streams_per_identity: int = 4
    stream_idle_s: float = 60.0
    health: str = "open"  # open, any (authenticated) or off
    reflection: str = "any"
    reader_names: list[str] = field(default_factory=list)  # mutual TLS: Query callers
    ingest_names: list[str] = field(default_factory=list)  # mutual TLS: OTLP senders
    workers: int = 64
    fleet_networks: list[str] = field(default_factory=list)  # e.g. ["10.0.0.0/16"]
    web_config: str = ""  # /metrics TLS and basic auth, exporter-toolkit's web-config format
    grace_s: float = 5.0
    insecure: bool = False
    token_file: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    client_ca: str = ""
    windows_dir: str = ""  # keep every window in Parquet files here ("" keeps none)
    windows_max_bytes: int = 1 << 30
    windows_max_age_s: float = 7 * 86400.0
    drift_min_group: int = 3
    drift_waivers: list[dict[str, object]] = field(default_factory=list)

    def server_config(self) -> ServerConfig:
        try:
            plan = PlanConfig(
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
        if not 0.1 <= self.report_interval_s <= 3600:
            raise ConfigError("report_interval_s: must be within 0.1..3600")
        raw = None
        if self.windows_dir:
            if self.windows_max_bytes < 1 << 20:
                raise ConfigError("windows_max_bytes: at least 1 MiB")
            if not 3600 <= self.windows_max_age_s <= 366 * 86400:
                raise ConfigError("windows_max_age_s: must be within 3600..31622400")
            raw = RawStoreConfig(
                self.windows_dir,
                max_bytes=self.windows_max_bytes,
                max_age_s=self.windows_max_age_s,
                flush_s=min(30.0, max(1.0, self.report_interval_s)),
            )
        for name in ("health", "reflection"):
            if getattr(self, name) not in ("open", "any", "off"):
                raise ConfigError(f"{name}: one of open, any, off")
        if self.web_config:
            try:
                load_web_config(self.web_config)
            except (OSError, ValueError, ssl.SSLError) as e:
                raise ConfigError(f"web_config: {e}") from None
        if not 4 <= self.workers <= 1024:
            raise ConfigError("workers: must be within 4..1024")
        if not 1 <= self.streams_per_identity <= self.workers // 2:
            raise ConfigError("streams_per_identity: must be within 1..workers/2")
        if not (0 < self.reports_per_second <= 1e6 and 1 <= self.report_burst <= 1e7):
            raise ConfigError("reports_per_second/report_burst out of range")
        if not 2 <= self.drift_min_group <= 100_000:
            raise ConfigError("drift_min_group: must be within 2..100000")
        return ServerConfig(
            raw=raw,
            drift_min_group=self.drift_min_group,
            drift_waivers=parse_waivers(self.drift_waivers),
            listen=self.listen,
            metrics_listen=self.metrics_listen,
            otlp_http_listen=self.otlp_http_listen,
            match=self.match_config(),
            web_config=self.web_config,
            workers=self.workers,
            grace=self.grace_s,
            stale_after=self.stale_after_s,
            forget_after=self.forget_after_s,
            api=ApiConfig(
                report_interval_ms=int(self.report_interval_s * 1000),
                plan=plan,
                fleet_networks=tuple(self._networks()),
            ),
            gate=GateConfig(
                rate=self.reports_per_second,
                burst=self.report_burst,
                streams_per_identity=self.streams_per_identity,
                max_streams=self.workers // 2,
                stream_idle_s=self.stream_idle_s,
                health=self.health,
                reflection=self.reflection,
            ),
        )

    def match_config(self) -> MatchConfig:
        """How engine spans' host attributes name agents' hosts (collector/linking.py)."""
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

    def _networks(self) -> list[str]:
        out = []
        for n in self.fleet_networks:
            try:
                out.append(str(ipaddress.ip_network(n, strict=False)))
            except ValueError as e:
                raise ConfigError(f"fleet_networks: {e}") from None
        return out

    def authenticator(self) -> Authenticator:
        """The authentication mode asked for; plain text only with `insecure`."""
        tls = [bool(self.tls_cert), bool(self.tls_key)]
        if any(tls) and not all(tls):
            raise ConfigError("tls_cert and tls_key go together")
        try:
            if self.client_ca:
                if not all(tls):
                    raise ConfigError("client_ca needs tls_cert and tls_key")
                return MutualTls.from_files(
                    self.tls_cert,
                    self.tls_key,
                    self.client_ca,
                    readers=frozenset(self.reader_names),
                    ingest=frozenset(self.ingest_names),
                )
            if self.token_file:
                creds = None
                if all(tls):
                    with open(self.tls_key, "rb") as k, open(self.tls_cert, "rb") as c:
                        creds = grpc.ssl_server_credentials([(k.read(), c.read())])
                elif not self.insecure:
                    raise ConfigError(
                        "tokens over plain text: give tls_cert/tls_key, or insecure to accept it"
                    )
                return TokenAuth(read_token_file(self.token_file), creds)
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
