"""Fast reading and merging of latency sketches as they travel (LatencySketch.encode()).

The collector takes thousands of window sketches per second. Decoding each into a full
LatencySketch allocates two 3,968-slot HDR histograms (~90 µs); a window of a few
dozen exchanges fills only a handful of slots. So the collector reads the wire form
itself: `kind|count|lost|min|max|sum|<base64 HDR V2>`, where the HDR part is an 8-byte
header (cookie, length) and a zlib stream of a 40-byte payload header and ZigZag
LEB128 varints (a positive value is the count of the next slot, a negative one skips
that many empty slots). Only non-empty slots are kept, as {slot index: count}; merging
is adding those up, exactly as HdrHistogram.add does, and percentiles and Prometheus
buckets are read from them. Slot values come from HdrHistogram itself, so the index
space is the one LatencySketch records into; a sketch with other HDR settings is
refused rather than misread.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import struct
import zlib
from dataclasses import dataclass, field
from functools import lru_cache

from hdrh.histogram import HdrHistogram

from probes.errors import ParseError
from probes.stats import HIGHEST_NS, LOWEST_NS, SIGNIFICANT_DIGITS

_EXT = struct.Struct(">II")  # cookie, length of the zlib part
_PAYLOAD = struct.Struct(">IIIIqqd")  # cookie, len, normalizing offset, digits, lo, hi, ratio
_COOKIE_BASE = 0x1C849303  # V2 encoding cookie, word-size nibble masked off
_COMPRESSED_BASE = 0x1C849304
_TEMPLATE = HdrHistogram(LOWEST_NS, HIGHEST_NS, SIGNIFICANT_DIGITS)
MAX_SLOTS = _TEMPLATE.counts_len
MAX_BLOB = 64 << 10


@lru_cache(maxsize=MAX_SLOTS)
def slot_value_ns(index: int) -> int:
    """Highest value (ns) that HDR slot INDEX stands for, as LatencySketch.buckets() gives."""
    return int(_TEMPLATE.get_highest_equivalent_value(_TEMPLATE.get_value_from_index(index)))


def _varints(data: bytes, start: int, end: int) -> dict[int, int]:
    """Decode the ZigZag LEB128 counts stream into {slot: count} for non-empty slots."""
    slots: dict[int, int] = {}
    index = 0
    pos = start
    while pos < end:
        b = data[pos]
        pos += 1
        value = b & 0x7F
        if b & 0x80:  # more bytes follow (most counts and skips fit in one or two)
            shift = 7
            while True:
                if pos >= end:
                    raise ParseError("truncated varint in latency sketch")
                b = data[pos]
                pos += 1
                if shift == 56:  # the ninth byte carries eight bits
                    value |= b << 56
                    break
                value |= (b & 0x7F) << shift
                if not b & 0x80:
                    break
                shift += 7
        n = (value >> 1) ^ -(value & 1)
        if n < 0:
            index -= n
        else:
            if n:
                slots[index] = n
            index += 1
    if index > MAX_SLOTS:
        raise ParseError("latency sketch has more slots than its histogram")
    return slots


@dataclass
class MergedSketch:
    """One or many windows' sketches folded together (same kind); exact in count, lost,
    min, max and sum; HDR slots {index: count} for everything else."""

    kind: str = "rtt"
    count: int = 0
    lost: int = 0
    min_ns: int | None = None
    max_ns: int | None = None
    sum_ns: int = 0
    slots: dict[int, int] = field(default_factory=dict)

    def merge(self, sk: MergedSketch) -> None:
        if sk.kind != self.kind:
            raise ValueError(f"cannot merge a {sk.kind} sketch into a {self.kind} sketch")
        self.count += sk.count
        self.lost += sk.lost
        self.sum_ns += sk.sum_ns
        if sk.min_ns is not None and (self.min_ns is None or sk.min_ns < self.min_ns):
            self.min_ns = sk.min_ns
        if sk.max_ns is not None and (self.max_ns is None or sk.max_ns > self.max_ns):
            self.max_ns = sk.max_ns
        slots = self.slots
        for i, n in sk.slots.items():
            slots[i] = slots.get(i, 0) + n

    def percentile_ns(self, p: float) -> int | None:
        """Value at percentile P (0-100) as HdrHistogram gives it, clamped into [min, max]."""
        if not self.count:
            return None
        want = max(1, int(self.count * p / 100.0 + 0.5))  # as HdrHistogram rounds
        running = 0
        for i in sorted(self.slots):
            running += self.slots[i]
            if running >= want:
                v = slot_value_ns(i)
                break
        else:
            v = self.max_ns or 0
        assert self.min_ns is not None and self.max_ns is not None
        return max(self.min_ns, min(v, self.max_ns))

    def cumulative(self, bounds_ns: list[int]) -> list[int]:
        """Counts at or below each bound (Prometheus `le` buckets), then the total."""
        per = [0] * (len(bounds_ns) + 1)
        for i, n in self.slots.items():
            per[bisect.bisect_left(bounds_ns, slot_value_ns(i))] += n
        out, running = [], 0
        for n in per:
            running += n
            out.append(running)
        return out

    @property
    def loss_ratio(self) -> float:
        total = self.count + self.lost
        return self.lost / total if total else 0.0


def parse_sketch(blob: bytes) -> MergedSketch:
    """Read LatencySketch.encode() output; ParseError for anything malformed."""
    if len(blob) > MAX_BLOB:
        raise ParseError(f"latency sketch of {len(blob)} bytes is too large")
    try:
        kind, count, lost, mn, mx, total, hist = blob.split(b"|", 6)
        sk = MergedSketch(
            kind=kind.decode(),
            count=int(count),
            lost=int(lost),
            min_ns=int(mn) if mn else None,
            max_ns=int(mx) if mx else None,
            sum_ns=int(total),
            slots={},
        )
    except (ValueError, UnicodeDecodeError) as e:
        raise ParseError(f"malformed latency sketch: {e}") from None
    if sk.kind not in ("rtt", "one_way"):
        raise ParseError(f"malformed latency sketch: unknown kind {sk.kind!r}")
    if sk.count < 0 or sk.lost < 0 or sk.sum_ns < 0:
        raise ParseError("malformed latency sketch: negative count")
    if not sk.count:
        if hist:
            raise ParseError("malformed latency sketch: histogram present with zero count")
        return sk
    if sk.min_ns is None or sk.max_ns is None or sk.min_ns > sk.max_ns:
        raise ParseError("malformed latency sketch: min/max missing or inverted")
    try:
        raw = base64.b64decode(hist, validate=True)
        cookie, length = _EXT.unpack_from(raw)
        if cookie & ~0xF0 != _COMPRESSED_BASE or length != len(raw) - _EXT.size:
            raise ParseError("malformed latency sketch: bad histogram header")
        payload = zlib.decompressobj().decompress(raw[_EXT.size :], _PAYLOAD.size + 9 * MAX_SLOTS)
        p_cookie, p_len, offset, digits, lo, hi, _ = _PAYLOAD.unpack_from(payload)
    except (binascii.Error, struct.error, zlib.error) as e:
        raise ParseError(f"malformed latency sketch: {e}") from None
    if p_cookie & ~0xF0 != _COOKIE_BASE or p_len != len(payload) - _PAYLOAD.size or offset:
        raise ParseError("malformed latency sketch: bad histogram payload")
    if (digits, lo, hi) != (SIGNIFICANT_DIGITS, LOWEST_NS, HIGHEST_NS):
        raise ParseError(f"latency sketch with other HDR settings ({digits}, {lo}, {hi})")
    sk.slots = _varints(payload, _PAYLOAD.size, len(payload))
    if sum(sk.slots.values()) != sk.count:
        raise ParseError("malformed latency sketch: histogram total does not match count")
    return sk


def merged(sk: MergedSketch) -> MergedSketch:
    """A copy of SK that can take further merges without changing SK."""
    m = MergedSketch(kind=sk.kind)
    m.merge(sk)
    return m
