"""Hypothesis fuzz of a probe window's `prober_delay` sketch as a stranger could send it:
the collector's store takes the report or refuses it with ReportError, never anything
else, and what it keeps is a prober delay it can stand behind: kind delay, no loss, no
more samples than the window's RTTs, on an RDMA window, with its p50 read back."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricprobe.collector.store import ReportError, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import MAX_SLOTS, to_wire
from fabricprobe.core.stats import LatencySketch
from tests.conftest import FuzzCounter

N = 100
BATCH = 16
S = 1_000_000_000
TARGET = "collector.store WindowStore.take (prober_delay)"

FUZZ = settings(
    max_examples=N, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)

u64 = st.integers(0, 2**64 - 1)
small = st.integers(0, 40)


def _real(kind: str, values: list[int], lost: int) -> pb.Sketch:
    sk = LatencySketch(kind)  # type: ignore[arg-type]
    sk.record_many(values)
    sk.record_lost(lost)
    return to_wire(sk)


# well-formed sketches of any kind, and arbitrary ones (slots out of order or range,
# counts that do not add up, min above max)
real = st.builds(
    _real,
    st.sampled_from(["delay", "rtt", "one_way"]),
    st.lists(st.integers(0, 10**11), max_size=12),
    st.integers(0, 3),
)
wild = st.builds(
    pb.Sketch,
    kind=st.sampled_from(["delay", "rtt", "", "delay\x00", "x"]),
    count=small | u64,
    lost=small | u64,
    min_ns=u64,
    max_ns=u64,
    sum_ns=u64,
    slots=st.lists(st.integers(0, MAX_SLOTS + 2) | st.integers(0, 2**32 - 1), max_size=6),
    counts=st.lists(small | u64, max_size=6),
)
windows = st.tuples(
    st.sampled_from(["rdma", "tcp"]),
    st.lists(st.integers(1, 10**9), max_size=10),  # the window's RTTs (empty: no rtt)
    real | wild | st.none(),
)


def test_prober_delay_is_taken_whole_or_refused(fuzz_inputs: FuzzCounter) -> None:
    @FUZZ
    @given(st.lists(windows, min_size=BATCH, max_size=BATCH))
    def run(data: list[Any]) -> None:
        for outcome in _take_all(fuzz_inputs, data):
            seen[outcome] = seen.get(outcome, 0) + 1

    seen: dict[str, int] = {}
    run()
    # both ways were taken: prober delays kept with a p50, and reports refused
    assert seen.get("kept", 0) and seen.get("refused", 0), seen


def _take_all(counter: FuzzCounter, data: list[Any]) -> list[str]:
    """Each window of DATA in a report of its own; what became of each."""
    out = []
    store = WindowStore(clock=lambda: 10_000 * S)
    store.register(pb.HostInfo(host="a"))
    for seq, (transport, rtts, prober) in enumerate(data, start=1):
        counter.tried(TARGET)
        r = pb.WindowReport(
            host="a",
            epoch=1,
            seq=seq,
            window_start_unix_ns=(seq - 1) * S,
            window_end_unix_ns=seq * S,
        )
        w = r.probes.add(dst="b", transport=transport, op="ud", size=20)
        if rtts:
            w.rtt.CopyFrom(_real("rtt", rtts, 0))
        if prober is not None:
            w.prober_delay.CopyFrom(prober)
        try:
            store.take(r)
        except ReportError:
            out.append("refused")
            continue
        except Exception:
            counter.crashed(TARGET)
            raise
        path = store.paths[("a", "b", transport, "ud", 20)]
        kept = path.last_prober_delay
        if prober is None:
            assert kept is None
            out.append("none")
            continue
        assert kept is not None and transport == "rdma"
        assert kept.kind == "delay" and kept.lost == 0 and kept.count <= len(rtts)
        p50 = path.last_prober_delay_ns
        if kept.count:
            assert p50 is not None and kept.min_ns is not None and kept.max_ns is not None
            assert kept.min_ns <= p50 <= kept.max_ns
        else:
            assert p50 is None
        out.append("kept")
    return out
