"""`probe agent`: answer probes, probe assigned peers, sample counters, report windows."""

from __future__ import annotations

import logging

from fabricprobe.agent.agent import EX_SOFTWARE, Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.cli.daemon import daemon_command, stop_on_signals
from fabricprobe.cli.options import fail
from fabricprobe.cli.sessions import served_sessions
from fabricprobe.core.errors import ProbeError

log = logging.getLogger("fabricprobe.agent")

EXAMPLES = """\b
Examples:
  probe agent --collector collector.example:4794 --topology tor-a12 \\
      --ca-file ca.pem --cert-file host.pem --key-file host.key
  probe agent --config /etc/fabricprobe/agent.toml
  FABRICPROBE_AGENT_TOPOLOGY=tor-a12 probe agent --config /etc/fabricprobe/agent.toml
  probe agent --collector 127.0.0.1:4794 --insecure --listen 127.0.0.2:4793 \\
      --host h2 --spool-dir /tmp/h2-spool   # one of several agents on a laptop"""


def _validated(cfg: AgentConfig) -> AgentConfig:
    cfg.validate()
    return cfg


@daemon_command(AgentConfig, "agent", EXAMPLES, "probe_listen", prepare=_validated)
def agent(cfg: AgentConfig, log_level: str) -> None:
    """Run this host's agent until SIGTERM or SIGINT, then spool and flush the last window."""
    if log_level != "debug":  # one line per answered probe is too much for a fleet
        logging.getLogger("fabricprobe.responder").setLevel(logging.WARNING)
    try:
        the_agent = Agent(cfg, sessions=served_sessions())
        the_agent.start()
    except (ProbeError, OSError, ValueError) as e:
        fail(f"cannot start: {e}", 1)
    stop_on_signals(the_agent.stop)
    the_agent.wait()
    the_agent.close()
    if the_agent.failure:
        # A dead thread: exit non-zero so systemd's Restart=on-failure starts a fresh agent.
        fail(f"agent thread died: {the_agent.failure}", EX_SOFTWARE)
