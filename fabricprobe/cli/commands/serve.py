"""`probe serve`: the responder that `probe tcp`, `probe lat` and `probe bw` probe."""

from __future__ import annotations

import signal
from types import FrameType

import click

from fabricprobe.cli.options import OneLineCommand, fail, log_format_option, log_level_option
from fabricprobe.cli.sessions import served_sessions
from fabricprobe.core.logs import setup_logging
from fabricprobe.probes.control import DEFAULT_PORT, format_hostport, parse_hostport
from fabricprobe.probes.errors import ProbeError
from fabricprobe.probes.responder import Responder, log


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe serve                              # every address, port 4793
  probe serve --listen 10.0.0.2:4793       # one host's address on a shared machine
  probe serve --listen [::1]:5000 --max-sessions 4 --idle-timeout 10""",
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
@log_level_option
@log_format_option
def serve(
    listen: str, max_sessions: int, idle_timeout: float, log_level: str, log_format: str
) -> None:
    """Answer probe sessions from peers until SIGINT or SIGTERM.

    Logs one line per session on stderr (at info): the prober, the session kind, how it
    ended. `--log-level warning` keeps only what went wrong.
    """
    try:
        host, port = parse_hostport(listen, DEFAULT_PORT, allow_port_zero=True)
    except ValueError as e:
        fail(f"--listen: {e}")
    setup_logging(log_level, log_format)
    responder = Responder(
        host,
        port,
        max_sessions=max_sessions,
        idle_timeout=idle_timeout,
        sessions=served_sessions(),
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
    log.info("listening on %s (sessions: %s)", format_hostport(*bound), kinds)
    responder.serve_forever()
    log.info("stopped after %d sessions", responder.served)
