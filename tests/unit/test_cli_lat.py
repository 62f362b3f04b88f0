"""`probe lat`: UD loss lines and JSON, the retransmit counters beside RC, bad arguments.
The RDMA runs themselves are in the lane (tests/rdma/test_ud_loss.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from fabricprobe.cli import main
from fabricprobe.cli.commands import rdma as rdma_cmd
from fabricprobe.cli.commands.rdma import PortWatch, retransmit_json
from fabricprobe.cli.render import loss_estimate_lines, retransmit_lines
from fabricprobe.core.stats import LatencySketch
from fabricprobe.probes.counters import CounterDelta
from fabricprobe.probes.loss import LossEstimate
from fabricprobe.probes.measure import LatencyResult

SYS = Path(__file__).resolve().parents[1] / "fixtures" / "sys"


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, ["lat", *args])
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--qp", "ud", "--op", "write"], "--op goes with RC ping-pong"),
        (["--qp", "ud", "--size", "4K"], "--size goes with RC ping-pong"),
        (["--qp", "ud", "--tcp"], "--tcp goes with RC ping-pong"),
        (["--qp", "ud", "--warmup", "500"], "--warmup: at most 100"),
        (["--interval", "0.001"], "--interval paces UD probes"),
        (["--wait", "0.05"], "--wait paces UD probes"),
        (["--qp", "uc"], "--qp"),
        (["--qp", "ud", "--interval", "-1"], "--interval"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str], needle: str) -> None:
    code, out, err = run("127.0.0.1:9", *args)
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and err.startswith("probe: error: ")
    assert needle in err


def test_loss_lines_give_the_interval_and_what_one_point_needs() -> None:
    enough = loss_estimate_lines(LossEstimate.of(39, 2000))
    assert enough[0] == "exchanges: 2,000 sent, 1,961 answered, 39 lost"
    assert enough[1] == "loss: 1.95% (Wilson 95% interval 1.43% .. 2.65%, ±0.70 points)"
    assert enough[2] == "±1 point at this loss needs 1,100 exchanges; this run's 2,000 are enough"
    short = loss_estimate_lines(LossEstimate.of(22, 500))
    assert short[2] == (
        "±1 point at this loss needs 1,963 exchanges; this run had 500: give --iters 1963"
    )
    none = loss_estimate_lines(LossEstimate.of(0, 1000))
    assert none[1].startswith("loss: 0.00% (Wilson 95% interval 0.00% .. 0.38%")


def test_retransmit_lines_say_what_rc_does_with_loss() -> None:
    changes = {
        "duplicate_request": CounterDelta(2, wrapped=False, reset=False),
        "completer_retry_err": CounterDelta(30, wrapped=True, reset=False),
        "rcvd_seq_err": CounterDelta(0, wrapped=False, reset=False),
    }
    lines = retransmit_lines("rxe0", 1, changes, 4.096e-6 * 2**14)
    assert "rxe0 port 1" in lines[0] and "the whole port" in lines[0]
    assert "duplicate_request +2  completer_retry_err +30 (wrapped)  rcvd_seq_err +0" in lines[0]
    assert lines[-1].startswith("RC hides loss as delay")
    assert "67 ms" in lines[-1] and "loss reads 0" in lines[-1] and "p99" in lines[-1]
    assert "--qp ud" in lines[-1]
    assert "has no hw_counters/" in retransmit_lines("bnxt_re0", 1, None, 0.067)[0]
    assert "none among" in retransmit_lines("irdma0", 1, {}, 0.067)[0]


def test_port_watch_reads_the_port_before_and_after(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(SYS / "rxe", root, symlinks=True)
    watch = PortWatch(str(root), "rxe0", 1)
    assert watch.driver == "rdma_rxe"
    f = root / "class/infiniband/rxe0/ports/1/hw_counters/completer_retry_err"
    f.write_text(str(int(f.read_text()) + 12))
    changes = watch.changes()
    assert changes is not None and changes["completer_retry_err"].delta == 12
    doc = retransmit_json("rxe0", 1, changes)
    assert doc["deltas"]["completer_retry_err"] == 12 and doc["deltas"]["duplicate_request"] == 0
    assert doc["wrapped"] == [] and doc["reset"] == [] and doc["source"] == "hw_counters"
    bare = PortWatch(str(SYS / "no_hw_counters"), "mlx4_0", 1)
    assert bare.changes() is None
    assert "unavailable" in retransmit_json("mlx4_0", 1, None)


def _ud_result(rtts_ns: list[int], lost: int, error: str | None) -> LatencyResult:
    net, raw = LatencySketch("rtt"), LatencySketch("rtt")
    net.record_many(rtts_ns)
    net.record_lost(lost)
    raw.record_many([r + 10_000 for r in rtts_ns])
    prober = LatencySketch("delay")
    prober.record_many([2_000] * len(rtts_ns))
    return LatencyResult(
        transport="rdma",
        op="probe",
        peer="192.0.2.2",
        port=4793,
        size=None,
        iters=len(rtts_ns) + lost,
        summary=net.summary(),
        duration_s=1.0,
        error=error,
        sketch=net,
        qp_type="ud",
        engine="native",
        engine_reason="native: test",
        device="rxe0",
        raw_summary=raw.summary(),
        responder_delay_p50_us=10.0,
        prober_delay=prober,
        timestamps="software",
        hw_timestamps_supported=False,
    )


class _Link:
    """UdLink's shape: a context manager whose run() gives a result; records its calls."""

    STEP_S = 0.5
    LATE_S = 1.0
    calls: ClassVar[list[tuple[Any, ...]]] = []
    result: ClassVar[LatencyResult]

    def __init__(self, params: Any) -> None:
        self.params = params

    def __enter__(self) -> _Link:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def run(self, probes: int, interval_s: float, warmup: int, late_s: float) -> LatencyResult:
        _Link.calls.append((self.params, probes, interval_s, warmup, late_s))
        return _Link.result


