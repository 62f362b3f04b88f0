"""Which link, held to the lane's leaf-spine: agents on the four hosts probe each other
over UD in two ECMP classes per peer, trace their classes, and report to a collector
that knows the fabric file; each trial degrades one leaf-spine link chosen at random
(netem in its router's namespace: a delay of 1-5 ms or 2 % loss) and the collector must
rank that link first and flag it alone, within two windows, and flag no healthy link at
any time. On rail 0 alone, ten trials; with both rails probed rail by rail, a delay on
either rail's link is named with its rail. Every trial is printed and written to
test-results/fabric-links*.json."""

from __future__ import annotations

import html
import json
import os
import random
import re
import subprocess
import sys
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
from tests.fabric.conftest import Fabric, Nic

WINDOW_S = 4.0
CLASSES = 2
TRIALS = 10
SETTLE_S = 1.5  # after a window boundary, for every agent's report to be in
RESULTS = Path("test-results")
RAILS = ["192.0.2.0/24=0", "198.51.100.0/24=1"]  # the lane's rail networks


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


class Fleet:
    """A collector with the lane's fabric file and an agent on each host, probing the
    peers on each of RAILS' rails (rail 0 alone when none), in UD classes."""

    def __init__(
        self, fabric: Fabric, tmp_path: Path, rails: list[int], count: int, **agent: object
    ) -> None:
        self.fabric = fabric
        self.agent_settings = agent  # more AgentConfig settings for every agent
        self.hosts = sorted({n.name for n in fabric.nics})
        self.rails = rails
        self.short: list[str] = []  # leaf-spine links fewer than two classes cross
        self.server = CollectorServer(
            ServerConfig(
                listen="127.0.0.1:0",
                metrics_listen="127.0.0.1:0",  # for `probe report`
                grace=0.5,
                api=ApiConfig(
                    trust_local_registration=True,  # the lane's hosts call from 127.0.0.1
                    report_interval_ms=int(WINDOW_S * 1000),
                    plan=PlanConfig(
                        interval_ms=2000,
                        count=count,
                        budget=8,
                        kinds=("rdma_ud",),
                        bursts_per_second=40 * len(rails),
                    ),
                ),
                fabric=FabricConfig(
                    os.environ["LANE_FILE"],
                    LocalizeConfig(min_rise_s=0.0005, fresh_s=3 * WINDOW_S + SETTLE_S),
                    ecmp_classes=CLASSES,
                ),
            )
        )
        self.server.start()
        links = self.server.api.links
        assert links is not None
        self.links = links
        self.report_seen: set[tuple[str, int | None, bool]] = set()  # see report()
        self.agents = [self._agent(h, tmp_path) for h in self.hosts]
        for a in self.agents:
            a.start()

    def _agent(self, host: str, tmp_path: Path) -> Agent:
        nics: list[Nic] = [self.fabric.nic(host, r) for r in self.rails]
        return Agent(
            AgentConfig(
                host=host,
                collector=f"127.0.0.1:{self.server.port}",
                # one address answers rail 0; with rails, every rail's address answers
                probe_listen=f"{nics[0].ip}:0" if len(nics) == 1 else "0.0.0.0:0",
                addresses=[n.ip for n in nics],
                devices=[n.device for n in nics],
                rails=RAILS if len(nics) > 1 else [],
                spool_dir=str(tmp_path / host),
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
                **self.agent_settings,  # type: ignore[arg-type]
            )
        )

    def uplinks(self, rail: int) -> list[str]:
        """RAIL's leaf-spine links, each way."""
        return [
            f"{c[x]}->{c[y]}"
            for c in self.fabric.doc["links"]
            if c["tier"] == "leaf-spine" and c["rail"] == rail
            for x, y in (("a", "b"), ("b", "a"))
        ]

    def covered(self, rail: int) -> list[str]:
        """RAIL's leaf-spine links that two classes or more cross: the ones a trial can
        name (a link one class crosses cannot be: one bad class is noise)."""
        return [u for u in self.uplinks(rail) if u not in self.short]

    def warm_up(self) -> None:
        """Every class's way out and back traced, baselines in place, the leaf-spine
        links two classes cross known (the collector's own count of the others agreeing),
        and three quiet windows with nothing flagged."""
        n = len(self.hosts)
        want = 2 * n * (n - 1) * CLASSES * len(self.rails)  # out and back
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            snap = self.links.snapshot()
            print(
                f"links warm-up: {snap.paths} class paths of {want}, counts {snap.counts}",
                flush=True,
            )
            if snap.paths >= want and snap.counts.class_windows >= 2 * want:
                break
            time.sleep(5)
        snap = self.links.snapshot()
        assert snap.paths >= want, (snap.paths, snap.counts)
        uplinks = [u for r in self.rails for u in self.uplinks(r)]
        through, short = coverage(self.links.class_links(), uplinks, k=2)
        print("links coverage:", through, "short of two classes:", short, flush=True)
        # Each class's port comes from its QP's number, and the QP numbers a run gets
        # depend on what ran before it in the VM: with two classes a pair, a link now and
        # then gets one class (spine1->leaf1 once, 1 of the 12 classes into leaf1). The
        # collector says which (fabricprobe_links_uncovered), and the trials leave them.
        uncovered = set(self.links.snapshot().uncovered) & set(uplinks)
        assert uncovered == set(short), (uncovered, short)
        assert len(short) <= 2, through  # more would be a plan that does not spread
        self.short = short
        quiet_flags = []
        for _ in range(3):  # quiet windows: nothing flagged
            time.sleep(next_boundary(time.time()) + SETTLE_S - time.time())
            verdicts = self.links.snapshot().verdicts
            quiet = [(v.link, v.classes, v.bad_classes) for v in verdicts[:4]]
            print("links quiet:", quiet, flush=True)
            quiet_flags += [v.link for v in verdicts if v.suspect]
        assert not quiet_flags, quiet_flags

    def trial(
        self, n: int, link: str, what: list[str], report: Path | None = None
    ) -> dict[str, object]:
        """Degrade LINK with netem WHAT for up to four windows: in which window it was
        ranked first and flagged alone, with its evidence and rail, and every healthy
        link flagged meanwhile (with REPORT, `probe report` is written there once it is
        named, the link still degraded); then wait for the link's classes to come back."""
        router, dev = egress(self.fabric, link)
        netem(router, dev, *what)
        t0 = time.time()
        got: dict[str, object] = {"trial": n, "link": link, "netem": " ".join(what)}
        healthy_flagged: set[str] = set()
        tops: list[list[tuple[object, ...]]] = []
        detected = None
        try:
            b = next_boundary(t0)
            for k in range(1, 5):
                time.sleep(max(0.0, b + SETTLE_S - time.time()))
                snap = self.links.snapshot()
                verdicts = snap.verdicts
                flagged = [v.link for v in verdicts if v.suspect]
                healthy_flagged |= set(flagged) - {link}
                # each window's first four, for a trial that goes wrong: (link, classes,
                # bad classes, rise in ms, suspect), and how many classes wait for their
                # way back to be traced
                tops.append(
                    [
                        *(
                            (
                                v.link,
                                v.classes,
                                v.bad_classes,
                                round(v.rtt_rise_s * 1e3, 2),
                                v.suspect,
                            )
                            for v in verdicts[:4]
                        ),
                        ("partial", snap.partial),
                    ]
                )
                if detected is None and verdicts[0].link == link and flagged == [link]:
                    detected = k
                    top = verdicts[0]
                    got.update(
                        classes=top.classes,
                        bad_classes=top.bad_classes,
                        rtt_rise_ms=round(top.rtt_rise_s * 1e3, 3),
                        loss=round(top.loss, 4),
                        rail=top.rail,
                    )
                    if report is not None:
                        self.report(report)
                if detected is not None and k >= 2:
                    break
                b += WINDOW_S
        finally:
            clear(router, dev)
        got.update(
            detected_in_windows=detected, healthy_flagged=sorted(healthy_flagged), windows=tops
        )
        print("links trial", json.dumps(got), flush=True)
        # recovery: the link's classes come back to their baselines
        for _ in range(6):
            time.sleep(next_boundary(time.time()) + SETTLE_S - time.time())
            if not any(v.suspect for v in self.links.snapshot().verdicts):
                break
        return got

    def report(self, out: Path) -> None:
        """Write `probe report` to OUT; the collector's first-ranked link, its rail and
        whether it was suspect, as read every half second while the report ran, go to
        self.report_seen."""
        # under the VM's emulation, on a loaded fleet, a new Python process that draws
        # takes a minute or more before its first query (one run's report, given 60 s
        # for its queries and 120 s in all, timed out)
        t0 = time.monotonic()
        report = subprocess.Popen(
            [sys.executable, "-m", "fabricprobe", "report", "--insecure",
             "--collector", f"127.0.0.1:{self.server.port}",
             "--metrics-url", f"http://127.0.0.1:{self.server.metrics_port}/metrics",
             "--out", str(out), "--timeout", "240"],
        )  # fmt: skip
        self.report_seen.clear()
        while report.poll() is None:
            assert time.monotonic() - t0 < 600, "probe report took over 600 s"
            top = self.links.snapshot().verdicts[0]
            self.report_seen.add((top.link, top.rail, top.suspect))
            time.sleep(0.5)
        assert report.returncode == 0, report.returncode
        print(f"links report written in {time.monotonic() - t0:.0f} s", flush=True)

    def close(self, trials: list[dict[str, object]], name: str) -> None:
        for a in self.agents:
            a.close()
        self.server.stop(0)
        if RESULTS.is_dir():
            (RESULTS / name).write_text(json.dumps(trials, indent=1))


