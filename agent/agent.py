"""The agent: answers probes, probes its assigned peers, samples counters and streams one
report per window to the collector through a bounded on-disk spool.

Threads: the responder (peers' probes), the scheduler and its probe workers, the window
clock (cuts a window at each aligned boundary, samples counters, spools the report) and
the sender (registers, sends spooled windows oldest first, deletes them on ack, follows
assignment changes). The sender is the only one that talks to the collector, so a
collector outage only makes the spool deeper.

Faults: a disk fault or a corrupt spool file is healed inside the spool (held in memory,
quarantined; see fabricprobe.agent.spool). Any other exception that ends one of the
agent's threads is a bug whose damage we cannot bound (a half-updated generation, a
sender that never sends again), so the agent stops as a whole instead of limping on:
`failure` names the thread, the CLI exits with EX_SOFTWARE (70), and systemd's
Restart=on-failure (or the DaemonSet) starts a fresh process that replays the spool.
The count of such ends is kept in the spool directory (`thread-failures.json`) and
reported with every window, so a crash loop shows on the collector's /metrics.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fabricprobe.agent.client import CallError, CollectorClient
from fabricprobe.agent.config import AgentConfig
from fabricprobe.agent.counters import ChangeFilter, CounterSampler, netdevs_of
from fabricprobe.agent.flows import QpReader
from fabricprobe.agent.identity import (
    Rails,
    device_messages,
    discover_addresses,
    discover_devices,
    discover_gpus,
    host_info,
)
from fabricprobe.agent.nixl import NixlReader
from fabricprobe.agent.probing import (
    MAX_ECMP_CLASSES,
    ProbeContext,
    ProbeSpec,
    Scheduler,
    Sink,
    class_specs,
)
from fabricprobe.agent.probing import Runner as ProbeRunner
from fabricprobe.agent.rdma_runners import all_runners
from fabricprobe.agent.selfload import Readers, SelfLoad
from fabricprobe.agent.sender import Sender
from fabricprobe.agent.spool import Spool, SpoolKey
from fabricprobe.agent.tracing import ClassTracer
from fabricprobe.agent.validation import ValidationSchedule
from fabricprobe.agent.window import WindowAggregator
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ConfigError, ParseError
from fabricprobe.core.hostport import parse_hostport
from fabricprobe.probes.control import SessionTable
from fabricprobe.probes.ethtool import Runner, run_command
from fabricprobe.probes.fleet import FleetToken
from fabricprobe.probes.hostload import CpuPressure
from fabricprobe.probes.measure import spin_seconds
from fabricprobe.probes.rails import parse_rails
from fabricprobe.probes.rdma.sessions import probe_sessions
from fabricprobe.probes.responder import Responder
from fabricprobe.probes.sysfs import RdmaDevice
from fabricprobe.probes.threads import name_os_thread

if TYPE_CHECKING:
    from fabricprobe.agent.exporter import MetricsServer

log = logging.getLogger("fabricprobe.agent")

# Sessions the agent's responder runs at once: up to 64 probing peers with six kept links
# each (TCP, RC, and UD in the collector's default of 4 ECMP classes;
# fabricprobe.agent.probing.Links), and room for one-shot sessions. An idle link holds a
# thread blocked on a socket (and, for RDMA, a QP); beyond this a prober is told `busy`.
MAX_SESSIONS = 416
# One peer's share: its kept links (TCP, RC, UD in up to MAX_ECMP_CLASSES classes) and a
# few one-shot sessions.
MAX_PER_SOURCE = 2 + MAX_ECMP_CLASSES + 4
# What all sessions together may hold: deploy/ gives the agent 128 MiB in all, and a
# peer's one-shot tcp_bw alone could ask for 64 MiB of stream buffers.
MAX_SESSION_MEMORY = 32 << 20
REFERENCE_EXCHANGES = 10  # per host-reference burst: two bursts a window
EX_SOFTWARE = 70  # sysexits.h: an internal error; the exit status when a thread died
FAILURES_FILE = "thread-failures.json"


def _probe_token(cfg: AgentConfig) -> FleetToken | None:
    """The fleet's probe token, or None for an open responder (--insecure)."""
    if not cfg.probe_token_file:
        return None
    try:
        return FleetToken.from_file(cfg.probe_token_file)
    except ValueError as e:
        raise ConfigError(f"probe_token_file: {e}") from None


