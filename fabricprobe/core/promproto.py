"""/metrics in the Prometheus protobuf exposition format, with native histograms.

Prometheus takes native histograms only over protobuf (Debian's 2.42 also only with
`--enable-feature=native-histograms`); it then sends an Accept header that puts
PROTOBUF_TYPE first. A server that asks for it gets `encode()`'s bytes, every other
client the text format with classic `le` buckets: `wants_protobuf()` decides.

A latency family is a `SketchHistogramFamily`: it keeps each series' sketch. The text
writers see its classic buckets as samples (as a HistogramMetricFamily); `encode()`
writes each sketch as a native histogram instead (fabricprobe.core.nativehist) and no
classic buckets: Prometheus 2.42 keeps only the native form of a histogram that has
one (it has no `scrape_classic_histograms`, which came later), so they would be bytes
for nothing. Every other family is written as its samples are, classic histograms
with their buckets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client.core import HistogramMetricFamily, Metric

from fabricprobe.core.api import prom_metrics_pb2 as mpb
from fabricprobe.core.nativehist import SCHEMA, to_native
from fabricprobe.core.sketchwire import MergedSketch

PROTOBUF_TYPE = "application/vnd.google.protobuf"
CONTENT_TYPE_PROTOBUF = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)
_PROTO_PARAMS = {"proto": "io.prometheus.client.metricfamily", "encoding": "delimited"}


def wants_protobuf(accept: str) -> bool:
    """True when ACCEPT (an HTTP Accept header) prefers the delimited MetricFamily
    protobuf to anything else: its q is above 0 and no other range has a higher one.

    Bounded: a header past 4 KiB or 64 ranges is read as not asking for protobuf."""
    if not accept or len(accept) > 4096:
        return False
    proto_q, other_q = 0.0, 0.0
    ranges = accept.split(",")
    if len(ranges) > 64:
        return False
    for part in ranges:
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        params: dict[str, str] = {}
        for f in fields[1:]:
            k, _, v = f.partition("=")
            params[k.strip().lower()] = v.strip().strip('"').lower()
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 0.0
        if not 0.0 <= q <= 1.0 or math.isnan(q):
            q = 0.0
        if media == PROTOBUF_TYPE:
            if all(params.get(k) == v for k, v in _PROTO_PARAMS.items()):
                proto_q = max(proto_q, q)
        elif media:
            other_q = max(other_q, q)
    return proto_q > 0.0 and proto_q >= other_q


class SketchHistogramFamily(HistogramMetricFamily):
    """A histogram family whose series keep their latency sketches.

    Its classic samples (CLASSIC(sketch) -> cumulative buckets and sum) are built only
    when a text writer reads `samples`: a protobuf scrape never pays for them.
    CLASSIC=None leaves them out of the text form too (its HELP and TYPE stay), for an
    endpoint whose series budget has no room for them."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        classic: Callable[[MergedSketch], tuple[list[tuple[str, float]], float]] | None,
        schema: int = SCHEMA,
    ) -> None:
        self._built: list[Any] = []
        self._pending = 0  # sketches whose classic samples are not built yet
        super().__init__(name, documentation, labels=labels)
        self.classic, self.schema = classic, schema
        self.sketches: list[tuple[list[str], MergedSketch]] = []

    @property
    def samples(self) -> list[Any]:
        if self.classic is not None and self._pending:
            todo, self._pending = self.sketches[len(self.sketches) - self._pending :], 0
            for values, sketch in todo:
                buckets, total = self.classic(sketch)
                self.add_metric(values, buckets, total)
        return self._built

    @samples.setter
    def samples(self, value: list[Any]) -> None:
        self._built = value

    def add_sketch(self, label_values: list[str], sketch: MergedSketch) -> None:
        self.sketches.append((label_values, sketch))
        self._pending += 1


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _labels(m: Any, labels: dict[str, str]) -> None:
    for k, v in labels.items():
        lp = m.label.add()
        lp.name = k
        try:
            lp.value = v
        except (ValueError, UnicodeError):  # a lone surrogate (a file name's bytes, say)
            lp.value = v.encode("utf-8", "backslashreplace").decode("utf-8")


