"""The agent's collector client holds its gRPC channel only while it talks: it opens at
the first call, `release()` closes it, the next call opens a new one; an agent releases
it once a window is sent (an open channel keeps gRPC's threads waking)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.client import CollectorClient
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from tests.support.fleet import loopback_agent_config


@pytest.fixture
def server() -> Iterator[CollectorServer]:
    s = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0", metrics_listen="", api=ApiConfig(trust_local_registration=True)
        )
    )
    s.start()
    yield s
    s.stop(0)


def test_the_channel_opens_on_use_and_closes_on_release(server: CollectorServer) -> None:
    c = CollectorClient(f"127.0.0.1:{server.port}", timeout=5)
    assert not c.connected and c.opened == 0
    assert c.register(pb.HostInfo(host="h1")).report_interval_ms
    assert c.connected and c.opened == 1
    c.register(pb.HostInfo(host="h1"))
    assert c.opened == 1  # kept while in use
    c.release()
    c.release()  # twice is fine
    assert not c.connected
    assert c.assignments("h1", 0) is not None
    assert c.connected and c.opened == 2
    c.close()
    assert not c.connected


def test_an_agent_lets_the_channel_go_between_windows(
    server: CollectorServer, tmp_path: Path
) -> None:
    cfg = loopback_agent_config(tmp_path, "127.0.0.31", server.port)
    agent = Agent(cfg)
    agent.start()
    try:
        deadline = time.monotonic() + 20
        while agent.sender.acked < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.sender.acked >= 2, "the agent's windows did not reach the collector"
        # each sent window ends with the channel released; the next opens a new one
        assert agent.sender.client.opened >= 2
        deadline = time.monotonic() + 5
        while agent.sender.client.connected and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not agent.sender.client.connected
    finally:
        agent.close(flush_timeout=0.5)