class Agent:
    """One host's agent (see the module docstring). SESSIONS (kind -> handler) are what
    the responder serves, the probes' own by default; RUNNERS (kind -> runner) what the
    scheduler runs, TCP and RDMA where pyverbs loads by default; READERS where the agent's
    figures about itself come from (this process's by default)."""

    def __init__(
        self,
        cfg: AgentConfig,
        *,
        client: CollectorClient | None = None,
        ethtool_runner: Runner = run_command,
        clock: Callable[[], int] = time.time_ns,
        sessions: SessionTable | None = None,
        runners: Mapping[str, ProbeRunner] | None = None,
        readers: Readers | None = None,
    ) -> None:
        cfg.validate()
        self.cfg, self.clock = cfg, clock
        self.epoch = self._window_start = clock()
        self.seq = self.generation = 0
        self.window_s = cfg.window_s
        self.spool = _spool(cfg)
        listen_host, listen_port = parse_hostport(cfg.probe_listen, 4793, allow_port_zero=True)
        self.devices, self.rails = _devices(cfg, listen_host)
        self.sampler = _sampler(cfg, self.devices, ethtool_runner)
        self.nixl = NixlReader(list(cfg.nixl_metrics), timeout=min(1.0, cfg.window_s / 4))
        token = _probe_token(cfg)
        self.responder = _responder(cfg, listen_host, listen_port, sessions, token)
        self.runners = dict(all_runners() if runners is None else runners)
        self.addresses, self.source = _addresses(cfg, listen_host, self.devices, self.rails)
        self.changed = ChangeFilter(cfg.counters_keyframe_every)
        self.aggregator = WindowAggregator()
        self.scheduler = _scheduler(cfg, self.source, token, self.aggregator.add, self.runners)
        self.checks = _checks(cfg, ethtool_runner)
        self.load = _self_load(cfg, readers)
        self.sender = Sender(cfg, self, client)
        self._stop, self._wake = threading.Event(), threading.Event()
        self._threads: list[threading.Thread] = []
        self.last_report: pb.WindowReport | None = None  # the newest window, for /metrics
        self.latest_counters: list[pb.CounterReading] = []  # every counter, last read
        self.metrics = _metrics(cfg, self) if cfg.metrics_listen else None
        self.failures = FailureLog(Path(cfg.spool_dir) / FAILURES_FILE)
        self.tracer = ClassTracer(self.source, rail_sources=self.rails.rail_sources())
        self.qps = QpReader.of(cfg.qp_interval_s, self.devices, self.rails.rail, ethtool_runner)

    @property
    def failure(self) -> str | None:
        """ "thread: error" once one of the agent's threads died, else None."""
        return self.failures.failure

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self.responder.start()
        # before the window loop: its first cut checks that the scheduler runs
        self.scheduler.start()
        self._threads = [
            threading.Thread(
                target=self._supervised,
                args=(name, fn),
                name=name,
                daemon=True,
            )
            for name, fn in (
                ("responder", self.responder.serve_forever),
                ("windows", self._window_loop),
                ("sender", lambda: self.sender.loop(self._stop, self._wake)),
                ("tracer", lambda: self.tracer.loop(self._stop)),
                *([("checks", self._checks_loop)] if self.checks is not None else []),
            )
        ]
        for t in self._threads:
            t.start()
        if self.metrics is not None:
            self.metrics.start()
        log.info(
            "agent started host=%s collector=%s probe_port=%d addresses=%s devices=%s spool=%s",
            self.cfg.host,
            self.cfg.collector,
            self.responder.port,
            self.addresses,
            [d.name for d in self.devices],
            self.cfg.spool_dir,
        )

    def _supervised(self, name: str, fn: Callable[[], None]) -> None:
        name_os_thread(name)
        try:
            fn()
        except Exception as e:  # logged and acted on here: the thread ends quietly
            self._thread_died(name, e)

    def _thread_died(self, name: str, e: BaseException) -> None:
        """Record that thread NAME ended on E and stop the agent (see the module docstring)."""
        self.failures.died(name, e)
        self.stop()

    def stop(self) -> None:
        """Ask the agent to finish; safe from a signal handler."""
        self._stop.set()
        self._wake.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stop() was called (or TIMEOUT); True once stopping."""
        return self._stop.wait(timeout)

    def close(self, flush_timeout: float = 2.0) -> None:
        """Stop probing, spool the last window, try to send it, stop answering probes."""
        self.stop()
        self.scheduler.stop()
        for t in self._threads[1:]:
            t.join()
        try:
            self.cut_window()
        except Exception as e:  # the process is ending anyway: flush what is spooled
            log.error("last window not cut: %s", e)
        deadline = time.monotonic() + flush_timeout
        while self.spool.depth and self.sender.registered and time.monotonic() < deadline:
            try:
                if not self.sender.send_batch():
                    break
            except CallError:
                break  # the spool keeps what is left for the next start
            except Exception as e:
                log.error("flush at shutdown stopped: %s", e)
                break
        self.responder.stop()
        if self._threads:  # started
            self._threads[0].join()
        if self.metrics is not None:
            self.metrics.stop()
        self.sender.client.close()
        log.info(
            "agent stopped host=%s acked=%d spooled=%d",
            self.cfg.host,
            self.sender.acked,
            self.spool.depth,
        )

    def run(self) -> None:
        """start(), then block until stop(), then close()."""
        self.start()
        self._stop.wait()
        self.close()

    # -- windows ------------------------------------------------------------------------

    def _window_loop(self) -> None:
        while not self._stop.is_set():
            now = self.clock() / 1e9
            boundary = (int(now / self.window_s) + 1) * self.window_s
            if self._stop.wait(max(0.0, boundary - now)):
                return
            self.cut_window()
            if not self.scheduler.running and not self._stop.is_set():
                self._thread_died("scheduler", RuntimeError("the scheduling thread ended"))
                return

    def cut_window(self) -> SpoolKey:
        """Close the current window into a report and spool it."""
        end = self.clock()
        bursts = self.aggregator.bursts
        self.seq += 1
        load, self.scheduler.slowdown = self.load.window(bursts, self.scheduler.slowdown)
        pairs, classes, rails = self.aggregator.cut_all()
        peers = {(s.dst, s.rail): s.address for s in self.scheduler.targets()}
        report = pb.WindowReport(
            host=self.cfg.host,
            epoch=self.epoch,
            seq=self.seq,
            window_start_unix_ns=self._window_start,
            window_end_unix_ns=end,
            probes=pairs,
            class_windows=classes,
            rail_windows=rails,
            class_paths=self.tracer.window(classes, peers),
            counters=self.changed((sample := self.sampler.sample()) + self.nixl.sample()),
            agent=pb.AgentStats(
                cpu_seconds=load.cpu_s,
                rss_bytes=load.rss_bytes,
                probes=bursts,
                probe_rate=load.probe_rate,
                spool_depth=self.spool.depth,
                spool_bytes=self.spool.size_bytes,
                spool_dropped=self.spool.dropped,
                spool_write_failures=self.spool.write_failures,
                spool_quarantined=self.spool.quarantined,
                spool_memory_windows=self.spool.in_memory,
                thread_failures=self.failures.count,
                links=len(self.scheduler.ctx.links),
                sessions=self.responder.active_sessions(),
                sessions_refused=self.responder.refused,
                sessions_refused_by_reason=dict(self.responder.refusals),
                self_throttle=self.scheduler.slowdown,
                cpu_share=load.share,
                cpu_pressure=-1.0 if load.pressure is None else load.pressure,
            ),
            assignment_generation=self.generation,
        )
        if (qps := self.qps.due(end / 1e9)) is not None:
            report.qps.CopyFrom(qps)
        self._window_start = end
        self.last_report, self.latest_counters = report, sample
        if self.metrics is not None:
            try:
                self.metrics.take(report)  # the RTT histograms see every window
            except Exception:  # /metrics is a view: it never stops the window loop
                log.exception("window %d not folded into /metrics", self.seq)
        key = SpoolKey(self.epoch, self.seq)
        if not self.spool.put(key, report.SerializeToString()):
            log.warning(
                "window %d not on disk (%d held in memory, %d write failures): %s",
                self.seq,
                self.spool.in_memory,
                self.spool.write_failures,
                self.spool.last_error,
            )
        self._wake.set()
        return key

    # -- collector ----------------------------------------------------------------------

    @property
    def tools_missing(self) -> set[str]:
        """Counter tools found missing on the newest sample (their counters are absent)."""
        return set(self.sampler.tools_missing)

    @property
    def inputs_skipped(self) -> dict[str, int]:
        """Outside input left out since start, by source (see exporter.SKIP_SOURCES)."""
        return {
            "sysfs": self.sampler.skipped_counters,
            "ethtool": self.sampler.skipped_lines,
            "nixl": self.nixl.skipped_lines,
        }

    @property
    def nics(self) -> list[pb.RdmaDevice]:
        """This host's devices with their rails and GPUs, as it registers them."""
        return device_messages(self.devices, self.rails)

    def host_info(self) -> pb.HostInfo:
        return host_info(
            self.cfg.host,
            self.addresses,
            self.devices,
            self.cfg.topology,
            self.responder.port,
            self.probe_kinds(),
            role=self.cfg.role,
            rails=self.rails,
        )

    def probe_kinds(self) -> list[str]:
        """Kinds this host can run and answer: RDMA ones only with an RDMA device."""
        return sorted(k for k in self.runners if self.devices or not k.startswith("rdma"))

    def apply(self, a: pb.Assignments) -> None:
        specs = assigned_specs(a, self.cfg.host, self.rails.source)
        ref = self.reference_spec()
        self.scheduler.set_targets(
            [*specs, *([ref] if ref is not None and specs else [])],
            budget=float(a.probe_budget) or None,
        )
        self.generation = a.generation
        self.qps.wanted = a.list_qps

    def reference_spec(self) -> ProbeSpec | None:
        """The host reference: the TCP latency probe against this agent's own responder.
        The kernel turns a connection to a local address around in the loopback device,
        so its RTT holds no NIC and no wire, only this host's stack and the scheduling of
        its prober and responder threads: what the host adds to every probe it sends or
        answers (the collector subtracts it; collector/attribution/join.py). It goes out with the
        windows as the path from this host to itself. None when turned off."""
        if not self.cfg.host_reference or "tcp_lat" not in self.runners:
            return None
        address = self.source or "127.0.0.1"
        return ProbeSpec(
            dst=self.cfg.host,
            address=address,
            port=self.responder.port,
            kind="tcp_lat",
            size=64,
            count=REFERENCE_EXCHANGES,
            interval_s=max(1.0, self.window_s / 2),
        )

    def counters_anew(self) -> None:
        """Every counter in the next two windows: a new shard has their rates at once."""
        self.changed.force(2)

    def _checks_loop(self) -> None:
        assert self.checks is not None
        self.checks.loop(self._stop, after=self._wake.set)  # the sender takes the verdicts


