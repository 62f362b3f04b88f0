"""A path's RTT over all its windows, kept at the resolution the export serves and no finer.

The collector exports each path's RTT as a Prometheus histogram, which counts from the
path's first window on: classic `le` buckets (RTT_BUCKETS_S) and a native histogram of
nativehist.SCHEMA. A merged HDR sketch would serve both, but its slot dictionary grows
with every latency value the path ever showed (about 9 KiB at 300 slots, 36 KiB once the
tail has spread over a thousand), for as long as the path lives: at 16,000 paths that is
the collector's memory growing for hours. `CumulativeSketch` keeps instead what the two
forms are computed from, folded in as each window arrives: per-bucket counts at the
classic bounds (where the merged sketch's `cumulative()` would put each slot) and counts
per native bucket (where `to_native()` would), in a dense array over the native buckets
seen, 8 bytes a bucket. Both exports come out equal to those of the merged sketch;
count, loss, sum, min and max stay exact.

The native buckets are also what the Query API reads a path's whole distribution from
(`probe report`): `percentiles_ns()` gives the middle of the native bucket that holds
each rank, within 0.54 % of the merged sketch's own percentile (which lies in that
bucket, see nativehist), and `cdf_buckets()` the buckets themselves, at SCHEMA or
coarser when a bound on their number asks for it.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Sequence
from itertools import accumulate

from fabricprobe.core.nativehist import (
    MIN_SCHEMA,
    SCHEMA,
    NativeHistogram,
    encode,
    native_buckets,
)
from fabricprobe.core.sketchwire import MergedSketch, slot_value_ns
from fabricprobe.core.stats import Exact, Kind, checked_percentiles, merge_exact

# RTT bucket upper bounds in seconds: 1-2-5 steps from 1 µs to 10 s, so that a
# soft-RoCE loopback (tens of µs), a real RoCE fabric (a few µs) and a congested
# TCP path (ms to s) each land in several buckets.
RTT_BUCKETS_S: tuple[float, ...] = tuple(
    m * 10.0**e for e in range(-6, 2) for m in (1.0, 2.0, 5.0) if m * 10.0**e <= 10.0
)
RTT_BUCKETS_NS: tuple[int, ...] = tuple(round(b * 1e9) for b in RTT_BUCKETS_S)


def bucket_upper_ns(index: int, schema: int = SCHEMA) -> float:
    """The upper bound (ns) of native bucket INDEX of SCHEMA: 2^(index / 2^schema) s."""
    return 2.0 ** (index / 2.0**schema) * 1e9


class CumulativeSketch(Exact):
    """Windows' sketches folded for export (see the module docstring)."""

    __slots__ = ("base", "classic", "native", "zero")

    def __init__(self, kind: Kind = "rtt") -> None:
        super().__init__(kind)
        # counts per classic bucket: [i] at or below RTT_BUCKETS_NS[i], the last above all
        self.classic = array("q", bytes(8 * (len(RTT_BUCKETS_NS) + 1)))
        self.base = 0  # the native bucket index of native[0]
        self.native = array("q")  # counts per native bucket from base on
        self.zero = 0  # native zero bucket (0 ns)

    def merge(self, sk: MergedSketch) -> None:
        """Fold one window's sketch in (same kind)."""
        merge_exact(self, sk)
        classic = self.classic
        for slot, n in sk.slots.items():
            classic[bisect.bisect_left(RTT_BUCKETS_NS, slot_value_ns(slot))] += n
        buckets, zero = native_buckets(sk, SCHEMA)
        self.zero += zero
        if not buckets:
            return
        lo, hi = buckets[0][0], buckets[-1][0]
        native = self.native
        if not native:
            self.base = lo
        if lo < self.base:  # room below: the array grows at its front
            self.native = native = array("q", bytes(8 * (self.base - lo))) + native
            self.base = lo
        if hi - self.base >= len(native):
            native.frombytes(bytes(8 * (hi - self.base + 1 - len(native))))
        base = self.base
        for idx, n in buckets:
            native[idx - base] += n

    def cumulative(self, bounds_ns: tuple[int, ...] = RTT_BUCKETS_NS) -> list[int]:
        """Counts at or below each of the classic bounds, then the total (as
        MergedSketch.cumulative gives them); only the bounds it was kept at."""
        if tuple(bounds_ns) != RTT_BUCKETS_NS:
            raise ValueError("a CumulativeSketch holds counts at RTT_BUCKETS_NS only")
        out, running = [], 0
        for n in self.classic:
            running += n
            out.append(running)
        return out

    def buckets(self) -> Iterator[tuple[int, int]]:
        """Ascending (native bucket index, count) of the non-empty native buckets."""
        base = self.base
        return ((base + i, n) for i, n in enumerate(self.native) if n)

    def to_native(self, schema: int = SCHEMA) -> NativeHistogram:
        """As nativehist.to_native() gives the merged sketch; only at SCHEMA."""
        if schema != SCHEMA:
            raise ValueError(f"a CumulativeSketch holds native buckets at schema {SCHEMA} only")
        return encode(self.buckets(), self.zero, self.count, self.sum_ns, schema)

    def percentiles_ns(self, ps: Sequence[float]) -> list[float | None]:
        """The value at each percentile of PS (0-100), as the merged sketch counts ranks:
        the geometric middle of the native bucket holding the rank, clamped into
        [min, max]. None when empty. The merged sketch's own percentile lies in the same
        bucket (each slot is counted whole in the bucket of its highest value), so this
        is within half a bucket of it: a factor 2^(2^-SCHEMA / 2), 0.54 % at schema 6."""
        ps = checked_percentiles(ps)
        if not self.count:
            return [None] * len(ps)
        assert self.min_ns is not None and self.max_ns is not None
        lo, hi = self.min_ns, self.max_ns
        running = list(accumulate(self.native, initial=self.zero))  # [0]: the zero bucket
        out: list[float | None] = []
        for p in ps:
            want = max(1, int(self.count * p / 100.0 + 0.5))  # as HdrHistogram rounds
            k = bisect.bisect_left(running, want)
            if k == 0:
                v = 0.0  # the zero bucket
            elif k >= len(running):
                v = float(hi)
            else:
                upper = bucket_upper_ns(self.base + k - 1, SCHEMA)
                v = upper * 2.0 ** (-(2.0**-SCHEMA) / 2)
            out.append(max(float(lo), min(v, float(hi))))
        return out

    def cdf_buckets(self, max_buckets: int) -> tuple[int, list[tuple[int, int]], int]:
        """(schema, ascending (index, count) of the non-empty native buckets, the zero
        bucket's count): at SCHEMA, or at the finest coarser schema (each step halves the
        number of buckets a doubling holds) whose non-empty buckets are at most
        MAX_BUCKETS; at MIN_SCHEMA whatever their number."""
        if max_buckets < 1:
            raise ValueError("max_buckets must be at least 1")
        schema, buckets = SCHEMA, list(self.buckets())
        while len(buckets) > max_buckets and schema > MIN_SCHEMA:
            schema -= 1
            coarse: list[tuple[int, int]] = []
            for idx, n in buckets:  # bucket i of schema s lies in (i + 1) >> 1 of s - 1
                j = (idx + 1) >> 1
                if coarse and coarse[-1][0] == j:
                    coarse[-1] = (j, coarse[-1][1] + n)
                else:
                    coarse.append((j, n))
            buckets = coarse
        return schema, buckets, self.zero

    @property
    def loss_ratio(self) -> float:
        total = self.count + self.lost
        return self.lost / total if total else 0.0

    def copy(self) -> CumulativeSketch:
        """A copy that later merges into this one leave alone."""
        c = CumulativeSketch(self.kind)
        c.count, c.lost, c.sum_ns = self.count, self.lost, self.sum_ns
        c.min_ns, c.max_ns = self.min_ns, self.max_ns
        c.classic, c.base, c.native = array("q", self.classic), self.base, array("q", self.native)
        c.zero = self.zero
        return c
