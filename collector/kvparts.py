"""A request's wait for remote KV in three parts: the fabric's, the transfer library's,
the engine's. Pure pandas over the joined KV frame (collector/attribution/join.py), no I/O.

- `kv_wait_s`: the decode side's whole wait for remote KV as its engine defines it
  (vLLM: the decode side's time_in_queue, which holds NIXL's transfer, its notification
  and the scheduler's polling; SGLang: decode_transferred; a measured span: its length).
- `fabric_s`: what the path explains at that time for the bytes moved, from the path's
  figures the join matched in time: the round trips the transfer protocol needs (the
  span's `fabricprobe.round_trips` where it says, `PROTOCOL_RTTS` otherwise; with the
  span's, `fabric_source` ends in `;round-trips=span`) at the path's median RTT (the
  hosts' own delay taken out), the bytes at the path's measured bandwidth, the
  retransmits its probe loss predicts, and the time PFC pauses held the link while the
  bytes were on it. Estimated, never measured: `fabric_source` says from what.
- `transfer_stack_s`: the transfer library's own measured time beyond fabric_s: the
  span's own figure for its transfer where it gives one (`fabricprobe.library_seconds`,
  `transfer_stack_source` "span"), else NIXL's mean seconds per transfer on the decode
  host over the counter window the transfer ran in ("nixl-host-rate"), less fabric_s
  ("" when neither is there).
- `engine_wait_s`: the rest, kv_wait_s - fabric_s - transfer_stack_s. A remainder below
  0 is reported as engine_wait_s = 0 with `over_explained_s` holding by how much the two
  estimates exceed the wait (path figures or bytes that do not fit the transfer).

The bytes come from the span where the engine gives them ("span"), else from the model's
shape for the request's prompt tokens ("model-shape", collector/kvshape.py), else from
NIXL's mean bytes per transfer on the host ("nixl-host-mean"): `kv_bytes_source`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# Round trips one KV transfer needs on the wire, per transport. NIXL over UCX with RDMA
# reads the prefill side's blocks with RDMA READs (one round trip: the read requests go
# out, the data comes back; the reads of a transfer are posted together) and then
# notifies the prefill side that its blocks may be freed (one more: the SEND and its ACK
# before the completion the decode side waits on). The handshake with the remote agent
# (its metadata) happens once per engine pair, not per transfer, so it is not counted.
# Over TCP (UCX's tcp transport, this project's loopback runs) a rendezvous adds one:
# the request, the data after it, and the notification.
PROTOCOL_RTTS: dict[str, int] = {"rdma": 2, "tcp": 3}
DEFAULT_RTTS = 2  # transport not given: the RDMA count, the fewest a transfer can take
# The op of one-sided latency windows (rdma_rc_read): an RDMA READ's RTT holds the two
# NICs and the path, and no software on the far end, as a KV transfer's READs and WRITEs
# do. A path's price and a transfer's join take these before its ping-pongs.
ONE_SIDED_OP = "read"
MTU_BYTES = 4096  # RoCE's largest MTU: the fewest packets, so the fewest retransmits
PAUSED_MAX = 0.99  # a link paused more than this share of the time moves nothing

PART_COLUMNS = [
    "kv_wait_s",
    "kv_bytes_used",
    "kv_bytes_source",
    "fabric_rtts",
    "fabric_rtt_s",
    "fabric_wire_s",
    "fabric_loss_s",
    "fabric_pause_s",
    "fabric_s",
    "fabric_source",
    "transfer_stack_s",
    "transfer_stack_source",
    "engine_wait_s",
    "over_explained_s",
]


def kv_bytes(kv: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(bytes, source) per transfer: the span's, the model shape's, NIXL's mean."""
    span = pd.to_numeric(kv["bytes"], errors="coerce").where(lambda b: b > 0)
    shape = pd.to_numeric(kv.get("model_bytes", np.nan), errors="coerce")
    shape = pd.Series(shape, index=kv.index).where(lambda b: b > 0)
    nixl = pd.to_numeric(kv["nixl_mean_bytes"], errors="coerce").where(lambda b: b > 0)
    nbytes = span.fillna(shape).fillna(nixl).astype(float)
    source = pd.Series(
        np.select(
            [span.notna(), shape.notna(), nixl.notna()],
            ["span", "model-shape", "nixl-host-mean"],
            default="",
        ),
        index=kv.index,
    )
    return nbytes, source


def protocol_rtts(transport: pd.Series) -> pd.Series:
    """PROTOCOL_RTTS of each transfer's transport (DEFAULT_RTTS when not given)."""
    return transport.fillna("").map(lambda t: PROTOCOL_RTTS.get(str(t), DEFAULT_RTTS))