def assigned_specs(
    a: pb.Assignments, host: str, rail_sources: Mapping[str, str] | None = None
) -> list[ProbeSpec]:
    """The probes A assigns HOST (none towards itself), each target in its ECMP classes.
    A target on a rail leaves from this host's device on it (RAIL_SOURCES: device -> its
    address); one naming a device this host has no rail address for is not run, since
    any other source would cross rails."""
    sources = rail_sources or {}
    out = []
    for t in a.targets:
        if t.dst == host:
            continue
        rail = t.rail if t.HasField("rail") else None
        bind = sources.get(t.src_device, "") if rail is not None else ""
        if rail is not None and not bind:
            log.debug("target %s on rail %d: no address of device %r", t.dst, rail, t.src_device)
            continue
        spec = ProbeSpec(
            dst=t.dst,
            address=t.address,
            port=t.port,
            kind=t.kind,
            size=t.size,
            count=t.count,
            interval_s=t.interval_ms / 1000.0,
            device=t.device,
            gid=t.gid,
            rail=rail,
            local_device=t.src_device if rail is not None else "",
            bind=bind,
        )
        out.extend(class_specs(spec, t.ecmp_classes))
    return out


def _spool(cfg: AgentConfig) -> Spool:
    return Spool(cfg.spool_dir, max_windows=cfg.spool_max_windows, max_bytes=cfg.spool_max_bytes)


