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
    tls_cert = "/etc/fabricprobe/collector.pem"
    tls_key = "/etc/fabricprobe/collector.key"
    client_ca = "/etc/fabricprobe/ca.pem"
    windows_dir = "/var/lib/fabricprobe-collector/windows"   # raw windows as Parquet
    windows_max_bytes = 1073741824
"""

from __future__ import annotations

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
from fabricprobe.collector.rawstore import RawStoreConfig
from fabricprobe.collector.service import ApiConfig, ServerConfig
from fabricprobe.core.errors import ConfigError


@dataclass
class CollectorSettings:
    listen: str = "0.0.0.0:4794"
    metrics_listen: str = "0.0.0.0:9794"
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
    windows_dir: str = ""  # keep every window in Parquet files here ("" keeps none)
    windows_max_bytes: int = 1 << 30
    windows_max_age_s: float = 7 * 86400.0

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
        return ServerConfig(
            raw=raw,
            listen=self.listen,
            metrics_listen=self.metrics_listen,
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
