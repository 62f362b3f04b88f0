"""Fuzzing the probe control protocol's parsers: whatever a peer sends, they return a
value or raise the module's own errors (ProtocolError / PeerError / ValueError), never
anything else."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricprobe.core.errors import PeerError
from fabricprobe.core.hostport import parse_hostport
from fabricprobe.probes.control import (
    MAX_MESSAGE_BYTES,
    Channel,
    ProtocolError,
    RdmaEndpoint,
    decode_payload,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=8,
)
ENDPOINT_KEYS = ("qpn", "psn", "gid", "gid_index", "lid", "rkey", "addr", "mtu")


@FUZZ
@given(st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_decode_payload_takes_any_bytes(data: bytes) -> None:
    try:
        msg = decode_payload(data)
    except ProtocolError:
        return
    assert isinstance(msg.kind, str) and isinstance(msg.body, dict)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(ENDPOINT_KEYS),
        st.integers(-2, 1 << 65) | st.text(max_size=45) | st.none() | st.floats() | st.booleans(),
    )
)
def test_an_endpoint_from_any_object(obj: dict[str, Any]) -> None:
    try:
        ep = RdmaEndpoint.from_dict(obj)
    except ProtocolError:
        return
    assert 1 <= ep.qpn < 1 << 24 and ep.mtu in (256, 512, 1024, 2048, 4096)


@FUZZ
@given(st.text(max_size=60))
def test_parse_hostport_takes_any_text(text: str) -> None:
    try:
        host, port = parse_hostport(text)
    except ValueError:
        return
    assert host and 1 <= port <= 65535


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 1 << 32).map(lambda n: struct.pack("!I", n % (1 << 32)))
    | st.just(struct.pack("!I", 12)),
    st.binary(max_size=80),
)
def test_a_channel_reads_any_stream(header: bytes, body: bytes) -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(header + body)
        a.shutdown(socket.SHUT_WR)
        try:
            msg = Channel(b, 0.5).recv()
        except PeerError:
            return
        (length,) = struct.unpack("!I", header)
        assert 0 < length <= MAX_MESSAGE_BYTES and isinstance(msg.body, dict)
