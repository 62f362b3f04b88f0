"""The analysis kept between queries: the newest one, served again for a second; and the
last view of the fold that did not fail, served when one fails.

A scrape never fails for what one batch of spans held: a failed view (or analysis) is
counted (`fabricprobe_attribution_failures_total`), said once in full in the log, and
the last good one is shown instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from fabricprobe.collector.attribution.analysis import Analysis

log = logging.getLogger("fabricprobe.collector")
T = TypeVar("T")


class AnalysisCache:
    """The newest analysis, the last good one and the failures, thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._newest: Analysis | None = None  # dropped when new records arrive
        self.last_good: Any = None  # what a scrape shows when the next one fails
        self.failures = 0

    def fresh(self, now_ns: int, max_age_s: float) -> Analysis | None:
        """The newest analysis when it is younger than MAX_AGE_S and no record came since."""
        with self.lock:
            got = self._newest
        if got is not None and (now_ns - got.now_ns) / 1e9 < max_age_s:
            return got
        return None

    def keep(self, res: Analysis) -> None:
        with self.lock:
            self._newest = res

    def invalidate(self) -> None:
        """New records arrived: the next analysis is made afresh."""
        with self.lock:
            self._newest = None

    def count_failure(self) -> int:
        """Count one failed analysis; the failures so far."""
        with self.lock:
            self.failures += 1
            return self.failures

    def failures_total(self) -> int:
        with self.lock:
            return self.failures

    def or_last(self, make: Callable[[], T]) -> T | None:
        """MAKE(), or when it fails the last one that did not (the failure counted): a
        scrape never fails for what one batch of spans held."""
        try:
            res = make()
        except Exception as e:  # pandas raises many kinds; the scrape must go on
            self.failed(e)
            with self.lock:
                return cast(T | None, self.last_good)
        with self.lock:
            self.last_good = res
        return res

    def failed(self, e: Exception) -> None:
        """Count a failed analysis (or join of a settled request), said once in full in
        the log, then counted (fabricprobe_attribution_failures_total)."""
        n = self.count_failure()
        first = n == 1
        log.log(
            logging.ERROR if first else logging.DEBUG,
            "analysis failed (%d so far): %s: %s",
            n,
            type(e).__name__,
            e,
            exc_info=first,
        )
