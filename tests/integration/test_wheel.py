"""The package as a user installs it: an sdist, a wheel built from that sdist, and the wheel
installed into a fresh virtual environment outside the checkout.

The wheel's top level is `fabricprobe` alone; it carries the compiled native loop, the
.proto, the metric catalogue and the dashboards. The installed `probe` answers --version
and validates a fixture host. The venv stays in build/wheel-venv, where the lane test
(tests/rdma/test_wheel_native.py) runs `probe lat --engine native` from it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from fabricprobe import __version__

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / "build" / "wheel-venv"
FIXTURE = ROOT / "tests" / "fixtures" / "sys" / "mlx5"


def run(*cmd: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    res = run(sys.executable, "-m", "build", "--outdir", out, ROOT, cwd=out)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    (whl,) = out.glob("*.whl")
    return whl


def test_sdist_and_wheel_hold_one_package_and_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"fabricprobe"}, top
    for needed in (
        "fabricprobe/core/api/fabricprobe.proto",
        "fabricprobe/collector/metrics.toml",
        "fabricprobe/grafana/rules.yml",
        "fabricprobe/probes/rdma/native/fastpath.c",
    ):
        assert needed in names, needed
    assert any(n.startswith("fabricprobe/probes/rdma/native/_fastpath") for n in names), (
        "the wheel has no native loop"
    )
    (sdist,) = wheel.parent.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
    assert any(m.endswith("fabricprobe/probes/rdma/native/fastpath.c") for m in members)
    assert any(m.endswith("/setup.py") for m in members)


def test_wheel_installs_and_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    shutil.rmtree(VENV, ignore_errors=True)
    made = run(sys.executable, "-m", "venv", VENV, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    inst = run(VENV / "bin" / "pip", "install", "-q", wheel, cwd=tmp_path)
    assert inst.returncode == 0, inst.stderr[-4000:]
    # pyverbs as the README's install section has a user give it to a venv: Debian's
    # package alone, through a .pth file (the RDMA commands import it; the lane runs them)
    distro = Path("/usr/lib/python3/dist-packages/pyverbs")
    if distro.is_dir():
        (VENV / "pyverbs-dist").mkdir()
        (VENV / "pyverbs-dist" / "pyverbs").symlink_to(distro)
        site = next((VENV / "lib").glob("python3*/site-packages"))
        (site / "distro-pyverbs.pth").write_text(f"{VENV / 'pyverbs-dist'}\n")
    probe = VENV / "bin" / "probe"
    version = run(probe, "--version", cwd=tmp_path)
    assert version.returncode == 0 and f"fabricprobe, version {__version__}" in version.stdout
    # the wheel's own metadata carries the version the source writes (pyproject.toml reads it)
    meta = run(
        VENV / "bin" / "python",
        "-c",
        "import importlib.metadata as m; print(m.version('fabricprobe'))",
        cwd=tmp_path,
    )
    assert meta.stdout.strip() == __version__, meta.stdout + meta.stderr
    where = run(
        VENV / "bin" / "python",
        "-c",
        "import fabricprobe; print(fabricprobe.__file__)",
        cwd=tmp_path,
    )
    assert str(VENV) in where.stdout, where.stdout
    native = run(
        VENV / "bin" / "python",
        "-c",
        "from fabricprobe.probes import native_loop; from fabricprobe.probes.rdma import native;"
        " print(native_loop.available() and native.available())",
        cwd=tmp_path,
    )
    assert native.stdout.strip() == "True", native.stderr
    res = run(probe, "validate", "--sysfs", FIXTURE, "--json", cwd=tmp_path)
    assert res.returncode in (0, 1), res.stderr
    report = json.loads(res.stdout)
    assert {r["check"] for r in report["results"]} >= {"device", "gid", "mtu"}
