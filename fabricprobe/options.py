"""Click options and helpers shared by every `probe` command."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click

sysfs_option = click.option(
    "--sysfs",
    "sysfs_root",
    default="/sys",
    show_default=True,
    envvar="FABRICPROBE_SYSFS",
    type=click.Path(file_okay=False),
    help="Root of the sysfs tree to read (tests point it at a fixture).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def fail(message: str, code: int = 2) -> NoReturn:
    """End the command with a one-line error on stderr (exit 2 = bad usage or environment)."""
    click.echo(f"probe: error: {message}", err=True)
    sys.exit(code)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
