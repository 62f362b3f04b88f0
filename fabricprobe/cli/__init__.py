"""`probe`: the fabricprobe command line. Each command is a thin layer over library code.

Commands are imported only when they run (or when help lists them): the agent and the
collector pull in gRPC, pandas and protobuf, which a responder or a one-shot probe on a
busy host (or under emulation, where every import is slow) should not pay for.
"""

from __future__ import annotations

import importlib

import click

from fabricprobe import __version__

# command name -> "module:attribute", in the order `probe --help` lists them
COMMANDS: dict[str, str] = {
    "validate": "fabricprobe.cli.commands.validate:validate",
    "lat": "fabricprobe.cli.commands.rdma:lat",
    "bw": "fabricprobe.cli.commands.rdma:bw",
    "tcp": "fabricprobe.cli.commands.tcp:tcp",
    "serve": "fabricprobe.cli.commands.serve:serve",
    "agent": "fabricprobe.cli.commands.agent:agent",
    "collector": "fabricprobe.cli.commands.collector:collector",
    "shards": "fabricprobe.cli.commands.shards:shards",
    "rxe": "fabricprobe.cli.commands.rxe:rxe",
    "demo": "fabricprobe.cli.commands.demo:demo",
    "workload": "fabricprobe.cli.commands.workload:workload",
    "why": "fabricprobe.cli.commands.why:why",
    "trace": "fabricprobe.cli.commands.trace:trace",
    "cost": "fabricprobe.cli.commands.cost:cost",
    "windows": "fabricprobe.cli.commands.windows:windows",
    "report": "fabricprobe.cli.commands.report:report",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Run `probe COMMAND --help` for the details and examples of each command.",
)
@click.version_option(__version__, "--version", prog_name="fabricprobe")
def main() -> None:
    """fabricprobe: how much of a request's time was the fabric, which path, and why.

    \b
    Examples:
      probe validate             # is this host's RoCEv2 configuration going to deliver?
      probe lat 10.0.0.2 --tcp   # RDMA ping-pong against `probe serve`, TCP beside it
      probe rxe status           # soft-RoCE devices, ports and GIDs on this host
    """
