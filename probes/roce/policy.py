"""The RoCEv2 policy a host is validated against, with common-practice defaults.

Defaults follow the usual lossless-RoCE recipe: RoCE traffic on priority 3 marked DSCP 26
(AF31), CNPs on priority 6 marked DSCP 48 (CS6), IB MTU 4096. A TOML file overrides any
of them:

    [roce]
    priority = 3
    dscp = 26
    cnp_priority = 6
    cnp_dscp = 48
    mtu = 4096
    lossless = true          # RoCE traffic off `priority` (rdma_cm ToS 0) is a FAIL
    roce_bw_min_pct = 50     # ETS share of the RoCE traffic class
    dcbx = "any"             # or "host" / "firmware"
    link_speed_gbps = 100    # 0: the port's fastest supported mode
    link_lanes = 4           # 0: not checked
    firmware_min = "28.39.1002"

    [thresholds]
    pause_duration_warn_pct = 1.0
    rdma_rtt_p99_us_max = 100.0
    pre_fec_ber_warn = 1e-6
    post_fec_ber_fail = 1e-12
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricprobe.core.errors import ProbeError
from fabricprobe.core.tomlpos import TomlError, toml_loads

IB_MTUS = (256, 512, 1024, 2048, 4096)
# RoCEv2 headers on top of the IB payload: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12, room
# for extended headers and the ICRC. The usual guidance rounds it to "MTU + 104", so an
# IB MTU of 4096 needs a netdev MTU of at least 4200.
ROCE_HEADROOM = 104
ECT0 = 0b10  # ECN-capable transport codepoint in the low two ToS bits


class PolicyError(ProbeError):
    """A policy file or override is invalid; the message says which key and why."""


@dataclass(frozen=True)
class Thresholds:
    """Limits for the counter window and the live check."""

    pause_duration_warn_pct: float = 1.0  # % of the window a priority spent paused
    pause_duration_fail_pct: float = 10.0
    pause_frames_warn_per_s: float = 1000.0  # PFC frames/s on the RoCE priority, either way
    discards_warn_per_s: float = 0.0  # any discard rate above this warns
    out_of_buffer_warn_per_s: float = 0.0
    timeouts_warn_per_s: float = 0.0  # local_ack_timeout_err and friends
    retransmits_warn_per_s: float = 0.0
    rdma_rtt_p50_us_max: float = 20.0
    rdma_rtt_p99_us_max: float = 100.0
    rdma_gbps_min: float = 0.0  # 0: not checked
    # Pre-FEC (raw) BER above this warns: the link runs on its FEC margin. Post-FEC
    # (effective) BER above this fails: frames are being lost after correction.
    pre_fec_ber_warn: float = 1e-6
    post_fec_ber_fail: float = 1e-12


@dataclass(frozen=True)
class Policy:
    """What a correctly configured RoCEv2 host looks like."""

    priority: int = 3  # 802.1p priority of RoCE traffic, lossless (PFC) and ECN-enabled
    dscp: int = 26  # DSCP of RoCE traffic (AF31), mapped to `priority`
    cnp_priority: int = 6  # priority of congestion notification packets
    cnp_dscp: int = 48  # DSCP of CNPs (CS6)
    mtu: int = 4096  # IB (RoCE) MTU
    roce_mode: str = "RoCE v2"  # rdma_cm default_roce_mode
    lossless: bool = True  # PFC on `priority`: traffic off it is lossy, so a miss FAILs
    roce_bw_min_pct: int = 50  # ETS share the RoCE traffic class should get
    dcbx: str = "any"  # who runs DCBX: "any", "host" (OS LLDP agent) or "firmware"
    link_speed_gbps: int = 0  # expected link speed; 0: the port's fastest supported mode
    link_lanes: int = 0  # expected lanes (ethtool Lanes:); 0: not checked
    firmware_min: str = ""  # lowest acceptable NIC firmware, dotted (e.g. "28.39.1002")
    thresholds: Thresholds = field(default_factory=Thresholds)

    @property
    def tos(self) -> int:
        """The ToS byte rdma_cm should use: the DSCP with ECT(0), 26 -> 106."""
        return (self.dscp << 2) | ECT0

    @property
    def min_netdev_mtu(self) -> int:
        return self.mtu + ROCE_HEADROOM

    def validate(self) -> Policy:
        """Raise PolicyError naming the first value out of range; return self."""
        for name in ("priority", "cnp_priority"):
            v = getattr(self, name)
            if not 0 <= v <= 7:
                raise PolicyError(f"{name} must be an 802.1p priority 0..7, not {v}")
        for name in ("dscp", "cnp_dscp"):
            v = getattr(self, name)
            if not 0 <= v <= 63:
                raise PolicyError(f"{name} must be a DSCP 0..63, not {v}")
        if self.mtu not in IB_MTUS:
            raise PolicyError(f"mtu must be one of {', '.join(map(str, IB_MTUS))}, not {self.mtu}")
        if self.roce_mode not in ("RoCE v2", "IB/RoCE v1"):
            raise PolicyError(
                f"roce_mode must be 'RoCE v2' or 'IB/RoCE v1', not {self.roce_mode!r}"
            )
        if self.dcbx not in ("any", "host", "firmware"):
            raise PolicyError(f"dcbx must be 'any', 'host' or 'firmware', not {self.dcbx!r}")
        if not 0 <= self.roce_bw_min_pct <= 100:
            raise PolicyError(f"roce_bw_min_pct must be 0..100, not {self.roce_bw_min_pct}")
        if not 0 <= self.link_speed_gbps <= 10_000 or not 0 <= self.link_lanes <= 32:
            raise PolicyError("link_speed_gbps must be 0..10000 and link_lanes 0..32")
        if self.firmware_min and not re.fullmatch(r"\d{1,9}(\.\d{1,9}){0,5}", self.firmware_min):
            raise PolicyError(f"firmware_min must be dotted numbers, not {self.firmware_min!r}")
        if self.priority == self.cnp_priority:
            raise PolicyError(f"cnp_priority must differ from priority ({self.priority})")
        t = self.thresholds
        for f in dataclasses.fields(t):
            v = getattr(t, f.name)
            if not math.isfinite(v) or v < 0:
                raise PolicyError(f"thresholds.{f.name} must be finite and not negative")
        if t.pause_duration_fail_pct < t.pause_duration_warn_pct:
            raise PolicyError("thresholds.pause_duration_fail_pct is below the warn level")
        return self

    def with_overrides(self, **overrides: Any) -> Policy:
        """A copy with the given non-None fields replaced, validated."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **changes).validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _typed(section: str, key: str, value: Any, default: Any) -> Any:
    want = type(default)
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not want:
        raise PolicyError(
            f"[{section}] {key} must be {want.__name__}, not {type(value).__name__} ({value!r})"
        )
    return value


