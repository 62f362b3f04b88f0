"""A UD round's bookkeeping (the pyverbs loop; the compiled one does the same in the lane):
late answers are kept with their RTT, only answers that never come are loss, and the
prober's own delay (its send side, and the time from its last empty poll to the poll
that found the answer) is reported beside the RTT, never more than it."""

from __future__ import annotations

import time

from fabricprobe.probes.rdma.ud import ACK1, ACK2, _pyverbs_round

BASE = 0xFFFFFFF0  # sequence numbers wrap inside the round
DELAY_NS = 1000  # what the responder says its own delay was
SEND_S = 0.002  # how long the scripted send completion takes to be seen
POLL_S = 0.0005  # the scripted receive loop's gap between two polls


class ScriptedPeer:
    """Send and receive as a UD endpoint with a responder behind it that answers probe i
    after LAGS[i] seconds (None: never), and a stale ACK of an earlier round first. A
    probe in STALLS has the prober stalled for that long (descheduled) just as its
    answer arrives, before the poll that finds it."""

    def __init__(self, lags: list[float | None], stalls: dict[int, float] | None = None) -> None:
        self.lags = lags
        self.stalls = dict(stalls or {})
        self.sent = 0
        self.last_empty_ns = 0
        self.due: list[tuple[float, int, int, int]] = [(0.0, ACK1, BASE - 3, 0)]

    def send(self, wr: object, kind: int, seq: int, value: int, deadline: float) -> tuple[int, int]:
        t = time.perf_counter_ns()
        lag = self.lags[(seq - BASE) & 0xFFFFFFFF]
        self.sent += 1
        if lag is not None:
            at = time.monotonic() + lag
            self.due += [(at, ACK1, seq, 0), (at, ACK2, seq, DELAY_NS)]
            self.due.sort()
        time.sleep(SEND_S)  # the send completion is seen this much later
        return t, time.perf_counter_ns()

    def receive(self, deadline: float) -> tuple[int, int, int, int] | None:
        while True:
            before = time.perf_counter_ns()
            if self.due and self.due[0][0] <= time.monotonic():
                _, kind, seq, value = self.due.pop(0)
                stall = self.stalls.pop((seq - BASE) & 0xFFFFFFFF, 0.0) if kind == ACK1 else 0.0
                time.sleep(stall)
                return kind, seq, value, time.perf_counter_ns()
            self.last_empty_ns = before
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)


def run(
    lags: list[float | None],
    step_s: float,
    late_s: float,
    interval_s: float = 0.0,
    stalls: dict[int, float] | None = None,
) -> tuple[list[int], list[int], list[int], list[int], float, str | None]:
    net: list[int] = []
    raw: list[int] = []
    delays: list[int] = []
    prober: list[int] = []
    t0 = time.monotonic()
    err = _pyverbs_round(
        ScriptedPeer(lags, stalls),
        None,
        len(lags),
        interval_s,
        step_s,
        late_s,
        BASE,
        net,
        raw,
        delays,
        prober,
    )
    assert len(prober) == len(net)
    return net, raw, delays, prober, time.monotonic() - t0, err


def test_a_late_answer_is_delay_and_a_missing_one_is_loss() -> None:
    # probe 0 answers after its 20 ms step (while probes 1 and 2 wait), 1 never, 2 at
    # once, 3 (the last) 80 ms late, within the round's second for late answers
    net, raw, delays, _, took, err = run([0.06, None, 0.001, 0.08], step_s=0.02, late_s=1.0)
    assert err is None
    assert len(net) == len(raw) == len(delays) == 3  # one lost
    assert sorted(raw)[-2] >= 60_000_000 and max(raw) >= 80_000_000  # their true RTTs
    assert delays == [DELAY_NS] * 3 and all(
        r - d == n for r, d, n in zip(raw, delays, net, strict=True)
    )
    assert took >= 1.0  # probe 1's answer was waited for until the round's end
    # with every answer in, the round ends at once instead of listening on
    net, _, _, _, took, _ = run([0.06, 0.001], step_s=0.02, late_s=1.0)
    assert len(net) == 2 and took < 0.6


def test_an_answer_after_the_round_is_over_is_loss() -> None:
    net, _, _, _, took, _ = run([0.001, 0.5], step_s=0.02, late_s=0.1)
    assert len(net) == 1  # the second answer came after the round stopped listening
    assert took >= 0.1


def test_probes_are_paced() -> None:
    net, _, _, _, took, _ = run([0.0] * 5, step_s=0.05, late_s=0.05, interval_s=0.03)
    assert len(net) == 5 and took >= 4 * 0.03


def test_the_probers_delay_is_its_send_side_and_how_late_it_saw_the_answer() -> None:
    # probe 2's prober is stalled 30 ms as its answer arrives; the others poll every 0.5 ms
    lags: list[float | None] = [0.005, 0.005, 0.005, 0.005]
    net, raw, delays, prober, _, err = run(lags, step_s=0.2, late_s=0.2, stalls={2: 0.03})
    assert err is None and len(prober) == 4
    for i, (r, d, p) in enumerate(zip(raw, delays, prober, strict=True)):
        assert p <= r  # two disjoint spans of the RTT
        assert p >= SEND_S * 1e9  # the send side is in it
        if i == 2:
            assert p >= 0.03e9 + SEND_S * 1e9 and r >= 0.035e9
        else:  # send side + at most a poll gap, with room for a loaded CI host
            assert p < (SEND_S + 0.004) * 1e9, (i, p)
        assert r - d == net[i]
    # the stall is host delay: the RTT rose by it, and the prober's delay says so
    assert raw[2] - prober[2] < min(raw[i] - prober[i] for i in (0, 1, 3)) + 0.004e9
