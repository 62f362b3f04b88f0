"""What the daemons (`probe agent`, `probe collector`, `probe serve`) share: a command
whose flags come from a settings class (fabricprobe.core.settings), with --config and
the log options, and the signals that stop them."""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
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
from fabricprobe.core import settings
from fabricprobe.core.errors import ConfigError
from fabricprobe.core.logs import setup_logging

Run = Callable[[Any, str], None]


def daemon_command(
    cls: type,
    section: str,
    examples: str,
    example_key: str,
    prepare: Callable[[Any], Any] | None = None,
) -> Callable[[Run], click.Command]:
    """A daemon's command: a flag for each setting of CLS, --config (its [SECTION] table),
    --log-format and --log-level; --help shows EXAMPLES and where settings come from
    (EXAMPLE_KEY the setting it names). It loads the settings and PREPARE's view of them
    (a ConfigError from either exits 2), sets up logging, and calls the decorated
    function with what PREPARE returned (the settings without it) and the log level."""

    def make(run: Run) -> click.Command:
        @functools.wraps(run)
        def command(config_file: str | None, log_format: str, log_level: str, **flags: Any) -> None:
            try:
                cfg: Any = settings.load(
                    cls, section, file=config_file, env=settings.environ(), flags=flags
                )
                ready = prepare(cfg) if prepare else cfg
            except ConfigError as e:
                fail(str(e))
            setup_logging(log_level, log_format)
            run(ready, log_level)

        options = settings_options(cls, section)(log_format_option(log_level_option(command)))
        epilog = examples + settings_epilog(section, example_key)
        return click.command(cls=OneLineCommand, epilog=epilog)(options)

    return make


def stop_on_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call STOP (in the main thread, between its own steps)."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
