"""Workload: KV sizes from model shapes, the pipeline on loopback TCP, the CLI and `why`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from fabricprobe.cli import main
from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.core.models import PRESETS, model_shape
from fabricprobe.probes.responder import Responder
from fabricprobe.workload.pipeline import (
    STAGE_ORDER,
    Host,
    RunQueueWait,
    WorkloadConfig,
    next_step,
    run_pipeline,
)
from fabricprobe.workload.summary import summarise
from fabricprobe.workload.transfer import TcpKvChannel, write_round_trips
from tests.support.fleet import open_responder


def test_kv_bytes_follow_the_shape_and_gqa() -> None:
    llama8 = PRESETS["Llama-3.1-8B"]
    assert llama8.bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072  # 128 KiB per token
    assert llama8.kv_bytes(1024) == 128 << 20
    assert PRESETS["Qwen2.5-7B"].bytes_per_token == 2 * 28 * 4 * 128 * 2
    assert PRESETS["Llama-3.1-70B"].bytes_per_token == 2 * 80 * 8 * 128 * 2
    mha = model_shape("Llama-3.1-8B", kv_heads=32)  # the same model without GQA
    assert mha.bytes_per_token == 4 * llama8.bytes_per_token
    assert model_shape("llama-3.1-8b", dtype="fp8").bytes_per_token == 65_536
    assert model_shape(layers=2, kv_heads=1, head_dim=64).kv_bytes(10) == 2 * 2 * 64 * 2 * 10


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"preset": "gpt-9"}, "unknown model"),
        ({"layers": 2}, "all of layers"),
        ({"preset": "Mistral-7B", "dtype": "fp4"}, "dtype"),
    ],
)
def test_bad_shapes_say_why(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        model_shape(**kw)  # type: ignore[arg-type]


@pytest.fixture
def responder() -> Iterator[Responder]:
    with open_responder() as r:
        yield r


@pytest.mark.parametrize(
    ("nbytes", "chunk", "outstanding", "want"),
    [
        (32 * 4096, 4096, 1, 32),  # layer by layer: a round trip each
        (32 * 4096, 4096, 4, 8),
        (32 * 4096 + 1, 4096, 4, 9),  # the tail is a WRITE of its own
        (32 * 4096, 4096, 64, 1),  # all in flight at once
        (1, 1 << 20, 4, 1),
    ],
)
def test_write_round_trips_count_the_windows_a_transfer_waits_for(
    nbytes: int, chunk: int, outstanding: int, want: int
) -> None:
    assert write_round_trips(nbytes, chunk, outstanding) == want


def test_write_round_trips_refuse_what_is_no_transfer() -> None:
    for args in ((0, 4096, 1), (1, 0, 1), (1, 4096, 0)):
        with pytest.raises(ValueError):
            write_round_trips(*args)


def test_tcp_kv_channel_moves_whole_transfers(responder: Responder) -> None:
    ch = TcpKvChannel("127.0.0.1", responder.port, bind="127.0.0.1")
    try:
        for n in (1, 3 << 20, 12345):
            assert ch.send(n) > 0
    finally:
        ch.close()
    assert ch.sent == 3


def test_pipeline_times_every_stage_on_loopback(responder: Responder) -> None:
    a, b, c = Host("a", "127.0.0.1"), Host("b", "127.0.0.1"), Host("c", "127.0.0.1")
    cfg = WorkloadConfig(
        model=PRESETS["Mistral-7B"],
        prompt_tokens=16,
        output_tokens=3,
        decode_step_s=0.002,
        requests=6,
        rate=200.0,
        concurrency=2,
        transport="tcp",
        port=responder.port,
    )
    results = run_pipeline([(a, b), (a, c)], cfg)
    assert len(results) == 6 and all(r.error is None for r in results)
    for r in results:
        assert list(r.stages) == list(STAGE_ORDER)
        assert r.seconds("decode") >= 3 * 0.002
        assert 0 < r.ttft_s < r.e2e_s
        assert r.kv_bytes == cfg.model.kv_bytes(r.prompt_tokens)
        assert r.kv_round_trips == 1  # over TCP: the frame out, the sink's byte back
        assert 0 < r.kv_library_s <= r.seconds("kv_transfer")
        assert r.kv_cpu_wait_s is None or r.kv_cpu_wait_s >= 0
    assert len({r.request_id for r in results + run_pipeline([(a, b)], cfg)}) == 12
    s = summarise(results)
    assert list(s["dst"]) == ["b", "c"] and list(s["requests"]) == [3, 3]
    assert (s["kv_bytes_per_s"] > 0).all()


@given(
    now=st.floats(0, 1e6, allow_nan=False),
    back=st.floats(0, 1e3, allow_nan=False),
    step=st.floats(1e-4, 1.0, allow_nan=False),
)
def test_the_decode_side_learns_of_its_kv_at_its_next_step(
    now: float, back: float, step: float
) -> None:
    epoch = now - back
    t = next_step(now, epoch, step)
    assert now - 1e-6 <= t < now + step + 1e-6
    k = (t - epoch) / step
    assert abs(k - round(k)) < 1e-6 * max(1.0, k)


def test_a_threads_wait_for_a_cpu_only_grows_and_ends_with_its_reader() -> None:
    clock = RunQueueWait()
    try:
        first = clock.read()
        if first is None:  # a kernel without CONFIG_SCHED_INFO keeps none
            assert clock.fd is None or clock.read() is None
            return
        assert 0 <= first <= (clock.read() or 0)
    finally:
        clock.close()
    assert clock.read() is None
    clock.close()  # twice is harmless


def test_a_polling_decode_side_waits_past_the_transfer(responder: Responder) -> None:
    cfg = WorkloadConfig(model=PRESETS["Mistral-7B"], prompt_tokens=4, output_tokens=1,
                         requests=3, kv_poll_s=0.02, transport="tcp",
                         port=responder.port)  # fmt: skip
    for r in run_pipeline([(Host("a", "127.0.0.1"), Host("b", "127.0.0.1"))], cfg):
        assert r.error is None
        assert 0 < r.kv_library_s <= r.seconds("kv_transfer")
        assert r.kv_poll_cpu_wait_s is None or r.kv_poll_cpu_wait_s >= 0


def test_unreachable_decode_host_fails_the_request_not_the_run() -> None:
    cfg = WorkloadConfig(model=PRESETS["Mistral-7B"], prompt_tokens=4, output_tokens=1,
                         requests=2, transport="tcp", port=1)  # fmt: skip
    results = run_pipeline([(Host("a", "127.0.0.1"), Host("b", "127.0.0.1"))], cfg)
    assert all(r.error for r in results)


@pytest.fixture
def collector() -> Iterator[CollectorServer]:
    server = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen=""))
    server.start()
    yield server
    server.stop(0)


def test_cli_workload_with_otlp_then_why(collector: CollectorServer) -> None:
    runner = CliRunner()
    otlp = f"127.0.0.1:{collector.port}"
    args = ["workload", "--transport", "tcp", "--serve", "--port", "0", "--requests", "4",
            "--model", "Qwen2.5-7B", "--prompt-tokens", "32", "--output-tokens", "2",
            "--decode-ms-per-token", "1", "--otlp", otlp, "--json"]  # fmt: skip
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["model"]["bytes_per_token"] == 57_344
    assert out["paths"][0]["requests"] == 4
    why = ["why", "--insecure", "--collector", f"127.0.0.1:{collector.port}"]
    res = runner.invoke(main, [*why, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert len(report["slowest"]) == 4
    first = report["slowest"][0]
    assert first["src"] == "local" and first["transport"] == "tcp"
    assert first["ttft_s"] > 0 and first["kv_transfer_s"] > 0
    res = runner.invoke(main, why)
    assert res.exit_code == 0 and "Slowest requests" in res.output


def test_cli_errors_are_one_line() -> None:
    res = CliRunner().invoke(main, ["workload", "--path", "x:y"])
    assert res.exit_code == 2 and "--path 'x:y'" in res.output
    res = CliRunner().invoke(main, ["why", "--insecure", "--collector", "127.0.0.1:1"])
    assert res.exit_code == 1 and "UNAVAILABLE" in res.output


def test_help_runs_as_a_process() -> None:
    for cmd in ("workload", "why"):
        out = subprocess.run([sys.executable, "-m", "fabricprobe", cmd, "--help"],
                             capture_output=True, text=True, check=True)  # fmt: skip
        assert "Examples" in out.stdout


def test_why_on_a_collector_that_has_seen_no_request(collector: CollectorServer) -> None:
    res = CliRunner().invoke(main, ["why", "--insecure", "--collector",
                                    f"127.0.0.1:{collector.port}", "--json"])  # fmt: skip
    assert res.exit_code == 3, res.output  # answered, nothing to show, and why
    out = json.loads(res.output)
    assert out["slowest"] == [] and out["empty_reason"].startswith("no spans in the window")
    res = CliRunner().invoke(main, ["why", "--insecure", "--collector",
                                    f"127.0.0.1:{collector.port}"])  # fmt: skip
    assert res.exit_code == 3 and "nothing to show: no spans" in res.output, res.output
