"""One KV transfer joined with its path's fabric figures at its time, over an index of the
fabric history: the rule of attribution/join.py, one transfer at a time, no pandas.

`FabricIndex` holds the history's probe windows by path (src, dst, transport, and by
src, dst whatever the transport), each path's in the order they ended, with its floor
(the lowest RTT minimum) and its prober's floor, and the counter rates by host in the
order they were read (NIXL's apart). The history keeps one up to date as reports come
(collector/history.py); `from_frames` makes one of frames for the pure join. A lookup
reads the windows of one path around one time, never the whole history, so joining a
transfer costs the same whatever the fleet or the traffic.

A probe's RTT holds the prober's and the responder's host delay beside the network's.
Each agent measures its own: the same TCP probe against its own responder, turned around
in the loopback device (no NIC, no wire). What that reference takes beyond its quietest
window is this host's stack and scheduling delay for a prober and a responder both, so a
path's share is half of each end's. RDMA probes measure their prober's delay themselves,
on the path (software-timed: UD from the last empty poll of the receive CQ to the poll
that found the answer, probes/rdma/ud.py; RC from a clock read the wait took before its
answer came, probes/rdma/rc.py): where a path's windows carry it, what it takes beyond
the path's quietest prober delay is the prober end's estimate in full, in place of half
the prober's reference; the responder end keeps half its reference (a UD RTT has the
responder's processing taken out already, but not the time its loop took to see the
probe), and the far end of a one-sided RTT (an RDMA READ, which the far end's NIC answers)
has no share: where a path has one-sided windows, the join takes them. A window is
host-bound when the estimate is at least HOST_SHARE of what the path's RTT rose above its
own floor at its median, or when the prober's own delay, measured on the path, is that
share of its p99's rise (a prober spinning on a shared CPU sees most answers at once and
loses a slice now and then: its tail is the host's while its median is the path's). A
reference's tail is no such measure: a quiet host's loopback TCP has tens of µs of it, an
RDMA path's p99 a few.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd

from fabricprobe.collector.history import (
    COUNTER_CATEGORIES,
    NIXL_CATEGORY,
    CounterRate,
    FabricWindow,
)
from fabricprobe.collector.kvparts import ONE_SIDED_OP

NAN = math.nan
HOST_SHARE = 0.5
HOST_FLOOR_S = 20e-6  # host delay below this is noise of the reference itself
HOST_FIELDS = ["host_delay_s", "rtt_p50_net_s", "rtt_p99_net_s", "host_bound"]
PROBER_FIELDS = ["prober_delay_min_s", "prober_delay_p50_s", "prober_delay_p99_s"]
RATE_FIELDS = [f"{end}_{c}_per_s" for end in ("src", "dst") for c in COUNTER_CATEGORIES]
NIXL_FIELDS = [
    "nixl_bytes_per_s",
    "nixl_transfers_per_s",
    "nixl_mean_bytes",
    "nixl_mean_xfer_s",
    "nixl_speed_bytes_per_s",
    "nixl_errors_per_s",
]
# what join_transfer adds to a transfer, in the order join_fabric's frame has them
JOIN_FIELDS = [
    "rtt_min_s",
    "rtt_p50_s",
    "rtt_p99_s",
    "loss_ratio",
    "fabric_windows",
    *RATE_FIELDS,
    "bandwidth_bytes_per_s",
    *HOST_FIELDS,
    *NIXL_FIELDS,
]
NETDEV_CATEGORIES = ("pfc_pause", "ecn_mark")  # counted per netdev, whatever the device


def _num(v: Any) -> float:
    """A figure as a float, NaN for None or what is not a number."""
    try:
        return NAN if v is None else float(v)
    except (TypeError, ValueError):
        return NAN


def _known(values: Iterable[Any]) -> list[float]:
    return [x for x in (_num(v) for v in values) if x == x]


def _min(values: Iterable[Any]) -> float:
    got = _known(values)
    return min(got) if got else NAN


def _max(values: Iterable[Any]) -> float:
    got = _known(values)
    return max(got) if got else NAN


def _mean(values: Iterable[Any]) -> float:
    got = _known(values)
    return sum(got) / len(got) if got else NAN


def _end(w: FabricWindow) -> int:
    return w.end_ns


def _t(r: CounterRate) -> int:
    return r.t_ns


class FabricIndex:
    """Probe windows by path and counter rates by host, for one transfer's lookups."""

    def __init__(self) -> None:
        self.exact: dict[tuple[str, str, str], list[FabricWindow]] = {}
        self.any: dict[tuple[str, str], list[FabricWindow]] = {}
        self.rates: dict[str, list[CounterRate]] = {}  # by host, NIXL's apart
        self.nixl: dict[str, list[CounterRate]] = {}
        self._floors: dict[tuple[str, str, str], float] = {}
        self._prober_floors: dict[tuple[str, str], float] = {}

    @classmethod
    def from_frames(cls, windows: pd.DataFrame, rates: pd.DataFrame) -> FabricIndex:
        """An index of history frames (collector/history.py's windows_frame, rates_frame)."""
        out = cls()
        fields = list(FabricWindow.__dataclass_fields__)
        cols = [c for c in fields if c in windows.columns]
        for row in windows[cols].itertuples(index=False):
            out.add_window(FabricWindow(**dict(zip(cols, row, strict=True))))
        rfields = list(CounterRate.__dataclass_fields__)
        for row in rates[rfields].itertuples(index=False):
            out.add_rate(CounterRate(*row))
        return out

    def add_window(self, w: FabricWindow) -> None:
        _insert(self.exact.setdefault((w.src, w.dst, w.transport), []), w, _end)
        _insert(self.any.setdefault((w.src, w.dst), []), w, _end)
        self._floors.pop((w.src, w.dst, w.transport), None)
        self._prober_floors.pop((w.src, w.dst), None)

    def drop_window(self, w: FabricWindow) -> None:
        """Forget W (the history let go of it)."""
        exact, both = (w.src, w.dst, w.transport), (w.src, w.dst)
        if _remove(self.exact.get(exact), w):
            del self.exact[exact]
        if _remove(self.any.get(both), w):
            del self.any[both]
        self._floors.pop(exact, None)
        self._prober_floors.pop(both, None)

    def add_rate(self, r: CounterRate) -> None:
        table = self.nixl if r.category == NIXL_CATEGORY else self.rates
        _insert(table.setdefault(r.host, []), r, _t)

    def drop_rate(self, r: CounterRate) -> None:
        table = self.nixl if r.category == NIXL_CATEGORY else self.rates
        if _remove(table.get(r.host), r):
            del table[r.host]

    def floor(self, key: tuple[str, str, str]) -> float:
        """The lowest RTT minimum of path KEY's windows."""
        got = self._floors.get(key)
        if got is None:
            ws = self.exact.get(key)
            if ws is None:
                return NAN  # no window: nothing kept for it
            got = self._floors[key] = _min(w.rtt_min_s for w in ws)
        return got

    def prober_floor(self, key: tuple[str, str]) -> float:
        """The lowest prober delay of the windows from KEY's prober to its responder (UD
        probes, whatever the transport asked)."""
        got = self._prober_floors.get(key)
        if got is None:
            ws = self.any.get(key)
            if ws is None:
                return NAN
            got = self._prober_floors[key] = _min(w.prober_delay_min_s for w in ws)
        return got

    def path(self, src: str, dst: str, transport: str) -> list[FabricWindow]:
        """The windows of path SRC -> DST (TRANSPORT's when given), else of the reverse
        direction (an RTT crosses both), else none."""
        if transport:
            fwd = self.exact.get((src, dst, transport))
            rev = self.exact.get((dst, src, transport))
        else:
            fwd, rev = self.any.get((src, dst)), self.any.get((dst, src))
        return fwd or rev or []

    def first_rates(
        self, host: str, start_ns: int, end_ns: int, *, nixl: bool = False
    ) -> list[CounterRate]:
        """HOST's readings from START_NS to END_NS, the first of each counter."""
        got = (self.nixl if nixl else self.rates).get(host)
        if not got:
            return []
        i = bisect.bisect_left(got, start_ns, key=_t)
        seen: dict[tuple[str, str], CounterRate] = {}
        for r in got[i:]:
            if r.t_ns > end_ns:
                break
            seen.setdefault((r.device, r.name), r)
        return list(seen.values())


