"""The collector's HTTP surfaces against hostile clients: a real `probe collector`
process with tokens and OTLP/HTTP on, short deadlines set through its settings, and
clients on loopback that send no token, the wrong one, held bodies, idle sockets and a
JSON nesting bomb. The collector's RSS is read from its own process."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.support.fleet import free_port, wait_for

INGEST_TOKEN = "ingest-token-0123456789abcdef"
READER_TOKEN = "reader-token-0123456789abcdef"
HOST_TOKEN = "host-token-0123456789abcdef01"
BODY_S = 2.0  # --http-body-timeout
HEADER_S = 1.0  # --http-header-timeout
IDLE_S = 1.5  # --http-idle-timeout
MIB = 1 << 20


@dataclass
class Collector:
    proc: subprocess.Popen[bytes]
    otlp: int
    metrics: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.otlp}/v1/traces"

    def rss(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def scrape(self, timeout: float = 10.0) -> dict[str, float]:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics}/metrics", timeout=timeout
        ) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    d = tmp_path_factory.mktemp("hostile")
    tokens = d / "tokens"
    tokens.write_text(
        f"otel {INGEST_TOKEN} ingest\nprom {READER_TOKEN} reader\nhost-1 {HOST_TOKEN}\n"
    )
    api, otlp, metrics = free_port(), free_port(), free_port()
    argv = [
        sys.executable,
        "-m",
        "fabricprobe",
        "collector",
        f"--listen=127.0.0.1:{api}",
        f"--metrics-listen=127.0.0.1:{metrics}",
        f"--otlp-http-listen=127.0.0.1:{otlp}",
        f"--token-file={tokens}",
        "--insecure",  # tokens over plain text, as the attacker's collector had them
        f"--http-body-timeout={BODY_S}",
        f"--http-header-timeout={HEADER_S}",
        f"--http-idle-timeout={IDLE_S}",
    ]
    log = (d / "collector.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    c = Collector(proc, otlp, metrics)
    try:
        wait_for(lambda: c.scrape(2.0) is not None, 30, "the collector's /metrics")
        yield c
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
    assert proc.returncode is not None


def post(url: str, body: bytes, ctype: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": ctype}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def refused(c: Collector, listener: str, reason: str) -> float:
    key = f'fabricprobe_collector_http_refused_total{{listener="{listener}",reason="{reason}"}}'
    return c.scrape()[key]


def settled(c: Collector) -> dict[str, float]:
    """/metrics once its one-second render cache has passed."""
    time.sleep(1.1)
    return c.scrape()


def test_otlp_http_takes_only_the_ingest_role(collector: Collector) -> None:
    c = collector
    before = settled(c)
    empty = json.dumps({"resourceSpans": []}).encode()
    assert post(c.url, empty, "application/json")[0] == 401
    assert post(c.url, b"", "application/x-protobuf")[0] == 401
    assert post(c.url, empty, "application/json", "wrong-token-0123456789abcdef")[0] == 401
    assert post(c.url, empty, "application/json", HOST_TOKEN)[0] == 403  # a host's token
    assert post(c.url, empty, "application/json", READER_TOKEN)[0] == 403
    after = settled(c)
    key = 'fabricprobe_collector_http_refused_total{listener="otlp",reason="%s"}'
    assert after[key % "unauthenticated"] - before[key % "unauthenticated"] == 3
    assert after[key % "permission"] - before[key % "permission"] == 2
    assert after["fabricprobe_otlp_spans_received_total"] == before.get(
        "fabricprobe_otlp_spans_received_total", 0
    )

    # a real SDK exporter with the ingest token gets its spans in
    exporter = OTLPSpanExporter(
        endpoint=c.url, headers={"authorization": f"Bearer {INGEST_TOKEN}"}, timeout=10
    )
    provider = TracerProvider(resource=Resource.create({"host.name": "127.0.0.1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("fabricprobe-test")
    for i in range(5):
        with tracer.start_as_current_span("kv_transfer") as span:
            span.set_attribute("gen_ai.request.id", f"req-{i}")
    provider.shutdown()
    received = settled(c)["fabricprobe_otlp_spans_received_total"]
    assert received - after.get("fabricprobe_otlp_spans_received_total", 0) == 5

    # the same exporter with a wrong token gets nothing in
    bad = OTLPSpanExporter(endpoint=c.url, headers={"authorization": "Bearer nope"}, timeout=5)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(bad))
    with provider.get_tracer("t").start_as_current_span("kv_transfer"):
        pass
    provider.shutdown()
    assert settled(c)["fabricprobe_otlp_spans_received_total"] == received


def test_a_nesting_bomb_gets_400_with_the_reason(collector: Collector) -> None:
    c = collector
    bomb = b"[" * (16 * MIB)
    code, body = post(c.url, bomb, "application/json", INGEST_TOKEN)
    print(f"nesting bomb of {len(bomb)} bytes: HTTP {code} {body[:120]!r}")
    assert code == 400
    assert b"nested too deeply" in body
    deep = b'{"resourceSpans": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert post(c.url, deep, "application/json", INGEST_TOKEN)[0] == 400


def _held(port: int, source: str, length: int, token: str, out: list[tuple[float, str]]) -> None:
    """Send all of a LENGTH-byte body but its last byte, then wait for the server to close."""
    t0 = time.monotonic()
    how = "closed"
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    except OSError as e:
        out.append((time.monotonic() - t0, f"connect: {e.__class__.__name__}"))
        return
    with s:
        head = (
            f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {length}\r\n\r\n"
        ).encode()
        chunk = b"\0" * MIB
        try:
            s.sendall(head)
            left = length - 1
            while left > 0:
                n = s.send(chunk[: min(left, MIB)])
                left -= n
            while s.recv(65536):
                how = "answered"
        except OSError as e:
            how = f"reset ({e.__class__.__name__})"
    out.append((time.monotonic() - t0, how))


def test_64_held_bodies_stay_bounded_and_are_closed_in_time(collector: Collector) -> None:
    c = collector
    base = c.rss()
    peak = base
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, c.rss())
            time.sleep(0.02)

    out: list[tuple[float, str]] = []
    # four sources of 16: every connection is admitted, the body budget is what holds
    threads = [
        threading.Thread(
            target=_held, args=(c.otlp, f"127.0.0.{2 + i % 4}", 16 * MIB - 1, INGEST_TOKEN, out)
        )
        for i in range(64)
    ]
    watcher = threading.Thread(target=watch)
    watcher.start()
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    done.set()
    watcher.join()
    took = sorted(d for d, _ in out)
    kinds: dict[str, int] = {}
    for _, how in out:
        kinds[how] = kinds.get(how, 0) + 1
    grew = (peak - base) / MIB
    print(
        f"64 held 16 MiB bodies: RSS {base / MIB:.0f} MiB -> peak {peak / MIB:.0f} MiB"
        f" (+{grew:.0f} MiB); closed after {took[0]:.2f}..{took[-1]:.2f} s"
        f" (deadline {BODY_S} s); {kinds}; all done in {time.monotonic() - t0:.1f} s"
    )
    assert len(out) == 64
    assert grew < 150
    assert took[-1] < BODY_S + HEADER_S + 2.0  # each closed within its deadline
    time.sleep(1.1)  # the render cache
    assert refused(c, "otlp", "body_timeout") >= 1
    assert refused(c, "otlp", "memory") >= 1
    # and the receiver answers a good request after
    assert post(c.url, b"", "application/x-protobuf", INGEST_TOKEN)[0] == 200


def test_64_bodies_without_a_token_are_refused_before_they_are_read(
    collector: Collector,
) -> None:
    c = collector
    base = c.rss()
    socks = []
    for i in range(64):
        s = socket.create_connection(
            ("127.0.0.1", c.otlp), timeout=5, source_address=(f"127.0.0.{2 + i % 4}", 0)
        )
        s.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + f"Content-Length: {16 * MIB - 1}\r\n\r\n".encode()
            + b"\0" * 65536
        )
        socks.append(s)
    t0 = time.monotonic()
    answers = []
    for s in socks:
        with s:
            answers.append(s.recv(12))
    took = time.monotonic() - t0
    grew = (c.rss() - base) / MIB
    print(
        f"64 bodies without a token: {answers.count(b'HTTP/1.1 401')} answered 401 in"
        f" {took:.2f} s, RSS +{grew:.0f} MiB"
    )
    assert answers == [b"HTTP/1.1 401"] * 64
    assert grew < 50


def test_half_sent_headers_are_closed_at_their_deadline(collector: Collector) -> None:
    c = collector
    time.sleep(1.1)  # the render cache
    before = refused(c, "otlp", "header_timeout")
    socks = []
    for i in range(30):
        s = socket.create_connection(
            ("127.0.0.1", c.otlp), source_address=(f"127.0.0.{6 + i % 2}", 0)
        )
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        socks.append(s)
    t0 = time.monotonic()
    assert post(c.url, b"", "application/x-protobuf", INGEST_TOKEN)[0] == 200  # meanwhile
    closed = []
    for s in socks:
        s.settimeout(HEADER_S + 3)
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(100) == b""
        closed.append(time.monotonic() - t0)
        s.close()
    print(f"30 half-sent requests closed within {max(closed):.2f} s (deadline {HEADER_S} s)")
    assert max(closed) < HEADER_S + 1.5
    time.sleep(1.1)  # the render cache
    assert refused(c, "otlp", "header_timeout") - before == 30


def test_idle_metrics_sockets_leave_scrapes_answered(collector: Collector) -> None:
    c = collector
    stop = threading.Event()
    reopened = [0]

    def idle_socket() -> None:
        while not stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", c.metrics), timeout=5)
            except OSError:
                time.sleep(0.05)
                continue
            with s:
                s.settimeout(0.2)
                while not stop.is_set():
                    try:
                        if s.recv(1) == b"":
                            break
                    except TimeoutError:
                        continue
                    except OSError:
                        break
            reopened[0] += 1

    idlers = [threading.Thread(target=idle_socket) for _ in range(16)]
    for t in idlers:
        t.start()
    answered = 0
    t0 = time.monotonic()
    try:
        time.sleep(0.3)
        for _ in range(30):
            try:
                c.scrape(timeout=2.0)
                answered += 1
            except OSError:
                pass
            time.sleep(0.1)
    finally:
        stop.set()
        for t in idlers:
            t.join(10)
    print(
        f"/metrics with 16 idle sockets (reopened {reopened[0]} times as they closed):"
        f" {answered} of 30 scrapes answered in {time.monotonic() - t0:.1f} s"
    )
    assert reopened[0] >= 16  # the idle timeout closed them, and they came back
    assert answered >= 29


def test_http_client_sees_401_with_a_challenge(collector: Collector) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", collector.otlp, timeout=5)
    conn.request("POST", "/v1/traces", body=b"", headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 401 and resp.getheader("WWW-Authenticate") == "Bearer"
    conn.close()


def get_cost(c: Collector, query: str, token: str | None) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(f"http://127.0.0.1:{c.otlp}/v1/kv-cost?{query}")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body.startswith(b"{") else {}


def test_the_kv_cost_endpoint_takes_only_the_reader_role(collector: Collector) -> None:
    """GET /v1/kv-cost sits beside OTLP/HTTP behind the same layer: the reader role only;
    a host the collector does not know is 404, a bad parameter 400, never a guess."""
    q = "src=gpu-1&dst=gpu-2&bytes=524288"
    assert get_cost(collector, q, None)[0] == 401
    assert get_cost(collector, q, "not-a-token")[0] == 401
    assert get_cost(collector, q, INGEST_TOKEN)[0] == 403
    status, body = get_cost(collector, q, READER_TOKEN)
    assert status == 404 and "error" in body
    for bad in ("src=a&dst=b", "src=a&dst=b&bytes=-1", "src=a&src=c&dst=b&bytes=1", "x=1"):
        assert get_cost(collector, bad, READER_TOKEN)[0] == 400, bad
