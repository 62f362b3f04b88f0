"""Native histograms: the sketch-to-exponential-bucket conversion (exact count and sum,
quantiles within one bucket of the sketch's), the protobuf exposition read back with the
generated classes, and content negotiation on the collector's and the agent's /metrics."""

from __future__ import annotations

import math
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from fabricprobe.agent.exporter import MetricsServer as AgentMetricsServer
from fabricprobe.collector.exporter import FabricCollector
from fabricprobe.collector.exposition import serve_metrics
from fabricprobe.collector.families import sketch_histogram
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.api import prom_metrics_pb2 as mpb
from fabricprobe.core.nativehist import (
    SCHEMA,
    ZERO_THRESHOLD_S,
    bucket_index,
    to_native,
)
from fabricprobe.core.promproto import (
    CONTENT_TYPE_PROTOBUF,
    SketchHistogramFamily,
    decode,
    encode,
    wants_protobuf,
)
from fabricprobe.core.sketchwire import MergedSketch, from_wire, slot_value_ns, to_wire
from fabricprobe.core.stats import LatencySketch
from tests.support.agentview import agent_view
from tests.support.nativehist import bucket_bounds

# What Prometheus 2.42 sends: with --enable-feature=native-histograms, and without.
ACCEPT_NATIVE = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
    "encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,"
    "application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
ACCEPT_CLASSIC = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def sketch_of(values: list[int]) -> MergedSketch:
    sk = LatencySketch()
    for v in values:
        sk.record(v)
    return from_wire(to_wire(sk))


def expand(h: mpb.Histogram) -> dict[int, int]:
    """A decoded native histogram's positive buckets, {index: count}."""
    out: dict[int, int] = {}
    idx, count, k = 0, 0, 0
    for i, span in enumerate(h.positive_span):
        idx = span.offset if i == 0 else idx + span.offset
        for _ in range(span.length):
            count += h.positive_delta[k]
            k += 1
            if count:
                out[idx] = count
            idx += 1
    assert k == len(h.positive_delta)
    return out


def native_quantile(buckets: dict[int, int], zero: int, q: float, schema: int) -> float:
    """histogram_quantile over native buckets as Prometheus reads them: the bucket that
    holds rank q x count, interpolated linearly inside it."""
    total = zero + sum(buckets.values())
    rank = q * total
    if rank <= zero:
        return 0.0
    running = float(zero)
    for idx in sorted(buckets):
        n = buckets[idx]
        if running + n >= rank:
            lo, hi = bucket_bounds(idx, schema)
            return lo + (hi - lo) * (rank - running) / n
        running += n
    raise AssertionError("rank beyond the count")


# -- the conversion ------------------------------------------------------------------


@pytest.mark.parametrize("schema", [-4, -1, 0, 1, 5, 6, 8])
@pytest.mark.parametrize("x", [1e-9, 2.5e-6, 0.5, 1.0, 1.5, 2.0, 7.75, 100.0])
def test_bucket_index_puts_a_value_inside_its_bucket(schema: int, x: float) -> None:
    lo, hi = bucket_bounds(bucket_index(x, schema), schema)
    assert lo < x <= hi * (1 + 1e-12)


def test_bucket_index_is_exact_at_powers_of_two() -> None:
    # bucket 0 of every schema ends at 1; 2 ends bucket 2^schema (schema >= 0)
    for schema in range(-4, 9):
        assert bucket_index(1.0, schema) == 0
    for schema in range(0, 9):
        assert bucket_index(2.0, schema) == 1 << schema
    with pytest.raises(ValueError):
        bucket_index(0.0)
    with pytest.raises(ValueError):
        bucket_index(1.0, 9)


def test_a_fabric_of_a_few_microseconds_spreads_over_many_buckets() -> None:
    # 2-5 µs RTTs: one classic bucket (2e-6 < x <= 5e-6) holds them all
    sk = sketch_of(list(range(2_000, 5_000, 10)))
    nh = to_native(sk)
    classic = dict(sketch_histogram(sk)[0])
    assert classic["5e-6"] - classic["2e-6"] == sk.count
    assert len(nh.buckets) > 80  # ln(2.5) / ln(2^(1/64)): 84 buckets of 1.09 %
    assert sum(n for _, n in nh.buckets) == sk.count == nh.count