def _insert(rows: list[Any], row: Any, key: Callable[[Any], int]) -> None:
    """ROW into ROWS, kept in KEY's order (rows come in that order, as a rule)."""
    if not rows or key(rows[-1]) <= key(row):
        rows.append(row)
    else:
        bisect.insort_right(rows, row, key=key)


def _remove(rows: list[Any] | None, row: Any) -> bool:
    """Take ROW (that very object) out of ROWS (the oldest first, as a rule); whether
    ROWS is left empty."""
    if rows is None:
        return False
    for i, r in enumerate(rows):
        if r is row:
            del rows[i]
            break
    return not rows


def windows_over(
    ws: list[FabricWindow], start_ns: int, end_ns: int, slack: int, horizon: int
) -> list[FabricWindow]:
    """WS's windows (in the order they ended) overlapping [START, END] (SLACK either
    side); with none, the first that ended after END, within HORIZON (a gap, or a first
    window's estimated start)."""
    i = bisect.bisect_left(ws, start_ns - slack, key=_end)
    over = [w for w in ws[i:] if w.start_ns <= end_ns + slack]
    if over or not ws:
        return over
    j = bisect.bisect_left(ws, end_ns, key=_end)
    return [ws[j]] if j < len(ws) and ws[j].end_ns <= end_ns + horizon else []


