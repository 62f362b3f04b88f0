"""The fold against the rows: what /metrics reads of the folded paths and requests must be
what the pure analysis gives over the same joined transfers (attribution/analysis.py):
equal while a path holds few transfers (its sketches keep the values), within the
sketches' stated accuracy past that; and its state bounded, with what it leaves out
counted."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricprobe.collector.attribution.analysis import (
    AnalysisConfig,
    path_figures,
    rank_correlation,
    rank_paths,
)
from fabricprobe.collector.attribution.kvfold import (
    BINS,
    KvFold,
    RequestFigures,
    transfer_vector,
)
from fabricprobe.core.quantiles import ALPHA, EXACT_MAX

S = 1_000_000_000
NOW = 10_000 * S
CFG = AnalysisConfig(window_s=60.0)
HOSTS = ["a", "b", "c", "d"]


def frame(rows: list[dict[str, object]]) -> pd.DataFrame:
    return pd.DataFrame(rows)


@st.composite
def transfers(draw: st.DrawFn, most: int = 8) -> pd.DataFrame:
    """Joined KV transfers on a few paths, ending in the last 50 s: seconds, bytes, RTT
    figures (the net ones sometimes missing), counter rates, host figures, KV parts."""
    paths = draw(
        st.lists(
            st.tuples(
                st.sampled_from(HOSTS), st.sampled_from(HOSTS), st.sampled_from(["rdma", ""])
            ),
            min_size=1,
            max_size=6,
            unique=True,
        )
    )
    maybe = st.one_of(st.just(math.nan), st.floats(1e-6, 1e-2))
    rows = []
    for i, (src, dst, tr) in enumerate(paths):
        slow = draw(st.sampled_from([1.0, 1.0, 4.0]))
        for j in range(draw(st.integers(1, most))):
            sec = slow * draw(st.floats(0.005, 0.05))
            end = NOW - draw(st.integers(0, 50 * S))
            p50 = slow * draw(st.floats(1e-5, 1e-3))
            rows.append(
                {
                    "request_id": f"r{i}-{j}",
                    "src": src,
                    "dst": dst,
                    "transport": tr,
                    "start_ns": end - int(sec * S),
                    "end_ns": end,
                    "duration_s": sec,
                    "bytes": draw(st.sampled_from([0, 1 << 20, 4 << 20])),
                    "rtt_min_s": p50 / 2,
                    "rtt_p50_s": p50,
                    "rtt_p99_s": p50 * draw(st.floats(1.0, 3.0)),
                    "rtt_p50_net_s": draw(st.one_of(st.just(math.nan), st.just(p50 * 0.9))),
                    "rtt_p99_net_s": math.nan,
                    "src_pfc_pause_per_s": draw(st.sampled_from([math.nan, 0.0, 40.0])),
                    "dst_retransmit_per_s": draw(st.sampled_from([math.nan, 0.0, 3.0])),
                    "host_bound": draw(st.sampled_from([math.nan, 0.0, 1.0])),
                    "host_delay_s": draw(maybe),
                    "kv_wait_s": sec,
                    "fabric_s": draw(maybe),
                    "transfer_stack_s": draw(maybe),
                    "engine_wait_s": draw(maybe),
                    "kv_speed_above_path": draw(st.sampled_from([None, True, False])),
                }
            )
    return frame(rows)


def folded(kv: pd.DataFrame, cfg: AnalysisConfig = CFG) -> KvFold:
    fold = KvFold(cfg)
    fold.add(folded_requests(kv), NOW)
    return fold


def by_path(df: pd.DataFrame) -> pd.DataFrame:
    return df.set_index(["src", "dst", "transport"]).sort_index()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transfers())
def test_the_folded_ranking_is_the_rows_ranking(kv: pd.DataFrame) -> None:
    """Few transfers a path (the sketches hold the values): every figure, flag and the
    time explained equal to rank_paths' over the rows."""
    want = by_path(rank_paths(kv, CFG)).drop(columns="rank")
    got = by_path(folded(kv).view(NOW).paths).drop(columns="rank")
    assert list(got.index) == list(want.index)
    for col in want.columns:
        w, g = want[col], got[col]
        if w.dtype == bool or g.dtype == bool:
            assert list(w.astype(bool)) == list(g.astype(bool)), col
        else:
            np.testing.assert_allclose(g.astype(float), w.astype(float), rtol=1e-9, err_msg=col)


def quantile_bound(values: pd.Series, q: float) -> float:
    """ALPHA of the larger of the two values pandas' Q quantile lies between."""
    v = sorted(values.dropna())
    if not v:
        return 0.0
    rank = q * (len(v) - 1)
    return ALPHA * max(abs(v[math.floor(rank)]), abs(v[math.ceil(rank)])) * (1 + 1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transfers(most=3 * EXACT_MAX))
