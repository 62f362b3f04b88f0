"""NIXL telemetry of a host's engines: vLLM's vllm:nixl_* series and NIXL's own exporter
become `nixl` counter readings; a bad source costs only itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricprobe.agent.nixl import NixlReader, parse_totals

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nixl"


def test_vllm_series_become_totals_in_the_readings_units() -> None:
    got = parse_totals((FIX / "vllm_decode_metrics.txt").read_text()).values
    assert got == {
        "transfers": 4.0,
        "xfer_time_us": pytest.approx(12_500.0),
        "post_time_us": pytest.approx(400.0),
        "bytes": 262_144.0,
        "errors": 1.0,
    }


def test_nixl_exporter_series_sum_over_labels() -> None:
    got = parse_totals((FIX / "nixl_exporter_metrics.txt").read_text()).values
    assert got == {
        "bytes": 4000.0,
        "transfers": 2.0,
        "xfer_time_us": 500.0,
        "post_time_us": 20.0,
        "errors": 3.0,
    }


def test_reader_names_the_source_and_survives_a_bad_one() -> None:
    pages = {
        "http://127.0.0.3:8000/metrics": (FIX / "vllm_decode_metrics.txt").read_bytes(),
        "http://127.0.0.2:8000/metrics": b"\x00not metrics {{{",
    }

    def fetch(url: str, timeout: float) -> bytes:
        if url.endswith(":9/metrics"):
            raise OSError("connection refused")
        return pages[url]

    r = NixlReader([*pages, "http://127.0.0.4:9/metrics"], fetch=fetch)
    out = r.sample()
    assert {(c.kind, c.device) for c in out} == {("nixl", "127.0.0.3:8000")}
    assert {c.name: c.value for c in out}["bytes"] == 262_144
    assert r.errors == 2  # the garbage page and the refused one
    with pytest.raises(ValueError):
        NixlReader(["file:///etc/passwd"])


def test_a_source_that_stays_down_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from fabricprobe.core.logs import warn_once

    log, warned = logging.getLogger("fabricprobe.test"), set[str]()
    with caplog.at_level(logging.WARNING, "fabricprobe.test"):
        for key in ("a", "a", "b", "a"):
            warn_once(log, warned, key, "%s not read: %s", key, "down")
    assert [r.getMessage() for r in caplog.records] == ["a not read: down", "b not read: down"]
    assert warned == {"a", "b"}
