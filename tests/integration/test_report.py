"""`probe report` against a real fleet on loopback: a collector over mutual TLS, three
agents probing each other, workload spans through the OpenTelemetry SDK, a real
Prometheus scraping the collector; the page is then rendered in headless Chromium and
what the screenshot and the DOM show is checked."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.cli.commands.why import query as why_query
from fabricprobe.cli.options import CollectorCredentials
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.auth import MutualTls
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.models import PRESETS
from fabricprobe.probes.ethtool import CommandResult
from fabricprobe.report.rtt import cdf_quantile
from fabricprobe.workload.pipeline import Host, WorkloadConfig, run_pipeline
from fabricprobe.workload.spans import emit_request
from tests.integration.test_loopback_fleet import FIXTURES, free_port, wait_for
from tests.support.fleet import open_responder
from tests.support.pki import issue, make_ca

HOSTS = {"host-2": "127.0.0.2", "host-3": "127.0.0.3", "host-4": "127.0.0.4"}
TOR = {"host-2": "tor-a", "host-3": "tor-a", "host-4": "tor-b"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, subject="/CN=report test CA")
    issue(d, "collector", "/CN=collector", "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in [*HOSTS, "reader", "engine"]:
        issue(d, name, f"/CN={name}", f"subjectAltName=DNS:{name}\n")
    return d


@pytest.fixture
def collector(pki: Path) -> Iterator[CollectorServer]:
    auth = MutualTls.from_files(
        str(pki / "collector.pem"),
        str(pki / "collector.key"),
        str(pki / "ca.pem"),
        readers=frozenset({"reader"}),  # the report's certificate: it may query
        ingest=frozenset({"engine"}),  # the inference server's: it may send spans
    )
    cfg = ServerConfig(
        listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        grace=0.5,
        api=ApiConfig(
            report_interval_ms=1000,
            plan=PlanConfig(interval_ms=300, count=5, budget=8),
            trust_local_registration=True,  # agents on 127.0.0.N call from 127.0.0.1
        ),
    )
    server = CollectorServer(cfg, auth)
    server.start()
    yield server
    server.stop(0)


def agent_config(tmp: Path, pki: Path, name: str, port: int) -> AgentConfig:
    return AgentConfig(
        host=name,
        collector=f"127.0.0.1:{port}",
        topology=TOR[name],
        probe_listen=f"{HOSTS[name]}:0",
        spool_dir=str(tmp / name),
        sysfs_root=str(tmp / "no-sysfs"),
        ethtool=False,
        ca_file=str(pki / "ca.pem"),
        cert_file=str(pki / f"{name}.pem"),
        key_file=str(pki / f"{name}.key"),
        probe_token_file=str(probe_token(tmp)),
        window_s=1.0,
        probe_timeout=3.0,
    )


def probe_token(tmp: Path) -> Path:
    """The fleet's probe token, the same for every agent of the test."""
    path = tmp / "probe-token"
    if not path.exists():
        path.write_text(secrets.token_hex(32) + "\n")
        path.chmod(0o600)
    return path


