"""Where an engine trace's spans belong among collector shards: the owner of its path.

A KV transfer's path is prefill host -> decode host, and its probe windows live on the
shard that owns the path's source, the prefill host (fabricprobe.core.shards: rendezvous
hashing of the host name). Disaggregated engines send their two sides apart, one
process each, so a side's spans alone often cannot say where the path starts: the
decode side of vLLM, SGLang and Dynamo names no prefill host (only llm-d's routing
sidecar does, in `llm_d.pd_proxy.prefill_target`).

Both sides of one request share its trace id whenever the proxy or router in front
propagates the trace context (SGLang's decode side continues the bootstrap room's
context; Dynamo's frontend and llm-d's sidecar parent both sides; vLLM's proxy forwards
`traceparent`). So routing takes two steps. The shard that owns the trace id (the same
hash) gathers the trace's engine spans: `PathRelay` keeps their fragments
(attribution/engines/) and decides the path's source as the join does
(attribution/linking.py: the side that says it is the prefill side, else the first of
two sides; the prefill target a sidecar names; a lone side whose request asked for one
token, which is how a prefill/decode proxy calls the prefill side). Once decided, every
span of that trace held so far, and every later one, goes to the source's owner.

Spans whose path is still open wait up to `hold_s` (a side that arrives before the one
that names the path); then each side goes to the owner of its own host and is counted
`unpaired` (a decode side whose prefill side never came, or an engine serving alone).
A trace that arrives after its hold ran out is decided again with everything seen.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fabricprobe.collector.attribution.engines import read_engine_span
from fabricprobe.collector.attribution.engines.common import Fragment
from fabricprobe.collector.attribution.linking import HostDirectory, pick, proxy_prefill, sides_of
from fabricprobe.collector.attribution.spanattrs import SpanError

MAX_TRACES = 50_000  # traces remembered (decided or waiting); the oldest go first
MAX_HELD_SPANS = 20_000  # spans waiting for their path; beyond it the oldest go on unpaired
MAX_FRAGMENTS = 64  # per trace: a trace this long is decided on what it has
ROUTE_RESULTS = ("src_host", "path", "unpaired", "resource")


@dataclass
class Item:
    """One span waiting, with what is needed to send it on."""

    resource: Any  # opentelemetry Resource (protobuf), shared by the spans of one batch
    schema_url: str
    scope: Any  # InstrumentationScope
    scope_url: str
    span: Any
    hints: tuple[tuple[str, str], ...]  # where it ran, for the unpaired case
    group: tuple[int, int, int]  # (batch, resource, scope): spans that came together


@dataclass
class _Trace:
    first_ns: int
    frags: list[Fragment] = field(default_factory=list)
    held: list[Item] = field(default_factory=list)
    held_since_ns: int = 0
    decided: bool = False
    host: str | None = None  # the path's source (None: decided, not a fleet host)


def engine_fragment(span: Any, resource: dict[str, Any], scope: str) -> Fragment | None:
    """The fragment of an engine span as the receiver reads it (attribution/otlp.py); None
    for spans that are no engine's, fabricprobe's own, or malformed."""
    try:
        return read_engine_span(span, resource, scope)[0]
    except SpanError:
        return None


def path_source(frags: list[Fragment], hosts: HostDirectory) -> tuple[bool, str | None]:
    """(decided, prefill host) of one trace's fragments: decided False while a side that
    would name the path may still come; the host None when decided but not a fleet host."""
    engine, proxy = sides_of(frags)
    got, _ = proxy_prefill(proxy, hosts)  # llm-d: the sidecar names the prefill target
    if got is not None:
        return True, got
    if not engine:
        return False, None
    pre, _, _ = pick(engine)
    if pre is None and len(engine) == 1:
        req = engine[0].request()
        if not engine[0].role and req is not None and req.max_tokens == 1:
            pre = engine[0]  # a proxy's prefill call: one token asked for
    if pre is None:
        return False, None
    return True, hosts.resolve(pre.hints())[0]


Emit = Callable[[str | None, list[Item], str], None]  # (host or None, items, result)


class PathRelay:
    """Engine traces gathered on the shard that owns their trace id, until their path is
    known (see the module docstring). EMIT sends items towards the owner of a host
    (None: keep here) and counts them under a result of ROUTE_RESULTS."""

    def __init__(
        self,
        emit: Emit,
        directory: Callable[[], HostDirectory],
        clock: Callable[[], int],
        *,
        hold_s: float = 10.0,
        max_traces: int = MAX_TRACES,
        max_held: int = MAX_HELD_SPANS,
    ) -> None:
        self.emit, self.directory, self.clock = emit, directory, clock
        self.hold_ns = int(hold_s * 1e9)
        self.max_traces, self.max_held = max_traces, max_held
        self.lock = threading.Lock()
        self.traces: OrderedDict[bytes, _Trace] = OrderedDict()
        self.waiting: OrderedDict[bytes, None] = OrderedDict()  # traces holding spans, oldest first
        self.held = 0

    def add(self, trace_id: bytes, items: list[Item], frags: list[Fragment]) -> None:
        """Take ITEMS (spans of one trace, FRAGS their engine fragments)."""
        out: list[tuple[str | None, list[Item], str]] = []
        with self.lock:
            now = self.clock()
            t = self.traces.get(trace_id)
            if t is None:
                t = self.traces[trace_id] = _Trace(now)
            if not t.decided:
                room = MAX_FRAGMENTS - len(t.frags)
                t.frags.extend(frags[: max(0, room)])
                t.decided, t.host = path_source(t.frags, self.directory())
                if not t.decided and room <= 0:
                    t.decided = True  # too long to wait on: each side by its own host
            if t.decided:
                out.append((t.host, t.held + items, "path"))
                self.held -= len(t.held)
                t.held, t.frags = [], []
                self.waiting.pop(trace_id, None)
            else:
                if not t.held:
                    t.held_since_ns = now
                    self.waiting[trace_id] = None
                t.held.extend(items)
                self.held += len(items)
            out += self._bound()
        for host, got, result in out:
            self.emit(host, got, result)

    def expire(self) -> None:
        """Send on what waited longer than hold_s, each side by its own host."""
        out: list[tuple[str | None, list[Item], str]] = []
        with self.lock:
            now = self.clock()
            while self.waiting:
                tid = next(iter(self.waiting))
                t = self.traces.get(tid)
                if t is not None and t.held and now - t.held_since_ns <= self.hold_ns:
                    break  # the rest waited less
                del self.waiting[tid]
                if t is not None and t.held:
                    out += self._release(t)
            out += self._bound()
        for host, got, result in out:
            self.emit(host, got, result)

    def _release(self, t: _Trace) -> list[tuple[str | None, list[Item], str]]:
        by: dict[tuple[tuple[str, str], ...], list[Item]] = {}
        for it in t.held:
            by.setdefault(it.hints, []).append(it)
        self.held -= len(t.held)
        t.held = []
        hosts = self.directory()
        return [(hosts.resolve(list(h))[0], items, "unpaired") for h, items in by.items()]

    def _bound(self) -> list[tuple[str | None, list[Item], str]]:
        out: list[tuple[str | None, list[Item], str]] = []
        while self.traces and (len(self.traces) > self.max_traces or self.held > self.max_held):
            if self.held > self.max_held and self.waiting:  # the longest waiting first
                tid, _ = self.waiting.popitem(last=False)
                t = self.traces.pop(tid, None)
            else:
                tid, t = self.traces.popitem(last=False)
                self.waiting.pop(tid, None)
            if t is not None and t.held:
                out += self._release(t)
        return out
