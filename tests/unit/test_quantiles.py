"""The quantile sketch against the exact quantile pandas gives: equal while it keeps the
values, within its stated accuracy once it buckets them, merged as if added at once."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricprobe.core.quantiles import ALPHA, EXACT_MAX, QuantileSketch

# magnitudes the collector folds: seconds per byte (1e-12) to seconds (1e3), rates
finite = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.floats(min_value=1e-12, max_value=1e-3),
    st.just(0.0),
)
quantiles = st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 0.99, 1.0])


def sketch_of(values: list[float]) -> QuantileSketch:
    s = QuantileSketch()
    s.add_many(values)
    return s


def bound(values: list[float], q: float) -> float:
    """How far the sketch may be from pandas' Q quantile: ALPHA of the larger magnitude
    of the two values pandas interpolates between."""
    vals = sorted(values)
    rank = q * (len(vals) - 1)
    lo, hi = vals[math.floor(rank)], vals[math.ceil(rank)]
    return ALPHA * max(abs(lo), abs(hi)) * (1 + 1e-9) + 1e-300


@settings(max_examples=300, deadline=None)
@given(st.lists(finite, min_size=1, max_size=400), quantiles)
def test_within_the_stated_accuracy_of_pandas(values: list[float], q: float) -> None:
    exact = float(pd.Series(values).quantile(q))
    got = sketch_of(values).quantile(q)
    assert abs(got - exact) <= bound(values, q)
    assert min(values) <= got <= max(values)


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=EXACT_MAX), quantiles)
def test_exact_while_small(values: list[float], q: float) -> None:
    exact = float(pd.Series(values).quantile(q))
    assert sketch_of(values).quantile(q) == pytest.approx(exact, rel=1e-12, abs=1e-300)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(finite, max_size=60), min_size=1, max_size=6), quantiles)
def test_merged_parts_answer_as_all_the_values_at_once(parts: list[list[float]], q: float) -> None:
    merged = QuantileSketch()
    for p in parts:
        merged.merge(sketch_of(p))
    every = [v for p in parts for v in p]
    whole = sketch_of(every)
    assert merged.count == whole.count == len(every)
    if every:
        assert merged.quantile(q) == pytest.approx(whole.quantile(q), rel=1e-12, abs=1e-300)
        assert abs(merged.quantile(q) - float(np.quantile(every, q))) <= bound(every, q) * 1.0001


def test_nan_and_infinities_are_left_out_and_empty_is_nan() -> None:
    s = sketch_of([math.nan, math.inf, -math.inf])
    assert s.count == 0 and math.isnan(s.median())
    s.add_many([1.0, math.nan, 3.0])
    assert s.median() == 2.0
    with pytest.raises(ValueError):
        s.quantile(1.5)


def test_a_copy_is_apart_and_buckets_stay_few() -> None:
    s = sketch_of([float(i) for i in range(1, 10_001)])
    c = s.copy()
    c.add(1e9)
    assert s.count == 10_000 and c.count == 10_001
    assert len(s.pos) < 500  # four decades at 1 %
    assert s.median() == pytest.approx(5000.5, rel=ALPHA)
