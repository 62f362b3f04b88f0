"""A request's own links, held to the lane's leaf-spine: agents on the four hosts list
their devices' live QPs, a `probe workload` process moves KV caches over RDMA from h0 to
h3 (other leaves) and sends its spans to the collector, and `probe why --links` must
give each request the links of its own QP pair: the spine its bytes crossed, as the
routers' byte counters saw it, and the hops the routers themselves choose for its
source ports (`ip route get ... sport`). Written to test-results/fabric-flows.json."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fabric.conftest import Fabric
from tests.fabric.test_links import Fleet

PROBE = [sys.executable, "-m", "fabricprobe"]
PROMPT_TOKENS = 32  # Llama-3.1-8B: 4 MiB of KV cache a request
REQUESTS = 40


def tx_bytes(fabric: Fabric) -> dict[str, int]:
    """Bytes each leaf-spine link's egress has sent, by directed link."""
    out = {}
    for c in fabric.doc["links"]:
        if c["tier"] != "leaf-spine" or c["rail"] != 0:
            continue
        for node, dev, peer in ((c["a"], c["a_dev"], c["b"]), (c["b"], c["b_dev"], c["a"])):
            got = subprocess.run(
                ["ip", "-n", node, "-j", "-s", "link", "show", "dev", dev],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            out[f"{node}->{peer}"] = int(json.loads(got)[0]["stats64"]["tx"]["bytes"])
    return out


def why_links(port: int) -> dict:
    got = subprocess.run(
        [*PROBE, "why", "--insecure", "--collector", f"127.0.0.1:{port}", "--links", "--json",
         "--slowest", "10", "--window", "600"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode in (0, 3), got.stderr
    return json.loads(got.stdout)


@pytest.mark.timeout(900)
def test_a_request_is_given_its_own_flow_s_links(fabric: Fabric, tmp_path: Path) -> None:
    h0, h3 = fabric.nic("h0"), fabric.nic("h3")
    fleet = Fleet(fabric, tmp_path, rails=[0], count=20, qp_interval_s=2.0)
    result: dict[str, object] = {}
    try:
        # the hosts' addresses reach the collector with their classes' first traces
        deadline = time.monotonic() + 300
        while not (fleet.links.links_of("h0", "h3") and fleet.links.links_of("h3", "h0")):
            assert time.monotonic() < deadline, fleet.links.snapshot().counts
            time.sleep(2)
        before = tx_bytes(fabric)
        work = subprocess.run(
            [*PROBE, "workload", "--serve", "--transport", "rdma",
             "--host", f"h0={h0.ip}", "--host", f"h3={h3.ip}", "--path", "h0:h3", "--port", "0",
             "--requests", str(REQUESTS), "--prompt-tokens", str(PROMPT_TOKENS),
             "--output-tokens", "2", "--decode-ms-per-token", "100", "--json",
             "--otlp", f"127.0.0.1:{fleet.server.port}"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert work.returncode == 0, work.stderr
        moved = {k: v - before[k] for k, v in tx_bytes(fabric).items()}
        kv = json.loads(work.stdout)["paths"][0]
        kv_bytes = kv["kv_bytes_mean"] * kv["requests"]
        # the spine that carried the KV bytes, by the routers' own counters
        carried = [link for link, n in moved.items() if n >= 0.9 * kv_bytes]
        result.update(moved=moved, kv_bytes=kv_bytes, carried=carried)
        assert len(carried) == 2, moved  # leaf0->spineX and spineX->leaf2
        deadline = time.monotonic() + 240
        while True:
            doc = why_links(fleet.server.port)
            mine = [r for r in doc["requests"] if (r["src"], r["dst"]) == ("h0", "h3")]
            if mine and all(
                any(f["traced"] and len(f["links"]) == 8 for f in r["flows"]) for r in mine
            ):  # its way out and its ACKs' way back, four links each
                break
            assert time.monotonic() < deadline, (mine, fleet.links.flows.counts)
            time.sleep(4)
        result.update(requests=mine)
        brief = {k: result[k] for k in ("moved", "kv_bytes", "carried")}
        print("flows:", json.dumps(brief), flush=True)
        print("flows: a request", json.dumps({k: mine[0][k] for k in ("links_of", "flows")}))
        print("flows: its pair's classes", json.dumps(mine[0]["classes"]), flush=True)
        for r in mine:
            [flow] = [f for f in r["flows"] if f["traced"]]
            assert set(carried) <= set(r["links"]), (carried, r)
            # and the hops the routers choose for its source ports, either way
            out = fabric.route_walk(h0, h3, flow["sport"])
            topo = fleet.links.topology
            want = topo.resolve(h0.ip, h3.ip, out).links
            assert tuple(flow["links"][: len(want)]) == want, (flow, want)
            back_qp = [
                q for q in fleet.links.flows.flows("h3", "h0", 0, time.time() + 60)[0]
                if q.out.lqpn == flow["dst_qpn"]
            ]  # fmt: skip
            back = topo.resolve(h3.ip, h0.ip, fabric.route_walk(h3, h0, back_qp[0].out.sport))
            assert tuple(flow["links"][len(want) :]) == back.links, (flow, back)
            # the responder's thread names itself and lives as long as its QP; the
            # workload's QP is made by whichever worker needs it first, which may end
            # before the QP does (its name then comes from a listing made while it ran,
            # or is not known: one CI run's was "", this machine's "python")
            assert flow["dst_comm"] == "answer", flow
        counts = fleet.links.flows.counts
        assert counts.listings_failed == 0 and counts.lookups.get("flow", 0) >= len(mine)
    finally:
        fleet.close([result], "fabric-flows.json")
