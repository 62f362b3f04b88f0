"""Which link: tomography over the probed ECMP classes.

Each class (a prober, a peer, a UDP source port) crosses a known list of directed links:
its probe's way out, and where it is known, its answer's way back (the responder's own
source port, traced from the peer). Each window a class is *bad* when its median RTT
rose over its own baseline by more than its noise and a floor, and *good* otherwise. A
class whose window was host-bound (the prober's own delay holds most of the rise) is
neither: a busy host never makes a link suspect.

A link is suspect when the classes that cross it went bad and those that avoid it did
not. The ranking is greedy, as Boolean tomography explains failures: the link crossed
by the most bad classes (and few good ones) is named first, the bad classes it explains
are set aside, and the next link must explain others. Loss is too sparse to make a
class bad on its own (2 % of a window's 40 probes is one loss or none), so it has a
greedy pass of its own on the counts of each class's newest `loss_windows` windows: a
link whose classes lost far more than the classes that avoid it, beyond what chance
gives at the others' rate. Every link gets its evidence: classes through it, how many
went bad, the median rise of those through it and their loss.

Baselines: a class's baseline is the median of its last good windows' medians, and its
noise their median absolute deviation; a bad window does not enter it, so a link that
stays bad stays named.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple


class ClassKey(NamedTuple):
    src: str  # prober host
    dst: str  # peer host
    sport: int  # UDP source port of the probes
    rail: int | None = None  # the rail its devices are on (None: off the rails)


@dataclass(frozen=True)
class LocalizeConfig:
    min_rise_s: float = 0.0002  # a rise below this is never bad, whatever the noise
    noise_k: float = 4.0  # ... nor one below this many baseline deviations
    min_loss: float = 0.0  # a class that lost more than this share of its probes is bad
    baseline_windows: int = 8  # good windows a baseline is the median of
    warmup_windows: int = 2  # a class needs this many before it can be bad
    host_bound_share: float = 0.5  # prober delay over this share of the rise: host-bound
    min_bad: int = 2  # bad classes a suspect link explains, at least
    max_good_share: float = 0.25  # good classes among those through a suspect, at most
    fresh_s: float = 30.0  # a class's newest window counts while it is this young
    # a class's loss is counted over its newest this many windows (those still fresh):
    # at 2 % a link's classes lose a handful of probes a window, too few to tell from
    # chance in one window more often than not
    loss_windows: int = 2

    def __post_init__(self) -> None:
        if self.min_rise_s < 0 or self.noise_k < 0 or not 0 <= self.min_loss < 1:
            raise ValueError("min_rise_s, noise_k >= 0 and 0 <= min_loss < 1")
        if self.baseline_windows < 2 or self.warmup_windows < 1 or self.min_bad < 1:
            raise ValueError("baseline_windows >= 2, warmup_windows >= 1, min_bad >= 1")
        if not 1 <= self.loss_windows <= 16:
            raise ValueError("1 <= loss_windows <= 16")
        if not 0 <= self.max_good_share < 1 or not 0 < self.host_bound_share <= 1:
            raise ValueError("0 <= max_good_share < 1, 0 < host_bound_share <= 1")


@dataclass(frozen=True)
class ClassWindow:
    """One class's figures in one window."""

    key: ClassKey
    end_s: float  # the window's end (unix seconds)
    p50_s: float | None  # median RTT (None: no answer at all)
    sent: int  # probes with an outcome: answered + lost
    lost: int
    prober_p50_s: float = 0.0  # the prober's own median delay inside the RTTs


@dataclass
class _Class:
    good: deque[float]
    counts: deque[tuple[float, int, int]]  # the newest windows' (end_s, sent, lost)
    last: ClassWindow | None = None
    rise_s: float = 0.0
    bad: bool = False
    host_bound: bool = False
    windows: int = 0


@dataclass(frozen=True)
class LinkVerdict:
    """One link's evidence and rank (the Query API's LinkVerdict, field for field)."""

    link: str
    rank: int
    suspect: bool
    classes: int  # fresh classes through it
    bad_classes: int  # of those, the ones that rose or lost
    rtt_rise_s: float  # median rise of the classes through it
    loss: float  # lost / sent of the classes through it
    rail: int | None = None


@dataclass
class LocalizeStats:
    windows: int = 0
    bad: int = 0
    host_bound: int = 0
    unplaced: int = 0  # windows of classes whose links are not known
    by_reason: dict[str, int] = field(default_factory=dict)


