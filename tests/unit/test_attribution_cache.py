"""The analysis kept between scrapes: served again while young, dropped when records
arrive, and the last good one served when an analysis fails."""

from __future__ import annotations

import logging

import pandas as pd
import pytest

from fabricprobe.collector.attribution.analysis import Analysis
from fabricprobe.collector.attribution.cache import AnalysisCache

S = 1_000_000_000


def analysis(now_ns: int) -> Analysis:
    empty = pd.DataFrame()
    return Analysis(now_ns, empty, empty, empty, empty, False, empty, empty, empty)


def test_the_newest_analysis_is_served_while_younger_than_max_age() -> None:
    cache = AnalysisCache()
    assert cache.fresh(0, 1.0) is None
    first = analysis(10 * S)
    cache.keep(first)
    assert cache.fresh(10 * S + S // 2, 1.0) is first
    assert cache.fresh(11 * S, 1.0) is None  # a second old
    cache.invalidate()  # new records
    assert cache.fresh(10 * S, 1.0) is None


def test_a_failed_analysis_is_counted_and_the_last_good_one_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = AnalysisCache()
    good = analysis(S)
    assert cache.or_last(lambda: good) is good
    assert cache.last_good is good

    def broken() -> Analysis:
        raise KeyError("src")

    with caplog.at_level(logging.DEBUG, logger="fabricprobe.collector"):
        assert cache.or_last(broken) is good
        assert cache.or_last(broken) is good
    assert cache.failures_total() == 2
    levels = [r.levelno for r in caplog.records if "analysis failed" in r.getMessage()]
    assert levels == [logging.ERROR, logging.DEBUG]  # said once in full, then counted
    assert AnalysisCache().or_last(broken) is None  # nothing good yet
    assert cache.count_failure() == 3
