"""`probe agent`: answer probes, probe assigned peers, sample counters, report windows."""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Any

import click

from fabricprobe.agent.agent import EX_SOFTWARE, Agent
from fabricprobe.agent.config import AgentConfig, apply, load_toml
from fabricprobe.cli.options import (
    collector_credential_options,
    fail,
    log_format_option,
    log_level_option,
    sysfs_option,
)
from fabricprobe.cli.sessions import served_sessions
from fabricprobe.core.errors import ConfigError
from fabricprobe.core.logs import setup_logging
from fabricprobe.probes.errors import ProbeError

log = logging.getLogger("fabricprobe.agent")


@click.command(
    epilog="""\b
Examples:
  probe agent --collector collector.example:4794 --topology tor-a12 \\
      --ca-file ca.pem --cert-file host.pem --key-file host.key
  probe agent --config /etc/fabricprobe/agent.toml
  probe agent --collector 127.0.0.1:4794 --insecure --listen 127.0.0.2:4793 \\
      --host h2 --spool-dir /tmp/h2-spool   # one of several agents on a laptop""",
)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML file.")
@click.option("--collector", metavar="HOST:PORT", help="Collector's agent API [127.0.0.1:4794].")
@click.option("--host", help="This host's name, its identity [the system host name].")
@click.option("--topology", help="Topology label, e.g. the ToR switch.")
@click.option(
    "--metrics-listen",
    metavar="ADDR:PORT",
    help="This host's own /metrics [127.0.0.1:9795]; '' for none.",
)
@click.option(
    "--listen", "probe_listen", metavar="ADDR:PORT", help="Responder address [0.0.0.0:4793]."
)
@click.option(
    "--address", "addresses", multiple=True, help="Address peers probe (repeat) [discovered]."
)
@click.option("--device", "devices", multiple=True, help="RDMA device of this host (repeat) [all].")
@click.option(
    "--spool-dir",
    type=click.Path(file_okay=False),
    help="Spool of unacknowledged windows [/var/lib/fabricprobe/spool].",
)
@click.option("--spool-max-windows", type=click.IntRange(1), help="Spool bound in windows [8640].")
@click.option("--spool-max-bytes", type=click.IntRange(4096), help="Spool bound in bytes [64 MiB].")
@click.option("--no-ethtool", "no_ethtool", is_flag=True, help="Do not run `ethtool -S`.")
@click.option(
    "--nixl-metrics",
    "nixl_metrics",
    multiple=True,
    metavar="URL",
    help="/metrics of an engine on this host with NIXL telemetry (repeat).",
)
@collector_credential_options("File holding this host's token.")
@click.option(
    "--probe-token-file",
    type=click.Path(dir_okay=False),
    help="The fleet's probe token: the responder serves, and probes, only its holders.",
)
@log_format_option
@log_level_option
@sysfs_option
def agent(
    config_file: str | None,
    addresses: tuple[str, ...],
    devices: tuple[str, ...],
    nixl_metrics: tuple[str, ...],
    no_ethtool: bool,
    sysfs_root: str,
    log_format: str,
    log_level: str,
    **flags: Any,
) -> None:
    """Run this host's agent until SIGTERM or SIGINT, then spool and flush the last window."""
    cfg = AgentConfig()
    try:
        if config_file:
            apply(cfg, load_toml(config_file, "agent"), config_file)
        given = {k: v for k, v in flags.items() if v is not None}
        if addresses:
            given["addresses"] = list(addresses)
        if devices:
            given["devices"] = list(devices)
        if nixl_metrics:
            given["nixl_metrics"] = list(nixl_metrics)
        if no_ethtool:
            given["ethtool"] = False
        if sysfs_root != "/sys":
            given["sysfs_root"] = sysfs_root
        apply(cfg, given, "flags")
        cfg.validate()
    except ConfigError as e:
        fail(str(e))
    setup_logging(log_level, log_format)
    if log_level != "debug":  # one line per answered probe is too much for a fleet
        logging.getLogger("fabricprobe.responder").setLevel(logging.WARNING)
    try:
        the_agent = Agent(cfg, sessions=served_sessions())
        the_agent.start()
    except (ProbeError, OSError, ValueError) as e:
        fail(f"cannot start: {e}", 1)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        the_agent.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    the_agent.wait()
    the_agent.close()
    if the_agent.failure:
        # A dead thread: exit non-zero so systemd's Restart=on-failure starts a fresh agent.
        fail(f"agent thread died: {the_agent.failure}", EX_SOFTWARE)
