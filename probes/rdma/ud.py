"""UD probing in the R-Pingmesh manner: a probe and two ACKs per sample, so that the
responder's own processing time is subtracted from the network RTT, and the prober's own
delay is reported beside it.

    prober                       responder
    t1  probe(seq)   -------->   t2  (receive completion)
                     <--------   ACK1(seq)  t3 (its send posted)
    t4  ACK1 arrives <--------   ACK2(seq, t3 - t2)

    network RTT = (t4 - t1) - (t3 - t2)

R-Pingmesh takes six timestamps: the prober's post (t1) and its send completion's
hardware time, the responder's receive and send completions, the prober's receive
completion of the ACK and the time it polled it. The prober's delay is then the post to
its send completion plus the ACK's completion to its poll. Where the device has
completion timestamps (`completion_timestamp_mask` > 0, `hw_ts`) that is the hardware
path: CQs made with ibv_create_cq_ex asking IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, each
completion's ibv_wc_read_completion_ts (device clock ticks, turned into ns with the
hca_core_clock of ibv_query_device_ex; or ibv_wc_read_completion_wallclock_ns where the
provider has it), and the prober's own delay as R-Pingmesh takes it. This
implementation does not take it (soft-RoCE has none, so it could not be tested): every
result says `timestamps: software`, and whether hardware ones could have been had.

In software what the prober can bound is its own delay: an ACK that a poll found came
after the poll before it found the CQ empty, so the time from that empty poll to the
poll that found ACK1 is at most how late the prober saw it (the loop's own pauses in a
long wait and any time it was descheduled are in it: both real host delay inside the
RTT, not network). The pyverbs loop waits for each probe's send completion too (polling
for the answer meanwhile), and the time from t1 to seeing it counts as its send side
when it came before the answer did: on soft-RoCE under emulation it mostly comes after
(the lane measured that), and a completion seen after the answer says nothing of when
the probe left. The spans are disjoint, so the prober's delay is never more than the
RTT. The compiled loop reaps its send completions lazily (nothing stands between the
post and the first poll for the answer), so its prober delay is the receive side alone.
The network RTT above still holds the prober's delay; the collector takes it out where
it explains a path (collector/attribution/join.py).

UD is unreliable by design, so a probe whose ACKs do not come is counted as lost instead
of being retransmitted: loss is part of what is measured. One probe is out at a time:
it waits a step for its ACKs, then the next goes. An answer that comes after its step
is still taken (with its true RTT) while later probes wait, and the round listens
`late_s` past its last probe for answers on their way: on a busy host an answer is often
late, and late is delay, not loss. A probe is lost when its round ends without its
answer. Timestamps are CLOCK_MONOTONIC, read when a poll returns.
"""

from __future__ import annotations

import random
import select
import struct
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from pyverbs.addr import AH, GID, AHAttr, GlobalRoute
from pyverbs.mr import MR
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from fabricprobe.core.errors import PeerError, ProbeError
from fabricprobe.core.stats import LatencySketch
from fabricprobe.probes.control import (
    ControlClient,
    RdmaEndpoint,
    Session,
    SessionHandler,
    require_int,
)
from fabricprobe.probes.measure import LatencyResult, LatencyRound
from fabricprobe.probes.rdma.links import RdmaLink, responder_engine
from fabricprobe.probes.rdma.rc import prober_session, responder_device, source_address, spun
from fabricprobe.probes.rdma.verbs import (
    PORT,
    Spin,
    VerbsEndpoint,
    e,
    gid_to_ipv6,
    ipv6_to_gid,
)

QKEY = 0x1F1F1F1F
GRH_BYTES = 40  # every UD receive buffer starts with room for the global routing header
DONE_FLOOR_S = 2.0  # the closing handshake's least time (UdLink.done_timeout)
MSG = struct.Struct("!IIIQ")  # magic, kind, seq, value (responder delay in ns for ACK2)
MAGIC = 0xFB0DD0D0
PROBE, ACK1, ACK2 = 1, 2, 3
# a received message: kind, seq, value, when a poll found it, and the clock read before
# the last poll that found the receive CQ empty before that (ns; 0: none yet)
Message = tuple[int, int, int, int, int]
# receive slots: one probe is out at a time, but while a host stalls the ACKs of several
# late ones queue up, and a UD message with no receive posted for it is dropped
DEPTH = 32
MAX_PROBES = 1_000_000
# A responder with no probe for this long looks whether the prober has ended the round (a
# lost probe leaves it short of the count). Each look starts a new 5 ms busy poll, so
# shorter costs CPU; longer keeps the prober's next round waiting.
CONTROL_POLL_S = 0.1


