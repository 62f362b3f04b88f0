"""`probe collector`: the agent API (gRPC) and Prometheus /metrics for a fleet of agents."""

from __future__ import annotations

import logging
import threading

from fabricprobe.cli.daemon import daemon_command, stop_on_signals
from fabricprobe.cli.options import fail
from fabricprobe.collector.auth import Authenticator
from fabricprobe.collector.config import CollectorSettings
from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.core.shards import EtcdError

log = logging.getLogger("fabricprobe.collector")

EXAMPLES = """\b
Examples:
  probe collector --listen 0.0.0.0:4794 --metrics-listen 0.0.0.0:9794 \\
      --tls-cert c.pem --tls-key c.key --client-ca ca.pem
  probe collector --config /etc/fabricprobe/collector.toml
  FABRICPROBE_COLLECTOR_BUDGET=8 probe collector --config /etc/fabricprobe/collector.toml
  probe collector --listen 127.0.0.1:4794 --insecure --report-interval 2  # a laptop"""


def _server_parts(s: CollectorSettings) -> tuple[Authenticator, ServerConfig]:
    """The authenticator and the server's configuration the settings make."""
    return s.authenticator(), s.server_config()


@daemon_command(CollectorSettings, "collector", EXAMPLES, "report_interval_s", _server_parts)
def collector(parts: tuple[Authenticator, ServerConfig], log_level: str) -> None:
    """Take window reports from agents, plan their probes, and serve /metrics.

    Runs until SIGTERM or SIGINT, then reports NOT_SERVING and drains.
    """
    auth, cfg = parts
    server = CollectorServer(cfg, auth)
    try:
        server.start()
    except (OSError, ValueError, RuntimeError, EtcdError) as e:
        fail(f"cannot start: {e}", 1)
    done = threading.Event()
    stop_on_signals(done.set)
    done.wait()
    log.info("draining")
    server.stop()