@pytest.fixture
def prometheus(collector: CollectorServer, tmp_path: Path) -> Iterator[str]:
    exe = shutil.which("prometheus")
    assert exe, "Debian's prometheus package is needed (scripts/setup.sh installs it)"
    port = free_port()
    conf = tmp_path / "prometheus.yml"
    conf.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: fabricprobe\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{collector.metrics_port}']}}]\n"
    )
    proc = subprocess.Popen(
        [
            exe,
            f"--config.file={conf}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def prom_series(base: str, query: str) -> int:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return len(json.loads(r.read())["data"]["result"])
    except OSError:
        return 0


def send_spans(pki: Path, port: int, responder_port: int) -> list[str]:
    """Workload requests host-2 -> host-3 and host-4 -> host-3 as SDK spans, over TLS."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    creds = grpc.ssl_channel_credentials(
        (pki / "ca.pem").read_bytes(),
        (pki / "engine.key").read_bytes(),
        (pki / "engine.pem").read_bytes(),
    )
    provider = TracerProvider(resource=Resource.create({"service.name": "report-test"}))
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", credentials=creds, timeout=10)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    tracer = provider.get_tracer("report-test")
    cfg = WorkloadConfig(
        model=PRESETS["Qwen2.5-7B"],
        prompt_tokens=64,
        output_tokens=4,
        prefill_s_per_token=1e-5,
        decode_step_s=0.001,
        requests=8,
        transport="tcp",
        port=responder_port,
    )
    dst = Host("host-3", HOSTS["host-3"])
    paths = [(Host("host-2", HOSTS["host-2"]), dst), (Host("host-4", HOSTS["host-4"]), dst)]
    results = run_pipeline(paths, cfg, on_request=lambda r: emit_request(tracer, r, "qwen"))
    provider.force_flush(10_000)
    provider.shutdown()
    assert [r.error for r in results] == [None] * len(results)
    return [r.request_id for r in results]


def run_report(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabricprobe", "report", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium")
    assert exe, "Debian's chromium package is needed (scripts/setup.sh installs it)"
    return subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def locate(shot: np.ndarray, picture: np.ndarray) -> tuple[int, int]:
    """Where PICTURE (drawn at its own size) sits in SHOT: top-left (y, x). The search
    key is the picture's most varied 48-pixel run of one row, so few places match it."""
    h, w = picture.shape[:2]
    best, y0, x0 = -1, 0, 0
    for y in range(0, h, 4):
        for x in range(0, w - 48, 16):
            n = len({tuple(c) for c in picture[y, x : x + 48]})
            if n > best:
                best, y0, x0 = n, y, x
    key = picture[y0, x0 : x0 + 48]
    for dx in range(0, shot.shape[1] - w + 1):
        seg = shot[y0 : shot.shape[0] - h + y0 + 1, dx + x0 : dx + x0 + 48]
        for y in np.nonzero(np.all(np.abs(seg - key) <= 3, axis=(1, 2)))[0][:20]:
            crop = shot[y : y + h, dx : dx + w]
            if np.mean(np.abs(crop - picture) <= 3) > 0.99:
                return int(y), int(dx)
    raise AssertionError("picture not found in the screenshot")


def _joined_with_figures(collector: CollectorServer, n: int) -> bool:
    """Whether N requests are joined and each KV transfer has its path's RTT: a request
    that settles before its path's windows are in keeps no figures, so the agents must
    not stop until every transfer has them."""
    res = collector.attribution.analyse(max_age_s=0)
    return len(res.requests) >= n and int(res.kv["rtt_p99_s"].notna().sum()) >= n


def test_report_renders_in_chromium(
    collector: CollectorServer, prometheus: str, pki: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    ethtool_text = (FIXTURES / "ethtool" / "mlx5_core.txt").read_text()

    def ethtool(argv: Sequence[str], timeout: float) -> CommandResult:
        return CommandResult(0, ethtool_text)

    configs = [agent_config(tmp_path, pki, n, collector.port) for n in HOSTS]
    configs[0].sysfs_root, configs[0].ethtool = str(FIXTURES / "sys" / "mlx5"), True
    agents = [Agent(configs[0], ethtool_runner=ethtool)] + [Agent(c) for c in configs[1:]]
    for a in agents:
        a.start()
    try:
        with open_responder(HOSTS["host-3"]) as kv_sink:
            names = list(HOSTS)
            pairs = len(names) * (len(names) - 1)
            rtt = "fabricprobe_rtt_seconds_bucket"
            wait_for(
                lambda: (
                    prom_series(prometheus, f'count(rate({rtt}{{le="+Inf"}}[5s]) > 0)') > 0
                    and prom_series(prometheus, f'{rtt}{{le="+Inf"}}') >= pairs
                ),
                timeout=60,
                what="every pair's RTT buckets in Prometheus, with a rate",
            )
            request_ids = send_spans(pki, collector.port, kv_sink.port)
        wait_for(
            lambda: _joined_with_figures(collector, len(request_ids)),
            what="the requests joined by the collector, each with its path's RTT figures",
        )
        wait_for(
            lambda: all((n, n, "tcp", "pingpong", 64) in collector.store.paths for n in names),
            what="each host's reference (its probe of its own responder)",
        )
    finally:
        for a in agents:  # no probe left in flight to a responder that closes
            a.stop()
            a.scheduler.stop()
        for a in agents:
            a.close()
    # the agents are closed: the collector's figures hold still while the report and
    # `probe why` read them
    out = tmp_path / "report"
    tls = ["--ca-file", str(pki / "ca.pem"), "--cert-file", str(pki / "reader.pem"),
           "--key-file", str(pki / "reader.key")]  # fmt: skip
    metrics = f"http://127.0.0.1:{collector.metrics_port}/metrics"
    common = ["--collector", f"127.0.0.1:{collector.port}", "--window", "120",
              "--metrics-url", metrics]  # fmt: skip
    res = run_report([*common, *tls, "--prometheus", prometheus, "--out", str(out)])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(out / "report.html")
    assert not res.stderr, res.stderr  # every source answered
    why_started = time.monotonic()
    why_args = ["why", "--json", "--window", "120", "--collector", f"127.0.0.1:{collector.port}"]
    why = subprocess.run(
        [sys.executable, "-m", "fabricprobe", *why_args, *tls],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert why.returncode == 0, why.stderr
    why_took = time.monotonic() - why_started

    # plain text, or TLS without the client certificate: the collector refuses
    for creds in (
        CollectorCredentials(insecure=True),
        CollectorCredentials(ca_file=str(pki / "ca.pem")),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            why_query(f"127.0.0.1:{collector.port}", 1, 60, "e2e_s", 5, creds)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    # a host's certificate does not make a reader, for the Why query or the Rtt query
    host = CollectorCredentials(
        ca_file=str(pki / "ca.pem"),
        cert_file=str(pki / "host-2.pem"),
        key_file=str(pki / "host-2.key"),
    )
    with pytest.raises(grpc.RpcError) as refused:
        why_query(f"127.0.0.1:{collector.port}", 1, 60, "e2e_s", 5, host)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as refused:
        host.call(f"127.0.0.1:{collector.port}", "Rtt", pb.RttRequest(), 5)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    took = time.monotonic() - started

    page = out / "report.html"
    html = page.read_text()
    assert "http://" not in html.split("<body>", 1)[1].split("<dt>metrics</dt>")[0]
    for png in ("rtt_cdf.png", "own_delay_cdf.png", "heatmap_0.png", "tor_matrix.png",
                "waterfall.png"):  # fmt: skip
        assert (out / png).stat().st_size > 5000, png
    assert (out / "rtt_p99_over_time.png").exists()

    dom = chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr
    text = dom.stdout
    for heading in ("RTT over time (Prometheus)", "RTT per path", "Heatmaps: src × dst",
                    "ToR matrix", "Slowest requests", "Counters per host",
                    "Validate verdicts per host", "No verdicts reported"):  # fmt: skip
        assert heading in text, heading
    for s in names:
        for d in names:
            if s != d:
                assert f"{s} → {d} tcp pingpong 64 B" in text, (s, d)
    shown = [r for r in request_ids if f"request {r}" in text]
    assert len(shown) == min(10, len(request_ids)), shown
    assert "host-2 → host-3 tcp" in text and "host-4 → host-3 tcp" in text
    assert "tor-a" in text and "tor-b" in text
    # the join found each request's path figures: its RTT p99 at the time is a number
    p99 = re.findall(r'<td class="l">RTT p99</td><td>([^<]*)</td>', text)
    assert len(p99) == len(shown) and all(v.endswith(" µs") for v in p99), p99

    # the report's figures agree with `probe why --json`'s for the same paths: its CDFs
    # (rtt_cdf.csv, read as the report reads them) and the table the page shows, within
    # the sketches' 1 %
    ranked = json.loads(why.stdout)["rtt"]
    assert {(r["src"], r["dst"]) for r in ranked} >= {("host-2", "host-3"), ("host-4", "host-3")}
    cdf = pd.read_csv(out / "rtt_cdf.csv", dtype={"src": str, "dst": str, "size": str})
    paths_html = section(text, "RTT per path")
    table = {row[0]: row[1:] for row in rows(paths_html)}
    for r in ranked:
        key = (r["src"], r["dst"], r["transport"], r["op"], str(r["size"]))
        cols = ["src", "dst", "transport", "op", "size"]
        g = cdf[(cdf[cols] == pd.Series(key, index=cols)).all(axis=1)]
        assert len(g) > 3 and (g["schema"] == 6).all() and not g["host_reference"].any(), key
        assert g["total"].iloc[0] == r["count"]
        for q, name in ((0.5, "p50_s"), (0.9, "p90_s"), (0.99, "p99_s"), (0.999, "p999_s")):
            got = cdf_quantile(g, q, g["min_s"].iloc[0], g["max_s"].iloc[0])
            assert abs(got / r[name] - 1) <= 0.01, (key, name, got, r[name])
        # exchanges, loss, then min, p50, p90, p99, p99.9 and max in µs, as printed
        row = table[f"{r['src']} → {r['dst']} {r['transport']} {r['op']} {r['size']} B"]
        assert int(row[0].replace(",", "")) == r["count"]
        for v, name in zip(row[2:], ("min_s", "p50_s", "p90_s", "p99_s", "p999_s", "max_s"),
                           strict=True):  # fmt: skip
            assert abs(float(v.replace(",", "")) / (r[name] * 1e6) - 1) <= 0.01, (key, name, v)
    # no host reference among the paths: each is in its own section, as the host's delay
    for n in names:
        assert f"{n} → {n}" not in paths_html
    (drawn,) = re.findall(r"<figcaption>Paths drawn \(6\): ([^<]*)\.</figcaption>", paths_html)
    assert set(drawn.split("; ")) == {f"{s} → {d} tcp pingpong 64 B"
                                      for s in names for d in names if s != d}  # fmt: skip
    own = rows(section(text, "Each host's own delay (its reference, not a path)"))
    assert sorted(r[:2] for r in own) == [[n, "own delay (tcp pingpong 64 B)"] for n in names]
    assert {r[0] for r in rows(paths_html)} == {
        f"{s} → {d} tcp pingpong 64 B" for s in names for d in names if s != d
    }
    timed = section(text, "RTT over time (Prometheus)")
    assert "Paths drawn: " in timed and "host-2 → host-3 tcp" in timed
    assert not any(f"{n} → {n}" in timed for n in names)

    shot_file = tmp_path / "shot.png"
    shot = chromium(f"--screenshot={shot_file}", "--window-size=1400,7000", page.as_uri())
    assert shot.returncode == 0, shot.stderr
    screen = (imread(shot_file)[:, :, :3] * 255).astype(np.int16)
    heat = (imread(out / "heatmap_0.png")[:, :, :3] * 255).astype(np.int16)
    top, left = locate(screen, heat)
    # the p50 panel (the left third of the heatmap as the browser drew it): its cells are
    # areas of one colour each, several colours for several RTTs, grey where not probed
    h, w = heat.shape[:2]
    panel = screen[top : top + h, left : left + w // 3].reshape(-1, 3)
    colours, area = np.unique(panel, axis=0, return_counts=True)
    cells = [c for c, n in zip(colours, area, strict=True) if n >= 400 and np.ptp(c) > 30]
    assert len(cells) >= 3, f"{len(cells)} cell colours in the p50 heatmap"
    grey = np.all(np.abs(panel - 238) <= 2, axis=1).sum()  # unprobed diagonal cells
    assert grey > 1000
    for png in ("rtt_cdf.png", "own_delay_cdf.png", "waterfall.png"):
        pic = (imread(out / png)[:, :, :3] * 255).astype(np.int16)
        locate(screen, pic)  # drawn, not a broken-image icon
    print(f"report test: fleet and report in {took:.1f} s (probe why --json: {why_took:.1f} s)")


def section(dom: str, title: str) -> str:
    """The HTML of the page's section titled TITLE, as the browser serialised it."""
    after = dom.split(f"<h2>{title}</h2>", 1)
    assert len(after) == 2, title
    return after[1].split("</section>", 1)[0]


def rows(html: str) -> list[list[str]]:
    """The cells of each table row of HTML (header rows left out)."""
    out = []
    for tr in re.findall(r"<tr>(.*?)</tr>", html, flags=re.S):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", tr, flags=re.S)
        if cells:
            out.append(cells)
    return out
