"""Attribution metrics: spans in through the ingest, fabric windows from a real store,
every family in the catalogue's [[attribution_metric]] tables and vice versa."""

from __future__ import annotations

import tomllib
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from fabricprobe.collector.attribution.core import Attribution
from fabricprobe.collector.attribution.exporter import AttributionCollector
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch
from tests.unit.spanmaker import S, batch, kv_span, span

CATALOGUE = Path(__file__).resolve().parents[2] / "collector" / "metrics.toml"
NOW = 1_000 * S


def sketch(ns: int) -> pb.Sketch:
    s = LatencySketch()
    s.record_many([ns] * 20)
    return to_wire(s)


def loaded() -> Attribution:
    store = WindowStore(clock=lambda: NOW)
    for host in ("h0", "h1"):
        store.register(pb.HostInfo(host=host))
    # the spans arrived first, 10 s ago (link_wait_s: their export is prompt, a window
    # ends later)
    a = Attribution(store, clock=lambda: NOW - 10 * S)
    spans = []
    for i in range(4):
        t = NOW - 15 * S + i * S
        for src, dst, sec in (("h0", "h1", 0.09), ("h0", "h2", 0.01), ("h1", "h2", 0.011)):
            rid = f"{src}{dst}{i}"
            spans.append(kv_span(rid, t, sec * (1 + i / 100), src, dst, 1 << 20))
            spans.append(
                span(
                    "llm_request",
                    t - S // 10,
                    t + S,
                    **{
                        "gen_ai.request.id": rid,
                        "gen_ai.latency.time_to_first_token": 0.3,
                        "gen_ai.latency.e2e": 1.1,
                        "gen_ai.usage.completion_tokens": 17,
                    },
                )
            )
    spans.append(span("queue", 2 * S, S))  # rejected
    res = a.ingest.export(batch(*spans))
    assert res.rejected == 1
    a.clock = lambda: NOW
    seq = 0
    # two windows per path: the second one's RTT is higher (h0->h1 much higher)
    for end, scale in ((NOW - 13 * S, 1), (NOW, 2)):
        for src, dst, rtt in [("h0", "h1", 2_000_000), ("h0", "h2", 80_000), ("h1", "h2", 90_000)]:
            seq += 1
            r = pb.WindowReport(
                host=src, epoch=1, seq=seq, window_start_unix_ns=end - 7 * S, window_end_unix_ns=end
            )
            r.probes.add(dst=dst, transport="rdma", op="write", size=64, rtt=sketch(rtt * scale))
            store.take(r)
        a.sync()
    return a


def test_metrics_show_the_slow_path_and_match_the_catalogue() -> None:
    a = loaded()
    reg = CollectorRegistry()
    reg.register(AttributionCollector(a))
    v = reg.get_sample_value
    assert v("fabricprobe_path_fabric_bound", {"src": "h0", "dst": "h1", "transport": "rdma"}) == 1
    assert v("fabricprobe_path_fabric_bound", {"src": "h0", "dst": "h2", "transport": "rdma"}) == 0
    # its probes' floor (2 ms against 80-90 µs) is a fault whatever the transfers did
    assert v("fabricprobe_path_fabric_fault", {"src": "h0", "dst": "h1", "transport": "rdma"}) == 1
    assert v("fabricprobe_path_fabric_fault", {"src": "h1", "dst": "h2", "transport": "rdma"}) == 0
    assert (
        v("fabricprobe_path_explained_seconds", {"src": "h0", "dst": "h1", "transport": "rdma"})
        > 0.3
    )
    assert (
        v("fabricprobe_kv_transfer_seconds_count", {"src": "h0", "dst": "h1", "transport": "rdma"})
        == 4
    )
    assert v("fabricprobe_stage_duration_seconds_count", {"stage": "kv_transfer"}) == 12
    assert v("fabricprobe_otlp_spans_received_total") == 25
    assert v("fabricprobe_otlp_spans_rejected_total") == 1
    assert v("fabricprobe_throughput_tokens_per_second") > 0
    rho = v(
        "fabricprobe_path_kv_rtt_rank_correlation", {"src": "h0", "dst": "h1", "transport": "rdma"}
    )
    assert rho is not None and rho > 0.5
    text = generate_latest(reg).decode()
    assert "request_id" not in text

    cat = {m["name"]: m for m in tomllib.loads(CATALOGUE.read_text())["attribution_metric"]}
    got = {}
    for fam in AttributionCollector(a).collect():
        name = fam.name + ("_total" if fam.type == "counter" else "")
        labels = sorted({k for s in fam.samples for k in s.labels if k != "le"})
        got[name] = (fam.type, fam.documentation, labels)
    assert sorted(got) == sorted(cat)
    for name, m in cat.items():
        assert got[name][0] == m["type"] and got[name][1] == m["help"], name
        if got[name][2]:  # a family with no sample this time shows no labels
            assert got[name][2] == sorted(m["labels"]), name
    assert {f.name for f in AttributionCollector(a).describe()} == {
        n.removesuffix("_total") for n in cat
    }
