"""A fleet on loopback for tests: a fast collector, agents on 127.0.0.x, and waiting for
what they report. Every address is on this machine."""

from __future__ import annotations

import random
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fabricprobe.agent.config import AgentConfig
from fabricprobe.cli.sessions import served_sessions
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from fabricprobe.probes.responder import Responder

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on HOST now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def quiet_port(host: str = "127.0.0.1") -> int:
    """A port free on HOST now and outside the kernel's ephemeral range, for a server
    that binds it only after a long start (vLLM's side channel binds a minute later):
    the kernel hands out ephemeral ports to every outgoing connection meanwhile, so one
    of those could take a free_port() before the server gets to it."""
    lo, hi = _ephemeral_range()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, lo) if lo > 10000 else rng.randrange(hi + 1, 65536)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no quiet port free on {host}")


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll COND until it is true; a COND that raises OSError (a server not up yet) is
    polled again. Fails with WHAT after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def fast_server_config(port: int = 0, **kw: Any) -> ServerConfig:
    """A collector on 127.0.0.1 with 1 s windows and quick probe bursts, trusting
    registrations from this machine (the loopback fleet's agents register 127.0.0.N)."""
    kw.setdefault(
        "api",
        ApiConfig(
            report_interval_ms=1000,
            plan=PlanConfig(interval_ms=300, count=5, budget=8),
            trust_local_registration=True,  # agents on 127.0.0.N call from 127.0.0.1
        ),
    )
    return ServerConfig(listen=f"127.0.0.1:{port}", metrics_listen="127.0.0.1:0", grace=0.5, **kw)


@contextmanager
def running_collector(cfg: ServerConfig | None = None, **kw: Any) -> Iterator[CollectorServer]:
    server = CollectorServer(cfg or fast_server_config(), **kw)
    server.start()
    try:
        yield server
    finally:
        server.stop(0)


def loopback_agent_config(tmp: Path, address: str, collector_port: int, **kw: Any) -> AgentConfig:
    """An insecure agent named host-N answering on ADDRESS (127.0.0.N), no sysfs, no
    ethtool, 1 s windows; KW overrides any setting."""
    name = "host-" + address.rsplit(".", 1)[1]
    settings: dict[str, Any] = {
        "host": name,
        "collector": f"127.0.0.1:{collector_port}",
        "topology": "tor-a",
        "probe_listen": f"{address}:0",
        "spool_dir": str(tmp / name / "spool"),
        "sysfs_root": str(tmp / "no-sysfs"),
        "ethtool": False,
        "insecure": True,
        "window_s": 1.0,
        "probe_timeout": 3.0,  # a loaded CI machine must not turn into loss
        # in-process agents share the test's process: its CPU time is not the agent's, so
        # the self-throttle (agent.selfload) would answer the harness, not the agent
        "cpu_budget": 4.0,
        "pressure_limit": 1.0,
    }
    settings.update(kw)
    return AgentConfig(**settings)


def scrape(server: CollectorServer, timeout: float = 10.0) -> str:
    """The collector's /metrics text."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def open_responder(address: str = "127.0.0.1", **kw: Any) -> Responder:
    """An open (unauthenticated) in-process responder on ADDRESS with every session kind
    `probe serve` answers, the workload's kv_sink among them; a context manager."""
    kw.setdefault("sessions", served_sessions())
    kw.setdefault("auth", None)
    return Responder(address, 0, **kw)
