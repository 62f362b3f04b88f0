"""Every `<!-- run: host -->` block of README.md and docs/ runs as written: bash with
errexit and pipefail, the repository root as its directory, this tree's `probe` first on
PATH, a time limit; it must exit 0 and print what its marker expects.

Where user namespaces are allowed, each block runs in a network namespace of its own
(`unshare -rn`, its loopback brought up), so the fixed ports a block names (4794, 9794,
4793) meet no other process on this machine; elsewhere it runs on the machine's loopback.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.docblocks import ROOT, Block, all_blocks

TIMEOUT_S = 90.0
HOST_BLOCKS = [b for b in all_blocks() if b.marker and b.marker.how == "host"]


@functools.cache
def _own_netns() -> bool:
    try:
        ok = subprocess.run(
            ["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ok.returncode == 0


def _probe_on_path(bin_dir: Path) -> None:
    """A `probe` that runs this tree's package with the test's interpreter."""
    bin_dir.mkdir()
    probe = bin_dir / "probe"
    probe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fabricprobe "$@"\n')
    probe.chmod(0o755)


def run_block(block: Block, tmp: Path) -> subprocess.CompletedProcess[str]:
    _probe_on_path(tmp / "bin")
    env = {
        **os.environ,
        "PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "TMPDIR": str(tmp),  # the blocks' mktemp lands here
    }
    argv = ["bash", "-euo", "pipefail", "-c", block.text]
    if _own_netns():
        argv = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the block's daemons go with it on a timeout
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{block.where}: still running after {TIMEOUT_S:.0f} s\n{out[-2000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize("block", HOST_BLOCKS, ids=lambda b: b.where)
def test_host_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = run_block(block, tmp_path)
    print(f"{block.where}: {time.monotonic() - t0:.1f} s")
    assert res.returncode == 0, f"{block.where}: exit {res.returncode}\n{res.stderr[-3000:]}"
    assert res.stdout.strip(), f"{block.where} printed nothing"
    assert block.marker is not None
    for want in block.marker.expect:
        assert want in res.stdout, f"{block.where}: no {want!r} in\n{res.stdout[-3000:]}"
