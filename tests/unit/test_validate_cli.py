"""`probe validate` from the command line: exit codes 0/1/2, --json, table and summary."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import fabricprobe.cli.commands.validate as validate_cmd
from fabricprobe.cli import main
from fabricprobe.probes.roce import LiveMeasurement, PathFigures

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SYS = FIXTURES / "sys"
TOOLS = FIXTURES / "tools"


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, ["validate", *args], env={"COLUMNS": "300"})
    if res.exception and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.stdout, res.stderr


def fixture_args(kind: str, *tools: str) -> list[str]:
    out = ["--sysfs", str(SYS / kind)]
    for t in tools:
        out += ["--replay", str(TOOLS / t)]
    return out


def sys_with_overlay(tmp_path: Path, overlay: str) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(SYS / "mlx5", root, symlinks=True)
    shutil.copytree(SYS / "overlays" / overlay, root, symlinks=True, dirs_exist_ok=True)
    return root


def test_good_host_exits_0() -> None:
    code, out, _ = run(*fixture_args("mlx5", "mlx5"))
    assert code == 0
    assert "PASS" in out and "FAIL" not in out
    assert out.strip().splitlines()[-1].startswith("OK: 20 pass, 0 warn, 0 fail, 1 skip")


def test_misconfigured_host_exits_1_with_fix() -> None:
    code, out, _ = run(*fixture_args("mlx5", "mlx5", "pfc_wrong_priority"), "--window", "0")
    assert code == 1
    assert "PFC is off on RoCE priority 3" in out
    assert "fix: dcb pfc set dev ens1f0np0 prio-pfc all:off 3:on" in out
    assert out.strip().splitlines()[-1].startswith("FAIL:")


def test_pause_storm_over_a_window() -> None:
    code, out, _ = run(*fixture_args("mlx5", "mlx5", "pause_storm"), "--window", "2")
    assert code == 1
    assert "pause storm" in out


def test_json_is_valid_and_complete(tmp_path: Path) -> None:
    root = sys_with_overlay(tmp_path, "ecn_off")
    code, out, _ = run("--sysfs", str(root), "--replay", str(TOOLS / "mlx5"), "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["ok"] is False
    assert doc["summary"]["fail"] == 2
    failed = [r for r in doc["results"] if r["status"] == "FAIL"]
    assert [r["check"] for r in failed] == ["ecn_rp", "ecn_np"]
    assert failed[0]["fix"].startswith("echo 1 > ")
    assert doc["policy"]["dscp"] == 26


def test_no_rdma_device_exits_1_and_names_soft_roce(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    (root / "class/net/enp0s3").mkdir(parents=True)
    (root / "class/net/enp0s3/operstate").write_text("up\n")
    code, out, _ = run("--sysfs", str(root))
    assert code == 1
    assert "no RDMA device" in out
    assert "probe rxe up --netdev enp0s3" in out
    code, out, _ = run("--sysfs", str(root), "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["results"][0]["status"] == "FAIL"
    assert "probe rxe up --netdev enp0s3" in doc["results"][0]["fix"]


def test_rxe_host_exits_0_with_skips() -> None:
    code, out, _ = run(*fixture_args("rxe", "rxe"), "--json")
    assert code == 0
    doc = json.loads(out)
    skipped = {r["check"] for r in doc["results"] if r["status"] == "SKIP"}
    assert skipped == set(
        [
            "pfc",
            "trust",
            "ecn_rp",
            "ecn_np",
            "cnp",
            "ets",
            "global_pause",
            "buffers",
            "dcbx",
            "link",
            "fec",
            "pcie",
            "acs",
            "firmware",
        ]
    )


def test_priority_and_dscp_flags_override_the_policy_file(tmp_path: Path) -> None:
    policy = tmp_path / "roce.toml"
    policy.write_text("[roce]\npriority = 4\ndscp = 34\n")
    code, out, _ = run(*fixture_args("mlx5", "mlx5"), "--policy", str(policy), "--json")
    assert code == 1
    assert json.loads(out)["policy"]["priority"] == 4
    code, out, _ = run(
        *fixture_args("mlx5", "mlx5"), "--policy", str(policy), "--priority", "3", "--dscp", "26"
    )
    assert code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--priority", "8"], "--priority"),
        (["--dscp", "64"], "--dscp"),
        (["--window", "-1"], "--window"),
        (["--bogus"], "No such option"),
        (["--priority", "6"], "cnp_priority must differ"),
    ],
)
def test_bad_usage_exits_2(args: list[str], message: str) -> None:
    code, _, err = run(*fixture_args("mlx5", "mlx5"), *args)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_bad_policy_file_exits_2(tmp_path: Path) -> None:
    policy = tmp_path / "roce.toml"
    policy.write_text("[roce]\nmtu = 9000\n")
    code, _, err = run(*fixture_args("mlx5", "mlx5"), "--policy", str(policy))
    assert code == 2 and "mtu must be one of" in err
    code, _, err = run(*fixture_args("mlx5", "mlx5"), "--policy", str(tmp_path / "nope.toml"))
    assert code == 2 and "cannot read policy file" in err


def test_bad_capture_dir_exits_2(tmp_path: Path) -> None:
    code, _, err = run("--sysfs", str(SYS / "mlx5"), "--replay", str(tmp_path))
    assert code == 2 and "commands.toml" in err


def test_peer_without_a_measurer_is_a_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        validate_cmd,
        "probe_measure",
        lambda sysfs, dev, bind, soft, timeout: (None, "fabricprobe.probes.tcp is not installed"),
    )
    code, out, _ = run(*fixture_args("mlx5", "mlx5"), "--window", "0", "--peer", "10.0.0.2")
    assert code == 0
    assert "live check not available: fabricprobe.probes.tcp is not installed" in out


def test_peer_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str | None, str | None]] = []

    def fake(
        sysfs: str, dev: str | None, bind: str | None, soft: bool, timeout: float | None
    ) -> tuple[object, str]:
        assert not soft
        seen.append((dev, bind))

        def measure(peer: str) -> LiveMeasurement:
            return LiveMeasurement(
                peer, PathFigures(3.9, 6.1, 370.0), PathFigures(22.0, 48.0, 41.0)
            )

        return measure, ""

    monkeypatch.setattr(validate_cmd, "probe_measure", fake)
    args = ["--device", "mlx5_0", "--window", "0", "--peer", "10.0.0.2", "--json"]
    code, out, _ = run(*fixture_args("mlx5", "mlx5"), *args)
    assert code == 0
    # the live probes go out from the address of the netdev under test
    assert seen == [("mlx5_0", "192.168.10.11")]
    live = [r for r in json.loads(out)["results"] if r["check"] == "live"]
    assert live[0]["status"] == "PASS" and "3.9" in live[0]["message"]


def test_verbose_shows_evidence() -> None:
    code, out, _ = run(*fixture_args("mlx5", "mlx5"), "--window", "0", "-v")
    assert code == 0
    assert "ibv_devinfo port 1: active_mtu 4096" in out


def test_help_smoke() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fabricprobe", "validate", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    assert "probe validate --device mlx5_0" in proc.stdout
    assert "Exit status: 0 when nothing FAILs" in proc.stdout


def test_fix_commands_are_never_split_at_80_columns(tmp_path: Path) -> None:
    root = sys_with_overlay(tmp_path, "ecn_off")
    args = ["validate", "--sysfs", str(root), "--replay", str(TOOLS / "mlx5")]
    args += ["--replay", str(TOOLS / "pfc_wrong_priority"), "--window", "0"]
    res = CliRunner().invoke(main, [*args, "--json"], env={"COLUMNS": "80"})
    fixes = [
        r["fix"] for r in json.loads(res.stdout)["results"] if r["fix"] and r["status"] != "PASS"
    ]
    assert len(fixes) >= 3 and any(len(f) > 80 for f in fixes)
    res = CliRunner().invoke(main, args, env={"COLUMNS": "80"})
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    for fix in fixes:
        assert any(fix in line for line in lines), f"fix split across lines: {fix}"
    table = [ln for ln in lines if not ln.startswith("[")]
    assert max(len(ln) for ln in table[:-1]) <= 80  # the table itself fits the terminal


# ------------------------------------------------------------------ NICs, rails and GPUs

GPU8_ARGS = ["--sysfs", str(SYS / "gpu8"), "--replay", str(TOOLS / "mlx5_no_tools")]
RAIL_NETS = ",".join(f"10.100.{r}.0/24={r}" for r in range(8))


def test_a_gpu_host_is_validated_nic_by_nic_with_rail_and_gpu() -> None:
    code, out, _ = run(*GPU8_ARGS, "--window", "0", "--rails", RAIL_NETS, "--json")
    assert code == 0
    doc = json.loads(out)
    nics = {n["device"]: n for n in doc["nics"]}
    assert nics["mlx5_3"] == {
        "device": "mlx5_3",
        "rail": 3,
        "gpu": "GPU3",
        "gpu_address": "0000:3c:00.0",
        "gpu_link": "PIX",
    }
    assert nics["mlx5_8"]["rail"] is None and nics["mlx5_8"]["gpu_link"] == "NODE"
    # every check runs on every NIC
    checked = {r["device"] for r in doc["results"] if r["check"] == "pcie"}
    assert checked == {f"mlx5_{i}" for i in range(9)}
    code, out, _ = run(*GPU8_ARGS, "--window", "0", "--rails", "gpu", "--device", "mlx5_6")
    assert code == 0
    line = next(x for x in out.splitlines() if "mlx5_6" in x and "GPU" in x)
    assert "rail 6" in line and "GPU6" in line and "PIX" in line and "0000:ba:00.0" in line


def test_without_rails_a_gpu_host_still_shows_each_nics_gpu() -> None:
    code, out, _ = run(*GPU8_ARGS, "--window", "0", "--json")
    doc = json.loads(out)
    assert code == 0 and {n["rail"] for n in doc["nics"]} == {None}
    assert {n["gpu"] for n in doc["nics"]} == {f"GPU{i}" for i in range(8)}


def test_a_laptop_prints_as_it_always_did() -> None:
    """No GPU and no rail: no NICs table, no `nics` in the JSON."""
    args = ["--sysfs", str(SYS / "laptop"), "--replay", str(TOOLS / "rxe"), "--window", "0"]
    code, out, _ = run(*args)
    assert code == 0 and out.startswith("┏") and "GPU address" not in out  # the checks first
    code, out, _ = run(*args, "--json")
    assert "nics" not in json.loads(out)
    code, out, _ = run(*fixture_args("rxe", "rxe"), "--json")
    assert "nics" not in json.loads(out)


def test_a_bad_rail_rule_exits_2() -> None:
    code, _, err = run(*GPU8_ARGS, "--rails", "mlx5_0=99")
    assert code == 2 and "rail" in err and len(err.strip().splitlines()) == 1
