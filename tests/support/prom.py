"""A real Prometheus (Debian's) on loopback for tests, and the dashboards' queries against
it: every panel query, template variable and recording rule must return data."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fabricprobe.grafana import build
from tests.support.fleet import ROOT, free_port, wait_for


class Prom:
    """Prometheus' HTTP API on loopback."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            doc = json.loads(resp.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[Any]:
        return list(self.get("/api/v1/query", query=expr)["result"])

    def targets(self) -> list[tuple[str, str, str]]:
        """(scrape URL, health, last error) of every active target."""
        return [
            (t["scrapeUrl"], t["health"], t["lastError"])
            for t in self.get("/api/v1/targets")["activeTargets"]
        ]


def with_variables(expr: str) -> str:
    """A panel query with every template variable matching anything."""
    return re.sub(r'=~"\$\w+"', '=~".*"', expr)


# rows only a fleet on a routed fabric feeds (a fabric file, traced classes, rails):
# tests/integration/test_prometheus.py holds them to data from tests/support/fabricfeed.py
FABRIC_ROWS = frozenset({"Links and rails"})


def missing_queries(prom: Prom, without: frozenset[str] = frozenset()) -> list[str]:
    """Dashboard panel queries, template variables and recording rules without data; the
    panels of the rows titled in WITHOUT are not asked."""
    out = []
    for d in build.DASHBOARDS:
        for row in d.rows:
            if row.title in without:
                continue
            for p in row.panels:
                for expr, _ in p.exprs:
                    if not prom.query(with_variables(expr)):
                        out.append(f"{d.uid} / {p.title}: {expr}")
        for name, query in d.variables:
            m = re.fullmatch(r"label_values\((\w+), (\w+)\)", query)
            assert m is not None, query
            metric, label = m.groups()
            got = prom.get(f"/api/v1/label/{label}/values", **{"match[]": metric})
            if not got:
                out.append(f"{d.uid} / variable {name}: {query}")
    for r in build.RECORDING:
        if not prom.query(r["record"]):
            out.append(f"recording rule {r['record']}")
    return out


@contextmanager
def running_prometheus(
    tmp: Path,
    collectors: Sequence[str],
    agents: Sequence[str],
    *,
    interval_s: float = 3.0,
    native: bool = False,
    remote_write: dict[str, Any] | None = None,
) -> Iterator[Prom]:
    """Prometheus scraping COLLECTORS and AGENTS (HOST:PORT each) with the project's rules;
    NATIVE: started with native histograms on, so that it scrapes protobuf; REMOTE_WRITE:
    one remote_write entry (a long-term store it sends every sample and rule result to)."""
    port = free_port()
    config = tmp / "prometheus.yml"
    every = f"{interval_s:g}s"
    config.write_text(
        f"global: {{scrape_interval: {every}, evaluation_interval: 1s, scrape_timeout: {every}}}\n"
        f"rule_files: [{ROOT / 'grafana' / 'rules.yml'}]\n"
        "scrape_configs:\n"
        "  - job_name: fabricprobe-collector\n"
        f"    static_configs: [{{targets: {list(collectors)}}}]\n"
        "  - job_name: fabricprobe-agent\n"
        f"    static_configs: [{{targets: {list(agents)}}}]\n"
        + (f"remote_write: [{json.dumps(remote_write)}]\n" if remote_write else "")
    )
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            *(["--enable-feature=native-histograms"] if native else []),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = Prom(port)
    try:
        wait_for(lambda: prom.get("/api/v1/status/buildinfo"), 60, "Prometheus to start")
        yield prom
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
