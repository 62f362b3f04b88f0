"""Hypothesis fuzz for the ICMP quote parser and the UDP way's error-queue reader: any
bytes give a Quote or None, never an exception; a real quote survives any tail."""

from __future__ import annotations

import socket
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricprobe.probes import trace
from tests.conftest import FuzzCounter
from tests.unit.test_trace import time_exceeded

FUZZ = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


@FUZZ
@given(st.lists(st.binary(max_size=120), min_size=16, max_size=16))
def test_any_bytes(fuzz_inputs: FuzzCounter, batch: list[bytes]) -> None:
    for b in batch:
        fuzz_inputs.tried("trace.parse_icmp_error")
        q = trace.parse_icmp_error(b)
        assert q is None or isinstance(q, trace.Quote)


@FUZZ
@given(st.integers(0, 0xFFFF), st.binary(max_size=64), st.integers(0, 80), st.binary(max_size=8))
def test_real_quotes_mutated(sport: int, payload: bytes, cut: int, junk: bytes) -> None:
    pkt = time_exceeded("203.0.113.9", "192.0.2.1", "192.0.2.3", sport, payload)
    q = trace.parse_icmp_error(pkt)
    assert q is not None and q.sport == sport and q.payload == payload
    assert trace.parse_icmp_error(pkt[:cut] + junk) is None or cut + len(junk) >= 56
    flipped = bytearray(pkt)
    flipped[cut % len(pkt)] ^= 0xFF
    trace.parse_icmp_error(bytes(flipped))


@FUZZ
@given(
    st.binary(max_size=40),
    st.lists(
        st.tuples(
            st.sampled_from([0, socket.IPPROTO_IP]), st.integers(0, 20), st.binary(max_size=40)
        ),
        max_size=3,
    ),
)
def test_error_queue_messages(data: bytes, anc: list[tuple[int, int, bytes]]) -> None:
    got = trace._errqueue_answer(data, anc)
    assert got is None or isinstance(got[1], str)
    trace.payload_ttl(data)


def test_a_real_error_queue_message() -> None:
    err = struct.pack("=IBBBBII", 113, 2, 11, 0, 0, 0, 0)
    offender = struct.pack("!HH4s8x", socket.AF_INET, 0, socket.inet_aton("203.0.113.5"))
    data = trace.PAYLOAD.pack(trace.MAGIC, 3, 0, 1)
    assert trace._errqueue_answer(
        data, [(socket.IPPROTO_IP, trace.IP_RECVERR, err + offender)]
    ) == (3, "203.0.113.5")
    local = struct.pack("=IBBBBII", 90, 1, 0, 0, 0, 0, 0)  # SO_EE_ORIGIN_LOCAL: not an answer
    assert (
        trace._errqueue_answer(data, [(socket.IPPROTO_IP, trace.IP_RECVERR, local + offender)])
        is None
    )
