"""The verbs resource ladder for probes: Context + PD -> CQ, MR, QP -> RTS.

`RcEndpoint` owns one RC queue pair with its own CQ and one registered buffer; it is a
context manager and `close()` releases QP, MR, CQ, PD and context in that order (and is
idempotent), so a probe that fails half-way leaks nothing. Polling always has a
deadline and the timeout says how many completions were missing.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from probes.errors import NotSupported, PeerError, ProbeError

try:  # Debian 12's rdma-core 44 names the module `enums`; newer releases `libibverbs_enums`
    import pyverbs.enums as e
except ImportError:  # pragma: no cover - depends on the installed rdma-core
    import pyverbs.libibverbs_enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

PORT = 1
# ibv_mtu enum value -> bytes
MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
_UNSUPPORTED = {95, 93}  # EOPNOTSUPP, EPROTONOSUPPORT


class VerbsError(ProbeError):
    """A verbs call failed; `errno` is kept so callers can tell unsupported from broken."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def _verbs(what: str, err: PyverbsRDMAError) -> ProbeError:
    code = getattr(err, "error_code", None)
    if code in _UNSUPPORTED:
        return NotSupported(f"{what}: not supported here ({err})")
    return VerbsError(f"{what}: {err}", code)


@dataclass(frozen=True)
class EndpointInfo:
    """What a peer needs to reach this queue pair (exchanged out of band)."""

    qpn: int
    psn: int
    gid: str
    gid_index: int
    rkey: int
    addr: int
    size: int
    mtu: int  # ibv_mtu enum value (1..5)


def roce_v2_gid_index(ctx: Any, device: str, port: int = PORT) -> int:
    """Index of the first IPv4-mapped RoCE v2 GID of DEVICE (what rdma_cm would pick)."""
    attr = ctx.query_port(port)
    for idx in range(attr.gid_tbl_len):
        try:
            gid = str(ctx.query_gid(port, idx))
            gtype = ctx.query_gid_type(port, idx)
        except PyverbsRDMAError:
            continue
        if gid.startswith("0000:0000:0000:0000:0000:ffff:") and gtype == e.IBV_GID_TYPE_ROCE_V2:
            return idx
    raise NotSupported(f"{device} port {port} has no RoCE v2 GID for an IPv4 address")