@pytest.fixture
def fake_ud(monkeypatch: pytest.MonkeyPatch) -> type[_Link]:
    _Link.calls = []
    monkeypatch.setattr(rdma_cmd, "_ud", lambda: SimpleNamespace(UdLink=_Link))
    return _Link


def test_ud_table_and_loss(fake_ud: type[_Link]) -> None:
    fake_ud.result = _ud_result([200_000 + i for i in range(1950)], 50, None)
    code, out, err = run("192.0.2.2", "--qp", "ud", "--iters", "2000", "--interval", "0.001")
    assert code == 0, err
    params, probes, interval, warmup, late = fake_ud.calls[0]
    assert (probes, interval, warmup, late) == (2000, 0.001, 100, 1.0)
    assert params.step_s is None and params.timeout is None  # the probe's own defaults
    out = " ".join(out.split())  # rich wraps at the terminal's width
    assert "UD probes rxe0 -> 192.0.2.2:4793 (native loop): 2,000 probes" in out
    assert "at most one per 1.000 ms; each waits 0.5 s for its ACKs before the next" in out
    assert "late answers count until 1 s after the last" in out
    assert "rdma ud RTT (µs)" in out and "p99" in out
    assert "network RTT p50 201.727 µs" in out
    assert "responder delay p50 10.000 µs (taken out of each RTT)" in out
    assert "prober delay p50 2.000 µs (still in it" in out and "software timestamps" in out
    assert "exchanges: 2,000 sent, 1,950 answered, 50 lost" in out
    assert "loss: 2.50% (Wilson 95% interval" in out


def test_ud_json_and_a_run_that_ended_early(fake_ud: type[_Link]) -> None:
    fake_ud.result = _ud_result([300_000] * 90, 10, "UD send did not complete in time")
    code, out, err = run(
        "192.0.2.2", "--qp", "ud", "--iters", "100", "--wait", "0.2", "--timeout", "3", "--json"
    )
    assert code == 1 and "run ended early" in err and "did not complete" in err
    doc = json.loads(out)
    params, _, _, _, late = fake_ud.calls[0]
    assert (params.step_s, params.timeout, late) == (0.2, 3.0, 3.0)
    assert doc["rdma"]["qp_type"] == "ud" and doc["rdma"]["probes"] == 100
    assert doc["rdma"]["timestamps"] == "software"
    assert doc["rdma"]["responder_delay_p50_us"] == 10.0
    assert doc["rdma"]["prober_delay_p50_us"] == 2.0
    assert doc["rdma"]["prober_delay"]["count"] == 90 and doc["rdma"]["prober_delay"]["lost"] == 0
    assert doc["loss"]["sent"] == 100 and doc["loss"]["lost"] == 10
    assert doc["loss"]["ratio"] == 0.1 and doc["loss"]["interval"]["method"] == "wilson"
    assert doc["loss"]["interval"]["low"] < 0.1 < doc["loss"]["interval"]["high"]
    assert doc["loss"]["exchanges_for_1_point"] > 100


def _rc_result(transport: str, rtt_ns: int, error: str | None = None) -> LatencyResult:
    sketch = LatencySketch("rtt")
    sketch.record_many([rtt_ns] * 10)
    return LatencyResult(
        transport=transport,
        op="send" if transport == "rdma" else "pingpong",
        peer="192.0.2.2",
        port=4793,
        size=64,
        iters=10,
        summary=sketch.summary(),
        duration_s=0.1,
        error=error,
        sketch=sketch,
        engine="pyverbs" if transport == "rdma" else "python",
        engine_reason="test",
        device="rxe0" if transport == "rdma" else None,
        loop_overhead_ns=40,
    )


