"""`probe serve`: the responder that `probe tcp`, `probe lat` and `probe bw` probe."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from fabricprobe.cli.daemon import daemon_command, stop_on_signals
from fabricprobe.cli.options import fail
from fabricprobe.cli.sessions import served_sessions
from fabricprobe.core.errors import ProbeError
from fabricprobe.core.hostport import DEFAULT_PORT, format_hostport, parse_hostport
from fabricprobe.core.settings import LISTEN, setting
from fabricprobe.probes.control import MAX_KEEPALIVE_S
from fabricprobe.probes.fleet import FleetToken
from fabricprobe.probes.measure import MAX_SPIN_US, SPIN_US_HELP, spin_seconds
from fabricprobe.probes.responder import Responder, log


@dataclass
class ServeConfig:
    """What `probe serve` is told: the [serve] table of --config, FABRICPROBE_SERVE_*
    variables and flags, declared once (fabricprobe.core.settings)."""

    listen: str = setting(
        f"0.0.0.0:{DEFAULT_PORT}",
        "Address and port to accept probe sessions on (port 0 picks a free one).",
        check=LISTEN,
    )
    max_sessions: int = setting(
        16, "Sessions served at once; more are refused with 'busy', never queued.", lo=1, hi=1024
    )
    idle_timeout_s: float = setting(
        30.0, "Seconds a session may wait for its prober before it is ended.", lo=0.01, hi=3600
    )
    max_per_source: int = setting(
        8,
        "Sessions (and connections still in their hello) one source address may hold.",
        lo=1,
        hi=1024,
    )
    max_memory_mib: int = setting(
        64,
        "Memory all sessions together may hold (buffers, registered memory), in MiB.",
        lo=1,
        hi=65536,
        flag="--max-memory",
        metavar="MIB",
    )
    max_keepalive_s: float = setting(
        MAX_KEEPALIVE_S,
        "Longest a kept link is held between rounds, whatever the prober asks.",
        lo=0,
        hi=MAX_KEEPALIVE_S,
    )
    hello_timeout_s: float = setting(
        2.0, "Seconds a new connection has to say (and prove) who it is.", lo=0.01, hi=60
    )
    token_file: str = setting(
        "", "The fleet's probe token: only probers that hold it are served.", metavar="FILE"
    )
    insecure: bool = setting(False, "Serve anyone, without a token (a lab, loopback).")
    spin_us: int = setting(-1, SPIN_US_HELP, lo=-1, hi=MAX_SPIN_US)


EXAMPLES = """\b
Examples:
  probe serve --token-file /etc/fabricprobe/probe-token     # every address, port 4793
  probe serve --token-file T --listen 10.0.0.2:4793          # one host's address
  probe serve --insecure --listen [::1]:5000 --max-sessions 4 --idle-timeout 10"""


@daemon_command(ServeConfig, "serve", EXAMPLES, "max_sessions")
def serve(cfg: ServeConfig, log_level: str) -> None:
    """Answer probe sessions from peers until SIGINT or SIGTERM.

    With --token-file a prober must prove it holds the fleet's token (HMAC of a fresh
    nonce; the token never crosses the wire); --insecure serves anyone. Logs one line
    per session on stderr (at info): the prober, the session kind, how it ended.
    `--log-level warning` keeps only what went wrong.
    """
    host, port = parse_hostport(cfg.listen, DEFAULT_PORT, allow_port_zero=True)
    auth = fleet_token(cfg.token_file or None, cfg.insecure)
    responder = Responder(
        host,
        port,
        sessions=served_sessions(),
        auth=auth,
        max_sessions=cfg.max_sessions,
        max_per_source=cfg.max_per_source,
        max_memory_bytes=cfg.max_memory_mib << 20,
        max_keepalive_s=cfg.max_keepalive_s,
        hello_timeout=cfg.hello_timeout_s,
        idle_timeout=cfg.idle_timeout_s,
        spin_s=spin_seconds(cfg.spin_us),
    )
    try:
        bound = responder.start()
    except ProbeError as e:
        fail(str(e), 1)
    stop_on_signals(responder.stop)
    kinds = ", ".join(sorted(responder.sessions))
    who = "anyone (--insecure)" if auth is None else "the fleet (token)"
    log.info("listening on %s for %s (sessions: %s)", format_hostport(*bound), who, kinds)
    responder.serve_forever()
    log.info("stopped after %d sessions", responder.served)


def fleet_token(token_file: str | None, insecure: bool) -> FleetToken | None:
    """The token --token-file names, or None with --insecure; neither (or both) exits 2."""
    if insecure and token_file:
        fail("--token-file and --insecure: give one")
    if insecure:
        return None
    if not token_file:
        fail("no credentials: give --token-file (the fleet's probe token), or --insecure")
    try:
        return FleetToken.from_file(token_file)
    except ValueError as e:
        fail(f"--token-file: {e}")


def open_serve_argv(listen: str, *extra: str) -> list[str]:
    """The command line of an open (`--insecure`) `probe serve` on LISTEN run by this
    interpreter: for the demo, tests and benchmarks, which stay on loopback or in the lane."""
    return [sys.executable, "-m", "fabricprobe", "serve", "--insecure", "--listen", listen, *extra]
