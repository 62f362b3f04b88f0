"""The collector's request view holds each workload request's stages to the spans the
workload sent: a real workload run on loopback (TCP KV transfers), the real OpenTelemetry
SDK and OTLP/gRPC exporter, a real collector. Every stage of every request, its TTFT and
its fabric share must equal what the workload measured, in its own column."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator

import pandas as pd
import pytest

from fabricprobe.cli.commands.why import reply_dict, requests_table
from fabricprobe.collector.query import why_reply
from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.models import PRESETS
from fabricprobe.probes.responder import Responder
from fabricprobe.workload.pipeline import Host, RequestResult, WorkloadConfig, run_pipeline
from fabricprobe.workload.spans import SpanSender
from tests.support.fleet import open_responder, scrape, wait_for
from tests.support.stages import (
    export_batches,
    recorded_spans,
    scattered_batches,
    view_mismatches,
)

PRE, FAST, SLOW = Host("pre-a", "127.0.0.1"), Host("dec-b", "127.0.0.1"), Host("dec-c", "127.0.0.1")
MODEL = PRESETS["Llama-3.1-8B"]
SHARE = "fabricprobe_kv_share_ttft_ratio "
HEADINGS = {"queue": "queue", "prefill": "prefill", "KV wait": "kv_transfer", "decode": "decode",
            "detok": "detokenize", "deliver": "deliver"}  # fmt: skip


@pytest.fixture
def collector() -> Iterator[CollectorServer]:
    server = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"))
    server.start()
    for h in (PRE, FAST, SLOW):
        server.api.register(pb.HostInfo(host=h.name, addresses=[h.address]))
    yield server
    server.stop(0)


@pytest.fixture(scope="module")
def results() -> Iterator[list[RequestResult]]:
    """One workload run as the demo's (two paths from one prefill host, prompts of
    32-96 tokens), its spans sent nowhere: the tests send them as they need."""
    with open_responder() as r:
        yield _run(r, on_request=None)


def _run(
    responder: Responder, on_request: Callable[[RequestResult], None] | None
) -> list[RequestResult]:
    cfg = WorkloadConfig(
        model=MODEL,
        prompt_tokens=64,
        output_tokens=8,
        prefill_s_per_token=2e-5,
        decode_step_s=0.002,
        requests=8,
        transport="tcp",
        port=responder.port,
    )
    out = run_pipeline([(PRE, FAST), (PRE, SLOW)], cfg, on_request=on_request)
    assert [r.error for r in out] == [None] * len(out)
    return out


def _view(server: CollectorServer) -> pd.DataFrame:
    return server.attribution.analyse(max_age_s=0).requests


def test_a_live_run_shows_every_stage_the_workload_sent(collector: CollectorServer) -> None:
    """The SpanSender as `probe workload --otlp` runs it: batch processor, real timing."""
    sender = SpanSender(f"127.0.0.1:{collector.port}")
    with open_responder() as r:
        results = _run(r, on_request=lambda res: sender.emit(res, MODEL.name))
    sender.close()
    assert view_mismatches(results, _view(collector)) == []
    # `probe why` reads the same figures, from the Query service's message
    reply = reply_dict(why_reply(collector.attribution.analyse(max_age_s=0), slowest=8))
    assert view_mismatches(results, pd.DataFrame(reply["slowest"])) == []
    # with each request's span of time, first stage start to last end (its flows' lookup)
    ends = {r.request_id: (min(b for b, _ in r.stages.values()), r.end_ns) for r in results}
    for r in reply["slowest"]:
        got = (r["start_unix_ns"], r["end_unix_ns"])
        assert got == pytest.approx(ends[r["request_id"]], abs=1e3), r["request_id"]
    # and `probe why`'s table prints each stage under its own heading
    table = requests_table(reply["slowest"])
    cells = {str(c.header): list(c.cells) for c in table.columns}
    sent = {r.request_id[-24:]: r for r in results}
    for i, rid in enumerate(cells["request"]):
        for heading, stage in HEADINGS.items():
            assert cells[heading][i] == f"{sent[rid].seconds(stage) * 1e3:,.1f}", (rid, heading)


def test_spans_split_across_batches_and_out_of_order(
    collector: CollectorServer, results: list[RequestResult]
) -> None:
    """Each request's spans spread over several Export calls, shuffled, parents before
    or after children; the view is read while requests are incomplete and must come out
    right once everything has arrived."""
    spans = recorded_spans(results, MODEL.name)
    assert len(spans) == 7 * len(results)
    batches = scattered_batches(spans, batches=4)
    per_request = {
        r.request_id: sum(
            any(s.attributes.get("gen_ai.request.id") == r.request_id for s in b) for b in batches
        )
        for r in results
    }
    assert min(per_request.values()) >= 2, per_request  # every request really is split
    seen = []
    export_batches(
        f"127.0.0.1:{collector.port}", batches, between=lambda: seen.append(_view(collector))
    )
    assert len(seen) == len(batches)
    assert view_mismatches(results, _view(collector)) == []


def test_kv_share_metric_is_the_median_of_the_requests_shares(
    collector: CollectorServer, results: list[RequestResult]
) -> None:
    export_batches(
        f"127.0.0.1:{collector.port}",
        scattered_batches(recorded_spans(results, MODEL.name), batches=3, seed=11),
    )
    shares = [r.seconds("kv_transfer") / r.ttft_s for r in results]

    def share_line() -> str | None:
        got = [ln for ln in scrape(collector).splitlines() if ln.startswith(SHARE)]
        return got[0] if got else None

    # the figure shows once requests settle, a few seconds after their last span; it is
    # the median of those settled so far (one CI run read it with some still to come), so
    # it is read until every request is in it
    want = statistics.median(shares)

    def settled_share() -> str | None:
        line = share_line()
        return line if line and float(line.split()[1]) == pytest.approx(want, rel=1e-6) else None

    try:
        wait_for(settled_share, what="the KV share of every request on /metrics")
    finally:
        print("last KV share line:", share_line(), "want", want)
    assert 0.0 < want < 1.0
