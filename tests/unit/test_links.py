"""The shared link types: parameters, engine choice with its reason, results' JSON."""

from __future__ import annotations

import pytest

from fabricprobe.core.errors import NotSupported
from fabricprobe.core.stats import LatencySketch
from fabricprobe.probes.measure import BandwidthResult, LatencyResult, LinkParams
from fabricprobe.probes.rdma import native
from fabricprobe.probes.rdma.links import EngineChoice, pick_engine


@pytest.mark.parametrize(
    "bad",
    [
        {"peer": ""},
        {"port": 0},
        {"port": 70000},
        {"timeout": 0},
        {"step_s": -1},
        {"engine": "x"},
        {"spin_s": -0.001},
        {"spin_s": 2.0},
    ],
)
def test_link_params_refuse_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LinkParams(**{"peer": "127.0.0.1", **bad})  # type: ignore[arg-type]


def test_link_params_defaults_are_the_probes_own() -> None:
    p = LinkParams("127.0.0.1")
    assert p.setup_timeout(30.0) == 30.0 and p.step(2.0) == 2.0
    q = LinkParams("127.0.0.1", step_s=0.5, timeout=4)
    assert q.setup_timeout(30.0) == 4 and q.step(2.0) == 0.5


def test_spin_is_set_only_on_a_compiled_loop_endpoint() -> None:
    """`spun` sets a compiled-loop endpoint's busy-poll, and leaves a pyverbs endpoint (no
    set_spin) and an unset spin alone."""
    from fabricprobe.probes.rdma.rc import spun

    class Compiled:
        spin: float | None = None

        def set_spin(self, s: float) -> None:
            self.spin = s

    class Python:
        pass

    c = Compiled()
    assert spun(c, 0.0002) is c and c.spin == 0.0002
    assert spun(Compiled(), None).spin is None
    p = Python()
    assert spun(p, 0.0002) is p


def test_engine_choice_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pick_engine("pyverbs") == EngineChoice("pyverbs", "pyverbs: asked for")

    def not_built() -> None:
        raise native.NativeError("the native engine is not built (no module)")

    monkeypatch.setattr(native, "load", not_built)
    auto = pick_engine("auto")
    assert auto.name == "pyverbs" and "not built (no module)" in auto.reason
    with pytest.raises(NotSupported, match="not built"):
        pick_engine("native")
    monkeypatch.setattr(native, "load", lambda: object())
    assert pick_engine("auto").name == "native"
    assert pick_engine("native").reason.startswith("native: ")
    with pytest.raises(ValueError):
        pick_engine("fast")


def test_results_keep_each_transports_json() -> None:
    sk = LatencySketch("rtt")
    sk.record(1000)
    tcp = LatencyResult("tcp", "pingpong", "h", 1, 64, 1, sk.summary(), 0.1, source="a", warmup=0)
    assert "qp_type" not in tcp.as_dict() and tcp.as_dict()["warmup"] == 0
    ud = LatencyResult(
        "rdma", "probe", "h", 1, None, 5, sk.summary(), 0.1, qp_type="ud", engine="native",
        engine_reason="native: built", raw_summary=sk.summary(), timestamps="software",
    )  # fmt: skip
    d = ud.as_dict()
    assert d["probes"] == 5 and "iters" not in d and d["engine_reason"] == "native: built"
    rc = BandwidthResult(
        "rdma", "write", "h", 1, 1024, 4096, 2.0, qp_type="rc", iters=5, completed=4
    )
    assert rc.as_dict()["lost"] == 1 and rc.bytes_per_second == 2048.0
    tcp_bw = BandwidthResult("tcp", "stream", "h", 1, 4096, 8192, 1.0, streams=2, bytes_sent=9000)
    assert tcp_bw.as_dict()["chunk_size"] == 4096 and "lost" not in tcp_bw.as_dict()


def test_a_clock_pair_of_the_python_loops_costs_a_little() -> None:
    from fabricprobe.probes import tcp
    from fabricprobe.probes.measure import clock_pair_ns

    assert 0 < clock_pair_ns(2000) < 1_000_000
    assert 0 < tcp.measure_timer_overhead(2000).pair_ns < 1_000_000
