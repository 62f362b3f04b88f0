"""`probe tcp` and `probe serve`: exit codes, --json, and one real run on loopback."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fabricprobe.cli import main
from fabricprobe.probes import tcp
from fabricprobe.probes.responder import Responder
from tests.unit.test_tcp_probe import LOOPBACK, start_serve


@pytest.fixture(scope="module")
def peer() -> Iterator[str]:
    with Responder(LOOPBACK, 0, idle_timeout=5, grace=0.2, sessions=tcp.SESSIONS, auth=None) as r:
        yield f"{LOOPBACK}:{r.address[1]}"


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_rtt_json(peer: str) -> None:
    code, out, _ = run("tcp", peer, "--iters", "200", "--size", "1K", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["transport"] == "tcp" and doc["op"] == "pingpong" and doc["size"] == 1024
    assert doc["rtt"]["kind"] == "rtt" and doc["rtt"]["count"] == 200 and doc["rtt"]["lost"] == 0
    assert doc["one_way"]["kind"] == "one_way" and doc["one_way"]["derived_from"] == "rtt/2"
    assert doc["timer_overhead_ns"] > 0 and doc["error"] is None


def test_rtt_table_names_rtt_and_one_way(peer: str) -> None:
    code, out, _ = run("tcp", peer, "--iters", "100")
    assert code == 0
    assert "RTT (µs)" in out and "one-way = RTT/2 (µs)" in out
    assert "p99.9" in out and "lost 0" in out and "timer overhead" in out


def test_bw_json_and_table(peer: str) -> None:
    code, out, _ = run("tcp", peer, "--bw", "--duration", "0.2", "--streams", "2", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["op"] == "stream" and doc["bytes"] > 0 and doc["bytes_per_second"] > 0
    code, out, _ = run("tcp", peer, "--bw", "--bytes", "1M")
    assert code == 0 and "1,048,576" in out and "Gbit/s" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--size", "2M"], "over the ping-pong limit"),
        (["--size", "0"], "outside 1.."),
        (["--size", "lots"], "not a size"),
        (["--iters", "0"], "--iters"),
        (["--duration", "1"], "--duration needs --bw"),
        (["--streams", "2"], "--streams needs --bw"),
        (["--bw", "--iters", "5"], "not --bw"),
        (["--bw", "--duration", "1", "--bytes", "1K"], "not both"),
        (["--bind", "not-an-ip"], "not an IP address"),
        (["--port", "5000"], "port given twice"),
        (["--timeout", "0"], "--timeout"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(peer: str, args: list[str], needle: str) -> None:
    code, out, err = run("tcp", peer, *args)
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and err.startswith("probe: error: ")
    assert needle in err


@pytest.mark.parametrize("bad_peer", ["a b", "host:", "host:99999", "[::1", "1:2:3"])
def test_bad_peer_format_exits_2(bad_peer: str) -> None:
    code, _, err = run("tcp", bad_peer)
    assert code == 2 and err.startswith("probe: error: ") and err.count("\n") == 1


def test_unreachable_peer_exits_1() -> None:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]
    code, out, err = run("tcp", f"{LOOPBACK}:{port}", "--json")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "cannot connect" in err


def test_serve_bad_listen_exits_2() -> None:
    code, _, err = run("serve", "--listen", "nowhere:abc")
    assert code == 2 and "--listen" in err and err.count("\n") == 1
    code, _, err = run("serve", "--max-sessions", "0")
    assert code == 2 and err.count("\n") == 1


def test_serve_settings_come_from_the_file_the_environment_and_flags(tmp_path: Path) -> None:
    from fabricprobe.cli.commands.serve import ServeConfig
    from fabricprobe.core import settings

    conf = tmp_path / "serve.toml"
    conf.write_text("[serve]\nmax_sessions = 4\nidle_timeout_s = 5\n")
    env = {"FABRICPROBE_SERVE_MAX_SESSIONS": "6", "FABRICPROBE_SERVE_INSECURE": "yes"}
    cfg = settings.load(ServeConfig, "serve", file=conf, env=env, flags={"max_memory_mib": 8})
    assert (cfg.max_sessions, cfg.idle_timeout_s, cfg.insecure) == (6, 5.0, True)
    assert cfg.max_memory_mib == 8 and cfg.listen == "0.0.0.0:4793" and cfg.token_file == ""
    assert cfg.spin_us == -1  # the compiled loops' own busy-poll, unless told
    cfg = settings.load(ServeConfig, "serve", file=None, env={}, flags={"spin_us": 0})
    assert cfg.spin_us == 0
    code, _, err = run("serve", "--spin-us", "2000000", "--insecure")
    assert code == 2 and "spin" in err
    conf.write_text('[serve]\nlisten = "127.0.0.1:0"\nmax_sessions = 0\n')
    code, _, err = run("serve", "--config", str(conf), "--insecure")
    assert code == 2 and "serve.toml:3" in err and "max_sessions" in err
    assert err.count("\n") == 1


def test_serve_and_tcp_as_processes(tmp_path: Path) -> None:
    """The real thing: `probe serve` in one process, `probe tcp` in another, SIGTERM ends it."""
    proc, port, log = start_serve(tmp_path, "--idle-timeout", "5")
    try:
        argv = ["tcp", f"{LOOPBACK}:{port}", "--iters", "300", "--json"]
        out = subprocess.run(
            [sys.executable, "-m", "fabricprobe", *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["rtt"]["count"] == 300
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert "session tcp_lat from 127.0.0.1:" in text and ": ok in " in text
    assert "stopped after 1 sessions" in text


def test_help_smoke() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fabricprobe", "tcp", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "RTT/2" in out.stdout


def test_serve_needs_a_token_or_explicit_insecure(tmp_path: Path) -> None:
    code, _, err = run("serve", "--listen", f"{LOOPBACK}:0")
    assert code == 2 and "--token-file" in err and "--insecure" in err
    short = tmp_path / "short"
    short.write_text("abc\n")
    code, _, err = run("serve", "--listen", f"{LOOPBACK}:0", "--token-file", str(short))
    assert code == 2 and "at least 16 characters" in err


def test_probing_a_fleet_responder_takes_its_token(tmp_path: Path) -> None:
    from fabricprobe.probes.fleet import FleetToken

    token = tmp_path / "probe-token"
    token.write_text("a-probe-token-for-this-test\n")
    auth = FleetToken.from_file(token)
    with Responder(LOOPBACK, 0, grace=0.2, sessions=tcp.SESSIONS, auth=auth) as r:
        there = f"{LOOPBACK}:{r.address[1]}"
        code, _, err = run("tcp", there, "--iters", "10")
        assert code == 1 and "fleet token" in err
        code, out, _ = run("tcp", there, "--iters", "10", "--token-file", str(token), "--json")
        assert code == 0 and json.loads(out)["rtt"]["count"] == 10
