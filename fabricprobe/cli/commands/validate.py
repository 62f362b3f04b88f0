"""`probe validate`: is this host's RoCEv2 configuration going to deliver, and how to fix it."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fabricprobe.cli.options import (
    EXISTING_DIR,
    CollectorCredentials,
    OneLineCommand,
    ask_collector,
    bind_option,
    collector_credential_options,
    collector_option,
    fail,
    json_option,
    print_json,
    shown_option,
    sysfs_option,
    timeout_option,
)
from fabricprobe.core.errors import ParseError, ProbeError
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.rails import parse_rails
from fabricprobe.probes.roce import (
    HostView,
    Policy,
    PolicyError,
    ReplayRunner,
    Report,
    Status,
    load_policy,
)
from fabricprobe.probes.roce.host import is_soft
from fabricprobe.probes.roce.live import LiveMeasurement, Measure, PathFigures
from fabricprobe.probes.roce.validate import validate as run_validation

_STYLE = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.SKIP: "dim"}

# Shapes of the live check: short, so validate stays quick on hardware; the generous
# per-step deadline lets soft-RoCE under emulation (the VM lane) finish too.
LIVE_ITERS = 1000
LIVE_BW_SECONDS = 2.0
LIVE_RDMA_BW_ITERS = 1000
LIVE_RDMA_BW_SIZE = 65536
LIVE_RDMA_STEP_S = 30.0


def probe_measure(
    sysfs_root: str,
    device: str | None,
    bind: str | None = None,
    soft: bool = False,
    timeout: float | None = None,
) -> tuple[Measure | None, str]:
    """A live measurement built on the probe libraries, or (None, why not).

    BIND is the source address: the validated netdev's, so both transports take the path
    through the device under test. SOFT (soft-RoCE) streams smaller writes with fewer in
    flight: rxe retransmits on a timer and gives up on deep queues under emulation.
    TIMEOUT (None: the probes' defaults) bounds each session's setup and each step; a
    peer that does not answer the TCP session's setup is not tried over RDMA too.
    """
    bw_size, bw_outstanding = (4096, 4) if soft else (LIVE_RDMA_BW_SIZE, 16)
    try:
        from fabricprobe.core.hostport import DEFAULT_PORT, parse_hostport
        from fabricprobe.probes import tcp as tcp_lib
        from fabricprobe.probes.control import PeerUnreachable
    except ImportError as e:  # pragma: no cover - the library ships with the package
        return None, f"the TCP probe library is missing ({e})"

    def measure(peer: str) -> LiveMeasurement:
        host, port = parse_hostport(peer, DEFAULT_PORT)
        there = LinkParams(host, port, bind=bind, timeout=timeout, step_s=timeout)
        try:
            lat = tcp_lib.run_pingpong(there, iters=LIVE_ITERS)
            bw = tcp_lib.run_throughput(there, duration=LIVE_BW_SECONDS)
            tcp: PathFigures | None = PathFigures(
                lat.summary.p50_us,
                lat.summary.p99_us,
                bw.bytes_per_second * 8 / 1e9,
                lat.error or bw.error,
            )
        except PeerUnreachable as e:  # RDMA sessions start on the same control port
            return LiveMeasurement(
                peer, PathFigures(error=f"not tried: {e}"), PathFigures(error=str(e))
            )
        except (ProbeError, OSError) as e:
            tcp = PathFigures(error=str(e))
        try:
            from fabricprobe.probes.rdma import rc
        except ImportError as e:
            return LiveMeasurement(peer, None, tcp, f"RDMA probes need pyverbs ({e})")
        try:
            rdma_link = LinkParams(
                host,
                port,
                bind=bind,
                device=device,
                sysfs_root=sysfs_root,
                timeout=timeout,
                step_s=timeout,
            )
            rl = rc.rc_latency(rdma_link, iters=LIVE_ITERS)
        except (ProbeError, OSError, ValueError) as e:
            return LiveMeasurement(peer, PathFigures(error=str(e)), tcp)
        p50, p99 = rl.summary.p50_us, rl.summary.p99_us
        if rl.error:
            return LiveMeasurement(peer, PathFigures(p50, p99, None, rl.error), tcp)
        try:
            rb = rc.rc_bandwidth(
                replace(rdma_link, step_s=timeout or LIVE_RDMA_STEP_S),
                size=bw_size,
                iters=LIVE_RDMA_BW_ITERS,
                outstanding=bw_outstanding,
            )
            gbps, err = rb.bytes_per_second * 8 / 1e9, rb.error
        except (ProbeError, OSError, ValueError) as e:
            gbps, err = None, str(e)
        rdma = PathFigures(p50, p99, gbps, f"bandwidth run: {err}" if err else None)
        return LiveMeasurement(peer, rdma, tcp)

    return measure, ""


def _source_for(view: HostView, device: str | None, netdev: str | None) -> str | None:
    """The first IPv4 address of the netdev under test, to probe the peer from."""
    if netdev is None and device is not None:
        try:
            dev = view.device(device)
        except ProbeError:
            return None
        netdev = view.netdev_of(dev, 1)
    if netdev is None:
        return None
    addrs, _ = view.addresses(netdev)
    return addrs.ipv4[0] if addrs and addrs.ipv4 else None


def _soft(view: HostView, device: str | None) -> bool:
    names = [device] if device else view.device_names()
    try:
        return bool(names) and all(is_soft(view.device(n)) for n in names)
    except ProbeError:
        return False


def nics_table(report: Report) -> Table:
    """One line per NIC with a rail or a GPU: where it sits, and how its checks went."""
    table = Table(title="NICs", pad_edge=False, expand=False)
    for col in ("device", "rail", "GPU", "PCIe", "GPU address", "checks"):
        table.add_column(col, no_wrap=True)
    for n in report.nics:
        fails, warns = report.worst(n.device)
        checks = Text(
            f"{fails} fail, {warns} warn" if fails or warns else "ok",
            style=_STYLE[Status.FAIL] if fails else _STYLE[Status.WARN] if warns else "green",
        )
        table.add_row(
            n.device,
            "-" if n.rail is None else f"rail {n.rail}",
            n.gpu or "-",
            n.gpu_link or "-",
            n.gpu_address or "-",
            checks,
        )
    return table


def render(report: Report, console: Console, verbose: bool) -> None:
    """The NICs' rails and GPUs (on a host that has them), the results table, the fix
    commands, and one summary line.

    Fix commands are printed below the table, one per line and never wrapped by the
    console (soft_wrap): a command folded at the terminal width into a table cell cannot
    be copied and pasted.
    """
    table = Table(show_lines=False, pad_edge=False, expand=False)
    table.add_column("", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("device", no_wrap=True)
    table.add_column("result", overflow="fold")
    fixes: list[tuple[str, str, str]] = []
    for r in report.results:
        where = f"{r.device}/{r.port}" if r.device and r.port else (r.device or r.netdev or "-")
        body = Text(r.message)
        if r.fix and r.status is not Status.PASS:
            fixes.append((r.check, where, r.fix))
            body.append(f"\nfix: [{len(fixes)}] below", style="cyan")
        if r.needs_root:
            body.append("\n(needs root)", style="dim")
        if verbose and r.evidence:
            body.append("\n" + "\n".join(f"  {e}" for e in r.evidence), style="dim")
        table.add_row(Text(r.status.value, style=_STYLE[r.status]), r.check, where, body)
    if report.nics:
        console.print(nics_table(report))
    console.print(table)
    for i, (check, where, fix) in enumerate(fixes, 1):
        console.print(Text(f"[{i}] {check} {where} fix: {fix}", style="cyan"), soft_wrap=True)
    worst = Status.FAIL if report.failed else (Status.WARN if report.count(Status.WARN) else None)
    console.print(Text(report.summary(), style=_STYLE[worst] if worst else "green"))


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe validate                          # every RDMA device, default policy
  probe validate --device mlx5_0 --window 10
  probe validate --priority 5 --dscp 34   # a fabric that puts RoCE on priority 5
  probe validate --policy roce.toml --json | jq '.results[] | select(.status=="FAIL")'
  probe validate --peer 10.0.0.2          # add a live RDMA/TCP check (peer runs probe serve)
  probe validate --rails 10.100.0.0/16=0,10.101.0.0/16=1 --json | jq .nics
                                          # each NIC's rail (by its network) and GPU
  probe validate --fleet --collector 10.0.0.9:4794 --ca-file ca.pem --token-file reader.token
                                          # every host's checks, and hosts unlike their peers

\b
Exit status: 0 when nothing FAILs, 1 on any FAIL (with --fleet: on any FAIL or
difference not waived), 2 on bad usage.
Checks that need root say so and are skipped when run unprivileged.""",
)
@click.option("--device", "devices", multiple=True, metavar="DEV", help="RDMA device (repeatable).")
@click.option("--netdev", metavar="IF", help="Netdev under the device (default: from its GIDs).")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False), help="TOML policy file.")
@click.option("--priority", type=click.IntRange(0, 7), help="RoCE priority (default 3).")
@click.option("--dscp", type=click.IntRange(0, 63), help="RoCE DSCP (default 26).")
@shown_option(
    "--window",
    click.FloatRange(0, 600),
    2.0,
    "Seconds between the two counter samples (0: skip the counter check).",
)
@click.option("--peer", metavar="HOST[:PORT]", help="Also measure RDMA and TCP to this host.")
@click.option(
    "--rails",
    "rail_rule",
    multiple=True,
    metavar="DEV=RAIL|CIDR=RAIL|gpu",
    help="Each NIC's rail, as the agent's `rails` setting (repeatable, or comma-separated).",
)
@bind_option
@timeout_option(None, "30 for RDMA setup, 5 TCP; 2 per exchange, 30 RDMA bandwidth")
@json_option
@sysfs_option
@click.option(
    "--configfs",
    "configfs_root",
    type=click.Path(file_okay=False),
    help="configfs root for rdma_cm defaults (default: SYSFS/kernel/config).",
)
@click.option(
    "--replay",
    "replay_dirs",
    multiple=True,
    type=EXISTING_DIR,
    help="Answer tool commands from captures in DIR/commands.toml (repeatable, later wins).",
)
@click.option("-v", "--verbose", is_flag=True, help="Show the evidence each check read.")
@click.option(
    "--fleet",
    is_flag=True,
    help="Ask the collector instead: every host's newest checks and the hosts whose "
    "configuration differs from their ToR's or role's.",
)
@collector_option()
@click.option("--fleet-host", default="", metavar="HOST", help="With --fleet: only this host.")
@click.option("--include-waived", is_flag=True, help="With --fleet: list waived differences.")
@collector_credential_options("With --fleet: a file holding a reader token.")
def validate(
    devices: tuple[str, ...],
    netdev: str | None,
    policy_file: str | None,
    priority: int | None,
    dscp: int | None,
    window: float,
    peer: str | None,
    rail_rule: tuple[str, ...],
    bind: str | None,
    timeout: float | None,
    as_json: bool,
    sysfs_root: str,
    configfs_root: str | None,
    replay_dirs: tuple[str, ...],
    verbose: bool,
    fleet: bool,
    collector: str,
    fleet_host: str,
    include_waived: bool,
    **cred: Any,
) -> None:
    """Check this host's RoCEv2 configuration and say how to fix what is wrong.

    Each check reads sysfs, configfs and the DCB tools (dcb, mlnx_qos, lldptool) and
    returns PASS, WARN, FAIL or SKIP with what it read and the command that fixes it.
    With --fleet it asks the collector for every agent's scheduled checks instead.
    """
    if fleet:
        # --timeout, with --fleet: how long the collector may take to answer (30 s)
        _fleet(collector, fleet_host, include_waived, timeout or 30.0, as_json, cred)
    try:
        policy = load_policy(policy_file) if policy_file else Policy()
        policy = policy.with_overrides(priority=priority, dscp=dscp)
        rails = parse_rails(rail_rule)
    except (PolicyError, ParseError) as e:
        fail(str(e))
    view = HostView(
        sysfs_root=Path(sysfs_root),
        configfs_root=Path(configfs_root) if configfs_root else None,
    )
    if replay_dirs:
        try:
            view.runner = ReplayRunner(*replay_dirs)
        except ProbeError as e:
            fail(str(e))
        view.sleep = lambda s: None  # captures do not change with time
        ticks = iter(range(1_000_000))
        view.clock = lambda: float(next(ticks)) * window
    measure, why = (None, "")
    if peer is not None:
        device = devices[0] if len(devices) == 1 else None
        source = bind or _source_for(view, device, netdev)
        measure, why = probe_measure(sysfs_root, device, source, _soft(view, device), timeout)
    start = time.monotonic()
    report = run_validation(
        view,
        policy,
        devices=devices,
        netdev=netdev,
        window=window,
        peer=peer,
        measure=measure,
        measure_unavailable=why,
        rails=rails,
    )
    if as_json:
        data = report.to_dict()
        data["duration_s"] = round(time.monotonic() - start, 3)
        print_json(data)
    else:
        render(report, Console(), verbose)
    raise SystemExit(report.exit_code)


def _fleet(
    collector: str,
    host: str,
    include_waived: bool,
    timeout: float,
    as_json: bool,
    cred: dict[str, Any],
) -> NoReturn:
    from fabricprobe.cli.drift import fleet_exit, fleet_query, render_fleet

    creds = CollectorCredentials.given(cred)
    data = ask_collector(
        collector, lambda: fleet_query(collector, host, include_waived, timeout, creds)
    )
    if as_json:
        print_json(data)
        raise SystemExit(fleet_exit(data))
    raise SystemExit(render_fleet(data, Console(width=max(120, Console().width))))