def rtt_probes(ws: list[FabricWindow]) -> list[FabricWindow]:
    """WS's windows of one kind of probe: one-sided ones (ONE_SIDED_OP) where there are
    any, as a KV transfer's own READs and WRITEs have no far-end software in their round
    trips either; of those, the smallest probe size: the path's RTT per round trip. A
    larger probe's RTT carries its own serialization, which a transfer's bytes are
    charged for apart (at the path's bandwidth), so a fleet probing several sizes counts
    it once."""
    if not ws:
        return ws
    one_sided = [w for w in ws if w.op == ONE_SIDED_OP]
    ws = one_sided or ws
    size = min(w.size for w in ws)
    return [w for w in ws if w.size == size]


def host_excess(
    index: FabricIndex, host: str, start_ns: int, end_ns: int, slack: int, horizon: int
) -> tuple[float, float]:
    """(p50, p99) of HOST's reference over [START, END] beyond its floor; NaN if none."""
    key = (host, host, "tcp")
    ref = index.exact.get(key)
    if not ref:
        return NAN, NAN
    w = windows_over(ref, start_ns, end_ns, slack, horizon)
    if not w:
        return NAN, NAN
    floor = index.floor(key)
    return (
        max(0.0, _mean(x.rtt_p50_s for x in w) - floor),
        max(0.0, _max(x.rtt_p99_s for x in w) - floor),
    )


def prober_excess(index: FabricIndex, w: list[FabricWindow]) -> tuple[str, float, float]:
    """(prober host, p50, p99) of the prober's own delay in windows W (one path) beyond
    the path's quietest prober delay; NaN figures when W carries none."""
    if not w:
        return "", NAN, NAN
    prober, dst = w[0].src, w[0].dst
    own = _known(x.prober_delay_p50_s for x in w)
    floor = index.prober_floor((prober, dst)) if own else NAN
    if math.isnan(floor):
        return prober, NAN, NAN
    return (
        prober,
        max(0.0, sum(own) / len(own) - floor),
        max(0.0, _max(x.prober_delay_p99_s for x in w) - floor),
    )


def dominates(delay: float, rise: float) -> bool:
    """Whether the hosts' DELAY accounts for a rise of RISE above the path's floor (and is
    more than the reference's own noise)."""
    return bool(delay >= HOST_FLOOR_S and delay >= HOST_SHARE * rise)


def nixl_figures(index: FabricIndex, host: str, start_ns: int, end_ns: int) -> dict[str, float]:
    """NIXL rates of one host for the counter window a transfer ran in (NaN: none)."""
    out = dict.fromkeys(NIXL_FIELDS, NAN)
    first = index.first_rates(host, start_ns, end_ns, nixl=True)
    if not first:
        return out
    per: dict[str, float] = {}
    for r in first:
        per[r.name] = per.get(r.name, 0.0) + r.rate
    nbytes, n = per.get("bytes", NAN), per.get("transfers", NAN)
    busy = per.get("xfer_time_us", NAN) / 1e6  # transfer seconds per second
    out["nixl_bytes_per_s"] = float(nbytes)
    out["nixl_transfers_per_s"] = float(n)
    out["nixl_errors_per_s"] = float(per.get("errors", NAN))
    if n and n > 0:
        out["nixl_mean_bytes"] = float(nbytes / n)
        out["nixl_mean_xfer_s"] = float(busy / n)
    if busy and busy > 0:
        out["nixl_speed_bytes_per_s"] = float(nbytes / busy)
    return out


