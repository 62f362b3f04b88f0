"""`probe serve`: the responder that `probe tcp`, `probe lat` and `probe bw` probe."""

from __future__ import annotations

import signal
import sys
from types import FrameType

import click

from fabricprobe.cli.options import OneLineCommand, fail, log_format_option, log_level_option
from fabricprobe.cli.sessions import served_sessions
from fabricprobe.core.errors import ProbeError
from fabricprobe.core.hostport import DEFAULT_PORT, format_hostport, parse_hostport
from fabricprobe.core.logs import setup_logging
from fabricprobe.probes.control import MAX_KEEPALIVE_S
from fabricprobe.probes.fleet import FleetToken
from fabricprobe.probes.responder import Responder, log


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe serve --token-file /etc/fabricprobe/probe-token     # every address, port 4793
  probe serve --token-file T --listen 10.0.0.2:4793          # one host's address
  probe serve --insecure --listen [::1]:5000 --max-sessions 4 --idle-timeout 10""",
)
@click.option(
    "--listen",
    default=f"0.0.0.0:{DEFAULT_PORT}",
    show_default=True,
    metavar="ADDR[:PORT]",
    help="Address and port to accept probe sessions on (port 0 picks a free one).",
)
@click.option(
    "--max-sessions",
    type=click.IntRange(1, 1024),
    default=16,
    show_default=True,
    help="Sessions served at once; more are refused with 'busy', never queued.",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(0.01, 3600),
    default=30.0,
    show_default=True,
    help="Seconds a session may wait for its prober before it is ended.",
)
@click.option(
    "--max-per-source",
    type=click.IntRange(1, 1024),
    default=8,
    show_default=True,
    help="Sessions (and connections still in their hello) one source address may hold.",
)
@click.option(
    "--max-memory",
    type=click.IntRange(1, 65536),
    default=64,
    show_default=True,
    metavar="MIB",
    help="Memory all sessions together may hold (buffers, registered memory), in MiB.",
)
@click.option(
    "--max-keepalive",
    type=click.FloatRange(0, MAX_KEEPALIVE_S),
    default=MAX_KEEPALIVE_S,
    show_default=True,
    help="Longest a kept link is held between rounds, whatever the prober asks.",
)
@click.option(
    "--hello-timeout",
    type=click.FloatRange(0.01, 60),
    default=2.0,
    show_default=True,
    help="Seconds a new connection has to say (and prove) who it is.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The fleet's probe token: only probers that hold it are served.",
)
@click.option("--insecure", is_flag=True, help="Serve anyone, without a token (a lab, loopback).")
@log_level_option
@log_format_option
def serve(
    listen: str,
    max_sessions: int,
    idle_timeout: float,
    max_per_source: int,
    max_memory: int,
    max_keepalive: float,
    hello_timeout: float,
    token_file: str | None,
    insecure: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Answer probe sessions from peers until SIGINT or SIGTERM.

    With --token-file a prober must prove it holds the fleet's token (HMAC of a fresh
    nonce; the token never crosses the wire); --insecure serves anyone. Logs one line
    per session on stderr (at info): the prober, the session kind, how it ended.
    `--log-level warning` keeps only what went wrong.
    """
    try:
        host, port = parse_hostport(listen, DEFAULT_PORT, allow_port_zero=True)
    except ValueError as e:
        fail(f"--listen: {e}")
    auth = fleet_token(token_file, insecure)
    setup_logging(log_level, log_format)
    responder = Responder(
        host,
        port,
        sessions=served_sessions(),
        auth=auth,
        max_sessions=max_sessions,
        max_per_source=max_per_source,
        max_memory_bytes=max_memory << 20,
        max_keepalive_s=max_keepalive,
        hello_timeout=hello_timeout,
        idle_timeout=idle_timeout,
    )
    try:
        bound = responder.start()
    except ProbeError as e:
        fail(str(e), 1)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        responder.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
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
