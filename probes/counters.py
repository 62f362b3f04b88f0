"""Read RDMA port counters from sysfs, and turn two readings into rates.

Two directories hold them, both under `SYSFS/class/infiniband/DEV/ports/N/`:

* `counters/` - the InfiniBand PMA counters (IBTA PortCounters / PortCountersExtended).
  Every IB and most RoCE HCAs have it; bnxt_re, irdma and rxe do not, and that is normal.
* `hw_counters/` - whatever the driver chooses to export, one file per counter, named as
  the driver spells it (mlx5 `out_of_buffer`, rxe `rcvd_seq_err`, irdma `cnpHandled`).
  `lifespan` in there is a cache period in milliseconds, not a counter.

Kernel ABI: Documentation/ABI/stable/sysfs-class-infiniband.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.numbers import parse_uint
from fabricprobe.probes.sysfs import read_small

# Files in hw_counters/ that are not counters.
_NOT_COUNTERS = frozenset({"lifespan"})

# mlx5 Q counters are 32 bits wide in firmware and the driver widens them without
# accumulating (drivers/infiniband/hw/mlx5/counters.c reads a __be32), so they wrap at
# 2**32. The congestion counters (rp_cnp_*, np_*) and rx_icrc_encapsulated are 64-bit.
MLX5_Q_COUNTERS_32BIT = frozenset(
    {
        "rx_write_requests",
        "rx_read_requests",
        "rx_atomic_requests",
        "rx_dct_connect",
        "out_of_buffer",
        "out_of_sequence",
        "duplicate_request",
        "rnr_nak_retry_err",
        "packet_seq_err",
        "implied_nak_seq_err",
        "local_ack_timeout_err",
        "resp_local_length_error",
        "resp_cqe_error",
        "req_cqe_error",
        "req_remote_invalid_request",
        "req_remote_access_errors",
        "resp_remote_access_errors",
        "resp_cqe_flush_error",
        "req_cqe_flush_error",
        "req_transport_retries_exceeded",
        "req_rnr_retries_exceeded",
        "roce_adp_retrans",
        "roce_adp_retrans_to",
        "roce_slow_restart",
        "roce_slow_restart_cnps",
        "roce_slow_restart_trans",
    }
)

# PMA counters that are 32 bits or narrower in PortCounters (the kernel falls back to
# them when the HCA lacks PortCountersExtended); they saturate or wrap early.
PMA_COUNTERS_32BIT = frozenset(
    {
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "port_rcv_switch_relay_errors",
        "port_xmit_discards",
        "port_xmit_constraint_errors",
        "port_rcv_constraint_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "VL15_dropped",
        "port_xmit_wait",
    }
)


@dataclass(frozen=True)
class SkippedCounter:
    """A counter file that was present but could not be used."""

    name: str  # file name, e.g. "hw_counters/out_of_buffer"
    reason: str  # errno class ("EACCES", "EISDIR", ...) or "not a counter: 'N/A'"


@dataclass(frozen=True)
class PmaCounters:
    """`ports/N/counters/`: the IB PMA counters, as the kernel names them."""

    # PMA quirk: port_xmit_data / port_rcv_data count 32-bit words, not bytes (IBTA
    # PortXmitData is "octets divided by 4"); mlx5 and every other HCA report them so.
    port_xmit_data: int | None  # counters/port_xmit_data (4-byte words)
    port_rcv_data: int | None  # counters/port_rcv_data (4-byte words)
    port_xmit_packets: int | None  # counters/port_xmit_packets
    port_rcv_packets: int | None  # counters/port_rcv_packets
    port_unicast_xmit_packets: int | None  # counters/port_unicast_xmit_packets
    port_unicast_rcv_packets: int | None  # counters/port_unicast_rcv_packets
    port_multicast_xmit_packets: int | None  # counters/port_multicast_xmit_packets
    port_multicast_rcv_packets: int | None  # counters/port_multicast_rcv_packets
    port_xmit_discards: int | None  # counters/port_xmit_discards
    port_xmit_wait: int | None  # counters/port_xmit_wait (ticks the port had data but no credit)
    port_xmit_constraint_errors: int | None  # counters/port_xmit_constraint_errors
    port_rcv_errors: int | None  # counters/port_rcv_errors
    port_rcv_remote_physical_errors: int | None  # counters/port_rcv_remote_physical_errors
    port_rcv_switch_relay_errors: int | None  # counters/port_rcv_switch_relay_errors
    port_rcv_constraint_errors: int | None  # counters/port_rcv_constraint_errors
    symbol_error: int | None  # counters/symbol_error
    link_error_recovery: int | None  # counters/link_error_recovery
    link_downed: int | None  # counters/link_downed
    local_link_integrity_errors: int | None  # counters/local_link_integrity_errors
    excessive_buffer_overrun_errors: int | None  # counters/excessive_buffer_overrun_errors
    vl15_dropped: int | None  # counters/VL15_dropped
    values: Mapping[str, int] = field(default_factory=dict, compare=False)  # all of counters/

    @property
    def port_xmit_bytes(self) -> int | None:
        """Bytes sent: port_xmit_data is in 4-byte words."""
        return None if self.port_xmit_data is None else self.port_xmit_data * 4

    @property
    def port_rcv_bytes(self) -> int | None:
        """Bytes received: port_rcv_data is in 4-byte words."""
        return None if self.port_rcv_data is None else self.port_rcv_data * 4


@dataclass(frozen=True)
class HwCounters:
    """`ports/N/hw_counters/`: driver counters; typed fields for the ones RoCE health needs.

    `values` keeps every counter under the name the driver gave it (irdma's `cnpHandled`
    included); the typed fields are None when this driver has no such counter.
    """

    values: Mapping[str, int]
    # mlx5: receive queue and transport (32-bit Q counters, see MLX5_Q_COUNTERS_32BIT)
    out_of_buffer: int | None  # hw_counters/out_of_buffer (RQ had no WQE: drop)
    out_of_sequence: int | None  # hw_counters/out_of_sequence
    duplicate_request: int | None  # hw_counters/duplicate_request (mlx5 and rxe)
    rnr_nak_retry_err: int | None  # hw_counters/rnr_nak_retry_err
    packet_seq_err: int | None  # hw_counters/packet_seq_err (NAK sequence errors received)
    implied_nak_seq_err: int | None  # hw_counters/implied_nak_seq_err
    local_ack_timeout_err: int | None  # hw_counters/local_ack_timeout_err (transport timeouts)
    resp_local_length_error: int | None  # hw_counters/resp_local_length_error
    resp_cqe_error: int | None  # hw_counters/resp_cqe_error
    req_cqe_error: int | None  # hw_counters/req_cqe_error
    resp_cqe_flush_error: int | None  # hw_counters/resp_cqe_flush_error
    req_cqe_flush_error: int | None  # hw_counters/req_cqe_flush_error
    req_remote_access_errors: int | None  # hw_counters/req_remote_access_errors
    req_remote_invalid_request: int | None  # hw_counters/req_remote_invalid_request
    req_transport_retries_exceeded: int | None  # hw_counters/req_transport_retries_exceeded
    roce_adp_retrans: int | None  # hw_counters/roce_adp_retrans (adaptive retransmissions)
    roce_adp_retrans_to: int | None  # hw_counters/roce_adp_retrans_to
    roce_slow_restart: int | None  # hw_counters/roce_slow_restart
    # mlx5: congestion control (DCQCN), 64-bit
    rp_cnp_handled: int | None  # hw_counters/rp_cnp_handled (CNPs acted on; bnxt_re too)
    rp_cnp_ignored: int | None  # hw_counters/rp_cnp_ignored
    np_cnp_sent: int | None  # hw_counters/np_cnp_sent
    np_ecn_marked_roce_packets: int | None  # hw_counters/np_ecn_marked_roce_packets
    rx_icrc_encapsulated: int | None  # hw_counters/rx_icrc_encapsulated
    # rxe (soft-RoCE), atomic64 counters
    sent_pkts: int | None  # hw_counters/sent_pkts
    rcvd_pkts: int | None  # hw_counters/rcvd_pkts
    rdma_sends: int | None  # hw_counters/rdma_sends
    rdma_recvs: int | None  # hw_counters/rdma_recvs
    out_of_seq_request: int | None  # hw_counters/out_of_seq_request
    rcvd_seq_err: int | None  # hw_counters/rcvd_seq_err
    rcvd_rnr_err: int | None  # hw_counters/rcvd_rnr_err
    send_rnr_err: int | None  # hw_counters/send_rnr_err
    completer_retry_err: int | None  # hw_counters/completer_retry_err
    retry_exceeded_err: int | None  # hw_counters/retry_exceeded_err
    retry_rnr_exceeded_err: int | None  # hw_counters/retry_rnr_exceeded_err
    send_err: int | None  # hw_counters/send_err
    # bnxt_re
    rx_roce_discards: int | None  # hw_counters/rx_roce_discards
    rx_roce_errors: int | None  # hw_counters/rx_roce_errors
    to_retransmits: int | None  # hw_counters/to_retransmits (timeout retransmissions)
    seq_err_naks_rcvd: int | None  # hw_counters/seq_err_naks_rcvd
    max_retry_exceeded: int | None  # hw_counters/max_retry_exceeded
    rx_out_of_buffer: int | None  # hw_counters/rx_out_of_buffer
    rx_cnp_pkts: int | None  # hw_counters/rx_cnp_pkts
    tx_cnp_pkts: int | None  # hw_counters/tx_cnp_pkts
    rx_ecn_marked_pkts: int | None  # hw_counters/rx_ecn_marked_pkts

    @classmethod
    def from_values(cls, values: Mapping[str, int]) -> HwCounters:
        """Build from a name -> value mapping; absent counters become None."""
        frozen = MappingProxyType(dict(values))
        typed = {f.name: frozen.get(f.name) for f in fields(cls) if f.name != "values"}
        return cls(values=frozen, **typed)


@dataclass(frozen=True)
class PortCounters:
    """Everything `read_port_counters` found for one port."""

    device: str
    port: int
    pma: PmaCounters | None  # None: no counters/ directory (bnxt_re, irdma, rxe)
    hw: HwCounters | None  # None: no hw_counters/ directory
    skipped: tuple[SkippedCounter, ...] = ()

    def value(self, name: str) -> int | None:
        """A counter by its kernel name, hw_counters first, then counters/."""
        if self.hw is not None and name in self.hw.values:
            return self.hw.values[name]
        if self.pma is not None and name in self.pma.values:
            return self.pma.values[name]
        return None


def parse_counter(text: str) -> int:
    """Parse one sysfs counter file: a decimal integer in 0..2**64 - 1.

    ParseError for anything else ("", "-1", "N/A (no PMA)", "0x10", "²", a value over 64
    bits); the directory reader skips such a file and names it in `skipped`.
    """
    try:
        return parse_uint(text, "counter")
    except ParseError as e:
        raise ParseError(f"not a counter: {e}") from None


def _errno_class(e: OSError) -> str:
    if isinstance(e, IsADirectoryError):
        return "EISDIR"
    return errno.errorcode.get(e.errno or 0, "EIO")


def _read_counter_dir(
    directory: Path, prefix: str, skipped: list[SkippedCounter]
) -> dict[str, int] | None:
    """Read every counter file in DIRECTORY; None when the directory does not exist."""
    if not directory.is_dir():
        return None
    values: dict[str, int] = {}
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.name in _NOT_COUNTERS:
            continue
        name = f"{prefix}/{entry.name}"
        try:
            values[entry.name] = parse_counter(read_small(entry))
        except OSError as e:
            if e.errno == errno.ENOENT:  # vanished between listing and reading
                continue
            skipped.append(SkippedCounter(name, _errno_class(e)))
        except ParseError as e:
            skipped.append(SkippedCounter(name, str(e)))
    return values


def _pma_from_values(values: Mapping[str, int]) -> PmaCounters:
    typed = {
        f.name: values.get("VL15_dropped" if f.name == "vl15_dropped" else f.name)
        for f in fields(PmaCounters)
        if f.name != "values"
    }
    return PmaCounters(values=MappingProxyType(dict(values)), **typed)


def read_port_counters(sysfs_root: Path | str, device: str, port: int) -> PortCounters:
    """Read SYSFS/class/infiniband/DEVICE/ports/PORT/{counters,hw_counters}/.

    A missing directory is normal and gives None; an unreadable or non-numeric file is
    listed in `skipped` with its errno class, never reported as 0.
    ABI: Documentation/ABI/stable/sysfs-class-infiniband (counters, hw_counters).
    """
    pdir = Path(sysfs_root) / "class" / "infiniband" / device / "ports" / str(port)
    skipped: list[SkippedCounter] = []
    pma_values = _read_counter_dir(pdir / "counters", "counters", skipped)
    hw_values = _read_counter_dir(pdir / "hw_counters", "hw_counters", skipped)
    return PortCounters(
        device=device,
        port=port,
        pma=None if pma_values is None else _pma_from_values(pma_values),
        hw=None if hw_values is None else HwCounters.from_values(hw_values),
        skipped=tuple(skipped),
    )


def counter_width(name: str, driver: str | None = None) -> int:
    """Bits after which NAME wraps: 32 for mlx5 Q counters and narrow PMA ones, else 64."""
    if name in PMA_COUNTERS_32BIT:
        return 32
    if name in MLX5_Q_COUNTERS_32BIT and (driver is None or driver.startswith("mlx5")):
        return 32
    return 64


@dataclass(frozen=True)
class CounterDelta:
    """The increase of one counter between two readings."""

    delta: int  # increase, counting one wrap if the counter wrapped
    wrapped: bool  # the counter passed 2**width once
    reset: bool  # the counter went backwards with no plausible wrap: delta counts from 0


def counter_delta(prev: int, cur: int, width: int = 64) -> CounterDelta:
    """Increase from PREV to CUR of a WIDTH-bit counter, telling a wrap from a reset.

    A 32-bit counter that went backwards wrapped if the wrapped increase is under half
    the range (a counter does not move 2**31 between two samples of a few seconds);
    otherwise the device was reset (driver reload, port reset) and CUR counts from zero.
    A 64-bit counter never wraps in practice, so going backwards is always a reset.
    """
    if width not in (32, 64):
        raise ValueError(f"counter width must be 32 or 64, not {width}")
    if prev < 0 or cur < 0:
        raise ValueError("counters are never negative")
    if cur >= prev:
        return CounterDelta(cur - prev, wrapped=False, reset=False)
    if width == 32 and prev < 2**32:
        wrapped = cur + 2**32 - prev
        if wrapped < 2**31:
            return CounterDelta(wrapped, wrapped=True, reset=False)
    return CounterDelta(cur, wrapped=False, reset=True)


def counter_deltas(
    prev: Mapping[str, int],
    cur: Mapping[str, int],
    widths: Mapping[str, int] | None = None,
) -> dict[str, CounterDelta]:
    """Deltas for every counter present in both readings (a counter absent from either
    is left out, not reported as 0)."""
    widths = widths or {}
    return {
        name: counter_delta(prev[name], cur[name], widths.get(name, 64))
        for name in cur.keys() & prev.keys()
    }


# hw_counters that count an RC retransmission, or the event that makes one, as each driver
# spells them. The requester's side: a retry after the ACK timer ran out (mlx5
# local_ack_timeout_err, bnxt_re to_retransmits, rxe completer_retry_err, which also counts
# go-back-N after a NAK), a sequence-error NAK received (mlx5 packet_seq_err, bnxt_re
# seq_err_naks_rcvd, rxe rcvd_seq_err), an implied NAK (mlx5 implied_nak_seq_err), mlx5's
# adaptive retransmissions (roce_adp_retrans, roce_adp_retrans_to) and retries given up
# (req_transport_retries_exceeded, retry_exceeded_err, max_retry_exceeded). The responder's
# side: a gap in the PSNs (mlx5 out_of_sequence, rxe out_of_seq_request) and a request
# seen twice because its ACK was lost (duplicate_request, mlx5 and rxe).
RETRANSMIT_COUNTERS = (
    "local_ack_timeout_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "out_of_sequence",
    "duplicate_request",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "req_transport_retries_exceeded",
    "to_retransmits",
    "seq_err_naks_rcvd",
    "max_retry_exceeded",
    "completer_retry_err",
    "rcvd_seq_err",
    "out_of_seq_request",
    "retry_exceeded_err",
)


def hw_counter_changes(
    before: PortCounters, after: PortCounters, names: Iterable[str], driver: str | None
) -> dict[str, CounterDelta]:
    """How each of NAMES in hw_counters/ moved between two readings of one port, in
    NAMES' order (DRIVER picks the wrap width); a counter missing from either is left out."""
    if (before.device, before.port) != (after.device, after.port):
        raise ValueError(
            f"readings of two ports: {before.device}/{before.port}, {after.device}/{after.port}"
        )
    if before.hw is None or after.hw is None:
        return {}
    prev, cur = before.hw.values, after.hw.values
    return {
        name: counter_delta(prev[name], cur[name], counter_width(name, driver))
        for name in names
        if name in prev and name in cur
    }
