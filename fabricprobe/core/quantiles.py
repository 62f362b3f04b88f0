"""A mergeable quantile sketch of floats at a stated relative accuracy, exact while small.

The collector folds figures per path as they arrive (collector/attribution/pathfold.py)
and reads their medians and quantiles at a scrape, without the rows. `QuantileSketch`
keeps the values themselves up to EXACT_MAX of them, so a path with few transfers has
the exact quantile pandas would give; past that it keeps counts in logarithmic buckets
(DDSketch's scheme: bucket k holds (γ^(k-1), γ^k] with γ = (1 + α) / (1 - α), and stands
for 2γ^k / (γ + 1)), a few hundred at most over nine decades, negative values and zero
apart. A quantile is taken as pandas takes it, at rank q (n - 1), interpolated between
the two values around that rank; each of those is a bucket's value, within α of the
value it stands for, so the answer is within α · max(|lo|, |hi|) of pandas', where lo and
hi are those two values (for values of one sign: within α of pandas' answer, relatively).
It never leaves [min, max], which are exact. NaN and infinities are not values: they are
left out, as pandas' median leaves NaN out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

ALPHA = 0.01  # relative accuracy of a bucketed value
EXACT_MAX = 32  # values kept as they are before the sketch buckets them
_GAMMA = (1 + ALPHA) / (1 - ALPHA)
_LOG_GAMMA = math.log(_GAMMA)
_MID = 2 / (_GAMMA + 1)  # a bucket's value over its upper bound


def _key(v: float) -> int:
    """The bucket of magnitude V (> 0)."""
    return math.ceil(math.log(v) / _LOG_GAMMA)


def _value(key: int) -> float:
    """The value bucket KEY stands for (within ALPHA of any magnitude it holds)."""
    return _MID * math.exp(key * _LOG_GAMMA)


class QuantileSketch:
    """Floats, exact up to EXACT_MAX of them, then in buckets (see the module docstring)."""

    __slots__ = ("count", "exact", "max", "min", "neg", "pos", "zero")

    def __init__(self) -> None:
        self.count = 0
        self.min = math.inf
        self.max = -math.inf
        self.exact: list[float] | None = []  # the values, until there are too many
        self.pos: dict[int, int] = {}  # bucket -> count, positive values
        self.neg: dict[int, int] = {}  # bucket of |v| -> count, negative values
        self.zero = 0

    def add(self, v: float) -> None:
        """One value (NaN and infinities are left out)."""
        if not math.isfinite(v):
            return
        self.count += 1
        if v < self.min:
            self.min = v
        if v > self.max:
            self.max = v
        if self.exact is not None:
            self.exact.append(v)
            if len(self.exact) > EXACT_MAX:
                self._bucket_all()
            return
        self._bucket(v, 1)

    def add_many(self, values: Iterable[float]) -> None:
        for v in values:
            self.add(v)

    def _bucket(self, v: float, n: int) -> None:
        if v > 0:
            k = _key(v)
            self.pos[k] = self.pos.get(k, 0) + n
        elif v < 0:
            k = _key(-v)
            self.neg[k] = self.neg.get(k, 0) + n
        else:
            self.zero += n

    def _bucket_all(self) -> None:
        held, self.exact = self.exact or [], None
        for v in held:
            self._bucket(v, 1)

    def merge(self, other: QuantileSketch) -> None:
        """Fold OTHER's values in (OTHER is left as it was)."""
        if not other.count:
            return
        self.count += other.count
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        if self.exact is not None and other.exact is not None:
            self.exact.extend(other.exact)
            if len(self.exact) > EXACT_MAX:
                self._bucket_all()
            return
        if self.exact is not None:
            self._bucket_all()
        if other.exact is not None:
            for v in other.exact:
                self._bucket(v, 1)
            return
        for mine, theirs in ((self.pos, other.pos), (self.neg, other.neg)):
            for k, n in theirs.items():
                mine[k] = mine.get(k, 0) + n
        self.zero += other.zero

    def copy(self) -> QuantileSketch:
        c = QuantileSketch()
        c.count, c.min, c.max, c.zero = self.count, self.min, self.max, self.zero
        c.exact = None if self.exact is None else list(self.exact)
        c.pos, c.neg = dict(self.pos), dict(self.neg)
        return c

    def quantile(self, q: float) -> float:
        """The Q quantile (0..1) as pandas interpolates it; NaN when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} outside 0..1")
        if not self.count:
            return math.nan
        rank = q * (self.count - 1)
        lo = math.floor(rank)
        hi = min(lo + 1, self.count - 1)
        if self.exact is not None:
            vals = sorted(self.exact)
            a, b = vals[lo], vals[hi]
        else:
            a, b = self._at(lo), self._at(hi)
        got = a + (b - a) * (rank - lo) if b != a else a
        return min(max(got, self.min), self.max)

    def median(self) -> float:
        return self.quantile(0.5)

    def _at(self, rank: int) -> float:
        """The value of the bucket holding the RANK-th smallest value (0-based)."""
        seen = 0
        for k in sorted(self.neg, reverse=True):  # the most negative first
            seen += self.neg[k]
            if seen > rank:
                return -_value(k)
        seen += self.zero
        if seen > rank:
            return 0.0
        for k in sorted(self.pos):
            seen += self.pos[k]
            if seen > rank:
                return _value(k)
        return self.max  # pragma: no cover  # the counts add up to count
