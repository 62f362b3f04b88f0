"""Choosing each request's decode host: in turn, or by the fabric's price.

A disaggregated router sends a request's prefill to one host and its decode to another;
the KV cache then crosses the fabric between them. `RoundRobin` takes the decode hosts
in turn; `FabricRouter` asks the collector what moving this request's KV bytes to each
candidate costs now (fabricprobe/workload/price.py) and takes the one with the lowest
p99, then p50. Candidates whose price is unknown are passed over; when none is known it
goes in turn, and says so in the choice's reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fabricprobe.workload.price import KvCost

ROUTES = ("round-robin", "fabric")


class Named(Protocol):
    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class Choice:
    index: int  # into the candidates
    reason: str  # "round-robin", "fabric p99 1.234 ms", "round-robin (no price: ...)"


class RoundRobin:
    """Each prefill host's decode candidates in turn."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def choose(self, src: Named, candidates: Sequence[Named], nbytes: int) -> Choice:
        if not candidates:
            raise ValueError("no decode host to choose from")
        i = self._next.get(src.name, 0) % len(candidates)
        self._next[src.name] = i + 1
        return Choice(i, "round-robin")


class FabricRouter:
    """The candidate whose KV transfer the fabric prices lowest (p99, then p50)."""

    def __init__(self, price: Callable[[str, str, int], KvCost]) -> None:
        self.price = price
        self.fallback = RoundRobin()
        self.priced = 0  # choices made on a price
        self.unpriced = 0  # choices made in turn for want of one

    def choose(self, src: Named, candidates: Sequence[Named], nbytes: int) -> Choice:
        if not candidates:
            raise ValueError("no decode host to choose from")
        best: tuple[float, float, int] | None = None
        why = ""
        for i, dst in enumerate(candidates):
            if dst.name == src.name:
                continue  # no fabric between a host and itself: nothing to price
            c = self.price(src.name, dst.name, nbytes)
            if not c.known or c.p99_s is None or c.p50_s is None:
                why = why or c.reason
                continue
            key = (c.p99_s, c.p50_s, i)
            if best is None or key < best:
                best = key
        if best is None:
            self.unpriced += 1
            got = self.fallback.choose(src, candidates, nbytes)
            return Choice(got.index, f"round-robin (no price: {why[:120] or 'same host'})")
        self.priced += 1
        return Choice(best[2], f"fabric p99 {best[0] * 1e3:.3f} ms")
