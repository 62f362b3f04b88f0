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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

from fabricprobe.collector.assign import DEFAULT_KINDS, PlanConfig
from fabricprobe.collector.auth import (
    Authenticator,
    Insecure,
    MutualTls,
    TokenAuth,
    read_token_file,
)
from fabricprobe.collector.engines import HOST_ATTRIBUTES
from fabricprobe.collector.linking import MatchConfig
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
    reports_per_second: float = 50.0
    workers: int = 64
    grace_s: float = 5.0
    insecure: bool = False
    token_file: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    client_ca: str = ""

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
        return ServerConfig(
            listen=self.listen,
            metrics_listen=self.metrics_listen,
            otlp_http_listen=self.otlp_http_listen,
            match=self.match_config(),
            workers=self.workers,
            grace=self.grace_s,
            stale_after=self.stale_after_s,
            forget_after=self.forget_after_s,
            api=ApiConfig(
                report_interval_ms=int(self.report_interval_s * 1000),
                reports_per_second=self.reports_per_second,
                plan=plan,
            ),
        )

    def match_config(self) -> MatchConfig:
        """How engine spans' host attributes name agents' hosts (collector/linking.py)."""
        rules = []
        for rule in self.host_rewrite:
            if not (
                isinstance(rule, list) and len(rule) == 2 and all(isinstance(x, str) for x in rule)
            ):
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

    def authenticator(self) -> Authenticator:
        """The authentication mode asked for; plain text only with `insecure`."""
        tls = [bool(self.tls_cert), bool(self.tls_key)]
        if any(tls) and not all(tls):
            raise ConfigError("tls_cert and tls_key go together")
        try:
            if self.client_ca:
                if not all(tls):
                    raise ConfigError("client_ca needs tls_cert and tls_key")
                return MutualTls.from_files(self.tls_cert, self.tls_key, self.client_ca)
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
