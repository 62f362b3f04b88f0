"""A UD round's bookkeeping (the pyverbs loop; the compiled one does the same in the lane):
late answers are kept with their RTT, only answers that never come are loss."""

from __future__ import annotations

import time

from fabricprobe.probes.rdma.ud import ACK1, ACK2, _pyverbs_round

BASE = 0xFFFFFFF0  # sequence numbers wrap inside the round
DELAY_NS = 1000  # what the responder says its own delay was


class ScriptedPeer:
    """Send and receive as a UD endpoint with a responder behind it that answers probe i
    after LAGS[i] seconds (None: never), and a stale ACK of an earlier round first."""

    def __init__(self, lags: list[float | None]) -> None:
        self.lags = lags
        self.sent = 0
        self.due: list[tuple[float, int, int, int]] = [(0.0, ACK1, BASE - 3, 0)]

    def send(self, wr: object, kind: int, seq: int, value: int, deadline: float) -> int:
        lag = self.lags[(seq - BASE) & 0xFFFFFFFF]
        self.sent += 1
        if lag is not None:
            at = time.monotonic() + lag
            self.due += [(at, ACK1, seq, 0), (at, ACK2, seq, DELAY_NS)]
            self.due.sort()
        return time.perf_counter_ns()

    def receive(self, deadline: float) -> tuple[int, int, int, int] | None:
        while True:
            if self.due and self.due[0][0] <= time.monotonic():
                _, kind, seq, value = self.due.pop(0)
                return kind, seq, value, time.perf_counter_ns()
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.0005)


def run(
    lags: list[float | None], step_s: float, late_s: float, interval_s: float = 0.0
) -> tuple[list[int], list[int], list[int], float, str | None]:
    net: list[int] = []
    raw: list[int] = []
    delays: list[int] = []
    t0 = time.monotonic()
    err = _pyverbs_round(
        ScriptedPeer(lags), None, len(lags), interval_s, step_s, late_s, BASE, net, raw, delays
    )
    return net, raw, delays, time.monotonic() - t0, err


def test_a_late_answer_is_delay_and_a_missing_one_is_loss() -> None:
    # probe 0 answers after its 20 ms step (while probes 1 and 2 wait), 1 never, 2 at
    # once, 3 (the last) 80 ms late, within the round's second for late answers
    net, raw, delays, took, err = run([0.06, None, 0.001, 0.08], step_s=0.02, late_s=1.0)
    assert err is None
    assert len(net) == len(raw) == len(delays) == 3  # one lost
    assert sorted(raw)[-2] >= 60_000_000 and max(raw) >= 80_000_000  # their true RTTs
    assert delays == [DELAY_NS] * 3 and all(
        r - d == n for r, d, n in zip(raw, delays, net, strict=True)
    )
    assert took >= 1.0  # probe 1's answer was waited for until the round's end
    # with every answer in, the round ends at once instead of listening on
    net, _, _, took, _ = run([0.06, 0.001], step_s=0.02, late_s=1.0)
    assert len(net) == 2 and took < 0.6


def test_an_answer_after_the_round_is_over_is_loss() -> None:
    net, _, _, took, _ = run([0.001, 0.5], step_s=0.02, late_s=0.1)
    assert len(net) == 1  # the second answer came after the round stopped listening
    assert took >= 0.1


def test_probes_are_paced() -> None:
    net, _, _, took, _ = run([0.0] * 5, step_s=0.05, late_s=0.05, interval_s=0.03)
    assert len(net) == 5 and took >= 4 * 0.03
