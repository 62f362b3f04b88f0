"""The native RC and UD engine on a host without RDMA: the extension imports (libibverbs loads),
a device that is not there is a clear ProbeError, and bad shapes fail before any verbs call."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from fabricprobe.core.errors import PeerError, ProbeError
from fabricprobe.probes.native_loop import clock_overhead_ns
from fabricprobe.probes.rdma import native
from fabricprobe.probes.rdma.native import (
    WC_STATUS,
    CompletionError,
    NativeError,
    NativeRcEndpoint,
    NativeUdEndpoint,
)

VERBS_H = Path("/usr/include/infiniband/verbs.h")


def test_extension_is_built_and_imports() -> None:
    assert native.available(), "run scripts/build-native.sh"
    mod = native.load()
    for fn in ("fp_open", "fp_connect", "fp_send_pingpong", "fp_write_pingpong", "fp_close"):
        assert hasattr(mod.lib, fn)
    for fn in ("fp_ud_open", "fp_ud_remote", "fp_ud_probe", "fp_ud_answer", "fp_ud_hw_ts"):
        assert hasattr(mod.lib, fn)


@pytest.mark.parametrize("kind", ["rc", "ud"])
def test_missing_device_is_a_clear_probe_error(kind: str) -> None:
    with pytest.raises(ProbeError) as caught:
        if kind == "rc":
            NativeRcEndpoint("fp-no-such-dev0", 64)
        else:
            NativeUdEndpoint("fp-no-such-dev0", 1, 0x1F1F1F1F)
    err = caught.value
    assert isinstance(err, NativeError)
    assert "fp-no-such-dev0" in str(err)
    # no uverbs at all (ENOSYS, a host without RDMA) or devices but not this one (ENODEV)
    assert err.errno in (errno.ENOSYS, errno.ENODEV)
    assert "RDMA device" in str(err)


@pytest.mark.parametrize(
    ("size", "depth"), [(0, 64), (1 << 31, 64), (64, 1), (64, 1 << 15)], ids=str
)
def test_bad_shapes_fail_before_verbs(size: int, depth: int) -> None:
    with pytest.raises(ValueError):
        NativeRcEndpoint("fp-no-such-dev0", size, depth)


@pytest.mark.parametrize("depth", [1, 1 << 15])
def test_bad_ud_depth_fails_before_verbs(depth: int) -> None:
    with pytest.raises(ValueError, match="depth"):
        NativeUdEndpoint("fp-no-such-dev0", 1, 0x1F1F1F1F, depth)


def test_completion_error_names_the_status() -> None:
    err = CompletionError("rxe0: send completion error", 12, completed=7)
    assert isinstance(err, PeerError)
    assert err.status_name == "IBV_WC_RETRY_EXC_ERR"
    assert err.completed == 7
    assert CompletionError("x", 99, 0).status_name == "99"


def test_status_names_follow_the_header() -> None:
    """scripts/build-native.sh installs the header the extension is compiled against."""
    text = VERBS_H.read_text()
    body = re.search(r"enum ibv_wc_status \{(.*?)\};", text, re.S)
    assert body is not None
    names = re.findall(r"\b(IBV_WC_\w+)", body.group(1))
    assert tuple(names) == WC_STATUS


def test_each_engine_reports_the_cost_of_its_own_timing() -> None:
    from fabricprobe.probes.rdma import rc

    assert 0 < clock_overhead_ns() < 1_000_000
    assert 0 < rc.loop_overhead_ns("native") < 1_000_000
    assert 0 < rc.loop_overhead_ns("pyverbs") < 1_000_000
