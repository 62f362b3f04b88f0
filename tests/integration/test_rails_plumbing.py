"""Rails through real processes' parts on loopback: three agents, each with a device on
rail 0 and one on rail 1 (soft-RoCE-shaped sysfs trees, addresses 127.0.0.x and
127.0.1.x), register their rails with a real collector over gRPC; the collector pairs
them rail by rail; each agent probes each rail from its own device and address (a
stand-in runner: RDMA needs the lane), and a path slow on rail 1 only is named rail 1 by
`probe why` and on /metrics, while the pair's own figures mix the rails as before."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.agent.probing import ProbeContext, ProbeOutcome, ProbeSpec
from fabricprobe.cli.commands.why import query
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from tests.unit.sysfs_builder import add_rdma_device

HOSTS = ("h0", "h1", "h2")
RAILS = ["127.0.0.0/24=0", "127.0.1.0/24=1"]


def gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def rail_address(host: int, rail: int) -> str:
    return f"127.0.{rail}.{21 + host}"


class StandIn:
    """A UD burst as rdma_runners' returns it, slow on rail 1 towards h2; it notes where
    each burst went from and to."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: set[tuple[str, int | None, str, str, str]] = set()

    def __call__(self, spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        with self.lock:
            self.seen.add((spec.dst, spec.rail, spec.local_device, spec.bind, spec.address))
        slow = spec.rail == 1 and spec.dst == "h2"
        return ProbeOutcome(
            "rdma",
            "ud",
            rtt_ns=[3_000_000 if slow else 20_000] * spec.count,
            sport=0xC000 + 16 * (spec.rail or 0) + len(spec.dst),
            return_sport=0xD000,
            source=spec.bind or ctx.bind or "",
        )


def test_rails_are_probed_rail_by_rail_and_a_slow_rail_is_named(tmp_path: Path) -> None:
    server = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0",
            metrics_listen="",
            grace=0.5,
            api=ApiConfig(
                trust_local_registration=True,
                report_interval_ms=500,
                plan=PlanConfig(interval_ms=200, count=8, kinds=("rdma_ud",)),
            ),
        )
    )
    server.start()
    runners = {h: StandIn() for h in HOSTS}
    agents = []
    for i, h in enumerate(HOSTS):
        sys = tmp_path / h / "sys"
        for rail, name in ((0, f"rxe{i}"), (1, f"rxe{i}r1")):
            g = gid(rail_address(i, rail))
            add_rdma_device(sys, name, [(1, g, "RoCE v2", "lo")], parent="lo")
        agents.append(
            Agent(
                AgentConfig(
                    host=h,
                    collector=f"127.0.0.1:{server.port}",
                    probe_listen="0.0.0.0:0",  # answers on every rail's address
                    addresses=[rail_address(i, 0)],
                    rails=RAILS,
                    spool_dir=str(tmp_path / h / "spool"),
                    insecure=True,
                    window_s=0.5,
                    host_reference=False,
                    sysfs_root=str(sys),
                    validate_interval_s=0,
                ),
                runners={"rdma_ud": runners[h]},
            )
        )
    try:
        for a in agents:
            a.start()
        deadline = time.monotonic() + 60
        standing: list = []
        while time.monotonic() < deadline:
            standing = [m for m in server.store.rail_view().paths if m.stands_out]
            if len(standing) >= 2:  # h0 -> h2 and h1 -> h2 on rail 1
                break
            time.sleep(0.2)
        # each agent probes each peer on each rail, from its own device and address there
        assert runners["h0"].seen >= {
            (dst, rail, f"rxe0{'r1' if rail else ''}", rail_address(0, rail), rail_address(j, rail))
            for j, dst in ((1, "h1"), (2, "h2"))
            for rail in (0, 1)
        }
        assert all(rail is not None for _, rail, _, _, _ in runners["h0"].seen)
        assert {(m.src, m.dst, m.rail) for m in standing} == {("h0", "h2", 1), ("h1", "h2", 1)}
        # the pair's own path mixes the rails, as before rails
        paths = {(k.src, k.dst) for k in server.store.paths}
        assert ("h0", "h2") in paths
        # probe why names the rail, with no request at all yet
        doc = query(f"127.0.0.1:{server.port}", 10, None, "e2e_s", timeout=30)
        out = [(r["src"], r["dst"], r["rail"]) for r in doc["rails"] if r["stands_out"]]
        assert sorted(out) == [("h0", "h2", 1), ("h1", "h2", 1)]
        assert (
            server.registry.get_sample_value("fabricprobe_rail_paths_standing_out", {"rail": "1"})
            == 2
        )
        assert (
            server.registry.get_sample_value("fabricprobe_rail_paths_standing_out", {"rail": "0"})
            == 0
        )
        # the classes of each rail come apart
        report = agents[0].last_report
        assert report is not None
        assert {w.rail for w in report.class_windows} == {0, 1}
    finally:
        for a in agents:
            a.close()
        server.stop(0)
