"""The UD way of `probe trace` (probes/trace.py): hop-limited UD sends through the RDMA
device itself, so each probe is the RoCE flow's own packet on its own 5-tuple.

Each ECMP class is a UD queue pair: the device takes the QP's UDP source port from its
QP number (probes/sport.py has each driver's rule), so N QPs with N different ports are
N classes. A probe is a UD send through an address handle whose GRH hop limit is the
TTL wanted; soft-RoCE writes it into the IPv4 TTL. The routers' time-exceeded answers
are read from a raw ICMP socket (CAP_NET_RAW) and matched to their class by the quoted
source port, and to their TTL by the quoted BTH's PSN where the router quoted that far
(Linux quotes up to 576 bytes; a switch may quote only the UDP header).

A probe that reaches the peer is a UD send to a QP number no device hands out (the
24-bit all-ones but one), which the peer's device drops: it reaches no process.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import Any

from pyverbs.addr import AH, GID, AHAttr, GlobalRoute
from pyverbs.mr import MR
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

from fabricprobe.core.errors import ProbeError
from fabricprobe.probes.rdma.verbs import (
    PORT,
    Spin,
    VerbsEndpoint,
    device_for_address,
    e,
    ipv6_to_gid,
    verbs_error,
)
from fabricprobe.probes.sport import source_port
from fabricprobe.probes.sysfs import read_device
from fabricprobe.probes.trace import (
    MAX_HOPS,
    ROCE_V2_PORT,
    TraceConfig,
    TraceResult,
    check_addresses,
    parse_icmp_error,
    raw_icmp_socket,
    run_trace,
    spread_sports,
    trace_udp,
)

QKEY = 0x1F1F1F1E
NOWHERE_QPN = 0xFFFFFE
DEPTH = 16
PAYLOAD_BYTES = 16
BTH = struct.Struct("!BBHII")  # opcode, flags, pkey, dest QPN (with a reserved byte), PSN
QP_ATTEMPTS = 8  # QPs made per class wanted, at most, to find distinct source ports
REAP_S = 1.0  # a send completion comes long before this, or the device is stuck


class TraceQps(VerbsEndpoint):
    """N UD QPs on one PD and CQ, each with its own source port; address handles per TTL
    are made on first use and released with the rest."""

    KIND = "UD trace"

    def __init__(self, device: str, gid_index: int, classes: int, driver: str) -> None:
        self.gid_index = gid_index
        self.classes = classes
        self.driver = driver
        self.qps: list[Any] = []
        self.sports: list[int] = []
        self._ahs: dict[int, Any] = {}
        self._sent = [0] * classes  # sends per QP: the next one's PSN
        self._posted = 0
        super().__init__(device, DEPTH, PORT)

    def create_mr(self) -> Any:
        return MR(self.pd, PAYLOAD_BYTES, e.IBV_ACCESS_LOCAL_WRITE)

    def _one_qp(self) -> Any:
        cap = QPCap(max_send_wr=DEPTH, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_UD, scq=self.send_cq, rcq=self.recv_cq, cap=cap)
        attr = QPAttr()
        attr.qkey = QKEY
        attr.port_num = self.port
        return QP(self.pd, init, attr)

    def create_qp(self) -> Any:
        return self._one_qp()

    def describe(self) -> None:
        """Keep QPs until there are `classes` distinct source ports (a QP whose port a
        kept one already has is released at once)."""
        candidates = [self.qp]
        seen: set[int] = set()
        for _ in range(self.classes * QP_ATTEMPTS):
            qp = candidates.pop() if candidates else self._one_qp()
            port = source_port(self.driver, qp.qp_num)
            if port is None:
                qp.close()
                raise ProbeError(
                    f"{self.device}: the {self.driver} driver's UDP source port rule is not known"
                )
            if port in seen:
                if qp is not self.qp:
                    qp.close()
                continue
            seen.add(port)
            self.qps.append(qp)
            self.sports.append(port)
            if qp is not self.qp:
                self._extra.append(qp)
            if len(self.qps) == self.classes:
                break
        if len(self.qps) < self.classes:
            raise ProbeError(f"{self.device}: found only {len(self.qps)} distinct source ports")

    def ah(self, dgid: str, ttl: int) -> Any:
        ah = self._ahs.get(ttl)
        if ah is None:
            route = GlobalRoute(
                dgid=GID(ipv6_to_gid(dgid)), sgid_index=self.gid_index, hop_limit=ttl
            )
            ah = AH(self.pd, attr=AHAttr(gr=route, is_global=1, port_num=self.port))
            self._ahs[ttl] = ah
            self._extra.insert(0, ah)  # released before the QPs' PD
        return ah

    def post(self, index: int, dgid: str, ttl: int) -> int:
        """Send one probe from class INDEX; returns its PSN."""
        self._reap()
        wr = SendWR(
            wr_id=index,
            opcode=e.IBV_WR_SEND,
            num_sge=1,
            sg=[SGE(self.mr.buf, PAYLOAD_BYTES, self.mr.lkey)],
            send_flags=e.IBV_SEND_SIGNALED,
        )
        wr.set_wr_ud(self.ah(dgid, ttl), NOWHERE_QPN, QKEY)
        try:
            self.qps[index].post_send(wr)
        except PyverbsRDMAError as err:
            raise verbs_error(f"{self.device}: UD trace send", err) from err
        self._posted += 1
        psn = self._sent[index] & 0xFFFFFF
        self._sent[index] += 1
        return psn

    def _reap(self) -> None:
        """Take the send completions that are in; with half the queue outstanding, wait
        for them (pausing, as every verbs wait does), REAP_S at most."""
        spin = Spin(time.monotonic() + REAP_S)
        while self._posted:
            n, _ = self.send_cq.poll(DEPTH)
            if n:
                self._posted -= n
            elif self._posted < DEPTH // 2:
                return
            elif spin.expired():
                raise ProbeError(f"{self.device}: {self._posted} UD trace sends did not complete")


class UdProber:
    """The UD way for run_trace: TraceQps for the sends, a raw ICMP socket for the
    answers."""

    def __init__(
        self, device: str, gid_index: int, source: str, peer: str, classes: int, driver: str
    ) -> None:
        self.source, self.peer = source, peer
        self.dgid = f"::ffff:{peer}"
        self.raw = raw_icmp_socket()  # PermissionError without CAP_NET_RAW
        try:
            self.qps = TraceQps(device, gid_index, classes, driver)
        except BaseException:
            self.raw.close()
            raise
        self.sports: Sequence[int] = self.qps.sports
        self._by_sport = {p: i for i, p in enumerate(self.sports)}
        self._psn_ttl: dict[tuple[int, int], int] = {}
        self.sent = 0

    def fileno(self) -> int:
        return self.raw.fileno()

    def send(self, index: int, ttl: int) -> None:
        if not 1 <= ttl <= MAX_HOPS:
            raise ValueError(f"TTL {ttl}")
        psn = self.qps.post(index, self.dgid, ttl)
        self._psn_ttl[(index, psn)] = ttl
        self.sent += 1

    def answers(self) -> list[tuple[int, int | None, str]]:
        out: list[tuple[int, int | None, str]] = []
        while True:
            try:
                packet = self.raw.recv(2048)
            except (BlockingIOError, InterruptedError):
                return out
            q = parse_icmp_error(packet)
            if q is None or q.src != self.source or q.dst != self.peer or q.dport != ROCE_V2_PORT:
                continue  # another host's, or not ours
            i = self._by_sport.get(q.sport)
            if i is None:
                continue
            ttl = None
            if len(q.payload) >= BTH.size:
                psn = BTH.unpack_from(q.payload)[4] & 0xFFFFFF
                ttl = self._psn_ttl.get((i, psn))
            out.append((i, ttl, q.router))

    def close(self) -> None:
        self.qps.close()
        self.raw.close()


def probe_raw_permission() -> str | None:
    """None when a raw ICMP socket can be opened; else why not, in words."""
    try:
        raw_icmp_socket().close()
    except PermissionError:
        return "reading the routers' answers to UD probes needs CAP_NET_RAW"
    except OSError as err:
        return f"no raw ICMP socket: {err.strerror}"
    return None


def trace_peer(
    source: str,
    peer: str,
    classes: int,
    config: TraceConfig,
    method: str = "auto",
    sysfs_root: str = "/sys",
) -> TraceResult:
    """Trace PEER from SOURCE over CLASSES ECMP classes: the UD way where it can be had
    (METHOD auto or ud), else the UDP way on the same source ports; the result says
    which way and why."""
    check_addresses(source, peer)
    if method == "udp":
        return trace_udp(source, peer, spread_sports(classes), config, "asked for")
    device, gid_index = device_for_address(source, sysfs_root)
    driver = read_device(sysfs_root, device).driver or "unknown"
    denied = probe_raw_permission()
    if denied is not None:
        if method == "ud":
            raise ProbeError(f"{denied} (run as root, or with --method udp)")
        return _udp_on_qp_ports(source, peer, classes, config, device, gid_index, driver, denied)
    prober = UdProber(device, gid_index, source, peer, classes, driver)
    try:
        traced = run_trace(prober, config, time.monotonic_ns, peer)
        sports = list(prober.sports)
    finally:
        prober.close()
    answers = sum(1 for c in traced for h in c.hops if h.address)
    ud = TraceResult(
        source, peer, "ud", f"UD probes through {device}", traced, prober.sent, answers
    )
    if answers or method == "ud":
        return ud
    # no router answered a UD probe: either none is on the way (one L2 segment) or the
    # driver does not put the hop limit into the TTL; a UDP probe on the same ports tells
    udp = trace_udp(source, peer, sports, config, "")
    if udp.answers:
        udp.why = (
            f"{device}'s UD probes do not honour the hop limit (no router answered one; "
            "the kernel gives an address handle its route's hop limit); UDP probes on the "
            "QPs' source ports"
        )
        return udp
    ud.why += "; no router answered (the peer is on the same segment)"
    return ud


def _udp_on_qp_ports(
    source: str,
    peer: str,
    classes: int,
    config: TraceConfig,
    device: str,
    gid_index: int,
    driver: str,
    why: str,
) -> TraceResult:
    """The UDP way on the source ports the device's own UD QPs get (made and released
    at once: no packet leaves), or spread over the range where QPs cannot be made."""
    try:
        with TraceQps(device, gid_index, classes, driver) as qps:
            sports = list(qps.sports)
        how = f"UDP probes on {device}'s QP ports"
    except ProbeError as err:
        sports = spread_sports(classes)
        how = f"UDP probes on spread ports ({err})"
    return trace_udp(source, peer, sports, config, f"{why}; {how}")
