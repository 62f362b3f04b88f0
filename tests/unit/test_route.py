"""Routing each request's decode host: in turn, or by the fabric's price."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fabricprobe.core.models import PRESETS
from fabricprobe.probes.responder import Responder
from fabricprobe.workload.pipeline import Host, WorkloadConfig, run_pipeline
from fabricprobe.workload.price import KvCost
from fabricprobe.workload.route import FabricRouter, RoundRobin
from tests.support.fleet import open_responder

A, B, C, D = (Host(n, "127.0.0.1") for n in "abcd")


def priced(table: dict[str, tuple[float, float] | None]):
    """A price function: dst -> (p50, p99) seconds, None for unknown; it counts calls."""
    calls: list[tuple[str, str, int]] = []

    def price(src: str, dst: str, nbytes: int) -> KvCost:
        calls.append((src, dst, nbytes))
        got = table.get(dst)
        if got is None:
            return KvCost(src, dst, nbytes, known=False, reason=f"no RTT probes to {dst}")
        return KvCost(src, dst, nbytes, known=True, p50_s=got[0], p99_s=got[1])

    price.calls = calls  # type: ignore[attr-defined]
    return price


def test_round_robin_takes_each_prefill_hosts_candidates_in_turn() -> None:
    rr = RoundRobin()
    got = [rr.choose(A, [B, C, D], 1).index for _ in range(5)]
    assert got == [0, 1, 2, 0, 1]
    assert rr.choose(B, [C, D], 1).index == 0  # its own turn
    with pytest.raises(ValueError):
        rr.choose(A, [], 1)


def test_fabric_router_takes_the_lowest_p99_then_p50_and_passes_over_unknowns() -> None:
    price = priced({"b": (0.001, 0.009), "c": (0.002, 0.003), "d": None})
    r = FabricRouter(price)
    ch = r.choose(A, [B, C, D], 4096)
    assert ch.index == 1 and ch.reason == "fabric p99 3.000 ms"
    assert price.calls == [("a", "b", 4096), ("a", "c", 4096), ("a", "d", 4096)]
    tie = FabricRouter(priced({"b": (0.002, 0.003), "c": (0.001, 0.003)}))
    assert tie.choose(A, [B, C], 1).index == 1
    assert r.priced == 1 and r.unpriced == 0


def test_fabric_router_goes_in_turn_when_no_price_is_known_and_says_why() -> None:
    r = FabricRouter(priced({}))
    got = [r.choose(A, [B, C], 1) for _ in range(3)]
    assert [c.index for c in got] == [0, 1, 0]
    assert got[0].reason == "round-robin (no price: no RTT probes to b)"
    assert r.unpriced == 3 and r.priced == 0


@pytest.fixture
def responder() -> Iterator[Responder]:
    with open_responder() as r:
        yield r


def test_pipeline_sends_each_request_where_the_router_says(responder: Responder) -> None:
    cfg = WorkloadConfig(
        model=PRESETS["Mistral-7B"],
        prompt_tokens=16,
        output_tokens=1,
        decode_step_s=0.0,
        requests=4,
        transport="tcp",
        port=responder.port,
    )
    price = priced({"b": (0.004, 0.008), "c": (0.001, 0.002)})
    results = run_pipeline([(A, B), (A, C)], cfg, router=FabricRouter(price))
    assert len(results) == 4 and all(r.error is None for r in results)
    assert {r.dst.name for r in results} == {"c"}
    assert all(r.route == "fabric p99 2.000 ms" for r in results)
    # the price was asked for each request's own KV bytes
    asked = sorted(n for _, dst, n in price.calls if dst == "c")
    assert asked == sorted(r.kv_bytes for r in results)
    rr = run_pipeline([(A, B), (A, C)], cfg, router=RoundRobin())
    assert sorted(r.dst.name for r in rr) == ["b", "b", "c", "c"]


def test_cli_route_fabric_asks_the_collector_and_goes_in_turn_without_prices() -> None:
    import json

    from click.testing import CliRunner

    from fabricprobe.cli import main
    from fabricprobe.collector.service import CollectorServer, ServerConfig

    server = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen="", grace=0.2))
    server.start()
    try:
        args = ["workload", "--transport", "tcp", "--serve", "--port", "0", "--requests", "4",
                "--prompt-tokens", "8", "--output-tokens", "1", "--decode-ms-per-token", "0",
                "--host", "p=127.0.0.1", "--host", "d1=127.0.0.1", "--host", "d2=127.0.0.1",
                "--path", "p:d1", "--path", "p:d2", "--route", "fabric", "--insecure",
                "--collector", f"127.0.0.1:{server.port}"]  # fmt: skip
        out = CliRunner().invoke(main, [*args, "--json"])
        assert out.exit_code == 0, out.output
        routes = json.loads(out.output)["routes"]
        assert len(routes) == 4
        # the collector knows neither host: no price, so in turn, with the reason
        assert all(r == "round-robin (no price: host p is not registered)" for r in routes.values())
        out = CliRunner().invoke(main, args)
        assert "0 request(s) routed on the fabric's price, 4 in turn" in out.output
    finally:
        server.stop(0)
