"""The links' way through real processes' parts on loopback: a collector with a fabric
file plans rdma_ud targets in ECMP classes, three agents probe them in as many classes
(a stand-in runner: RDMA needs the lane, where tests/fabric runs the real one), their
class windows and traces reach the collector over real gRPC, and what it cannot place
on the fabric (loopback has no routers) is counted, not lost."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.agent.probing import ProbeContext, ProbeOutcome, ProbeSpec
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.fabric.service import FabricConfig
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from tests.unit.sysfs_builder import add_rdma_device

HOSTS = {"h0": "127.0.0.11", "h1": "127.0.0.12", "h2": "127.0.0.13"}


def fabric_file(tmp: Path) -> Path:
    doc = {
        "routers": [{"name": "leaf0", "kind": "leaf", "rail": 0, "interfaces": []}],
        "links": [
            {
                "a": h,
                "a_dev": f"{h}l0",
                "a_ip": ip,
                "b": "leaf0",
                "b_dev": f"l0{h}",
                "b_ip": f"203.0.113.{2 * i}",
                "rail": 0,
                "tier": "host",
            }
            for i, (h, ip) in enumerate(HOSTS.items())
        ],
        "nics": [{"name": h, "ip": ip, "rail": 0, "leaf": "leaf0"} for h, ip in HOSTS.items()],
    }
    p = tmp / "fabric.json"
    p.write_text(json.dumps(doc))
    return p


def ud_stand_in(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
    """A UD burst as rdma_runners' returns it: RTTs, and the class's two ports."""
    return ProbeOutcome(
        "rdma",
        "ud",
        rtt_ns=[20_000] * spec.count,
        sport=0xC000 + 16 * spec.ecmp_class + len(spec.dst),
        return_sport=0xD000 + spec.ecmp_class,
        source=ctx.bind or "",
    )


def test_class_windows_and_traces_reach_the_collector(tmp_path: Path) -> None:
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
            fabric=FabricConfig(str(fabric_file(tmp_path)), ecmp_classes=4),
        )
    )
    server.start()
    links = server.api.links
    assert links is not None
    for i, (h, ip) in enumerate(HOSTS.items()):  # each agent sees an rxe device of its own
        a, b, c, d = (int(x) for x in ip.split("."))
        gid = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
        add_rdma_device(tmp_path / h / "sys", f"rxe{i}", [(1, gid, "RoCE v2", "lo")], parent="lo")
    agents = [
        Agent(
            AgentConfig(
                host=h,
                collector=f"127.0.0.1:{server.port}",
                probe_listen=f"{ip}:0",
                addresses=[ip],
                spool_dir=str(tmp_path / h / "spool"),
                insecure=True,
                window_s=0.5,
                host_reference=False,
                sysfs_root=str(tmp_path / h / "sys"),
                validate_interval_s=0,
                qp_interval_s=0.5,
            ),
            runners={"rdma_ud": ud_stand_in},
        )
        for h, ip in HOSTS.items()
    ]
    try:
        for a in agents:
            a.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            snap = links.snapshot()
            if snap.counts.class_windows >= 3 * 2 * 4 and snap.counts.paths_unresolved:
                break
            time.sleep(0.2)
        specs = agents[0].scheduler.targets()
        assert sorted((s.dst, s.ecmp_class) for s in specs) == [
            (d, c) for d in ("h1", "h2") for c in range(4)
        ]
        assert all(s.count == 2 for s in specs)  # 8 exchanges shared by 4 classes
        snap = links.snapshot()
        assert snap.counts.class_windows >= 24 and snap.counts.class_windows_refused == 0
        # loopback: every trace reaches its peer with no router on the way
        assert snap.counts.paths_unresolved.get("no routed hop", 0) >= 1
        assert agents[0].tracer.counts.classes >= 1
        report = agents[0].last_report
        assert report is not None and {w.sport for w in report.class_windows} >= {0xC002}
        assert sum(w.rtt.count for w in report.class_windows) == sum(
            w.rtt.count for w in report.probes
        )
        # asked to list their QPs (the collector has a fabric file); this host has no RDMA
        # netlink, so each listing says why it could not be read, and a request between
        # them keeps its pair's classes with that reason
        assert all(a.qps.wanted for a in agents)
        flows = links.flows.counts
        while time.monotonic() < deadline:  # a listing a window once an agent is assigned
            got, why = links.flow_links("h0", "h1", time.time() - 60, time.time())
            if flows.listings >= 3 and "cannot list" in why:
                break
            time.sleep(0.2)
        assert flows.listings >= 3 and flows.listings_failed == flows.listings
        assert not got and why.startswith("h0 cannot list its QPs ("), why
    finally:
        for a in agents:
            a.close()
        server.stop(0)