class RcEndpoint:
    """One RC QP with its CQ and a registered buffer of `size` bytes (x2: send + recv halves)."""

    def __init__(
        self,
        device: str,
        size: int,
        depth: int = 64,
        gid_index: int | None = None,
        port: int = PORT,
        remote_access: bool = False,
    ) -> None:
        if size < 1 or size > 1 << 30:
            raise ValueError(f"buffer size {size} outside 1..1 GiB")
        self.device, self.size, self.depth, self.port = device, size, depth, port
        self._closed = False
        self.ctx: Any = None
        self.pd: Any = None
        self.cq: Any = None
        self.mr: Any = None
        self.qp: Any = None
        try:
            self.ctx = Context(name=device)
            self.pd = PD(self.ctx)
            self.cq = CQ(self.ctx, depth * 2, None, None, 0)
            access = e.IBV_ACCESS_LOCAL_WRITE
            if remote_access:
                access |= e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
            self.mr = MR(self.pd, size * 2, access)
            cap = QPCap(
                max_send_wr=depth,
                max_recv_wr=depth,
                max_send_sge=1,
                max_recv_sge=1,
                max_inline_data=0,
            )
            init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap)
            self.qp = QP(self.pd, init, QPAttr())  # pyverbs leaves an RC QP in INIT
            self.gid_index = (
                gid_index if gid_index is not None else roce_v2_gid_index(self.ctx, device, port)
            )
            self.gid = str(self.ctx.query_gid(port, self.gid_index))
            self.active_mtu = int(self.ctx.query_port(port).active_mtu)
        except PyverbsRDMAError as err:
            self.close()
            raise _verbs(f"{device}: creating RC resources", err) from err
        except BaseException:
            self.close()
            raise
        self.psn = random.randrange(1 << 24)
        self._recv_wr: Any = None
        self._send_wr: Any = None

    # -- lifetime ---------------------------------------------------------------------
    def close(self) -> None:
        """Release QP, MR, CQ, PD, context (children first). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for res in (self.qp, self.mr, self.cq, self.pd, self.ctx):
            if res is not None:
                res.close()

    def __enter__(self) -> RcEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connection -------------------------------------------------------------------
    def info(self) -> EndpointInfo:
        return EndpointInfo(
            qpn=self.qp.qp_num,
            psn=self.psn,
            gid=self.gid,
            gid_index=self.gid_index,
            rkey=self.mr.rkey,
            addr=self.mr.buf,
            size=self.size,
            mtu=self.active_mtu,
        )

    def connect(self, remote: EndpointInfo) -> None:
        """INIT -> RTR -> RTS towards REMOTE; path MTU is the smaller active MTU."""
        attr = QPAttr()
        attr.path_mtu = min(self.active_mtu, remote.mtu)
        attr.dest_qp_num = remote.qpn
        attr.rq_psn = remote.psn
        attr.sq_psn = self.psn
        attr.max_dest_rd_atomic = 1
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = 12  # 0.64 ms
        attr.timeout = 14  # 4.096 us * 2^14 = 67 ms per retry
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_LOCAL_WRITE
        route = GlobalRoute(dgid=_gid(remote.gid), sgid_index=self.gid_index, hop_limit=64)
        attr.ah_attr = AHAttr(gr=route, is_global=1, port_num=self.port)
        try:
            self.qp.to_rts(attr)
        except PyverbsRDMAError as err:
            raise _verbs(f"{self.device}: QP {self.qp.qp_num} to RTS", err) from err

    # -- data path --------------------------------------------------------------------
    def write_payload(self, data: bytes, offset: int = 0) -> None:
        self.mr.write(data, len(data), offset)

    def read_payload(self, length: int, offset: int = 0) -> bytes:
        return bytes(self.mr.read(length, offset))

    def post_recv(self, length: int | None = None, wr_id: int = 2) -> None:
        """Post one receive into the second half of the buffer."""
        sge = SGE(self.mr.buf + self.size, length or self.size, self.mr.lkey)
        self.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[sge]))

    def post_send(self, length: int | None = None, wr_id: int = 1, signaled: bool = True) -> None:
        sge = SGE(self.mr.buf, length or self.size, self.mr.lkey)
        flags = e.IBV_SEND_SIGNALED if signaled else 0
        self.qp.post_send(
            SendWR(wr_id=wr_id, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge], send_flags=flags)
        )

    def post_write(
        self,
        remote: EndpointInfo,
        length: int,
        wr_id: int = 3,
        signaled: bool = True,
        remote_offset: int = 0,
    ) -> None:
        sge = SGE(self.mr.buf, length, self.mr.lkey)
        flags = e.IBV_SEND_SIGNALED if signaled else 0
        wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=flags)
        wr.set_wr_rdma(remote.rkey, remote.addr + remote_offset)
        self.qp.post_send(wr)

    def poll(self, want: int, deadline: float, opcode: int | None = None) -> list[Any]:
        """Poll until WANT completions (of OPCODE, if given) arrived or DEADLINE passed.

        Completions of other opcodes are consumed and dropped. An error completion raises
        PeerError (the usual cause is a peer that vanished: retry exceeded)."""
        got: list[Any] = []
        while len(got) < want:
            n, wcs = self.cq.poll(max(1, want - len(got)))
            for wc in wcs[:n]:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise PeerError(
                        f"{self.device}: completion error status {wc.status} "
                        f"(opcode {wc.opcode}, wr_id {wc.wr_id})"
                    )
                if opcode is None or wc.opcode == opcode:
                    got.append(wc)
            if n == 0 and time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.device}: {want - len(got)} of {want} completions "
                    "missing at the deadline"
                )
        return got


def _gid(text: str) -> Any:
    from pyverbs.addr import GID

    return GID(text)
