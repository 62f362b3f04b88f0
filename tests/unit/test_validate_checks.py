"""The RoCE checks over fixture hosts: a good host, each misconfiguration alone, other drivers."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.roce import (
    HostView,
    Policy,
    ReplayRunner,
    Report,
    Status,
    Thresholds,
    validate,
)
from fabricprobe.probes.roce.checks import (
    Target,
    check_pfc,
    check_rdma_cm,
    evaluate_counters,
    iboe_mtu,
)
from fabricprobe.probes.roce.host import CounterSample, ToolRun

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SYS = FIXTURES / "sys"
TOOLS = FIXTURES / "tools"


def host(
    tmp_path: Path,
    kind: str,
    tools: list[str | Path],
    overlays: tuple[str, ...] = (),
) -> HostView:
    """A HostView over a copy of SYS/KIND with OVERLAYS applied, tools replayed from TOOLS."""
    root = tmp_path / "sys"
    shutil.copytree(SYS / kind, root, symlinks=True)
    for o in overlays:
        shutil.copytree(SYS / "overlays" / o, root, symlinks=True, dirs_exist_ok=True)
    ticks = iter(float(i) * 2.0 for i in range(1000))
    return HostView(
        sysfs_root=root,
        runner=ReplayRunner(*(TOOLS / t if isinstance(t, str) else t for t in tools)),
        clock=lambda: next(ticks),
        sleep=lambda s: None,
        is_root=False,
    )


def capture(tmp_path: Path, outputs: dict[str, str]) -> Path:
    """A capture directory answering each command with the given output."""
    d = tmp_path / f"capture{len(list(tmp_path.glob('capture*')))}"
    d.mkdir()
    manifest = []
    for i, (command, text) in enumerate(outputs.items()):
        (d / f"out{i}.txt").write_text(text)
        manifest.append(f'["{command}"]\nstdout = "out{i}.txt"\n')
    (d / "commands.toml").write_text("\n".join(manifest))
    return d


def not_passing(report: Report) -> dict[str, Status]:
    return {r.check: r.status for r in report.results if r.status is not Status.PASS}


def by_check(report: Report, check: str) -> list:
    return [r for r in report.results if r.check == check]


ALL_CHECKS = [
    "device",
    "gid",
    "mtu",
    "pfc",
    "trust",
    "ecn_rp",
    "ecn_np",
    "cnp",
    "rdma_cm",
    "ets",
    "global_pause",
    "buffers",
    "dcbx",
    "link",
    "fec",
    "pcie",
    "acs",
    "firmware",
    "pause",
    "discards",
    "rdma_errors",
]
NO_GPU = {"acs": Status.SKIP}  # the fixture hosts have no GPU: GPUDirect checks do not apply


@pytest.mark.parametrize(
    "tool_view",
    [
        ["mlx5"],
        ["mlx5", "mlx5_dcb_only"],
        ["mlx5", "mlx5_mlnx_qos_only"],
        ["mlx5", "mlx5_unprivileged"],
    ],
)
def test_good_mlx5_host_passes_everything(tmp_path: Path, tool_view: list[str]) -> None:
    report = validate(host(tmp_path, "mlx5", tool_view), Policy())
    assert [r.check for r in report.results] == ALL_CHECKS
    assert not_passing(report) == NO_GPU
    assert report.exit_code == 0
    assert report.summary().startswith("OK: 20 pass, 0 warn, 0 fail, 1 skip")


def test_good_mlx5_host_through_lldptool_only(tmp_path: Path) -> None:
    report = validate(host(tmp_path, "mlx5", ["mlx5", "mlx5_lldptool_only"]), Policy())
    skipped = {"trust": Status.SKIP, "ets": Status.SKIP, "buffers": Status.SKIP}
    assert not_passing(report) == skipped | NO_GPU
    (pfc,) = by_check(report, "pfc")
    assert "lldptool" in pfc.evidence[0]


# Each misconfiguration alone yields exactly its FAIL, with a command that fixes it.
MISCONFIGURED = [
    (
        "pfc_wrong_priority",
        (),
        ["pfc_wrong_priority"],
        "pfc",
        "PFC is off on RoCE priority 3 (on 4)",
        "prio-pfc all:off 3:on",
    ),
    ("ecn_off", ("ecn_off",), [], "ecn_rp+ecn_np", "ECN is off for priority 3", "echo 1 > "),
    ("trust_pcp", (), ["trust_pcp"], "trust", "port trusts PCP", "--trust dscp"),
    (
        "mtu_mismatch",
        ("mtu_mismatch",),
        ["mtu_mismatch"],
        "mtu",
        "netdev MTU 1500 is below 4200: RoCE runs at IB MTU 1024",
        "mtu 9000",
    ),
    ("v1_only_gids", ("v1_only_gids",), [], "gid", "no RoCE v2 GID", "RoCE v2"),
    ("pause_storm", (), ["pause_storm"], "pause", "pause storm", "pause"),
]


@pytest.mark.parametrize(
    ("name", "overlays", "tools", "check", "message", "fix"),
    MISCONFIGURED,
    ids=[m[0] for m in MISCONFIGURED],
)
def test_each_misconfiguration_alone(
    tmp_path: Path,
    name: str,
    overlays: tuple[str, ...],
    tools: list[str],
    check: str,
    message: str,
    fix: str,
) -> None:
    report = validate(host(tmp_path, "mlx5", ["mlx5", *tools], overlays), Policy())
    failing = dict.fromkeys(check.split("+"), Status.FAIL)
    assert {c: s for c, s in not_passing(report).items() if c != "discards"} == failing | NO_GPU
    (result,) = by_check(report, check.split("+")[0])
    assert message in result.message
    assert result.fix is not None and fix in result.fix
    assert report.exit_code == 1


@pytest.mark.parametrize(
    ("misconfig", "check"),
    [("pfc_wrong_priority", "pfc"), ("trust_pcp", "trust")],
)
def test_misconfiguration_seen_through_dcb_alone(
    tmp_path: Path, misconfig: str, check: str
) -> None:
    # the overlay first, then the view without mlnx_qos: dcb alone must see it too
    view = host(tmp_path, "mlx5", ["mlx5", misconfig, "mlx5_dcb_only"])
    report = validate(view, Policy())
    assert not_passing(report) == {check: Status.FAIL} | NO_GPU
    (r,) = by_check(report, check)
    assert any(e.startswith("dcb ") for e in r.evidence)
    assert not any(e.startswith("mlnx_qos") and "ok" in e for e in r.evidence)


def test_pause_storm_details(tmp_path: Path) -> None:
    report = validate(host(tmp_path, "mlx5", ["mlx5", "pause_storm"]), Policy())
    (c,) = by_check(report, "pause")
    assert "tx_pause_storm_error_events +1" in c.message
    assert "priority 3 paused 92% of the window" in c.message
    (d,) = by_check(report, "discards")
    assert d.status is Status.WARN and "rx_discards_phy +4410" in d.message
    assert "rx_discards_phy" not in c.message  # each finding on its own line


def test_bnxt_re_without_counters_dir(tmp_path: Path) -> None:
    report = validate(host(tmp_path, "bnxt_re", ["bnxt_re"]), Policy())
    ecn = dict.fromkeys(("ecn_rp", "ecn_np", "cnp"), Status.SKIP)
    assert not_passing(report) == ecn | {"buffers": Status.SKIP} | NO_GPU
    (rp,) = by_check(report, "ecn_rp")
    assert "does not expose ECN" in rp.message
    (buffers,) = by_check(report, "buffers")
    assert "bnxt_en" in buffers.message or "does not support it" in buffers.message
    assert buffers.fix is None  # nothing to install: the driver has no buffer operations
    for c in ("pause", "discards", "rdma_errors"):
        (counters,) = by_check(report, c)
        assert counters.status is Status.PASS
    (trust,) = by_check(report, "trust")
    assert "trust inferred from the APP table: dscp" in trust.evidence


def test_rxe_skips_pfc_and_ecn_and_never_fails(tmp_path: Path) -> None:
    report = validate(host(tmp_path, "rxe", ["rxe"]), Policy())
    assert not report.failed
    soft = [
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
    assert not_passing(report) == dict.fromkeys(soft, Status.SKIP)
    for check in soft:
        (r,) = by_check(report, check)
        assert "software RDMA" in r.message and "lossy Ethernet" in r.message
    (mtu,) = by_check(report, "mtu")
    assert "MTU 1500 gives IB MTU 1024" in mtu.message
    (gid,) = by_check(report, "gid")
    assert "10.10.0.1 -> index 3" in gid.message


def test_irdma_without_configfs(tmp_path: Path) -> None:
    report = validate(host(tmp_path, "irdma", ["irdma"]), Policy())
    assert not report.failed
    (cm,) = by_check(report, "rdma_cm")
    assert cm.status is Status.SKIP and cm.needs_root
    assert "configfs is not mounted" in cm.message
    assert "needed root and skipped: rdma_cm" in report.summary()
    (pfc,) = by_check(report, "pfc")
    assert pfc.status is Status.PASS and "lldptool" in pfc.evidence[-1]


def test_no_tools_unprivileged_says_what_needed_root(tmp_path: Path) -> None:
    report = validate(host(tmp_path, "mlx5", ["mlx5", "mlx5_no_tools"]), Policy())
    (pfc,) = by_check(report, "pfc")
    assert pfc.status is Status.SKIP and pfc.needs_root
    assert "mlnx_qos -i ens1f0np0: needs root" in pfc.evidence[-1]
    (mtu,) = by_check(report, "mtu")
    assert mtu.status is Status.PASS
    assert "ibverbs-utils" in mtu.message
    assert report.to_dict()["needs_root"] == ["buffers", "ets", "pfc", "trust"]


def test_no_rdma_device(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    (root / "class/net/eth0").mkdir(parents=True)
    (root / "class/net/eth0/operstate").write_text("up\n")
    (root / "class/net/lo").mkdir()
    view = HostView(sysfs_root=root, runner=ReplayRunner(), is_root=False)
    report = validate(view, Policy())
    (r,) = report.results
    assert r.status is Status.FAIL and r.check == "device"
    assert "no RDMA device" in r.message
    assert r.fix is not None and "probe rxe up --netdev eth0" in r.fix
    assert report.exit_code == 1


def test_unknown_device_and_netdev(tmp_path: Path) -> None:
    view = host(tmp_path, "mlx5", ["mlx5"])
    report = validate(view, Policy(), devices=["mlx5_9"])
    (r,) = report.results
    assert r.status is Status.FAIL and "no RDMA device 'mlx5_9' (present: mlx5_0)" in r.message
    report = validate(view, Policy(), netdev="eth7")
    (r,) = report.results
    assert r.status is Status.FAIL and "no RDMA device on netdev eth7" in r.message
    report = validate(view, Policy(), netdev="ens1f0np0", window=0)
    assert [r.device for r in report.results] == ["mlx5_0"] * len(ALL_CHECKS)


def test_infiniband_port_is_not_a_roce_port(tmp_path: Path) -> None:
    report = validate(host(tmp_path, "no_hw_counters", ["mlx5"]), Policy())
    (r,) = report.results
    assert r.status is Status.SKIP and "link layer is InfiniBand" in r.message
    assert report.exit_code == 0


def test_port_down(tmp_path: Path) -> None:
    view = host(tmp_path, "mlx5", ["mlx5"])
    pdir = view.sysfs_root / "class/infiniband/mlx5_0/ports/1"
    (pdir / "state").write_text("1: DOWN\n")
    (pdir / "phys_state").write_text("3: Disabled\n")
    report = validate(view, Policy(), window=0)
    (dev,) = by_check(report, "device")
    assert dev.status is Status.FAIL and "DOWN / Disabled" in dev.message
    assert dev.fix is not None and "ip link set dev ens1f0np0 up" in dev.fix


def test_pfc_on_extra_priority_warns(tmp_path: Path) -> None:
    extra = capture(
        tmp_path, {"dcb pfc show dev ens1f0np0": "prio-pfc 0:off 1:off 2:off 3:on 4:on 5:off\n"}
    )
    view = host(tmp_path, "mlx5", ["mlx5", extra])
    dev = view.device("mlx5_0")
    r = check_pfc(view, Target(dev, dev.ports[0], "ens1f0np0"), Policy())
    assert r.status is Status.WARN and "also on 4" in r.message


def test_policy_priority_changes_the_verdict(tmp_path: Path) -> None:
    # the same good host judged by a policy that wants RoCE on priority 4
    report = validate(host(tmp_path, "mlx5", ["mlx5"]), Policy(priority=4, dscp=34), window=0)
    assert (
        not_passing(report)
        == {
            "pfc": Status.FAIL,
            "ecn_rp": Status.FAIL,
            "ecn_np": Status.FAIL,
            "rdma_cm": Status.FAIL,
            "ets": Status.FAIL,  # TC 4 gets 0% in the good host's ETS table
            "buffers": Status.WARN,  # priority 4 shares buffer 0 with the lossy priorities
            "dcbx": Status.FAIL,
            "pause": Status.SKIP,
            "discards": Status.SKIP,
            "rdma_errors": Status.SKIP,
        }
        | NO_GPU
    )


def test_dscp_mapped_to_wrong_priority(tmp_path: Path) -> None:
    extra = capture(tmp_path, {"dcb app show dev ens2f0np0": "dscp-prio AF31:0 CS6:6 \n"})
    view = host(tmp_path, "bnxt_re", ["bnxt_re", extra])
    report = validate(view, Policy(), window=0)
    (trust,) = by_check(report, "trust")
    assert trust.status is Status.FAIL
    assert "DSCP 26 maps to priority 0, not the PFC priority 3" in trust.message
    assert trust.fix is not None and "dcb app replace dev ens2f0np0 dscp-prio 26:3" in trust.fix


def test_ecn_cnp_settings_warn(tmp_path: Path) -> None:
    view = host(tmp_path, "mlx5", ["mlx5"])
    (view.sysfs_root / "class/net/ens1f0np0/ecn/roce_np/cnp_dscp").write_text("46\n")
    report = validate(view, Policy(), window=0)
    (ecn,) = by_check(report, "cnp")
    assert ecn.status is Status.WARN and "CNP DSCP 46 (policy 48)" in ecn.message
    assert ecn.fix is not None and "echo 48 >" in ecn.fix


@pytest.mark.parametrize(
    ("setup", "status", "message"),
    [
        ("v1", Status.FAIL, "connects with IB/RoCE v1"),
        ("tos0", Status.FAIL, "default ToS 0 (DSCP 0)"),  # DSCP 0 is a lossy priority
        ("no_dev_dir", Status.FAIL, "default ToS 0"),
        ("no_rdma_cm", Status.SKIP, "rdma_cm is not loaded"),
    ],
)
def test_rdma_cm(tmp_path: Path, setup: str, status: Status, message: str) -> None:
    view = host(tmp_path, "mlx5", ["mlx5"])
    cm = view.sysfs_root / "kernel/config/rdma_cm"
    port_dir = cm / "mlx5_0/ports/1"
    if setup == "v1":
        (port_dir / "default_roce_mode").write_text("IB/RoCE v1\n")
    elif setup == "tos0":
        (port_dir / "default_roce_tos").write_text("0\n")
    elif setup == "no_dev_dir":
        shutil.rmtree(cm / "mlx5_0")
    elif setup == "no_rdma_cm":
        shutil.rmtree(cm)
        (view.sysfs_root / "kernel/config/other").mkdir()
    dev = view.device("mlx5_0")
    r = check_rdma_cm(view, Target(dev, dev.ports[0], "ens1f0np0"), Policy())
    assert r.status is status and message in r.message
    assert r.fix is not None
    if setup == "no_dev_dir":
        assert "mkdir" in r.fix and "kernel defaults apply" in r.evidence[0]


@pytest.mark.parametrize(
    ("netdev_mtu", "ib_mtu"),
    [
        (1500, 1024),
        (4200, 4096),
        (4191, 2048),
        (4192, 4096),
        (9000, 4096),
        (2200, 2048),
        (300, 256),
    ],
)
def test_iboe_mtu(netdev_mtu: int, ib_mtu: int) -> None:
    assert iboe_mtu(netdev_mtu) == ib_mtu


def _target(tmp_path: Path) -> Target:
    view = host(tmp_path, "mlx5", ["mlx5"])
    dev = view.device("mlx5_0")
    return Target(dev, dev.ports[0], "ens1f0np0")


@pytest.mark.parametrize(
    ("hw0", "hw1", "status", "text"),
    [
        # mlx5 Q counters are 32-bit: a wrap is an increase, not a reset
        (
            {"out_of_buffer": 2**32 - 5},
            {"out_of_buffer": 15},
            Status.WARN,
            "out_of_buffer +20 (10.0/s)",
        ),
        (
            {"local_ack_timeout_err": 3},
            {"local_ack_timeout_err": 9},
            Status.WARN,
            "transport timeouts",
        ),
        ({"roce_adp_retrans": 41}, {"roce_adp_retrans": 45}, Status.WARN, "retransmissions"),
        ({"rx_roce_discards": 0}, {"rx_roce_discards": 2}, Status.WARN, "discards"),
        ({"np_cnp_sent": 1}, {"np_cnp_sent": 900}, Status.PASS, "no pause storm"),
    ],
)
def test_evaluate_counters(
    tmp_path: Path, hw0: dict[str, int], hw1: dict[str, int], status: Status, text: str
) -> None:
    t = _target(tmp_path)
    results = evaluate_counters(
        t, Policy(), CounterSample(0.0, hw0, {}), CounterSample(2.0, hw1, {}), 2.0
    )
    assert [r.check for r in results] == ["pause", "discards", "rdma_errors"]
    worst = max(results, key=lambda r: r.status.rank)
    assert worst.status is status and text in " ".join(r.message for r in results)
    assert sum(r.status is not Status.PASS for r in results) == (status is not Status.PASS)


def test_evaluate_counters_flags_a_reset(tmp_path: Path) -> None:
    t = _target(tmp_path)
    r, *_ = evaluate_counters(
        t,
        Policy(),
        CounterSample(0.0, {"np_cnp_sent": 5_000_000}, None),
        CounterSample(2.0, {"np_cnp_sent": 10}, None, note="ethtool -S: not installed"),
        2.0,
    )
    assert r.status is Status.PASS
    assert any("reset during the window" in e and "np_cnp_sent" in e for e in r.evidence)
    assert any("not installed" in e for e in r.evidence)


def test_evaluate_counters_nothing_to_sample(tmp_path: Path) -> None:
    t = _target(tmp_path)
    results = evaluate_counters(
        t, Policy(), CounterSample(0.0, {}, None), CounterSample(1.0, {}, None), 1.0
    )
    assert [r.status for r in results] == [Status.SKIP] * 3


def test_thresholds_come_from_the_policy(tmp_path: Path) -> None:
    t = _target(tmp_path)
    s0 = CounterSample(0.0, {}, {"tx_prio3_pause_duration": 0})
    s1 = CounterSample(1.0, {}, {"tx_prio3_pause_duration": 50_000})  # 5% of one second
    assert evaluate_counters(t, Policy(), s0, s1, 1.0)[0].status is Status.WARN
    lenient = Policy().with_overrides(thresholds=Thresholds(pause_duration_warn_pct=6.0))
    assert evaluate_counters(t, lenient, s0, s1, 1.0)[0].status is Status.PASS


def test_window_zero_skips_counters(tmp_path: Path) -> None:
    report = validate(host(tmp_path, "mlx5", ["mlx5"]), Policy(), window=0)
    for check in ("pause", "discards", "rdma_errors"):
        (c,) = by_check(report, check)
        assert c.status is Status.SKIP and "--window 0" in c.message


def test_report_json_shape(tmp_path: Path) -> None:
    report = validate(host(tmp_path, "mlx5", ["mlx5", "pfc_wrong_priority"]), Policy(), window=0)
    d = report.to_dict()
    assert d["ok"] is False
    assert d["summary"] == {"pass": 16, "skip": 4, "warn": 0, "fail": 1}
    assert d["policy"]["priority"] == 3
    pfc = next(r for r in d["results"] if r["check"] == "pfc")
    assert pfc["status"] == "FAIL" and pfc["device"] == "mlx5_0" and pfc["port"] == 1
    assert isinstance(pfc["evidence"], list)


def test_missing_configfs_as_root_is_not_a_privilege_skip(tmp_path: Path) -> None:
    view = host(tmp_path, "irdma", ["irdma"])
    view.is_root = True
    report = validate(view, Policy(), window=0)
    (cm,) = by_check(report, "rdma_cm")
    assert cm.status is Status.SKIP and not cm.needs_root
    assert "needed root" not in report.summary()


class _Tools:
    """A host whose tools answer from a table: argv -> (status, stdout)."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[str, str]]) -> None:
        self.answers = answers

    def run(self, *argv: str) -> ToolRun:
        status, out = self.answers.get(argv, ("missing", ""))
        return ToolRun(argv, status, out)


def _number(text: str) -> int | None:
    if text == "nothing":
        return None
    if not text.isdigit():
        raise ParseError(f"not a number: {text!r}")
    return int(text)


def test_the_first_tool_with_an_answer_wins_and_the_others_are_evidence() -> None:
    from fabricprobe.probes.roce.checks import first_answer

    view: Any = _Tools(
        {
            ("a",): ("ok", "junk"),
            ("b",): ("ok", "nothing"),
            ("c",): ("ok", "7"),
            ("d",): ("ok", "8"),
        }
    )
    sources = [((name,), _number) for name in ("x", "a", "b", "c", "d")]
    value, ev, runs = first_answer(view, sources)
    assert value == 7 and [r.command for r in runs] == ["x", "a", "b", "c"]
    assert ev == ["a: not a number: 'junk'"]  # a tool that says nothing leaves no evidence
    value, ev, runs = first_answer(view, sources[:3])
    assert value is None and len(runs) == 3 and runs[0].status == "missing"
