"""The analysis kept between scrapes: the newest one, served again for a second, and the
last one that did not fail, served when an analysis fails.

A scrape never fails for what one batch of spans held: a failed analysis is counted
(`fabricprobe_attribution_failures_total`), said once in full in the log, and the last
good one is shown instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fabricprobe.collector.attribution.analysis import Analysis

log = logging.getLogger("fabricprobe.collector")


class AnalysisCache:
    """The newest analysis, the last good one and the failures, thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._newest: Analysis | None = None  # dropped when new records arrive
        self.last_good: Analysis | None = None  # what a scrape shows when analysis fails
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

    def or_last(self, analyse: Callable[[], Analysis]) -> Analysis | None:
        """ANALYSE(), or when it fails the last analysis that did not (the failure
        counted): a scrape never fails for what one batch of spans held."""
        try:
            res = analyse()
        except Exception as e:  # pandas raises many kinds; the scrape must go on
            n = self.count_failure()
            first = n == 1
            # said once in full, then counted (fabricprobe_attribution_failures_total)
            log.log(
                logging.ERROR if first else logging.DEBUG,
                "analysis failed (%d so far): %s: %s",
                n,
                type(e).__name__,
                e,
                exc_info=first,
            )
            with self.lock:
                return self.last_good
        with self.lock:
            self.last_good = res
        return res