class Localizer:
    """Class baselines, each class's newest verdict, and the links ranked from them."""

    def __init__(self, config: LocalizeConfig | None = None, max_classes: int = 200_000) -> None:
        self.config = config or LocalizeConfig()
        self.max_classes = max_classes
        self._lock = threading.Lock()
        self._classes: dict[ClassKey, _Class] = {}
        self.stats = LocalizeStats()

    def observe(self, w: ClassWindow) -> bool:
        """Take one class window; True when the class is bad in it."""
        cfg = self.config
        with self._lock:
            c = self._classes.get(w.key)
            if c is None:
                if len(self._classes) >= self.max_classes:
                    self.stats.by_reason["class table full"] = (
                        self.stats.by_reason.get("class table full", 0) + 1
                    )
                    return False
                c = self._classes[w.key] = _Class(
                    good=deque(maxlen=cfg.baseline_windows),
                    counts=deque(maxlen=cfg.loss_windows),
                )
            self.stats.windows += 1
            c.last, c.windows = w, c.windows + 1
            c.counts.append((w.end_s, w.sent, w.lost))
            c.rise_s, c.bad, c.host_bound = 0.0, False, False
            lossy = w.sent > 0 and w.lost / w.sent > cfg.min_loss and w.lost > 0
            if w.p50_s is not None and len(c.good) >= cfg.warmup_windows:
                base = statistics.median(c.good)
                noise = statistics.median(abs(x - base) for x in c.good)
                c.rise_s = max(0.0, w.p50_s - base)
                risen = c.rise_s > max(cfg.min_rise_s, cfg.noise_k * noise)
                if risen and w.prober_p50_s > cfg.host_bound_share * c.rise_s:
                    c.host_bound = True
                    self.stats.host_bound += 1
                    return False
                c.bad = risen
            if c.bad:
                self.stats.bad += 1
            elif w.p50_s is not None and not lossy:
                c.good.append(w.p50_s)
            return c.bad

    def forget(self, keys: Iterable[ClassKey]) -> None:
        with self._lock:
            for k in keys:
                self._classes.pop(k, None)

    def rank(
        self,
        paths: Mapping[ClassKey, Sequence[str]],
        now_s: float,
        links: Iterable[str] = (),
        rail_of: Mapping[str, int | None] | None = None,
    ) -> list[LinkVerdict]:
        """Every link crossed by a fresh class (and every one of LINKS), ranked: the
        suspects first, in the order they explain the bad classes, then the rest by the
        share of bad classes through them."""
        cfg = self.config
        with self._lock:
            fresh: dict[ClassKey, _Fresh] = {
                k: (c.bad, c.rise_s, _counted(c.last, c.counts, now_s - cfg.fresh_s))
                for k, c in self._classes.items()
                if c.last is not None
                and not c.host_bound
                and now_s - c.last.end_s <= cfg.fresh_s
                and k in paths
            }
        through: dict[str, list[ClassKey]] = {link: [] for link in links}
        for k in fresh:
            for link in dict.fromkeys(paths[k]):
                through.setdefault(link, []).append(k)
        suspects = self._explain_rises(through, fresh)
        for link in self._explain_losses(through, fresh):
            if link not in suspects:
                suspects.append(link)
        out = []
        for link, ks in through.items():
            rises = [fresh[k][1] for k in ks]
            sent = sum(fresh[k][2].sent for k in ks)
            lost = sum(fresh[k][2].lost for k in ks)
            out.append(
                LinkVerdict(
                    link=link,
                    rank=0,
                    suspect=link in suspects,
                    classes=len(ks),
                    bad_classes=sum(1 for k in ks if fresh[k][0] or fresh[k][2].lost),
                    rtt_rise_s=statistics.median(rises) if rises else 0.0,
                    loss=lost / sent if sent else 0.0,
                    rail=(rail_of or {}).get(link),
                )
            )
        order = {link: i for i, link in enumerate(suspects)}
        out.sort(
            key=lambda v: (
                order.get(v.link, len(order)),
                -(v.bad_classes / v.classes if v.classes else 0.0),
                -v.loss,
                -v.rtt_rise_s,
                v.link,
            )
        )
        return [LinkVerdict(**{**v.__dict__, "rank": i + 1}) for i, v in enumerate(out)]

    def _explain_rises(
        self, through: Mapping[str, list[ClassKey]], fresh: Mapping[ClassKey, _Fresh]
    ) -> list[str]:
        """Greedy over the classes whose RTT rose: the link crossed by the most of them
        (with few classes through it that did not rise) first, then one that explains
        others. A link whose risen classes all cross another link that more risen
        classes cross is not named: the other explains them and more. (While a fault is
        new, a window holds it in part: the faulty link has some classes risen and some
        not yet, too many good ones to be named, and a link after it with fewer classes
        can have all of its few risen; it is named a window later, or never.)"""
        cfg = self.config
        left = {k for k, (bad, _, _) in fresh.items() if bad}
        links_of: dict[ClassKey, list[str]] = {}
        for link, ks in through.items():
            for k in ks:
                if k in left:
                    links_of.setdefault(k, []).append(link)
        suspects: list[str] = []
        while left:
            risen = {link: {k for k in ks if k in left} for link, ks in through.items()}
            best: tuple[int, int, str] | None = None
            for link, ks in through.items():
                if link in suspects:
                    continue
                mine = risen[link]
                nb = len(mine)
                ng = sum(1 for k in ks if not fresh[k][0])
                if nb < cfg.min_bad or ng > cfg.max_good_share * (nb + ng):
                    continue
                # a link that crosses all of MINE crosses any one of them: look no further
                anyone = next(iter(mine))
                if any(
                    o != link and len(risen[o]) > nb and mine <= risen[o] for o in links_of[anyone]
                ):
                    continue
                if best is None or (nb, -ng, link) > best:
                    best = (nb, -ng, link)
            if best is None:
                break
            suspects.append(best[2])
            left -= set(through[best[2]])
        return suspects

    def _explain_losses(
        self, through: Mapping[str, list[ClassKey]], fresh: Mapping[ClassKey, _Fresh]
    ) -> list[str]:
        """Greedy over the probes lost: loss is sparse (2 % of 40 probes is one or none
        per class and window), so it is judged on the counts of the classes through a
        link against those of the classes that avoid it. A link is a suspect when its
        classes lost at least MIN_LOST probes, at a rate over min_loss and LOSS_FACTOR
        times the others', and so large a share of all the losses would fall on its
        probes by chance (each loss landing on a probe at random) less often than
        LOSS_P. The one that lost most is named, its classes are set aside, and the next
        must explain what is left.

        Two links can hold the very same losing classes (early in a fault a handful of
        losses can all fall on the classes an uplink and the downlink after it share):
        then the counts tell them apart only by their clean probes. L losses on the S
        probes of one link and none on the S' - S more of the other are (S'/S)^L times as
        likely were the smaller link the lossy one; it is named only when that is e^LOSS_LR
        or more, and otherwise neither is until more losses come."""
        cfg = self.config
        left = {k for k, (_, _, w) in fresh.items() if w.sent}
        suspects: list[str] = []
        undecided: set[str] = set()  # links the counts cannot tell apart yet
        while True:
            total_lost = sum(fresh[k][2].lost for k in left)
            total_sent = sum(fresh[k][2].sent for k in left)
            if total_lost < MIN_LOST:
                return suspects
            passed: list[tuple[int, float, str, int, frozenset[ClassKey]]] = []
            for link, ks in through.items():
                if link in suspects or link in undecided:
                    continue
                mine = [k for k in ks if k in left]
                lost = sum(fresh[k][2].lost for k in mine)
                sent = sum(fresh[k][2].sent for k in mine)
                other_sent = total_sent - sent
                if lost < MIN_LOST or not sent or not other_sent:
                    continue
                rate, others = lost / sent, (total_lost - lost) / other_sent
                if rate <= max(cfg.min_loss, LOSS_FACTOR * others):
                    continue
                # were the losses spread over all probes alike, this link's share of them
                # would follow its share of the probes
                if binomial_tail(lost, total_lost, sent / total_sent) > LOSS_P:
                    continue
                losing = frozenset(k for k in mine if fresh[k][2].lost)
                passed.append((lost, rate, link, sent, losing))
            if not passed:
                return suspects
            lost, _, link, sent, losing = max(passed, key=lambda c: c[:3])
            twins = [c for c in passed if c[2] != link and c[4] == losing]
            if twins and lost * math.log(min(c[3] for c in twins) / sent) < LOSS_LR:
                undecided.update(c[2] for c in twins)
                undecided.add(link)
                left -= losing  # what they lost names no other link either
                continue
            suspects.append(link)
            left -= set(through[link])


_Fresh = tuple[bool, float, ClassWindow]


def _counted(
    last: ClassWindow, counts: Iterable[tuple[float, int, int]], since_s: float
) -> ClassWindow:
    """LAST with the probes sent and lost of the COUNTS that ended after SINCE_S."""
    sent = lost = 0
    for end, n, k in counts:
        if end >= since_s:
            sent, lost = sent + n, lost + k
    return replace(last, sent=sent, lost=lost)


MIN_LOST = 3  # probes lost through a link before loss can name it
LOSS_FACTOR = 3.0  # its classes' loss rate over the others', at least
LOSS_P = 2e-4  # chance of so large a share of the losses by chance, at most
LOSS_LR = 3.0  # log of how much likelier one of two links with the same losses must be


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= K) for X ~ Binomial(N, P), summed in logs from K up (N is a window's
    probes through one link: thousands at most)."""
    if k <= 0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k, n + 1):
        term = math.exp(
            math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        )
        total += term
        if term < 1e-18 * max(total, 1e-300):
            break
    return min(1.0, total)
