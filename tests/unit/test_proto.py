"""The generated API code must match what scripts/gen-proto.sh makes from the .proto."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = (
    "fabricprobe_pb2.py",
    "fabricprobe_pb2.pyi",
    "fabricprobe_pb2_grpc.py",
    "prom_metrics_pb2.py",
    "prom_metrics_pb2.pyi",
)


def test_generated_code_is_current(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)], check=True)
    stale = [
        name
        for name in GENERATED
        if (tmp_path / "fabricprobe" / "core" / "api" / name).read_bytes()
        != (ROOT / "fabricprobe" / "core" / "api" / name).read_bytes()
    ]
    assert not stale, f"stale generated code {stale}: run scripts/gen-proto.sh and commit"


def test_api_round_trip() -> None:
    from fabricprobe.core.api import fabricprobe_pb2 as pb

    msg = pb.WindowReport(host="h1", epoch=7, seq=3)
    rtt = pb.Sketch(kind="rtt", count=1, slots=[3], counts=[1])
    msg.probes.add(dst="h2", transport="tcp", op="pingpong", size=64, rtt=rtt)
    again = pb.WindowReport.FromString(msg.SerializeToString())
    assert again.probes[0].dst == "h2" and again.seq == 3
    assert list(again.probes[0].rtt.slots) == [3]
