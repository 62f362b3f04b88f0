"""A UD round's bookkeeping (the pyverbs loop; the compiled one does the same in the lane):
late answers are kept with their RTT, only answers that never come are loss, and the
prober's own delay (its send side, and the time from its last empty poll to the poll
that found the answer) is reported beside the RTT, never more than it."""

from __future__ import annotations

import time

from fabricprobe.probes.rdma.ud import ACK1, ACK2, ProbeRound, _pyverbs_round

BASE = 0xFFFFFFF0  # sequence numbers wrap inside the round
DELAY_NS = 1000  # what the responder says its own delay was
SEND_S = 0.002  # how long the scripted send completion takes to be seen
POLL_S = 0.0005  # the scripted receive loop's gap between two polls


class ScriptedPeer:
    """Send and receive as a UD endpoint with a responder behind it that answers probe i
    after LAGS[i] seconds (None: never), and a stale ACK of an earlier round first. Its
    send completion is seen SEND_S after the post, and meanwhile it listens for answers
    as the real one does (listen=True). A probe in STALLS has the prober stalled for that
    long (descheduled) just as its answer arrives, before the poll that finds it. It
    keeps what really happened (ns): each probe's post, send completion seen, its ACK1's
    arrival and the poll that found it."""

    def __init__(
        self,
        lags: list[float | None],
        stalls: dict[int, float] | None = None,
        send_s: float = SEND_S,
        stale: bool = True,
    ) -> None:
        self.lags = lags
        self.stalls = dict(stalls or {})
        self.send_s = send_s
        self.empty_ns = 0
        self.early: list[tuple[int, int, int, int, int]] = []
        self.due: list[tuple[int, int, int, int]] = [(0, ACK1, BASE - 3, 0)] if stale else []
        self.posted: dict[int, int] = {}
        self.seen: dict[int, int] = {}
        self.arrived: dict[int, int] = {}
        self.found: dict[int, int] = {}

    def send(
        self, wr: object, kind: int, seq: int, value: int, deadline: float, listen: bool = False
    ) -> tuple[int, int]:
        t = time.perf_counter_ns()
        i = (seq - BASE) & 0xFFFFFFFF
        self.posted[i] = t
        lag = self.lags[i]
        if lag is not None:
            at = t + int(lag * 1e9)
            self.arrived[i] = at
            self.due += [(at, ACK1, seq, 0), (at, ACK2, seq, DELAY_NS)]
            self.due.sort()
        seen = t + int(self.send_s * 1e9)
        while time.perf_counter_ns() < seen:
            if listen and (msg := self._poll()) is not None:
                self.early.append(msg)
            time.sleep(POLL_S)
        self.seen[i] = time.perf_counter_ns()
        return t, self.seen[i]

    def _poll(self) -> tuple[int, int, int, int, int] | None:
        before = time.perf_counter_ns()
        if self.due and self.due[0][0] <= before:
            _, kind, seq, value = self.due.pop(0)
            i = (seq - BASE) & 0xFFFFFFFF
            stall = self.stalls.pop(i, 0.0) if kind == ACK1 else 0.0
            time.sleep(stall)
            t = time.perf_counter_ns()
            if kind == ACK1:
                self.found[i] = t
            return kind, seq, value, t, self.empty_ns
        self.empty_ns = before
        return None

    def receive(self, deadline: float) -> tuple[int, int, int, int, int] | None:
        if self.early:
            return self.early.pop(0)
        while True:
            msg = self._poll()
            if msg is not None:
                return msg
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)


def run(
    lags: list[float | None],
    step_s: float,
    late_s: float,
    interval_s: float = 0.0,
    peer: ScriptedPeer | None = None,
) -> tuple[list[int], list[int], list[int], list[int], float, str | None]:
    r = ProbeRound(len(lags), interval_s, step_s, late_s, BASE)
    t0 = time.monotonic()
    err = _pyverbs_round(peer or ScriptedPeer(lags), None, r)
    assert len(r.prober) == len(r.net)
    return r.net, r.raw, r.delays, r.prober, time.monotonic() - t0, err


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
    # answers 20 ms after the post, the send completion seen after 2 ms; probe 2's prober
    # is stalled 30 ms just as its answer arrives
    lags: list[float | None] = [0.02] * 4
    peer = ScriptedPeer(lags, stalls={2: 0.03})
    net, raw, delays, prober, _, err = run(lags, step_s=0.2, late_s=0.2, peer=peer)
    assert err is None and len(prober) == 4
    for i, (r, d, p) in enumerate(zip(raw, delays, prober, strict=True)):
        assert r == peer.found[i] - peer.posted[i] and r - d == net[i]
        assert p <= r  # two disjoint spans of the RTT
        assert p >= peer.found[i] - peer.arrived[i]  # the time it took to see the answer
        if peer.seen[i] < peer.arrived[i]:  # the send completion came first: it counts
            assert p >= peer.seen[i] - peer.posted[i] + peer.found[i] - peer.arrived[i]
    # the stall is host delay inside the RTT, and the prober's delay holds it
    assert prober[2] >= 0.03e9 and raw[2] >= 0.05e9


def test_an_answer_before_the_send_completion_leaves_the_send_side_out() -> None:
    # answers 5 ms after the post, while the send completion takes 50 ms to be seen: the
    # send waits listening, so the answer is found as it comes; the send side is unknown
    lags: list[float | None] = [0.005] * 3
    peer = ScriptedPeer(lags, send_s=0.05, stale=False)
    _, raw, _, prober, _, err = run(lags, step_s=0.2, late_s=0.2, peer=peer)
    assert err is None and len(prober) == 3
    for i, (r, p) in enumerate(zip(raw, prober, strict=True)):
        assert peer.found[i] < peer.seen[i]  # found while the send waited
        # the first poll, right after the post, found nothing yet: only the time after
        # the last empty poll is the prober's, never the send's 50 ms
        assert peer.found[i] - peer.arrived[i] <= p < r < peer.seen[i] - peer.posted[i]
