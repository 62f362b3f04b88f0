"""A latency sketch as a Prometheus native histogram (exponential buckets, one series).

Native bucket i of schema s covers (2^((i-1)/2^s), 2^(i/2^s)] seconds: every bucket is
2^(2^-s) times as wide as the one below it. The sketch is an HDR histogram of 2
significant digits: its slots are at most 1/128 (0.78 %) of their value wide from
256 ns up and one nanosecond wide below.

Conversion, and the error it adds: each HDR slot is counted whole in the native bucket
that holds the slot's highest value — the value the sketch's own percentiles and its
classic `le` buckets report for it. So any quantile read from the native histogram
(Prometheus interpolates inside one bucket) lies in the same native bucket as the
sketch's own percentile of that rank: within a factor 2^(2^-s) of it, 1.09 % at
SCHEMA 6 (2.19 % at schema 5). Against the recorded value itself the HDR slot adds its
width: at most a factor 2^(1/64) x (1 + 1/128) = 1.019 at schema 6. Count and sum are
carried exactly (the sum as the float of the exact nanosecond total). Values of 0 ns
(only a slot index 0 can hold them; probes record at least 1 ns) go to the zero bucket,
whose threshold ZERO_THRESHOLD_S lies below the sketch's lowest value, 1 ns.

Why schema 6: at schema 5 a bucket (2.19 %) is coarser than the sketch's 1 %; at schema
7 (0.54 %) a series has twice the buckets for a resolution the sketch does not have.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from fabricprobe.core.sketchwire import MAX_SLOTS, MergedSketch, slot_value_ns

SCHEMA = 6
MIN_SCHEMA, MAX_SCHEMA = -4, 8
# Below the sketch's lowest value (1 ns) and above 0: a threshold > 0 is also what marks
# a protobuf histogram as native for Prometheus 2.42, even one with no observations yet.
ZERO_THRESHOLD_S = 2.0**-128


@lru_cache(maxsize=MAX_SCHEMA + 1)
def _bounds(schema: int) -> tuple[float, ...]:
    """Bucket upper bounds inside one power of two, as math.frexp mantissas in [0.5, 1)."""
    n = 1 << schema
    return tuple(0.5 * 2.0 ** (j / n) for j in range(n))


def bucket_index(x: float, schema: int = SCHEMA) -> int:
    """The index of the native bucket that holds X (> 0) at SCHEMA.

    Exact at bucket boundaries for schema <= 0 and as exact as 2^(j/2^s) is in floating
    point above: the mantissa is compared, not a logarithm."""
    if not MIN_SCHEMA <= schema <= MAX_SCHEMA:
        raise ValueError(f"schema {schema} outside {MIN_SCHEMA}..{MAX_SCHEMA}")
    if not x > 0 or math.isinf(x):
        raise ValueError(f"no native bucket holds {x}")
    frac, exp = math.frexp(x)  # x = frac * 2^exp, frac in [0.5, 1)
    if schema > 0:
        return bisect.bisect_left(_bounds(schema), frac) + (exp - 1) * (1 << schema)
    # Coarse schemas: one bucket spans 2^(2^-schema) powers of two.
    idx = exp - 1 if frac == 0.5 else exp
    return (idx + (1 << -schema) - 1) >> -schema


@dataclass(frozen=True)
class NativeHistogram:
    """What a native histogram sample carries: exact count and sum, the zero bucket, and
    the positive buckets in their protobuf form: SPANS of consecutive buckets (offset,
    length; the first offset is the first index, each later one the gap after the span
    before it) and DELTAS, each bucket's count minus the one before it. Gaps of one or
    two empty buckets are carried as zero counts inside a span: two deltas cost less
    than a new span."""

    schema: int
    count: int
    sum_s: float
    zero_threshold: float
    zero_count: int
    spans: tuple[tuple[int, int], ...]
    deltas: tuple[int, ...]

    @property
    def buckets(self) -> tuple[tuple[int, int], ...]:
        """The non-empty positive buckets as ascending (index, count) pairs."""
        out: list[tuple[int, int]] = []
        idx, count, k = 0, 0, 0
        for i, (off, length) in enumerate(self.spans):
            idx = off if i == 0 else idx + off
            for _ in range(length):
                count += self.deltas[k]
                k += 1
                if count:
                    out.append((idx, count))
                idx += 1
        return tuple(out)


@lru_cache(maxsize=MAX_SCHEMA - MIN_SCHEMA + 1)
def slot_buckets(schema: int) -> tuple[int | None, ...]:
    """HDR slot index -> the native bucket of its highest value (None: the zero bucket),
    for every slot of the sketch: a scrape converts by lookup, not by logarithm."""
    out: list[int | None] = []
    for slot in range(MAX_SLOTS):
        v_ns = slot_value_ns(slot)
        out.append(bucket_index(v_ns / 1e9, schema) if v_ns > 0 else None)
    return tuple(out)


def native_buckets(sketch: MergedSketch, schema: int = SCHEMA) -> tuple[list[tuple[int, int]], int]:
    """SKETCH's slots summed into native buckets of SCHEMA: ascending (index, count) of the
    non-empty ones, and the zero bucket's count."""
    table = slot_buckets(schema)
    out: list[tuple[int, int]] = []
    zero = 0
    cur, acc = 0, 0  # the bucket being summed (slots ascend, so bucket indices do too)
    for slot, n in sorted(sketch.slots.items()):
        if n <= 0:
            continue
        if 0 <= slot < MAX_SLOTS:
            idx = table[slot]
        else:  # not from a validated sketch: converted the long way
            v_ns = slot_value_ns(slot)
            idx = bucket_index(v_ns / 1e9, schema) if v_ns > 0 else None
        if idx is None:
            zero += n
        elif acc and idx == cur:
            acc += n
        else:
            if acc:
                out.append((cur, acc))
            cur, acc = idx, n
    if acc:
        out.append((cur, acc))
    return out, zero


def encode(
    buckets: Iterable[tuple[int, int]], zero: int, count: int, sum_ns: int, schema: int = SCHEMA
) -> NativeHistogram:
    """A native histogram of ascending non-empty BUCKETS (index, count) and ZERO."""
    offsets: list[int] = []
    lengths: list[int] = []
    deltas: list[int] = []
    prev, end = 0, 0  # the count of the bucket last written; the index after its span
    for idx, n in buckets:
        gap = idx - end
        if offsets and gap <= 2:  # the span goes on, over up to two empty buckets
            for _ in range(gap):
                deltas.append(-prev)
                prev = 0
            lengths[-1] += gap + 1
        else:
            offsets.append(gap if offsets else idx)
            lengths.append(1)
        deltas.append(n - prev)
        prev, end = n, idx + 1
    return NativeHistogram(
        schema=schema,
        count=count,
        sum_s=sum_ns / 1e9,
        zero_threshold=ZERO_THRESHOLD_S,
        zero_count=zero,
        spans=tuple(zip(offsets, lengths, strict=True)),
        deltas=tuple(deltas),
    )


def to_native(sketch: MergedSketch, schema: int = SCHEMA) -> NativeHistogram:
    """SKETCH as a native histogram of SCHEMA (see the module's note for the error)."""
    buckets, zero = native_buckets(sketch, schema)
    return encode(buckets, zero, sketch.count, sketch.sum_ns, schema)
