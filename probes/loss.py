"""A loss ratio with its uncertainty: the Wilson score interval, and how many exchanges a
run needs before that interval is as narrow as asked.

UD loss is k lost out of n independent exchanges, and k/n is only as good as n. The
Wilson interval stays inside [0, 1] and keeps its coverage at the small ratios a fabric
has (and at k = 0), where the textbook p ± z·sqrt(p(1-p)/n) shrinks to nothing. Its
bounds sit unevenly around k/n; `margin` is the larger of the two distances, so "±1
point" means both bounds lie within a point of the measured ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

CONFIDENCE = 0.95
MAX_EXCHANGES = 10**12  # exchanges_for's search bound: past it the answer is "more than this"


def z_for(confidence: float) -> float:
    """The two-sided standard normal quantile for CONFIDENCE (0.95 -> 1.96)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence!r} outside (0, 1)")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _bounds(ratio: float, n: float, z: float) -> tuple[float, float]:
    z2n = z * z / n
    centre = (ratio + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(ratio * (1 - ratio) / n + z2n / (4 * n))
    # at 0 (or 1) the bound is exactly 0 (1); the subtraction would leave rounding dust
    lo = 0.0 if ratio == 0 else max(0.0, centre - half)
    hi = 1.0 if ratio == 1 else min(1.0, centre + half)
    return lo, hi


def wilson_interval(lost: int, sent: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of the ratio LOST / SENT at CONFIDENCE."""
    if sent < 1 or not 0 <= lost <= sent:
        raise ValueError(f"{lost} lost of {sent} sent: need 0 <= lost <= sent and sent >= 1")
    return _bounds(lost / sent, sent, z_for(confidence))


def _margin(ratio: float, n: float, z: float) -> float:
    lo, hi = _bounds(ratio, n, z)
    return max(ratio - lo, hi - ratio)


def exchanges_for(ratio: float, margin: float = 0.01, confidence: float = CONFIDENCE) -> int:
    """The fewest exchanges whose Wilson interval at RATIO lies within ±MARGIN of it (for
    0.05 and ±1 point: 2,167, where the normal approximation says 1,825; for 0:
    381, the interval then being [0, 1 %])."""
    if not 0 <= ratio <= 1:
        raise ValueError(f"ratio {ratio!r} outside 0..1")
    if not 0 < margin < 1:
        raise ValueError(f"margin {margin!r} outside (0, 1)")
    z = z_for(confidence)
    lo, hi = 1, 1
    while _margin(ratio, hi, z) > margin:  # the margin shrinks as n grows
        lo, hi = hi, hi * 2
        if hi > MAX_EXCHANGES:
            raise ValueError(f"±{margin} needs more than {MAX_EXCHANGES:,} exchanges")
    while lo < hi:
        mid = (lo + hi) // 2
        if _margin(ratio, mid, z) > margin:
            lo = mid + 1
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class LossEstimate:
    """LOST of SENT exchanges, with the Wilson interval [low, high] at CONFIDENCE."""

    sent: int
    lost: int
    confidence: float
    low: float
    high: float

    @classmethod
    def of(cls, lost: int, sent: int, confidence: float = CONFIDENCE) -> LossEstimate:
        low, high = wilson_interval(lost, sent, confidence)
        return cls(sent, lost, confidence, low, high)

    @property
    def answered(self) -> int:
        return self.sent - self.lost

    @property
    def ratio(self) -> float:
        return self.lost / self.sent

    @property
    def margin(self) -> float:
        """The farther bound's distance from the measured ratio."""
        return max(self.ratio - self.low, self.high - self.ratio)

    def exchanges_for(self, margin: float = 0.01) -> int:
        """Exchanges a run at this ratio needs for ±MARGIN."""
        return exchanges_for(self.ratio, margin, self.confidence)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "answered": self.answered,
            "lost": self.lost,
            "ratio": self.ratio,
            "interval": {
                "method": "wilson",
                "confidence": self.confidence,
                "low": self.low,
                "high": self.high,
                "margin": self.margin,
            },
            "exchanges_for_1_point": self.exchanges_for(0.01),
        }
