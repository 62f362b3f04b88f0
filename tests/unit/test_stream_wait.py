"""How long the target of an RDMA WRITE stream holds its QP and region for the prober's
`done` (probes/rdma/rc.py: stream_wait_s)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fabricprobe.probes.rdma.rc import (
    MAX_ITERS,
    MAX_SIZE,
    MAX_STREAM_WAIT_S,
    STREAM_FLOOR_BPS,
    stream_wait_s,
)


def test_a_long_stream_is_waited_out_past_the_idle_timeout() -> None:
    # 2,000 WRITEs of 64 KiB: 125 MiB, two minutes at the floor rate, plus the step
    assert stream_wait_s(65536, 2000, 5.0, 30.0) == 5.0 + 2000 * 65536 / STREAM_FLOOR_BPS
    assert stream_wait_s(1024, 10, 5.0, 30.0) == 30.0  # a short one: the idle timeout
    assert stream_wait_s(MAX_SIZE, MAX_ITERS, 60.0, 30.0) == MAX_STREAM_WAIT_S


@given(
    size=st.integers(1, MAX_SIZE),
    iters=st.integers(1, MAX_ITERS),
    step=st.floats(0.01, 60),
    idle=st.floats(0.1, 3600),
)
def test_the_wait_is_bounded_and_grows_with_the_stream(
    size: int, iters: int, step: float, idle: float
) -> None:
    w = stream_wait_s(size, iters, step, idle)
    assert idle <= w <= max(idle, MAX_STREAM_WAIT_S)
    assert stream_wait_s(size, min(MAX_ITERS, iters * 2), step, idle) >= w