def _col(kv: pd.DataFrame, name: str) -> pd.Series:
    """KV's column NAME as floats (NaN where it is missing)."""
    if name not in kv:
        return pd.Series(np.nan, index=kv.index, dtype=float)
    return pd.to_numeric(kv[name], errors="coerce").astype(float)


def split_parts(kv: pd.DataFrame) -> pd.DataFrame:
    """KV with PART_COLUMNS added (NaN where a figure a part needs is unknown)."""
    if kv.empty:
        return kv.assign(**{c: pd.Series(dtype=object) for c in PART_COLUMNS})
    wait = _col(kv, "duration_s")
    nbytes, source = kv_bytes(kv)
    # the round trips the span says its transfer waited for, else its protocol's count
    said = _col(kv, "round_trips").where(lambda n: n > 0)
    rtts = said.fillna(protocol_rtts(kv["transport"]).astype(float))
    # the path's RTT without the hosts' own delay, where the join could take it out
    rtt = _col(kv, "rtt_p50_net_s").fillna(_col(kv, "rtt_p50_s"))
    bw = _col(kv, "bandwidth_bytes_per_s").where(lambda b: b > 0)
    rtt_s = rtts * rtt
    wire_s = nbytes / bw
    # each packet the probes' loss ratio says is lost costs one more round trip (an RC
    # receiver NAKs the gap, the sender goes back and sends again)
    packets = np.ceil(nbytes / MTU_BYTES)
    loss_s = packets * _col(kv, "loss_ratio").fillna(0.0) * rtt
    # PFC pause time per second at either end (µs/s from ethtool's *_pause_duration_us):
    # a link paused a share p of the time moves the bytes in wire / (1 - p)
    paused = pd.concat([_col(kv, f"{e}_pause_us_per_s") / 1e6 for e in ("src", "dst")], axis=1).max(
        axis=1
    )
    have_pause = paused.notna()
    p = paused.fillna(0.0).clip(0.0, PAUSED_MAX)
    pause_s = wire_s * p / (1 - p)
    fabric = rtt_s + wire_s + loss_s + pause_s
    fabric_source = pd.Series(
        np.where(
            fabric.notna(),
            np.where(have_pause, "rtt+bandwidth+loss+pause@window", "rtt+bandwidth+loss@window"),
            "",
        ),
        index=kv.index,
    ).where(~(fabric.notna() & said.notna()), lambda f: f + ";round-trips=span")
    # the transfer library's own time for the transfer (the span's, else NIXL's mean on
    # the host), beyond what the fabric explains, and no more than the wait left after it
    own = _col(kv, "library_s").where(lambda s: s > 0)
    lib = own.fillna(_col(kv, "nixl_mean_xfer_s"))
    room = (wait - fabric).clip(lower=0.0)
    stack = (lib - fabric).clip(lower=0.0)
    stack = stack.where(stack <= room, room).where(lib.notna() & fabric.notna())
    stack_source = pd.Series(
        np.select([stack.isna(), own.notna()], ["", "span"], default="nixl-host-rate"),
        index=kv.index,
    )
    rest = wait - fabric - stack.fillna(0.0)
    return kv.assign(
        kv_wait_s=wait,
        kv_bytes_used=nbytes,
        kv_bytes_source=source,
        fabric_rtts=rtts.astype(float),
        fabric_rtt_s=rtt_s,
        fabric_wire_s=wire_s,
        fabric_loss_s=loss_s,
        fabric_pause_s=pause_s.where(have_pause),
        fabric_s=fabric,
        fabric_source=fabric_source,
        transfer_stack_s=stack,
        transfer_stack_source=stack_source,
        engine_wait_s=rest.clip(lower=0.0),
        over_explained_s=(-rest).clip(lower=0.0).where(rest.notna()),
    )


def fabric_seconds(
    nbytes: float, rtt_s: float, bandwidth_bytes_per_s: float, loss_ratio: float, transport: str
) -> float:
    """fabric_s of one transfer from scalar figures, as split_parts computes it (no pause
    time): the protocol's round trips, the bytes at the bandwidth, a round trip per
    packet the loss ratio says is lost. What the price list predicts (collector/price.py)."""
    rtts = PROTOCOL_RTTS.get(transport, DEFAULT_RTTS)
    lost = np.ceil(nbytes / MTU_BYTES) * loss_ratio
    return float(rtts * rtt_s + nbytes / bandwidth_bytes_per_s + lost * rtt_s)
