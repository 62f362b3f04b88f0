"""`probe`: the fabricprobe command line. Each command is a thin layer over library code."""

from __future__ import annotations

import click

from fabricprobe import __version__
from fabricprobe.commands.agent import agent
from fabricprobe.commands.collector import collector
from fabricprobe.commands.rdma import bw, lat
from fabricprobe.commands.rxe import rxe
from fabricprobe.commands.serve import serve
from fabricprobe.commands.tcp import tcp
from fabricprobe.commands.validate import validate


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Run `probe COMMAND --help` for the details and examples of each command.",
)
@click.version_option(__version__, "--version", prog_name="fabricprobe")
def main() -> None:
    """fabricprobe: how much of a request's time was the fabric, which path, and why.

    \b
    Examples:
      probe rxe status           # RDMA devices, ports and GIDs on this host
      probe rxe up --netdev eth0 # soft-RoCE for a laptop or CI
    """


main.add_command(lat)
main.add_command(bw)
main.add_command(rxe)
main.add_command(serve)
main.add_command(tcp)
main.add_command(validate)
main.add_command(agent)
main.add_command(collector)
