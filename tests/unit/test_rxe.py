from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from fabricprobe.cli import main
from fabricprobe.probes import rxe
from tests.unit.sysfs_builder import add_netdev, add_rdma_device

V2 = "0000:0000:0000:0000:0000:ffff:c000:0201"


class Recorder:
    """Stands in for the system commands (modprobe, rdma); they need root and a kernel."""

    def __init__(self, root: Path, returncode: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.root, self.returncode = root, returncode

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        if argv[:3] == ["rdma", "link", "add"] and self.returncode == 0:
            add_rdma_device(self.root, argv[3], [(1, V2, "RoCE v2", argv[-1])], parent=argv[-1])
        return subprocess.CompletedProcess(
            argv, self.returncode, "", "error: Operation not permitted"
        )


def host(tmp_path: Path, euid: int = 0, with_module: bool = True) -> rxe.Host:
    kdir = tmp_path / "modules" / "6.1.0-test"
    kdir.mkdir(parents=True)
    if with_module:
        ko = kdir / "kernel" / "drivers" / "infiniband" / "sw" / "rxe" / "rdma_rxe.ko.xz"
        ko.parent.mkdir(parents=True)
        ko.write_bytes(b"")
    osr = tmp_path / "os-release"
    osr.write_text('ID=debian\nPRETTY_NAME="Debian GNU/Linux 12"\n')
    return rxe.Host(
        sysfs_root=tmp_path / "sys",
        modules_root=tmp_path / "modules",
        os_release=osr,
        kernel="6.1.0-test",
        euid=euid,
    )


def test_up_adds_a_link_and_waits_for_the_v2_gid(tmp_path: Path) -> None:
    h = host(tmp_path)
    add_netdev(h.sysfs_root, "eth0")
    run = Recorder(h.sysfs_root)
    dev = rxe.up(h, "eth0", runner=run)
    assert run.calls == [
        ["modprobe", "rdma_rxe"],
        ["rdma", "link", "add", "rxe0", "type", "rxe", "netdev", "eth0"],
    ]
    assert dev.name == "rxe0" and dev.parent_netdev == "eth0"


@pytest.mark.parametrize(
    ("euid", "module", "netdev", "existing", "message"),
    [
        (1000, True, "eth0", False, "needs root"),
        (0, False, "eth0", False, "linux-image-amd64"),
        (0, True, "eth9", False, "no network interface 'eth9'"),
        (0, True, "eth0", True, "rxe0 already exists on eth0"),
    ],
)
def test_up_refuses_with_one_reason_and_changes_nothing(
    tmp_path: Path, euid: int, module: bool, netdev: str, existing: bool, message: str
) -> None:
    h = host(tmp_path, euid=euid, with_module=module)
    add_netdev(h.sysfs_root, "eth0")
    if existing:
        add_rdma_device(h.sysfs_root, "rxe0", [], parent="eth0")
    run = Recorder(h.sysfs_root)
    with pytest.raises(rxe.RxeError, match=message):
        rxe.up(h, netdev, runner=run)
    assert run.calls == []


def test_module_hint_names_the_package_per_distribution(tmp_path: Path) -> None:
    h = host(tmp_path, with_module=False)
    h.os_release.write_text("ID=ubuntu\nID_LIKE=debian\n")
    assert "linux-modules-extra-6.1.0-test" in rxe.module_hint(h)


def test_a_failing_command_is_reported_with_its_message(tmp_path: Path) -> None:
    h = host(tmp_path)
    add_netdev(h.sysfs_root, "eth0")
    with pytest.raises(rxe.RxeError, match="Operation not permitted"):
        rxe.up(h, "eth0", runner=Recorder(h.sysfs_root, returncode=1))


def test_down_removes_only_soft_roce_devices(tmp_path: Path) -> None:
    h = host(tmp_path)
    add_rdma_device(h.sysfs_root, "rxe0", [], parent="eth0")
    add_rdma_device(h.sysfs_root, "mlx5_0", [], driver="mlx5_core")
    run = Recorder(h.sysfs_root)
    assert rxe.down(h, runner=run) == ["rxe0"]
    with pytest.raises(rxe.RxeError, match="no soft-RoCE device 'mlx5_0'"):
        rxe.down(h, "mlx5_0", runner=run)


def test_cli_status_lists_gids_with_type_and_index(tmp_path: Path) -> None:
    add_rdma_device(tmp_path, "rxe0", [(1, V2, "RoCE v2", "eth0")], parent="eth0")
    res = CliRunner().invoke(main, ["rxe", "status", "--sysfs", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    assert '"type": "RoCE v2"' in res.output and '"index": 1' in res.output


def test_cli_up_without_the_module_exits_2_with_one_line() -> None:
    res = subprocess.run(
        [".venv/bin/probe", "rxe", "up", "--netdev", "lo0x"],
        capture_output=True,
        text=True,
        check=False,
    )
    if rxe.module_available(rxe.Host()):
        pytest.fail("this test expects a host kernel without rdma_rxe (the CI machine)")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "rdma_rxe" in lines[0] and "install" in lines[0]


@pytest.mark.parametrize(("gids", "warned"), [([], True), ([(1, V2, "RoCE v2", "eth0")], False)])
def test_cli_up_warns_when_no_v2_gid_came(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gids: list[tuple[int, str, str, str]],
    warned: bool,
) -> None:  # fmt: skip
    from fabricprobe.cli.commands import rxe as rxe_cmd
    from fabricprobe.probes.sysfs import read_device

    def up(h: rxe.Host, netdev: str, name: str | None) -> object:
        add_rdma_device(tmp_path, "rxe0", gids, parent=netdev)  # as the kernel would
        return read_device(tmp_path, "rxe0")

    monkeypatch.setattr(rxe_cmd.rxe_lib, "up", up)
    res = CliRunner().invoke(main, ["rxe", "up", "--netdev", "eth0", "--sysfs", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert ("no RoCE v2 GID" in res.stderr and "dev eth0" in res.stderr) is warned
