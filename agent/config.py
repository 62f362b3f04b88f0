"""Agent settings: defaults, overridden by a TOML file's [agent] table, then by flags.

Example file::

    [agent]
    host = "gpu-node-17"
    collector = "collector.example:4794"
    topology = "tor-a12"
    role = "decode"               # hosts are compared with their ToR's and their role's
    validate_interval_s = 3600    # the RoCE checks, hourly (jittered); 0 runs none
    validate_policy = "/etc/fabricprobe/roce.toml"   # what `probe validate --policy` takes
    probe_listen = "0.0.0.0:4793"
    metrics_listen = "127.0.0.1:9795"   # this host's own /metrics
    spool_dir = "/var/lib/fabricprobe/spool"
    spool_max_windows = 8640      # a day of 10 s windows
    spool_max_bytes = 67108864    # 64 MiB
    token_file = "/etc/fabricprobe/token"
    probe_token_file = "/etc/fabricprobe/probe-token"   # the fleet's, the same on every host
    nixl_metrics = ["http://127.0.0.1:8000/metrics"]   # engines' NIXL telemetry (agent/nixl.py)
"""

from __future__ import annotations

import dataclasses
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricprobe.agent.nixl import check_url
from fabricprobe.agent.spool import DEFAULT_MAX_BYTES, DEFAULT_MAX_WINDOWS
from fabricprobe.core.errors import ConfigError


@dataclass
class AgentConfig:
    host: str = field(default_factory=socket.gethostname)
    collector: str = "127.0.0.1:4794"
    topology: str = ""
    role: str = ""  # what the host does ("prefill", "decode"): drift compares by role too
    addresses: list[str] = field(default_factory=list)  # empty: discover
    devices: list[str] = field(
        default_factory=list
    )  # RDMA devices that are this host's; empty: all
    probe_listen: str = "0.0.0.0:4793"
    metrics_listen: str = ""  # this host's own /metrics (agent/exporter.py); "" serves none
    window_s: float = 10.0  # until the collector says otherwise
    spool_dir: str = "/var/lib/fabricprobe/spool"
    spool_max_windows: int = DEFAULT_MAX_WINDOWS
    spool_max_bytes: int = DEFAULT_MAX_BYTES
    sysfs_root: str = "/sys"
    ethtool: bool = True
    counters_keyframe_every: int = 6  # windows between reports that carry every counter
    jitter: float = 0.2
    probe_timeout: float = 1.0
    probe_workers: int = 4
    insecure: bool = False  # plain text to the collector, open responder: only when asked for
    token_file: str = ""
    # the fleet's shared probe token: this responder serves, and this prober proves
    # itself to, only hosts holding it (fabricprobe.probes.fleet)
    probe_token_file: str = ""
    probe_max_keepalive_s: float = 600.0  # longest a peer's kept link is held here
    # the host reference (agent.reference_spec): a TCP probe of this host's own responder
    host_reference: bool = True
    # the self-throttle: probe intervals stretch (up to 4x, never a stop) while the agent
    # uses more than cpu_budget of a core or the host's CPU pressure is over pressure_limit
    cpu_budget: float = 0.01
    pressure_limit: float = 0.5
    proc_root: str = "/proc"
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""  # TLS name to expect from the collector, if not its address
    # `probe validate` on a schedule (agent/validation.py): every this many seconds,
    # jittered, the first run within validate_first_s of the start; 0 runs none
    validate_interval_s: float = 3600.0
    validate_first_s: float = 60.0
    validate_policy: str = ""  # a policy file as `probe validate --policy` takes
    # /metrics URLs of this host's engines (vLLM's vllm:nixl_* series) or NIXL exporters
    nixl_metrics: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if not self.host or any(c.isspace() for c in self.host):
            raise ConfigError(f"host: {self.host!r} is not a host name")
        if not 0.1 <= self.window_s <= 3600:
            raise ConfigError("window_s: must be within 0.1..3600")
        if self.counters_keyframe_every < 1:
            raise ConfigError("counters_keyframe_every: must be >= 1")
        if not 0 <= self.jitter < 1:
            raise ConfigError("jitter: must be within 0..1")
        if self.spool_max_windows < 1 or self.spool_max_bytes < 4096:
            raise ConfigError("spool bounds: at least 1 window and 4096 bytes")
        if not (self.insecure or self.token_file or self.ca_file):
            raise ConfigError(
                "no credentials: give --token-file or --ca-file (TLS), or --insecure for plain text"
            )
        if not (self.insecure or self.probe_token_file):
            raise ConfigError(
                "no probe credentials: give --probe-token-file (the fleet's probe token), "
                "or --insecure for an open responder"
            )
        if self.validate_interval_s != 0 and not 60 <= self.validate_interval_s <= 86400:
            raise ConfigError("validate_interval_s: 0 (off) or within 60..86400")
        if not 0 <= self.validate_first_s <= 86400:
            raise ConfigError("validate_first_s: must be within 0..86400")
        if self.validate_policy and not Path(self.validate_policy).is_file():
            raise ConfigError(f"validate_policy: {self.validate_policy}: no such file")
        if len(self.role) > 128 or any(c.isspace() for c in self.role):
            raise ConfigError(f"role: {self.role[:40]!r} is not a label (no spaces, 128 at most)")
        if not 0.0001 <= self.cpu_budget <= 4:
            raise ConfigError("cpu_budget: a share of a core within 0.0001..4")
        if not 0 < self.pressure_limit <= 1:
            raise ConfigError("pressure_limit: a share of the time within 0..1")
        if not 0 <= self.probe_max_keepalive_s <= 600:
            raise ConfigError("probe_max_keepalive_s: must be within 0..600")
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("cert_file and key_file go together")
        for url in self.nixl_metrics:
            try:
                check_url(url)
            except ValueError as e:
                raise ConfigError(f"nixl_metrics: {e}") from None


def load_toml(path: str | Path, section: str) -> dict[str, Any]:
    """The [SECTION] table of a TOML file; ConfigError for a file that cannot be used."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from None
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{section}] is not a table")
    return table


def apply(obj: Any, values: dict[str, Any], where: str) -> None:
    """Set dataclass fields of OBJ from VALUES (dashes or underscores), checking types."""
    known = {f.name: f for f in dataclasses.fields(obj)}
    for raw_key, value in values.items():
        key = raw_key.replace("-", "_")
        if key not in known:
            raise ConfigError(f"{where}: unknown setting {raw_key!r}")
        current = getattr(obj, key)
        if isinstance(current, bool) and not isinstance(value, bool):
            raise ConfigError(f"{where}: {raw_key} must be true or false")
        if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, type(current)):
            raise ConfigError(f"{where}: {raw_key} must be a {type(current).__name__}")
        setattr(obj, key, value)
