"""The UDP source port a RoCE v2 device puts on a queue pair's packets: the key to its
ECMP class, so the path of a flow can be known from its QP numbers alone.

Each rule is the driver's own, as the Linux kernel writes it:

- rdma_rxe (soft-RoCE), every QP when it is made (drivers/infiniband/sw/rxe/rxe_qp.c,
  rxe_qp_init_req): 0xC000 + (hash_32(qpn, 14) & 0x3FFF), where hash_32 multiplies by
  the 32-bit golden ratio 0x61C88647 and keeps the top 14 bits. A UD QP keeps that port
  for life.
- The kernel's common rule (include/rdma/ib_verbs.h, rdma_get_udp_sport), which mlx5
  applies to a connected QP's path and rxe, from Linux 5.18, when a connected QP is
  given its address (rxe_verbs.c, rxe_modify_qp): the GRH flow label, or when it is 0
  one made of the two QP numbers (rdma_calc_flow_label: their product folded at bits 20
  and 40, low 20 bits), folded to 14 bits (rdma_flow_label_to_udp_sport) over 0xC000.

A driver not listed here has no known rule: its flows keep their host path only.
"""

from __future__ import annotations

GOLDEN_RATIO_32 = 0x61C88647
ROCE_SPORT_MIN = 0xC000
FLOW_LABEL_MASK = 0xFFFFF


def hash_32(value: int, bits: int) -> int:
    """The kernel's hash_32: the low 32 bits of VALUE x golden ratio, top BITS bits."""
    return ((value * GOLDEN_RATIO_32) & 0xFFFFFFFF) >> (32 - bits)


def rxe_qp_sport(qpn: int) -> int:
    """soft-RoCE's port for QP number QPN, as it is made."""
    return ROCE_SPORT_MIN + (hash_32(qpn & 0xFFFFFF, 14) & 0x3FFF)


def flow_label(lqpn: int, rqpn: int) -> int:
    """rdma_calc_flow_label: a connected QP pair's flow label from its two QP numbers."""
    fl = (lqpn & 0xFFFFFF) * (rqpn & 0xFFFFFF)
    fl ^= fl >> 20
    fl ^= fl >> 40
    return fl & FLOW_LABEL_MASK


def flow_label_sport(label: int) -> int:
    """rdma_flow_label_to_udp_sport: a 20-bit flow label folded into a RoCE port."""
    low, high = label & 0x3FFF, label & 0xFC000
    return (low ^ (high >> 14)) | ROCE_SPORT_MIN


def connected_sport(lqpn: int, rqpn: int, label: int = 0) -> int:
    """rdma_get_udp_sport: the port of a connected QP towards RQPN."""
    return flow_label_sport(label or flow_label(lqpn, rqpn))


def source_port(driver: str, qpn: int, rqpn: int | None = None) -> int | None:
    """The UDP source port DRIVER (its kernel module's name) gives QP QPN's packets
    (RQPN: its connected peer's QP number, None for UD), or None where the driver's rule
    is not known."""
    if driver in ("rdma_rxe", "rxe"):
        return rxe_qp_sport(qpn) if rqpn is None else connected_sport(qpn, rqpn)
    if driver.startswith("mlx5") and rqpn is not None:
        return connected_sport(qpn, rqpn)
    return None
