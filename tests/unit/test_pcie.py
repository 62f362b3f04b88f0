"""The PCI topology reader: GPUs, each NIC's PCI function, distances in nvidia-smi topo's
terms and each NIC's GPU, over the fixture trees of an 8-GPU / 8-NIC host and a laptop,
and over trees that try to lead the reader out of its root."""

from __future__ import annotations

import filecmp
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricprobe.core.errors import ParseError
from fabricprobe.probes import pcie
from fabricprobe.probes.pcie import Gpu, Link, PciFunction, link_between
from tests.support import pcitree

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sys"
GPU8, LAPTOP = FIXTURES / "gpu8", FIXTURES / "laptop"


def test_gpu8_each_nic_serves_the_gpu_of_its_rail() -> None:
    got = pcie.read_nic_gpus(GPU8)
    assert {d: (a.gpu.name, a.link) for d, a in got.items()} == {
        **{f"mlx5_{i}": (f"GPU{i}", Link.PIX) for i in range(8)},
        "mlx5_8": ("GPU0", Link.NODE),  # the frontend NIC: socket 0, under no switch of a GPU
    }
    assert got["mlx5_0"].nic == "0000:19:00.0" and got["mlx5_0"].gpu.function.address == (
        "0000:18:00.0"
    )
    assert {g.vendor for g in pcie.read_gpus(GPU8)} == {"NVIDIA"}


def test_gpu8_distances_as_nvidia_smi_topo_prints_them() -> None:
    nics = pcie.read_nic_functions(GPU8)
    gpus = {g.name: g.function for g in pcie.read_gpus(GPU8)}
    row = {name: link_between(nics["mlx5_0"], fn).name for name, fn in gpus.items()}
    assert row == {
        "GPU0": "PIX",
        "GPU1": "PIX",  # the other GPU of the switch: one bridge too
        "GPU2": "NODE",
        "GPU3": "NODE",
        "GPU4": "SYS",
        "GPU5": "SYS",
        "GPU6": "SYS",
        "GPU7": "SYS",
    }
    assert link_between(nics["mlx5_4"], gpus["GPU0"]) is Link.SYS


def test_a_laptop_has_no_gpu_and_no_attribution() -> None:
    assert pcie.read_gpus(LAPTOP) == []  # its GPU is Intel's, in the CPU
    assert pcie.read_nic_functions(LAPTOP) == {}  # rxe0 is software: no PCI function
    assert pcie.read_nic_gpus(LAPTOP) == {}
    assert pcie.single_numa_node(LAPTOP)


def test_a_tree_without_pci_at_all_gives_nothing(tmp_path: Path) -> None:
    assert pcie.read_gpus(tmp_path) == [] and pcie.read_nic_gpus(tmp_path) == {}
    assert pcie.read_nic_gpus(FIXTURES / "mlx5") == {}  # a NIC and no bus/pci tree


def test_the_checked_in_trees_are_the_builders_output(tmp_path: Path) -> None:
    for name, build in pcitree.BUILDERS.items():
        build(tmp_path / name)
        _same_tree(tmp_path / name, FIXTURES / name)


def _same_tree(a: Path, b: Path) -> None:
    cmp = filecmp.dircmp(a, b)
    assert not (cmp.left_only or cmp.right_only or cmp.diff_files), (
        f"{b} differs from tests/support/pcitree.py: run python -m tests.support.pcitree"
    )
    for entry in cmp.common:
        x, y = a / entry, b / entry
        if x.is_symlink() or y.is_symlink():
            assert os.readlink(x) == os.readlink(y), y
        elif x.is_dir():
            _same_tree(x, y)


# ------------------------------------------------------------------ distances

HB0, HB1 = "pci0000:00", "pci0000:80"


def fn(addr: str, hb: str, *bridges: str, numa: int | None = 0) -> PciFunction:
    return PciFunction(addr, hb, tuple(bridges), numa)


SWITCH = ("0000:00:01.0", "0000:01:00.0")  # a root port and a switch's upstream port


@pytest.mark.parametrize(
    ("a", "b", "single", "link"),
    [
        (fn("n", HB0, *SWITCH, "0000:02:00.0"), fn("g", HB0, *SWITCH, "0000:02:01.0"), 0, "PIX"),
        (  # one side behind a second switch under the first
            fn("n", HB0, *SWITCH, "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"),
            fn("g", HB0, *SWITCH, "0000:02:01.0"),
            0,
            "PXB",
        ),
        (fn("n", HB0, "0000:00:01.0"), fn("g", HB0, "0000:00:02.0"), 0, "PHB"),
        (fn("n", HB0), fn("g", HB1, numa=0), 0, "NODE"),
        (fn("n", HB0), fn("g", HB1, numa=1), 0, "SYS"),
        (fn("n", HB0, numa=None), fn("g", HB1, numa=None), 0, "SYS"),  # unknown: not near
        (fn("n", HB0, numa=None), fn("g", HB1, numa=None), 1, "NODE"),  # one node in all
        (fn("n", HB0, numa=0), fn("g", HB1, numa=None), 1, "SYS"),
    ],
)
def test_link_between(a: PciFunction, b: PciFunction, single: int, link: str) -> None:
    assert link_between(a, b, bool(single)).name == link
    assert link_between(b, a, bool(single)).name == link  # symmetric


