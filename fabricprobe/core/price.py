"""The fabric's price of a KV transfer as the Query API carries it (KvCost): what the
collector answers (collector/price.py works it out) and its clients read
(fabricprobe.workload.price, `probe cost`). A figure that is not known is None here and
absent on the wire, never 0."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
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
        msg = pb.KvCostReply(
            known=self.known,
            reason=self.reason,
            transport=self.transport,
            rtts=self.rtts,
            src=self.src,
            dst=self.dst,
            bytes=self.bytes,
        )
        for name in FIGURES:
            v = getattr(self, name)
            if v is not None and math.isfinite(v):
                setattr(msg, name, float(v))
        return msg

    @classmethod
    def from_reply(cls, r: pb.KvCostReply) -> Self:
        """The price a KvCost answer carries."""
        figures = {n: getattr(r, n) for n in FIGURES if r.HasField(n)}
        return cls(
            src=r.src,
            dst=r.dst,
            bytes=r.bytes,
            known=r.known,
            reason=r.reason,
            transport=r.transport,
            rtts=r.rtts,
            **figures,
        )