def _counter_rates(
    index: FabricIndex, end: str, host: str, device: str, start_ns: int, until_ns: int
) -> dict[str, float]:
    first = index.first_rates(host, start_ns, until_ns)
    if device:
        # RDMA counters are per device; netdev ones (PFC, ECN) stay whatever device
        first = [r for r in first if r.device == device or r.category in NETDEV_CATEGORIES]
    per: dict[str, float] = {}
    for r in first:
        per[r.category] = per.get(r.category, 0.0) + r.rate
    return {f"{end}_{c}_per_s": per.get(c, NAN) if first else NAN for c in COUNTER_CATEGORIES}


def join_transfer(
    index: FabricIndex,
    stage: Any,
    *,
    slack: int,
    horizon: int,
    bandwidth: float | None,
) -> dict[str, float]:
    """JOIN_FIELDS of one KV transfer STAGE (src, dst, devices, transport, start_ns,
    end_ns: a StageRecord or a frame's row) with the figures of its path over its time
    (attribution/join.py's join_fabric says what each is). BANDWIDTH: the path's."""
    src, dst, start, end = stage.src, stage.dst, int(stage.start_ns), int(stage.end_ns)
    out: dict[str, float] = {"bandwidth_bytes_per_s": float(bandwidth) if bandwidth else NAN}
    # NIXL counts a transfer where it is posted: the decode side reads remote KV
    nx = dict.fromkeys(NIXL_FIELDS, NAN)
    for host in (dst, src):
        if index.nixl.get(host):
            nx = nixl_figures(index, host, start, end + horizon)
            if not math.isnan(nx["nixl_bytes_per_s"]):
                break
    pw = index.path(src, dst, stage.transport)
    w = rtt_probes(windows_over(pw, start, end, slack, horizon))
    rmin, p50 = _min(x.rtt_min_s for x in w), _mean(x.rtt_p50_s for x in w)
    p99 = _max(x.rtt_p99_s for x in w)
    out.update(
        rtt_min_s=rmin, rtt_p50_s=p50, rtt_p99_s=p99, fabric_windows=float(len(w)),
        loss_ratio=_mean(x.loss_ratio for x in w),
    )  # fmt: skip
    # each end's share: the prober's own delay where its windows carry one, else half
    # its reference
    prober, own50, own99 = prober_excess(index, w)
    ends = []
    measured99 = NAN  # the prober's own tail, where it measured it on the path
    one_sided = bool(w) and w[0].op == ONE_SIDED_OP
    for h in (src, dst):
        if h == prober and not math.isnan(own50):
            ends.append((own50, own99))
            measured99 = own99
        elif one_sided and h != prober:
            ends.append((0.0, 0.0))  # the far end's NIC answered: none of its host's delay
        else:
            e = host_excess(index, h, start, end, slack, horizon)
            ends.append((e[0] / 2, e[1] / 2))
    known = [e for e in ends if not math.isnan(e[0])]
    delay = sum(e[0] for e in known) if known else NAN
    delay99 = sum(e[1] for e in known) if known else NAN
    floor = _min(x.rtt_min_s for x in pw if x.size == w[0].size and x.op == w[0].op) if w else NAN
    rise, rise99 = p50 - floor, p99 - floor
    out["host_delay_s"] = delay
    out["rtt_p50_net_s"] = max(rmin, p50 - delay) if known and w else p50
    out["rtt_p99_net_s"] = max(rmin, p99 - delay99) if known and w else p99
    out["host_bound"] = (
        float(dominates(delay, rise) or dominates(measured99, rise99))
        if known and w and not math.isnan(rise)
        else NAN
    )
    for end_name, host, device in (("src", src, stage.src_device), ("dst", dst, stage.dst_device)):
        out.update(_counter_rates(index, end_name, host, device, start, end + horizon))
    out.update(nx)
    return out
