"""The fabric's price of a KV transfer as the Query API carries it (KvCost): what the
collector answers (collector/price.py works it out) and its clients read
(fabricprobe.workload.price, `probe cost`). A figure that is not known is None here and
absent on the wire, never 0."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Self

from fabricprobe.core.api import fabricprobe_pb2 as pb

# The optional figures of a KvCostReply: the price at the path's RTT p50 and p99 (s), the
# figures it came from, and the age of the oldest of them (s).
FIGURES = (
    "p50_s",
    "p99_s",
    "rtt_p50_s",
    "rtt_p99_s",
    "bandwidth_bytes_per_s",
    "loss_ratio",
    "age_s",
)


@dataclass(frozen=True)
class Price:
    """The predicted KV-transfer time on a path, or why it is unknown."""

    src: str
    dst: str
    bytes: int
    known: bool
    reason: str = ""  # why unknown ("" when known)
    p50_s: float | None = None
    p99_s: float | None = None
    rtt_p50_s: float | None = None
    rtt_p99_s: float | None = None
    bandwidth_bytes_per_s: float | None = None
    loss_ratio: float | None = None
    age_s: float | None = None  # of the oldest figure used
    transport: str = ""
    rtts: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The JSON of the price: every field but the figures not known."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def reply(self) -> pb.KvCostReply:
        """The Query API's KvCost answer (figures absent where unknown or not finite)."""
        wire: dict[str, Any] = {name: getattr(self, name) for name in PLAIN}
        for name in FIGURES:
            if (v := getattr(self, name)) is not None and math.isfinite(v):
                wire[name] = float(v)
        return pb.KvCostReply(**wire)

    @classmethod
    def from_reply(cls, r: pb.KvCostReply) -> Self:
        """The price a KvCost answer carries."""
        plain = {name: getattr(r, name) for name in PLAIN}
        return cls(**plain, **{n: getattr(r, n) for n in FIGURES if r.HasField(n)})


# The other fields of a Price: on the wire under the same names, always there.
PLAIN = tuple(f.name for f in fields(Price) if f.name not in FIGURES)