class UdEndpoint(VerbsEndpoint):
    """A UD QP with one CQ per direction and a small registered ring of slots: slots
    [0, DEPTH) receive, slot DEPTH is the send slot."""

    KIND = "UD"
    SLOT = GRH_BYTES + MSG.size

    def __init__(self, device: str, gid_index: int, port: int = PORT) -> None:
        self.gid_index = gid_index
        super().__init__(device, DEPTH, port)

    def create_mr(self) -> Any:
        return MR(self.pd, self.SLOT * (DEPTH + 1), e.IBV_ACCESS_LOCAL_WRITE)

    def create_qp(self) -> Any:
        cap = QPCap(max_send_wr=DEPTH, max_recv_wr=DEPTH, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_UD, scq=self.send_cq, rcq=self.recv_cq, cap=cap)
        attr = QPAttr()
        attr.qkey = QKEY
        attr.port_num = self.port
        return QP(self.pd, init, attr)  # pyverbs takes a UD QP all the way to RTS

    def describe(self) -> None:
        self.gid = str(self.ctx.query_gid(self.port, self.gid_index))
        try:
            self.hw_ts = int(self.ctx.query_device_ex().completion_timestamp_mask) > 0
        except (PyverbsRDMAError, AttributeError):
            self.hw_ts = False
        self._recv = [
            RecvWR(
                wr_id=i, num_sge=1, sg=[SGE(self.mr.buf + i * self.SLOT, self.SLOT, self.mr.lkey)]
            )
            for i in range(DEPTH)
        ]
        for wr in self._recv:
            self.qp.post_recv(wr)
        self._send_sge = SGE(self.mr.buf + DEPTH * self.SLOT + GRH_BYTES, MSG.size, self.mr.lkey)
        self._empty_ns = 0  # the clock before the newest poll that found the receive CQ empty
        self._early: list[Message] = []  # answers found while a send waited (listen=True)

    def endpoint(self) -> RdmaEndpoint:
        return RdmaEndpoint.datagram(self.qp.qp_num, gid_to_ipv6(self.gid), self.gid_index)

    def sender(self, remote: RdmaEndpoint) -> Any:
        """A send WR towards REMOTE, built once (its address handle lives with us)."""
        route = GlobalRoute(
            dgid=GID(ipv6_to_gid(remote.gid)), sgid_index=self.gid_index, hop_limit=64
        )
        ah = AH(self.pd, attr=AHAttr(gr=route, is_global=1, port_num=self.port))
        self._extra.append(ah)
        wr = SendWR(
            wr_id=DEPTH,
            opcode=e.IBV_WR_SEND,
            num_sge=1,
            sg=[self._send_sge],
            send_flags=e.IBV_SEND_SIGNALED,
        )
        wr.set_wr_ud(ah, remote.qpn, QKEY)
        return wr

    def send(
        self, wr: Any, kind: int, seq: int, value: int, deadline: float, listen: bool = False
    ) -> tuple[int, int]:
        """Send one message and wait for its completion; returns the software timestamps
        taken just before the post and when the completion was seen. The first is the
        probe's t1 (a completion seen by a busy poller can be late: the reply may already
        be back, so it would make t4 - t1 shorter than the truth). LISTEN (the prober)
        polls the receive CQ too while it waits, so that an answer that comes first is
        seen when it comes: receive() hands it over next."""
        self.mr.write(MSG.pack(MAGIC, kind, seq, value), MSG.size, DEPTH * self.SLOT + GRH_BYTES)
        t = time.perf_counter_ns()
        self.qp.post_send(wr)
        spin = Spin(deadline)
        while True:
            n, wcs = self.send_cq.poll(1)
            if n:
                seen = time.perf_counter_ns()
                if wcs[0].status != e.IBV_WC_SUCCESS:
                    raise PeerError(f"{self.device}: UD send completion status {wcs[0].status}")
                return t, seen
            if listen:
                _, msg = self._poll_receive()
                if msg is not None:
                    self._early.append(msg)
            if spin.expired():
                raise PeerError(f"{self.device}: UD send did not complete in time")

    def _poll_receive(self) -> tuple[int, Message | None]:
        """One poll of the receive CQ: (completions found, the valid message or None).
        The clock is read before each poll: one that finds the CQ empty is kept in
        `_empty_ns`, and a message found later arrived after it."""
        before = time.perf_counter_ns()
        n, wcs = self.recv_cq.poll(1)
        if not n:
            self._empty_ns = before
            return 0, None
        t = time.perf_counter_ns()
        wc = wcs[0]
        slot = wc.wr_id
        msg = None
        if wc.status == e.IBV_WC_SUCCESS and wc.byte_len == GRH_BYTES + MSG.size:
            magic, kind, seq, value = MSG.unpack(
                self.mr.read(MSG.size, slot * self.SLOT + GRH_BYTES)
            )
            if magic == MAGIC:
                msg = (kind, seq, value, t, self._empty_ns)
        self.qp.post_recv(self._recv[slot])
        return n, msg

    def receive(self, deadline: float) -> Message | None:
        """Next valid message as (kind, seq, value, t_ns, empty_ns), or None at the
        deadline: T_NS when a poll found it, EMPTY_NS the clock read before the last poll
        that found the receive CQ empty before it (0: none yet). Malformed datagrams
        (wrong size or magic) are dropped and the slot re-posted."""
        if self._early:
            return self._early.pop(0)
        spin = Spin(deadline)
        while True:
            n, msg = self._poll_receive()
            if msg is not None:
                return msg
            if not n and spin.expired():
                return None