def _devices(cfg: AgentConfig, listen_host: str) -> tuple[list[RdmaDevice], Rails]:
    """The RDMA devices the agent uses, and each one's rail (by the configured rule) and
    GPU, with the rails that the responder listening on LISTEN_HOST answers on."""
    try:
        rule = parse_rails(cfg.rails)
    except ParseError as e:
        raise ConfigError(str(e)) from None
    devices = [d for d in discover_devices(cfg.sysfs_root) if _wanted(cfg, d)]
    gpus = discover_gpus(cfg.sysfs_root, devices)
    return devices, Rails.of(rule, devices, gpus).served_at(listen_host)


def _wanted(cfg: AgentConfig, device: RdmaDevice) -> bool:
    """Whether the agent uses DEVICE: any, or those the configuration names."""
    return not cfg.devices or device.name in cfg.devices


def _sampler(cfg: AgentConfig, devices: list[RdmaDevice], runner: Runner) -> CounterSampler:
    return CounterSampler(cfg.sysfs_root, devices, netdevs_of(devices), runner, cfg.ethtool)


def _scheduler(
    cfg: AgentConfig,
    source: str | None,
    token: FleetToken | None,
    sink: Sink,
    runners: Mapping[str, ProbeRunner],
) -> Scheduler:
    spin_s = spin_seconds(cfg.probe_spin_us)
    context = ProbeContext(source, cfg.probe_timeout, cfg.sysfs_root, token=token, spin_s=spin_s)
    return Scheduler(context, sink, jitter=cfg.jitter, workers=cfg.probe_workers, runners=runners)


