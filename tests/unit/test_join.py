"""Join: KV transfers meet the probe windows and counter rates of their path and time."""

from __future__ import annotations

import math

import pytest

from fabricprobe.collector.attribution.join import (
    join_fabric,
    request_breakdown,
    requests_frame,
    stages_frame,
)
from fabricprobe.collector.attribution.stages import RequestRecord, StageRecord
from fabricprobe.collector.history import CounterRate, FabricWindow, rates_frame, windows_frame
from tests.support.stages import scrambled_requests

S = 1_000_000_000


def kv(rid: str, t: int, seconds: float, src: str = "h0", dst: str = "h1") -> StageRecord:
    return StageRecord(rid, "kv_transfer", t, t + int(seconds * S), src, dst, "", "", "rdma", 1000)


def win(src: str, dst: str, start: int, end: int, p99_us: float) -> FabricWindow:
    return FabricWindow(
        src, dst, "rdma", "write", 64, start, end, p99_us / 4e6, p99_us / 2e6, p99_us / 1e6, 0.0, 10
    )


WINDOWS = windows_frame(
    [
        win("h0", "h1", 0, 10 * S, 50),
        win("h0", "h1", 10 * S, 20 * S, 900),
        win("h2", "h0", 0, 20 * S, 70),  # only the reverse direction probed
        FabricWindow("h0", "h1", "tcp", "pingpong", 64, 0, 20 * S, 1e-4, 1e-3, 2e-3, 0.0, 10),
    ]
)
RATES = rates_frame(
    [
        CounterRate("h0", "fp0", "pfc_pause", "rx_pause", 12 * S, 40.0),
        CounterRate("h0", "fp0", "pfc_pause", "tx_pause", 12 * S, 2.0),
        CounterRate("h0", "fp0", "pfc_pause", "rx_pause", 22 * S, 99.0),
        CounterRate("h1", "rxe1", "retransmit", "completer_retry_err", 15 * S, 3.0),
    ]
)


def test_each_transfer_gets_the_windows_of_its_path_and_time() -> None:
    st = stages_frame([kv("a", 2 * S, 0.1), kv("b", 11 * S, 0.5), kv("c", 5 * S, 0.1, "h0", "h2")])
    out = join_fabric(st, WINDOWS, RATES, slack_s=0.0).set_index("request_id")
    assert out.loc["a", "rtt_p99_s"] == pytest.approx(50e-6)
    assert out.loc["b", "rtt_p99_s"] == pytest.approx(900e-6)  # not the tcp window
    assert out.loc["b", "rtt_min_s"] == pytest.approx(225e-6)
    assert out.loc["c", "rtt_p99_s"] == pytest.approx(70e-6)  # reverse direction
    assert out.loc["b", "src_pfc_pause_per_s"] == pytest.approx(42.0)  # first reading after
    assert out.loc["b", "dst_retransmit_per_s"] == pytest.approx(3.0)
    assert math.isnan(out.loc["c", "dst_retransmit_per_s"])
    assert list(out["fabric_windows"]) == [1, 1, 1]


