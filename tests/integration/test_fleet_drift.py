"""A loopback fleet whose hosts run `probe validate` on their schedule: one host's
configuration differs from its ToR's, and the collector flags exactly that host.

Four agents on 127.0.0.2-5 each read a copy of the mlx5 fixture host (sysfs tree and
tool captures, tests/fixtures); host-4's netdev has MTU 1500 where the others have 9000,
host-5 runs a newer firmware under a waiver. Real gRPC to one collector; the plan probes
TCP only, inside 127.0.0.0/8.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from fabricprobe.agent.agent import Agent
from fabricprobe.cli import main as cli
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.drift import parse_waivers
from fabricprobe.collector.service import ApiConfig
from fabricprobe.probes.roce import ReplayRunner
from tests.support.fleet import (
    FIXTURES,
    fast_server_config,
    loopback_agent_config,
    running_collector,
    scrape,
    wait_for,
)

ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


def host_tree(tmp: Path, name: str, overlays: tuple[str, ...]) -> Path:
    root = tmp / name / "sys"
    shutil.copytree(FIXTURES / "sys" / "mlx5", root, symlinks=True)
    for o in overlays:
        shutil.copytree(FIXTURES / "sys" / "overlays" / o, root, symlinks=True, dirs_exist_ok=True)
    return root


def newer_firmware(root: Path) -> None:
    for fw in root.glob("class/infiniband/*/fw_ver"):
        fw.write_text("28.41.1000\n")


def test_the_one_host_unlike_its_tor_is_flagged(tmp_path: Path) -> None:
    cfg = fast_server_config(
        api=ApiConfig(
            trust_local_registration=True,
            report_interval_ms=1000,
            plan=PlanConfig(interval_ms=1000, count=3, kinds=("tcp_lat",)),
            fleet_networks=("127.0.0.0/8",),
        ),
        drift_waivers=parse_waivers(
            [{"host": "host-5", "check": "firmware", "reason": "canary firmware"}]
        ),
    )
    agents: list[Agent] = []
    with running_collector(cfg) as server:
        try:
            for addr in ADDRESSES:
                name = "host-" + addr.rsplit(".", 1)[1]
                root = host_tree(tmp_path, name, ("mtu_mismatch",) if name == "host-4" else ())
                tools = [FIXTURES / "tools" / "mlx5"]
                if name == "host-4":
                    tools.append(FIXTURES / "tools" / "mtu_mismatch")
                if name == "host-5":
                    newer_firmware(root)
                a = Agent(
                    loopback_agent_config(
                        tmp_path,
                        addr,
                        server.port,
                        sysfs_root=str(root),
                        topology="tor-a",
                        role="decode",
                        validate_interval_s=60.0,
                        validate_first_s=0.0,
                    ),
                    ethtool_runner=ReplayRunner(*tools),
                )
                a.start()
                agents.append(a)
            wait_for(lambda: len(server.drift.hosts) == 4, 60, "every host's checks")
            rows = server.drift.drift()
            flagged = {(d.host, d.check, d.waived) for d in rows}
            assert {h for h, _, w in flagged if not w} == {"host-4"}, rows
            assert ("host-4", "mtu", False) in flagged
            assert ("host-5", "firmware", True) in flagged
            mtu = next(d for d in rows if d.check == "mtu" and d.group_by == "topology")
            assert mtu.value.startswith("1500/") and mtu.peers_value.startswith("9000/")
            assert mtu.peers_agree == 3 and mtu.group_size == 4
            text = scrape(server)
            drift_lines = [
                ln for ln in text.splitlines() if ln.startswith("fabricprobe_host_check_drift{")
            ]
            assert drift_lines and all(
                'host="host-4"' in ln or 'waived="true"' in ln for ln in drift_lines
            ), drift_lines
            assert "fabricprobe_drift_hosts 1.0" in text
            assert 'fabricprobe_host_check_status{check="mtu",host="host-4"} 3.0' in text
            # the operator's view: probe validate --fleet, over real gRPC
            fleet = ["validate", "--fleet", "--insecure", "--collector", f"127.0.0.1:{server.port}"]
            out = CliRunner().invoke(cli, [*fleet, "--json"])
            assert out.exit_code == 1, out.output
            data = json.loads(out.output)
            assert {r["host"] for r in data["drift"]} == {"host-4"}
            assert len(data["hosts"]) == 4
            out = CliRunner().invoke(cli, [*fleet, "--include-waived"])
            assert "host-4" in out.output and "canary firmware" in out.output, out.output
        finally:
            for a in agents:
                a.close(flush_timeout=0.5)
