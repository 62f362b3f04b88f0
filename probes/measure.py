"""The types every probe shares, TCP, RC and UD alike.

- `LinkParams`: where the peer is and how patiently to reach it (peer, port, bind,
  device, timeouts, engine). One-shot probes and kept links take it, whatever the
  transport.
- `LatencyRound`: one round's bare figures (RTTs in ns in an `array('q')`, losses, why
  the round stopped short), what an agent folds into its window without a sketch.
- `LatencyResult` and `BandwidthResult`: a summarised run of one measurement, each a
  `ProbeRun` (what ran towards whom, and how it ended) with its own figures; their
  `as_dict()` is the JSON the CLI prints. Fields a transport has no use for stay None
  and are left out of the JSON.
"""

from __future__ import annotations

import socket
import statistics
import time
from array import array
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from fabricprobe.core.hostport import DEFAULT_PORT
from fabricprobe.core.stats import LatencySketch, LatencySummary, one_way_from_rtt
from fabricprobe.probes.fleet import FleetToken

ENGINES = ("auto", "pyverbs", "native")


@dataclass(frozen=True)
class LinkParams:
    """How a prober reaches one peer's responder.

    `timeout` bounds the session's setup as one deadline that all its steps share
    (connect, hello, the fleet-token challenge, ready, the data connections or the local
    QP; building QPs takes seconds on a loaded host), `step_s` each exchange once it runs
    and the closing `done`; None leaves each to the probe's own default. `device` pins
    the local RDMA device (default: the one whose RoCE v2 GID maps the source address);
    `engine` picks the RDMA hot loop; `spin_s`, how long the compiled loop busy-polls for
    an answer before it sleeps on the completion event (None: its own 5 ms); `token`
    answers a responder that asks for the fleet token (fabricprobe.probes.fleet).
    TCP probes ignore `device`, `engine`, `spin_s` and `sysfs_root`.
    """

    peer: str
    port: int = DEFAULT_PORT
    bind: str | None = None
    device: str | None = None
    timeout: float | None = None
    step_s: float | None = None
    engine: str = "auto"
    sysfs_root: str = "/sys"
    spin_s: float | None = None
    token: FleetToken | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.peer:
            raise ValueError("peer: empty address")
        if isinstance(self.port, bool) or not 1 <= self.port <= 65535:
            raise ValueError(f"port {self.port!r} outside 1..65535")
        for name in ("timeout", "step_s"):
            v = getattr(self, name)
            if v is not None and not 0 < v <= 3600:
                raise ValueError(f"{name} {v!r} outside (0, 3600] s")
        check_spin(self.spin_s)
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")

    def setup_timeout(self, default: float) -> float:
        return default if self.timeout is None else self.timeout

    def step(self, default: float) -> float:
        return default if self.step_s is None else self.step_s


SPIN_US_HELP = (
    "Microseconds an RDMA probe loop busy-polls for an answer before it sleeps on the "
    "completion event, where many loops share few CPUs (-1: busy-poll 5 ms, then "
    "poll every 50 us; an answer found after a sleep counts the wake-up's wait for a "
    "CPU in its prober delay)."
)
MAX_SPIN_US = 1_000_000


def spin_seconds(spin_us: int) -> float | None:
    """A --spin-us setting as a loop's spin_s: None (-1, the loop's own), else seconds."""
    return None if spin_us < 0 else spin_us / 1e6


def check_spin(spin_s: float | None) -> None:
    """A compiled loop's busy-poll before it sleeps: None (its own) or 0..1 s."""
    if spin_s is not None and not 0 <= spin_s <= 1:
        raise ValueError(f"spin_s {spin_s!r} outside 0..1 s")


def clock_pair_ns(rounds: int) -> int:
    """The median cost (ns) of two back-to-back perf_counter_ns() reads in this process,
    the store of their difference into a sample array included: what each sample of a
    Python loop holds besides the exchange it times."""
    clock = time.perf_counter_ns
    pairs = array("q", bytes(8 * rounds))
    for i in range(rounds):
        t0 = clock()
        t1 = clock()
        pairs[i] = t1 - t0
    return int(statistics.median(pairs))


def _ns() -> array[int]:
    return array("q")


@dataclass(frozen=True)
class LatencyRound:
    """One round's bare figures: RTTs in ns (warm-up left out; for UD the network RTT,
    the responder's delay taken out), exchanges lost, why the round stopped short (None
    when it did not), the local device (None over TCP) and the loop's wall time. RDMA
    rounds carry the prober's own delay inside each RTT (`prober_ns`, software-timed:
    probes/rdma/ud.py and rc.py say what each bounds); UD rounds also the RTTs with the
    responder's delay (`raw_ns`), those delays, and whether the device has completion
    timestamps."""

    rtt_ns: array[int]
    lost: int
    error: str | None
    device: str | None
    duration_s: float
    raw_ns: array[int] = field(default_factory=_ns)
    delays_ns: array[int] = field(default_factory=_ns)
    prober_ns: array[int] = field(default_factory=_ns)
    hw_ts: bool = False


