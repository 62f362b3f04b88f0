"""Which link, held to the lane's leaf-spine: agents on rail 0's four hosts probe each
other over UD in four ECMP classes per peer, trace their classes, and report to a
collector that knows the fabric file; each trial degrades one leaf-spine link chosen at
random (netem in its router's namespace: a delay of 1-5 ms or 2 % loss) and the
collector must rank that link first and flag it alone, within two windows, and flag no
healthy link at any time. Every trial is printed and written to
test-results/fabric-links.json."""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.fabric.localize import LocalizeConfig
from fabricprobe.collector.fabric.plan import coverage
from fabricprobe.collector.fabric.service import FabricConfig
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from tests.fabric.conftest import Fabric

WINDOW_S = 4.0
CLASSES = 2
TRIALS = 10
SETTLE_S = 1.5  # after a window boundary, for every agent's report to be in
RESULTS = Path("test-results")


def netem(router: str, dev: str, *args: str) -> None:
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            router,
            "tc",
            "qdisc",
            "replace",
            "dev",
            dev,
            "root",
            "netem",
            *args,
        ],
        check=True,
    )


def clear(router: str, dev: str) -> None:
    subprocess.run(
        ["ip", "netns", "exec", router, "tc", "qdisc", "del", "dev", dev, "root"],
        check=False,
        capture_output=True,
    )


def egress(fabric: Fabric, link: str) -> tuple[str, str]:
    """The router and veth whose egress carries directed LINK."""
    a, b = link.split("->")
    for c in fabric.doc["links"]:
        if (c["a"], c["b"]) == (a, b):
            return a, c["a_dev"]
        if (c["b"], c["a"]) == (a, b):
            return a, c["b_dev"]
    raise AssertionError(link)


def next_boundary(after: float) -> float:
    return (int(after / WINDOW_S) + 1) * WINDOW_S


@pytest.mark.timeout(1500)
def test_a_degraded_leaf_spine_link_is_named_alone(fabric: Fabric, tmp_path: Path) -> None:
    hosts = [n for n in fabric.nics if n.rail == 0]
    server = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0",
            metrics_listen="",
            grace=0.5,
            api=ApiConfig(
                trust_local_registration=True,  # the lane's hosts call from 127.0.0.1
                report_interval_ms=int(WINDOW_S * 1000),
                plan=PlanConfig(
                    interval_ms=2000, count=60, budget=8, kinds=("rdma_ud",), bursts_per_second=40
                ),
            ),
            fabric=FabricConfig(
                os.environ["LANE_FILE"],
                LocalizeConfig(min_rise_s=0.0005, fresh_s=3 * WINDOW_S + SETTLE_S),
                ecmp_classes=CLASSES,
            ),
        )
    )
    server.start()
    links = server.api.links
    assert links is not None
    agents = [
        Agent(
            AgentConfig(
                host=h.name,
                collector=f"127.0.0.1:{server.port}",
                probe_listen=f"{h.ip}:0",
                addresses=[h.ip],
                devices=[h.device],
                spool_dir=str(tmp_path / h.name),
                insecure=True,
                window_s=WINDOW_S,
                # a UD probe waits this for its answers before the next goes, and its
                # round this much (a second at least) for late ones: a lossy burst's
                # outcome lands in the window it ran in
                probe_timeout=0.5,
                probe_workers=4,
                # four agents' loops on the VM's two CPUs: busy-polling, each made the
                # others' RTTs tens of ms; asleep on completion events they answer in
                # about 0.1 ms, and a wake-up's wait for a CPU counts as prober delay
                probe_spin_us=0,
                host_reference=False,
                # the four agents share this process: each would see all four's CPU as
                # its own and stretch its probing
                cpu_budget=4.0,
                pressure_limit=1.0,
            )
        )
        for h in hosts
    ]
    for a in agents:
        a.start()
    uplinks = [
        f"{c[x]}->{c[y]}"
        for c in fabric.doc["links"]
        if c["tier"] == "leaf-spine" and c["rail"] == 0
        for x, y in (("a", "b"), ("b", "a"))
    ]
    trials: list[dict[str, object]] = []
    try:
        # every class's way out and back traced, and baselines in place
        want = 2 * len(hosts) * (len(hosts) - 1) * CLASSES  # out and back
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            snap = links.snapshot()
            print(
                f"links warm-up: {snap.paths} class paths of {want}, counts {snap.counts}",
                flush=True,
            )
            if snap.paths >= want and snap.counts.class_windows >= 2 * want:
                break
            time.sleep(5)
        snap = links.snapshot()
        assert snap.paths >= want, (snap.paths, snap.counts)
        through, short = coverage(links.class_links(), uplinks, k=2)
        print("links coverage:", through, flush=True)
        assert not short, through  # k = 2 covers each leaf-spine link
        quiet_flags = []
        for _ in range(3):  # quiet windows: nothing flagged
            time.sleep(next_boundary(time.time()) + SETTLE_S - time.time())
            verdicts = links.snapshot().verdicts
            quiet = [(v.link, v.classes, v.bad_classes) for v in verdicts[:4]]
            print("links quiet:", quiet, flush=True)
            quiet_flags += [v.link for v in verdicts if v.suspect]
        assert not quiet_flags, quiet_flags
        rng = random.Random(int(os.environ.get("FABRICPROBE_TRIAL_SEED", "24")))
        for trial in range(TRIALS):
            link = rng.choice(uplinks)
            what = ["delay", f"{rng.randint(1, 5)}ms"] if trial % 2 == 0 else ["loss", "2%"]
            router, dev = egress(fabric, link)
            netem(router, dev, *what)
            t0 = time.time()
            got: dict[str, object] = {"trial": trial + 1, "link": link, "netem": " ".join(what)}
            healthy_flagged: set[str] = set()
            detected = None
            try:
                b = next_boundary(t0)
                for k in range(1, 5):
                    time.sleep(max(0.0, b + SETTLE_S - time.time()))
                    verdicts = links.snapshot().verdicts
                    flagged = [v.link for v in verdicts if v.suspect]
                    healthy_flagged |= set(flagged) - {link}
                    if detected is None and verdicts[0].link == link and flagged == [link]:
                        detected = k
                        top = verdicts[0]
                        got.update(
                            classes=top.classes,
                            bad_classes=top.bad_classes,
                            rtt_rise_ms=round(top.rtt_rise_s * 1e3, 3),
                            loss=round(top.loss, 4),
                        )
                    if detected is not None and k >= 2:
                        break
                    b += WINDOW_S
            finally:
                clear(router, dev)
            got.update(detected_in_windows=detected, healthy_flagged=sorted(healthy_flagged))
            trials.append(got)
            print("links trial", json.dumps(got), flush=True)
            # recovery: the link's classes come back to their baselines
            for _ in range(6):
                time.sleep(next_boundary(time.time()) + SETTLE_S - time.time())
                if not any(v.suspect for v in links.snapshot().verdicts):
                    break
    finally:
        for a in agents:
            a.close()
        server.stop(0)
        if RESULTS.is_dir():
            (RESULTS / "fabric-links.json").write_text(json.dumps(trials, indent=1))
    named = [
        t for t in trials if t["detected_in_windows"] is not None and t["detected_in_windows"] <= 2
    ]
    assert len(named) >= 9, trials
    assert not [t for t in trials if t["healthy_flagged"]], trials
