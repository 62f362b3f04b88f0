"""The verbs resource ladder for probes: Context + PD -> CQs, MR, QP -> RTS.

`VerbsEndpoint` is the ladder itself (Context + PD, then CQs, MR and QP from overridable
`create_*` factories); the RC endpoint here and the UD one (fabricprobe.probes.rdma.ud)
climb it. `RcEndpoint` owns one RC queue pair with a send CQ, a receive CQ and one
registered buffer split in two halves (send half, receive half). Endpoints are context
managers and `close()` releases QP, MR, CQs, PD and context in that order (idempotent),
so a probe that fails half-way leaks nothing. Polling always has a deadline; the timeout names how
many completions were missing.

Hot-path rules (Python's per-call cost is what separates a probe from perftest): work
requests are built once and re-posted, the buffer is read and written through a
zero-copy ctypes view of the registered memory, and nothing is allocated per
iteration except what pyverbs' own poll returns.
"""

from __future__ import annotations

import ctypes
import ipaddress
import random
import time
from pathlib import Path
from typing import Any, Self

from fabricprobe.core.errors import NotSupported, PeerError, ProbeError, SysfsError
from fabricprobe.probes.control import IB_MTUS, RdmaEndpoint
from fabricprobe.probes.sysfs import list_device_names

try:  # Debian 12's rdma-core 44 names the module `enums`; newer releases `libibverbs_enums`
    import pyverbs.enums as e
except ImportError:  # pragma: no cover - depends on the installed rdma-core
    import pyverbs.libibverbs_enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

PORT = 1
# RC transport timer: 4.096 us * 2^14 = 67 ms before a request with no ACK is sent again,
# up to 7 times (fastpath.c sets the same)
ACK_TIMEOUT = 14
ACK_TIMEOUT_S = 4.096e-6 * 2**ACK_TIMEOUT
_UNSUPPORTED = {95, 93}  # EOPNOTSUPP, EPROTONOSUPPORT
# A wait busy-polls for SPIN_S (answers of a working fabric, queueing included, come well
# inside it), then pauses PAUSE_S between polls: a lost message, or a peer that is slow or
# gone, costs a few % of a core until the deadline instead of all of it (as the native
# loops; an answer that late is seen up to a pause and the timer's slack after it came).
SPIN_S = 0.005
PAUSE_S = 50e-6


class Spin:
    """One wait's clock: `expired()` after an empty poll says whether DEADLINE has passed,
    pausing first once the wait is older than SPIN_S. Creating one reads no clock: a wait
    answered at the first poll (inside a timed exchange) costs nothing more than before.
    `last` is the clock read before the newest empty poll (0: none, the first poll found
    the queue empty with no read before it): an answer a later poll finds came after it.
    A read just after the poll that found nothing would not bound that: a preemption
    between the two can hold the answer's arrival."""

    __slots__ = ("deadline", "last", "next", "pause_from")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.pause_from: float | None = None  # set at the first empty poll
        self.last = 0.0
        self.next = 0.0  # the newest clock read: it comes before the next poll

    def expired(self) -> bool:
        now = time.monotonic()
        self.last, self.next = self.next, now
        if now > self.deadline:
            return True
        if self.pause_from is None:
            self.pause_from = now + SPIN_S
        elif now > self.pause_from:
            time.sleep(PAUSE_S)
        return False


def mtu_enum(mtu_bytes: int) -> int:
    """Path MTU in bytes -> ibv_mtu (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5)."""
    return IB_MTUS.index(mtu_bytes) + 1


