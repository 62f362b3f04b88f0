"""`probe collector`: the agent API (gRPC) and Prometheus /metrics for a fleet of agents."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

import click

from fabricprobe.agent.config import apply, load_toml
from fabricprobe.cli.options import fail, log_format_option, log_level_option
from fabricprobe.collector.config import CollectorSettings
from fabricprobe.collector.service import CollectorServer
from fabricprobe.core.errors import ConfigError
from fabricprobe.core.logs import setup_logging

log = logging.getLogger("fabricprobe.collector")


@click.command(
    epilog="""\b
Examples:
  probe collector --listen 0.0.0.0:4794 --metrics-listen 0.0.0.0:9794 \\
      --tls-cert c.pem --tls-key c.key --client-ca ca.pem
  probe collector --config /etc/fabricprobe/collector.toml
  probe collector --listen 127.0.0.1:4794 --insecure --report-interval 2  # a laptop""",
)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML file.")
@click.option("--listen", metavar="ADDR:PORT", help="Agent API address [0.0.0.0:4794].")
@click.option(
    "--metrics-listen", metavar="ADDR:PORT", help="Where /metrics is served [0.0.0.0:9794]."
)
@click.option(
    "--otlp-http-listen",
    metavar="ADDR:PORT",
    help="OTLP over HTTP (POST /v1/traces) for engines' spans [off; 0.0.0.0:4318 is usual].",
)
@click.option(
    "--fleet-network",
    "fleet_networks",
    multiple=True,
    metavar="CIDR",
    help="A network the fleet's addresses lie in (repeat); probes go nowhere else.",
)
@click.option(
    "--web-config",
    type=click.Path(dir_okay=False),
    help="TLS and basic auth for /metrics (exporter-toolkit's web-config YAML).",
)
@click.option("--report-interval", type=click.FloatRange(0.1, 3600), help="Window seconds [10].")
@click.option("--budget", type=click.IntRange(1, 1024), help="Peers each host probes [16].")
@click.option("--probe-interval", type=click.FloatRange(0.1, 3600), help="Seconds per burst [10].")
@click.option("--probe-count", type=click.IntRange(1, 10_000), help="Exchanges per burst [10].")
@click.option("--stale-after", type=click.FloatRange(1, 86400), help="Host stale after s [30].")
@click.option("--insecure", is_flag=True, default=None, help="Accept plain text, no identity.")
@click.option("--token-file", type=click.Path(dir_okay=False), help="`HOST TOKEN` lines.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="Server certificate (PEM).")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="Server key (PEM).")
@click.option("--client-ca", type=click.Path(dir_okay=False), help="CA of agent certificates.")
@click.option(
    "--windows-dir",
    type=click.Path(file_okay=False),
    help="Keep every raw window here as Parquet (`probe windows` reads it).",
)
@click.option(
    "--windows-max-bytes",
    type=click.IntRange(1 << 20),
    help="Disk budget of --windows-dir [1 GiB].",
)
@log_format_option
@log_level_option
def collector(config_file: str | None, log_format: str, log_level: str, **flags: Any) -> None:
    """Take window reports from agents, plan their probes, and serve /metrics.

    Runs until SIGTERM or SIGINT, then reports NOT_SERVING and drains.
    """
    settings = CollectorSettings()
    renames = {
        "report_interval": "report_interval_s",
        "probe_interval": "probe_interval_s",
        "stale_after": "stale_after_s",
    }
    try:
        if config_file:
            apply(settings, load_toml(config_file, "collector"), config_file)
        given = {renames.get(k, k): v for k, v in flags.items() if v is not None}
        if given.get("fleet_networks") == ():
            del given["fleet_networks"]
        elif "fleet_networks" in given:
            given["fleet_networks"] = list(given["fleet_networks"])
        apply(settings, given, "flags")
        auth = settings.authenticator()
        cfg = settings.server_config()
    except ConfigError as e:
        fail(str(e))
    setup_logging(log_level, log_format)
    server = CollectorServer(cfg, auth)
    try:
        server.start()
    except (OSError, ValueError, RuntimeError) as e:
        fail(f"cannot start: {e}", 1)
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    done.wait()
    log.info("draining")
    server.stop()
