"""The demo: fabricprobe end to end on a small soft-RoCE fabric (the VM lane's hosts).

It answers, for every directed path of the fabric, the question the project exists for:
what does this path cost an RDMA transfer, next to TCP on the same path, and which path
is the slow one. Every figure printed is measured during the run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fabricprobe.cli import netem
from fabricprobe.cli.commands.serve import open_serve_argv
from fabricprobe.cli.render import devices_table, fmt_us
from fabricprobe.core.errors import ProbeError
from fabricprobe.core.models import PRESETS
from fabricprobe.probes import tcp as tcp_lib
from fabricprobe.probes.control import wait_listening
from fabricprobe.probes.counters import counter_deltas, read_port_counters
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.rdma.links import pick_engine
from fabricprobe.probes.sysfs import read_device

DEMO_PORT = 4793
SHOWN_COUNTERS = (
    "sent_pkts",
    "rcvd_pkts",
    "rdma_sends",
    "rdma_recvs",
    "duplicate_request",
    "completer_retry_err",
    "rcvd_seq_err",
    "out_of_seq_request",
)


@dataclass(frozen=True)
class FabricHost:
    name: str
    device: str
    netdev: str
    ip: str
    gid_index: int


def load_fabric(path: str | Path) -> list[FabricHost]:
    """Hosts from a fabric file: {"hosts": [{name, device, netdev, ip, gid_index}, ...]}."""
    try:
        data = json.loads(Path(path).read_text())
        hosts = [FabricHost(**h) for h in data["hosts"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ProbeError(f"cannot read the fabric description {path}: {e}") from e
    if len(hosts) < 2:
        raise ProbeError(f"{path}: a fabric needs at least two hosts")
    return hosts


@contextmanager
def responder(hosts: list[FabricHost], port: int) -> Iterator[None]:
    """One `probe serve` process answering on every host's address (the lane's hosts share
    one machine; each probe's RDMA device is picked from the address it arrives at)."""
    proc = subprocess.Popen(
        open_serve_argv(f"0.0.0.0:{port}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for h in hosts:
            wait_listening(h.ip, port, timeout=120)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _counters(hosts: list[FabricHost], sysfs_root: str) -> dict[str, dict[str, int]]:
    out = {}
    for h in hosts:
        pc = read_port_counters(sysfs_root, h.device, 1)
        out[h.name] = dict(pc.hw.values) if pc.hw else {}
    return out


def run(
    hosts: list[FabricHost],
    console: Console,
    iters: int = 300,
    delay: str = "2ms",
    sysfs_root: str = "/sys",
    port: int = DEMO_PORT,
) -> int:
    """The whole demo; returns a process exit code."""
    from fabricprobe.probes.rdma import rc  # pyverbs: only where RDMA exists

    t_start = time.monotonic()
    console.rule(
        f"[bold]fabricprobe demo[/]: a soft-RoCE fabric of {len(hosts)} hosts, every path measured"
    )
    console.print(devices_table([read_device(sysfs_root, h.device) for h in hosts]))
    before = _counters(hosts, sysfs_root)
    pairs = [(a, b) for a in hosts for b in hosts if a is not b]
    failures = 0
    with responder(hosts, port):
        console.rule("1. latency of every path: RDMA (RC SEND and WRITE) beside TCP")
        table = Table(
            "path",
            "RDMA send p50 / p99 RTT µs",
            "RDMA write p50 / p99 RTT µs",
            "TCP p50 / p99 RTT µs",
            "TCP ÷ RDMA send (p50)",
            "lost",
        )
        for a, b in pairs:
            row = _path_row(rc, a, b, iters, port, sysfs_root)
            failures += row[-1] != "0"
            table.add_row(f"{a.name} → {b.name}", *row)
        console.print(table)
        timer = tcp_lib.measure_timer_overhead()
        engine = pick_engine("auto")
        console.print(
            f"timing loop cost inside each sample: RDMA ({engine.reason}) "
            f"{rc.loop_overhead_ns(engine.name):,} ns, "
            f"TCP {timer.loop_ns:,} ns (measured now, in this process)",
            highlight=False,
        )

        a, b = hosts[0], hosts[1]
        console.rule(f"2. bandwidth {a.name} → {b.name}: RDMA WRITE 64 KiB x 300, 16 in flight")
        bw = rc.rc_bandwidth(
            LinkParams(b.ip, port, bind=a.ip, sysfs_root=sysfs_root),
            op="write",
            size=65536,
            iters=300,
        )
        tbw = tcp_lib.run_throughput(
            LinkParams(b.ip, port, bind=a.ip),
            duration=None,
            total_bytes=65536 * 300,
            chunk_size=65536,
        )
        console.print(
            f"RDMA WRITE {bw.bytes_per_second / 1e6:,.2f} MB/s "
            f"({bw.completed}/{bw.iters} completed); TCP, same bytes: "
            f"{tbw.bytes_per_second / 1e6:,.2f} MB/s",
            highlight=False,
        )

        if os.geteuid() == 0 and len(hosts) >= 3:
            slow = hosts[2]
            console.rule(
                f"3. which path? {delay} of delay injected on {a.name} → {slow.name} "
                "only (tc netem)"
            )
            netem.impair(a.netdev, slow.ip, delay=delay)
            try:
                ranked = []
                for b2 in hosts[1:]:
                    r = rc.rc_latency(
                        LinkParams(b2.ip, port, bind=a.ip, sysfs_root=sysfs_root),
                        op="send",
                        size=64,
                        iters=max(50, iters // 3),
                        warmup=10,
                    )
                    ranked.append((r.summary.p50_us or 0.0, b2, r))
            finally:
                netem.clear(a.netdev)
            ranked.sort(key=lambda x: -x[0])
            t3 = Table("rank", "path", "RDMA send p50 RTT µs", "p99 RTT µs")
            for i, (_, b2, r) in enumerate(ranked, 1):
                t3.add_row(
                    str(i),
                    f"{a.name} → {b2.name}",
                    fmt_us(r.summary.p50_us),
                    fmt_us(r.summary.p99_us),
                )
            console.print(t3)
            verdict = ranked[0][1] is slow
            console.print(
                ("[green]found[/]" if verdict else "[red]missed[/]")
                + f": the slowest path is {a.name} → {ranked[0][1].name}"
            )
            failures += 0 if verdict else 1

    if os.geteuid() == 0 and len(hosts) >= 3:
        failures += request_view(hosts, console, delay)

    console.rule("5. what the NICs counted during the demo (hw_counters deltas)")
    after = _counters(hosts, sysfs_root)
    ct = Table("counter", *[f"{h.name} ({h.device})" for h in hosts])
    deltas = {h.name: counter_deltas(before[h.name], after[h.name]) for h in hosts}
    for name in SHOWN_COUNTERS:
        if any(name in deltas[h.name] for h in hosts):
            ct.add_row(
                name,
                *[
                    str(deltas[h.name][name].delta) if name in deltas[h.name] else "absent"
                    for h in hosts
                ],
            )
    console.print(ct)
    console.print(
        f"demo finished in {time.monotonic() - t_start:.1f} s"
        + (f" with {failures} problem(s)" if failures else ""),
        highlight=False,
    )
    return 1 if failures else 0


def _probe(*args: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "fabricprobe", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        **kw,
    )


def _run_shown(console: Console, timeout: float, *args: str) -> int:
    """Run `probe ARGS` to the end and print what it printed; 1 if it failed, else 0."""
    res = subprocess.run(
        [sys.executable, "-m", "fabricprobe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    console.print((res.stdout or res.stderr).rstrip(), highlight=False)
    return int(res.returncode != 0)


def request_view(hosts: list[FabricHost], console: Console, delay: str) -> int:
    """Section 4: a real collector and one real agent per host, the disaggregated workload
    sending its spans over OTLP with a known delay on one path, then `probe why` and the
    attribution metrics. Returns the number of problems met."""
    api, metrics, agent_port = "127.0.0.1:4794", "127.0.0.1:9794", DEMO_PORT + 10
    a, fast, slow = hosts[0], hosts[1], hosts[2]
    console.rule(
        f"4. the request's view: agents, collector, a disaggregated workload, "
        f"{delay} on {a.name} → {slow.name}"
    )
    spool = Path(tempfile.mkdtemp(prefix="fabricprobe-demo-"))
    procs = [
        _probe(
            "collector",
            "--listen",
            api,
            "--metrics-listen",
            metrics,
            "--insecure",
            # the demo's hosts share this machine and reach the collector on 127.0.0.1
            "--trust-loopback",
            "--report-interval",
            "3",
            "--probe-interval",
            "3",
            "--probe-count",
            "10",
            # the default kinds and a bandwidth probe: the fabric's price needs both
            *("--kind=tcp_lat", "--kind=rdma_rc_lat", "--kind=rdma_ud", "--kind=rdma_rc_bw"),
        )
    ]
    procs += [
        _probe(
            "agent",
            "--collector",
            api,
            "--insecure",
            "--host",
            h.name,
            "--listen",
            f"{h.ip}:{agent_port}",
            "--address",
            h.ip,
            "--device",
            h.device,
            "--spool-dir",
            str(spool / h.name),
            "--no-ethtool",
        )
        for h in hosts
    ]
    problems = 0
    try:
        for h in hosts:
            wait_listening(h.ip, agent_port, timeout=180)
        netem.impair(a.netdev, slow.ip, delay=delay)
        try:
            problems += _run_shown(
                console,
                600,
                "workload",
                "--model",
                "Llama-3.1-8B",
                "--prompt-tokens",
                "64",
                "--output-tokens",
                "8",
                "--requests",
                "8",
                "--transport",
                "rdma",
                "--port",
                str(agent_port),
                *[f"--host={h.name}={h.ip}" for h in hosts],
                f"--path={a.name}:{fast.name}",
                f"--path={a.name}:{slow.name}",
                "--otlp",
                api,
            )
            time.sleep(8)  # the agents' windows covering the transfers reach the collector
        finally:
            netem.clear(a.netdev)
        problems += _run_shown(
            console,
            300,
            "why",
            "--insecure",
            "--collector",
            api,
            "--slowest",
            "5",
            "--window",
            "300",
            "--timeout",
            "300",
        )
        # the fabric's price of one request's KV cache (Llama-3.1-8B, 64 tokens) on each
        # path now: what a scheduler choosing the decode host would be told
        for dst in (fast, slow):
            _run_shown(
                console, 60, "cost", "--insecure", "--collector", api, "--src", a.name,
                "--dst", dst.name, "--bytes", str(PRESETS["Llama-3.1-8B"].kv_bytes(64)),
            )  # fmt: skip
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=60) as r:
            lines = [
                ln
                for ln in r.read().decode().splitlines()
                if ln.startswith(
                    (
                        "fabricprobe_path_fabric_bound",
                        "fabricprobe_path_fabric_fault",
                        "fabricprobe_path_host_bound",
                        "fabricprobe_path_explained_seconds",
                        "fabricprobe_kv_share_ttft_ratio",
                        "fabricprobe_fabric_share_ttft_ratio",
                        "fabricprobe_path_kv_wait_seconds",
                        "fabricprobe_path_kv_fabric_seconds",
                        "fabricprobe_path_kv_transfer_stack_seconds",
                        "fabricprobe_path_kv_engine_wait_seconds",
                        "fabricprobe_goodput_tokens_per_second",
                    )
                )
            ]
        console.print("[bold]/metrics[/] (attribution):\n" + "\n".join(lines), highlight=False)
    except (ProbeError, OSError, subprocess.TimeoutExpired) as e:
        console.print(f"[red]request view failed:[/] {e}")
        problems += 1
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(spool, ignore_errors=True)
    return problems


def _path_row(
    rc: Any, a: FabricHost, b: FabricHost, iters: int, port: int, sysfs_root: str
) -> list[str]:
    """RDMA SEND, RDMA WRITE and TCP ping-pong on one path; the last cell counts losses
    and failed runs (a probe that fails is shown, never hidden)."""
    cells, rtts, problems = [], {}, 0
    rdma = LinkParams(b.ip, port, bind=a.ip, sysfs_root=sysfs_root)
    tcp = LinkParams(b.ip, port, bind=a.ip)
    for name in ("send", "write", "tcp"):
        try:
            if name == "tcp":
                res = tcp_lib.run_pingpong(tcp, size=64, iters=iters, warmup=20)
            else:
                res = rc.rc_latency(rdma, op=name, size=64, iters=iters, warmup=20)
        except ProbeError as e:
            cells.append(f"failed: {e}")
            problems += 1
            continue
        rtts[name] = res.summary
        problems += res.summary.lost + (1 if res.error else 0)
        cells.append(_pp(res.summary.p50_us, res.summary.p99_us))
    ratio = (
        tcp_lib.kernel_bypass_ratio(rtts["tcp"], rtts["send"])
        if "tcp" in rtts and "send" in rtts
        else None
    )
    return [*cells, "-" if ratio is None else f"{ratio:.2f}×", str(problems)]


def _pp(p50: float | None, p99: float | None) -> str:
    return f"{fmt_us(p50)} / {fmt_us(p99)}"