def named_in_two(t: dict[str, object]) -> bool:
    d = t["detected_in_windows"]
    return isinstance(d, int) and d <= 2


@pytest.mark.timeout(1500)
def test_a_degraded_leaf_spine_link_is_named_alone(fabric: Fabric, tmp_path: Path) -> None:
    # bursts of 120: at 2 % loss a link only two classes cross still loses a few a window
    fleet = Fleet(fabric, tmp_path, rails=[0], count=120)
    trials: list[dict[str, object]] = []
    try:
        fleet.warm_up()
        uplinks = fleet.covered(0)
        rng = random.Random(int(os.environ.get("FABRICPROBE_TRIAL_SEED", "24")))
        for n in range(TRIALS):
            link = rng.choice(uplinks)
            what = ["delay", f"{rng.randint(1, 5)}ms"] if n % 2 == 0 else ["loss", "2%"]
            trials.append(fleet.trial(n + 1, link, what))
    finally:
        fleet.close(trials, "fabric-links.json")
    assert len([t for t in trials if named_in_two(t)]) >= 9, trials
    assert not [t for t in trials if t["healthy_flagged"]], trials


@pytest.mark.timeout(1500)
def test_a_delay_on_one_rail_is_named_on_that_rail(fabric: Fabric, tmp_path: Path) -> None:
    """Every host probes its peers on both rails, device to device within a rail; a
    delay on a leaf-spine link of rail 1, then of rail 0, is named alone, with its rail
    (rail 1's leaves are leaf3-leaf5, its links share the spines)."""
    # twice the classes of rail 0 alone: bursts of 120 probes loaded the VM's answering
    # loops enough to raise every class into some hosts (a responder's wait to see a
    # probe is in no one's measured delay), and the links into them were named
    fleet = Fleet(fabric, tmp_path, rails=[0, 1], count=60)
    trials: list[dict[str, object]] = []
    try:
        fleet.warm_up()
        rng = random.Random(int(os.environ.get("FABRICPROBE_TRIAL_SEED", "24")))
        for n, rail in enumerate((1, 0, 1)):
            link = rng.choice(fleet.covered(rail))
            # the report in the last trial: a new Python process loads the VM's two CPUs
            # for about two minutes, and the windows after it were no quiet fabric (with it
            # in the first trial, the second failed twice in four runs: once every class
            # into two hosts rose 4-5 ms and the links into them were flagged)
            out = tmp_path / "report" if n == 2 else None
            got = fleet.trial(n + 1, link, ["delay", f"{rng.randint(2, 4)}ms"], out)
            got["on_rail"] = rail
            trials.append(got)
    finally:
        fleet.close(trials, "fabric-links-rails.json")
    # each named, alone, on its rail; as the rail-0 trials allow one in ten, one of the
    # three may come a window late (measured once: a 3 ms delay on rail 1, 7 of 7 classes
    # bad, named in the third window on a loaded VM; how fast is the benchmark's figure)
    assert all(isinstance(t["detected_in_windows"], int) for t in trials), trials
    assert all(t["rail"] == t["on_rail"] for t in trials), trials
    assert len([t for t in trials if named_in_two(t)]) >= len(trials) - 1, trials
    assert not [t for t in trials if t["healthy_flagged"]], trials
    # the report drew the leaf-spine of both rails and the links as the collector ranked them
    # (kept with the results whatever it shows)
    out = tmp_path / "report"
    if RESULTS.is_dir():
        for f in ("report.html", "fabric_links.png"):
            if (out / f).exists():
                (RESULTS / f"links-{f}").write_bytes((out / f).read_bytes())
    assert (out / "fabric_links.png").stat().st_size > 5000
    page = (out / "report.html").read_text()
    section = page[page.index("<h2>Fabric links") :]
    # its table's first row is the collector's first-ranked link as the report read it:
    # one the collector ranked first while the report ran (the collector's verdicts move
    # on window by window; one run's report read them a minute after the link was named,
    # by when the link's twin direction had risen beside it and neither was flagged)
    m = re.search(r'<tr><td class="l">([^<]*)</td><td class="l">([^<]*)</td>'
                  r'<td class="l">([^<]*)</td>', section)  # fmt: skip
    assert m, section[:3000]
    drawn = (html.unescape(m[1]), int(m[2]) if m[2] else None, m[3] == "yes")
    print("links report's first row", drawn, "collector's while it ran", fleet.report_seen)
    assert drawn in fleet.report_seen, (drawn, fleet.report_seen)