@dataclass(frozen=True)
class ProbeRun:
    """What both results hold: what ran (and which engine or loop timed it, and why),
    towards whom, from which address and device, and why it stopped short (`error`, None
    when it did not). These are keyword-only, after each result's own fields."""

    transport: str  # "tcp" or "rdma"
    op: str  # "pingpong" / "stream" (TCP), "send" / "write" (RC), "probe" (UD)
    peer: str
    port: int  # the responder's control port
    _: KW_ONLY
    error: str | None = None
    qp_type: str | None = None  # "rc" or "ud" (RDMA)
    engine: str | None = None  # "pyverbs" or "native" (RDMA); "python" or "native" (TCP)
    engine_reason: str | None = None
    source: str | None = None
    device: str | None = None

    def head(self, optional: tuple[str, ...]) -> dict[str, Any]:
        """The JSON keys both results start with: what ran, towards whom; then those of
        OPTIONAL that are set."""
        d: dict[str, Any] = {"transport": self.transport}
        if self.qp_type is not None:
            d["qp_type"] = self.qp_type
        if self.qp_type is not None or self.engine is not None:
            d["engine"] = self.engine
            d["engine_reason"] = self.engine_reason
        d["op"] = self.op
        d["peer"] = self.peer
        d["port"] = self.port
        for name in optional:
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        return d


@dataclass(frozen=True)
class LatencyResult(ProbeRun):
    """A summarised latency run. Figures are RTTs; one-way ones are RTT/2 and say so."""

    size: int | None
    iters: int
    summary: LatencySummary  # kind "rtt"
    duration_s: float
    sketch: LatencySketch = field(repr=False, compare=False, default_factory=LatencySketch)
    warmup: int | None = None
    loop_overhead_ns: int | None = None
    timer_overhead_ns: int | None = None
    raw_summary: LatencySummary | None = None  # UD: the RTT with the responder's delay
    responder_delay_p50_us: float | None = None
    # RDMA: the prober's own delay in each RTT (kind "delay"; probes/rdma/ud.py and rc.py
    # say what it bounds); it is still inside `summary`, as UD's responder delay is not
    prober_delay: LatencySketch | None = field(default=None, repr=False, compare=False)
    timestamps: str | None = None  # UD: "software" or "hardware"
    hw_timestamps_supported: bool | None = None

    @property
    def prober_delay_p50_us(self) -> float | None:
        if self.prober_delay is None or not self.prober_delay.count:
            return None
        return self.prober_delay.summary().p50_us

    @property
    def probes(self) -> int:
        """UD's name for its iterations."""
        return self.iters

    def one_way(self) -> LatencySummary:
        return one_way_from_rtt(self.summary)

    def as_dict(self) -> dict[str, Any]:
        d = self.head(("source", "device"))
        if self.qp_type == "ud":
            d["probes"] = self.iters
        else:
            d["size"] = self.size
            d["iters"] = self.iters
        if self.warmup is not None:
            d["warmup"] = self.warmup
        d["rtt"] = self.summary.as_dict()
        d["one_way"] = {**self.one_way().as_dict(), "derived_from": "rtt/2"}
        if self.raw_summary is not None:
            d["rtt_with_responder_delay"] = self.raw_summary.as_dict()
            d["responder_delay_p50_us"] = self.responder_delay_p50_us
            if self.prober_delay is not None:
                d["prober_delay"] = self.prober_delay.summary().as_dict()
                d["prober_delay_p50_us"] = self.prober_delay_p50_us
            d["timestamps"] = self.timestamps
            d["hw_timestamps_supported"] = self.hw_timestamps_supported
        for name in ("timer_overhead_ns", "loop_overhead_ns"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        d["duration_s"] = round(self.duration_s, 6)
        d["error"] = self.error
        return d


@dataclass(frozen=True)
class BandwidthResult(ProbeRun):
    """A summarised bandwidth run; `bytes` counts only what is known to have arrived
    (confirmed by the TCP responder, or completed RDMA operations)."""

    size: int  # bytes per operation (RC) or per send call (TCP's chunk)
    bytes: int
    duration_s: float
    iters: int | None = None  # RC: operations asked for
    completed: int | None = None  # RC: operations completed
    streams: int | None = None  # TCP: connections
    bytes_sent: int | None = None  # TCP: what left our socket buffers

    @property
    def chunk_size(self) -> int:
        return self.size

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.duration_s if self.duration_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = self.head(("source", "device", "streams"))
        if self.transport == "tcp":
            d["chunk_size"] = self.size
            d["bytes"] = self.bytes
            d["bytes_sent"] = self.bytes_sent
        else:
            d["size"] = self.size
            d["iters"] = self.iters
            d["completed"] = self.completed
            d["lost"] = (self.iters or 0) - (self.completed or 0)
        d["duration_s"] = round(self.duration_s, 6)
        d["bytes_per_second"] = round(self.bytes_per_second, 1)
        d["error"] = self.error
        return d


def source_address(peer: str, port: int, bind: str | None = None) -> str:
    """The local address the kernel would use towards PEER:PORT (a UDP connect sends
    nothing), or BIND when given."""
    if bind:
        return bind
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, port))
        return str(s.getsockname()[0])
