"""`probe lat` and `probe bw`: RC latency (with the port's retransmit counters beside it),
UD latency and loss, and RC bandwidth against a peer running `probe serve`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import click
from rich.console import Console

from fabricprobe.cli.options import (
    Peer,
    SizeParam,
    fail,
    peer_options,
    print_json,
    probe_command,
    shown_option,
    sysfs_option,
    timeout_option,
)
from fabricprobe.cli.render import (
    latency_table,
    loss_estimate_lines,
    loss_line,
    progress_bar,
    retransmit_lines,
)
from fabricprobe.core.errors import ProbeError
from fabricprobe.probes import tcp as tcp_lib
from fabricprobe.probes.counters import (
    RETRANSMIT_COUNTERS,
    CounterDelta,
    PortCounters,
    hw_counter_changes,
    read_port_counters,
)
from fabricprobe.probes.loss import LossEstimate
from fabricprobe.probes.measure import (
    MAX_SPIN_US,
    SPIN_US_HELP,
    BandwidthResult,
    LatencyResult,
    LinkParams,
    spin_seconds,
)
from fabricprobe.probes.sysfs import SysfsError, read_device

T = TypeVar("T")
R = TypeVar("R", LatencyResult, BandwidthResult)
SIZE = SizeParam(1, 1 << 20)
UD_MAX_WARMUP = 100  # UdLink.round's bound
device_option = click.option(
    "--device",
    default=None,
    help="RDMA device to use (default: the one owning the source address).",
)
engine_option = shown_option(
    "--engine",
    click.Choice(["auto", "pyverbs", "native"]),
    "auto",
    "Hot loop: pyverbs, or the compiled one (native); auto takes native when built.",
)
tcp_option = click.option(
    "--tcp",
    "with_tcp",
    is_flag=True,
    help="Also run the same shape over TCP to the same peer and print the kernel-bypass ratio.",
)


@dataclass(frozen=True)
class RdmaPeer(Peer):
    """The peer of `probe lat` or `probe bw`, and how to reach it over RDMA: --device,
    --sysfs and --engine beside what every probe command takes."""

    device: str | None = None
    sysfs_root: str = "/sys"
    engine: str = "auto"
    spin_s: float | None = None  # the compiled loop's busy-poll before it sleeps

    def link(self, step_s: float | None) -> LinkParams:
        """The RDMA link to the peer; a bad value exits 2. The timeout bounds the setup and
        STEP_S each step (None: each probe's defaults)."""
        try:
            return replace(
                self.tcp_link(),
                step_s=step_s,
                device=self.device,
                sysfs_root=self.sysfs_root,
                engine=self.engine,
                spin_s=self.spin_s,
            )
        except ValueError as e:
            fail(str(e))


def rdma_peer_options(f: Callable[..., None]) -> Callable[..., None]:
    """The options `probe lat` and `probe bw` share, after their own (peer_options and
    --device, --engine, --tcp, --sysfs). The command gets the peer and how to reach it as
    one RdmaPeer, its first argument, and --tcp and --json as `with_tcp` and `as_json`."""

    @functools.wraps(f)
    def command(
        to: Peer, *, device: str | None, engine: str, sysfs_root: str, spin_us: int, **rest: Any
    ) -> None:
        f(
            RdmaPeer(
                to.host, to.port, to.bind, to.timeout, to.token, device, sysfs_root, engine,
                spin_seconds(spin_us),
            ),
            **rest,
        )  # fmt: skip

    timeout = timeout_option(None, "30 for the RDMA setup; 2 per exchange, lat; 5, bw")
    spin = click.option(
        "--spin-us", type=click.IntRange(-1, MAX_SPIN_US), default=-1, help=SPIN_US_HELP
    )
    return peer_options(timeout, device_option, engine_option, tcp_option)(
        spin(sysfs_option(command))
    )


def _measure(call: Callable[[], T]) -> T:
    """CALL's result; a bad argument exits 2, a probe that could not run exits 1."""
    try:
        return call()
    except ValueError as e:
        fail(str(e))
    except ProbeError as e:
        fail(str(e), 1)


def _beside(call: Callable[[], R], errors: list[str]) -> R:
    """The TCP run beside the RDMA one, its error (if it ended early) added to ERRORS; a
    run that fails exits 1."""
    try:
        t = call()
    except ProbeError as e:
        fail(f"TCP beside RDMA failed: {e}", 1)
    errors += [t.error] if t.error else []
    return t


def _times(ratio: float | None) -> str:
    """A ratio as the commands print it: 2.00x, or - when there is none."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def _end(errors: list[str]) -> None:
    """Exit 1 when a run ended early (its figures are shown by then)."""
    if errors:
        fail("run ended early: " + "; ".join(errors), 1)


def _rc() -> Any:
    """fabricprobe.probes.rdma.rc imports pyverbs: load it only when an RDMA command runs."""
    try:
        from fabricprobe.probes.rdma import rc
    except ImportError as e:
        fail(f"RDMA probes need pyverbs ({e}); see the README's install section")
    return rc


def _ud() -> Any:
    """fabricprobe.probes.rdma.ud, loaded as _rc() loads rc."""
    try:
        from fabricprobe.probes.rdma import ud
    except ImportError as e:
        fail(f"RDMA probes need pyverbs ({e}); see the README's install section")
    return ud


class PortWatch:
    """The retransmit counters of the port an RC run goes out of, read before and after."""

    def __init__(self, sysfs_root: str, device: str, port: int) -> None:
        self.sysfs_root, self.device, self.port = sysfs_root, device, port
        try:
            self.driver = read_device(sysfs_root, device).driver
        except SysfsError:
            self.driver = None
        self.before = self._read()

    def _read(self) -> PortCounters:
        return read_port_counters(self.sysfs_root, self.device, self.port)

    def changes(self) -> dict[str, CounterDelta] | None:
        """The counters' changes since the first reading (None: no hw_counters/)."""
        after = self._read()
        if self.before.hw is None or after.hw is None:
            return None
        return hw_counter_changes(self.before, after, RETRANSMIT_COUNTERS, self.driver)


def _port_watch(rc: Any, to: RdmaPeer) -> tuple[str, PortWatch]:
    """The device an RC run to TO will go out of, as the probe itself picks it, and its
    port's retransmit counters read now."""
    from fabricprobe.probes.rdma.verbs import PORT

    try:
        dev, _ = _measure(
            lambda: rc.local_device(
                to.sysfs_root, rc.source_address(to.host, to.port, to.bind), to.device
            )
        )
    except OSError as e:
        fail(f"no route to {to.host}: {e.strerror or e}", 1)
    return dev, PortWatch(to.sysfs_root, dev, PORT)


def retransmit_json(
    device: str, port: int, changes: dict[str, CounterDelta] | None
) -> dict[str, Any]:
    d: dict[str, Any] = {"device": device, "port": port, "source": "hw_counters"}
    if changes is None:
        d["unavailable"] = "no hw_counters/ on this port"
        return d
    d["deltas"] = {name: c.delta for name, c in changes.items()}
    d["wrapped"] = sorted(name for name, c in changes.items() if c.wrapped)
    d["reset"] = sorted(name for name, c in changes.items() if c.reset)
    return d


def _given(name: str) -> bool:
    """The user gave option NAME (it is not at its default)."""
    src = click.get_current_context().get_parameter_source(name)
    return src not in (None, click.core.ParameterSource.DEFAULT)


@probe_command(
    """\b
Examples:
  probe lat 10.0.0.2                       # SEND/RECV ping-pong, 2 B, 1,000 iterations
  probe lat 10.0.0.2 --op write --size 4K --iters 100000
  probe lat 192.0.2.2 --bind 192.0.2.1 --tcp   # RDMA then TCP, with the bypass ratio
  probe lat 10.0.0.2 --json | jq .rdma.rtt.p99_us
  probe lat 10.0.0.2 --qp ud --iters 5000 --interval 0.001   # loss, paced at 1 kHz
  probe lat 10.0.0.2 --qp ud --json | jq .loss.interval"""
)
@shown_option(
    "--qp",
    click.Choice(["rc", "ud"]),
    "rc",
    "RC ping-pong, or UD probes (a probe and two ACKs, the responder's delay taken out): UD "
    "loses what the fabric drops and counts it, RC retransmits it.",
)
@click.option(
    "--interval",
    type=click.FloatRange(0, 60),
    default=0.0,
    help="UD: at most one probe per INTERVAL seconds (default: back to back, one out at a time).",
)
@click.option(
    "--wait",
    type=click.FloatRange(0.001, 60),
    default=None,
    help="UD: seconds a probe waits for its ACKs before the next goes (default 0.5); a "
    "later answer still counts until --timeout after the last probe.",
)
@shown_option(
    "--op",
    click.Choice(["send", "write", "read"]),
    "send",
    "SEND/RECV ping-pong, RDMA WRITE with memory polling (perftest's write_lat), or "
    "one-sided RDMA READs that the peer's NIC answers (perftest's read_lat).",
)
@shown_option("--size", SIZE, "2", "Message size, 1 B..1 MiB.")
@shown_option("--iters", click.IntRange(1, 10_000_000), 1000)
@shown_option("--warmup", click.IntRange(0, 1_000_000), 100)
@rdma_peer_options
def lat(
    to: RdmaPeer,
    qp: str,
    interval: float,
    wait: float | None,
    op: str,
    size: int,
    iters: int,
    warmup: int,
    with_tcp: bool,
    as_json: bool,
) -> None:
    """RC ping-pong latency to PEER, with the port's retransmit counters; or with --qp ud,
    UD latency and loss. Figures are RTTs; one-way columns are RTT/2.

    With --qp ud one probe is out at a time and waits --wait (0.5 s unless given) for its
    two ACKs before the next goes; an answer that comes later still counts, with its RTT,
    until --timeout (1 s unless given) after the last probe, and a probe with none by
    then is lost. The loss comes with its 95 % Wilson interval."""
    if qp == "ud":
        for name, flag in (("op", "--op"), ("size", "--size"), ("with_tcp", "--tcp")):
            if _given(name):
                fail(f"{flag} goes with RC ping-pong, not with --qp ud")
        if warmup > UD_MAX_WARMUP and _given("warmup"):
            fail(f"--warmup: at most {UD_MAX_WARMUP} with --qp ud")
        ud = _ud()
        # --timeout bounds the setup and how late an answer may come; --wait the step
        late = ud.UdLink.LATE_S if to.timeout is None else to.timeout
        _lat_ud(ud, to.link(wait), iters, min(warmup, UD_MAX_WARMUP), interval, late, as_json)
        return
    for name, flag in (("interval", "--interval"), ("wait", "--wait")):
        if _given(name):
            fail(f"{flag} paces UD probes: give it with --qp ud")
    rc = _rc()
    from fabricprobe.probes.rdma.verbs import ACK_TIMEOUT_S, PORT  # pyverbs is there now

    link = to.link(to.timeout)
    dev, watch = _port_watch(rc, to)
    with progress_bar(not as_json and iters >= 5000, f"RDMA {op} ping-pong", "iterations") as bar:
        res = _measure(
            lambda: rc.rc_latency(link, op=op, size=size, iters=iters, warmup=warmup, progress=bar)
        )
    changes = watch.changes()
    out: dict[str, Any] = {
        "rdma": res.as_dict(),
        "retransmit_counters": retransmit_json(dev, PORT, changes),
    }
    rows = {f"rdma {op}": res.summary}
    errors = [res.error] if res.error else []
    if with_tcp:
        t = _beside(
            lambda: tcp_lib.run_pingpong(to.tcp_link(), size=size, iters=iters, warmup=warmup),
            errors,
        )
        out["tcp"] = t.as_dict()
        rows["tcp"] = t.summary
        out["kernel_bypass_ratio"] = tcp_lib.kernel_bypass_ratio(t.summary, res.summary)
    if as_json:
        print_json(out)
    else:
        console = _headline(
            f"RC {op} ping-pong", res, link, f"{size:,} B, {iters:,} measured (+{warmup:,} warm-up)"
        )
        console.print(latency_table(rows))
        for name, summary in rows.items():
            console.print(loss_line(name, summary), highlight=False)
        for line in retransmit_lines(dev, PORT, changes, ACK_TIMEOUT_S):
            console.print(line, highlight=False)
        console.print(
            f"timing loop cost: {res.loop_overhead_ns:,} ns per iteration "
            "(clock reads + bookkeeping, measured in this process)",
            highlight=False,
        )
        own = res.prober_delay.summary() if res.prober_delay else None
        if own is not None and own.count:
            console.print(
                f"prober delay p50 {own.p50_us:,.3f} µs, p99 {own.p99_us:,.3f} µs (still in "
                "each RTT: how late this host can have seen each answer, from a clock read "
                "before the wait's last empty poll)",
                highlight=False,
            )
        if with_tcp:
            ratio = _times(out["kernel_bypass_ratio"])
            console.print(
                f"kernel-bypass ratio (TCP p50 RTT / RDMA p50 RTT): {ratio}", highlight=False
            )
    _end(errors)


def _headline(what: str, res: R, link: LinkParams, figures: str) -> Console:
    """A console for the run's lines, the first two printed: WHAT ran from which device to
    LINK's peer in which loop, with its FIGURES; then why that loop."""
    console = Console()
    peer = f"{link.peer}:{link.port}"
    console.print(f"{what} {res.device} -> {peer} ({res.engine} loop): {figures}", highlight=False)
    console.print(f"engine: {res.engine_reason}", highlight=False)
    return console


def _lat_ud(
    ud: Any,
    link: LinkParams,
    probes: int,
    warmup: int,
    interval: float,
    late_s: float,
    as_json: bool,
) -> None:
    """One UD round of PROBES probes: network RTT, responder delay, loss with its interval."""

    def run() -> Any:
        with ud.UdLink(link) as kept:
            return kept.run(probes, interval, warmup, late_s)

    res = _measure(run)
    loss = LossEstimate.of(res.summary.lost, res.summary.count + res.summary.lost)
    if as_json:
        print_json({"rdma": res.as_dict(), "loss": loss.as_dict()})
    else:
        pace = f"at most one per {interval * 1e3:,.3f} ms" if interval else "back to back"
        step = link.step(ud.UdLink.STEP_S)
        console = _headline(
            "UD probes",
            res,
            link,
            f"{probes:,} probes (+{warmup:,} warm-up), {pace}; each waits {step:g} s for its "
            f"ACKs before the next goes, late answers count until {max(late_s, step):g} s "
            "after the last",
        )
        console.print(latency_table({"rdma ud": res.summary}))
        delay, own = res.responder_delay_p50_us, res.prober_delay_p50_us
        p50 = res.summary.p50_us
        console.print(
            f"network RTT p50 {'-' if p50 is None else f'{p50:,.3f}'} µs; responder delay "
            f"p50 {'-' if delay is None else f'{delay:,.3f}'} µs (taken out of each RTT); "
            f"prober delay p50 {'-' if own is None else f'{own:,.3f}'} µs (still in it: "
            f"how late this host can have seen each answer{_send_side(res.engine)}); "
            f"{res.timestamps} timestamps (the device "
            f"{'has' if res.hw_timestamps_supported else 'has no'} completion timestamps)",
            highlight=False,
        )
        for line in loss_estimate_lines(loss):
            console.print(line, highlight=False)
    if res.error:
        fail(f"run ended early (probes not sent count as lost): {res.error}", 1)


def _send_side(engine: str | None) -> str:
    """What the prober's delay holds beyond the receive side, by engine (ud.py)."""
    return ", and its send side when seen before the answer" if engine == "pyverbs" else ""


@probe_command(
    """\b
Examples:
  probe bw 10.0.0.2                        # RDMA WRITE, 64 KiB, 16 in flight
  probe bw 10.0.0.2 --op send --size 1M --iters 2000
  probe bw 192.0.2.2 --bind 192.0.2.1 --tcp --json"""
)
@shown_option("--op", click.Choice(["write", "send"]), "write")
@shown_option("--size", SIZE, "64K", "Message size, 1 B..1 MiB.")
@shown_option("--iters", click.IntRange(1, 10_000_000), 1000)
@shown_option("--outstanding", click.IntRange(1, 64), 16, "Operations in flight.")
@rdma_peer_options
def bw(
    to: RdmaPeer, op: str, size: int, iters: int, outstanding: int, with_tcp: bool, as_json: bool
) -> None:
    """RC bandwidth to PEER: ITERS operations of SIZE bytes, OUTSTANDING in flight; the
    goodput (bytes completed over the run's time), with the port's retransmit counters."""
    rc = _rc()
    from fabricprobe.probes.rdma.verbs import ACK_TIMEOUT_S, PORT  # pyverbs is there now

    link = to.link(to.timeout)
    dev, watch = _port_watch(rc, to)
    with progress_bar(not as_json and iters >= 2000, f"RDMA {op} bandwidth", "operations") as bar:
        res = _measure(
            lambda: rc.rc_bandwidth(
                link,
                op=op,
                size=size,
                iters=iters,
                outstanding=outstanding,
                progress=bar,
            )
        )
    changes = watch.changes()
    out: dict[str, Any] = {
        "rdma": res.as_dict(),
        "retransmit_counters": retransmit_json(dev, PORT, changes),
    }
    errors = [res.error] if res.error else []
    if with_tcp:
        t = _beside(
            lambda: tcp_lib.run_throughput(
                to.tcp_link(), duration=None, total_bytes=size * iters, chunk_size=size
            ),
            errors,
        )
        out["tcp"] = t.as_dict()
        out["rdma_to_tcp_ratio"] = (
            res.bytes_per_second / t.bytes_per_second if t.bytes_per_second else None
        )
    if as_json:
        print_json(out)
    else:
        console = _headline(
            f"RC {op} bandwidth",
            res,
            link,
            f"{size:,} B x {res.completed:,}/{iters:,} in {res.duration_s:.3f} s = "
            f"{res.bytes_per_second / 1e6:,.2f} MB/s ({res.bytes_per_second * 8 / 1e9:.3f} Gb/s)"
            " goodput",
        )
        for line in retransmit_lines(dev, PORT, changes, ACK_TIMEOUT_S, stream=True):
            console.print(line, highlight=False)
        if with_tcp:
            tcp_mbps = out["tcp"]["bytes_per_second"] / 1e6
            ratio = _times(out["rdma_to_tcp_ratio"])
            console.print(
                f"TCP same bytes: {tcp_mbps:,.2f} MB/s; RDMA/TCP {ratio}", highlight=False
            )
    _end(errors)
