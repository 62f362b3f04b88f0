"""Collector settings, each declared once (fabricprobe.core.settings): the defaults, then
the [collector] table of a TOML file (`--config`, or FABRICPROBE_COLLECTOR_CONFIG), then
environment variables FABRICPROBE_COLLECTOR_<NAME> (e.g. FABRICPROBE_COLLECTOR_BUDGET), then
the flags of `probe collector` (`probe collector --help` lists each flag with its variable).
Unknown sections and keys are errors that name the file and line.

Example file::

    [collector]
    listen = "0.0.0.0:4794"
    metrics_listen = "0.0.0.0:9794"
    report_interval_s = 10.0
    budget = 16                 # peers per host
    probe_interval_s = 10.0
    probe_count = 10
    sizes = [64, 4096]
    # tcp_bw and rdma_rc_read are off by default; the KV join and the price take the
    # one-sided READs' RTT where a path has them
    kinds = ["tcp_lat", "rdma_rc_lat", "rdma_rc_read", "rdma_ud", "tcp_bw"]
    stale_after_s = 30.0
    otlp_http_listen = "0.0.0.0:4318"   # OTLP over HTTP beside the gRPC receiver
    http_body_timeout_s = 30.0  # HTTP bounds (fabricprobe/core/web.py Limits)
    http_per_source = 32        # connections from one address, per HTTP server
    host_attributes = ["host.name", "service.instance.id", "k8s.pod.ip", "server.address"]
    host_aliases = { "vllm-decode-0" = "gpu-node-17" }   # engine host value -> agent host
    host_rewrite = [["^(.*)-vllm-[0-9]+$", '\\1']]       # regex, replacement
    tls_cert = "/etc/fabricprobe/collector.pem"
    tls_key = "/etc/fabricprobe/collector.key"
    client_ca = "/etc/fabricprobe/ca.pem"
    windows_dir = "/var/lib/fabricprobe-collector/windows"   # raw windows as Parquet
    etcd = "etcd-1.example:2379"    # one shard of many (collector/shard.py)
    shard_name = "collector-a"
    advertise = "collector-a.example:4794"
    windows_max_bytes = 1073741824
    detail_worst_k = 10        # /metrics shows the worst 10 paths of each probe kind...
    detail_max_paths = 500     # ...and at most 500 paths in all (collector/detail.py)
    drift_min_group = 3        # hosts of one ToR or role before any is called different
    drift_waivers = [          # known differences, shown but not alerted on
        { host = "gpu-node-4*", check = "firmware", reason = "canary", until = 2027-01-31 },
    ]
"""

from __future__ import annotations

from dataclasses import dataclass

from fabricprobe.collector.auth import Authenticator
from fabricprobe.collector.configsections import (
    AccessSettings,
    ApiPortSettings,
    DetailSettings,
    DriftSettings,
    EngineSettings,
    FabricSettings,
    HttpSettings,
    ListenSettings,
    PlanSettings,
    ShardSettings,
    WindowsSettings,
)
from fabricprobe.collector.drift import parse_waivers
from fabricprobe.collector.service import ApiConfig, ServerConfig
from fabricprobe.collector.shard import ShardConfig
from fabricprobe.core import settings


@dataclass
class CollectorSettings(
    ShardSettings,
    FabricSettings,
    DriftSettings,
    DetailSettings,
    WindowsSettings,
    ApiPortSettings,
    HttpSettings,
    AccessSettings,
    PlanSettings,
    EngineSettings,
    ListenSettings,
):
    """Every setting of `probe collector`, its sections' in one flat table (their
    declarations are in collector/configsections.py, the last base's first);
    `settings.load(CollectorSettings, "collector", ...)` fills one, `server_config()` and
    `authenticator()` turn it into the server's."""

    def shard_config(self) -> ShardConfig | None:
        """The shard's settings, or None without etcd."""
        return self.shard_at(self.listen)

    def authenticator(self) -> Authenticator:
        """The authentication mode asked for; plain text only with `insecure`."""
        return self.credentials(frozenset(self.reader_names), frozenset(self.ingest_names))

    def server_config(self) -> ServerConfig:
        settings.check(self)
        plan = self.plan_config()
        raw = self.raw_config(flush_s=min(30.0, max(1.0, self.report_interval_s)))
        self.check_web_config()
        self.check_streams()
        return ServerConfig(
            shard=self.shard_config(),
            fabric=self.fabric_config(self.report_interval_s),
            raw=raw,
            detail=self.detail_config(fresh_s=self.stale_after_s),
            drift_min_group=self.drift_min_group,
            drift_waivers=parse_waivers(self.drift_waivers),
            listen=self.listen,
            metrics_listen=self.metrics_listen,
            otlp_http_listen=self.otlp_http_listen,
            match=self.match_config(),
            kv_models=self.kv_shapes(),
            why_requests=self.why_requests,
            web_config=self.web_config,
            http=self.http_limits(),
            workers=self.workers,
            grace=self.grace_s,
            stale_after=self.stale_after_s,
            forget_after=self.forget_after_s,
            api=ApiConfig(
                report_interval_ms=int(self.report_interval_s * 1000),
                plan=plan,
                fleet_networks=tuple(self.networks()),
                trust_local_registration=self.trust_loopback,
            ),
            gate=self.gate_config(),
        )
