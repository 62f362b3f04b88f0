"""Engine fragments -> requests with a path: prefill side -> decode side, host to host.

Fragments (attribution/engines/) of one request are linked by trace id, and otherwise
by request id (`gen_ai.request.id`, SGLang's `rid`, Dynamo's `x_request_id`, llm-d's
request id) or SGLang's `bootstrap_room`: any shared key puts two fragments in one
request. Within a request, fragments from one sending process (its resource) are one
side. The prefill side is the one that says so, else the one that started first; the
decode side likewise, else the one that ended last.

Each side's host comes from its resource attributes (`host.name`, `service.instance.id`,
`k8s.pod.ip`, `server.address`, ...) matched against the names and addresses the agents
registered (`HostDirectory`), as `MatchConfig` says: exact name, exact address, the
short name (before the first dot), aliases and rewrite rules. A request whose link or
host is missing is still returned, with `path_known` False and the reason.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from fabricprobe.collector.attribution.engines.common import HOST_ATTRIBUTES, Fragment, StageSpan
from fabricprobe.collector.attribution.stages import RequestRecord, StageRecord

MAX_SIDES = 8  # engine sides in one linked request before the link counts as ambiguous

# the reasons a path is unknown: a bounded set (they become a metric label)
REASONS = (
    "one side only",  # a single engine side: aggregated serving, or the other side unseen
    "no prefill side",
    "no decode side",
    "ambiguous link",  # more engine sides in one request than a prefill/decode pair
    "prefill host unknown",
    "decode host unknown",
    "same host",  # both sides on one host: the KV did not cross the fabric
)


@dataclass(frozen=True)
class MatchConfig:
    """How resource attributes name hosts, for fleets that name things differently.

    attributes: resource (then span) attributes tried in order.
    aliases: attribute value -> agent host name, tried first.
    rewrite: (regex, replacement) pairs applied to a value before matching again
      (e.g. ("^(.*)-vllm-[0-9]+$", "\\1") for pod names made from the node's).
    short_names: also match the part before the first dot on either side."""

    attributes: tuple[str, ...] = HOST_ATTRIBUTES
    aliases: dict[str, str] = field(default_factory=dict)
    rewrite: tuple[tuple[str, str], ...] = ()
    short_names: bool = True


class HostDirectory:
    """Agent host names and addresses, for matching a side's host attributes."""

    def __init__(self, hosts: Iterable[tuple[str, Iterable[str]]], cfg: MatchConfig) -> None:
        self.cfg = cfg
        self.names: dict[str, str] = {}
        self.addresses: dict[str, str] = {}
        self.short: dict[str, str | None] = {}
        for name, addresses in hosts:
            self.names[name] = name
            for a in addresses:
                self.addresses.setdefault(a, name)
            s = name.split(".", 1)[0]
            # a short name two hosts share matches neither of them
            self.short[s] = name if self.short.get(s, name) == name else None
        self.rules = [(re.compile(p), r) for p, r in cfg.rewrite]

    def match(self, value: str) -> str | None:
        """The agent host VALUE names, or None."""
        for v in self._candidates(value):
            if v in self.cfg.aliases:
                return self.cfg.aliases[v]
            got = self.names.get(v) or self.addresses.get(v)
            if got is None and self.cfg.short_names:
                got = self.short.get(v.split(".", 1)[0])
            if got is not None:
                return got
        return None

    def _candidates(self, value: str) -> list[str]:
        out = [value]
        host, sep, port = value.rpartition(":")  # "10.0.0.2:8000" (llm-d's prefill target)
        if sep and port.isdigit():
            out.append(host.strip("[]"))
        for rx, repl in self.rules:
            new = rx.sub(repl, value)
            if new != value:
                out.append(new)
        return out

    def resolve(self, hints: Iterable[tuple[str, str]]) -> tuple[str | None, str]:
        """(host, what matched) for a side's hints, in the configured attribute order."""
        order = {k: i for i, k in enumerate(self.cfg.attributes)}
        ranked = sorted(
            (h for h in hints if h[0] in order or h[0] in ("host_id", "peer")),
            key=lambda h: order.get(h[0], len(order)),
        )
        for key, value in ranked:
            got = self.match(value)
            if got is not None:
                return got, f"{key}={value}"
        seen = ", ".join(f"{k}={v}" for k, v in ranked[:4]) or "no host attributes"
        return None, seen


@dataclass
class Side:
    identity: str
    fragments: list[Fragment]

    @property
    def engine(self) -> str:
        return self.fragments[0].engine

    @property
    def role(self) -> str:
        roles = {f.role for f in self.fragments if f.role}
        return roles.pop() if len(roles) == 1 else ""

    @property
    def start_ns(self) -> int:
        return min(f.start_ns for f in self.fragments)

    @property
    def end_ns(self) -> int:
        return max(f.end_ns for f in self.fragments)

    def request(self) -> Fragment | None:
        req = [f for f in self.fragments if f.kind == "request"]
        return max(req, key=lambda f: f.end_ns) if req else None

    def hints(self) -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        for f in self.fragments:
            for h in f.hosts:
                if h not in seen:
                    seen.append(h)
        return seen


@dataclass(frozen=True)
class PathInfo:
    """How one request's path was found, or why it was not."""

    request_id: str
    engine: str
    src: str  # prefill host ("" when unknown)
    dst: str  # decode host
    path_known: bool
    reason: str  # one of REASONS when unknown, "" when known
    detail: str  # what was matched, or what could not be
    kv_source: str  # the span or attribute the KV-transfer time came from ("" for none)
    sides: int
    last_ns: int  # the newest fragment's end: when the request can be taken as complete
    # one side seen that looks like half of a pair (a prefill side's max_tokens 1, or a
    # side that names its role): its other side may come much later (after the decode)
    pending: bool = False


@dataclass(frozen=True)
class Linked:
    request: RequestRecord
    stages: list[StageRecord]
    path: PathInfo


def group(fragments: Iterable[Fragment]) -> list[list[Fragment]]:
    """Fragments in requests: union-find over their trace ids and link keys."""
    frags = list(fragments)
    parent = list(range(len(frags)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, f in enumerate(frags):
        keys = list(f.keys)
        if f.trace_id:
            keys.append("trace:" + f.trace_id)
        for k in keys:
            j = owner.setdefault(k, i)
            if j != i:
                a, b = find(i), find(j)
                if a != b:
                    parent[a] = b
    groups: dict[int, list[Fragment]] = {}
    for i, f in enumerate(frags):
        groups.setdefault(find(i), []).append(f)
    return list(groups.values())


def sides_of(frags: list[Fragment]) -> tuple[list[Side], list[Side]]:
    """(engine sides, proxy sides) of one request, each in start order."""
    by: dict[tuple[str, str], Side] = {}
    for f in frags:
        key = ("proxy" if f.kind == "proxy" else "engine", f.identity)
        by.setdefault(key, Side(f.identity, [])).fragments.append(f)
    engine = sorted((s for k, s in by.items() if k[0] == "engine"), key=lambda s: s.start_ns)
    proxy = sorted((s for k, s in by.items() if k[0] == "proxy"), key=lambda s: s.start_ns)
    # a side with no request-level span and no role (an SGLang thread span alone) adds
    # hosts to the side of the same trace that has them, not a side of its own
    return [s for s in engine if s.request() or s.role or len(engine) == 1], proxy


def pick(engine: list[Side]) -> tuple[Side | None, Side | None, str]:
    """(prefill side, decode side, reason when they cannot be told)."""
    if len(engine) > MAX_SIDES:
        return None, None, "ambiguous link"
    pre = [s for s in engine if s.role == "prefill"]
    dec = [s for s in engine if s.role == "decode"]
    if len(engine) == 1:
        only = engine[0]
        if only.role == "decode":
            return None, only, "no prefill side"
        if only.role == "prefill":
            return only, None, "no decode side"
        return None, None, "one side only"
    if len(pre) > 1 or len(dec) > 1 or (len(engine) > 2 and not (pre and dec)):
        return None, None, "ambiguous link"
    p = pre[0] if pre else min(engine, key=lambda s: s.start_ns)
    d = dec[0] if dec else max((s for s in engine if s is not p), key=lambda s: s.end_ns)
    return p, d, ""


def proxy_prefill(proxy: list[Side], hosts: HostDirectory) -> tuple[str | None, str]:
    """(host, what matched) of the first prefill target a proxy side names (llm-d's
    sidecar) that is an agent host; (None, what the last one tried was) when none is,
    (None, "") when no proxy side names one."""
    hint = ""
    for p in proxy:
        for f in p.fragments:
            if f.peer:
                got, hint = hosts.resolve([("peer", f.peer)])
                if got is not None:
                    return got, hint
    return None, hint


def _stage(rid: str, s: StageSpan, src: str = "", dst: str = "") -> StageRecord:
    return StageRecord(rid, s.stage, s.start_ns, s.end_ns, src=src, dst=dst, derived=not s.measured)


def _side_stages(side: Side, rid: str, *, decode: bool, src: str, dst: str) -> list[StageRecord]:
    """A side's stages; on the decode side, the latency total that holds the KV wait is
    split into the wait (kv_transfer) and the rest, unless a span measures the wait."""
    spans = [s for f in side.fragments for s in f.stages]
    measured = {s.stage for s in spans if s.measured}
    out: list[StageRecord] = []
    kv_measured = [s for s in spans if s.measured and s.stage == "kv_transfer"]
    req = side.request()
    for s in spans:
        if not s.measured and s.stage in measured:
            continue  # the engine's own span of this stage beats the laid-out total
        if s.stage == "kv_send":
            continue  # the prefill side's view of the transfer; the decode side's wait counts
        if s.stage == "kv_transfer":
            if decode:
                out.append(_stage(rid, s, src, dst))
            continue
        # vLLM 0.32: the wait for remote KV is all of the decode side's time_in_queue
        if (
            decode
            and not kv_measured
            and not s.measured
            and s.stage == "queue"
            and req is not None
            and req.kv_total == "gen_ai.latency.time_in_queue"
        ):
            wait = StageSpan("kv_transfer", s.start_ns, s.end_ns, False)
            out.append(_stage(rid, wait, src, dst))
            continue
        out.append(_stage(rid, s))
    if decode and not any(r.stage == "kv_transfer" for r in out):
        send = [s for s in spans if s.stage == "kv_send"]
        for s in send[:1]:  # only the prefill side's view exists
            wait = StageSpan("kv_transfer", s.start_ns, s.end_ns, s.measured)
            out.append(_stage(rid, wait, src, dst))
    return out


def link(frags: list[Fragment], hosts: HostDirectory) -> Linked:
    """One request (one group of fragments): its merged record, stages and path."""
    engine, proxy = sides_of(frags)
    pre, dec, reason = pick(engine) if engine else (None, None, "one side only")
    rid = next((f.request_id for f in frags if f.request_id), "")
    if not rid:
        rid = next((f.trace_id for f in frags if f.trace_id), "") or frags[0].identity
    detail = ""
    src = dst = None
    if not reason or reason in ("no prefill side", "no decode side"):
        src_hint = dst_hint = ""
        if pre is not None:
            src, src_hint = hosts.resolve(pre.hints())
        if dec is not None:
            dst, dst_hint = hosts.resolve(dec.hints())
        # llm-d: the sidecar names the prefill target and sits by the decode instance
        if src is None:
            got, hint = proxy_prefill(proxy, hosts)
            if hint:
                src, src_hint = got, hint
        for p in proxy:
            if dst is None and dec is None:
                dst, dst_hint = hosts.resolve(p.hints())
        if src is not None and dst is not None:
            reason = "same host" if src == dst else ""
        elif pre is None and src is None:
            reason = reason or "no prefill side"
        elif dec is None and dst is None:
            reason = reason or "no decode side"
        elif src is None:
            reason = "prefill host unknown"
        else:
            reason = "decode host unknown"
        detail = f"prefill: {src_hint or '-'}; decode: {dst_hint or '-'}"
    known = not reason
    s_src, s_dst = (src or "", dst or "") if known else ("", "")
    stages: list[StageRecord] = []
    if pre is not None:
        stages += _side_stages(pre, rid, decode=False, src=s_src, dst=s_dst)
    if dec is not None:
        stages += _side_stages(dec, rid, decode=True, src=s_src, dst=s_dst)
    kv = [s for s in stages if s.stage == "kv_transfer"]
    kv_source = ""
    if kv:
        kv_source = "span" if not kv[0].derived else "gen_ai.latency.time_in_queue (decode side)"
    if pre is not None and dec is not None:
        # each side's laid-out totals already gave way to that side's own spans; across
        # two sides of one request id they must not give way to the other side's
        stages = [dataclasses.replace(s, derived=False) if s.derived else s for s in stages]
    if pre is None and dec is None:
        for s in engine:
            stages += _side_stages(s, rid, decode=False, src="", dst="")
    if not engine:
        for p in proxy:
            stages += [_stage(rid, st) for f in p.fragments for st in f.stages]
    req = _merge(rid, pre, dec, engine, proxy, frags)
    last = max(f.end_ns for f in frags)
    eng = (dec or pre or (engine[0] if engine else proxy[0])).engine
    pending = reason in ("no prefill side", "no decode side") or (
        reason == "one side only"
        and any(r is not None and r.max_tokens == 1 for r in (s.request() for s in engine))
    )
    path = PathInfo(
        rid, eng, src or "", dst or "", known, reason, detail, kv_source, len(engine), last,
        pending,
    )  # fmt: skip
    return Linked(req, stages, path)


def _merge(
    rid: str,
    pre: Side | None,
    dec: Side | None,
    engine: list[Side],
    proxy: list[Side],
    frags: list[Fragment],
) -> RequestRecord:
    """The request's figures over both sides: it starts when the prefill side got it and
    its first token is the decode side's first token."""
    start = min(f.start_ns for f in frags)
    end = max(f.end_ns for f in frags)
    first = dec or pre or (engine[0] if len(engine) == 1 else None)
    rq = first.request() if first is not None else None
    ttft = e2e = None
    out_tokens = prompt_tokens = None
    model = ""
    if rq is not None:
        if rq.ttft_s is not None:
            ttft = (rq.start_ns - start) / 1e9 + rq.ttft_s
        if rq.e2e_s is not None:
            e2e = (rq.start_ns - start) / 1e9 + rq.e2e_s
        out_tokens, model = rq.output_tokens, rq.model
    prq = pre.request() if pre is not None else rq
    if prq is not None:
        prompt_tokens = prq.prompt_tokens
        model = model or prq.model
    if e2e is None and (pre is not None or dec is not None or proxy):
        e2e = (end - start) / 1e9 if (pre and dec) or proxy else None
    return RequestRecord(rid, start, end, ttft, e2e, out_tokens, prompt_tokens, model)