def test_breakdown_keeps_ttft_and_itl_apart_and_prefers_measured_stages() -> None:
    st = stages_frame(
        [
            StageRecord("r", "queue", 0, S // 10),
            StageRecord("r", "queue", 0, S, derived=True),  # from llm_request: superseded
            StageRecord("r", "prefill", S // 10, S // 2),
            kv("r", S // 2, 0.25),
            StageRecord("r", "decode", 3 * S // 4, 2 * S),
        ]
    )
    rq = requests_frame([RequestRecord("r", 0, 2 * S, 1.0, 2.0, 11, 100)])
    out = request_breakdown(st, rq).set_index("request_id")
    assert out.loc["r", "queue_s"] == pytest.approx(0.1)
    assert out.loc["r", "ttft_s"] == 1.0
    assert out.loc["r", "itl_s"] == pytest.approx(0.1)
    assert out.loc["r", "kv_share_ttft"] == pytest.approx(0.25)
    assert out.loc["r", "kv_share_e2e"] == pytest.approx(0.125)
    assert (out.loc["r", "src"], out.loc["r", "dst"]) == ("h0", "h1")


def test_no_fabric_figures_yet_leaves_gaps_not_errors() -> None:
    out = join_fabric(stages_frame([kv("a", S, 0.1)]), windows_frame([]), rates_frame([]))
    assert out.loc[0, "fabric_windows"] == 0 and math.isnan(out.loc[0, "rtt_p99_s"])


def test_breakdown_puts_each_requests_stages_in_their_own_columns() -> None:
    """Many requests with their records scrambled (as spans of several export batches
    arrive): every cell is its own request's own stage, and the fabric share is that
    request's KV transfer over its own TTFT."""
    stages, requests, want = scrambled_requests(40)
    out = request_breakdown(stages_frame(stages), requests_frame(requests))
    assert len(out) == 40
    got = out.set_index("request_id")
    for rid, row in want.items():
        for col, seconds in row.items():
            assert got.loc[rid, col] == pytest.approx(seconds, rel=1e-12, abs=1e-12), (rid, col)


def test_a_spans_round_trips_reach_the_fabric_part() -> None:
    said = StageRecord("a", "kv_transfer", 2 * S, 2 * S + S // 10, "h0", "h1", transport="rdma",
                       bytes=1000, round_trips=8)  # fmt: skip
    out = join_fabric(stages_frame([said, kv("b", 3 * S, 0.1)]), WINDOWS, RATES, slack_s=0.0)
    out = out.set_index("request_id")
    assert out.loc["a", "fabric_rtts"] == 8
    assert out.loc["b", "fabric_rtts"] == 2  # the span did not say: RDMA's count
    assert out.loc["a", "fabric_rtt_s"] == pytest.approx(4 * out.loc["b", "fabric_rtt_s"])


def test_a_spans_own_transfer_time_reaches_the_stack() -> None:
    said = StageRecord("a", "kv_transfer", 2 * S, 2 * S + S // 10, "h0", "h1", transport="rdma",
                       bytes=1000, library_s=0.05)  # fmt: skip
    out = join_fabric(stages_frame([said, kv("b", 3 * S, 0.1)]), WINDOWS, RATES, slack_s=0.0,
                      bandwidth={("h0", "h1"): 1e9})  # fmt: skip
    out = out.set_index("request_id")
    assert out.loc["a", "transfer_stack_source"] == "span"
    assert out.loc["a", "transfer_stack_s"] == pytest.approx(0.05 - out.loc["a", "fabric_s"])
    assert out.loc["a", "engine_wait_s"] == pytest.approx(0.1 - 0.05)
    assert out.loc["b", "transfer_stack_source"] != "span"


def test_the_rtt_is_the_smallest_probes_of_the_path() -> None:
    """A fleet probing 64 B and 64 KiB: the larger probe's RTT carries its own
    serialization, which the transfer's bytes are charged for apart."""
    big = FabricWindow("h0", "h1", "rdma", "write", 65536, 0, 10 * S, 1e-3, 2e-3, 4e-3, 0.0, 10)
    st = stages_frame([kv("a", 2 * S, 0.1)])
    both = join_fabric(st, windows_frame([win("h0", "h1", 0, 10 * S, 50), big]), RATES)
    alone = join_fabric(st, windows_frame([win("h0", "h1", 0, 10 * S, 50)]), RATES)
    assert both.iloc[0]["rtt_p50_s"] == pytest.approx(alone.iloc[0]["rtt_p50_s"])
    assert both.iloc[0]["fabric_windows"] == 1
    # with only the large probes, they are the path's figures
    only = join_fabric(st, windows_frame([big]), RATES)
    assert only.iloc[0]["rtt_p50_s"] == pytest.approx(2e-3)
