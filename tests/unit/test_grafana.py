"""The dashboards and rules ask only for metrics and labels the collector really exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from fabricprobe.grafana import build

ROOT = Path(__file__).resolve().parents[2]
METRIC = re.compile(r"\b(fabricprobe[a-z0-9_:]*)(\{[^}]*\})?")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
HIST_SUFFIXES = ("_bucket", "_sum", "_count")


def catalogue() -> dict[str, set[str]]:
    """metric name as queried -> labels it carries."""
    data = tomllib.loads((ROOT / "collector" / "metrics.toml").read_text())
    out: dict[str, set[str]] = {}
    tables = (
        "metric",
        "attribution_metric",
        "rawstore_metric",
        "agent_metric",
        "drift_metric",
        "link_metric",
        "rail_metric",
    )
    for m in (row for table in tables for row in data.get(table, [])):
        labels = set(m["labels"])
        if m.get("native"):  # the native form: one series under the bare name
            out[m["name"]] = out.get(m["name"], set()) | labels
        if m["type"] == "histogram" and not m.get("native_only"):
            for suffix in HIST_SUFFIXES:
                name = m["name"] + suffix
                out[name] = (
                    out.get(name, set()) | labels | ({"le"} if suffix == "_bucket" else set())
                )
        elif m["type"] != "histogram":  # a name both the collector and the agents export
            out[m["name"]] = out.get(m["name"], set()) | labels
    for r in build.RECORDING:  # recording rules keep the path labels
        out[r["record"]] = {"src", "dst", "transport", "op", "size"}
    return out


def queries() -> list[str]:
    exprs = [r["expr"] for r in build.RECORDING] + [a["expr"] for a in build.ALERTS]
    for d in build.DASHBOARDS:
        exprs += [e for row in d.rows for p in row.panels for e, _ in p.exprs]
        exprs += [q for _, q in d.variables]
    return exprs


def test_committed_files_are_current() -> None:
    assert build.main(["--check"]) == 0, "run: python -m fabricprobe.grafana.build"


@pytest.mark.parametrize("expr", queries())
def test_every_query_uses_catalogued_metrics_and_labels(expr: str) -> None:
    known = catalogue()
    found = METRIC.findall(expr)
    assert found, f"no fabricprobe metric in {expr!r}"
    for name, selector in found:
        assert name in known, f"{name} is not in collector/metrics.toml"
        for label in MATCHER.findall(selector or ""):
            assert label in known[name], f"{name} has no label {label!r}"
    for group in re.findall(r"by \(([^)]*)\)", expr):
        for label in (x.strip() for x in group.split(",")):
            assert any(label in known[n] for n, _ in found), f"no metric here has {label!r}"


def test_legends_name_labels_the_panel_queries_carry() -> None:
    known = catalogue()
    for d in build.DASHBOARDS:
        for row in d.rows:
            for p in row.panels:
                for expr, legend in p.exprs:
                    labels = set().union(*(known[n] for n, _ in METRIC.findall(expr)))
                    for used in re.findall(r"\{\{(\w+)\}\}", legend):
                        assert used in labels, f"{p.title}: legend uses {used!r}"


def test_dashboards_are_valid_grafana_json() -> None:
    for d in build.DASHBOARDS:
        doc = json.loads((ROOT / "grafana" / f"{d.uid}.json").read_text())
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids))
        assert all(t["expr"] for p in doc["panels"] for t in p.get("targets", []))


def test_promtool_accepts_the_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup.sh installs Debian's prometheus"
    res = subprocess.run(
        [promtool, "check", "rules", str(ROOT / "grafana" / "rules.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_rule_tests_pass_and_cover_every_alert() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup.sh installs Debian's prometheus"
    res = subprocess.run(
        [promtool, "test", "rules", "rules_test.yml"],
        cwd=ROOT / "grafana",
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    tests = yaml.safe_load((ROOT / "grafana" / "rules_test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for t in tests
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    alerts = {a["alert"] for a in build.ALERTS}
    assert alerts <= fired, f"alerts no test sees firing: {sorted(alerts - fired)}"


def test_every_alert_has_a_runbook() -> None:
    text = (ROOT / "grafana" / "runbooks.md").read_text()
    headings = set(re.findall(r"^## (\S+)$", text, re.M))
    for a in build.ALERTS:
        assert build.runbook_anchor(a["alert"]) in headings, a["alert"]
    rules = (ROOT / "grafana" / "rules.yml").read_text()
    assert rules.count("runbook_url:") == len(build.ALERTS)


def test_panels_have_units_heatmaps_and_top_k() -> None:
    panels = [p for d in build.DASHBOARDS for row in d.rows for p in row.panels]
    assert not [p.title for p in panels if p.unit in ("", "short")]
    kinds = {p.kind for p in panels}
    assert {"heatmap", "bargauge", "stat", "timeseries"} <= kinds
    assert any("topk(" in e for p in panels for e, _ in p.exprs)
    for p in panels:
        if p.kind == "heatmap":
            assert p.fmt == "heatmap" and all("by (le)" in e for e, _ in p.exprs)
