"""The deploy files, checked with the tools that judge them: `systemd-analyze security` on
the units, `helm lint` and `helm template` on the chart, kubernetes-validate (the
Kubernetes API's own schemas) on every rendered object, promtool on the PrometheusRule,
and the committed plain manifests held to what the chart renders.

Regenerate deploy/kubernetes/fabricprobe.yaml after a chart change with
    FABRICPROBE_UPDATE_DEPLOY=1 .venv/bin/python -m pytest tests/unit/test_deploy.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "fabricprobe"
PLAIN = DEPLOY / "kubernetes" / "fabricprobe.yaml"
HELM = Path(os.environ.get("FABRICPROBE_TOOLS", "/opt/fabricprobe-tools")) / "bin" / "helm"
# systemd-analyze's exposure score: 0 is fully confined, 10 is a process with no limits.
EXPOSURE = {"fabricprobe-collector.service": 2.0, "fabricprobe-agent.service": 2.0}
K8S_VERSION = "1.30.0"


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    if not HELM.exists():
        pytest.fail(f"no helm at {HELM}: run scripts/install-deploy-tools.sh", pytrace=False)
    return subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(*sets: str) -> list[dict[str, Any]]:
    args = ["template", "fabricprobe", str(CHART), "--namespace", "fabricprobe"]
    for s in sets:
        args += ["--set", s]
    res = helm(*args)
    assert res.returncode == 0, res.stderr
    return [doc for doc in yaml.safe_load_all(res.stdout) if doc]


@pytest.mark.parametrize("unit", sorted(EXPOSURE))
def test_systemd_unit_exposure(unit: str) -> None:
    res = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(DEPLOY / "systemd" / unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", res.stdout + res.stderr)
    assert found, res.stdout + res.stderr
    score = float(found.group(1))
    print(f"{unit}: exposure {score}")
    assert score <= EXPOSURE[unit], f"{unit} exposure {score} > {EXPOSURE[unit]}"


def test_units_run_as_their_own_user_without_capabilities() -> None:
    for unit in EXPOSURE:
        text = (DEPLOY / "systemd" / unit).read_text()
        assert "User=fabricprobe" in text and "\nCapabilityBoundingSet=\n" in text, unit
    users = (DEPLOY / "systemd" / "fabricprobe.sysusers.conf").read_text()
    assert re.search(r"^u fabricprobe ", users, re.M)


def test_chart_lints() -> None:
    res = helm("lint", "--strict", str(CHART))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(
    "sets",
    [(), ("agent.rdma.mode=privileged",), ("collector.tlsSecret=", "agent.tlsSecret=")],
    ids=["default", "privileged", "plain-text"],
)
def test_rendered_objects_pass_the_kubernetes_schemas(sets: tuple[str, ...], tmp_path) -> None:
    docs = render(*sets)
    core = [d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    path = tmp_path / "core.yaml"
    path.write_text(yaml.safe_dump_all(core))
    res = subprocess.run(
        [
            str(Path(sys.executable).parent / "kubernetes-validate"),
            "--strict",
            "--quiet",
            "-k",
            K8S_VERSION,
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("DaemonSet") == 1 and kinds.count("Deployment") == 1, kinds


def agent_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    return ds["spec"]["template"]["spec"]["containers"][0]


def test_agent_gets_rdma_devices_the_way_clusters_do() -> None:
    plugin = agent_container(render())
    assert plugin["resources"]["limits"]["rdma/hca_shared_devices_a"] == 1
    assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert not plugin["securityContext"].get("privileged")
    assert all(m["mountPath"] != "/dev/infiniband" for m in plugin["volumeMounts"])
    privileged = agent_container(render("agent.rdma.mode=privileged"))
    assert privileged["securityContext"]["privileged"] is True
    assert any(m["mountPath"] == "/dev/infiniband" for m in privileged["volumeMounts"])
    assert "rdma/hca_shared_devices_a" not in privileged["resources"]["limits"]


def test_values_are_validated() -> None:
    res = helm("template", "x", str(CHART), "--set", "agent.rdma.mode=bogus")
    assert res.returncode != 0 and "mode" in res.stderr
    res = helm("template", "x", str(CHART), "--set", "collector.grpcPort=70000")
    assert res.returncode != 0


def test_monitoring_objects(tmp_path: Path) -> None:
    docs = render()
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    ports = {p["name"] for p in svc["spec"]["ports"]}
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= ports
    (pm,) = [d for d in docs if d["kind"] == "PodMonitor"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= (
        ds["spec"]["template"]["metadata"]["labels"].items()
    )
    agent_ports = {p["name"] for p in agent_container(docs)["ports"]}
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} <= agent_ports
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    if not shutil.which("promtool"):
        pytest.fail("promtool is missing: run scripts/setup.sh", pytrace=False)
    res = subprocess.run(
        ["promtool", "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert rule["spec"] == yaml.safe_load((ROOT / "grafana" / "rules.yml").read_text())
    (dash,) = [d for d in docs if d["metadata"]["name"].endswith("-dashboards")]
    for name, text in dash["data"].items():
        assert json.loads(text) == json.loads((ROOT / "grafana" / name).read_text()), name
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_plain_manifests_are_the_charts_defaults() -> None:
    res = helm("template", "fabricprobe", str(CHART), "--namespace", "fabricprobe")
    assert res.returncode == 0, res.stderr
    header = "# Rendered from deploy/helm/fabricprobe with its default values; do not edit.\n"
    want = header + res.stdout
    if os.environ.get("FABRICPROBE_UPDATE_DEPLOY"):
        PLAIN.write_text(want)
    assert PLAIN.read_text() == want, "stale: FABRICPROBE_UPDATE_DEPLOY=1 pytest " + __file__


def test_grafana_provisioning_files() -> None:
    base = DEPLOY / "grafana" / "provisioning"
    ds = yaml.safe_load((base / "datasources" / "fabricprobe.yaml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
    dash = yaml.safe_load((base / "dashboards" / "fabricprobe.yaml").read_text())
    assert dash["providers"][0]["type"] == "file" and dash["providers"][0]["options"]["path"]


def test_example_prometheus_config() -> None:
    if not shutil.which("promtool"):
        pytest.fail("promtool is missing: run scripts/setup.sh", pytrace=False)
    res = subprocess.run(
        ["promtool", "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