def _self_load(cfg: AgentConfig, readers: Readers | None) -> SelfLoad:
    pressure = CpuPressure(Path(cfg.proc_root) / "pressure" / "cpu")
    return SelfLoad(
        pressure, cpu_budget=cfg.cpu_budget, pressure_limit=cfg.pressure_limit, readers=readers
    )


def _metrics(cfg: AgentConfig, agent: Agent) -> MetricsServer:
    """The agent's own /metrics, as node_exporter's (its web server and prometheus_client
    are loaded only then: an agent serving none holds neither in memory)."""
    from fabricprobe.agent.exporter import MetricsServer

    host, port = parse_hostport(cfg.metrics_listen, 9795, allow_port_zero=True)
    return MetricsServer(agent, host, port)


def _responder(
    cfg: AgentConfig,
    host: str,
    port: int,
    sessions: SessionTable | None,
    token: FleetToken | None,
) -> Responder:
    return Responder(
        host,
        port,
        sessions=probe_sessions() if sessions is None else sessions,
        auth=token,
        max_sessions=MAX_SESSIONS,
        max_per_source=MAX_PER_SOURCE,
        max_memory_bytes=MAX_SESSION_MEMORY,
        max_keepalive_s=cfg.probe_max_keepalive_s,
        idle_timeout=10.0,
        spin_s=spin_seconds(cfg.probe_spin_us),
    )


def _addresses(
    cfg: AgentConfig, listen_host: str, devices: list[RdmaDevice], rails: Rails
) -> tuple[list[str], str | None]:
    """The addresses the agent registers, and the one its probes leave from (None: the
    kernel's choice): those configured, else the one it listens on, else its devices'.
    Each rail device's address is registered too, after them: peers probe each rail at
    its own (the collector plans a rail only at an address the host registered)."""
    specific = listen_host not in ("0.0.0.0", "::")
    addresses = list(cfg.addresses) or ([listen_host] if specific else discover_addresses(devices))
    source = addresses[0] if (cfg.addresses or specific) and addresses else None
    addresses += [a for a in rails.addresses() if a not in addresses]
    return addresses, source


def _checks(cfg: AgentConfig, runner: Runner) -> ValidationSchedule | None:
    """Scheduled `probe validate` runs, None when turned off."""
    if cfg.validate_interval_s <= 0:
        return None
    return ValidationSchedule(
        cfg.host,
        sysfs_root=cfg.sysfs_root,
        runner=runner,
        interval_s=cfg.validate_interval_s,
        jitter=cfg.jitter,
        first_within_s=cfg.validate_first_s,
        policy_file=cfg.validate_policy,
        devices=tuple(cfg.devices),
    )


class FailureLog:
    """How many agent processes ended on a thread failure, kept in the spool directory so
    that a crash loop shows on the collector's /metrics (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failure: str | None = None  # this process's, once a thread died
        self.count, last = _read_failures(path)
        if last:
            log.warning(
                "a previous agent process ended on a thread failure (%d so far): %s",
                self.count,
                last,
            )

    def died(self, name: str, e: BaseException) -> None:
        if self.failure is None:
            self.failure = f"{name}: {type(e).__name__}: {e}"
        self.count += 1
        log.critical("agent thread %s died, stopping the agent: %s", name, self.failure)
        _write_failures(self.path, self.count, self.failure)


def _read_failures(path: Path) -> tuple[int, str | None]:
    """(count, last failure) from the failures file; (0, None) when absent or unreadable."""
    try:
        doc = json.loads(path.read_text()[:4096])
        count, last = doc.get("count"), doc.get("last")
    except (OSError, ValueError, AttributeError):
        return 0, None
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count < 1 << 63:
        return 0, None
    return count, str(last)[:500] if last is not None else None


def _write_failures(path: Path, count: int, last: str) -> None:
    """Best effort: the disk may be the very thing that failed."""
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps({"count": count, "last": last[:500]}))
        os.replace(tmp, path)
    except OSError as e:
        log.error("cannot record the thread failure in %s: %s", path, e)
