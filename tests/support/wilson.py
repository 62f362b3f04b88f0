"""The Wilson score interval written out on its own, as the loss tests' oracle for
fabricprobe.probes.loss (which the product computes its exchange counts with)."""

from __future__ import annotations

import math
from statistics import NormalDist


def margin_at(ratio: float, n: int, confidence: float = 0.95) -> float:
    """How far the farther Wilson bound lies from RATIO measured over N exchanges."""
    if n < 1 or not 0 <= ratio <= 1:
        raise ValueError(f"ratio {ratio!r} over {n} exchanges: need 0..1 and n >= 1")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    denom = 1 + z * z / n
    centre = (ratio + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(ratio * (1 - ratio) / n + z * z / (4 * n * n))
    lo = 0.0 if ratio == 0 else max(0.0, centre - half)
    hi = 1.0 if ratio == 1 else min(1.0, centre + half)
    return max(ratio - lo, hi - ratio)