def parse_policy(text: str, base: Policy | None = None) -> Policy:
    """Parse a TOML policy (pure); unknown sections or keys are errors, not ignored."""
    try:
        doc = toml_loads(text)
    except TomlError as e:
        raise PolicyError(f"policy: {e}") from None
    base = base or Policy()
    unknown = set(doc) - {"roce", "thresholds"}
    if unknown:
        raise PolicyError(f"unknown policy section(s): {', '.join(sorted(unknown))}")
    roce = doc.get("roce", {})
    thr = doc.get("thresholds", {})
    if not isinstance(roce, dict) or not isinstance(thr, dict):
        raise PolicyError("[roce] and [thresholds] must be tables")
    roce_fields = {f.name for f in dataclasses.fields(Policy)} - {"thresholds"}
    thr_fields = {f.name for f in dataclasses.fields(Thresholds)}
    for section, table, known in (("roce", roce, roce_fields), ("thresholds", thr, thr_fields)):
        bad = set(table) - known
        if bad:
            raise PolicyError(f"unknown key(s) in [{section}]: {', '.join(sorted(bad))}")
    roce_values = {k: _typed("roce", k, v, getattr(base, k)) for k, v in roce.items()}
    thr_values = {
        k: _typed("thresholds", k, v, getattr(base.thresholds, k)) for k, v in thr.items()
    }
    thresholds = dataclasses.replace(base.thresholds, **thr_values)
    return dataclasses.replace(base, thresholds=thresholds, **roce_values).validate()


def load_policy(path: Path | str) -> Policy:
    """Read a TOML policy file; PolicyError names the file on any problem."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PolicyError(f"cannot read policy file {path}: {e.strerror or e}") from e
    try:
        return parse_policy(text)
    except PolicyError as e:
        raise PolicyError(f"{path}: {e}") from e
