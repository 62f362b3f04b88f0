"""OTLP over HTTP: protobuf and JSON bodies (hex ids), gzip, partial success, refusals."""

from __future__ import annotations

import contextlib
import gzip
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb

from fabricprobe.collector.attribution.otlp import TraceIngest
from fabricprobe.collector.attribution.otlp_http import BadRequest, decode, serve_otlp_http
from tests.unit.spanmaker import S, batch, kv_span, span

Taken = list[tuple[list, list, list]]


@pytest.fixture
def served() -> Iterator[tuple[str, Taken]]:
    taken: Taken = []
    server = serve_otlp_http("127.0.0.1", 0, TraceIngest(lambda *a: taken.append(a), max_spans=5))
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", taken
    server.shutdown()
    server.server_close()


def post(url: str, body: bytes, ctype: str, **headers: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": ctype, **headers})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_protobuf_and_gzip(served: tuple[str, Taken]) -> None:
    url, taken = served
    body = batch(kv_span("r1", 10 * S, 0.1, "h0", "h1", 1024)).SerializeToString()
    assert post(url, body, "application/x-protobuf")[0] == 200
    code, _ = post(
        url, gzip.compress(body), "application/x-protobuf", **{"Content-Encoding": "gzip"}
    )
    assert code == 200
    assert [st[0].request_id for st, _, _ in taken] == ["r1", "r1"]


def test_json_with_hex_ids_and_partial_success(served: tuple[str, Taken]) -> None:
    url, taken = served
    req = batch(kv_span("r2", 10 * S, 0.1, "h0", "h1", 1024), span("queue", 2 * S, S))
    obj = json_format.MessageToDict(req)
    for s in obj["resourceSpans"][0]["scopeSpans"][0]["spans"]:  # OTLP/JSON: hex ids
        s["traceId"] = bytes(range(1, 17)).hex()
        s["spanId"] = bytes(range(1, 9)).hex()
    code, out = post(url, json.dumps(obj).encode(), "application/json")
    assert code == 200
    resp = json.loads(out)
    assert resp["partialSuccess"]["rejectedSpans"] == "1"
    assert taken[0][0][0].request_id == "r2"


def test_refusals(served: tuple[str, Taken]) -> None:
    url, _ = served
    assert post(url, b"\xff\xff", "application/x-protobuf")[0] == 400
    assert post(url, b"[1]", "application/json")[0] == 400
    assert post(url, b"{}", "text/plain")[0] == 415
    bad = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}
    assert post(url, json.dumps(bad).encode(), "application/json")[0] == 400
    many = batch(*[kv_span(f"r{i}", 10 * S, 0.1, "h0", "h1", 1) for i in range(6)])
    code, out = post(url, many.SerializeToString(), "application/x-protobuf")
    assert code == 400 and b"at most 5" in out
    assert post(url.replace("/v1/traces", "/v1/logs"), b"", "application/x-protobuf")[0] == 404
    empty = ts_pb.ExportTraceServiceRequest().SerializeToString()
    assert post(url, empty, "application/x-protobuf")[0] == 200


def test_a_nesting_bomb_and_deep_messages_are_400_with_the_reason(
    served: tuple[str, Taken],
) -> None:
    url, _ = served
    code, out = post(url, b"[" * 100_000, "application/json")
    assert code == 400 and b"nested too deeply" in out
    deep = b'{"resourceSpans": [{"resource": {"attributes": [{"key": "k", "value": '
    deep += b'{"kvlistValue": {"values": [{"key": "k", "value": ' * 300 + b"{}" + b"}]}}" * 300
    deep += b"}]}}]}"
    assert post(url, deep, "application/json")[0] == 400


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    doc=st.one_of(
        json_values,
        st.builds(lambda v: {"resourceSpans": v}, json_values),
        st.builds(lambda v: {"resourceSpans": [{"scopeSpans": [{"spans": v}]}]}, json_values),
    )
)
def test_any_json_is_a_request_or_a_bad_request(doc: object) -> None:
    """decode() takes any JSON document or says why not (BadRequest, a 400): never
    another exception, which would drop the connection without a reply."""
    with contextlib.suppress(BadRequest):
        decode(json.dumps(doc).encode(), "application/json")


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=300))
def test_any_bytes_are_a_request_or_a_bad_request(body: bytes) -> None:
    for ctype in ("application/json", "application/x-protobuf"):
        with contextlib.suppress(BadRequest):
            decode(body, ctype)
