#!/usr/bin/env python3
"""How close are fabricprobe's RC probes to perftest on the same soft-RoCE link?

Run it inside the VM lane (it needs two lane hosts and perftest):

    lane/run.sh -- .venv/bin/python bench/rdma_accuracy.py [--rounds 3] [--iters 2000]

In alternating rounds on one path (h0 -> h1) it runs perftest's `ib_send_lat`,
`ib_write_lat` (2 B) and `ib_write_bw` (64 KiB), and fabricprobe's SEND and WRITE
ping-pong and WRITE bandwidth against `probe serve`, with each engine available
(pyverbs; native when built). perftest's latency tests report one-way figures (RTT/2);
fabricprobe's one-way figure is its measured RTT/2, so medians are compared one-way to
one-way. Bandwidth is compared in MiB/s (perftest's MB is 2^20 bytes), both with 16
operations in flight. It prints each
pair, their ratio against the targets (latency <= 1.10x, bandwidth >= 0.90x) and the
cost of fabricprobe's own timing loop. Then it runs bench/tcp_accuracy.py on the same
address pair for the TCP baseline against sockperf.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabricprobe.cli.commands.serve import open_serve_argv
from fabricprobe.probes.control import wait_listening
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.rdma import native, rc

LAT_TARGET = 1.10
BW_TARGET = 0.90
PERFTEST_PORT = 18515
PROBE_PORT = 4797
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")


def lane_hosts() -> list[dict[str, object]]:
    path = os.environ.get("LANE_FILE")
    if not path:
        raise SystemExit(
            "run this inside the VM lane: lane/run.sh -- .venv/bin/python bench/rdma_accuracy.py"
        )
    return list(json.loads(Path(path).read_text())["hosts"])


def perftest(
    tool: str, a: dict[str, object], b: dict[str, object], args: list[str], tries: int = 3
) -> list[float]:
    """Run TOOL server on B, client on A; return the numbers of its result row. soft-RoCE
    under emulation sometimes ends a perftest run with an error completion; such a run
    is reported and repeated."""
    for attempt in range(1, tries + 1):
        row = _perftest_once(tool, a, b, args)
        if isinstance(row, list):
            return row
        print(f"  {tool} attempt {attempt} failed: {row}", flush=True)
    raise SystemExit(f"{tool} failed {tries} times")


def _perftest_once(
    tool: str, a: dict[str, object], b: dict[str, object], args: list[str]
) -> list[float] | str:
    common = ["-F", "-p", str(PERFTEST_PORT), *args]
    server = subprocess.Popen(
        [tool, "-d", str(b["device"]), "-x", str(b["gid_index"]), *common],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # the server accepts exactly one connection, so watch for its listening socket
        # instead of connecting to it
        deadline = time.monotonic() + 60
        while not _listening(PERFTEST_PORT):
            if server.poll() is not None or time.monotonic() > deadline:
                return f"{tool} server did not start: {server.communicate()[0][-300:]}"
            time.sleep(0.1)
        out = subprocess.run(
            [tool, "-d", str(a["device"]), "-x", str(a["gid_index"]), *common, str(b["ip"])],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:  # its client failed: nobody will finish it
            server.kill()
            server.wait()
    rows = [m for line in out.stdout.splitlines() if (m := ROW.match(line))]
    if out.returncode or not rows:
        tail = (out.stdout + out.stderr).strip().splitlines()[-3:]
        return " / ".join(tail)
    return [float(x) for x in rows[-1].groups()]


def _listening(port: int) -> bool:
    """Whether a TCP socket listens on PORT (from /proc/net/tcp, state 0A = LISTEN)."""
    with open("/proc/net/tcp") as f:
        next(f)
        return any(
            line.split()[1].endswith(f":{port:04X}") and line.split()[3] == "0A" for line in f
        )


def retried(what: str, run: Callable[[], Any], tries: int = 3) -> Any:
    """Run a fabricprobe measurement; like perftest's, a run that ends in an error
    completion is reported and repeated."""
    for attempt in range(1, tries + 1):
        res = run()
        if not res.error:
            return res
        print(f"  {what} attempt {attempt} failed: {res.error}", flush=True)
    raise SystemExit(f"{what} failed {tries} times")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--bw-iters", type=int, default=1000)
    ap.add_argument("--skip-tcp", action="store_true")
    args = ap.parse_args(argv)
    a, b = lane_hosts()[:2]
    engines = ["pyverbs"] + (["native"] if native.available() else [])
    figures: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        figures.setdefault(key, []).append(value)

    serve = subprocess.Popen(
        open_serve_argv(f"0.0.0.0:{PROBE_PORT}"),
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(str(b["ip"]), PROBE_PORT, timeout=120)
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            n = str(args.iters)
            # ib_*_lat columns: bytes, iters, t_min, t_max, t_typical (one-way, us)
            add("perftest send_lat", perftest("ib_send_lat", a, b, ["-s", "2", "-n", n])[4])
            add("perftest write_lat", perftest("ib_write_lat", a, b, ["-s", "2", "-n", n])[4])
            # ib_write_bw columns: bytes, iters, BW peak, BW average (MiB/s), msg rate
            add(
                "perftest write_bw",
                perftest("ib_write_bw", a, b, ["-s", "65536", "-n", str(args.bw_iters)])[3],
            )
            for engine in engines:
                for op in ("send", "write"):
                    res = retried(
                        f"fabricprobe[{engine}] {op}_lat",
                        lambda op=op, e=engine: rc.rc_latency(
                            LinkParams(str(b["ip"]), PROBE_PORT, bind=str(a["ip"]), engine=e),
                            op=op,
                            size=2,
                            iters=args.iters,
                            warmup=200,
                        ),
                    )
                    add(f"fabricprobe[{engine}] {op}_lat", res.summary.p50_us / 2)
                    add(f"loop cost[{engine}] ns", res.loop_overhead_ns)
                bw = retried(
                    f"fabricprobe[{engine}] write_bw",
                    lambda e=engine: rc.rc_bandwidth(
                        LinkParams(str(b["ip"]), PROBE_PORT, bind=str(a["ip"]), engine=e),
                        op="write",
                        size=65536,
                        iters=args.bw_iters,
                    ),
                )
                add(f"fabricprobe[{engine}] write_bw", bw.bytes_per_second / (1 << 20))
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=30)

    med = {k: statistics.median(v) for k, v in figures.items()}
    print(
        f"\nRC probes vs perftest, {a['name']}({a['device']}) -> {b['name']}({b['device']}), "
        f"median of {args.rounds} rounds; latency one-way (RTT/2) in us, bandwidth MiB/s"
    )
    print(f"{'figure':<28}{'perftest':>12}{'fabricprobe':>14}{'ratio':>9}  target")
    ok = True
    for engine in engines:
        for op in ("send", "write"):
            p, f = med[f"perftest {op}_lat"], med[f"fabricprobe[{engine}] {op}_lat"]
            good = f / p <= LAT_TARGET
            ok &= good
            print(
                f"{f'{op}_lat 2 B [{engine}]':<28}{p:>12.2f}{f:>14.2f}{f / p:>9.2f}  "
                f"<= {LAT_TARGET:.2f} {'met' if good else 'NOT met'}"
            )
        p, f = med["perftest write_bw"], med[f"fabricprobe[{engine}] write_bw"]
        good = f / p >= BW_TARGET
        ok &= good
        print(
            f"{f'write_bw 64 KiB [{engine}]':<28}{p:>12.2f}{f:>14.2f}{f / p:>9.2f}  "
            f">= {BW_TARGET:.2f} {'met' if good else 'NOT met'}"
        )
        print(
            f"  timing loop cost [{engine}]: {med[f'loop cost[{engine}] ns']:.0f} ns per "
            "sample (clock reads and the store, inside every RTT)"
        )
    print("per-round figures:", json.dumps(figures))
    if not args.skip_tcp:
        print("\nTCP baseline on the same address pair:", flush=True)
        tcp = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("tcp_accuracy.py")),
                "--server-addr",
                str(b["ip"]),
                "--client-addr",
                str(a["ip"]),
                "--rounds",
                str(args.rounds),
                "--iters",
                "3000",  # Python under emulation: ~1 ms per round trip
            ],
            check=False,
        )
        ok &= tcp.returncode == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
