"""The routed hops of RoCEv2 traffic to a peer, one trace per UDP source port.

A leaf-spine fabric hashes each flow's 5-tuple (source and destination address, UDP,
source port, 4791) onto one of its equal-cost paths, and a RoCE device gives each queue
pair its own source port, so each source port is an ECMP class with a path of its own.
A probe sent with a TTL of k expires at the k-th router, which answers with an ICMP
time-exceeded that quotes the probe's IP and UDP headers: the quoted source port tells
which class the answer belongs to, the answer's source address which router (with
`icmp_errors_use_inbound_ifaddr`, the address of the interface the probe came in on,
which names the link as well).

Two ways to send the probes, both on the class's own 5-tuple:

- `ud`: hop-limited UD sends through the RDMA device itself (probes/rdma/trace.py), the
  RoCE flow's own packets. The ICMP answers go to no socket (the device's UDP socket is
  bound to 4791, the quoted source port is the QP's), so they are read from a raw ICMP
  socket, which needs CAP_NET_RAW.
- `udp`: a UDP socket bound to the class's source port sending to the peer's 4791, with
  IP_TTL set per probe; the kernel hands the ICMP answer to that socket's error queue
  (IP_RECVERR), which needs no privilege. The socket is left unconnected: a connected
  one stamps its packets with a random flow hash of its own, which a Linux router's
  multipath choice would take instead of the 5-tuple's. It is the way where the UD one cannot
  be had: no CAP_NET_RAW, or a driver that does not put the address handle's hop limit
  into the IP TTL (no router ever answers a UD probe, while one answers a UDP probe).
  Its 16-byte payload is too short for a RoCE packet, so a peer's device drops it.

One probe per class is out at a time; each waits up to `timeout_s` for its answer. A
class ends after `quiet` TTLs in a row went unanswered (the probe reached the peer, which
sends no time-exceeded, or routers beyond do not answer) or at `max_hops`. A hop's RTT
is the time from the send to the poll that saw the answer: a router makes its ICMP on
its slow path, and this host's scheduling is in the figure, so it places a hop, it does
not time the link.
"""

from __future__ import annotations

import contextlib
import ipaddress
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fabricprobe.core.errors import ProbeError

ROCE_V2_PORT = 4791
ICMP_TIME_EXCEEDED = 11
ICMP_UNREACHABLE = 3
SPORT_MIN = 0xC000  # RoCE v2 source ports come from 49152..65535 (IBTA annex A17)
MAX_HOPS = 32
MAX_CLASSES = 64
# probe kinds whose kept links can be told apart by ECMP class (a queue pair each)
CLASS_KINDS = frozenset({"rdma_ud"})
PAYLOAD = struct.Struct("!4sHHQ")  # magic, ttl, class index, send time (ns)
MAGIC = b"FPTR"
# IP_RECVERR's struct sock_extended_err: errno, origin, type, code, pad, info, data
EXTENDED_ERR = struct.Struct("=IBBBBII")
SO_EE_ORIGIN_ICMP = 2
IP_RECVERR = getattr(socket, "IP_RECVERR", 11)


@dataclass(frozen=True)
class Quote:
    """An ICMP error as a raw socket reads it: who sent it, what kind, and the probe
    headers it quotes (and as much of the probe's UDP payload as it carries)."""

    router: str
    icmp_type: int
    icmp_code: int
    src: str
    dst: str
    sport: int
    dport: int
    payload: bytes


def _ipv4_header(buf: bytes, at: int) -> tuple[int, int, str, str] | None:
    """(header length, protocol, source, destination) of the IPv4 header at AT."""
    if len(buf) < at + 20 or buf[at] >> 4 != 4:
        return None
    ihl = (buf[at] & 0x0F) * 4
    if ihl < 20 or len(buf) < at + ihl:
        return None
    src = socket.inet_ntoa(buf[at + 12 : at + 16])
    dst = socket.inet_ntoa(buf[at + 16 : at + 20])
    return ihl, buf[at + 9], src, dst


def parse_icmp_error(packet: bytes) -> Quote | None:
    """The quote of an ICMP time-exceeded or destination-unreachable carried in an IPv4
    packet (as a raw IPPROTO_ICMP socket returns it), or None for anything else: other
    ICMP types, a truncated packet, or a quote of something other than UDP."""
    outer = _ipv4_header(packet, 0)
    if outer is None or outer[1] != socket.IPPROTO_ICMP:
        return None
    at = outer[0]
    if len(packet) < at + 8:
        return None
    icmp_type, icmp_code = packet[at], packet[at + 1]
    if icmp_type not in (ICMP_TIME_EXCEEDED, ICMP_UNREACHABLE):
        return None
    inner = _ipv4_header(packet, at + 8)
    if inner is None or inner[1] != socket.IPPROTO_UDP:
        return None
    udp = at + 8 + inner[0]
    if len(packet) < udp + 8:
        return None
    sport, dport = struct.unpack_from("!HH", packet, udp)
    return Quote(
        router=outer[2],
        icmp_type=icmp_type,
        icmp_code=icmp_code,
        src=inner[2],
        dst=inner[3],
        sport=sport,
        dport=dport,
        payload=bytes(packet[udp + 8 :]),
    )


