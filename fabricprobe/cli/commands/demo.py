"""`probe demo`: fabricprobe end to end on a small soft-RoCE fabric."""

from __future__ import annotations

import os

import click
from rich.console import Console

from fabricprobe.cli.options import OneLineCommand, fail, shown_option, sysfs_option
from fabricprobe.core.errors import ProbeError


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  make demo                                   # boots the soft-RoCE VM lane and runs this
  probe demo --fabric /run/fabricprobe-lane.json --iters 1000""",
)
@click.option(
    "--fabric",
    "fabric_file",
    default=lambda: os.environ.get("LANE_FILE"),
    help="Fabric description (JSON hosts: name, device, netdev, ip, gid_index); "
    "default: $LANE_FILE, written by the VM lane.",
)
@shown_option("--iters", click.IntRange(10, 1_000_000), 300, "Round trips per path and transport.")
@click.option(
    "--delay",
    default="2ms",
    show_default=True,
    help="Delay injected on one path to show that it is found (needs root).",
)
@sysfs_option
def demo(fabric_file: str | None, iters: int, delay: str, sysfs_root: str) -> None:
    """Measure every path of a soft-RoCE fabric: RDMA beside TCP, the slow path, counters."""
    from fabricprobe.cli import demo as demo_lib

    if not fabric_file:
        fail(
            "no fabric to run on: start the demo with `make demo`, which boots the soft-RoCE "
            "VM lane, or pass --fabric FILE"
        )
    try:
        hosts = demo_lib.load_fabric(fabric_file)
        code = demo_lib.run(
            hosts, Console(width=140), iters=iters, delay=delay, sysfs_root=sysfs_root
        )
    except ProbeError as e:
        fail(str(e), 1)
    raise SystemExit(code)