def test_many_transfers_a_path_within_the_sketches_accuracy(kv: pd.DataFrame) -> None:
    """Past EXACT_MAX transfers a bin the figures come from buckets: each median (and the
    speed at kv_quantile) within ALPHA of the values pandas interpolates between."""
    fold = folded(kv)
    exact = path_figures(kv, CFG)
    rows = kv.assign(
        s_per_byte=kv["duration_s"] / kv["bytes"].where(kv["bytes"] > 0),
        rtt_p50_net_s=kv["rtt_p50_net_s"].fillna(kv["rtt_p50_s"]),
    )
    for key, st_ in fold.paths.items():
        f = st_.figures
        assert f is not None
        mine = rows[
            (rows["src"] == key[0]) & (rows["dst"] == key[1]) & (rows["transport"] == key[2])
        ]
        want = exact.loc[key]
        assert f.transfers == want["transfers"] and f.kv_bytes == pytest.approx(want["kv_bytes"])
        for name, col, q in (
            ("kv_median_s", "duration_s", 0.5),
            ("s_per_byte", "s_per_byte", CFG.kv_quantile),
            ("rtt_p50_s", "rtt_p50_s", 0.5),
            ("rtt_p50_net_s", "rtt_p50_net_s", 0.5),
            ("host_delay_s", "host_delay_s", 0.5),
        ):
            got, w = getattr(f, name), want[name]
            if math.isnan(w):
                assert math.isnan(got), name
            else:
                assert abs(got - w) <= quantile_bound(mine[col], q), name


def test_rho_of_the_newest_window_is_rank_correlations() -> None:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(40):
        start = NOW - 50 * S + i * S
        p99 = 1e-4 * (1 + i / 10) * (1 + 0.2 * rng.random())
        rows.append(
            {"src": "a", "dst": "b", "transport": "rdma", "start_ns": start,
             "end_ns": start + S // 10, "duration_s": 0.1 * p99 / 1e-4, "bytes": 1 << 20,
             "rtt_min_s": 5e-5, "rtt_p50_s": 8e-5, "rtt_p99_s": p99}
        )  # fmt: skip
    kv = frame(rows)
    want = rank_correlation(kv, CFG).dropna(subset=["rho_rtt_p99"])
    newest = want[want["window"] == want["window"].max()]
    got = folded(kv).view(NOW).rho
    assert [(k, pytest.approx(r)) for k, r in got] == [
        (("a", "b", "rdma"), r) for r in newest["rho_rtt_p99"]
    ]


def test_bins_leave_the_window_and_paths_past_the_bound_are_counted() -> None:
    rows = [
        {"src": "a", "dst": h, "transport": "rdma", "start_ns": NOW - 55 * S,
         "end_ns": NOW - 55 * S + S // 10, "duration_s": 0.1, "bytes": 1 << 20,
         "rtt_min_s": 5e-5, "rtt_p50_s": 8e-5, "rtt_p99_s": 1e-4}
        for h in ("b", "c", "d")
    ]  # fmt: skip
    fold = KvFold(CFG, max_paths=2)
    fold.add(folded_requests(frame(rows)), NOW)
    assert len(fold.paths) == 2 and fold.dropped_total()["path"] == 1
    assert len(fold.view(NOW).paths) == 2
    later = NOW + int(CFG.window_s / BINS * S) * 2  # the bin the transfers ended in is gone
    view = fold.view(later)
    assert view.paths.empty and not fold.paths and not fold.by_bin
    before = fold.version
    assert fold.view(later) is view and fold.version == before  # nothing changed: kept


def folded_requests(kv: pd.DataFrame) -> list[RequestFigures]:
    nan = math.nan
    out = []
    for r in kv.to_dict("records"):
        key = (r["src"], r["dst"], r["transport"])
        move = [(key, r["start_ns"], r["end_ns"], transfer_vector(r))]
        start, end = int(r["start_ns"]), int(r["end_ns"])
        out.append(RequestFigures(start, end, nan, nan, nan, nan, nan, None, move))
    return out


def test_request_figures_give_goodput_shares_and_the_communication_bins() -> None:
    fold = KvFold(CFG)
    reqs = [
        RequestFigures(NOW - 30 * S, NOW - 20 * S, 0.1, 0.01, 1.0, 0.2, 0.05, (100.0, True), []),
        RequestFigures(
            NOW - 30 * S, NOW - 10 * S, 0.3, 0.02, 1.0, 0.4, math.nan, (50.0, False), []
        ),
        RequestFigures(NOW - 30 * S, NOW - 5 * S, math.nan, 0.03, 1.0, math.nan, 0.15, None, []),
        RequestFigures(NOW - 90 * S, NOW - 80 * S, 9.0, 9.0, 9.0, 0.9, 0.9, (9.0, True), []),
    ]  # the last ended before the window: left out
    fold.add(reqs, NOW)
    v = fold.view(NOW)
    g = v.goodput.iloc[0]
    assert (g["requests"], g["met"], g["tokens"]) == (2, 1, 150.0)
    assert g["goodput_tps"] == pytest.approx(100 / 60) and g["throughput_tps"] == pytest.approx(2.5)
    assert v.kv_share_ttft == pytest.approx(0.3) and v.fabric_share_ttft == pytest.approx(0.1)
    assert list(v.bins["kv_transfer_s"]) == [pytest.approx(0.2)]
    assert not v.communication_bound  # one window of requests: nothing rises