@dataclass(frozen=True)
class Hop:
    ttl: int
    address: str | None  # None: no answer within the timeout
    rtt_s: float | None


@dataclass
class ClassTrace:
    """One ECMP class's hops, in TTL order; `complete` when it ended on `quiet` silent
    TTLs (the probes reached the peer) rather than at the hop limit."""

    sport: int
    hops: list[Hop] = field(default_factory=list)
    complete: bool = False

    def addresses(self) -> list[str | None]:
        return [h.address for h in self.hops]

    def to_json(self) -> dict[str, object]:
        return {
            "sport": self.sport,
            "hops": self.addresses(),
            "rtt_s": [h.rtt_s for h in self.hops],
            "complete": self.complete,
        }


@dataclass
class TraceResult:
    source: str
    peer: str
    method: str  # "ud" or "udp"
    why: str  # why this method, in words
    classes: list[ClassTrace]
    probes_sent: int = 0
    answers: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "peer": self.peer,
            "dport": ROCE_V2_PORT,
            "method": self.method,
            "method_reason": self.why,
            "probes_sent": self.probes_sent,
            "answers": self.answers,
            "classes": [c.to_json() for c in self.classes],
        }


@dataclass(frozen=True)
class TraceConfig:
    max_hops: int = 8
    timeout_s: float = 0.3
    quiet: int = 2  # unanswered TTLs in a row that end a class
    gap_s: float = 0.002  # the least time between two probes of one class

    def __post_init__(self) -> None:
        if not 1 <= self.max_hops <= MAX_HOPS:
            raise ValueError(f"max hops {self.max_hops} outside 1..{MAX_HOPS}")
        if not 0.01 <= self.timeout_s <= 10:
            raise ValueError(f"timeout {self.timeout_s} s outside 0.01..10")
        if not 1 <= self.quiet <= 4:
            raise ValueError(f"quiet {self.quiet} outside 1..4")


class Prober(Protocol):
    """Sends a class's probe with a TTL, and returns the answers that came: (class
    index, TTL the answer is for or None when the quote does not say, router address)."""

    @property
    def sports(self) -> Sequence[int]: ...

    def send(self, index: int, ttl: int) -> None: ...

    def fileno(self) -> int: ...

    def answers(self) -> list[tuple[int, int | None, str]]: ...

    def close(self) -> None: ...


