"""Spans on their way to the collector shard that owns their path.

`SpanRouter.route` splits each OTLP request a shard takes: a trace with a
`fabricprobe.src.host` goes to that host's owner; an engine trace (vLLM, SGLang, Dynamo,
llm-d spans) goes first to the shard that owns its trace id, which gathers its sides
until one says where the path starts and then sends them all to that host's owner
(collector/attribution/spanpath.py; each side alone goes by its own host after `span_hold_s`);
other spans go to the owner of the host their resource names. A trace that names no
known host stays where it arrived. `Forwarder` sends them on: a bounded queue drained by
one thread, with a drop counter. A request sent to a path's owner carries the resource
attribute `fabricprobe.forwarded` and is never forwarded again (one sent to a trace's
owner carries `fabricprobe.relayed`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

from fabricprobe.collector.attribution.engines.common import Fragment
from fabricprobe.collector.attribution.linking import HostDirectory
from fabricprobe.collector.attribution.otlp import BatchRefused, resource_attributes
from fabricprobe.collector.attribution.spanpath import (
    ROUTE_RESULTS,
    Item,
    PathRelay,
    engine_fragment,
)
from fabricprobe.core.shards import MAX_MEMBERS, Member, owner_of

log = logging.getLogger("fabricprobe.collector.shard")

MAX_FORWARD_QUEUE = 256  # OTLP requests waiting to be forwarded; beyond it they are dropped
FORWARD_TIMEOUT_S = 5.0
FORWARDED = "fabricprobe.forwarded"  # resource attribute of a forwarded request
RELAYED = "fabricprobe.relayed"  # ... of one sent to the shard that gathers its traces
Group = tuple[int, int, int]  # (batch, resource, scope) of a span
SRC_HOST = "fabricprobe.src.host"
FORWARD_RESULTS = ("sent", "queue_full", "failed")


class Credentials(Protocol):
    """How a shard proves itself to the others when it forwards spans: a bearer token
    holding the ingest role there, over TLS with CA_FILE (and a client certificate)."""

    @property
    def token_file(self) -> str: ...
    @property
    def ca_file(self) -> str: ...
    @property
    def cert_file(self) -> str: ...
    @property
    def key_file(self) -> str: ...
    @property
    def server_name(self) -> str: ...


class FleetView(Protocol):
    """What routing needs of a shard's view of the fleet."""

    member: Member  # this shard

    def current_members(self) -> tuple[Member, ...]: ...

    def directory(self) -> HostDirectory: ...


class SpanRouter:
    """One shard's routing of spans (see the module docstring)."""

    def __init__(
        self,
        view: FleetView,
        forwarder: Forwarder,
        clock: Callable[[], int],
        *,
        hold_s: float,
    ) -> None:
        self.view = view
        self.forwarder = forwarder
        self.lock = threading.Lock()
        self._batches = 0
        self.routed = dict.fromkeys(ROUTE_RESULTS, 0)  # spans, by how their shard was found
        # where spans this shard keeps after gathering them go (TraceIngest.export_local)
        self.local: Callable[[Any], object] | None = None
        self.relay = PathRelay(self._emit, view.directory, clock, hold_s=hold_s)

    def routed_counts(self) -> dict[str, int]:
        """Spans routed, by how their shard was found (a copy)."""
        with self.lock:
            return dict(self.routed)

    def route(self, request: ts_pb.ExportTraceServiceRequest) -> tuple[Any, int]:
        """(the part of REQUEST this shard keeps, spans handed on: forwarded, or gathered
        under their trace until their path is known)."""
        members = self.view.current_members()
        member = self.view.member
        if len(members) < 2:
            return request, 0
        self.relay.expire()
        relayed = False
        for rs in request.resource_spans:
            for a in rs.resource.attributes:
                if a.key == FORWARDED:
                    return request, 0  # forwarded once already: kept wherever it landed
                relayed = relayed or a.key == RELAYED
        traces: dict[bytes, list[tuple[Any, Any, Any, Fragment | None, Group]]] = {}
        with self.lock:
            self._batches += 1
            batch = self._batches
        for i, rs in enumerate(request.resource_spans):
            res = resource_attributes(rs)
            for j, ss in enumerate(rs.scope_spans):
                for span in ss.spans:
                    frag = engine_fragment(span, res, ss.scope.name)
                    traces.setdefault(bytes(span.trace_id), []).append(
                        (rs, ss, span, frag, (batch, i, j))
                    )
        keep: list[Item] = []
        out: dict[Member, list[Item]] = {}  # to the shards that gather these traces
        final: dict[Member, list[Item]] = {}  # to the shards that own these paths
        gathered = 0
        directory: HostDirectory | None = None
        for tid, spans in traces.items():
            items = [_item(rs, ss, span, frag, g) for rs, ss, span, frag, g in spans]
            src = next(
                (
                    a.value.string_value
                    for _, _, span, _, _ in spans
                    for a in span.attributes
                    if a.key == SRC_HOST and a.value.string_value
                ),
                None,
            )
            frags = [f for _, _, _, f, _ in spans if f is not None]
            if src is None and frags:
                key = owner_of("trace:" + tid.hex(), members)
                if relayed or key is None or key == member:
                    self.relay.add(tid, items, frags)
                else:  # to the shard that gathers this trace
                    out.setdefault(key, []).extend(items)
                gathered += len(items)
                continue
            if src is None:
                if directory is None:
                    directory = self.view.directory()
                hints = [(k, v) for k, v in _resource_hints(spans[0][0]) if v]
                src = directory.resolve(hints)[0]
                result = "resource"
            else:
                result = "src_host"
            m = owner_of(src, members) if src is not None else None
            if m is None or m == member:
                keep += items
            else:
                self._count(result, len(items))
                final.setdefault(m, []).extend(items)
                gathered += len(items)
        for mark, by in ((FORWARDED, final), (RELAYED, out)):
            for m, got in by.items():
                self.forwarder.put(m, _request(got, mark, member.name), len(got))
        if not out and gathered == 0:
            return request, 0
        return _request(keep), gathered

    def _emit(self, host: str | None, items: list[Item], result: str) -> None:
        """Where the relay decided ITEMS go: the owner of HOST, or here."""
        if not items:
            return
        self._count(result, len(items))
        me = self.view.member
        m = owner_of(host, self.view.current_members()) if host is not None else None
        if m is None or m == me:
            if self.local is not None:
                try:
                    self.local(_request(items))
                except BatchRefused as e:
                    log.warning("spans gathered here refused: %s", e)
            return
        self.forwarder.put(m, _request(items, FORWARDED, me.name), len(items))

    def _count(self, result: str, n: int) -> None:
        with self.lock:
            self.routed[result] += n


