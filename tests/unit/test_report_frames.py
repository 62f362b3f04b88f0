"""report.frames: exposition text and Why rows into frames, on small hand-made inputs
(the Rtt reply's frames: tests/unit/test_report_rtt.py)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fabricprobe.report import frames

LES = ["1e-6", "2e-6", "5e-6", "1e-5", "+Inf"]


def histogram(src: str, dst: str, counts: list[int], transport: str = "tcp") -> str:
    labels = f'dst="{dst}",op="pingpong",size="64",src="{src}",transport="{transport}"'
    lines = [
        f'fabricprobe_rtt_seconds_bucket{{{labels},le="{le}"}} {n}'
        for le, n in zip(LES, counts, strict=True)
    ]
    lines.append(f"fabricprobe_rtt_seconds_count{{{labels}}} {counts[-1]}")
    lines.append(f"fabricprobe_probe_exchanges_total{{{labels}}} {counts[-1] + 2}")
    lines.append(f"fabricprobe_probe_lost_total{{{labels}}} 2")
    return "\n".join(lines)


TEXT = "\n".join(
    [
        "# TYPE fabricprobe_rtt_seconds histogram",
        histogram("a", "b", [0, 10, 90, 100, 100]),
        histogram("b", "a", [0, 0, 50, 98, 100]),
        histogram("a", "c", [0, 0, 0, 0, 0]),
        'fabricprobe_host_info{src="a",topology="tor-1",version="0.1"} 1',
        'fabricprobe_host_info{src="b",topology="tor-1",version="0.1"} 1',
        'fabricprobe_host_info{src="c",topology="",version="0.1"} 1',
        'fabricprobe_host_up{src="a"} 1',
        'fabricprobe_host_up{src="b"} 0',
        'fabricprobe_pfc_rx_pause_frames_total{netdev="e0",priority="3",src="a"} 5',
        'fabricprobe_pfc_tx_pause_frames_total{netdev="e0",priority="3",src="a"} 7',
        'fabricprobe_pfc_rx_discards_total{netdev="e0",priority="3",src="a"} 1',
        'fabricprobe_netdev_stat_total{counter="rx_ecn_mark",netdev="e0",src="a"} 11',
        'fabricprobe_rdma_port_stat_total{counter="np_cnp_sent",device="m0",port="1",src="a"} 3',
        'fabricprobe_rdma_port_stat_total{counter="packet_seq_err",device="m0",port="1",src="a"} 4',
        'fabricprobe_rdma_port_stat_total{counter="out_of_buffer",device="m0",port="1",src="b"} 2',
    ]
)


@pytest.fixture
def expo() -> frames.Exposition:
    return frames.parse_exposition(TEXT)


def test_bad_lines_cost_only_themselves() -> None:
    text = TEXT + '\nfabricprobe_host_up{src="d" 1\nnot a metric line at all\n'
    e = frames.parse_exposition(text)
    assert e.dropped == 2
    assert set(e.get("fabricprobe_host_up")["src"]) == {"a", "b"}
    assert len(e.get("fabricprobe_rtt_seconds_bucket")) == 15


def test_samples_past_the_bound_are_counted() -> None:
    e = frames.parse_exposition(TEXT, max_samples=5)
    assert sum(len(df) for df in e.samples.values()) == 5
    assert e.dropped > 0


def test_matrix_keeps_the_busiest_hosts() -> None:
    t = pd.DataFrame(
        {
            "src": ["a", "a", "b", "c"],
            "dst": ["b", "c", "a", "a"],
            "exchanges": [100, 1, 100, 1],
            "p99_s": [1.0, 2.0, 3.0, 4.0],
        }
    )
    grid, left = frames.matrix(t, "p99_s", limit=2)
    assert left == 1 and list(grid.index) == ["a", "b"] and list(grid.columns) == ["a", "b"]
    assert grid.loc["a", "b"] == 1.0 and grid.loc["b", "a"] == 3.0
    assert math.isnan(grid.loc["a", "a"])


def test_host_counters_absent_is_not_zero(expo: frames.Exposition) -> None:
    c = frames.host_counters(expo).set_index("src")
    assert c.loc["a", "pfc_pause_frames"] == 12
    assert c.loc["a", "ecn_marks"] == 11
    assert c.loc["a", "cnp"] == 3
    assert c.loc["a", "retransmits"] == 4
    assert c.loc["a", "discards"] == 1
    assert c.loc["b", "discards"] == 2 and c.loc["b", "up"] == 0
    assert math.isnan(c.loc["b", "pfc_pause_frames"])


def test_verdicts_only_when_exported(expo: frames.Exposition) -> None:
    assert frames.host_verdicts(expo).empty
    e = frames.parse_exposition(
        'fabricprobe_validate_check{src="a",check="pfc",verdict="FAIL"} 1\n'
        'fabricprobe_validate_check{src="a",check="ecn",verdict="PASS"} 1\n'
    )
    v = frames.host_verdicts(e)
    assert list(v["check"]) == ["ecn", "pfc"] and list(v["verdict"]) == ["PASS", "FAIL"]


def test_slowest_and_waterfall_take_what_they_can() -> None:
    rows = [
        {"request_id": "r1", "queue_s": 0.001, "prefill_s": "0.002", "kv_transfer_s": 0.004,
         "decode_s": None, "rtt_p99_s": 2e-5, "src": "a", "dst": "b"},
        {"request_id": "r2", "prefill_s": "bad", "decode_s": 0.5},
        "not a row",
        {"request_id": "r3"},
    ]  # fmt: skip
    slow, more = frames.slowest_frame(rows, limit=2)
    assert list(slow["request_id"]) == ["r1", "r2"] and more == 1
    for junk in (5, "text", {"request_id": "r"}, None):
        assert frames.slowest_frame(junk, limit=2)[0].empty
    wf = frames.waterfall(slow)
    r1 = wf[wf["request_id"] == "r1"]
    assert list(r1["stage"]) == ["queue", "prefill", "kv_transfer"]
    assert list(r1["start_s"]) == pytest.approx([0.0, 0.001, 0.003])
    assert list(wf[wf["request_id"] == "r2"]["stage"]) == ["decode"]
    figs = dict(frames.fabric_figures(slow.iloc[0].to_dict()))
    assert figs["RTT p99"] == "20.0 µs" and figs["loss"] == "not measured"


def test_labels_are_bounded_and_printable() -> None:
    assert frames.clip("x" * 100, 10) == "x" * 9 + "…"
    assert frames.clip("a\x1b[31mb\n") == "a?[31mb?"


def test_range_frame_skips_malformed_points() -> None:
    result = [
        {"metric": {"src": "a", "dst": "b", "transport": "tcp"},
         "values": [[1.0, "2e-5"], [2.0, "NaN"], ["x", "1"], [3.0]]},
        {"metric": "bad"},
        "junk",
    ]  # fmt: skip
    df = frames.range_frame(result)
    assert list(df["value"]) == [2e-5] and list(df["src"]) == ["a"]
    assert frames.range_frame({"not": "a list"}).empty


def test_kv_parts_say_how_each_part_was_found_and_what_is_not_known() -> None:
    row = {
        "kv_wait_s": 0.12,
        "fabric_s": 0.0004,
        "fabric_source": "rtt+bandwidth+loss@window",
        "transfer_stack_s": float("nan"),
        "engine_wait_s": 0.1196,
        "over_explained_s": 0.0,
        "kv_bytes": 524288,
        "kv_bytes_source": "model-shape",
    }
    got = dict(frames.kv_parts(row))
    assert got["KV wait (the engine's)"] == "120.000 ms"
    assert got["fabric"] == "0.400 ms (rtt+bandwidth+loss@window)"
    assert got["transfer stack"] == "not known"
    assert got["KV bytes"] == "524,288 (model-shape)"
    assert "estimates beyond the wait" not in got
    assert dict(frames.kv_parts({"kv_bytes": "junk"})) == {
        "KV wait (the engine's)": "not known",
        "fabric": "not known",
        "transfer stack": "not known",
        "engine wait": "not known",
    }
