"""`probe rxe`: soft-RoCE (rdma_rxe) for laptops and CI."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from fabricprobe.cli.options import fail, json_option, print_json, sysfs_option
from fabricprobe.cli.render import devices_table
from fabricprobe.core.errors import ProbeError
from fabricprobe.probes import rxe as rxe_lib
from fabricprobe.probes.sysfs import RdmaDevice, find_gid, read_devices


@click.group()
def rxe() -> None:
    """Set up, remove and show soft-RoCE (rdma_rxe) devices.

    \b
    Examples:
      sudo probe rxe up --netdev eth0
      probe rxe status --json
      sudo probe rxe down --device rxe0
    """


def _host(sysfs_root: str) -> rxe_lib.Host:
    return rxe_lib.Host(sysfs_root=Path(sysfs_root))


@rxe.command(epilog="Example: sudo probe rxe up --netdev eth0")
@click.option("--netdev", required=True, help="Ethernet interface to run RoCE over.")
@click.option("--name", default=None, help="Device name (default: the first free rxeN).")
@sysfs_option
def up(netdev: str, name: str | None, sysfs_root: str) -> None:
    """Load rdma_rxe and add a soft-RoCE device on NETDEV."""
    try:
        dev = rxe_lib.up(_host(sysfs_root), netdev, name)
    except ProbeError as e:
        fail(str(e))
    _print_devices([dev])
    if find_gid(dev) is None:  # the probes need one; rxe adds it when the netdev has an address
        click.echo(
            f"probe: warning: {dev.name} has no RoCE v2 GID of an IPv4 address yet: give "
            f"{netdev} one (ip addr add ADDR/LEN dev {netdev}), then check `probe rxe status`",
            err=True,
        )


@rxe.command(epilog="Example: sudo probe rxe down --device rxe0")
@click.option("--device", default=None, help="Device to remove (default: every soft-RoCE device).")
@sysfs_option
def down(device: str | None, sysfs_root: str) -> None:
    """Remove one soft-RoCE device, or all of them."""
    try:
        removed = rxe_lib.down(_host(sysfs_root), device)
    except ProbeError as e:
        fail(str(e))
    click.echo(f"removed: {', '.join(removed)}" if removed else "no soft-RoCE devices to remove")


@rxe.command(epilog="Example: probe rxe status --json")
@click.option("--all", "show_all", is_flag=True, help="Show hardware RDMA devices too.")
@json_option
@sysfs_option
def status(show_all: bool, as_json: bool, sysfs_root: str) -> None:
    """Show soft-RoCE devices: ports, state, netdev and every GID with its type and index."""
    try:
        devices = read_devices(sysfs_root)
    except ProbeError as e:
        fail(str(e))
    if not show_all:
        devices = [d for d in devices if rxe_lib.is_soft_roce(d)]
    if as_json:
        print_json([_device_dict(d) for d in devices])
        return
    if not devices:
        click.echo("no soft-RoCE devices (create one with `sudo probe rxe up --netdev IF`)")
        return
    _print_devices(devices)


def _device_dict(d: RdmaDevice) -> dict[str, object]:
    return {
        "device": d.name,
        "driver": d.driver,
        "netdev": d.parent_netdev,
        "ports": [
            {
                "port": p.number,
                "state": p.state,
                "phys_state": p.phys_state,
                "link_layer": p.link_layer,
                "gids": [
                    {"index": g.index, "gid": g.gid, "type": g.type, "netdev": g.netdev}
                    for g in p.gids
                ],
            }
            for p in d.ports
        ],
    }


def _print_devices(devices: list[RdmaDevice]) -> None:
    Console(width=160).print(devices_table(devices))