def _resource_hints(rs: Any) -> list[tuple[str, str]]:
    return [(a.key, a.value.string_value) for a in rs.resource.attributes]


def _item(rs: Any, ss: Any, span: Any, frag: Fragment | None, group: Group) -> Item:
    hints = frag.hosts if frag else ()
    return Item(rs.resource, rs.schema_url, ss.scope, ss.schema_url, span, hints, group)


def _request(items: list[Item], mark: str = "", sender: str = "") -> Any:
    """ITEMS as one OTLP request, grouped by their resource and scope as they came; MARK
    (with SENDER) is added to every resource."""
    req = ts_pb.ExportTraceServiceRequest()
    resources: dict[tuple[int, int], Any] = {}
    scopes: dict[Group, Any] = {}
    for it in items:
        rid = it.group[:2]
        new_rs = resources.get(rid)
        if new_rs is None:
            new_rs = resources[rid] = req.resource_spans.add()
            new_rs.resource.CopyFrom(it.resource)
            new_rs.schema_url = it.schema_url
            if mark:
                attr = new_rs.resource.attributes.add()
                attr.key, attr.value.string_value = mark, sender
        new_ss = scopes.get(it.group)
        if new_ss is None:
            new_ss = scopes[it.group] = new_rs.scope_spans.add()
            new_ss.scope.CopyFrom(it.scope)
            new_ss.schema_url = it.scope_url
        new_ss.spans.append(it.span)
    return req


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


class Forwarder:
    """OTLP requests for other shards: a bounded queue and one sending thread."""

    def __init__(self, cfg: Credentials, max_queue: int = MAX_FORWARD_QUEUE) -> None:
        self.cfg = cfg
        self.queue: queue.Queue[tuple[Member, Any, int] | None] = queue.Queue(maxsize=max_queue)
        self.spans = dict.fromkeys(FORWARD_RESULTS, 0)
        self.lock = threading.Lock()
        self._channels: dict[Member, tuple[grpc.Channel, Any]] = {}
        self._thread: threading.Thread | None = None
        token = Path(cfg.token_file).read_text().strip() if cfg.token_file else ""
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.creds = None
        if cfg.ca_file:
            self.creds = grpc.ssl_channel_credentials(
                root_certificates=_read(cfg.ca_file),
                private_key=_read(cfg.key_file) if cfg.key_file else None,
                certificate_chain=_read(cfg.cert_file) if cfg.cert_file else None,
            )

    def counts(self) -> dict[str, int]:
        """Spans forwarded, by result (a copy)."""
        with self.lock:
            return dict(self.spans)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="forward", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(None)
        for ch, _ in list(self._channels.values()):
            ch.close()

    def put(self, member: Member, request: Any, spans: int) -> None:
        try:
            self.queue.put_nowait((member, request, spans))
        except queue.Full:
            self._count("queue_full", spans)

    def _count(self, result: str, n: int) -> None:
        with self.lock:
            self.spans[result] += n

    def _stub(self, member: Member) -> Any:
        held = self._channels.get(member)
        if held is None:
            for old in [m for m in self._channels if m.name == member.name]:
                self._channels.pop(old)[0].close()  # the shard came back elsewhere
            while len(self._channels) >= MAX_MEMBERS:  # shards come and go: oldest out
                self._channels.pop(next(iter(self._channels)))[0].close()
            opts = (
                [("grpc.ssl_target_name_override", self.cfg.server_name)]
                if self.cfg.server_name
                else []
            )
            target = member.otlp_target
            ch = (
                grpc.secure_channel(target, self.creds, options=opts)
                if self.creds is not None
                else grpc.insecure_channel(target)
            )
            held = self._channels[member] = (ch, ts_grpc.TraceServiceStub(ch))
        return held[1]

    def _loop(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            member, request, n = item
            try:
                self._stub(member).Export(
                    request, timeout=FORWARD_TIMEOUT_S, metadata=self.metadata
                )
            except grpc.RpcError as e:
                self._count("failed", n)
                log.warning("forwarding %d spans to shard %s: %s", n, member.name, e.code())
                continue
            self._count("sent", n)
