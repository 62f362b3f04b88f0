"""`probe agent`: answer probes, probe assigned peers, sample counters, report windows."""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Any

import click

from fabricprobe.agent.agent import EX_SOFTWARE, Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.cli.options import (
    OneLineCommand,
    fail,
    log_format_option,
    log_level_option,
    settings_epilog,
    settings_options,
)
from fabricprobe.cli.sessions import served_sessions
from fabricprobe.core import settings
from fabricprobe.core.errors import ConfigError, ProbeError
from fabricprobe.core.logs import setup_logging

log = logging.getLogger("fabricprobe.agent")


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe agent --collector collector.example:4794 --topology tor-a12 \\
      --ca-file ca.pem --cert-file host.pem --key-file host.key
  probe agent --config /etc/fabricprobe/agent.toml
  FABRICPROBE_AGENT_TOPOLOGY=tor-a12 probe agent --config /etc/fabricprobe/agent.toml
  probe agent --collector 127.0.0.1:4794 --insecure --listen 127.0.0.2:4793 \\
      --host h2 --spool-dir /tmp/h2-spool   # one of several agents on a laptop"""
    + settings_epilog("agent", "probe_listen"),
)
@settings_options(AgentConfig, "agent")
@log_format_option
@log_level_option
def agent(config_file: str | None, log_format: str, log_level: str, **flags: Any) -> None:
    """Run this host's agent until SIGTERM or SIGINT, then spool and flush the last window."""
    try:
        cfg = settings.load(
            AgentConfig, "agent", file=config_file, env=settings.environ(), flags=flags
        )
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