def test_ties_go_round_the_nearest_gpus_in_address_order() -> None:
    """Four NICs under one switch with two GPUs: each NIC its own GPU in turn, whatever
    order the NICs come in."""
    down = [f"0000:02:{i:02x}.0" for i in range(6)]
    gpus = [Gpu(i, "NVIDIA", fn(f"0000:1{i}:00.0", HB0, *SWITCH, down[i])) for i in range(2)]
    nics = {f"mlx5_{i}": fn(f"0000:2{i}:00.0", HB0, *SWITCH, down[2 + i]) for i in range(4)}
    want = {"mlx5_0": 0, "mlx5_1": 1, "mlx5_2": 0, "mlx5_3": 1}
    for order in (list(nics), list(reversed(nics))):
        got = pcie.attribute({k: nics[k] for k in order}, reversed(gpus))
        assert {d: a.gpu.index for d, a in got.items()} == want
        assert list(got) == sorted(got)
    assert pcie.attribute(nics, []) == {}


# ------------------------------------------------------------------ parsers


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0000:1c:00.0\n", "0000:1c:00.0"),
        ("0000:1C:00.7", "0000:1c:00.7"),
        ("10000:e0:1f.0", "10000:e0:1f.0"),  # a VMD domain
        ("0000:1c:20.0", None),  # device numbers stop at 0x1f
        ("0000:1c:00.8", None),
        ("1c:00.0", None),
        ("0000:1c:00.0/..", None),
        ("", None),
    ],
)
def test_parse_pci_address(text: str, want: str | None) -> None:
    if want is None:
        with pytest.raises(ParseError):
            pcie.parse_pci_address(text)
    else:
        assert pcie.parse_pci_address(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0x030200\n", 0x030200),
        ("0x10DE", 0x10DE),
        ("030200", None),
        ("0x", None),
        ("0x1234567", None),
        ("0x03020g", None),
        ("0x٣", None),
    ],
)
def test_parse_pci_id(text: str, want: int | None) -> None:
    if want is None:
        with pytest.raises(ParseError):
            pcie.parse_pci_id(text, "class", 6)
    else:
        assert pcie.parse_pci_id(text, "class", 6) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [("0\n", 0), ("1", 1), ("-1", None), ("1023", 1023), ("1024", "err"), ("x", "err")],
)
def test_parse_numa_node(text: str, want: int | str | None) -> None:
    if want == "err":
        with pytest.raises(ParseError):
            pcie.parse_numa_node(text)
    else:
        assert pcie.parse_numa_node(text) == want


def test_parse_device_path() -> None:
    path = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0"
    assert pcie.parse_device_path(path) == (
        "pci0000:15",
        ("0000:15:01.0", "0000:16:00.0", "0000:17:01.0"),
        "0000:19:00.0",
    )
    for bad in (
        "devices/virtual/net/lo",
        "devices/pci0000:15",
        "devices/pci0000:15/0000:15:01.0/virtio0",
        "class/infiniband/mlx5_0",
        "devices/pci0000:15/" + "0000:15:01.0/" * 70,
    ):
        with pytest.raises(ParseError):
            pcie.parse_device_path(bad)


# ------------------------------------------------------------------ hostile trees


def test_links_that_leave_the_root_are_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    outside = tmp_path / "devices" / "pci0000:00" / "0000:00:01.0"
    outside.mkdir(parents=True)
    (outside / "class").write_text("0x030200\n")
    (outside / "vendor").write_text("0x10de\n")
    ib = root / "class" / "infiniband"
    for name, target in (
        ("climbs", "../../../../devices/pci0000:00/0000:00:01.0"),  # out of sys/
        ("absolute", str(outside)),
        ("loop", "loop"),
        ("missing", "../../../devices/pci0000:00/0000:00:09.0"),
    ):
        (ib / name).mkdir(parents=True)
        os.symlink(target, ib / name / "device")
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    os.symlink("../../../../devices/pci0000:00/0000:00:01.0", bus / "0000:00:01.0")
    assert pcie.read_nic_functions(root) == {}
    assert pcie.read_gpus(root) == []  # the GPU outside the root is not this host's
    assert pcie.resolve_in_root(root, "class/infiniband/loop/device") is None


names = st.sampled_from(["a", "b", "..", ".", "c"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(names, st.lists(names, max_size=5)), max_size=6), st.data())
def test_resolution_never_leaves_the_root(
    tmp_path_factory: pytest.TempPathFactory,
    links: list[tuple[str, list[str]]],
    data: st.DataObject,
) -> None:
    """Whatever relative links a tree holds, what resolves lies inside the root."""
    top = tmp_path_factory.mktemp("t")
    root = top / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "c").mkdir()
    for i, (where, target) in enumerate(links):
        d = {"a": root / "a", "b": root / "a" / "b", "c": root / "c"}.get(where, root)
        os.symlink("/".join(target) or ".", d / f"l{i}")
    query = "/".join(data.draw(st.lists(st.sampled_from(["a", "b", "c", "..", "l0", "l1"]))))
    got = pcie.resolve_in_root(root, query)
    if got is not None:
        real = (root / got).resolve()
        assert real == root.resolve() or root.resolve() in real.parents


def test_a_nics_gpu_does_not_depend_on_which_nics_are_asked_for() -> None:
    got = pcie.read_nic_gpus(GPU8, ["mlx5_3", "mlx5_8"])
    assert {d: a.gpu.name for d, a in got.items()} == {"mlx5_3": "GPU3", "mlx5_8": "GPU0"}


def test_the_checked_in_trees_hold_no_empty_directory() -> None:
    """git keeps no empty directory: a clean clone would miss it, and a reader counting
    NUMA nodes or following a driver link would see another host."""
    for name in pcitree.BUILDERS:
        empty = [d for d, dirs, files in os.walk(FIXTURES / name) if not dirs and not files]
        assert not empty, empty
