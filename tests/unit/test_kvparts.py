"""The three parts of a KV wait, and the bytes they are computed for, over small frames."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricprobe.collector.attribution.join import request_breakdown, requests_frame, stages_frame
from fabricprobe.collector.attribution.stages import RequestRecord, StageRecord
from fabricprobe.collector.kvparts import MTU_BYTES, PROTOCOL_RTTS, split_parts
from fabricprobe.collector.kvshape import KvShape, model_bytes, parse_kv_models, parse_kv_shape
from fabricprobe.core.models import PRESETS, ModelShape

S = 10**9


def frame(**over: object) -> pd.DataFrame:
    """One joined KV transfer: 100 ms wait, rdma, 30 µs RTT, 10 GB/s, 1 MB from the span."""
    row: dict[str, object] = {
        "request_id": "r",
        "duration_s": 0.1,
        "transport": "rdma",
        "bytes": 1_000_000,
        "model_bytes": np.nan,
        "nixl_mean_bytes": np.nan,
        "nixl_mean_xfer_s": np.nan,
        "rtt_p50_s": 30e-6,
        "rtt_p50_net_s": 30e-6,
        "bandwidth_bytes_per_s": 10e9,
        "loss_ratio": 0.0,
    }
    row.update(over)
    return pd.DataFrame([row])


def test_the_spans_round_trips_stand_for_the_protocols_and_say_so() -> None:
    said = split_parts(frame(round_trips=32)).iloc[0]
    assert said["fabric_rtts"] == 32
    assert said["fabric_s"] == pytest.approx(32 * 30e-6 + 1e6 / 10e9)
    assert said["fabric_source"] == "rtt+bandwidth+loss@window;round-trips=span"
    # 0 (or missing) is a span that did not say: the protocol's count
    for unsaid in (frame(round_trips=0), frame(round_trips=np.nan)):
        r = split_parts(unsaid).iloc[0]
        assert r["fabric_rtts"] == PROTOCOL_RTTS["rdma"]
        assert r["fabric_source"] == "rtt+bandwidth+loss@window"
    # no path figures: no fabric part, and no source for it either
    r = split_parts(frame(round_trips=8, rtt_p50_s=np.nan, rtt_p50_net_s=np.nan)).iloc[0]
    assert math.isnan(r["fabric_s"]) and r["fabric_source"] == ""


def test_fabric_is_the_protocols_rtts_plus_the_bytes_at_the_paths_bandwidth() -> None:
    r = split_parts(frame()).iloc[0]
    assert r["fabric_rtts"] == PROTOCOL_RTTS["rdma"] == 2
    assert r["fabric_s"] == pytest.approx(2 * 30e-6 + 1e6 / 10e9)
    assert r["fabric_source"] == "rtt+bandwidth+loss@window"
    assert r["kv_bytes_source"] == "span"
    # no NIXL figures: the library's part is unknown, the rest goes to the engine
    assert math.isnan(r["transfer_stack_s"]) and r["transfer_stack_source"] == ""
    assert r["engine_wait_s"] == pytest.approx(0.1 - r["fabric_s"])
    assert r["over_explained_s"] == 0


def test_tcp_counts_one_more_round_trip_and_the_hosts_delay_stays_out() -> None:
    r = split_parts(frame(transport="tcp", rtt_p50_s=80e-6, rtt_p50_net_s=50e-6)).iloc[0]
    assert r["fabric_rtt_s"] == pytest.approx(3 * 50e-6)


def test_loss_costs_a_round_trip_per_lost_packet_and_pauses_stretch_the_wire_time() -> None:
    r = split_parts(frame(loss_ratio=0.01, dst_pause_us_per_s=250_000.0)).iloc[0]
    packets = math.ceil(1e6 / MTU_BYTES)
    assert r["fabric_loss_s"] == pytest.approx(packets * 0.01 * 30e-6)
    wire = 1e6 / 10e9
    assert r["fabric_pause_s"] == pytest.approx(wire * 0.25 / 0.75)
    assert r["fabric_source"] == "rtt+bandwidth+loss+pause@window"
    assert r["fabric_s"] == pytest.approx(
        2 * 30e-6 + wire + r["fabric_loss_s"] + r["fabric_pause_s"]
    )


def test_nixl_time_beyond_the_fabric_is_the_stack_and_the_rest_the_engines() -> None:
    r = split_parts(frame(nixl_mean_xfer_s=0.004)).iloc[0]
    fabric = 2 * 30e-6 + 1e-4
    assert r["transfer_stack_s"] == pytest.approx(0.004 - fabric)
    assert r["transfer_stack_source"] == "nixl-host-rate"
    assert r["engine_wait_s"] == pytest.approx(0.1 - 0.004)
    parts = r["fabric_s"] + r["transfer_stack_s"] + r["engine_wait_s"]
    assert parts == pytest.approx(r["kv_wait_s"])


def test_the_spans_own_library_time_stands_before_nixls_host_mean() -> None:
    fabric = 2 * 30e-6 + 1e-4
    r = split_parts(frame(library_s=0.009, nixl_mean_xfer_s=0.004)).iloc[0]
    assert r["transfer_stack_s"] == pytest.approx(0.009 - fabric)
    assert r["transfer_stack_source"] == "span"
    assert r["engine_wait_s"] == pytest.approx(0.1 - 0.009)
    # not said (0) is not a figure: NIXL's mean stands
    r = split_parts(frame(library_s=0.0, nixl_mean_xfer_s=0.004)).iloc[0]
    assert r["transfer_stack_source"] == "nixl-host-rate"
    r = split_parts(frame(library_s=0.0)).iloc[0]
    assert math.isnan(r["transfer_stack_s"]) and r["transfer_stack_source"] == ""


def test_a_wait_shorter_than_the_fabric_says_so_and_never_goes_negative() -> None:
    # 10 MB at 1 GB/s is 10 ms; the engine says it waited 2 ms
    r = split_parts(frame(duration_s=0.002, bytes=10_000_000, bandwidth_bytes_per_s=1e9)).iloc[0]
    assert r["engine_wait_s"] == 0
    assert r["over_explained_s"] == pytest.approx(r["fabric_s"] - 0.002)
    r = split_parts(
        frame(duration_s=0.002, bytes=10_000_000, bandwidth_bytes_per_s=1e9, nixl_mean_xfer_s=0.02)
    ).iloc[0]
    assert r["transfer_stack_s"] == 0  # never more than the wait leaves


def test_unknown_path_figures_leave_the_fabric_unknown_not_zero() -> None:
    r = split_parts(frame(rtt_p50_s=np.nan, rtt_p50_net_s=np.nan)).iloc[0]
    assert math.isnan(r["fabric_s"]) and r["fabric_source"] == ""
    r = split_parts(frame(bandwidth_bytes_per_s=np.nan)).iloc[0]
    assert math.isnan(r["fabric_s"])


def test_bytes_come_from_the_span_then_the_model_shape_then_nixl() -> None:
    kv = pd.concat(
        [
            frame(request_id="a", bytes=1000, model_bytes=2000.0, nixl_mean_bytes=3000.0),
            frame(request_id="b", bytes=0, model_bytes=2000.0, nixl_mean_bytes=3000.0),
            frame(request_id="c", bytes=0, model_bytes=np.nan, nixl_mean_bytes=3000.0),
            frame(request_id="d", bytes=0, model_bytes=np.nan, nixl_mean_bytes=np.nan),
        ],
        ignore_index=True,
    )
    out = split_parts(kv).set_index("request_id")
    assert list(out["kv_bytes_used"].fillna(-1)) == [1000, 2000, 3000, -1]
    assert list(out["kv_bytes_source"]) == ["span", "model-shape", "nixl-host-mean", ""]


def test_model_shape_bytes_round_the_prompt_up_to_whole_blocks() -> None:
    tiny = parse_kv_shape("layers=4,kv_heads=2,head_dim=64,dtype=fp32,block=128")
    assert tiny.shape.bytes_per_token == 2 * 4 * 2 * 64 * 4
    assert tiny.request_bytes(48) == 128 * 4096  # one block of 128 tokens
    assert tiny.request_bytes(129) == 256 * 4096
    llama = parse_kv_shape("Llama-3.1-8B")
    assert llama.shape == PRESETS["Llama-3.1-8B"] and llama.block_tokens == 16
    assert parse_kv_shape("llama-3.1-8b,block=32,dtype=fp8").shape.dtype == "fp8"
    got = model_bytes(
        [("a", "m", 48), ("b", "m", None), ("c", "other", 48), ("d", "m", 0)], {"m": tiny}
    )
    assert got == {"a": 128 * 4096}


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "Nope-1B",
        "layers=4,kv_heads=2",
        "layers=0,kv_heads=2,head_dim=64",
        "layers=4,kv_heads=2,head_dim=64,dtype=fp7",
        "Llama-3.1-8B,block=0",
        "Llama-3.1-8B,block=x",
        "Llama-3.1-8B,color=red",
        "Llama-3.1-8B,block=16,block=32",
        "block=16,Llama-3.1-8B",
        "x" * 300,
    ],
)
def test_bad_shapes_are_refused_with_a_reason(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_kv_shape(spec)


def test_the_setting_names_the_model_whose_shape_is_wrong() -> None:
    with pytest.raises(ValueError, match="served-a"):
        parse_kv_models({"served-a": "layers=4"})
    assert parse_kv_models({"m": "Qwen2.5-7B"})["m"].shape.kv_heads == 4


@given(st.text(max_size=80))
def test_any_text_is_a_shape_or_a_value_error(spec: str) -> None:
    try:
        got = parse_kv_shape(spec)
    except ValueError:
        return
    assert isinstance(got, KvShape) and got.shape.bytes_per_token > 0


@given(
    st.integers(1, 128),
    st.integers(1, 16),
    st.sampled_from([64, 128]),
    st.integers(1, 256),
    st.integers(1, 4096),
)
def test_shape_bytes_cover_the_prompt_within_one_block(
    layers: int, heads: int, dim: int, block: int, tokens: int
) -> None:
    k = KvShape(ModelShape("m", layers, heads, dim), block)
    got = k.request_bytes(tokens)
    per = k.shape.bytes_per_token
    assert tokens * per <= got < (tokens + block) * per and got % (block * per) == 0


def test_breakdown_carries_the_parts_and_both_shares() -> None:
    st_ = stages_frame(
        [
            StageRecord("r", "prefill", 0, S // 2),
            StageRecord("r", "kv_transfer", S // 2, S // 2 + S // 10, "a", "b", transport="rdma"),
        ]
    )
    rq = requests_frame([RequestRecord("r", 0, 2 * S, 1.0, 2.0, 8, 48)])
    kv = split_parts(frame(duration_s=0.1, nixl_mean_xfer_s=0.004))
    out = request_breakdown(st_, rq, None, kv).set_index("request_id").loc["r"]
    assert out["kv_wait_s"] == pytest.approx(0.1)
    assert out["kv_share_ttft"] == pytest.approx(0.1)
    assert out["fabric_share_ttft"] == pytest.approx(kv.loc[0, "fabric_s"] / 1.0)
    assert out["kv_bytes"] == 1_000_000 and out["kv_bytes_source"] == "span"
    assert out["transfer_stack_source"] == "nixl-host-rate"


def test_a_request_naming_no_model_takes_the_star_shape() -> None:
    shapes = parse_kv_models({"*": "layers=4,kv_heads=2,head_dim=64,dtype=fp32,block=128"})
    assert model_bytes([("a", "", 48), ("b", "other", 200)], shapes) == {
        "a": 128 * 4096,
        "b": 256 * 4096,
    }


def test_why_tables_print_every_column_they_have_and_no_none() -> None:
    from rich.console import Console

    from fabricprobe.cli.commands.why import paths_table, requests_table

    row = {
        "request_id": "r",
        "src": "a",
        "dst": "b",
        "kv_transfer_s": 0.12,
        "kv_wait_s": 0.12,
        "fabric_s": 0.0002,
        "fabric_source": "rtt+bandwidth+loss@window",
        "transfer_stack_s": 0.004,
        "engine_wait_s": 0.1158,
        "ttft_s": 1.0,
        "kv_share_ttft": 0.12,
        "fabric_share_ttft": 0.0002,
        "kv_bytes": 524288,
        "kv_bytes_source": "model-shape",
    }
    console = Console(width=400, record=True)
    console.print(requests_table([row]))
    console.print(paths_table([{"rank": 1, "src": "a", "dst": "b", "transfers": 3}]))
    text = console.export_text()
    assert "None" not in text
    assert text.count("│ a->b │") == 2  # no transport printed where none is known
    for cell in ("120.0", "0.2~", "4.0", "115.8", "12%", "0.02%", "524,288m"):
        assert cell in text, cell


def test_why_sorts_by_the_fabrics_part() -> None:
    from fabricprobe.collector.query import check_why
    from fabricprobe.core.api import fabricprobe_pb2 as pb

    assert check_why(pb.WhyRequest(by="fabric_s"))[2] == "fabric_s"
    assert check_why(pb.WhyRequest(by="kv_wait_s"))[2] == "kv_wait_s"
    with pytest.raises(ValueError):
        check_why(pb.WhyRequest(by="kv_fabric_s"))
