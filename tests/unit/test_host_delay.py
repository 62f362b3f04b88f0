"""Busy hosts: what a host adds to its probes comes out of the path's RTT (the hosts'
reference probes), a busy prober's paths are host-bound and not fabric-bound, and a
path the network delays is still found beside them."""

from __future__ import annotations

import pytest

from fabricprobe.collector.attribution.analysis import rank_paths
from fabricprobe.collector.attribution.join import HOST_FIELDS, join_fabric, stages_frame
from fabricprobe.collector.attribution.stages import StageRecord
from fabricprobe.collector.history import FabricWindow, rates_frame, windows_frame

S = 1_000_000_000
US = 1e-6


def rdma(
    src: str, dst: str, start: int, end: int, min_us: float, p50_us: float, p99_us: float
) -> FabricWindow:
    return FabricWindow(
        src, dst, "rdma", "send", 64, start, end, min_us * US, p50_us * US, p99_us * US, 0.0, 50
    )


def ref(host: str, start: int, end: int, min_us: float, p50_us: float) -> FabricWindow:
    """HOST's reference: the TCP probe of its own responder."""
    return FabricWindow(
        host, host, "tcp", "pingpong", 64, start, end, min_us * US, p50_us * US, 2 * p50_us * US,
        0.0, 10,
    )  # fmt: skip


def transfers(src: str, dst: str, seconds: float, n: int = 6) -> list[StageRecord]:
    return [
        StageRecord(f"{src}{dst}{i}", "kv_transfer", (11 + i) * S, (11 + i) * S + int(seconds * S),
                    src, dst, "", "", "rdma", 1 << 20)
        for i in range(n)
    ]  # fmt: skip


PATHS = (("a", "b"), ("a", "c"), ("b", "c"), ("b", "d"), ("c", "d"))


def fleet(busy: str | None, delayed: tuple[str, str] | None) -> tuple:
    """Hosts a, b, c, d; quiet windows from 0 to 10 s, the event from 10 s to 30 s. A busy
    host's reference rises from 30 µs to 2 ms and so do its probes' RTTs (the prober waits
    for a CPU); a delayed path's floor rises by 2 ms (netem), its hosts stay quiet."""
    ws = []
    for h in "abcd":
        ws.append(ref(h, 0, 10 * S, 30, 35))
        ws.append(ref(h, 10 * S, 30 * S, 30, 2000 if h == busy else 35))
    for src, dst in PATHS:
        ws.append(rdma(src, dst, 0, 10 * S, 8, 10, 30))
        noisy = busy in (src, dst)
        slow = delayed == (src, dst)
        lo, mid, tail = (2008, 2010, 2030) if slow else (8, 10, 30)
        if noisy:  # the prober waits for a CPU: half the busy reference's rise, p50 and p99
            lo, mid, tail = lo + 10, mid + 985, tail + 1985
        ws.append(rdma(src, dst, 10 * S, 30 * S, lo, mid, tail))
    kv = []
    for src, dst in PATHS:
        slow = delayed == (src, dst) or busy in (src, dst)
        kv += transfers(src, dst, 0.030 if slow else 0.010)
    return stages_frame(kv), windows_frame(ws)


def test_the_hosts_delay_comes_out_of_the_rtt() -> None:
    st, ws = fleet(busy="a", delayed=None)
    out = join_fabric(st, ws, rates_frame([]), slack_s=0.0).set_index("request_id")
    ab, bc = out.loc["ab0"], out.loc["bc0"]
    # a's reference is 1970 µs over its floor, b's 5 µs: a path holds half of each (a's
    # prober, b's responder)
    assert ab["host_delay_s"] == pytest.approx(1975 * US / 2)
    assert ab["rtt_p50_net_s"] == pytest.approx(18 * US)  # 995 - 987.5, held at the minimum
    assert ab["host_bound"] == 1.0
    assert bc["host_delay_s"] == pytest.approx(5 * US) and bc["host_bound"] == 0.0
    assert bc["rtt_p50_net_s"] == pytest.approx(8 * US)  # never below the window's minimum


def test_a_busy_prober_is_host_bound_and_a_delayed_path_is_still_found() -> None:
    st, ws = fleet(busy="a", delayed=("b", "c"))
    kv = join_fabric(st, ws, rates_frame([]), slack_s=0.0)
    paths = rank_paths(kv).set_index(["src", "dst"])
    assert paths.loc[("b", "c"), "fabric_bound"]
    assert not paths.loc[("b", "c"), "host_bound"]
    for p in (("a", "b"), ("a", "c")):
        assert not paths.loc[p, "fabric_bound"], p
        assert paths.loc[p, "host_bound"], p


def test_without_the_correction_the_busy_host_would_pass_for_the_network() -> None:
    st, ws = fleet(busy="a", delayed=None)
    kv = join_fabric(st, ws, rates_frame([]), slack_s=0.0).drop(columns=HOST_FIELDS)
    raw = rank_paths(kv).set_index(["src", "dst"])
    assert raw["fabric_bound"].any()  # what the figures said before the hosts' reference
    kv = join_fabric(st, ws, rates_frame([]), slack_s=0.0)
    assert not rank_paths(kv)["fabric_bound"].any()


def test_hosts_without_a_reference_keep_the_raw_figures() -> None:
    st, ws = fleet(busy=None, delayed=("b", "c"))
    ws = ws[ws["src"] != ws["dst"]]
    kv = join_fabric(st, ws, rates_frame([]), slack_s=0.0)
    assert kv["host_delay_s"].isna().all() and kv["host_bound"].isna().all()
    assert (kv["rtt_p50_net_s"] == kv["rtt_p50_s"]).all()
    paths = rank_paths(kv).set_index(["src", "dst"])
    assert paths.loc[("b", "c"), "fabric_bound"] and not paths["host_bound"].any()


def one_sided(src: str, dst: str, start: int, end: int, p50_us: float) -> FabricWindow:
    """A window of one-sided READs (rdma_rc_read): the far end's NIC answers them."""
    return FabricWindow(
        src, dst, "rdma", "read", 64, start, end, 0.9 * p50_us * US, p50_us * US, 2 * p50_us * US,
        0.0, 50,
    )  # fmt: skip


def test_a_path_with_one_sided_windows_is_joined_on_them_and_its_far_end_has_no_share() -> None:
    """A busy responder (b) lifts the ping-pong's RTT and its own reference; the READs'
    RTT, which b's NIC answers, stays. The join takes the READs, charges none of b's
    delay to them, and keeps the path off host-bound and off fabric-bound."""
    st, ws = fleet(busy="b", delayed=None)
    quiet = windows_frame(
        [one_sided("a", "b", 0, 10 * S, 12), one_sided("a", "b", 10 * S, 30 * S, 12)]
    )
    both = windows_frame(
        [
            *(FabricWindow(**r) for r in ws.to_dict("records")),
            *(one_sided("a", "b", t, t + 10 * S, 12) for t in (0, 10 * S, 20 * S)),
        ]
    )
    ab = join_fabric(st, both, rates_frame([]), slack_s=0.0).set_index("request_id").loc["ab0"]
    assert ab["rtt_p50_s"] == pytest.approx(12 * US)  # the READs', not the ping-pong's 995
    assert ab["rtt_min_s"] == pytest.approx(10.8 * US)
    assert ab["host_delay_s"] == pytest.approx(5 * US / 2)  # a's half; b's NIC answered
    assert ab["host_bound"] == 0.0
    alone = join_fabric(st, quiet, rates_frame([]), slack_s=0.0).set_index("request_id")
    assert alone.loc["ab0", "rtt_p50_s"] == pytest.approx(12 * US)
