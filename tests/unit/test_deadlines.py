"""Every client command ends within its --timeout when the peer falls silent, wherever it
does: at connect, at the hello, in the fleet-token handshake, mid-run, at `done`.

These check that one deadline is passed down through a stage's steps (they must not add
up), not how fast anything is: the wall time of an in-process CliRunner call must stay
within --timeout plus SLACK_S, which covers Python's own work (the run's bookkeeping, the
timer calibration, printing) on a loaded 2-core machine. Every peer is on loopback.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from fabricprobe.cli import main
from fabricprobe.report.build import ReportOptions, gather
from fabricprobe.report.sources import HttpAuth, SourceError, fetch_metrics
from tests.support.silent_peers import LOOPBACK, SilentPeer, full_backlog, refusing_port

SLACK_S = 0.75
T = 1.0  # the --timeout the commands get


def timed(*args: str) -> tuple[Result, float]:
    t0 = time.monotonic()
    res = CliRunner().invoke(main, list(args))
    return res, time.monotonic() - t0


def within_deadline(wall: float) -> bool:
    print(f"wall {wall:.2f} s for --timeout {T:g} (slack {SLACK_S} s)")
    return wall <= T + SLACK_S


@pytest.fixture
def token_file(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "fleet.token"
    path.write_text("a-fleet-token-for-the-deadline-tests\n")
    yield str(path)


@pytest.mark.parametrize("mode", [[], ["--bw"]], ids=["rtt", "bw"])
def test_tcp_to_a_listener_that_never_answers(mode: list[str]) -> None:
    with SilentPeer("hang") as peer:
        res, wall = timed("tcp", peer.address, "--timeout", f"{T:g}", *mode)
    assert res.exit_code == 1
    assert f"did not answer the hello within {T:g} s" in res.stderr
    assert within_deadline(wall)


def test_tcp_to_a_refusing_port_fails_at_once() -> None:
    with refusing_port() as address:
        res, wall = timed("tcp", address, "--timeout", "30")
    assert res.exit_code == 1 and "Connection refused" in res.stderr
    assert wall < SLACK_S  # a refusal is an answer: no waiting for the deadline


def test_tcp_to_a_full_listen_backlog() -> None:
    with full_backlog() as address:
        res, wall = timed("tcp", address, "--timeout", f"{T:g}")
    assert res.exit_code == 1
    assert f"did not accept the connection within {T:g} s" in res.stderr
    assert within_deadline(wall)


def test_tcp_fleet_token_handshake_left_unanswered(token_file: str) -> None:
    with SilentPeer("challenge") as peer:
        res, wall = timed("tcp", peer.address, "--timeout", f"{T:g}", "--token-file", token_file)
    assert res.exit_code == 1
    assert f"did not answer the fleet-token answer (auth) within {T:g} s" in res.stderr
    assert within_deadline(wall)


def test_tcp_setup_steps_share_one_deadline(token_file: str) -> None:
    # each step comes 0.6 s late: inside a 1 s per-step timeout, but the whole setup
    # (challenge at 0.6 s, ready at 1.2 s) is past the one deadline
    with SilentPeer("trickle", delay=0.6) as peer:
        res, wall = timed("tcp", peer.address, "--timeout", f"{T:g}", "--token-file", token_file)
    assert res.exit_code == 1 and f"within {T:g} s" in res.stderr, res.stderr
    assert within_deadline(wall)
    assert wall >= 0.9 * T  # it was the deadline that ended it


def test_tcp_peer_silent_mid_run() -> None:
    with SilentPeer("echo_then_silent", echoes=50) as peer:
        res, wall = timed(
            "tcp", peer.address, "--iters", "1000", "--warmup", "0", "--timeout", f"{T:g}",
            "--json",
        )  # fmt: skip
    assert res.exit_code == 1
    assert f"run ended early: peer did not answer within {T:g} s" in res.stderr
    rtt = json.loads(res.stdout)["rtt"]
    assert rtt["count"] == 50 and rtt["lost"] == 950
    assert within_deadline(wall)


def test_tcp_bw_peer_stops_reading_mid_run() -> None:
    with SilentPeer("stop_reading", read_bytes=1 << 20) as peer:
        res, wall = timed("tcp", peer.address, "--bw", "--duration", "60", "--timeout", f"{T:g}")
    assert res.exit_code == 1 and "run ended early" in res.stderr, res.stderr
    assert within_deadline(wall)


def test_tcp_peer_silent_at_done_keeps_the_run() -> None:
    with SilentPeer("no_done") as peer:
        res, wall = timed(
            "tcp", peer.address, "--iters", "100", "--warmup", "0", "--timeout", f"{T:g}",
            "--json",
        )  # fmt: skip
    assert res.exit_code == 0, res.stderr  # the figures were measured; `done` is courtesy
    assert json.loads(res.stdout)["rtt"]["count"] == 100
    assert within_deadline(wall)


def test_why_to_a_collector_that_never_answers() -> None:
    import grpc  # type: ignore[import-untyped]  # noqa: F401  # imported before the clock

    with SilentPeer("hang") as peer:
        res, wall = timed("why", "--insecure", "--collector", peer.address, "--timeout", f"{T:g}")
    assert res.exit_code == 1 and "DEADLINE_EXCEEDED" in res.stderr, res.stderr
    assert within_deadline(wall)


def test_why_to_a_refusing_port_fails_at_once() -> None:
    import grpc  # noqa: F401

    with refusing_port() as address:
        res, wall = timed("why", "--insecure", "--collector", address, "--timeout", "30")
    assert res.exit_code == 1 and "UNAVAILABLE" in res.stderr, res.stderr
    assert wall < 2 * SLACK_S


class _Trickle(http.server.BaseHTTPRequestHandler):
    """/metrics answers at once; /slow sends its body one byte per 0.2 s."""

    def do_GET(self) -> None:
        body = b"fabricprobe_host_up 1\n" if self.path == "/metrics" else b"x" * 100
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path == "/metrics":
            self.wfile.write(body)
            return
        for i in range(len(body)):
            try:
                self.wfile.write(body[i : i + 1])
                self.wfile.flush()
            except OSError:  # the client gave up, as it should
                return
            time.sleep(0.2)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_peer() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), _Trickle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://{LOOPBACK}:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_report_source_that_trickles_its_answer(http_peer: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(SourceError, match=f"no complete answer within {T:g} s"):
        fetch_metrics(f"{http_peer}/slow", HttpAuth(), timeout=T)
    assert within_deadline(time.monotonic() - t0)


def test_report_sources_share_one_deadline(http_peer: str, tmp_path: Path) -> None:
    import grpc

    from fabricprobe.cli.commands.why import query
    from fabricprobe.cli.options import CollectorCredentials

    with SilentPeer("hang") as collector, SilentPeer("hang") as prometheus:

        def why_query(slowest: int, window: float, timeout: float) -> dict[str, Any]:
            creds = CollectorCredentials(insecure=True)
            try:
                return query(collector.address, slowest, window, "e2e_s", timeout, creds)
            except grpc.RpcError as e:
                raise SourceError(f"collector: {e.code().name}") from None

        opts = ReportOptions(
            collector=collector.address,
            metrics_url=f"{http_peer}/metrics",
            out_dir=tmp_path,
            auth=HttpAuth(),
            prometheus=f"http://{prometheus.address}",
            timeout=T,
        )
        t0 = time.monotonic()
        got = gather(opts, why_query)  # the Why query and Prometheus are both silent
        wall = time.monotonic() - t0
    assert got.metrics_text == "fabricprobe_host_up 1\n"
    assert "DEADLINE_EXCEEDED" in got.why_error
    assert "no time left" in got.prom_error or "no complete answer" in got.prom_error
    assert within_deadline(wall)


def test_validate_live_check_to_a_silent_peer() -> None:
    from tests.unit.test_validate_cli import fixture_args

    args = [*fixture_args("mlx5", "mlx5"), "--window", "0", "--json"]
    _, checks = timed("validate", *args)  # the local checks alone: not the peer's to wait
    with SilentPeer("hang") as peer:
        res, wall = timed(
            "validate", *args, "--peer", peer.address, "--bind", LOOPBACK, "--timeout", f"{T:g}"
        )
    assert res.exit_code == 1, res.output  # the live check FAILs
    live = next(r for r in json.loads(res.stdout)["results"] if r["check"] == "live")
    assert live["status"] == "FAIL"
    text = json.dumps(live)
    assert f"did not answer the hello within {T:g} s" in text and "not tried" in text, text
    assert within_deadline(wall - checks)  # TCP found it silent; RDMA did not wait again
