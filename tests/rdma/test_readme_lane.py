"""The by-hand lane fleet of docs/soft-roce.md, run exactly as written: a collector and one `probe
agent` process per lane host, RDMA (RC, UD) and TCP RTT histograms for every pair on
/metrics within a minute of the agents registering (the page's commands wait for them)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from tests.rdma.conftest import LaneHost

DOC = Path(__file__).resolve().parents[2] / "docs" / "soft-roce.md"
BLOCK = re.compile(
    r"<!-- lane-fleet:begin -->\n```bash\nlane/run\.sh -- bash -c '\n(.*?)\n'\n```\n"
    r"<!-- lane-fleet:end -->",
    re.S,
)
SERIES = re.compile(r"^fabricprobe_rtt_seconds_count\{([^}]*)\} (\S+)$", re.M)


def readme_commands() -> str:
    m = BLOCK.search(DOC.read_text())
    assert m, "docs/soft-roce.md has no lane-fleet block"
    return m.group(1)


def test_readme_lane_fleet(lane_hosts: list[LaneHost]) -> None:
    names = [h.name for h in lane_hosts[:3]]
    assert names == ["h0", "h1", "h2"], "docs/soft-roce.md names the lane's hosts h0..h2"
    t0 = time.monotonic()
    # the commands need the repository root as their directory, as the page's do
    res = subprocess.run(
        ["bash", "-c", readme_commands()],
        cwd=DOC.parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(f"\n{res.stdout}(the page's commands: {time.monotonic() - t0:.0f} s in all)")
    assert res.returncode == 0, res.stderr[-3000:]
    seen = set()
    for labels, value in SERIES.findall(res.stdout):
        kv = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if float(value) > 0:
            seen.add((kv["src"], kv["dst"], kv["transport"], kv["op"]))
    want = {
        (s, d, tr, op)
        for s in names
        for d in names
        if s != d
        for tr, op in (("rdma", "send"), ("rdma", "ud"), ("tcp", "pingpong"))
    }
    assert not want - seen, f"missing a minute after the agents registered: {sorted(want - seen)}"
