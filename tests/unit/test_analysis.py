"""Analysis over small frames: ranking, fabric-bound flag, correlation, comm-bound, goodput."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricprobe.collector.attribution.analysis import (
    AnalysisConfig,
    communication_bound,
    goodput,
    leave_one_out_median,
    rank_correlation,
    rank_paths,
    spearman,
)

S = 1_000_000_000


def kv_frame(paths: dict[tuple[str, str], tuple[float, float]], n: int = 5) -> pd.DataFrame:
    """n transfers of 1 MB per path with (seconds, probe p99 RTT); a little spread."""
    rows = []
    for (src, dst), (sec, rtt) in paths.items():
        for i in range(n):
            rows.append(
                {
                    "request_id": f"{src}{dst}{i}",
                    "start_ns": i * S,
                    "duration_s": sec * (1 + i / 100),
                    "bytes": 1_000_000,
                    "src": src,
                    "dst": dst,
                    "transport": "rdma",
                    "rtt_min_s": rtt / 4,
                    "rtt_p50_s": rtt / 2,
                    "rtt_p99_s": rtt * (1 + i / 50),
                    "src_pfc_pause_per_s": 0.0,
                }
            )
    return pd.DataFrame(rows)


def test_the_slow_path_with_a_slow_fabric_ranks_first_and_alone_is_flagged() -> None:
    kv = kv_frame(
        {
            ("h0", "h1"): (0.010, 100e-6),
            ("h0", "h2"): (0.040, 2100e-6),
            ("h1", "h2"): (0.011, 110e-6),
        }
    )
    out = rank_paths(kv)
    assert (out.iloc[0]["src"], out.iloc[0]["dst"]) == ("h0", "h2")
    assert list(out["fabric_bound"]) == [True, False, False]
    first = out.iloc[0]
    assert first["explained_s"] == pytest.approx(5 * 0.0295, rel=0.1)
    assert first["kv_ratio"] > 3 and first["rtt_ratio"] > 10


def test_a_slow_path_with_a_clean_fabric_is_not_fabric_bound() -> None:
    kv = kv_frame(
        {
            ("h0", "h1"): (0.010, 100e-6),
            ("h0", "h2"): (0.040, 105e-6),
            ("h1", "h2"): (0.011, 110e-6),
        }
    )
    out = rank_paths(kv)
    assert out.iloc[0]["dst"] == "h2" and not out["fabric_bound"].any()


def test_congestion_counters_count_as_fabric_evidence() -> None:
    kv = kv_frame(
        {
            ("h0", "h1"): (0.010, 100e-6),
            ("h0", "h2"): (0.040, 105e-6),
            ("h1", "h2"): (0.011, 110e-6),
        }
    )
    kv.loc[kv["dst"] == "h2", "src_pfc_pause_per_s"] = 500.0
    kv.loc[(kv["src"] == "h1"), "src_pfc_pause_per_s"] = 0.0
    out = rank_paths(kv).set_index(["src", "dst"])
    assert out.loc[("h0", "h2"), "fabric_bound"]
    assert not out.loc[("h0", "h1"), "fabric_bound"]


def test_a_lone_path_or_too_few_transfers_is_never_judged() -> None:
    assert not rank_paths(kv_frame({("a", "b"): (1.0, 1.0)}))["fabric_bound"].any()
    kv = kv_frame({("a", "b"): (0.01, 1e-4), ("a", "c"): (1.0, 1.0), ("b", "c"): (0.01, 1e-4)}, n=2)
    assert not rank_paths(kv)["fabric_bound"].any()
    assert rank_paths(kv_frame({}, n=0)).empty


def test_spearman_and_rank_correlation_per_window_and_path() -> None:
    assert spearman(pd.Series([1, 2, 3, 4]), pd.Series([10, 20, 25, 99])) == pytest.approx(1.0)
    assert spearman(pd.Series([1, 2, 3]), pd.Series([5, 5, 5])) != spearman(
        pd.Series([1, 2, 3]), pd.Series([5, 5, 5])
    )  # NaN for a constant series
    kv = kv_frame({("h0", "h1"): (0.01, 1e-4)}, n=6)
    out = rank_correlation(kv, AnalysisConfig(window_s=3.0))
    assert list(out["window"]) == [0, 1]
    assert list(out["transfers"]) == [3, 3]
    assert out["rho_rtt_p99"].tolist() == pytest.approx([1.0, 1.0])


def _stages(kv_s: list[float], queue_s: list[float], compute_s: list[float]) -> pd.DataFrame:
    rows = []
    for i, (k, q, c) in enumerate(zip(kv_s, queue_s, compute_s, strict=True)):
        for stage, d in (("kv_transfer", k), ("queue", q), ("prefill", c / 2), ("decode", c / 2)):
            rows.append(
                {"request_id": f"r{i}", "stage": stage, "start_ns": i * 60 * S, "duration_s": d}
            )
    return pd.DataFrame(rows)


def test_communication_bound_needs_kv_and_queue_rising_with_compute_flat() -> None:
    flag, bins = communication_bound(
        _stages([0.1, 0.2, 0.4, 0.8], [0.01, 0.05, 0.2, 0.5], [1.0] * 4)
    )
    assert flag and len(bins) == 4
    flag, _ = communication_bound(
        _stages([0.1, 0.2, 0.4, 0.8], [0.01, 0.05, 0.2, 0.5], [1, 2, 3, 4])
    )
    assert not flag  # compute grew too: not the fabric's doing alone
    flag, _ = communication_bound(_stages([0.1, 0.1, 0.1, 0.1], [0.01, 0.05, 0.2, 0.5], [1.0] * 4))
    assert not flag


def test_goodput_counts_only_requests_within_both_targets() -> None:
    rq = pd.DataFrame(
        {
            "request_id": ["a", "b", "c", "d"],
            "end_ns": [1 * S, 2 * S, 3 * S, 4 * S],
            "ttft_s": [0.5, 3.0, 0.5, 0.2],
            "itl_s": [0.05, 0.05, 0.5, None],
            "output_tokens": [100, 100, 100, 1],
        }
    )
    cfg = AnalysisConfig(window_s=10.0, slo_ttft_s=1.0, slo_itl_s=0.1)
    row = goodput(rq, cfg).iloc[0]
    assert (row["requests"], row["met"], row["tokens"]) == (4, 2, 301)
    assert row["goodput_tps"] == pytest.approx(10.1)
    assert row["throughput_tps"] == pytest.approx(30.1)
    last = goodput(rq, cfg, now_ns=5 * S).iloc[0]
    assert last["goodput_tps"] == pytest.approx(10.1)
    assert goodput(rq, AnalysisConfig(window_s=1.0), now_ns=100 * S).empty


def test_a_raised_rtt_floor_is_a_fault_and_ranks_first_when_transfers_hide_it() -> None:
    """A busy sender's stalls can swamp a path's added latency: its transfers come out
    no slower than the others' and the path explains nothing, but its probes' floor
    rose, which host noise cannot do: a fault, and it goes first. The others' tails
    (host noise) are no fault."""
    kv = kv_frame(
        {
            ("h0", "h1"): (0.50, 40e-3),  # tail high, floor 10 ms
            ("h0", "h2"): (0.52, 30e-3),
            ("h1", "h2"): (0.49, 200e-6),
        }
    )
    kv.loc[kv["dst"] == "h2", "rtt_min_s"] = 100e-6
    out = rank_paths(kv)
    assert (out.iloc[0]["src"], out.iloc[0]["dst"]) == ("h0", "h1")
    assert list(out["fabric_fault"]) == [True, False, False]
    assert not out["fabric_bound"].any()
    assert out.iloc[0]["explained_s"] <= out["explained_s"].max()


def test_counters_alone_are_no_fault() -> None:
    """Counters are per device, and a busy receiver moves them too: without slow transfers
    they flag nothing (in the busy lane a host shared with the delayed path showed them)."""
    kv = kv_frame({("h0", "h1"): (0.010, 100e-6), ("h0", "h2"): (0.010, 105e-6),
                   ("h1", "h2"): (0.011, 110e-6)})  # fmt: skip
    kv.loc[kv["dst"] == "h2", "src_pfc_pause_per_s"] = 500.0
    kv.loc[(kv["src"] == "h1"), "src_pfc_pause_per_s"] = 0.0
    out = rank_paths(kv)
    assert not out["fabric_fault"].any() and not out["fabric_bound"].any()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.none(), st.floats(min_value=-1e3, max_value=1e3), st.sampled_from([1.0, 2.0])),
        max_size=30,
    )
)
def test_leave_one_out_median_is_the_median_of_the_others(values: list[float | None]) -> None:
    s = pd.Series(values, index=[f"p{i}" for i in range(len(values))], dtype=float)
    got = leave_one_out_median(s)
    assert list(got.index) == list(s.index)
    for key in s.index:
        rest = s.drop(key).dropna()
        want = float(rest.median()) if len(rest) else float("nan")
        assert got[key] == pytest.approx(want, rel=1e-12, abs=1e-12, nan_ok=True), key


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from([1.0, 2.0, 3.0]), st.floats(-10, 10)),
            st.one_of(st.none(), st.sampled_from([1.0, 5.0]), st.floats(-10, 10)),
        ),
        max_size=25,
    )
)
def test_spearman_is_pearson_over_pandas_ranks(
    pairs: list[tuple[float | None, float | None]],
) -> None:
    both = pd.DataFrame(pairs, columns=["x", "y"], dtype=float).dropna()
    rx, ry = both["x"].rank(), both["y"].rank()
    constant = len(both) < 3 or rx.std() == 0 or ry.std() == 0
    want = float("nan") if constant else float(rx.corr(ry))
    got = spearman(
        pd.Series([p[0] for p in pairs], dtype=float), pd.Series([p[1] for p in pairs], dtype=float)
    )
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12, nan_ok=True)