@dataclass(frozen=True)
class UdPorts:
    """What names a UD link's ECMP class: its source address and device, and the QP
    numbers on both ends (each device takes its QP's UDP source port from it)."""

    source: str
    device: str
    qpn: int
    remote_qpn: int


class UdLink(RdmaLink):
    """A UD probe link: several rounds over one UD QP on each end (the responder keeps
    its address handle towards us too). Sequence numbers continue across a session's
    rounds, so a late ACK of an earlier round is never taken for a new one. `ports`
    names the session's ECMP class once it is open."""

    STEP_S = 0.5
    LATE_S = 1.0  # how long a round listens past its last probe for late answers
    _seq = 0  # the next probe's sequence number; each session starts at a random one
    ports: UdPorts | None = None

    def _setup(self, params: dict[str, Any]) -> tuple[ControlClient, Any, Any]:
        hello = {**params, "step_s": self.step_s, "engine": self.engine}
        ctl, ep, remote = self._stack.enter_context(
            prober_session(
                "rdma_ud",
                self.params,
                self.timeout,  # the endpoint, connect, hello -> ready: one deadline
                hello,
                lambda dev, gid_index: _ud_endpoint(self.engine, dev, gid_index),
            )
        )
        self._seq = random.randrange(1 << 30)
        p = self.params
        source = source_address(p.peer, p.port, p.bind)  # a UDP connect: nothing is sent
        self.ports = UdPorts(source, ep.device, ep.endpoint().qpn, remote.qpn)
        return ctl, ep, ep.sender(remote)

    def done_timeout(self) -> float:
        """The responder looks for the end of a round every CONTROL_POLL_S (and may be
        sending an ACK, a step at most): the closing handshake gets both, and never less
        than DONE_FLOOR_S (on a loaded host a responder that answered every probe can still
        take a few hundred ms to close; the figures are in hand by then)."""
        return max(DONE_FLOOR_S, self.step_s + 2 * CONTROL_POLL_S)

    def round(
        self, probes: int, interval_s: float = 0.0, warmup: int = 1, late_s: float | None = None
    ) -> LatencyRound:
        """One round of PROBES probes, at most one per INTERVAL_S, after WARMUP unrecorded
        ones (the first probe of a round may find the responder pausing between polls,
        and the time it waits there is not part of the delay it reports), answers taken
        until LATE_S (default LATE_S, at least a step) after the last: the bare figures."""
        if not 1 <= probes <= MAX_PROBES:
            raise ValueError(f"probes {probes} outside 1..{MAX_PROBES}")
        if not 0 <= interval_s <= 60 or not 0 <= warmup <= 100:
            raise ValueError(f"interval {interval_s} s or warm-up {warmup} out of range")
        late = self.LATE_S if late_s is None else late_s
        if not 0 <= late <= 60:
            raise ValueError(f"late_s {late} outside 0..60 s")
        total = probes + warmup
        _, ep, wr = self._begin({"probes": total})
        step_s = self.step_s
        late = max(late, step_s)
        base, self._seq = self._seq, (self._seq + total) & 0xFFFFFFFF
        t_start = time.perf_counter()
        run = _native_round if self.engine == "native" else _pyverbs_round
        # warm-up answers are not waited for: a late one is ignored by the measured round
        error = run(ep, wr, ProbeRound(warmup, 0.0, step_s, 0.0, base)) if warmup else None
        got = ProbeRound(probes, interval_s, step_s, late, base + warmup)
        if error is None:
            error = run(ep, wr, got)
        duration = time.perf_counter() - t_start
        self._end(error, {"probes": probes})
        return LatencyRound(
            array("q", got.net),
            probes - len(got.net),
            error,
            ep.device,
            duration,
            raw_ns=array("q", got.raw),
            delays_ns=array("q", got.delays),
            prober_ns=array("q", got.prober),
            hw_ts=ep.hw_ts,
        )

    def run(
        self, probes: int, interval_s: float = 0.0, warmup: int = 1, late_s: float | None = None
    ) -> LatencyResult:
        """One round, summarised: network RTT, RTT with the responder's delay, that delay,
        and the prober's own delay (see the module docstring)."""
        r = self.round(probes, interval_s, warmup, late_s)
        net, raw = LatencySketch("rtt"), LatencySketch("rtt")
        net.record_many(r.rtt_ns)
        net.record_lost(r.lost)
        raw.record_many(r.raw_ns)
        prober = LatencySketch("delay")
        prober.record_many(r.prober_ns)
        delays = sorted(r.delays_ns)
        return self._result(
            r,
            net,
            qp_type="ud",
            op="probe",
            size=None,
            iters=probes,
            raw_summary=raw.summary(),
            responder_delay_p50_us=round(delays[len(delays) // 2] / 1000, 3) if delays else None,
            prober_delay=prober,
            timestamps="software",
            hw_timestamps_supported=r.hw_ts,
        )


def _ud_endpoint(engine: str, device: str, gid_index: int) -> Any:
    if engine == "native":
        from fabricprobe.probes.rdma.native import NativeUdEndpoint

        return NativeUdEndpoint(device, gid_index, QKEY, DEPTH)
    return UdEndpoint(device, gid_index)


@dataclass(frozen=True)
class ProbeRound:
    """One UD round's loop: PROBES probes numbered from BASE, at most one per INTERVAL_S,
    each waiting STEP_S for its ACKs, late ACKs taken for LATE_S after the last; the loop
    appends each answered probe's network RTT, raw RTT, responder's delay and prober's
    delay (ns) to NET, RAW, DELAYS and PROBER."""

    probes: int
    interval_s: float
    step_s: float
    late_s: float
    base: int
    net: list[int] = field(default_factory=list)
    raw: list[int] = field(default_factory=list)
    delays: list[int] = field(default_factory=list)
    prober: list[int] = field(default_factory=list)


def _pyverbs_round(ep: Any, wr: Any, r: ProbeRound) -> str | None:
    """A round probe by probe in Python, as the compiled loop runs it (fp_ud_probe): each
    probe waits STEP_S for its ACKs, the next goes no sooner than INTERVAL_S after it,
    late ACKs are taken on the way and for LATE_S after the last probe. Fills NET, RAW,
    DELAYS and PROBER; returns why it stopped short, or None.

    The prober's delay of a probe: the receive side, from the last poll that found the
    receive CQ empty (or t1, if later) to the poll that found ACK1, and the send side,
    from t1 to seeing the send completion, when that came before the receive side began
    (a completion seen after the answer came says nothing of when the probe left). The
    two spans are disjoint, so the delay is never more than the RTT."""
    probes, interval_s, step_s, late_s, base = r.probes, r.interval_s, r.step_s, r.late_s, r.base
    t1s: list[int] = []
    seens: list[int] = []
    t4s: list[int | None] = []
    own: list[int] = []
    got: list[int | None] = []
    answered = 0

    def take(msg: Message) -> None:
        nonlocal answered
        kind, mseq, value, t, empty = msg
        i = (mseq - base) & 0xFFFFFFFF
        if i >= len(t1s):
            return  # a late ACK of an earlier round
        was = t4s[i] is not None and got[i] is not None
        if kind == ACK1 and t4s[i] is None:
            t4s[i] = t
            since = max(empty, t1s[i])  # the answer came after this
            sent = seens[i] - t1s[i] if seens[i] <= since else 0
            own[i] = sent + max(0, t - since)
        elif kind == ACK2 and got[i] is None:
            got[i] = value
        answered += not was and t4s[i] is not None and got[i] is not None

    error = None
    last = 0.0
    for i in range(probes):
        last = time.monotonic()
        deadline = last + step_s
        try:
            t1, seen = ep.send(wr, PROBE, (base + i) & 0xFFFFFFFF, 0, deadline, listen=True)
        except PeerError as err:
            error = str(err)
            break
        t1s.append(t1)
        seens.append(seen)
        t4s.append(None)
        own.append(0)
        got.append(None)
        nxt = last + interval_s if i + 1 < probes else 0.0
        while True:
            done = t4s[i] is not None and got[i] is not None
            until = nxt if done else max(deadline, nxt)
            if time.monotonic() >= until:
                break
            msg = ep.receive(until)
            if msg is not None:
                take(msg)
    if error is None and t1s:
        until = last + late_s
        while answered < len(t1s):
            msg = ep.receive(until)
            if msg is None:
                break
            take(msg)
    for t1, t4, mine, delay in zip(t1s, t4s, own, got, strict=True):
        if t4 is not None and delay is not None and delay <= t4 - t1:
            r.raw.append(t4 - t1)
            r.net.append(t4 - t1 - delay)
            r.delays.append(delay)
            r.prober.append(mine)
    return error


def _native_round(ep: Any, wr: Any, r: ProbeRound) -> str | None:
    """A round in the compiled loop, in one call (see _pyverbs_round); fills NET, RAW,
    DELAYS and PROBER (the receive side only: the loop does not wait for its sends);
    returns why it stopped short, or None."""
    try:
        got = ep.probe(r.probes, r.step_s, r.base, r.interval_s, r.late_s)
    except ProbeError as err:
        return str(err)
    r.net.extend(got[0])
    r.raw.extend(got[1])
    r.delays.extend(got[2])
    r.prober.extend(got[3])
    return None


def serve_ud(session: Session) -> dict[str, Any]:
    p = session.params
    probes = require_int(p, "probes", 1, MAX_PROBES, where="params.")
    step_s = float(p.get("step_s", 0.5))
    if not 0.01 <= step_s <= 60:
        raise ProbeError(f"params.step_s {step_s} outside 0.01..60")
    remote = session.rdma_endpoint()  # ACKs go only to the address that asked
    session.reserve(UdEndpoint.SLOT * (DEPTH + 1), "a UD endpoint's ring")
    dev, gid_index = responder_device(session)
    # the prober's engine when this host has it (the responder's own delay is taken out
    # of every RTT either way, but a pyverbs prober is answered by pyverbs as it asked)
    engine = responder_engine(p.get("engine", "pyverbs"))
    ep = spun(session.resources.enter_context(_ud_endpoint(engine, dev, gid_index)), session.spin_s)
    wr = ep.sender(remote)
    session.ready({"endpoint": ep.endpoint().as_dict(), "engine": engine})
    answered = 0
    while True:  # one round, or one per `again` of a kept link
        if engine == "native":
            answered += _answer_native(session, ep, probes, step_s)
        else:
            answered += _answer(session, ep, wr, probes, step_s)
        nxt = session.next_round()
        if nxt is None:
            break
        probes = require_int(nxt, "probes", 1, MAX_PROBES, where="again.params.")
        session.go()
    return {"answered": answered, "engine": engine}


def _prober_spoke(session: Session) -> bool:
    """The prober wrote on the control connection (its next round, `done`, or it hung
    up): it has sent every probe of this round and waited out each one's ACKs. A round
    with lost probes never reaches its count here, and without this the responder would
    wait out its idle time while the prober waits for it."""
    try:
        readable, _, _ = select.select([session.channel.sock], [], [], 0)
    except (OSError, ValueError):  # closed under us
        return True
    return bool(readable)


def _answer_native(session: Session, ep: Any, probes: int, step_s: float) -> int:
    """Answer up to PROBES probes in the compiled loop, in calls that return after
    CONTROL_POLL_S without a probe, so that the end of the round is seen between them."""
    answered = 0
    idle_s = max(step_s * 4, 2.0)
    last = time.monotonic()
    while answered < probes and not session.stopping:
        got = ep.answer(probes - answered, step_s, CONTROL_POLL_S)
        answered += got
        now = time.monotonic()
        last = now if got else last
        if _prober_spoke(session) or now - last > idle_s:
            break
    return answered


def _answer(session: Session, ep: UdEndpoint, wr: Any, probes: int, step_s: float) -> int:
    """Answer up to PROBES probes with two ACKs each; stop when the prober says the round
    is over or goes quiet."""
    answered = 0
    idle_deadline = time.monotonic() + max(step_s * 4, 2.0)
    while answered < probes and not session.stopping:
        msg = ep.receive(min(idle_deadline, time.monotonic() + CONTROL_POLL_S))
        if msg is None:
            if _prober_spoke(session) or time.monotonic() >= idle_deadline:
                break
            continue
        kind, seq, _, t2, _ = msg
        if kind != PROBE:
            continue
        deadline = time.monotonic() + step_s
        t3, _ = ep.send(wr, ACK1, seq, 0, deadline)
        ep.send(wr, ACK2, seq, t3 - t2, deadline)
        answered += 1
        idle_deadline = time.monotonic() + max(step_s * 4, 2.0)
    return answered


# Session kind -> handler, for whoever builds a responder.
SESSIONS: dict[str, SessionHandler] = {"rdma_ud": serve_ud}