@pytest.fixture
def fake_rc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """RC and the TCP run beside it, faked: what each was asked, and the sysfs they read."""
    pytest.importorskip("pyverbs")  # `probe lat` reads the port number from verbs
    from fabricprobe.probes.measure import BandwidthResult

    asked: dict[str, Any] = {"sysfs": tmp_path / "sys", "tcp_error": None}
    shutil.copytree(SYS / "rxe", asked["sysfs"], symlinks=True)

    def rc_latency(link: Any, **kw: Any) -> LatencyResult:
        asked["rdma"] = (link, kw)
        return _rc_result("rdma", 10_000)

    def rc_bandwidth(link: Any, **kw: Any) -> BandwidthResult:
        asked["rdma"] = (link, kw)
        return BandwidthResult(
            "rdma", "write", "192.0.2.2", 4793, 4096, 8 << 20, 0.004, iters=2048, completed=2048
        )

    def run_pingpong(link: Any, **kw: Any) -> LatencyResult:
        asked["tcp"] = (link, kw)
        return _rc_result("tcp", 20_000, asked["tcp_error"])

    def run_throughput(link: Any, **kw: Any) -> BandwidthResult:
        asked["tcp"] = (link, kw)
        return BandwidthResult("tcp", "stream", "192.0.2.2", 4793, 4096, 8 << 20, 0.008)

    rc = SimpleNamespace(
        local_device=lambda root, source, device: ("rxe0", 1),
        source_address=lambda host, port, bind: bind or "192.0.2.1",
        rc_latency=rc_latency,
        rc_bandwidth=rc_bandwidth,
    )
    monkeypatch.setattr(rdma_cmd, "_rc", lambda: rc)
    monkeypatch.setattr(rdma_cmd.tcp_lib, "run_pingpong", run_pingpong)
    monkeypatch.setattr(rdma_cmd.tcp_lib, "run_throughput", run_throughput)
    return asked


def test_rc_latency_with_tcp_beside(fake_rc: dict[str, Any]) -> None:
    sysfs = str(fake_rc["sysfs"])
    args = ["192.0.2.2", "--bind", "192.0.2.1", "--tcp", "--timeout", "4", "--sysfs", sysfs]
    code, out, err = run(*args, "--engine", "pyverbs", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["kernel_bypass_ratio"] == 2.0 and doc["tcp"]["transport"] == "tcp"
    assert doc["retransmit_counters"]["device"] == "rxe0"
    link, kw = fake_rc["rdma"]
    assert (link.bind, link.timeout, link.step_s, link.engine) == ("192.0.2.1", 4.0, 4.0, "pyverbs")
    assert link.spin_s is None  # the compiled loop's own busy-poll
    assert link.sysfs_root == sysfs and kw["size"] == 2 and kw["iters"] == 1000
    tcp, kw = fake_rc["tcp"]
    assert (tcp.bind, tcp.timeout, tcp.step_s, tcp.engine, tcp.device) == (
        "192.0.2.1",
        4.0,
        4.0,
        "auto",
        None,
    )
    code, out, err = run(*args)
    assert code == 0, err
    assert "kernel-bypass ratio (TCP p50 RTT / RDMA p50 RTT): 2.00x" in out
    fake_rc["tcp_error"] = "peer went quiet"
    code, out, err = run(*args)
    assert code == 1 and "run ended early: peer went quiet" in err


def test_rc_bandwidth_with_tcp_beside(fake_rc: dict[str, Any]) -> None:
    args = ["192.0.2.2", "--size", "4K", "--iters", "2048", "--tcp"]
    args += ["--sysfs", str(fake_rc["sysfs"])]
    res = CliRunner().invoke(main, ["bw", *args, "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["rdma_to_tcp_ratio"] == 2.0
    # the port the stream went out of, its retransmit counters read around it
    counters = doc["retransmit_counters"]
    assert (counters["device"], counters["source"]) == ("rxe0", "hw_counters")
    assert counters["deltas"]["completer_retry_err"] == 0
    link, kw = fake_rc["rdma"]
    assert (link.timeout, link.step_s, kw["size"], kw["iters"]) == (None, None, 4096, 2048)
    res = CliRunner().invoke(main, ["bw", *args, "--spin-us", "250000", "--json"])
    assert res.exit_code == 0, res.stderr
    assert fake_rc["rdma"][0].spin_s == 0.25  # busy-poll a quarter second, then sleep
    res = CliRunner().invoke(main, ["bw", *args, "--spin-us", "-2"])
    assert res.exit_code == 2 and "--spin-us" in res.stderr
    _, kw = fake_rc["tcp"]
    assert (kw["total_bytes"], kw["chunk_size"], kw["duration"]) == (4096 * 2048, 4096, None)
    res = CliRunner().invoke(main, ["bw", *args])
    assert res.exit_code == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "TCP same bytes: 1,048.58 MB/s; RDMA/TCP 2.00x" in text
    assert "goodput" in text and "the goodput above is what arrived once" in text
