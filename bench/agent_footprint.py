#!/usr/bin/env python3
"""Agent CPU and memory at the default schedule with 32 peers.

Starts a collector and 32 peer agents in this process (each on its own 127.0.0.x
address with its own responder), then one agent as a separate `probe agent` process.
With a budget of 32 the plan is a full mesh, so the measured agent probes 32 peers and
answers 32 peers' probes, at the default schedule (one 10-exchange burst per peer every
10 s, 10 s windows). After a warm-up, its CPU time and RSS are sampled.
Targets: at most 0.25 % of one core and 48 MB RSS. RSS counts the pages of shared
libraries the process has touched (libpython, libcrypto), which other processes share;
the unique and proportional sets (USS, PSS) are printed beside it.

The CPU is also split by part of the agent: each thread's run time (schedstat, in ns)
grouped by the kernel name the agent gives it (fabricprobe.probes.threads). Bursts on
kept links that answer quickly run in the scheduling thread itself
(fabricprobe.agent.probing.INLINE_KINDS), so `scheduler` holds nearly all the probing
and `probe workers` only link setups and slow bursts; `answering peers` is the echo of
the 33 probers' exchanges (32 peers and the host reference); `sender` is the collector
client's work as well (its calls run in that thread); what threads that ended used is
the rest.

The self-throttle is lifted on every agent here (a budget of 4 cores, a pressure limit
of 100 %): the 32 peers share this process, whose CPU is not theirs, and on a busy host
CPU pressure would stretch every interval up to 4x, so the figure would be that of a
lighter schedule. The bursts the measured agent ran are printed beside the number the
default schedule asks for.

    python bench/agent_footprint.py                 # 60 s measurement
    python bench/agent_footprint.py --seconds 30 --peers 16
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig

# kernel thread names (fabricprobe.probes.threads) -> the part of the agent they are
THREAD_PARTS = {
    "probe": "probe workers",
    "answer": "answering peers",
    "scheduler": "scheduler",
    "sender": "sender",
    "windows": "window cuts",
    "responder": "accepting",
    "checks": "RoCE checks",
}


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """(kernel name, CPU seconds) of each live thread of PID by thread id. The run time
    in /proc/PID/task/*/schedstat is in ns; stat's user and system ticks (10 ms) would
    round away the answering threads, each of which runs a few ms a minute."""
    out: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
        out[int(task.name)] = (name, ns / 1e9)
    return out


def by_part(
    start: dict[int, tuple[str, float]], end: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds between two thread_cpu() reads by part of the agent (THREAD_PARTS;
    a thread of another name stands as itself)."""
    parts: dict[str, float] = {}
    for tid, (name, cpu) in end.items():
        part = THREAD_PARTS.get(name.rstrip("0123456789_"), name)
        parts[part] = parts.get(part, 0.0) + cpu - start.get(tid, ("", 0.0))[1]
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    args = ap.parse_args()
    logging.disable(logging.INFO)  # the peers' own log lines are not the figures
    plan = PlanConfig(budget=args.peers)  # default schedule otherwise
    server = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0",
            metrics_listen="",
            api=ApiConfig(plan=plan, trust_local_registration=True),  # peers on 127.0.0.N
        )
    )
    server.start()
    tmp = Path(tempfile.mkdtemp(prefix="fabricprobe-bench-"))
    peers = []
    for i in range(args.peers):
        cfg = AgentConfig(
            host=f"peer-{i:02d}",
            collector=f"127.0.0.1:{server.port}",
            probe_listen=f"127.0.0.{10 + i}:0",
            spool_dir=str(tmp / f"peer-{i:02d}"),
            sysfs_root=str(tmp / "none"),
            ethtool=False,
            insecure=True,
            cpu_budget=4.0,
            pressure_limit=1.0,
        )
        a = Agent(cfg)
        a.start()
        peers.append(a)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabricprobe",
            "agent",
            "--collector",
            f"127.0.0.1:{server.port}",
            "--insecure",
            "--host",
            "measured",
            "--listen",
            "127.0.0.9:0",
            "--spool-dir",
            str(tmp / "measured"),
            "--log-level",
            "warning",
            "--cpu-budget",
            "4",
            "--pressure-limit",
            "1",
        ],
    )
    started = time.monotonic()
    try:
        ps = psutil.Process(proc.pid)
        print(f"measured agent: pid {proc.pid}; load average {os.getloadavg()[0]:.2f}")
        print(f"warming up {args.warmup:g} s (registration, first windows)...")
        time.sleep(args.warmup)
        threads_start = thread_cpu(proc.pid)
        t_start = ps.cpu_times()
        c0 = t_start.user + t_start.system
        t0 = time.monotonic()
        rss_max = uss_max = pss_max = 0
        while time.monotonic() - t0 < args.seconds:
            mem = ps.memory_full_info()
            rss_max, uss_max = max(rss_max, mem.rss), max(uss_max, mem.uss)
            pss_max = max(pss_max, getattr(mem, "pss", 0))
            time.sleep(1.0)
        t_end = ps.cpu_times()
        threads_end = thread_cpu(proc.pid)
        cpu = t_end.user + t_end.system - c0
        user, system = t_end.user - t_start.user, t_end.system - t_start.system
        wall = time.monotonic() - t0
        host = server.store.hosts.get("measured")
        bursts = host.agent.probes if host and host.agent else 0
        elapsed = time.monotonic() - started
        targets = len(server.planner.assignments("measured")[1])
        answered = sum(
            1 for (src, dst, *_), p in server.store.paths.items() if dst == "measured" and p.windows
        )
        print(f"peers: {args.peers} (probes {targets} targets, probed by {answered} peers)")
        print(
            f"agent CPU: {100 * cpu / wall:.2f} % of one core over {wall:.0f} s "
            f"(user {100 * user / wall:.2f} %, kernel {100 * system / wall:.2f} %; "
            "target <= 0.25 %)"
        )
        print(
            f"agent RSS: max {rss_max / 2**20:.1f} MiB (target <= 48 MB); its own pages (USS) "
            f"{uss_max / 2**20:.1f} MiB, PSS {pss_max / 2**20:.1f} MiB"
        )
        due = targets * elapsed / (plan.interval_ms / 1000)
        print(
            f"probe bursts run by the agent since start: {bursts} "
            f"(the default schedule asks about {due:.0f} in its {elapsed:.0f} s)"
        )
        parts = by_part(threads_start, threads_end)
        top = sorted(parts.items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{n} {100 * v / wall:.3f} %" for n, v in top if v > 0)
        print(
            f"by thread (user + kernel, from /proc): {shown}; threads that ended "
            f"{100 * (cpu - sum(parts.values())) / wall:.3f} %"
        )
        started_answering = sum(
            1
            for tid, (name, _) in threads_end.items()
            if name == "answer" and tid not in threads_start
        )
        print(f"answering threads (sessions) started during the measurement: {started_answering}")
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        for a in peers:
            a.close(flush_timeout=0.2)
        server.stop(0)


if __name__ == "__main__":
    main()
