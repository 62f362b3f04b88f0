"""Engine spans without fabricprobe attributes: mapped, linked prefill -> decode by trace id
or request id, hosts matched from resource attributes, unknown paths kept with a reason."""

from __future__ import annotations

import math
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb
from opentelemetry.proto.trace.v1 import trace_pb2
from prometheus_client import CollectorRegistry

from fabricprobe.collector.attribution.core import Attribution
from fabricprobe.collector.attribution.exporter import AttributionCollector
from fabricprobe.collector.attribution.linking import HostDirectory, MatchConfig
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from tests.unit.spanmaker import S, attr

NOW = 1_000 * S


def espan(name: str, start: int, end: int, trace: int, span_id: int = 1, **attrs: Any):
    return trace_pb2.Span(
        trace_id=trace.to_bytes(16, "big"),
        span_id=span_id.to_bytes(8, "big"),
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=[attr(k, v) for k, v in attrs.items()],
    )


def export(*groups: tuple[dict[str, Any], list[trace_pb2.Span]], scope: str = "vllm"):
    req = ts_pb.ExportTraceServiceRequest()
    for resource, spans in groups:
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(attr(k, v) for k, v in resource.items())
        ss = rs.scope_spans.add()
        ss.scope.name = scope
        ss.spans.extend(spans)
    return req


def vllm_request(start: int, rid: str, trace: int, *, queue: float, e2e: float, out: int):
    return espan(
        "llm_request",
        start,
        start + int(e2e * S),
        trace,
        **{
            "gen_ai.request.id": rid,
            "gen_ai.latency.time_in_queue": queue,
            "gen_ai.latency.time_in_model_prefill": 0.01,
            "gen_ai.latency.time_in_model_decode": max(0.0, e2e - queue - 0.01),
            "gen_ai.latency.time_to_first_token": queue + 0.01,
            "gen_ai.latency.e2e": e2e,
            "gen_ai.usage.prompt_tokens": 32,
            "gen_ai.usage.completion_tokens": out,
        },
    )


def fleet() -> tuple[WindowStore, Attribution]:
    store = WindowStore(clock=lambda: NOW)
    store.register(pb.HostInfo(host="pre-node", addresses=["10.0.0.2"]))
    store.register(pb.HostInfo(host="dec-node.example", addresses=["10.0.0.3"]))
    return store, Attribution(store, clock=lambda: NOW)


PRE = {"host.name": "pre-node", "service.name": "vllm-prefill"}
DEC = {"host.name": "dec-node", "service.name": "vllm-decode"}  # short name of the agent's


