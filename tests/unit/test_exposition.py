"""render() writes exactly what prometheus_client's generate_latest() writes."""

from __future__ import annotations

import gzip
import urllib.request

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fabricprobe.collector.exporter import FabricCollector
from fabricprobe.collector.exposition import render, serve_metrics
from fabricprobe.collector.store import WindowStore
from tests.unit.test_collector_export import full_store


class Odd(Collector):
    """Label values that need escaping, and a label name the library must escape."""

    def collect(self):  # type: ignore[no-untyped-def]
        g = GaugeMetricFamily("odd_values", "help with \\ and\nnewline", labels=["v"])
        g.add_metric(['quote " back \\ nl \n end'], 1.5)
        g.add_metric(["plain"], float("inf"))
        g.add_metric(["nan"], float("nan"))
        g.add_metric(["big"], 123456789.0)
        yield g
        h = GaugeMetricFamily("odd_names", "a label name with a dot", labels=["a.b"])
        h.add_metric(["x"], 2)
        yield h


def test_render_equals_generate_latest() -> None:
    reg = CollectorRegistry()
    reg.register(FabricCollector(full_store()))
    reg.register(Odd())
    Counter("plain_events", "events", ["kind"], registry=reg).labels("a").inc(3)
    Gauge("plain_level", "level", registry=reg).set(-2.5)
    Histogram("plain_seconds", "seconds", registry=reg).observe(0.3)
    Info("plain_build", "build", registry=reg).info({"version": "1"})
    text = generate_latest(reg)
    assert b"fabricprobe_rtt_seconds_bucket{" in text and b"odd_names" in text
    assert timeless(render(reg)) == timeless(text)


def timeless(text: bytes) -> list[bytes]:
    """The lines, but for the scrape-duration gauge (it differs from scrape to scrape)."""
    return [ln for ln in text.splitlines() if not ln.startswith(b"fabricprobe_collector_scrape_d")]


def test_served_plain_and_gzip() -> None:
    reg = CollectorRegistry()
    reg.register(FabricCollector(WindowStore()))
    server = serve_metrics("127.0.0.1", 0, reg)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            plain = r.read()
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            zipped = gzip.decompress(r.read())
        assert timeless(plain) == timeless(zipped)
        try:
            urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=10)
            raise AssertionError("404 expected")
        except urllib.error.HTTPError as e:
            assert e.code == 404
    finally:
        server.shutdown()
        server.server_close()
