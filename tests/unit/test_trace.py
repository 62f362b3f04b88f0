"""probe trace's parts off the lane: the ICMP quote parser on packets built as a Linux
router builds them, the drivers' source-port rules on QP numbers measured in the lane,
the TTL walk over a scripted fabric, and the UDP way's real sockets on loopback."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Sequence

import pytest
from click.testing import CliRunner

from fabricprobe.cli import main
from fabricprobe.probes import sport, trace


def ipv4(src: str, dst: str, proto: int, payload: bytes, ttl: int = 64) -> bytes:
    total = 20 + len(payload)
    head = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        total,
        1,
        0,
        ttl,
        proto,
        0,
        socket.inet_aton(src),
        socket.inet_aton(dst),
    )
    return head + payload


def time_exceeded(router: str, src: str, dst: str, sport_: int, quote_payload: bytes) -> bytes:
    """An ICMP time-exceeded from ROUTER quoting a RoCE probe SRC:SPORT -> DST:4791."""
    udp = struct.pack("!HHHH", sport_, 4791, 8 + len(quote_payload), 0) + quote_payload
    quoted = ipv4(src, dst, socket.IPPROTO_UDP, udp, ttl=1)
    icmp = struct.pack("!BBHI", 11, 0, 0, 0) + quoted
    return ipv4(router, src, socket.IPPROTO_ICMP, icmp)


def test_a_quote_names_the_router_and_the_probes_ports() -> None:
    bth = struct.pack("!BBHII", 0x64, 0, 0xFFFF, 0xFFFFFE, 7)
    q = trace.parse_icmp_error(time_exceeded("203.0.113.3", "192.0.2.1", "192.0.2.3", 57236, bth))
    assert q is not None
    assert (q.router, q.icmp_type, q.src, q.dst, q.sport, q.dport) == (
        "203.0.113.3",
        11,
        "192.0.2.1",
        "192.0.2.3",
        57236,
        4791,
    )
    assert q.payload == bth


def test_a_quote_of_eight_bytes_still_gives_the_ports() -> None:
    q = trace.parse_icmp_error(time_exceeded("203.0.113.3", "192.0.2.1", "192.0.2.3", 50000, b""))
    assert q is not None and q.sport == 50000 and q.payload == b""


@pytest.mark.parametrize(
    "packet",
    [
        b"",
        b"\x45" * 19,
        ipv4("203.0.113.1", "192.0.2.1", socket.IPPROTO_UDP, b"\x00" * 16),  # not ICMP
        ipv4("203.0.113.1", "192.0.2.1", socket.IPPROTO_ICMP, b"\x08\x00" + b"\x00" * 30),  # echo
        time_exceeded("203.0.113.1", "192.0.2.1", "192.0.2.3", 50000, b"")[:40],  # cut quote
    ],
)
def test_anything_else_is_not_a_quote(packet: bytes) -> None:
    assert trace.parse_icmp_error(packet) is None


# QP numbers and the source ports rxe gave them, read from the routers' answers in the
# lane (tests/fabric runs the same check live).
RXE_MEASURED = {17: 57236, 18: 63494, 19: 53368, 20: 59626}


def test_rxe_ports_are_the_ones_measured() -> None:
    for qpn, port in RXE_MEASURED.items():
        assert sport.rxe_qp_sport(qpn) == port
        assert sport.source_port("rdma_rxe", qpn) == port


def test_connected_ports_fold_the_flow_label() -> None:
    assert sport.flow_label_sport(0) == 0xC000
    assert sport.flow_label_sport(0xFFFFF) == 0xC000 | (0x3FFF ^ 0x3F)
    label = sport.flow_label(0x11, 0x22)
    assert label == 0x11 * 0x22  # small products fold to themselves
    assert sport.connected_sport(0x11, 0x22) == sport.flow_label_sport(label)
    assert sport.connected_sport(0x11, 0x22, label=0x5) == 0xC005
    for q in range(1, 5000, 7):
        assert 0xC000 <= sport.connected_sport(q, q + 1) <= 0xFFFF
        assert 0xC000 <= sport.rxe_qp_sport(q) <= 0xFFFF
    assert sport.source_port("mlx5_core", 5, 9) == sport.connected_sport(5, 9)
    assert sport.source_port("mlx5_core", 5) is None  # UD: from the AH's flow label
    assert sport.source_port("bnxt_re", 5, 9) is None


class Scripted:
    """A fabric in a table: class i's probe with TTL t is answered by ROUTES[i][t-1], or
    by nobody past the table or where it holds None. An answer is a byte down a real
    socket pair, so run_trace's select() waits on something real."""

    def __init__(self, routes: Sequence[Sequence[str | None]]) -> None:
        self._sports = [0xC100 + i for i in range(len(routes))]
        self.routes = routes
        self.r, self.w = socket.socketpair()
        self.r.setblocking(False)
        self.ready: list[tuple[int, int | None, str]] = []
        self.sent: list[tuple[int, int]] = []

    @property
    def sports(self) -> Sequence[int]:
        return self._sports

    def fileno(self) -> int:
        return self.r.fileno()

    def send(self, index: int, ttl: int) -> None:
        self.sent.append((index, ttl))
        row = self.routes[index]
        if ttl <= len(row) and (hop := row[ttl - 1]) is not None:
            self.ready.append((index, ttl, hop))
            self.w.send(b"x")

    def answers(self) -> list[tuple[int, int | None, str]]:
        with contextlib.suppress(BlockingIOError):
            while self.r.recv(64):
                pass
        got, self.ready = self.ready, []
        return got

    def close(self) -> None:
        self.r.close()
        self.w.close()