def spread_sports(n: int) -> list[int]:
    """N source ports spread over the RoCE v2 range (for the UDP way, where any port can
    be chosen)."""
    if not 1 <= n <= MAX_CLASSES:
        raise ValueError(f"classes {n} outside 1..{MAX_CLASSES}")
    step = (0x10000 - SPORT_MIN) // n
    return [SPORT_MIN + i * step + step // 2 + 1 for i in range(n)]


def run_trace(
    prober: Prober, config: TraceConfig, clock: Callable[[], int], peer: str
) -> list[ClassTrace]:
    """Walk every class's TTLs at once, one probe per class out at a time. An answer
    from PEER itself (a port unreachable where nothing listens on 4791) ends its class:
    the probe arrived."""
    n = len(prober.sports)
    traces = [ClassTrace(sport=s) for s in prober.sports]
    ttl = [1] * n
    sent_at: list[int | None] = [None] * n
    silent = [0] * n
    done = [False] * n
    timeout_ns = int(config.timeout_s * 1e9)

    def advance(i: int, hop: Hop) -> None:
        if hop.address == peer:
            traces[i].complete = done[i] = True
            sent_at[i] = None
            return
        traces[i].hops.append(hop)
        silent[i] = silent[i] + 1 if hop.address is None else 0
        sent_at[i] = None
        if silent[i] >= config.quiet:
            traces[i].complete = True
            done[i] = True
            del traces[i].hops[-config.quiet :]
        elif ttl[i] >= config.max_hops:
            done[i] = True
        else:
            ttl[i] += 1

    while not all(done):
        now = clock()
        for i in range(n):
            if not done[i] and sent_at[i] is None:
                prober.send(i, ttl[i])
                sent_at[i] = clock()
        due = min(s for i, s in enumerate(sent_at) if s is not None and not done[i])
        wait_s = max(0.0, (due + timeout_ns - now) / 1e9)
        ready, _, _ = select.select([prober.fileno()], [], [], min(wait_s, config.timeout_s))
        now = clock()
        if ready:
            for i, for_ttl, router in prober.answers():
                start = sent_at[i]
                if done[i] or start is None or (for_ttl is not None and for_ttl != ttl[i]):
                    continue  # late: its TTL already timed out
                advance(i, Hop(ttl[i], router, (now - start) / 1e9))
        for i in range(n):
            start = sent_at[i]
            if not done[i] and start is not None and now - start >= timeout_ns:
                advance(i, Hop(ttl[i], None, None))
        if config.gap_s:
            time.sleep(config.gap_s)
    for t in traces:  # a silent hop at the end says nothing past the last answer
        while t.hops and t.hops[-1].address is None:
            t.hops.pop()
    return traces


class UdpProber:
    """The UDP way: a socket per class, bound to (source, sport), sending to the peer's
    4791, IP_RECVERR on; answers come on each socket's error queue."""

    def __init__(self, source: str, peer: str, sports: Sequence[int]) -> None:
        self.sports = list(sports)
        self.peer = (peer, ROCE_V2_PORT)
        self.socks: list[socket.socket] = []
        self.sent = 0
        self._poll = select.epoll()
        self._index: dict[int, int] = {}
        try:
            for i, sport in enumerate(self.sports):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self.socks.append(s)
                s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
                try:
                    s.bind((source, sport))
                except OSError as err:
                    raise ProbeError(f"cannot bind UDP {source}:{sport}: {err.strerror}") from err
                s.setblocking(False)
                self._index[s.fileno()] = i
                self._poll.register(s.fileno(), select.EPOLLERR)
        except BaseException:
            self.close()
            raise

    def fileno(self) -> int:
        return self._poll.fileno()

    def send(self, index: int, ttl: int) -> None:
        s = self.socks[index]
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
        # a pending error (an earlier answer) fails the send: answers() reads it
        with contextlib.suppress(OSError):
            s.sendto(PAYLOAD.pack(MAGIC, ttl, index, time.monotonic_ns()), self.peer)
        self.sent += 1

    def answers(self) -> list[tuple[int, int | None, str]]:
        out: list[tuple[int, int | None, str]] = []
        for fd, _ in self._poll.poll(0):
            i = self._index[fd]
            while True:
                try:
                    data, anc, _, _ = self.socks[i].recvmsg(64, 512, socket.MSG_ERRQUEUE)
                except (BlockingIOError, InterruptedError):
                    break
                got = _errqueue_answer(data, anc)
                if got is not None:
                    out.append((i, got[0], got[1]))
        return out

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.socks.clear()
        self._poll.close()


def _errqueue_answer(
    data: bytes, anc: list[tuple[int, int, bytes]]
) -> tuple[int | None, str] | None:
    """(TTL from the quoted payload, router) of one IP_RECVERR message, if it is an ICMP
    time-exceeded or unreachable."""
    for level, kind, blob in anc:
        if level != socket.IPPROTO_IP or kind != IP_RECVERR or len(blob) < EXTENDED_ERR.size + 8:
            continue
        _, origin, icmp_type, _, _, _, _ = EXTENDED_ERR.unpack_from(blob)
        if origin != SO_EE_ORIGIN_ICMP or icmp_type not in (ICMP_TIME_EXCEEDED, ICMP_UNREACHABLE):
            continue
        router = socket.inet_ntoa(blob[EXTENDED_ERR.size + 4 : EXTENDED_ERR.size + 8])
        return payload_ttl(data), router
    return None


def payload_ttl(payload: bytes) -> int | None:
    """The TTL a quoted UDP-way payload was sent with, when the quote holds it."""
    if len(payload) < PAYLOAD.size:
        return None
    magic, ttl, _, _ = PAYLOAD.unpack_from(payload)
    return ttl if magic == MAGIC else None


def raw_icmp_socket() -> socket.socket:
    """A raw ICMP socket, or PermissionError without CAP_NET_RAW."""
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.setblocking(False)
    return s


def check_addresses(source: str, peer: str) -> None:
    for what, a in (("source", source), ("peer", peer)):
        try:
            ipaddress.IPv4Address(a)
        except ValueError:
            raise ValueError(f"{what} {a!r} is not an IPv4 address") from None


def trace_udp(
    source: str, peer: str, sports: Sequence[int], config: TraceConfig, why: str
) -> TraceResult:
    check_addresses(source, peer)
    prober = UdpProber(source, peer, sports)
    try:
        classes = run_trace(prober, config, time.monotonic_ns, peer)
    finally:
        prober.close()
    return TraceResult(
        source,
        peer,
        "udp",
        why,
        classes,
        prober.sent,
        sum(1 for c in classes for h in c.hops if h.address),
    )
