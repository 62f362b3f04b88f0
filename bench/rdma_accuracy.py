#!/usr/bin/env python3
"""How close is each of fabricprobe's RDMA probes to perftest on the same soft-RoCE link?

Run it inside the VM lane (it needs two lane hosts and perftest):

    lane/run.sh -- .venv/bin/python bench/rdma_accuracy.py [--rounds 3]

In alternating rounds on one path (h0 -> h1), each figure measured by perftest and by
fabricprobe back to back, with the same size, iterations and depth:
  * RC SEND and WRITE latency from 2 B to 1 MiB (`ib_send_lat`, `ib_write_lat`):
    perftest's typical one-way figure against fabricprobe's RTT p50 / 2; RDMA READ
    latency (`ib_read_lat`, which reports the READ's whole round trip) against
    fabricprobe's one-sided READ RTT p50;
  * UD latency (`ib_send_lat -c UD`, a 20 B ping-pong) against fabricprobe's UD probe
    (20 B, one out at a time, the next as soon as the last is answered): its network
    RTT p50 / 2 (the responder's own delay taken out, as the agent reports it), and its
    RTT with that delay in beside it;
  * RC WRITE and SEND bandwidth at 4 KiB, 64 KiB and 1 MiB, 16 in flight (`ib_write_bw`,
    `ib_send_bw`), in MiB/s both (perftest's MB is 2^20 bytes).
Both of fabricprobe's loops busy-poll for the whole exchange, as perftest's do (it polls
its completion queue without pause unless given -e): `--spin-us 1000000` on the prober
and on `probe serve`. `--spin-us -1` measures the loops' own default instead (5 ms of
busy-polling, then a poll every 50 us), `--spin-us 0` loops that sleep on completion
events at once, as the lane's agents run.
It prints the median of each figure over the rounds, the ratio fabricprobe / perftest
against the band 0.95-1.05, every round's ratio and fabricprobe's own timing loop cost
beside each latency figure. Then it runs bench/tcp_accuracy.py on the same address pair
for TCP against sockperf and qperf. Exit status 0 when every ratio is in its band.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabricprobe.cli.commands.serve import open_serve_argv
from fabricprobe.probes.control import wait_listening
from fabricprobe.probes.measure import MAX_SPIN_US, LinkParams, spin_seconds
from fabricprobe.probes.rdma import native, rc, ud

LOW, HIGH = 0.95, 1.05
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


LAT_SIZES = (2, 4096, 65536, 1 << 20)
BW_SIZES = (4096, 65536, 1 << 20)
UD_SIZE = 20  # fabricprobe's UD probe: magic, kind, sequence number, value
DEPTH = 16


@dataclass(frozen=True)
class Figure:
    """One figure measured both ways: perftest's argv and where its figure sits in the
    result row, and fabricprobe's run returning (figure, its loop's cost in ns or None)."""

    name: str
    unit: str
    tool: str
    args: tuple[str, ...]
    column: int
    probe: Callable[[], tuple[float, float | None]]


def lat_iters(iters: int, size: int) -> int:
    """ITERS up to 4 KiB; above, the bytes of ITERS 4 KiB messages, at least 100."""
    return max(100, min(iters, iters * 4096 // max(size, 4096)))


def bw_iters(iters: int, size: int) -> int:
    """ITERS at 64 KiB: four times as many at 4 KiB, an eighth at 1 MiB (16, 64, 128 MiB
    at the defaults), at least 50."""
    return max(50, iters * 4 if size <= 4096 else iters if size <= 65536 else iters // 8)


def half(us: float | None) -> float:
    if us is None:
        raise SystemExit("a latency run returned no samples")
    return us / 2


def figures(a: dict[str, object], b: dict[str, object], engine: str, args: Any) -> list[Figure]:
    link = LinkParams(
        str(b["ip"]),
        PROBE_PORT,
        bind=str(a["ip"]),
        engine=engine,
        spin_s=spin_seconds(args.spin_us),
    )
    out: list[Figure] = []
    for op in ("send", "write", "read"):
        for size in LAT_SIZES:
            n = lat_iters(args.iters, size)

            def lat(op: str = op, size: int = size, n: int = n) -> tuple[float, float | None]:
                res = retried(
                    f"{op}_lat {size}",
                    lambda: rc.rc_latency(link, op=op, size=size, iters=n, warmup=min(200, n)),
                )
                p50 = res.summary.p50_us
                rtt = op == "read"  # ib_read_lat reports the whole round trip
                return (p50 if rtt and p50 is not None else half(p50)), res.loop_overhead_ns

            # ib_*_lat columns: bytes, iters, t_min, t_max, t_typical (us: one-way, but
            # the round trip for read_lat)
            unit = "us RTT" if op == "read" else "us one-way"
            out.append(
                Figure(f"rc {op}_lat {size} B [{engine}]", unit, f"ib_{op}_lat",
                       ("-s", str(size), "-n", str(n)), 4, lat)
            )  # fmt: skip

    def ud_lat() -> tuple[float, float | None]:
        with ud.UdLink(link) as kept:
            res = kept.run(args.iters, interval_s=0.0, warmup=10)
        if res.error:
            raise SystemExit(f"ud probe failed: {res.error}")
        net = half(res.summary.p50_us)
        raw = half(res.raw_summary.p50_us) if res.raw_summary else float("nan")
        print(f"  ud probe: network RTT/2 {net:.2f} us, with the responder's delay "
              f"{raw:.2f} us", flush=True)  # fmt: skip
        return net, None

    out.append(
        Figure(f"ud send_lat {UD_SIZE} B [{engine}]", "us one-way", "ib_send_lat",
               ("-c", "UD", "-s", str(UD_SIZE), "-n", str(args.iters)), 4, ud_lat)
    )  # fmt: skip
    for op in ("write", "send"):
        for size in BW_SIZES:
            n = bw_iters(args.bw_iters, size)

            def bw(op: str = op, size: int = size, n: int = n) -> tuple[float, float | None]:
                res = retried(
                    f"{op}_bw {size}",
                    lambda: rc.rc_bandwidth(link, op=op, size=size, iters=n, outstanding=DEPTH),
                )
                return res.bytes_per_second / (1 << 20), None

            # ib_*_bw columns: bytes, iters, BW peak, BW average (MiB/s), msg rate
            out.append(
                Figure(f"rc {op}_bw {size} B [{engine}]", "MiB/s", f"ib_{op}_bw",
                       ("-s", str(size), "-n", str(n), "-t", str(DEPTH)), 3, bw)
            )  # fmt: skip
    return out


def run_rounds(
    a: dict[str, object], b: dict[str, object], figs: list[Figure], rounds: int
) -> dict[str, list[tuple[float, float, float | None]]]:
    """Every figure, ROUNDS times: (perftest, fabricprobe, loop cost) per round."""
    got: dict[str, list[tuple[float, float, float | None]]] = {f.name: [] for f in figs}
    for r in range(rounds):
        print(f"round {r + 1}/{rounds}", flush=True)
        for f in figs:
            ref = perftest(f.tool, a, b, list(f.args))[f.column]
            mine, cost = f.probe()
            got[f.name].append((ref, mine, cost))
            print(f"  {f.name}: perftest {ref:.2f}, fabricprobe {mine:.2f} {f.unit}", flush=True)
    return got


def report(figs: list[Figure], got: dict[str, list[tuple[float, float, float | None]]]) -> bool:
    print(f"\n{'figure':<32}{'unit':>11}{'perftest':>11}{'fabricprobe':>13}{'ratio':>7}"
          f"{'loop ns':>9}  rounds' ratios")  # fmt: skip
    ok = True
    for f in figs:
        rows = got[f.name]
        ref = statistics.median(r[0] for r in rows)
        mine = statistics.median(r[1] for r in rows)
        ratio = mine / ref if ref else float("inf")
        costs = [r[2] for r in rows if r[2] is not None]
        cost = f"{statistics.median(costs):.0f}" if costs else "-"
        good = LOW <= ratio <= HIGH
        ok &= good
        each = " ".join(f"{r[1] / r[0]:.2f}" if r[0] else "-" for r in rows)
        print(f"{f.name:<32}{f.unit:>11}{ref:>11.2f}{mine:>13.2f}{ratio:>7.2f}{cost:>9}  "
              f"{each}{'' if good else '  OUT of ' + f'{LOW:.2f}-{HIGH:.2f}'}")  # fmt: skip
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=2000, help="latency iterations at <= 4 KiB")
    ap.add_argument("--bw-iters", type=int, default=1000, help="bandwidth iterations at 64 KiB")
    ap.add_argument("--engines", default="", help="pyverbs,native (default: the one auto picks)")
    ap.add_argument("--skip-tcp", action="store_true")
    ap.add_argument("--only", default="", help="only the figures whose name holds this text")
    ap.add_argument(
        "--spin-us",
        type=int,
        default=MAX_SPIN_US,
        help="how long both loops busy-poll before they sleep (default: the whole exchange, "
        "as perftest; -1: the loops' own default)",
    )
    args = ap.parse_args(argv)
    a, b = lane_hosts()[:2]
    engines = (
        args.engines.split(",") if args.engines else ["native" if native.available() else "pyverbs"]
    )
    figs = [f for e in engines for f in figures(a, b, e, args) if args.only in f.name]
    if not figs:
        raise SystemExit(f"no figure's name holds {args.only!r}")
    serve = subprocess.Popen(
        open_serve_argv(f"0.0.0.0:{PROBE_PORT}", "--spin-us", str(args.spin_us)),
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(str(b["ip"]), PROBE_PORT, timeout=120)
        got = run_rounds(a, b, figs, args.rounds)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=30)
    print(
        f"\nRDMA probes vs perftest, {a['name']}({a['device']}) -> {b['name']}({b['device']}), "
        f"median of {args.rounds} rounds (commit {commit()}, {time.strftime('%Y-%m-%d')}, "
        f"loops busy-poll {args.spin_us} us); "
        f"ratio = fabricprobe / perftest, band {LOW:.2f}-{HIGH:.2f}"
    )
    ok = report(figs, got)
    print("per-round figures:", json.dumps(got))
    if not args.skip_tcp:
        print("\nTCP on the same address pair:", flush=True)
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
                "3000",
            ],
            check=False,
        )
        ok &= tcp.returncode == 0
    return 0 if ok else 1


def commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(Path(__file__).parent), "describe", "--always", "--dirty"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