class VerbsError(ProbeError):
    """A verbs call failed; `errno` is kept so callers can tell unsupported from broken."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def verbs_error(what: str, err: PyverbsRDMAError) -> ProbeError:
    """A ProbeError for a failed verbs call: NotSupported, or VerbsError with its errno."""
    code = getattr(err, "error_code", None)
    if code in _UNSUPPORTED:
        return NotSupported(f"{what}: not supported here ({err})")
    return VerbsError(f"{what}: {err}", code)


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


# (sysfs root, IPv4) -> (device, gid index, when found): a responder or an agent resolves
# the same few addresses over and over, and each miss opens every device.
_GID_CACHE: dict[tuple[str, str], tuple[str, int, float]] = {}
GID_CACHE_TTL_S = 30.0


def device_for_address(ipv4: str, sysfs_root: str | Path = "/sys") -> tuple[str, int]:
    """(device, gid_index) of the RoCE v2 GID that maps IPV4: the address picks the path.

    Asks each device for its whole GID table in one call (ibv_query_gid_table) instead of
    reading sysfs, where soft-RoCE alone has 1,024 GID files per port."""
    key = (str(sysfs_root), ipv4)
    hit = _GID_CACHE.get(key)
    if hit is not None and time.monotonic() - hit[2] < GID_CACHE_TTL_S:
        return hit[0], hit[1]
    want = ipaddress.IPv4Address(ipv4)
    for name in list_device_names(sysfs_root):
        try:
            with Context(name=name) as ctx:
                size = ctx.query_port(PORT).gid_tbl_len
                entries = ctx.query_gid_table(size)
        except PyverbsRDMAError:
            continue
        for ent in entries:
            gid = ipaddress.IPv6Address(gid_to_ipv6(ent.gid_str()))
            if ent.gid_type == e.IBV_GID_TYPE_ROCE_V2 and gid.ipv4_mapped == want:
                _GID_CACHE[key] = (name, ent.gid_index, time.monotonic())
                return name, ent.gid_index
    _GID_CACHE.pop(key, None)
    raise SysfsError(f"no RDMA device has a RoCE v2 GID for {ipv4}")


class VerbsEndpoint:
    """The resource ladder every pyverbs endpoint climbs, as rdma-core's pyverbs tests
    build theirs: Context + PD, then two CQs, the MR and the QP from overridable
    `create_*` factories, then `describe()` for what is queried once the QP exists. An RC
    endpoint's `connect()` takes the QP to RTS (pyverbs takes a UD QP there itself).
    A failure on any rung releases what was built; `close()` releases QP, what hangs on
    the PD (address handles), MR, CQs, PD and context, children first (idempotent)."""

    KIND = "verbs"

    def __init__(self, device: str, depth: int, port: int = PORT) -> None:
        self.device, self.depth, self.port = device, depth, port
        self._closed = False
        self._extra: list[Any] = []  # resources made later on the PD (UD address handles)
        self._spin: Spin | None = None  # the newest poll() wait's
        self.ctx: Any = None
        self.pd: Any = None
        self.send_cq: Any = None
        self.recv_cq: Any = None
        self.mr: Any = None
        self.qp: Any = None
        try:
            self.ctx = Context(name=device)
            self.pd = PD(self.ctx)
            self.send_cq = self.create_cq()
            self.recv_cq = self.create_cq()
            self.mr = self.create_mr()
            self.qp = self.create_qp()
            self.describe()
        except PyverbsRDMAError as err:
            self.close()
            raise verbs_error(f"{device}: creating {self.KIND} resources", err) from err
        except BaseException:
            self.close()
            raise

    def create_cq(self) -> Any:
        return CQ(self.ctx, self.depth, None, None, 0)

    def create_mr(self) -> Any:
        raise NotImplementedError

    def create_qp(self) -> Any:
        raise NotImplementedError

    def describe(self) -> None:
        """Queries and set-up that need the QP (GID, MTU, pre-posted receives)."""

    def release_views(self) -> None:
        """Let go of views into the registered memory before it is deregistered."""

    def close(self) -> None:
        """Release every resource, children first. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.release_views()
        for res in (self.qp, *self._extra, self.mr, self.send_cq, self.recv_cq, self.pd, self.ctx):
            if res is not None:
                res.close()
        self._extra.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RcEndpoint(VerbsEndpoint):
    """One RC QP, its two CQs and a registered buffer of 2 x `size` bytes."""

    KIND = "RC"

    def __init__(
        self,
        device: str,
        size: int,
        depth: int = 64,
        gid_index: int | None = None,
        port: int = PORT,
        remote_access: bool = False,
        inline: int = 0,
    ) -> None:
        if not 1 <= size <= 1 << 30:
            raise ValueError(f"buffer size {size} outside 1..1 GiB")
        self.size = size
        self.access = e.IBV_ACCESS_LOCAL_WRITE
        if remote_access:
            self.access |= e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        self.inline = inline
        self.gid_index = gid_index if gid_index is not None else -1
        self.view: memoryview | None = None
        super().__init__(device, depth, port)
        self.psn = random.randrange(1 << 24)

    def create_mr(self) -> Any:
        return MR(self.pd, self.size * 2, self.access)

    def create_qp(self) -> Any:
        """The QP (left in INIT with the access flags) asking for `inline` bytes of inline
        data; fall back to none. Access flags are set at INIT: RTR/RTS do not change them."""
        for want in (self.inline, 0) if self.inline else (0,):
            cap = QPCap(
                max_send_wr=self.depth,
                max_recv_wr=self.depth,
                max_send_sge=1,
                max_recv_sge=1,
                max_inline_data=want,
            )
            init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.send_cq, rcq=self.recv_cq, cap=cap)
            try:
                attr = QPAttr()
                attr.qp_access_flags = self.access
                qp = QP(self.pd, init, attr)
            except PyverbsRDMAError:
                if want == 0:
                    raise
                continue
            self.inline = want
            return qp
        raise AssertionError("unreachable")

    def describe(self) -> None:
        if self.gid_index < 0:
            self.gid_index = roce_v2_gid_index(self.ctx, self.device, self.port)
        self.gid = str(self.ctx.query_gid(self.port, self.gid_index))
        self.active_mtu = IB_MTUS[int(self.ctx.query_port(self.port).active_mtu) - 1]
        # zero-copy views of the registered memory: [0, size) is sent, [size, 2 size) received
        size = self.size
        whole = (ctypes.c_char * (size * 2)).from_address(self.mr.buf)
        self.view = memoryview(whole).cast("B")
        self.send_buf = self.view[:size]
        self.recv_buf = self.view[size:]
        self._recv_wr = RecvWR(wr_id=2, num_sge=1, sg=[SGE(self.mr.buf + size, size, self.mr.lkey)])

    def release_views(self) -> None:
        for attr in ("send_buf", "recv_buf", "view"):
            v = getattr(self, attr, None)
            if v is not None:
                v.release()

    # -- connection -------------------------------------------------------------------
    def endpoint(self) -> RdmaEndpoint:
        """What the peer needs to reach this QP and write into the receive half."""
        return RdmaEndpoint(
            qpn=self.qp.qp_num,
            psn=self.psn,
            gid=gid_to_ipv6(self.gid),
            gid_index=self.gid_index,
            lid=0,
            rkey=self.mr.rkey,
            addr=self.mr.buf + self.size,
            mtu=self.active_mtu,
        )

    def connect(self, remote: RdmaEndpoint) -> None:
        """INIT -> RTR -> RTS towards REMOTE; the path MTU is the smaller active MTU."""
        attr = QPAttr()
        attr.path_mtu = mtu_enum(min(self.active_mtu, remote.mtu))
        attr.dest_qp_num = remote.qpn
        attr.rq_psn = remote.psn
        attr.sq_psn = self.psn
        attr.max_dest_rd_atomic = 1
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = 1  # 0.01 ms: a responder that is late to re-post is retried soon
        attr.timeout = ACK_TIMEOUT
        attr.retry_cnt = 7
        attr.rnr_retry = 7  # 7 = retry forever on RNR; the probe's own deadline bounds it
        route = GlobalRoute(
            dgid=GID(ipv6_to_gid(remote.gid)), sgid_index=self.gid_index, hop_limit=64
        )
        attr.ah_attr = AHAttr(gr=route, is_global=1, port_num=self.port)
        try:
            self.qp.to_rts(attr)
        except PyverbsRDMAError as err:
            raise verbs_error(f"{self.device}: QP {self.qp.qp_num} to RTS", err) from err

    # -- work requests (built once, posted many times) ----------------------------------
    def send_wr(self, length: int, signaled: bool = True) -> Any:
        flags = e.IBV_SEND_SIGNALED if signaled else 0
        if length <= self.inline:
            flags |= e.IBV_SEND_INLINE
        sge = SGE(self.mr.buf, length, self.mr.lkey)
        return SendWR(wr_id=1, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge], send_flags=flags)

    def write_wr(self, remote: RdmaEndpoint, length: int, signaled: bool = True) -> Any:
        flags = e.IBV_SEND_SIGNALED if signaled else 0
        if length <= self.inline:
            flags |= e.IBV_SEND_INLINE
        sge = SGE(self.mr.buf, length, self.mr.lkey)
        wr = SendWR(wr_id=3, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=flags)
        wr.set_wr_rdma(remote.rkey, remote.addr)
        return wr

    def read_wr(self, remote: RdmaEndpoint, length: int) -> Any:
        """A signaled RDMA READ of LENGTH bytes from REMOTE's receive half into ours."""
        sge = SGE(self.mr.buf + self.size, length, self.mr.lkey)
        wr = SendWR(
            wr_id=1, opcode=e.IBV_WR_RDMA_READ, num_sge=1, sg=[sge], send_flags=e.IBV_SEND_SIGNALED
        )
        wr.set_wr_rdma(remote.rkey, remote.addr)
        return wr

    def post(self, wr: Any) -> None:
        self.qp.post_send(wr)

    def post_recv(self) -> None:
        self.qp.post_recv(self._recv_wr)

    def poll(self, cq: Any, want: int, deadline: float) -> int:
        """Poll CQ until WANT completions arrived or DEADLINE (monotonic) passed.

        Returns how many arrived (fewer than WANT only at the deadline). An error
        completion raises PeerError: usually a peer that vanished (retries exceeded).
        `last_empty` keeps the wait's clock read before its last empty poll (Spin.last:
        monotonic s, 0 when there was none)."""
        got = 0
        spin = self._spin = Spin(deadline)
        while got < want:
            n, wcs = cq.poll(want - got)
            if n:
                for wc in wcs[:n]:
                    if wc.status != e.IBV_WC_SUCCESS:
                        raise PeerError(
                            f"{self.device}: completion error status {wc.status} "
                            f"(opcode {wc.opcode})"
                        )
                got += n
            elif spin.expired():
                break
        return got

    @property
    def last_empty(self) -> float:
        return self._spin.last if self._spin is not None else 0.0

    def poll_or_raise(self, cq: Any, want: int, deadline: float) -> None:
        got = self.poll(cq, want, deadline)
        if got < want:
            raise TimeoutError(
                f"{self.device}: {want - got} of {want} completions missing at the deadline"
            )


def gid_to_ipv6(sysfs_gid: str) -> str:
    """sysfs/pyverbs GID text (8 groups of 4 hex digits) -> IPv6 notation."""
    return str(ipaddress.IPv6Address(bytes.fromhex(sysfs_gid.replace(":", ""))))


def ipv6_to_gid(ipv6: str) -> str:
    """IPv6 notation -> the 8 groups of 4 hex digits pyverbs' GID takes."""
    raw = ipaddress.IPv6Address(ipv6).packed.hex()
    return ":".join(raw[i : i + 4] for i in range(0, 32, 4))