def test_the_walk_follows_each_class_and_ends_on_silence() -> None:
    s = Scripted([["a", "s0", "b"], ["a", "s1", "b"], ["a", None, "b"], ["a"]])
    got = trace.run_trace(
        s, trace.TraceConfig(max_hops=8, timeout_s=0.05, gap_s=0), time.monotonic_ns, "peer"
    )
    s.close()
    assert [c.addresses() for c in got] == [
        ["a", "s0", "b"],
        ["a", "s1", "b"],
        ["a", None, "b"],
        ["a"],
    ]
    assert all(c.complete for c in got)
    assert all(h.rtt_s is not None and h.rtt_s > 0 for c in got for h in c.hops if h.address)
    # each class went to TTL len+2 and no further: two silent TTLs end it
    assert max(t for i, t in s.sent if i == 0) == 5


def test_the_hop_limit_ends_a_class_that_never_goes_silent() -> None:
    s = Scripted([["r"] * 10])
    got = trace.run_trace(
        s, trace.TraceConfig(max_hops=4, timeout_s=0.05, gap_s=0), time.monotonic_ns, "peer"
    )
    s.close()
    assert got[0].addresses() == ["r"] * 4 and not got[0].complete


def test_the_peer_answering_ends_the_class_without_a_hop() -> None:
    s = Scripted([["a", "peer"]])
    got = trace.run_trace(s, trace.TraceConfig(timeout_s=0.05, gap_s=0), time.monotonic_ns, "peer")
    s.close()
    assert got[0].addresses() == ["a"] and got[0].complete


def test_the_udp_way_on_loopback_reads_the_kernels_answer() -> None:
    """Real sockets: nothing listens on 127.0.0.1:4791, so the kernel answers each probe
    with a port unreachable from the peer itself; the classes end at once with no
    routed hop, and the answer came through each socket's error queue."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("127.0.0.1", 4791))
        except OSError:
            pytest.fail("something on this machine listens on UDP 4791")
    got = trace.trace_udp(
        "127.0.0.1",
        "127.0.0.1",
        trace.spread_sports(3),
        trace.TraceConfig(timeout_s=0.5, gap_s=0),
        "asked for",
    )
    assert [c.hops for c in got.classes] == [[], [], []]
    assert all(c.complete for c in got.classes)
    assert got.probes_sent == 3
    doc = got.to_json()
    assert doc["method"] == "udp" and doc["dport"] == 4791
    assert [c["sport"] for c in doc["classes"]] == trace.spread_sports(3)


def test_spread_ports_are_distinct_roce_ports() -> None:
    for n in (1, 2, 16, trace.MAX_CLASSES):
        ports = trace.spread_sports(n)
        assert len(set(ports)) == n and all(0xC000 <= p <= 0xFFFF for p in ports)
    with pytest.raises(ValueError):
        trace.spread_sports(0)


def test_config_bounds() -> None:
    for bad in ({"max_hops": 0}, {"max_hops": 33}, {"timeout_s": 0}, {"quiet": 0}):
        with pytest.raises(ValueError):
            trace.TraceConfig(**bad)  # type: ignore[arg-type]


def test_cli_udp_on_loopback_and_bad_arguments() -> None:
    r = CliRunner().invoke(
        main, ["trace", "127.0.0.1", "--bind", "127.0.0.1", "--method", "udp", "--sports", "2"]
    )
    assert r.exit_code == 0, r.output
    assert "udp probes (asked for)" in r.output and r.output.count("no routed hop") == 2
    bad = CliRunner().invoke(main, ["trace", "not-an-address", "--method", "udp"])
    assert bad.exit_code == 2 and "not an IPv4 address" in bad.output
    many = CliRunner().invoke(main, ["trace", "127.0.0.1", "--sports", "65"])
    assert many.exit_code == 2