def pd_pair(i: int, *, trace: bool = True, dec_res: dict[str, Any] = DEC):
    t = NOW - 20 * S + i * S
    tid = 100 + i if trace else 0
    pre = vllm_request(t, f"req-{i}", tid, queue=0.002, e2e=0.05, out=1)
    dec = vllm_request(t + S // 10, f"req-{i}", tid, queue=0.03, e2e=0.3, out=8)
    return (PRE, [pre]), (dec_res, [dec])


def test_vllm_pair_linked_by_trace_id_gets_the_path_and_the_kv_wait() -> None:
    _, a = fleet()
    for i in range(3):
        a.ingest.export(export(*pd_pair(i)))
    res = a.analyse()
    req = res.requests.set_index("request_id")
    assert list(req["path"]) == ["pre-node->dec-node.example"] * 3
    r = req.loc["req-0"]
    # the decode side's time_in_queue is its wait for remote KV (vLLM 0.32)
    assert math.isclose(r["kv_transfer_s"], 0.03, rel_tol=1e-6)
    assert r["kv_source"] == "gen_ai.latency.time_in_queue (decode side)"
    # one request from the prefill side's arrival to the decode side's end
    assert math.isclose(r["e2e_s"], 0.1 + 0.3, rel_tol=1e-6)
    assert math.isclose(r["ttft_s"], 0.1 + 0.04, rel_tol=1e-6)
    assert r["output_tokens"] == 8
    assert math.isclose(r["kv_share_ttft"], 0.03 / 0.14, rel_tol=1e-6)
    assert a.linker.path_known_total == 3  # complete pairs are counted at once
    reg = CollectorRegistry()
    reg.register(AttributionCollector(a))
    v = reg.get_sample_value
    assert v("fabricprobe_stage_duration_seconds_count", {"stage": "kv_transfer"}) == 3
    assert v("fabricprobe_stage_duration_seconds_count", {"stage": "queue"}) == 3
    path = {"src": "pre-node", "dst": "dec-node.example", "transport": "unknown"}
    assert v("fabricprobe_kv_transfer_seconds_count", path) == 3
    assert v("fabricprobe_requests_path_known_total") == 3
    assert v("fabricprobe_otlp_engine_spans_total", {"engine": "vllm"}) == 6


def test_link_by_request_id_when_no_trace_context_was_forwarded() -> None:
    _, a = fleet()
    a.ingest.export(export(*pd_pair(0, trace=False)))
    req = a.analyse().requests.set_index("request_id")
    assert req.loc["req-0", "path"] == "pre-node->dec-node.example"


def test_unknown_host_keeps_the_request_with_a_reason_and_nan_share() -> None:
    _, a = fleet()
    stranger = {"host.name": "somewhere-else", "k8s.pod.ip": "10.9.9.9"}
    a.ingest.export(export(*pd_pair(19, dec_res=stranger)))  # ended 0.6 s ago
    res = a.analyse()
    r = res.requests.set_index("request_id").loc["req-19"]
    assert r["path"] == "unknown" and r["path_reason"] == "decode host unknown"
    assert "somewhere-else" in r["path_detail"]
    assert math.isnan(r["fabric_share_ttft"])  # unknown is not 0
    assert res.kv.empty  # no path to join with
    from fabricprobe.collector.query import why_reply

    slow = {r.request_id: r for r in why_reply(res, 10).slowest}["req-19"]
    assert slow.src == "" and slow.path_reason == "decode host unknown" and slow.engine == "vllm"
    assert not slow.HasField("fabric_share_ttft")
    assert a.linker.path_unknown_total["decode host unknown"] == 0  # still waiting for a host
    a.clock = lambda: NOW + 10 * S
    a.sync()
    assert a.linker.path_unknown_total["decode host unknown"] == 1
    reg = CollectorRegistry()
    reg.register(AttributionCollector(a))
    assert (
        reg.get_sample_value(
            "fabricprobe_requests_path_unknown_total", {"reason": "decode host unknown"}
        )
        == 1
    )
    share = reg.get_sample_value("fabricprobe_fabric_share_ttft_ratio")
    assert share is None  # never a 0.0 for requests whose path is unknown


def test_single_vllm_instance_is_one_side_only_and_keeps_its_stages() -> None:
    _, a = fleet()
    a.ingest.export(
        export((PRE, [vllm_request(NOW - 9 * S, "solo", 7, queue=0.01, e2e=0.5, out=5)]))
    )
    a.sync()
    assert a.linker.path_unknown_total["one side only"] == 0  # the other side may come
    a.clock = lambda: NOW + 10 * S  # link_wait_s after it arrived
    a.sync()
    r = a.analyse().requests.set_index("request_id").loc["solo"]
    assert r["path"] == "unknown" and r["path_reason"] == "one side only"
    assert math.isclose(r["queue_s"], 0.01) and math.isclose(r["e2e_s"], 0.5)
    assert math.isnan(r["fabric_share_ttft"])
    assert a.linker.path_unknown_total["one side only"] == 1
    assert a.histograms.stage["queue"].counts != [0] * len(a.histograms.stage["queue"].counts)


def test_unmapped_engine_spans_are_counted_not_rejected() -> None:
    _, a = fleet()
    res = a.ingest.export(
        export(
            (
                PRE,
                [
                    espan("llm_core_step", NOW - S, NOW, 5),
                    espan("prefill_forward", NOW - S, NOW, 5),
                ],
            ),
            scope="sglang server",
        )
    )
    assert res.rejected == 0
    assert a.ingest.unmapped["sglang"] == 1
    assert a.ingest.engine_spans["sglang"] == 2


def test_host_matching_rules() -> None:
    d = HostDirectory(
        [("gpu-17.dc1", ["10.1.0.17"]), ("gpu-18.dc1", ["10.1.0.18"])],
        MatchConfig(
            aliases={"decode-a": "gpu-18.dc1"}, rewrite=((r"^vllm-(gpu-\d+)-\w+$", r"\1"),)
        ),
    )
    assert d.match("gpu-17.dc1") == "gpu-17.dc1"
    assert d.match("10.1.0.18") == "gpu-18.dc1"
    assert d.match("10.1.0.18:8000") == "gpu-18.dc1"  # llm-d's prefill target
    assert d.match("gpu-17") == "gpu-17.dc1"  # short names
    assert d.match("decode-a") == "gpu-18.dc1"
    assert d.match("vllm-gpu-17-abcde") == "gpu-17.dc1"
    assert d.match("gpu-19") is None
    got, how = d.resolve([("k8s.pod.ip", "10.1.0.17"), ("host.name", "pod-xyz")])
    assert got == "gpu-17.dc1" and how == "k8s.pod.ip=10.1.0.17"
    strict = HostDirectory([("gpu-17.dc1", [])], MatchConfig(short_names=False))
    assert strict.match("gpu-17") is None


def test_kv_wait_split_by_the_paths_rtt_and_bandwidth_with_nixl_bytes() -> None:
    from fabricprobe.core.sketchwire import to_wire
    from fabricprobe.core.stats import LatencySketch

    store, a = fleet()
    t = NOW - 5 * S
    a.ingest.export(export(*pd_pair(15)))  # decode side arrives at NOW - 4.9 s
    sk = LatencySketch()
    sk.record_many([200_000] * 20)  # 200 us RTT
    # decode host: NIXL counters before and after the transfer (1 transfer, 8 MiB in 2 ms);
    # prefill host probes decode: RTT and a bandwidth of 1 GB/s
    readings = ((t - 2 * S, 0, 0, 0), (t + S, 8 << 20, 1, 2000))
    for seq, (end, nbytes, n, us) in enumerate(readings, 1):
        r = pb.WindowReport(
            host="dec-node.example", epoch=1, seq=seq, window_start_unix_ns=end - S,
            window_end_unix_ns=end,
        )  # fmt: skip
        for name, v in (("bytes", nbytes), ("transfers", n), ("xfer_time_us", us)):
            r.counters.add(kind="nixl", device="127.0.0.3:8000", name=name, value=v, width=64)
        store.take(r)
        p = pb.WindowReport(
            host="pre-node", epoch=1, seq=seq, window_start_unix_ns=end - S, window_end_unix_ns=end
        )
        p.probes.add(
            dst="dec-node.example", transport="tcp", op="pingpong", size=64, rtt=to_wire(sk)
        )
        p.probes.add(
            dst="dec-node.example", transport="tcp", op="stream", size=4096,
            bytes_moved=1_000_000_000, busy_seconds=1.0,
        )  # fmt: skip
        store.take(p)
    a.sync()
    kv = a.analyse().kv.set_index("request_id").loc["req-15"]
    assert kv["nixl_mean_bytes"] == pytest.approx(8 << 20, rel=1e-3)
    assert kv["bandwidth_bytes_per_s"] == pytest.approx(1e9)
    wire = (8 << 20) / 1e9
    # no transport given: the RDMA count of round trips (reads + notification)
    rtt = kv["rtt_p50_net_s"]
    assert 0 < rtt <= kv["rtt_p50_s"]
    assert kv["fabric_s"] == pytest.approx(2 * rtt + wire, rel=1e-6)
    assert kv["kv_bytes_source"] == "nixl-host-mean"
    assert kv["fabric_source"] == "rtt+bandwidth+loss@window"
    # NIXL's 2 ms a transfer is less than the fabric explains: no stack time beyond it
    assert kv["transfer_stack_s"] == 0 and kv["transfer_stack_source"] == "nixl-host-rate"
    assert kv["engine_wait_s"] == pytest.approx(0.03 - kv["fabric_s"], rel=1e-6)
    # NIXL says 8 MiB in 2 ms (4.2 GB/s) on a path measured at 1 GB/s: flagged
    assert kv["nixl_speed_bytes_per_s"] == pytest.approx((8 << 20) / 0.002, rel=1e-3)
    assert bool(kv["kv_speed_above_path"])
    reg = CollectorRegistry()
    reg.register(AttributionCollector(a))
    path = {"src": "pre-node", "dst": "dec-node.example", "transport": "unknown"}
    assert reg.get_sample_value("fabricprobe_path_kv_speed_above_bandwidth", path) == 1
    nixl = {"host": "dec-node.example", "engine": "127.0.0.3:8000"}
    assert reg.get_sample_value("fabricprobe_nixl_bytes_total", nixl) == 8 << 20
    assert reg.get_sample_value("fabricprobe_nixl_transfer_seconds_total", nixl) == pytest.approx(
        0.002
    )


def test_vllm_child_spans_measure_the_kv_wait_when_sent() -> None:
    _, a = fleet()
    (pre_res, [pre]), (dec_res, [dec]) = pd_pair(3)
    t = dec.start_time_unix_nano
    kids = [
        espan("vllm_queue", t, t + S // 200, 103, 2, **{"gen_ai.request.id": "req-3"}),
        espan("vllm_async_kv_transfer", t + S // 200, t + S // 40, 103, 3),
    ]
    for k in kids:
        k.parent_span_id = dec.span_id
    a.ingest.export(export((pre_res, [pre]), (dec_res, [dec, *kids])))
    r = a.analyse().requests.set_index("request_id").loc["req-3"]
    assert r["path"] == "pre-node->dec-node.example"
    assert math.isclose(r["kv_transfer_s"], 0.02, rel_tol=1e-6)  # the span, not the total
    assert r["kv_source"] == "span"
    # the prefill side's queue plus the decode side's measured vllm_queue
    assert math.isclose(r["queue_s"], 0.002 + 0.005, rel_tol=1e-6)


def test_a_prefill_side_waits_for_its_decode_side() -> None:
    _, a = fleet()
    (pre_res, [pre]), (dec_res, [dec]) = pd_pair(0)
    pre.attributes.append(attr("gen_ai.request.max_tokens", 1))  # the proxy's prefill call
    a.ingest.export(export((pre_res, [pre])))
    a.clock = lambda: NOW + 30 * S  # long after link_wait_s: the decode is still running
    a.sync()
    assert a.linker.path_known_total == 0 and sum(a.linker.path_unknown_total.values()) == 0
    a.ingest.export(export((dec_res, [dec])))
    a.sync()
    assert a.linker.path_known_total == 1 and sum(a.linker.path_unknown_total.values()) == 0


def test_engine_hosts_paths_are_watched_from_their_first_fragment() -> None:
    store, a = fleet()
    r = pb.WindowReport(host="pre-node", epoch=1, seq=1, window_start_unix_ns=NOW - S)
    r.window_end_unix_ns = NOW
    r.probes.add(dst="dec-node.example", transport="tcp", op="pingpong", size=64)
    store.take(r)
    (pre_res, [pre]), _ = pd_pair(0)
    a.ingest.export(export((pre_res, [pre])))  # only the prefill side so far
    a.sync()
    assert ("dec-node.example", "pre-node") in a.fabric.history.pairs
