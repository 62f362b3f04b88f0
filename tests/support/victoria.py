"""A real VictoriaMetrics (Debian's 1.79) and vmalert on loopback for tests, set up as
docs/victoriametrics.md tells an operator to: the scrape and remote_write configs are
read from that page's marked YAML blocks, with only the targets and ports filled in."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.support.fleet import ROOT, free_port, wait_for
from tests.support.prom import Prom

DOC = ROOT / "docs" / "victoriametrics.md"
# a test asks at once for what was just scraped: no response cache, and points visible
# after 1 s (the page's production flags keep VictoriaMetrics' defaults there)
TEST_FLAGS = ("-search.disableCache", "-search.latencyOffset=1s", "-retentionPeriod=1d")


def doc_block(name: str) -> dict[str, Any]:
    """The YAML block between `<!-- NAME:begin -->` and `<!-- NAME:end -->` of the page."""
    m = re.search(
        rf"<!-- {name}:begin -->\n```yaml\n(.*?)```\n<!-- {name}:end -->", DOC.read_text(), re.S
    )
    assert m, f"{DOC.name} has no {name} block"
    doc = yaml.safe_load(m.group(1))
    assert isinstance(doc, dict), name
    return doc


def with_targets(
    config: dict[str, Any], collectors: Sequence[str], agents: Sequence[str], every_s: float
) -> dict[str, Any]:
    """CONFIG's scrape jobs pointed at COLLECTORS and AGENTS, scraped every EVERY_S."""
    every = f"{every_s:g}s"
    config["global"] = {**config.get("global", {}), "scrape_interval": every}
    config["global"]["scrape_timeout"] = every
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"fabricprobe-collector", "fabricprobe-agent"}, sorted(jobs)
    jobs["fabricprobe-collector"]["static_configs"] = [{"targets": list(collectors)}]
    jobs["fabricprobe-agent"]["static_configs"] = [{"targets": list(agents)}]
    return config


@contextmanager
def _process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextmanager
def running_victoria(tmp: Path, scrape: dict[str, Any] | None = None) -> Iterator[Prom]:
    """victoria-metrics on loopback (its Prometheus query API is PROM's); with SCRAPE (a
    Prometheus-style scrape config) it scrapes the targets itself."""
    port = free_port()
    argv = [
        "victoria-metrics",
        f"-storageDataPath={tmp / 'vm-data'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        *TEST_FLAGS,
    ]
    if scrape is not None:
        config = tmp / "vm-scrape.yml"
        config.write_text(yaml.safe_dump(scrape))
        argv.append(f"-promscrape.config={config}")
    with _process(argv, tmp / "victoria-metrics.log"):
        vm = Prom(port)
        wait_for(lambda: _answers(vm), 60, "VictoriaMetrics to start")
        yield vm


def _answers(vm: Prom) -> bool:
    try:
        vm.query("1")
    except OSError:
        return False
    return True


class VmAlert:
    """vmalert's HTTP API: the health of every rule it evaluates."""

    def __init__(self, port: int) -> None:
        self.api = Prom(port)

    def rules(self) -> list[dict[str, Any]]:
        return [r for g in self.api.get("/api/v1/rules")["groups"] for r in g["rules"]]


@contextmanager
def running_vmalert(tmp: Path, vm: Prom) -> Iterator[VmAlert]:
    """vmalert evaluating grafana/rules.yml every second against VM and writing the recorded
    series (and alert states) back into it. Its notifier is a loopback port nothing
    listens on: the alerts are evaluated and their states stored, but nobody is paged."""
    port, nobody = free_port(), free_port()
    argv = [
        "vmalert",
        f"-rule={ROOT / 'grafana' / 'rules.yml'}",
        f"-datasource.url={vm.base}",
        f"-remoteWrite.url={vm.base}",
        f"-notifier.url=http://127.0.0.1:{nobody}",
        "-evaluationInterval=1s",
        f"-httpListenAddr=127.0.0.1:{port}",
    ]
    with _process(argv, tmp / "vmalert.log"):
        alert = VmAlert(port)
        wait_for(lambda: _rules_loaded(alert), 60, "vmalert to load the rules")
        yield alert


def _rules_loaded(alert: VmAlert) -> bool:
    try:
        return bool(alert.rules())
    except OSError:
        return False
