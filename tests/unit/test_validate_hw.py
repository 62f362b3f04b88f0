"""The hardware checks (ETS, global pause, buffers, DCBX/APP, link, FEC, PCIe, ACS/ATS,
firmware), table-driven over the mlx5 and bnxt_re fixtures with one input changed per
row, and their parsers over good and bad text."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.roce import Policy, Status, validate
from fabricprobe.probes.roce import hwtools as hw
from fabricprobe.probes.roce.checks import Target
from fabricprobe.probes.roce.hwchecks import check_acs
from fabricprobe.probes.roce.tools import MAX_TEXT
from tests.unit.test_validate_checks import TOOLS, by_check, capture, host

MLX = "ens1f0np0"
BNXT = "ens2f0np0"
GOOD = {"mlx5": (MLX, "mlx5_0"), "bnxt_re": (BNXT, "bnxt_re0")}


def _write(rel: str, text: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        (root / rel).write_text(text)

    return edit


ETS_ZERO = "tc-bw 0:100 1:0 2:0 3:0 4:0 5:0 6:0 7:0\ntc-tsa all:ets\n"
# (id, driver, {command template: output}, sysfs edit, check, status, in message, in fix)
ROWS: list[
    tuple[str, str, dict[str, str], Callable[[Path], None] | None, str, Status, str, str]
] = [
    ("ets-good-mlx5", "mlx5", {}, None, "ets", Status.PASS, "TC 3 with 50%", ""),
    ("ets-good-bnxt", "bnxt_re", {}, None, "ets", Status.PASS, "TC 1 with 50%", ""),
    (
        "ets-roce-0pct",
        "mlx5",
        {
            "dcb ets show dev {nd}": "tc-bw 0:100 1:0 2:0 3:0 4:0 5:0 6:0 7:0\n"
            "tc-tsa 0:ets 1:ets 2:ets 3:ets 4:ets 5:ets 6:strict 7:ets\n"
            "prio-tc 0:0 1:1 2:2 3:3 4:4 5:5 6:6 7:7\n"
        },
        None,
        "ets",
        Status.FAIL,
        "RoCE TC 3 gets 0% under ETS",
        "dcb ets set dev ens1f0np0",
    ),
    (
        "ets-roce-small-share-bnxt",
        "bnxt_re",
        {
            "dcb ets show dev {nd}": "tc-bw 0:80 1:20 2:0 3:0 4:0 5:0 6:0 7:0\n"
            "tc-tsa 0:ets 1:ets 2:strict 3:strict 4:strict 5:strict 6:strict 7:strict\n"
            "prio-tc 0:0 1:0 2:0 3:1 4:0 5:0 6:2 7:0\n"
        },
        None,
        "ets",
        Status.WARN,
        "gets 20% under ETS (policy 50%)",
        "tc-bw",
    ),
    (
        "ets-cnp-starved",
        "mlx5",
        {
            "dcb ets show dev {nd}": "tc-bw 0:50 1:0 2:0 3:50 4:0 5:0 6:0 7:0\n"
            "tc-tsa 0:ets 1:ets 2:ets 3:ets 4:ets 5:ets 6:ets 7:ets\n"
            "prio-tc 0:0 1:1 2:2 3:3 4:4 5:5 6:6 7:7\n"
        },
        None,
        "ets",
        Status.WARN,
        "CNP TC 6 gets 0%",
        "6:strict",
    ),
    (
        "ets-garbage",
        "mlx5",
        {"dcb ets show dev {nd}": "tc-bw 9:50\n", "mlnx_qos -i {nd}": "x"},
        None,
        "ets",
        Status.SKIP,
        "not readable",
        "",
    ),
    ("pause-good-bnxt", "bnxt_re", {}, None, "global_pause", Status.PASS, "global pause off", ""),
    (
        "pause-on",
        "mlx5",
        {"ethtool -a {nd}": "Pause parameters for x:\nAutonegotiate:\ton\nRX:\t\ton\nTX:\t\ton\n"},
        None,
        "global_pause",
        Status.FAIL,
        "global pause RX and TX on",
        "ethtool -A ens1f0np0 autoneg off rx off tx off",
    ),
    (
        "pause-bad",
        "mlx5",
        {"ethtool -a {nd}": "RX: maybe\nTX: off\n"},
        None,
        "global_pause",
        Status.SKIP,
        "not readable",
        "",
    ),
    ("buffers-good-mlx5", "mlx5", {}, None, "buffers", Status.PASS, "buffer 1 to itself", ""),
    (
        "buffers-unsupported-bnxt",
        "bnxt_re",
        {},
        None,
        "buffers",
        Status.SKIP,
        "does not support it",
        "",
    ),
    (
        "buffers-zero",
        "mlx5",
        {
            "dcb buffer show dev {nd}": "prio-buffer 0:0 1:0 2:0 3:1 4:0 5:0 6:0 7:0\n"
            "buffer-size 0:256Kb 1:0b 2:0b 3:0b 4:0b 5:0b 6:0b 7:0b\n"
        },
        None,
        "buffers",
        Status.FAIL,
        "buffer 1, which has 0 bytes",
        "prio-buffer all:0 3:1",
    ),
    (
        "buffers-shared",
        "mlx5",
        {
            "dcb buffer show dev {nd}": "prio-buffer 0:0 1:0 2:0 3:0 4:0 5:0 6:0 7:0\n"
            "buffer-size 0:256Kb 1:0b 2:0b 3:0b 4:0b 5:0b 6:0b 7:0b\n"
        },
        None,
        "buffers",
        Status.WARN,
        "shares buffer 0 with priorities 0, 1, 2, 4, 5, 6, 7",
        "--prio2buffer 0,0,0,1,0,0,0,0",
    ),
    ("dcbx-good-mlx5", "mlx5", {}, None, "dcbx", Status.PASS, "UDP 4791 to priority 3", ""),
    ("dcbx-good-bnxt", "bnxt_re", {}, None, "dcbx", Status.PASS, "DCBX by firmware", ""),
    (
        "dcbx-no-app",
        "bnxt_re",
        {"dcb app show dev {nd}": "dscp-prio AF31:3 CS6:6\n"},
        None,
        "dcbx",
        Status.WARN,
        "no APP entry maps UDP 4791",
        "dcb app add dev ens2f0np0 dgram-port-prio 4791:3",
    ),
    (
        "dcbx-app-wrong-prio",
        "mlx5",
        {"dcb app show dev {nd}": "dscp-prio AF31:3 CS6:6\ndgram-port-prio 4791:0\n"},
        None,
        "dcbx",
        Status.FAIL,
        "maps UDP 4791 to priority [0], not 3",
        "dcb app del dev ens1f0np0 dgram-port-prio 4791:0",
    ),
    ("link-good-mlx5", "mlx5", {}, None, "link", Status.PASS, "100 Gb/s, 4 lanes", ""),
    ("link-good-bnxt", "bnxt_re", {}, None, "link", Status.PASS, "100 Gb/s, 4 lanes", ""),
    (
        "link-slow",
        "bnxt_re",
        {
            "ethtool {nd}": (TOOLS / "bnxt_re/ethtool.txt")
            .read_text()
            .replace("100000Mb/s", "25000Mb/s")
            .replace("Lanes: 4", "Lanes: 1")
        },
        None,
        "link",
        Status.WARN,
        "link at 25 Gb/s, the port's fastest mode is 100 Gb/s",
        "ethtool ens2f0np0",
    ),
    (
        "link-down",
        "mlx5",
        {"ethtool {nd}": "Settings for x:\n\tSpeed: Unknown!\n\tLink detected: no\n"},
        None,
        "link",
        Status.FAIL,
        "the link is down",
        "ip link set dev ens1f0np0 up",
    ),
    (
        "link-bad",
        "mlx5",
        {"ethtool {nd}": "Settings for x:\n\tSpeed: fast\n"},
        None,
        "link",
        Status.SKIP,
        "not readable",
        "",
    ),
    ("fec-good-mlx5", "mlx5", {}, None, "fec", Status.PASS, "raw BER 2.0e-12", ""),
    ("fec-good-bnxt", "bnxt_re", {}, None, "fec", Status.PASS, "FEC RS", ""),
    (
        "fec-off-at-100g",
        "bnxt_re",
        {"ethtool -I --show-fec {nd}": "FEC parameters for x:\nActive FEC encoding: Off\n"},
        None,
        "fec",
        Status.FAIL,
        "FEC is Off at 100 Gb/s",
        "ethtool --set-fec ens2f0np0 encoding rs",
    ),
    (
        "fec-uncorrectable",
        "mlx5",
        {
            "ethtool -I --show-fec {nd}": "Active FEC encoding: RS\nStatistics:\n"
            "  corrected_blocks: 99\n  uncorrectable_blocks: 12\n"
        },
        None,
        "fec",
        Status.WARN,
        "12 uncorrectable FEC blocks",
        "transceiver",
    ),
    (
        "fec-high-ber",
        "mlx5",
        {
            "mlxlink -d {dev} -c": "FEC : Standard RS-FEC - RS(528,514)\n"
            "Effective Physical BER : 3E-10\nRaw Physical BER : 4E-5\n"
        },
        None,
        "fec",
        Status.FAIL,
        "effective (post-FEC) BER 3.0e-10",
        "replace the cable",
    ),
    ("pcie-good-mlx5", "mlx5", {}, None, "pcie", Status.PASS, "PCIe x16 at 16 GT/s", ""),
    (
        "pcie-narrow-bnxt",
        "bnxt_re",
        {},
        _write("class/infiniband/bnxt_re0/device/current_link_width", "8\n"),
        "pcie",
        Status.FAIL,
        "PCIe link x8 of x16",
        "reseat",
    ),
    (
        "pcie-slow-mlx5",
        "mlx5",
        {},
        _write("class/infiniband/mlx5_0/device/current_link_speed", "8.0 GT/s PCIe\n"),
        "pcie",
        Status.WARN,
        "8 GT/s of 16 GT/s",
        "BIOS",
    ),
    (
        "pcie-garbage",
        "mlx5",
        {},
        _write("class/infiniband/mlx5_0/device/max_link_width", "wide\n"),
        "pcie",
        Status.SKIP,
        "unreadable",
        "",
    ),
    ("acs-no-gpu", "mlx5", {}, None, "acs", Status.SKIP, "no GPU on this host", ""),
    ("fw-good-mlx5", "mlx5", {}, None, "firmware", Status.PASS, "firmware 28.39.1002", ""),
    ("fw-good-bnxt", "bnxt_re", {}, None, "firmware", Status.PASS, "driver bnxt_en", ""),
]


@pytest.mark.parametrize(
    ("name", "driver", "outputs", "edit", "check", "status", "message", "fix"),
    ROWS,
    ids=[r[0] for r in ROWS],
)
def test_hw_check(
    tmp_path: Path,
    name: str,
    driver: str,
    outputs: dict[str, str],
    edit: Callable[[Path], None] | None,
    check: str,
    status: Status,
    message: str,
    fix: str,
) -> None:
    nd, dev = GOOD[driver]
    tools: list[str | Path] = [driver]
    if outputs:
        tools.append(capture(tmp_path, {k.format(nd=nd, dev=dev): v for k, v in outputs.items()}))
    view = host(tmp_path, driver, tools)
    if edit is not None:
        edit(view.sysfs_root)
    report = validate(view, Policy(), window=0)
    (r,) = by_check(report, check)
    assert r.status is status, (r.message, r.evidence)
    assert message in r.message
    assert r.evidence, "every verdict shows what it read"
    if status in (Status.WARN, Status.FAIL):
        assert r.fix is not None and fix in r.fix


@pytest.mark.parametrize(
    ("policy", "check", "status", "message"),
    [
        (Policy(link_speed_gbps=200), "link", Status.FAIL, "policy is 200 Gb/s"),
        (Policy(link_lanes=2), "link", Status.FAIL, "4 lanes, policy expects 2"),
        (Policy(firmware_min="28.40.1000"), "firmware", Status.FAIL, "older than"),
        (Policy(firmware_min="28.39.1002"), "firmware", Status.PASS, "policy minimum"),
        (Policy(dcbx="firmware"), "dcbx", Status.WARN, "DCBX run by host, policy wants firmware"),
        (Policy(roce_bw_min_pct=60), "ets", Status.WARN, "50% under ETS (policy 60%)"),
    ],
)
def test_policy_expectations(
    tmp_path: Path, policy: Policy, check: str, status: Status, message: str
) -> None:
    report = validate(host(tmp_path, "mlx5", ["mlx5"]), policy.validate(), window=0)
    (r,) = by_check(report, check)
    assert r.status is status and message in r.message


def test_tos_0_is_only_a_warning_without_a_lossless_policy(tmp_path: Path) -> None:
    view = host(tmp_path, "mlx5", ["mlx5"])
    (view.sysfs_root / "kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos").write_text("0\n")
    for lossless, status in ((True, Status.FAIL), (False, Status.WARN)):
        (r,) = by_check(validate(view, Policy(lossless=lossless), window=0), "rdma_cm")
        assert r.status is status
        assert r.fix is not None and "echo 106 >" in r.fix
        assert any("default_roce_tos: 0" in e for e in r.evidence)


# ------------------------------------------------------------------ ACS over a PCI tree


def _pci_tree(root: Path, gpu_under_nic_switch: bool) -> None:
    """A root port 00:01.0 > switch upstream 01:00.0 > downstream 02:00.0 > NIC 03:00.0,
    and a GPU either behind the same switch (02:01.0 > 04:00.0) or on root port 00:02.0."""
    top = root / "devices/pci0000:00"
    nic = top / "0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0"
    if gpu_under_nic_switch:
        gpu = top / "0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0"
    else:
        gpu = top / "0000:00:02.0/0000:05:00.0"
    for d in (nic, gpu):
        d.mkdir(parents=True)
    (gpu / "class").write_text("0x030200\n")
    (gpu / "vendor").write_text("0x10de\n")
    (nic / "class").write_text("0x020000\n")
    (nic / "vendor").write_text("0x15b3\n")
    bus = root / "bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    for d in (nic, gpu):
        os.symlink(os.path.relpath(d, bus), bus / d.name)
    dev_link = root / "class/infiniband/mlx5_0/device"
    for f in dev_link.iterdir():  # the fixture's device dir becomes the NIC's PCI dir
        if f.is_symlink():
            os.symlink(os.readlink(f), nic / f.name)
        else:
            (nic / f.name).write_text(f.read_text())
    shutil.rmtree(dev_link)
    os.symlink(os.path.relpath(nic, dev_link.parent), dev_link)


LSPCI = (
    "{bdf} PCI bridge: PLX Technology, Inc. PEX 8747\n"
    "\tCapabilities: [148 v1] Access Control Services\n"
    "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- "
    "DirectTrans+\n"
    "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir{r} CmpltRedir{r} UpstreamFwd+ EgressCtrl- "
    "DirectTrans{d}\n"
)
NIC_LSPCI = (
    "{bdf} Ethernet controller: Mellanox Technologies MT2892 Family [ConnectX-6 Dx]\n"
    "\tCapabilities: [480 v1] Address Translation Service (ATS)\n"
    "\t\tATSCap:\tInvalidate Queue Depth: 00\n"
    "\t\tATSCtl:\tEnable{a}, Smallest Translation Unit: 00\n"
)


@pytest.mark.parametrize(
    ("shared", "redirect", "ats", "direct", "status", "message"),
    [
        (True, "+", "-", "-", Status.WARN, "ACS redirects P2P at"),
        (True, "-", "-", "-", Status.PASS, "stays below the PCIe switch"),
        (True, "+", "+", "+", Status.PASS, "stays below the PCIe switch"),  # ATS goes direct
        (False, "+", "-", "-", Status.PASS, "through the root complex"),
    ],
)
def test_acs_on_the_nic_gpu_path(
    tmp_path: Path, shared: bool, redirect: str, ats: str, direct: str, status: Status, message: str
) -> None:
    bridges = ["0000:01:00.0", "0000:02:00.0", "0000:02:01.0"]
    outputs: dict[str, Any] = {
        f"lspci -vvv -s {b}": LSPCI.format(bdf=b[5:], r=redirect, d=direct) for b in bridges
    }
    outputs["lspci -vvv -s 0000:03:00.0"] = NIC_LSPCI.format(bdf="03:00.0", a=ats)
    view = host(tmp_path, "mlx5", ["mlx5", capture(tmp_path, outputs)])
    _pci_tree(view.sysfs_root, shared)
    dev = view.device("mlx5_0")
    r = check_acs(view, Target(dev, dev.ports[0], MLX), Policy())
    assert r.status is status and message in r.message, (r.message, r.evidence)
    if status is Status.WARN:
        assert r.fix is not None and "setpci -s 0000:02:00.0 ECAP_ACS+0x6.w=0000" in r.fix


def test_acs_needs_root_for_capabilities(tmp_path: Path) -> None:
    denied = "03:00.0 Ethernet controller: Mellanox\n\tCapabilities: <access denied>\n"
    outputs = {
        f"lspci -vvv -s {b}": denied
        for b in ("0000:01:00.0", "0000:02:00.0", "0000:02:01.0", "0000:03:00.0")
    }
    view = host(tmp_path, "mlx5", ["mlx5", capture(tmp_path, outputs)])
    _pci_tree(view.sysfs_root, True)
    dev = view.device("mlx5_0")
    r = check_acs(view, Target(dev, dev.ports[0], MLX), Policy())
    assert r.status is Status.SKIP and r.needs_root


# ------------------------------------------------------------------ parsers, bad input too

PARSES: list[tuple[Callable[[str], object], str, Callable[[Any], bool]]] = [
    (
        hw.parse_dcb_ets,
        "prio-tc 0:0 3:3\ntc-tsa 0:ets 3:strict\ntc-bw 0:100 3:0\n",
        lambda e: e.tsa[3] == "strict" and e.bw[0] == 100,
    ),
    (
        hw.parse_dcb_buffer,
        "prio-buffer 3:1\nbuffer-size 0:2K 1:1.5Kb\ntotal-size 1M\n",
        lambda b: b.size == {0: 2048, 1: 1536} and b.total == 1 << 20,
    ),
    (hw.parse_dcb_dcbx, "lld-managed ieee\n", lambda d: d.managed_by == "firmware"),
    (
        hw.parse_mlnx_qos_dcbx,
        "DCBX mode: Firmware controlled\n",
        lambda d: d.managed_by == "firmware",
    ),
    (hw.parse_dcb_app_ports, "dgram-port-prio 4791:3 4791:5\n", lambda a: a[4791] == (3, 5)),
    (
        hw.parse_lldptool_app,
        "APP:\n\tapp=3,3,4791\n\tapp=4,2,3260\n",
        lambda a: dict(a) == {4791: (3,)},
    ),
    (hw.parse_ethtool_pause, "RX: on\nTX: off\n", lambda p: p.rx and not p.tx),
    (
        hw.parse_ethtool_driver,
        "driver: ice\nfirmware-version: 4.40\n",
        lambda d: d.firmware == "4.40",
    ),
    (hw.parse_ethtool_fec, "Active FEC encoding: None\n", lambda f: f.active == "None"),
    (hw.parse_mlxlink, "Raw Physical BER : 1.5E-8\n", lambda f: abs(f.raw_ber - 1.5e-8) < 1e-20),
    (hw.parse_link_speed, "32.0 GT/s PCIe\n", lambda v: v == 32.0),
    (hw.parse_link_width, "4\n", lambda v: v == 4),
    (hw.parse_lspci_caps, "3b:00.0 Eth\n\t\tATSCtl:\tEnable+, Smallest\n", lambda c: c.ats_enabled),
]


@pytest.mark.parametrize(("parse", "text", "ok"), PARSES, ids=[p[0].__name__ for p in PARSES])
def test_parsers_read_their_format(
    parse: Callable[[str], object], text: str, ok: Callable[[Any], bool]
) -> None:
    assert ok(parse(text))


BAD = [
    (hw.parse_dcb_ets, "prio-tc 0:9\ntc-tsa 0:ets\n"),
    (hw.parse_dcb_ets, "tc-bw 0:500\n"),
    (hw.parse_dcb_ets, "nothing here"),
    (hw.parse_mlnx_qos_ets, "tc: 3 ratelimit: unlimited, tsa: ets, bw: 900%\n"),
    (hw.parse_dcb_buffer, "buffer-size 0:lots\n"),
    (hw.parse_dcb_buffer, "prio-buffer 0:8\n"),
    (hw.parse_mlnx_qos_buffers, "Receive buffer size (bytes): 1,2,3,4,5,6,7,8,9,\n"),
    (hw.parse_dcb_dcbx, "bogus\n"),
    (hw.parse_dcb_app_ports, "dgram-port-prio 99999:3\n"),
    (hw.parse_lldptool_app, "app=9,3,4791\n"),
    (hw.parse_ethtool_pause, "RX: sometimes\nTX: off\n"),
    (hw.parse_ethtool_link, "Speed: 100000Mb/s\n"),
    (hw.parse_ethtool_driver, "version: 1\n"),
    (hw.parse_ethtool_fec, "FEC parameters for x:\n"),
    (hw.parse_mlxlink, "Raw Physical BER : lots\n"),
    (hw.parse_link_speed, "fast\n"),
    (hw.parse_link_width, "-1\n"),
    (hw.parse_lspci_caps, "ACSCtl: ReqRedir+\n"),
    (hw.parse_dcb_ets, "x" * (MAX_TEXT + 1)),
]


@pytest.mark.parametrize(
    ("parse", "text"), BAD, ids=[f"{p.__name__}-{i}" for i, (p, _) in enumerate(BAD)]
)
def test_parsers_refuse_bad_input(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises(ParseError):
        parse(text)
