"""Terminal output shared by the probe commands: latency tables, loss and retransmit
lines, progress bars."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from fabricprobe.core.stats import LatencySummary, one_way_from_rtt
from fabricprobe.probes.counters import CounterDelta
from fabricprobe.probes.loss import LossEstimate
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


def loss_estimate_lines(e: LossEstimate, margin: float = 0.01) -> list[str]:
    """Exchanges sent, answered and lost; the loss ratio with its interval; and how many
    exchanges a run at this ratio needs for ±MARGIN."""
    need = e.exchanges_for(margin)
    points = f"±{margin * 100:g} point{'s' if margin != 0.01 else ''}"
    enough = (
        f"this run's {e.sent:,} are enough"
        if e.sent >= need
        else f"this run had {e.sent:,}: give --iters {need}"
    )
    return [
        f"exchanges: {e.sent:,} sent, {e.answered:,} answered, {e.lost:,} lost",
        f"loss: {e.ratio:.2%} (Wilson {e.confidence:.0%} interval {e.low:.2%} .. {e.high:.2%}, "
        f"±{e.margin * 100:.2f} points)",
        f"{points} at this loss needs {need:,} exchanges; {enough}",
    ]


def retransmit_lines(
    device: str,
    port: int,
    changes: Mapping[str, CounterDelta] | None,
    ack_timeout_s: float,
    *,
    stream: bool = False,
) -> list[str]:
    """The retransmit counters' changes over an RC run (None: the port has no
    hw_counters/), and what RC does with loss: in a ping-pong, or a STREAM's goodput."""
    where = f"{device} port {port}"
    if changes is None:
        lines = [f"retransmit counters: {where} has no hw_counters/, they cannot be read here"]
    elif not changes:
        lines = [f"retransmit counters: none among the hw_counters of {where}"]
    else:
        moved = "  ".join(
            f"{name} +{d.delta:,}" + (" (wrapped)" if d.wrapped else "")
            + (" (reset: from 0)" if d.reset else "")
            for name, d in changes.items()
        )  # fmt: skip
        lines = [
            f"retransmit counters of {where} over the run (hw_counters; the whole port, "
            f"so other traffic on it counts too): {moved}",
        ]
    lines.append(
        "RC hides loss as delay: the NIC sends a dropped packet again (after a sequence "
        f"NAK, or when its ACK timer of {ack_timeout_s * 1e3:.0f} ms runs out), so every "
        + (
            "operation completes, while each resend (and a go-back-N's resent window) is "
            "bytes sent again: the goodput above is what arrived once."
            if stream
            else "exchange completes and loss reads 0, while each resend lands in one RTT "
            "sample and lifts p99. `probe lat --qp ud` counts loss as loss."
        )
    )
    return lines


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
