"""report.build/page/figures on hostile input, and what report.sources sends."""

from __future__ import annotations

import base64
import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from fabricprobe.core.errors import ConfigError
from fabricprobe.report import build
from fabricprobe.report.sources import HttpAuth, SourceError, fetch_metrics, prometheus_range
from tests.unit.test_metrics_http import pki, registry, web_config  # noqa: F401  (pki: a fixture)
from tests.unit.test_report_rtt import fleet_doc

EVIL = '<script>alert("x")</script>$\\frac{a}{b}$' + "x" * 300


def exposition(hosts: list[str]) -> str:
    lines = ["# TYPE fabricprobe_rtt_seconds histogram"]
    for i, s in enumerate(hosts):
        for j, d in enumerate(hosts):
            if s == d:
                continue
            lab = f'dst="{d}",op="pingpong",size="64",src="{s}",transport="tcp"'
            n = 10 + i + j
            for le, c in (("1e-5", 0), ("2e-5", n // 2), ("5e-5", n), ("+Inf", n)):
                lines.append(f'fabricprobe_rtt_seconds_bucket{{{lab},le="{le}"}} {c}')
            lines.append(f"fabricprobe_probe_exchanges_total{{{lab}}} {n}")
            lines.append(f"fabricprobe_probe_lost_total{{{lab}}} {i % 2}")
        lines.append(f'fabricprobe_host_info{{src="{s}",topology="tor-{i % 3}",version="1"}} 1')
        lines.append(f'fabricprobe_host_up{{src="{s}"}} 1')
    return "\n".join(lines) + "\n"


def escaped(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"')


@pytest.fixture
def opts(tmp_path: Path) -> build.ReportOptions:
    return build.ReportOptions(
        collector="127.0.0.1:1",
        metrics_url="http://127.0.0.1:1/metrics",
        out_dir=tmp_path / "out",
        auth=HttpAuth(),
    )


def hostile_doc(hosts: list[str]) -> dict[str, object]:
    """An Rtt reply of HOSTS (as names the collector might hold), every pair and each
    host's reference."""
    doc = fleet_doc(["h0", "h1", "h2"], windows=1)
    for m in doc["paths"] + doc["host_references"]:
        m["src"], m["dst"] = hosts[int(m["src"][1])], hosts[int(m["dst"][1])]
    return doc


def test_hostile_labels_are_escaped_bounded_and_drawn(opts: build.ReportOptions) -> None:
    hosts = [EVIL, "b$", "c"]
    slow = [{"request_id": EVIL, "src": EVIL, "dst": "c", "transport": "tcp",
             "prefill_s": 0.01, "kv_transfer_s": 0.02, "rtt_p99_s": 3e-5}]  # fmt: skip
    text = exposition([escaped(h) for h in hosts])
    g = build.Gathered(text, {"slowest": slow}, "", rtt=hostile_doc(hosts))
    page = build.write(g, opts).read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "x" * 250 not in page  # labels are cut short
    for png in ("rtt_cdf.png", "own_delay_cdf.png", "heatmap_0.png", "tor_matrix.png",
                "waterfall.png"):  # fmt: skip
        assert (opts.out_dir / png).read_bytes().startswith(b"\x89PNG")
    csv = (opts.out_dir / "rtt_cdf.csv").read_text().splitlines()
    assert csv[0].startswith("host_reference,src,dst,transport,op,size,lower_s,upper_s,")
    assert len(csv) > 9  # a row per bucket of the 6 paths and 3 references
    # nothing the page shows is fetched: pictures inline, no script, no link outward
    assert not re.search(r'(src|href)="(?!data:image/png;base64,|#s\d)', page)
    assert "Content-Security-Policy" in page


def test_many_paths_and_requests_are_bounded(opts: build.ReportOptions) -> None:
    hosts = [f"h{i:02d}" for i in range(45)]
    slow = [{"request_id": f"r{i}", "e2e_s": 1.0, "decode_s": 0.5} for i in range(25)]
    doc = fleet_doc(hosts, windows=1, max_paths=build.RTT_PATHS)
    g = build.Gathered(exposition(hosts), {"slowest": slow}, "", rtt=doc)
    secs, _, dropped = build.sections(g, opts)
    text = " ".join(" ".join(s.parts) for s in secs)
    assert f"{45 * 44 - build.MAX_PATHS} more paths not drawn" in text
    assert f"{build.RTT_PATHS - 60} more not shown" in text  # the table's rows
    assert f"The collector holds {45 * 44 - build.RTT_PATHS} more paths than it sent" in text
    assert "5 more hosts not shown" in text
    assert "15 more requests not shown" in text
    assert text.count('<div class="request">') == build.MAX_REQUESTS
    assert dropped == 0


def test_sources_that_failed_say_so(opts: build.ReportOptions) -> None:
    g = build.Gathered("", None, "collector x: UNAVAILABLE: down", prom_error="p: HTTP 500",
                       rtt_error="collector x: UNIMPLEMENTED: older")  # fmt: skip
    secs, pics, _ = build.sections(g, build.ReportOptions(**{**opts.__dict__, "prometheus": "p"}))
    text = " ".join(" ".join(s.parts) for s in secs)
    assert "Why query failed: collector x: UNAVAILABLE: down" in text
    assert "Prometheus query failed: p: HTTP 500" in text
    assert text.count("Rtt query failed: collector x: UNIMPLEMENTED: older") == 4
    assert "No verdicts reported" in text
    assert pics == []


def test_basic_auth_files_are_checked(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("no colon here\n")
    with pytest.raises(ConfigError, match="USER:PASSWORD"):
        HttpAuth(basic_file=str(tmp_path / "pw")).basic()
    with pytest.raises(ConfigError, match="No such file"):
        HttpAuth(basic_file=str(tmp_path / "none")).basic()
    (tmp_path / "pw").write_text("prom:s3cret:with:colons\n")
    assert (
        HttpAuth(basic_file=str(tmp_path / "pw")).basic()
        == "Basic " + base64.b64encode(b"prom:s3cret:with:colons").decode()
    )


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []
    body = b"fabricprobe_host_up 1\n"

    def do_GET(self) -> None:
        type(self).seen.append({"path": self.path, **dict(self.headers)})
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_password_goes_to_the_collector_only_and_never_in_clear(
    recorder: str, tmp_path: Path
) -> None:
    (tmp_path / "pw").write_text("prom:s3cret\n")
    auth = HttpAuth(basic_file=str(tmp_path / "pw"))
    with pytest.raises(ConfigError, match="basic auth only over https"):
        fetch_metrics(recorder + "/metrics", auth, timeout=5)
    assert _Recorder.seen == []  # refused before connecting
    assert fetch_metrics(recorder + "/metrics", HttpAuth(), timeout=5) == "fabricprobe_host_up 1\n"
    with pytest.raises(SourceError, match="not JSON"):  # the recorder answers text
        prometheus_range(recorder, "up", start=0, end=1, step=1, auth=auth, timeout=5)
    assert "Authorization" not in _Recorder.seen[-1]
    assert _Recorder.seen[-1]["path"].startswith("/api/v1/query_range?query=up&")


def test_only_http_urls_are_read() -> None:
    with pytest.raises(SourceError, match="only http"):
        fetch_metrics("file:///etc/passwd", HttpAuth(), timeout=1)


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fabricprobe.cli import main
    from tests.integration.test_loopback_fleet import free_port

    res = CliRunner().invoke(main, ["report", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "no TLS: give --ca-file" in res.output
    res = CliRunner().invoke(main, ["report", "--insecure", "--cert-file", "c"])
    assert res.exit_code == 2 and "go together" in res.output
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    args = ["report", "--insecure", "--metrics-url", dead, "--out", str(tmp_path), "--timeout", "2"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and res.output.startswith(f"probe: error: {dead}: ")
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "report.html").exists()


def test_metrics_behind_a_web_config(pki: Path, tmp_path: Path) -> None:  # noqa: F811
    """TLS and basic auth as the collector's /metrics serves them (its web config)."""
    from fabricprobe.collector.exposition import load_web_config, serve_metrics

    reg, _ = registry()
    server = serve_metrics("127.0.0.1", 0, reg, web=load_web_config(str(web_config(pki))))
    url = f"https://127.0.0.1:{server.server_address[1]}/metrics"
    (tmp_path / "pw").write_text("prometheus:s3cret\n")
    try:
        good = HttpAuth(ca_file=str(pki / "ca.pem"), basic_file=str(tmp_path / "pw"))
        assert "fabricprobe_test_value 1.0" in fetch_metrics(url, good, timeout=5)
        with pytest.raises(SourceError, match="HTTP 401"):
            fetch_metrics(url, HttpAuth(ca_file=str(pki / "ca.pem")), timeout=5)
        with pytest.raises(SourceError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch_metrics(url, HttpAuth(basic_file=str(tmp_path / "pw")), timeout=5)
    finally:
        server.shutdown()
        server.server_close()
