"""What the commands share: the daemons' command shape (fabricprobe.cli.daemon) and the
way a client command asks the collector (fabricprobe.cli.options)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import grpc
import pytest
from click.testing import CliRunner

from fabricprobe.cli.daemon import daemon_command
from fabricprobe.cli.options import (
    CollectorCredentials,
    ask_collector,
    collector_address,
    collector_option,
)
from fabricprobe.core.errors import ConfigError
from fabricprobe.core.settings import setting


@dataclass
class Toy:
    """A settings class of one daemon, in the [serve] table."""

    max_sessions: int = setting(4, "Sessions at once.", lo=1, hi=64)


def toy_command(prepare: Any = None) -> tuple[click.Command, list[Any]]:
    got: list[Any] = []

    @daemon_command(Toy, "serve", "\b\nExamples:\n  toy --max-sessions 2", "max_sessions", prepare)
    def toy(cfg: Any, log_level: str) -> None:
        """Run the toy."""
        got.append((cfg, log_level))

    return toy, got


@pytest.fixture(autouse=True)
def _no_settings_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("FABRICPROBE_"):
            monkeypatch.delenv(name)


def test_a_daemon_gets_its_settings_and_log_level() -> None:
    cmd, got = toy_command()
    res = CliRunner().invoke(cmd, ["--max-sessions", "2", "--log-level", "warning"])
    assert res.exit_code == 0, res.output
    assert got == [(Toy(max_sessions=2), "warning")]
    assert cmd.name == "toy" and cmd.help == "Run the toy."


def test_a_daemon_reads_its_table_of_the_config_file(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text("[serve]\nmax_sessions = 9\n")
    cmd, got = toy_command()
    res = CliRunner().invoke(cmd, ["--config", str(f)])
    assert res.exit_code == 0, res.output
    assert got[0][0].max_sessions == 9


def test_a_daemon_help_says_where_settings_come_from() -> None:
    cmd, _ = toy_command()
    out = CliRunner().invoke(cmd, ["--help"]).output
    for text in ("--max-sessions", "--config", "--log-format", "--log-level", "Examples:"):
        assert text in out
    assert "FABRICPROBE_SERVE_MAX_SESSIONS is max_sessions" in " ".join(out.split())


def test_a_bad_setting_or_a_failed_preparation_exits_2_in_one_line() -> None:
    cmd, got = toy_command()
    res = CliRunner().invoke(cmd, ["--max-sessions", "0"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert "max_sessions" in res.output or "--max-sessions" in res.output

    def refuse(cfg: Toy) -> Toy:
        raise ConfigError("not today")

    cmd, got = toy_command(refuse)
    res = CliRunner().invoke(cmd, [])
    assert (res.exit_code, res.output.strip(), got) == (2, "probe: error: not today", [])


def test_a_daemon_gets_what_its_preparation_made() -> None:
    cmd, got = toy_command(lambda cfg: ("ready", cfg.max_sessions))
    assert CliRunner().invoke(cmd, []).exit_code == 0
    assert got == [(("ready", 4), "info")]


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("10.0.0.9", "10.0.0.9:4794"),
        ("10.0.0.9:5000", "10.0.0.9:5000"),
        ("[::1]", "[::1]:4794"),
        ("collector.example:4795", "collector.example:4795"),
    ],
)
def test_collector_address(given: str, address: str) -> None:
    assert collector_address(given) == address


def test_collector_address_refuses_a_bad_one() -> None:
    with pytest.raises(ValueError):
        collector_address("a:b:c:[")


class Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "said no"


def _ask(call: Any, **kw: Any) -> click.testing.Result:
    @click.command()
    @collector_option()
    def asker(collector: str) -> None:
        click.echo(ask_collector(collector, call, **kw))

    return CliRunner().invoke(asker, [])


def test_ask_collector_passes_the_answer() -> None:
    res = _ask(lambda: "42")
    assert (res.exit_code, res.output) == (0, "42\n")


def test_ask_collector_turns_errors_into_exit_codes() -> None:
    def bad_address() -> None:
        raise ValueError("bad address 'x'")

    def refused(code: grpc.StatusCode) -> Any:
        def call() -> None:
            raise Refused(code)

        return call

    res = _ask(bad_address)
    assert (res.exit_code, res.output.strip()) == (2, "probe: error: bad address 'x'")
    res = _ask(refused(grpc.StatusCode.UNAVAILABLE))
    assert res.exit_code == 1
    assert res.output.strip() == "probe: error: collector 127.0.0.1:4794: UNAVAILABLE: said no"
    res = _ask(refused(grpc.StatusCode.INVALID_ARGUMENT))
    assert res.exit_code == 1
    res = _ask(refused(grpc.StatusCode.INVALID_ARGUMENT), usage=("INVALID_ARGUMENT",))
    assert res.exit_code == 2


def test_a_call_to_no_collector_raises_rpc_error() -> None:
    from fabricprobe.core.api import fabricprobe_pb2 as pb

    creds = CollectorCredentials(insecure=True)
    with pytest.raises(grpc.RpcError) as err:
        creds.call("127.0.0.1:1", "Why", pb.WhyRequest(slowest=1), timeout=2.0)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    with pytest.raises(ValueError):
        creds.call("a:b:c:[", "Why", pb.WhyRequest(slowest=1), timeout=2.0)


def test_lat_and_bw_get_their_peer_as_one_object(tmp_path: Path) -> None:
    from fabricprobe.cli.commands.rdma import RdmaPeer, rdma_peer_options
    from fabricprobe.cli.options import port_option

    got: list[Any] = []

    @click.command()
    @click.argument("peer")
    @port_option
    @click.option("--iters", type=int, default=3)
    @rdma_peer_options
    def probe(to: RdmaPeer, iters: int, with_tcp: bool, as_json: bool) -> None:
        got.append((to, iters, with_tcp, as_json))

    token = tmp_path / "token"
    token.write_text("a" * 64 + "\n")
    args = ["10.0.0.2:5000", "--iters", "7", "--bind", "10.0.0.1", "--device", "rxe0"]
    args += ["--engine", "pyverbs", "--timeout", "3", "--token-file", str(token), "--tcp"]
    res = CliRunner().invoke(probe, [*args, "--json", "--sysfs", str(tmp_path)])
    assert res.exit_code == 0, res.output
    to, iters, with_tcp, as_json = got[0]
    assert (iters, with_tcp, as_json) == (7, True, True)
    assert (to.host, to.port, to.bind, to.device, to.engine) == (
        "10.0.0.2",
        5000,
        "10.0.0.1",
        "rxe0",
        "pyverbs",
    )
    assert to.token is not None and to.sysfs_root == str(tmp_path)
    link = to.link(0.5)
    assert (link.peer, link.port, link.timeout, link.step_s, link.device) == (
        "10.0.0.2",
        5000,
        3.0,
        0.5,
        "rxe0",
    )
    assert (link.engine, link.sysfs_root, link.token) == ("pyverbs", str(tmp_path), to.token)
    tcp = to.tcp_link()  # the TCP run beside: no device or engine of RDMA's
    assert (tcp.peer, tcp.port, tcp.bind, tcp.timeout, tcp.step_s) == (
        "10.0.0.2",
        5000,
        "10.0.0.1",
        3.0,
        3.0,
    )
    assert (tcp.device, tcp.engine, tcp.token) == (None, "auto", to.token)
