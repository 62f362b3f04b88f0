"""The `probe` command as a user meets it: --version, and --help on every command."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fabricprobe import __version__
from fabricprobe.cli import COMMANDS, main


def listed_commands(help_text: str) -> list[str]:
    section = help_text.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^  (\w+)\s", section, flags=re.M)


def test_help_lists_exactly_the_commands_that_exist() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "fabricprobe", "--help"], capture_output=True, text=True, check=True
    )
    assert listed_commands(res.stdout) == list(COMMANDS)


def test_version() -> None:
    res = CliRunner().invoke(main, ["--version"])
    assert res.exit_code == 0 and __version__ in res.output


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_help_with_an_example(name: str) -> None:
    res = CliRunner().invoke(main, [name, "--help"])
    assert res.exit_code == 0, res.output
    assert "Example" in res.output, f"probe {name} --help shows no example"


def test_an_unknown_command_is_a_usage_error() -> None:
    res = CliRunner().invoke(main, ["frobnicate"])
    assert res.exit_code == 2
