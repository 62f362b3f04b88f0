"""Agent settings, each declared once (fabricprobe.core.settings): the defaults, then the
[agent] table of a TOML file (`--config`, or FABRICPROBE_AGENT_CONFIG), then environment
variables FABRICPROBE_AGENT_<NAME> (e.g. FABRICPROBE_AGENT_SPOOL_DIR), then the flags of
`probe agent` (`probe agent --help` lists each flag with its variable). Unknown sections
and keys are errors that name the file and line.

Example file::

    [agent]
    host = "gpu-node-17"
    collector = "collector.example:4794"
    etcd = "etcd-1.example:2379,etcd-2.example:2379"   # collector shards; '' for one collector
    topology = "tor-a12"
    rails = ["10.100.0.0/24=0", "10.100.1.0/24=1"]   # each RDMA device's rail, by network
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

import socket
from dataclasses import dataclass

from fabricprobe.agent.nixl import check_url
from fabricprobe.agent.spool import DEFAULT_MAX_BYTES, DEFAULT_MAX_WINDOWS
from fabricprobe.core import settings
from fabricprobe.core.errors import ConfigError
from fabricprobe.core.settings import FILE, IP, LISTEN, LISTEN_OR_OFF, NAME, PEER, Check, setting
from fabricprobe.core.shards import parse_endpoints
from fabricprobe.probes.measure import MAX_SPIN_US, SPIN_US_HELP
from fabricprobe.probes.rails import MAX_ENTRIES, check_rails

URL = Check(check_url, "URL")


def _label(text: str) -> None:
    if len(text) > 128 or any(c.isspace() for c in text):
        raise ValueError(f"{text[:40]!r} is not a label (no spaces, 128 at most)")


def _every(seconds: float) -> None:
    if seconds != 0 and seconds < 60:
        raise ValueError(f"{seconds:g} is neither 0 (off) nor within 60..86400")


ROLE = Check(_label, "LABEL", empty_ok=True)
ENDPOINTS = Check(parse_endpoints, "HOST:PORT,...", empty_ok=True)
EVERY = Check(_every, "SECONDS")
RAILS = Check(check_rails, "DEV=RAIL|CIDR=RAIL|gpu")


@dataclass
class AgentConfig:
    """Every setting of `probe agent`; `settings.load(AgentConfig, "agent", ...)` fills one."""

    host: str = setting(
        help="This host's name, its identity.",
        factory=socket.gethostname,
        shown="the system host name",
        check=NAME,
    )
    collector: str = setting("127.0.0.1:4794", "Collector's agent API.", check=PEER)
    # collector shards (collector/shard.py): the agent reads the live shards from etcd and
    # reports to the one that owns its host; `collector` is used only until etcd answers
    etcd: str = setting(
        "", "etcd endpoints listing the collector shards; '' talks to `collector`.", check=ENDPOINTS
    )
    etcd_prefix: str = setting("/fabricprobe/", "Key prefix of the shards in etcd.", metavar="KEY")
    # one small read per host every this many seconds (and at once after a failed send);
    # a dead shard's hosts move within its lease TTL plus this
    etcd_refresh_s: float = setting(
        2.0, "Seconds between reads of the shard members.", lo=0.1, hi=600
    )
    etcd_ca_file: str = setting("", "CA of etcd's certificate (https).", check=FILE)
    etcd_cert_file: str = setting("", "Client certificate for etcd (PEM).", check=FILE)
    etcd_key_file: str = setting("", "Client key for etcd (PEM).", check=FILE)
    # acknowledged windows kept to replay to a new shard when the old one died before
    # Prometheus scraped them: at least a scrape interval and a window
    handoff_keep_s: float = setting(
        60.0, "Acknowledged windows kept this long for a shard handoff, seconds.", lo=0, hi=3600
    )
    topology: str = setting("", "Topology label, e.g. the ToR switch.", metavar="LABEL")
    role: str = setting(
        "", "What the host does (prefill, decode): drift compares by role too.", check=ROLE
    )
    addresses: list[str] = setting(
        [],
        "Address peers probe (the first is the probes' source).",
        flag="--address",
        shown="discovered",
        check=IP,
    )
    devices: list[str] = setting(
        [], "RDMA device of this host.", flag="--device", shown="all", check=NAME
    )
    # which rail network each RDMA device is cabled to (fabricprobe.probes.rails): probes
    # then go device to device within a rail; none named, none used (probes as before)
    rails: list[str] = setting(
        [],
        "A device's rail: DEV=RAIL, CIDR=RAIL (its GIDs' network) or gpu (its GPU's index).",
        flag="--rail",
        shown="none",
        check=RAILS,
        max_items=MAX_ENTRIES,
    )
    probe_listen: str = setting("0.0.0.0:4793", "Responder address.", flag="--listen", check=LISTEN)
    metrics_listen: str = setting(
        "", "This host's own /metrics (agent/exporter.py); '' serves none.", check=LISTEN_OR_OFF
    )
    window_s: float = setting(10.0, "Window seconds, until the collector says.", lo=0.1, hi=3600)
    spool_dir: str = setting(
        "/var/lib/fabricprobe/spool", "Spool of unacknowledged windows.", metavar="DIR"
    )
    spool_max_windows: int = setting(
        DEFAULT_MAX_WINDOWS, "Spool bound in windows.", lo=1, hi=10_000_000
    )
    spool_max_bytes: int = setting(
        DEFAULT_MAX_BYTES, "Spool bound in bytes.", lo=4096, hi=1 << 40, shown="64 MiB"
    )
    sysfs_root: str = setting(
        "/sys",
        "Root of the sysfs tree to read (tests point it at a fixture).",
        flag="--sysfs",
        metavar="DIR",
    )
    ethtool: bool = setting(True, "Read `ethtool -S` counters.")
    counters_keyframe_every: int = setting(
        6, "Windows between reports that carry every counter.", lo=1, hi=10_000
    )
    jitter: float = setting(0.2, "Share of a probe interval spread at random.", lo=0, hi=0.9)
    probe_timeout: float = setting(
        1.0, "Seconds a probe waits for its peer.", lo=0.01, hi=600, metavar="SECONDS"
    )
    probe_workers: int = setting(4, "Probes run at once.", lo=1, hi=256)
    probe_spin_us: int = setting(-1, SPIN_US_HELP, lo=-1, hi=MAX_SPIN_US)
    # the live connected QPs on this host's devices (agent/flows.py), for the collector to
    # learn each KV transfer's links from its 5-tuple
    qp_interval_s: float = setting(
        15.0,
        "Seconds between listings of this host's live QPs (rdma resource show qp); 0: none.",
        lo=0,
        hi=3600,
        metavar="SECONDS",
    )
    insecure: bool = setting(
        False, "Plain text to the collector and an open responder: only when asked for."
    )
    token_file: str = setting("", "File holding this host's token.", check=FILE)
    # the fleet's shared probe token: this responder serves, and this prober proves
    # itself to, only hosts holding it (fabricprobe.probes.fleet)
    probe_token_file: str = setting(
        "",
        "The fleet's probe token: the responder serves, and probes, only its holders.",
        check=FILE,
    )
    probe_max_keepalive_s: float = setting(
        600.0, "Longest a peer's kept link is held here, seconds.", lo=0, hi=600
    )
    # the host reference (agent.reference_spec): a TCP probe of this host's own responder
    host_reference: bool = setting(True, "Probe this host's own responder, the host reference.")
    # the self-throttle: probe intervals stretch (up to 4x, never a stop) while the agent
    # uses more than cpu_budget of a core or the host's CPU pressure is over pressure_limit
    cpu_budget: float = setting(
        0.01, "Share of a core the agent may use before it throttles.", lo=0.0001, hi=4
    )
    pressure_limit: float = setting(
        0.5, "Host CPU pressure (PSI share of time) the agent throttles above.", lo=0.001, hi=1
    )
    proc_root: str = setting(
        "/proc", "Root of the proc tree to read.", flag="--proc", metavar="DIR"
    )
    ca_file: str = setting("", "CA of the collector (TLS).", check=FILE)
    cert_file: str = setting("", "Client certificate (PEM).", check=FILE)
    key_file: str = setting("", "Client key (PEM).", check=FILE)
    server_name: str = setting(
        "", "TLS name the collector's certificate carries, if not its address.", metavar="NAME"
    )
    # `probe validate` on a schedule (agent/validation.py): every this many seconds,
    # jittered, the first run within validate_first_s of the start; 0 runs none
    validate_interval_s: float = setting(
        3600.0,
        "Seconds between runs of the RoCE checks; 0 runs none.",
        lo=0,
        hi=86400,
        check=EVERY,
    )
    validate_first_s: float = setting(
        60.0, "The first run within this many seconds of the start.", lo=0, hi=86400
    )
    validate_policy: str = setting(
        "", "A policy file, as `probe validate --policy` takes.", check=FILE, shown="defaults"
    )
    # /metrics URLs of this host's engines (vLLM's vllm:nixl_* series) or NIXL exporters
    nixl_metrics: list[str] = setting(
        [], "/metrics of an engine on this host with NIXL telemetry.", check=URL, max_items=64
    )

    def validate(self) -> None:
        """Every setting against its declaration, then the ones that go together."""
        settings.check(self)
        if not (self.insecure or self.token_file or self.ca_file):
            raise ConfigError(
                "no credentials: give --token-file or --ca-file (TLS), or --insecure for plain text"
            )
        if not (self.insecure or self.probe_token_file):
            raise ConfigError(
                "no probe credentials: give --probe-token-file (the fleet's probe token), "
                "or --insecure for an open responder"
            )
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("cert_file and key_file go together")
        if bool(self.etcd_cert_file) != bool(self.etcd_key_file):
            raise ConfigError("etcd_cert_file and etcd_key_file go together")
        if self.etcd_cert_file and not self.etcd_ca_file:
            raise ConfigError("etcd_cert_file needs etcd_ca_file (a client certificate is https)")
