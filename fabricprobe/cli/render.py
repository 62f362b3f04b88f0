"""Terminal output shared by the probe commands: latency tables and progress bars."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from fabricprobe.probes.stats import LatencySummary, one_way_from_rtt
from fabricprobe.probes.sysfs import RdmaDevice


@contextmanager
def progress_bar(show: bool, label: str, unit: str) -> Iterator[Callable[[int, int], None] | None]:
    """A transient progress bar on stderr (a no-op when not shown or not a terminal)."""
    console = Console(stderr=True)
    if not show or not console.is_terminal:
        yield None
        return
    columns = (
        TextColumn(f"{label} [dim]{unit}[/]"),
        BarColumn(),
        TaskProgressColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def fmt_us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.3f}"


def latency_table(rtts: dict[str, LatencySummary]) -> Table:
    """One RTT column and one RTT/2 column per labelled run (e.g. rdma send, tcp)."""
    table = Table()
    table.add_column("figure")
    halves = {name: one_way_from_rtt(s) for name, s in rtts.items()}
    for name in rtts:
        table.add_column(f"{name} RTT (µs)", justify="right")
        table.add_column(f"{name} one-way = RTT/2 (µs)", justify="right")
    for label, attr in (
        ("min", "min_us"),
        ("p50", "p50_us"),
        ("p90", "p90_us"),
        ("p99", "p99_us"),
        ("p99.9", "p999_us"),
        ("max", "max_us"),
        ("mean", "mean_us"),
    ):
        row = [label]
        for name, s in rtts.items():
            row += [fmt_us(getattr(s, attr)), fmt_us(getattr(halves[name], attr))]
        table.add_row(*row)
    return table


def loss_line(name: str, s: LatencySummary) -> str:
    return f"{name}: count {s.count:,}  lost {s.lost:,} ({s.loss_ratio:.3%})"


def devices_table(devices: list[RdmaDevice]) -> Table:
    """One row per GID: device, port, state, netdev, GID index, GID and its type."""
    table = Table("device", "port", "state", "phys", "netdev", "gid index", "gid", "type")
    for d in devices:
        for p in d.ports:
            if not p.gids:
                table.add_row(
                    d.name,
                    str(p.number),
                    p.state,
                    p.phys_state or "",
                    d.parent_netdev or "",
                    "",
                    "(no GIDs)",
                    "",
                )
            for g in p.gids:
                table.add_row(
                    d.name,
                    str(p.number),
                    p.state,
                    p.phys_state or "",
                    g.netdev or d.parent_netdev or "",
                    str(g.index),
                    g.gid,
                    g.type or "?",
                )
    return table
