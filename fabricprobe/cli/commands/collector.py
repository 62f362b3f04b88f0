"""`probe collector`: the agent API (gRPC) and Prometheus /metrics for a fleet of agents."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

import click

from fabricprobe.cli.options import (
    OneLineCommand,
    fail,
    log_format_option,
    log_level_option,
    settings_epilog,
    settings_options,
)
from fabricprobe.collector.config import CollectorSettings
from fabricprobe.collector.service import CollectorServer
from fabricprobe.core import settings
from fabricprobe.core.errors import ConfigError
from fabricprobe.core.logs import setup_logging
from fabricprobe.core.shards import EtcdError

log = logging.getLogger("fabricprobe.collector")


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe collector --listen 0.0.0.0:4794 --metrics-listen 0.0.0.0:9794 \\
      --tls-cert c.pem --tls-key c.key --client-ca ca.pem
  probe collector --config /etc/fabricprobe/collector.toml
  FABRICPROBE_COLLECTOR_BUDGET=8 probe collector --config /etc/fabricprobe/collector.toml
  probe collector --listen 127.0.0.1:4794 --insecure --report-interval 2  # a laptop"""
    + settings_epilog("collector", "report_interval_s"),
)
@settings_options(CollectorSettings, "collector")
@log_format_option
@log_level_option
def collector(config_file: str | None, log_format: str, log_level: str, **flags: Any) -> None:
    """Take window reports from agents, plan their probes, and serve /metrics.

    Runs until SIGTERM or SIGINT, then reports NOT_SERVING and drains.
    """
    try:
        s = settings.load(
            CollectorSettings, "collector", file=config_file, env=settings.environ(), flags=flags
        )
        auth = s.authenticator()
        cfg = s.server_config()
    except ConfigError as e:
        fail(str(e))
    setup_logging(log_level, log_format)
    server = CollectorServer(cfg, auth)
    try:
        server.start()
    except (OSError, ValueError, RuntimeError, EtcdError) as e:
        fail(f"cannot start: {e}", 1)
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    done.wait()
    log.info("draining")
    server.stop()
