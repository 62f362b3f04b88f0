"""One collector per port: a second one on the same port fails with a clear message."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from fabricprobe.cli import main
from fabricprobe.collector.service import CollectorServer, ServerConfig


def test_a_second_collector_on_the_same_port_fails() -> None:
    first = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"))
    first.start()
    try:
        second = CollectorServer(ServerConfig(listen=f"127.0.0.1:{first.port}", metrics_listen=""))
        with pytest.raises(OSError, match="in use"):
            second.start()
        third = CollectorServer(  # the API port free, the /metrics port taken
            ServerConfig(listen="127.0.0.1:0", metrics_listen=f"127.0.0.1:{first.metrics_port}")
        )
        with pytest.raises(OSError, match="/metrics"):
            third.start()
    finally:
        first.stop(0)
    again = CollectorServer(ServerConfig(listen=f"127.0.0.1:{first.port}", metrics_listen=""))
    again.start()  # the port is free again once the first collector stopped
    again.stop(0)


def test_probe_collector_says_the_port_is_taken() -> None:
    first = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen=""))
    first.start()
    args = ["collector", "--insecure", "--listen", f"127.0.0.1:{first.port}",
            "--metrics-listen", "127.0.0.1:0", "--log-level", "error"]  # fmt: skip
    try:
        out = CliRunner().invoke(main, args)
    finally:
        first.stop(0)
    assert out.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{first.port}" in out.output
    assert "in use" in out.output
