"""Covering the links: every directed link of the known fabric crossed by at least K
probed classes (K = 2: one bad class is noise, two that share only this link are a
finding).

Two figures. `coverage()` counts, from the class paths the collector learned, how many
classes cross each link and which fall short of K. `classes_per_leaf()` says how many
classes must leave each leaf of a 2-tier fabric for its uplinks to be covered when the
switches hash each class onto a spine at random (as ECMP does; one class a QP, its port
fixed by the driver): the counts on S uplinks are multinomial, and the smallest C for
which every uplink gets K with probability P is found exactly (not by sampling) from
the multinomial's occupancy recursion. Where classes can be picked after tracing them
(the UDP way chooses its ports), K x S per leaf is enough; the random figure is what
QPs with driver-chosen ports cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

K = TypeVar("K")


def coverage(
    paths: Mapping[K, Sequence[str]], links: Iterable[str], k: int = 2
) -> tuple[dict[str, int], list[str]]:
    """(classes crossing each link, the links crossed by fewer than K)."""
    counts = {link: 0 for link in links}
    for path in paths.values():
        for link in dict.fromkeys(path):
            counts[link] = counts.get(link, 0) + 1
    return counts, sorted(link for link, n in counts.items() if n < k)


def cover_probabilities(max_classes: int, spines: int, k: int) -> np.ndarray:
    """P(each of SPINES uplinks gets at least K of C classes hashed uniformly), for every
    C in 0..MAX_CLASSES: the occupancy recursion over uplinks, q_j(n) = sum over m >= K
    of Binomial(n, 1/j)(m) q_{j-1}(n - m), in floats that stay within [0, 1]."""
    n = np.arange(max_classes + 1)
    logfact = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, max_classes + 1)))))
    q = (n == 0).astype(float)  # no uplink: covered only with no class left over
    for j in range(1, spines + 1):
        p = 1.0 / j
        new = np.zeros(max_classes + 1)
        for total in range(k, max_classes + 1):
            m = np.arange(k, total + 1)  # classes on the j-th uplink
            logpmf = logfact[total] - logfact[m] - logfact[total - m] + m * np.log(p)
            if j > 1:
                logpmf += (total - m) * np.log1p(-p)
            else:
                logpmf = np.where(m == total, 0.0, -np.inf)  # one uplink takes all
            new[total] = float(np.sum(np.exp(logpmf) * q[total - m]))
        q = new
    return q


@dataclass(frozen=True)
class CoverCost:
    spines: int
    leaves: int
    hosts: int
    k: int
    p: float
    random_per_leaf: int  # classes leaving a leaf with QP-chosen ports
    chosen_per_leaf: int  # with ports picked after tracing: K x spines
    probes_per_class: int  # per window
    window_s: float

    def rate(self, per_leaf: int) -> float:
        """Fabric-wide probes per second for PER_LEAF classes out of every leaf."""
        return self.leaves * per_leaf * self.probes_per_class / self.window_s

    def per_host(self, per_leaf: int) -> float:
        return per_leaf / max(1, self.hosts // self.leaves)


def classes_per_leaf(spines: int, k: int = 2, p: float = 0.99, limit: int = 20_000) -> int:
    """The least C with P(every uplink of a leaf gets >= K of C random classes) >= P."""
    top = max(4 * k * spines, 64)
    while True:
        got = np.nonzero(cover_probabilities(top, spines, k) >= p)[0]
        if got.size:
            return int(got[0])
        if top >= limit:
            raise ValueError(f"more than {limit} classes per leaf")
        top = min(limit, top * 2)


def cover_cost(
    hosts: int,
    spines: int,
    hosts_per_leaf: int,
    k: int = 2,
    p: float = 0.99,
    probes_per_class: int = 100,
    window_s: float = 10.0,
) -> CoverCost:
    leaves = math.ceil(hosts / hosts_per_leaf)
    return CoverCost(
        spines=spines,
        leaves=leaves,
        hosts=hosts,
        k=k,
        p=p,
        random_per_leaf=classes_per_leaf(spines, k, p),
        chosen_per_leaf=k * spines,
        probes_per_class=probes_per_class,
        window_s=window_s,
    )