def test_zero_values_go_to_the_zero_bucket() -> None:
    # a hostile or old agent's slot 0 (0 ns): the zero bucket, not a bucket of its own
    sk = MergedSketch(count=3, min_ns=0, max_ns=1_000, sum_ns=1_000, slots={0: 2})
    sk.slots[next(i for i in range(1, 4000) if slot_value_ns(i) >= 1_000)] = 1
    nh = to_native(sk)
    assert nh.zero_count == 2 and nh.zero_threshold == ZERO_THRESHOLD_S
    assert 0 < ZERO_THRESHOLD_S < 1e-9
    assert sum(n for _, n in nh.buckets) == 1


values = st.lists(
    st.one_of(
        st.integers(1, 300),  # exact slots below 256 ns
        st.integers(1_000, 10_000),  # a RoCE fabric
        st.integers(10_000, 100_000_000_000),  # TCP, congestion, up to the sketch's top
    ),
    min_size=1,
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(values, st.sampled_from([5, 6]), st.floats(0.01, 0.999))
def test_conversion_keeps_count_sum_and_quantiles_within_a_bucket(
    vs: list[int], schema: int, q: float
) -> None:
    sk = sketch_of(vs)
    fam = SketchHistogramFamily("x_seconds", "x", ["p"], classic=None, schema=schema)
    fam.add_sketch(["a"], sk)
    (decoded,) = decode(encode([fam]))
    h = decoded.metric[0].histogram
    assert h.sample_count == len(vs)
    assert h.sample_sum == sum(vs) / 1e9  # exact: the float of the exact ns total
    assert h.schema == schema and h.zero_threshold == ZERO_THRESHOLD_S and h.zero_count == 0
    buckets = expand(h)
    assert sum(buckets.values()) == len(vs)
    # every slot lands in the bucket of its highest value
    for slot, n in sk.slots.items():
        v = slot_value_ns(slot) / 1e9
        lo, hi = bucket_bounds(bucket_index(v, schema), schema)
        assert lo < v <= hi * (1 + 1e-12) and buckets[bucket_index(v, schema)] >= n
    # the quantile Prometheus reads lies in the native bucket of the sketch's own value at
    # that rank: within a factor 2^(2^-schema); against the recorded value, one HDR slot more
    factor = 2.0 ** (2.0**-schema)
    got = native_quantile(buckets, 0, q, schema)
    rank = max(1, math.ceil(q * len(vs) - 1e-9))
    ordered = sorted(vs)
    slot_hi = sorted(slot_value_ns(s) for s, n in sk.slots.items() for _ in range(n))
    want_sketch = slot_hi[rank - 1] / 1e9
    assert want_sketch / factor <= got <= want_sketch * factor * (1 + 1e-12)
    recorded = ordered[rank - 1] / 1e9
    slot_width = 1 + 1 / 128
    assert recorded / (factor * slot_width) <= got <= recorded * factor * slot_width


# -- the protobuf exposition -----------------------------------------------------------


def test_every_family_kind_is_encoded_and_reads_back() -> None:
    c = CounterMetricFamily("fabricprobe_x", "a counter", labels=["src"])
    c.add_metric(["a"], 3.0)
    g = GaugeMetricFamily("fabricprobe_y", "a gauge", labels=["src"])
    g.add_metric(["b"], 0.25)
    h = HistogramMetricFamily("fabricprobe_z_seconds", "a classic one", labels=["m"])
    h.add_metric(["Report"], [("0.1", 2.0), ("1", 3.0), ("+Inf", 4.0)], 1.5)
    sk = sketch_of([3_000, 3_050, 4_000, 90_000])
    n = SketchHistogramFamily("fabricprobe_rtt_seconds", "rtt", ["src"], sketch_histogram)
    n.add_sketch(["a"], sk)
    empty = SketchHistogramFamily("fabricprobe_none_seconds", "none", ["src"], None)
    fams = {f.name: f for f in decode(encode([c, g, h, n, empty]))}
    assert set(fams) == {
        "fabricprobe_x_total",
        "fabricprobe_y",
        "fabricprobe_z_seconds",
        "fabricprobe_rtt_seconds",
    }
    assert fams["fabricprobe_x_total"].type == mpb.COUNTER
    assert fams["fabricprobe_x_total"].metric[0].counter.value == 3.0
    assert fams["fabricprobe_x_total"].metric[0].label[0].value == "a"
    assert fams["fabricprobe_y"].metric[0].gauge.value == 0.25
    classic = fams["fabricprobe_z_seconds"].metric[0].histogram
    assert [(b.upper_bound, b.cumulative_count) for b in classic.bucket] == [(0.1, 2), (1.0, 3)]
    assert classic.sample_count == 4 and classic.sample_sum == 1.5
    assert not classic.positive_span and classic.zero_threshold == 0  # stays classic
    native = fams["fabricprobe_rtt_seconds"].metric[0].histogram
    assert native.schema == SCHEMA and not native.bucket  # no classic buckets: 2.42 drops them
    assert expand(native) == dict(to_native(sk).buckets)
    assert native.sample_count == 4 and native.sample_sum == pytest.approx(100_050e-9)


def test_an_empty_native_histogram_is_still_marked_native() -> None:
    # Prometheus 2.42 decides native or classic from the zero threshold and the buckets
    n = SketchHistogramFamily("fabricprobe_rtt_seconds", "rtt", ["src"], None)
    n.add_sketch(["a"], MergedSketch())
    h = decode(encode([n]))[0].metric[0].histogram
    assert h.sample_count == 0 and h.zero_threshold > 0 and not h.positive_span


def test_truncated_bytes_are_refused() -> None:
    g = GaugeMetricFamily("fabricprobe_y", "a gauge")
    g.add_metric([], 1.0)
    data = encode([g])
    with pytest.raises(ValueError):
        decode(data[:-1])


@pytest.mark.parametrize(
    ("accept", "protobuf"),
    [
        (ACCEPT_NATIVE, True),
        (ACCEPT_CLASSIC, False),
        ("", False),
        ("*/*", False),
        ("text/plain", False),
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily", False),
        (
            "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
            "encoding=delimited; q=0.3, text/plain;q=0.9",
            False,
        ),
        (
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
            "encoding=delimited;q=0",
            False,
        ),
        (
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
            "encoding=delimited;q=nonsense",
            False,
        ),
        ("a," * 5000, False),
    ],
)
def test_content_negotiation(accept: str, protobuf: bool) -> None:
    assert wants_protobuf(accept) is protobuf


def fetch(port: int, accept: str) -> tuple[str, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.headers["Content-Type"], resp.read()


def report(host: str, dst: str, seq: int, values: list[int]) -> pb.WindowReport:
    r = pb.WindowReport(host=host, epoch=1, seq=seq)
    sk = LatencySketch()
    for v in values:
        sk.record(v)
    r.probes.add(dst=dst, transport="rdma", op="send", size=64, rtt=to_wire(sk))
    return r


def test_the_collector_serves_native_to_who_asks_and_text_to_the_rest() -> None:
    store = WindowStore()
    store.register(pb.HostInfo(host="a"))
    store.take(report("a", "b", 1, list(range(3_000, 4_000, 5))))
    reg = CollectorRegistry()
    reg.register(FabricCollector(store))
    server = serve_metrics("127.0.0.1", 0, reg, cache_s=0.0)
    try:
        port = server.server_address[1]
        ctype, body = fetch(port, ACCEPT_NATIVE)
        assert ctype == CONTENT_TYPE_PROTOBUF
        fams = {f.name: f for f in decode(body)}
        h = fams["fabricprobe_rtt_seconds"].metric[0].histogram
        assert h.sample_count == 200 and h.schema == SCHEMA and len(expand(h)) > 20
        assert fams["fabricprobe_probe_exchanges_total"].metric[0].counter.value == 200
        ctype, body = fetch(port, ACCEPT_CLASSIC)
        assert ctype.startswith("text/plain")
        text = body.decode()
        assert 'fabricprobe_rtt_seconds_bucket{dst="b",le="5e-6"' in text
        assert "fabricprobe_rtt_seconds_count" in text
    finally:
        server.shutdown()
        server.server_close()


def test_the_agent_serves_its_cumulative_rtt_as_native_histograms() -> None:
    view = agent_view()
    server = AgentMetricsServer(view, "127.0.0.1", 0)  # type: ignore[arg-type]
    server.start()
    try:
        server.take(report("gpu-1", "peer-1", 1, [4_000] * 10))
        server.take(report("gpu-1", "peer-1", 1, [4_000] * 10))  # the same window again
        view.last_report = report("gpu-1", "peer-1", 2, [8_000] * 5)  # not given by take()
        ctype, body = fetch(server.port, ACCEPT_NATIVE)
        assert ctype == CONTENT_TYPE_PROTOBUF
        fams = {f.name: f for f in decode(body)}
        (m,) = fams["fabricprobe_agent_rtt_seconds"].metric
        assert {lp.name: lp.value for lp in m.label}["dst"] == "peer-1"
        h = m.histogram
        assert h.sample_count == 15 and h.sample_sum == pytest.approx(80_000e-9)
        assert sorted(expand(h).values()) == [5, 10]
        assert "fabricprobe_agent_path_rtt_seconds" not in fams  # the histogram holds them
        ctype, body = fetch(server.port, ACCEPT_CLASSIC)
        text = body.decode()
        assert "fabricprobe_agent_rtt_seconds_bucket" not in text  # budget: no classic
        assert 'fabricprobe_agent_path_rtt_seconds{dst="peer-1"' in text
    finally:
        server.stop()


def test_the_agent_bounds_its_paths() -> None:
    from fabricprobe.agent.exporter import RttTotals

    t = RttTotals()
    t.MAX_PATHS = 4
    for seq in range(1, 11):
        t.take(report("gpu-1", f"peer-{seq}", seq, [5_000]))
    assert len(t.paths) == 4 and t.evicted == 6
    assert {k[0] for k in t.paths} == {f"peer-{i}" for i in range(7, 11)}
    bad = pb.WindowReport(host="gpu-1", epoch=1, seq=11)
    bad.probes.add(dst="x", transport="tcp", op="pingpong", size=64, rtt=pb.Sketch(kind="?"))
    bad.probes.add(
        dst="peer-10", transport="rdma", op="send", size=64, rtt=pb.Sketch(kind="one_way")
    )
    t.take(bad)
    assert t.rejected == 2 and len(t.paths) == 4


def test_the_catalogue_marks_exactly_the_native_families() -> None:
    import tomllib
    from pathlib import Path

    from fabricprobe.agent.exporter import AgentCollector

    rows = tomllib.loads(
        (Path(__file__).resolve().parents[2] / "collector" / "metrics.toml").read_text()
    )
    store = WindowStore()
    store.register(pb.HostInfo(host="a"))
    store.take(report("a", "b", 1, [5_000]))
    view = agent_view(
        last_report=report("a", "b", 1, [5_000]),
    )
    for table, collector in (
        ("metric", FabricCollector(store)),
        ("agent_metric", AgentCollector(view)),  # type: ignore[arg-type]
    ):
        native = {m.name for m in collector.collect() if isinstance(m, SketchHistogramFamily)}
        marked = {r["name"] for r in rows[table] if r.get("native")}
        assert native == marked, table
        for fam in collector.collect():
            if isinstance(fam, SketchHistogramFamily):
                only = any(r["name"] == fam.name and r.get("native_only") for r in rows[table])
                assert (fam.classic is None) == only, fam.name


def test_a_label_value_protobuf_cannot_carry_does_not_fail_the_scrape() -> None:
    g = GaugeMetricFamily("fabricprobe_y", "a gauge", labels=["netdev"])
    g.add_metric(["eth\udcff0"], 1.0)  # undecodable bytes of an interface name
    g.add_metric(["eth1"], 2.0)
    (fam,) = decode(encode([g]))
    assert [m.label[0].value for m in fam.metric] == ["eth\\udcff0", "eth1"]


def test_spans_carry_short_gaps_as_zeros_and_open_a_span_after_long_ones() -> None:
    from fabricprobe.core.nativehist import slot_buckets

    table = slot_buckets(SCHEMA)
    first = {}  # bucket index -> a slot counted in it
    for slot, idx in enumerate(table):
        if idx is not None:
            first.setdefault(idx, slot)
    i0 = bucket_index(4e-6)  # 4 µs: one HDR slot per native bucket or finer
    want = {i0: 3, i0 + 1: 5, i0 + 4: 1, i0 + 11: 2}  # gaps: 0, 2 (kept), 6 (new span)
    sk = MergedSketch(count=11, min_ns=1, max_ns=1, sum_ns=0)
    sk.slots = {first[i]: n for i, n in want.items()}
    nh = to_native(sk)
    assert nh.spans == ((i0, 5), (6, 1))
    assert nh.deltas == (3, 2, -5, 0, 1, 1)
    assert dict(nh.buckets) == want