def _native(fam: SketchHistogramFamily) -> mpb.MetricFamily:
    out = mpb.MetricFamily(name=fam.name, help=fam.documentation, type=mpb.HISTOGRAM)
    names = fam._labelnames
    for values, sketch in fam.sketches:
        nh = to_native(sketch, fam.schema)
        m = out.metric.add()
        _labels(m, dict(zip(names, values, strict=True)))
        h = m.histogram
        h.sample_count, h.sample_sum, h.schema = nh.count, nh.sum_s, nh.schema
        h.zero_threshold, h.zero_count = nh.zero_threshold, nh.zero_count
        spans, deltas = nh.spans()
        for off, length in spans:
            h.positive_span.add(offset=off, length=length)
        h.positive_delta.extend(deltas)
    return out


_SIMPLE = {"gauge": mpb.GAUGE, "info": mpb.GAUGE, "stateset": mpb.GAUGE, "unknown": mpb.UNTYPED}


def _family(metric: Metric) -> mpb.MetricFamily | None:
    """METRIC as a MetricFamily message, or None when it has nothing to say."""
    if isinstance(metric, SketchHistogramFamily):
        return _native(metric) if metric.sketches else None
    mtype, name = metric.type, metric.name
    if mtype == "counter":
        fam_name, kind = name + "_total", mpb.COUNTER
    elif mtype == "info":
        fam_name, kind = name + "_info", mpb.GAUGE
    elif mtype in _SIMPLE:
        fam_name, kind = name, _SIMPLE[mtype]
    elif mtype in ("histogram", "gaugehistogram"):
        fam_name = name
        kind = mpb.HISTOGRAM if mtype == "histogram" else mpb.GAUGE_HISTOGRAM
    elif mtype == "summary":
        fam_name, kind = name, mpb.SUMMARY
    else:
        return None
    out = mpb.MetricFamily(name=fam_name, help=metric.documentation, type=kind)
    if kind in (mpb.COUNTER, mpb.GAUGE, mpb.UNTYPED):
        for s in metric.samples:
            if s.name != fam_name:  # _created and the like: not carried here
                continue
            m = out.metric.add()
            _labels(m, s.labels)
            if kind == mpb.COUNTER:
                m.counter.value = s.value
            elif kind == mpb.GAUGE:
                m.gauge.value = s.value
            else:
                m.untyped.value = s.value
            if s.timestamp is not None:
                m.timestamp_ms = int(float(s.timestamp) * 1000)
        return out
    # Histograms and summaries: their samples grouped into one message per label set.
    series: dict[tuple[tuple[str, str], ...], Any] = {}
    for s in metric.samples:
        own = {k: v for k, v in s.labels.items() if k not in ("le", "quantile")}
        key = tuple(own.items())
        sm = series.get(key)
        if sm is None:
            sm = series[key] = out.metric.add()
            _labels(sm, own)
        suffix = s.name[len(name) :]
        if kind == mpb.SUMMARY:
            if suffix == "":
                sm.summary.quantile.add(quantile=float(s.labels["quantile"]), value=s.value)
            elif suffix == "_count":
                sm.summary.sample_count = int(s.value)
            elif suffix == "_sum":
                sm.summary.sample_sum = s.value
            continue
        if suffix == "_bucket":
            le = float(s.labels["le"])
            if not math.isinf(le):  # +Inf is the sample count
                sm.histogram.bucket.add(cumulative_count=int(s.value), upper_bound=le)
        elif suffix in ("_count", "_gcount"):
            sm.histogram.sample_count = int(s.value)
        elif suffix in ("_sum", "_gsum"):
            sm.histogram.sample_sum = s.value
    return out


def encode(metrics: Iterable[Metric]) -> bytes:
    """METRICS (a registry's collect()) as delimited MetricFamily messages."""
    out: list[bytes] = []
    for metric in metrics:
        fam = _family(metric)
        if fam is None or not fam.metric:
            continue
        body = fam.SerializeToString()
        out.append(_varint(len(body)))
        out.append(body)
    return b"".join(out)


def decode(data: bytes) -> list[mpb.MetricFamily]:
    """encode()'s bytes read back (tests and benchmarks); ValueError when truncated."""
    out: list[mpb.MetricFamily] = []
    pos = 0
    while pos < len(data):
        n, shift = 0, 0
        while True:
            if pos >= len(data) or shift > 63:
                raise ValueError("truncated length prefix")
            b = data[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if pos + n > len(data):
            raise ValueError("truncated message")
        out.append(mpb.MetricFamily.FromString(data[pos : pos + n]))
        pos += n
    return out
