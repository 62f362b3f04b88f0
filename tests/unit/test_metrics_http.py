"""/metrics served safely: one render for concurrent GETs, no thread per connection, TLS
and basic auth from a web-config file. Real HTTP on 127.0.0.1."""

from __future__ import annotations

import base64
import shutil
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from fabricprobe.collector.exposition import ScrapeStats, load_web_config, serve_metrics
from fabricprobe.core.web import Limits
from tests.support.pki import issue, make_ca


class Slow:
    """A collector that costs 50 ms per collect() and counts them."""

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> Iterator[Any]:
        self.calls += 1
        time.sleep(0.05)
        g = GaugeMetricFamily("fabricprobe_test_value", "A test value.")
        g.add_metric([], 1.0)
        yield g


def registry() -> tuple[CollectorRegistry, Slow]:
    reg = CollectorRegistry()
    slow = Slow()
    reg.register(slow)  # type: ignore[arg-type]
    return reg, slow


def get(url: str, **kw: Any) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10, **kw) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def test_concurrent_gets_share_one_render() -> None:
    reg, slow = registry()
    stats = ScrapeStats()
    server = serve_metrics("127.0.0.1", 0, reg, stats=stats, max_threads=32, cache_s=5.0)
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        got: list[int] = []
        threads = [threading.Thread(target=lambda: got.append(get(url)[0])) for _ in range(30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == [200] * 30
        assert slow.calls == 1 and stats.renders == 1  # 30 strangers, one render
    finally:
        server.shutdown()
        server.server_close()


def test_silent_sockets_take_no_thread_and_one_source_is_capped() -> None:
    """20 silent sockets from 127.0.0.2 against a cap of 8 per source: 12 are turned away
    as busy, no thread is started for any, and a scrape from 127.0.0.1 is answered."""
    reg, _ = registry()
    stats = ScrapeStats()
    before = threading.active_count()
    server = serve_metrics(
        "127.0.0.1",
        0,
        reg,
        stats=stats,
        max_threads=4,
        cache_s=0.0,
        limits=Limits(per_source=8, idle_s=5.0),
    )
    port = server.server_address[1]
    silent = [
        socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
        for _ in range(20)
    ]
    try:
        wait_until(lambda: stats.refused["busy"] >= 12)
        assert stats.refused["busy"] == 12
        assert threading.active_count() <= before + 1  # the server's own loop thread
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200
    finally:
        for s in silent:
            s.close()
        server.shutdown()


def wait_until(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed (scripts/setup.sh installs it)")
    d = tmp_path_factory.mktemp("webpki")
    make_ca(d, subject="/CN=test CA")
    issue(d, "m", "/CN=m", "subjectAltName=IP:127.0.0.1\n")
    return d


def web_config(pki: Path, extra: str = "") -> Path:
    h = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    f = pki / "web.yml"
    f.write_text(
        f"tls_server_config:\n  cert_file: {pki / 'm.pem'}\n  key_file: {pki / 'm.key'}\n"
        f"basic_auth_users:\n  prometheus: '{h}'\n{extra}"
    )
    return f


def test_tls_and_basic_auth_from_a_web_config(pki: Path) -> None:
    reg, slow = registry()
    stats = ScrapeStats()
    web = load_web_config(str(web_config(pki)))
    server = serve_metrics("127.0.0.1", 0, reg, web=web, stats=stats)
    port = server.server_address[1]
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    url = f"https://127.0.0.1:{port}/metrics"

    def auth(user: str, pw: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()}

    try:
        assert get(url, context=ctx)[0] == 401
        req = urllib.request.Request(url, headers=auth("prometheus", "wrong"))
        assert get(req, context=ctx)[0] == 401  # type: ignore[arg-type]
        assert slow.calls == 0  # nothing rendered for anyone without the password
        for _ in range(3):  # the pair checked once, then remembered
            req = urllib.request.Request(url, headers=auth("prometheus", "s3cret"))
            code, body = get(req, context=ctx)  # type: ignore[arg-type]
            assert code == 200 and b"fabricprobe_test_value 1.0" in body
        assert stats.refused["unauthorized"] == 2
        with pytest.raises(OSError):  # plain HTTP to the TLS port: no answer
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("basic_auth_users:\n  p: '$2b$04$" + "a" * 53 + "'\n", "in clear"),
        ("tls_server_config:\n  cert_file: x\n", "go together"),
        ("tls_server_config:\n  cert_file: x\n  key_file: y\n  bogus: 1\n", "unknown keys"),
        ("colour: blue\n", "unknown keys"),
        ("- a\n", "a mapping"),
        ("tls_server_config: {client_auth_type: Maybe}\n", "client_auth_type"),
    ],
)
def test_bad_web_configs_say_why(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "web.yml"
    f.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_web_config(str(f))


def test_a_password_that_is_not_a_bcrypt_hash_is_refused(pki: Path) -> None:
    f = pki / "plain.yml"
    f.write_text(
        f"tls_server_config:\n  cert_file: {pki / 'm.pem'}\n  key_file: {pki / 'm.key'}\n"
        "basic_auth_users:\n  prometheus: hunter2\n"
    )
    with pytest.raises(ValueError, match="bcrypt"):
        load_web_config(str(f))
