"""Wilson intervals for loss ratios and the exchanges a run needs for ±1 point."""

from __future__ import annotations

import numpy as np
import pytest

from fabricprobe.probes.loss import LossEstimate, exchanges_for, wilson_interval, z_for
from tests.support.wilson import margin_at


@pytest.mark.parametrize(
    ("lost", "sent", "low", "high"),
    [
        # Newcombe, Statistics in Medicine 17 (1998) 857-872, table I, method 3 (Wilson)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        (29, 29, 0.8830, 1.0),
    ],
)
def test_wilson_matches_published_intervals(lost: int, sent: int, low: float, high: float) -> None:
    lo, hi = wilson_interval(lost, sent)
    assert (round(lo, 4), round(hi, 4)) == (low, high)


def test_no_loss_has_an_exact_zero_bound_and_all_loss_an_exact_one() -> None:
    assert wilson_interval(0, 1000)[0] == 0.0
    assert wilson_interval(1000, 1000)[1] == 1.0


def test_coverage_is_near_the_confidence_at_fabric_loss_ratios() -> None:
    """At 2 % and 1,000 exchanges the interval holds the true ratio about 95 % of the time
    (the normal approximation's would cover visibly less)."""
    rng = np.random.default_rng(7)
    lost = rng.binomial(1000, 0.02, size=4000)
    covered = sum(lo <= 0.02 <= hi for lo, hi in (wilson_interval(int(k), 1000) for k in lost))
    assert 0.93 <= covered / len(lost) <= 0.97


@pytest.mark.parametrize(
    ("ratio", "want"), [(0.0, 381), (0.02, 1118), (0.05, 2167), (0.0975, 3686), (0.5, 9600)]
)
def test_exchanges_for_one_point_is_the_smallest_that_gets_there(ratio: float, want: int) -> None:
    n = exchanges_for(ratio, 0.01)
    assert n == want
    assert margin_at(ratio, n) <= 0.01 < margin_at(ratio, n - 1)
    # at small ratios Wilson's upper bound lies farther out than the normal approximation's
    # half-width, so it asks for more exchanges; at 0.5 it pulls in and asks for fewer
    normal = z_for(0.95) ** 2 * ratio * (1 - ratio) / 1e-4
    assert n > normal if ratio <= 0.1 else n < normal


def test_a_tighter_margin_or_confidence_needs_more() -> None:
    assert exchanges_for(0.05, 0.005) > exchanges_for(0.05, 0.01) > exchanges_for(0.05, 0.02)
    assert exchanges_for(0.05, 0.01, 0.99) > exchanges_for(0.05, 0.01, 0.95)


def test_estimate_figures_and_json() -> None:
    e = LossEstimate.of(39, 2000)
    assert (e.sent, e.answered, e.lost, e.ratio) == (2000, 1961, 39, 0.0195)
    assert e.low < e.ratio < e.high and e.margin == pytest.approx(e.high - e.ratio)
    d = e.as_dict()
    assert d["interval"]["method"] == "wilson" and d["interval"]["confidence"] == 0.95
    assert d["exchanges_for_1_point"] == exchanges_for(0.0195) and d["answered"] == 1961


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: wilson_interval(1, 0), "sent >= 1"),
        (lambda: wilson_interval(-1, 10), "lost <= sent"),
        (lambda: wilson_interval(11, 10), "lost <= sent"),
        (lambda: wilson_interval(1, 10, 1.0), "confidence"),
        (lambda: exchanges_for(1.5), "ratio"),
        (lambda: exchanges_for(0.1, 0.0), "margin"),
        (lambda: exchanges_for(0.5, 1e-9), "more than"),
    ],
)
def test_bad_input_is_a_value_error(call: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        call()  # type: ignore[operator]
