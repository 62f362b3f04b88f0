"""Fixtures for tests on the lane's routed leaf-spine fabric (lane/run.sh --fabric
leaf-spine --hosts 4 --rails 2), described in $LANE_FILE. Outside it these tests fail,
never skip."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class Nic:
    name: str
    device: str
    netdev: str
    ip: str
    gid_index: int
    rail: int
    leaf: str


@dataclass(frozen=True)
class End:
    node: str
    dev: str
    ip: str


class Fabric:
    """The lane file's routers, links and devices, and the routers' own forwarding
    choice for a 5-tuple."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.nics = [Nic(**n) for n in doc["nics"]]
        self.routers = {r["name"]: r for r in doc["routers"]}
        self.ends: dict[tuple[str, str], End] = {}  # (node, dev) -> the far end
        for link in doc["links"]:
            a = End(link["a"], link["a_dev"], link["a_ip"])
            b = End(link["b"], link["b_dev"], link["b_ip"])
            self.ends[(a.node, a.dev)] = b
            self.ends[(b.node, b.dev)] = a

    def nic(self, host: str, rail: int = 0) -> Nic:
        return next(n for n in self.nics if n.name == host and n.rail == rail)

    def address_of(self, router: str, dev: str) -> str:
        return next(i["ip"] for i in self.routers[router]["interfaces"] if i["dev"] == dev)

    def route_walk(self, src: Nic, dst: Nic, sport: int) -> list[str]:
        """The address of the interface each router takes the 5-tuple in on, asking each
        router in turn where it sends it (`ip route get ... iif`)."""
        here = self.ends[(src.name, src.netdev)]
        hops = []
        for _ in range(8):
            hops.append(self.address_of(here.node, here.dev))
            out = subprocess.run(
                [
                    "ip",
                    "-n",
                    here.node,
                    "route",
                    "get",
                    dst.ip,
                    "from",
                    src.ip,
                    "iif",
                    here.dev,
                    "ipproto",
                    "udp",
                    "sport",
                    str(sport),
                    "dport",
                    "4791",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            dev = re.search(r"\bdev (\S+)", out)
            assert dev, out
            nxt = self.ends[(here.node, dev.group(1))]
            if nxt.node not in self.routers:
                assert nxt.node == dst.name, (out, nxt)
                return hops
            here = nxt
        raise AssertionError(f"no end to the walk {src} -> {dst}")


@pytest.fixture(scope="session")
def fabric() -> Fabric:
    path = os.environ.get("LANE_FILE")
    if not path or not Path(path).is_file():
        pytest.fail(
            "no lane: run these tests through lane/run.sh --fabric leaf-spine", pytrace=False
        )
    doc = json.loads(Path(path).read_text())
    if doc.get("fabric") != "leaf-spine":
        pytest.fail(f"the lane's fabric is {doc.get('fabric')!r}, not leaf-spine", pytrace=False)
    return Fabric(doc)
