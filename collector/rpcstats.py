"""Every RPC timed into a histogram and counted by status code (a server interceptor)."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

RPC_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class RpcCounts(NamedTuple):
    """A copy of RpcStats' figures."""

    buckets: dict[str, list[int]]  # method -> counts per bucket, then +Inf
    sums: dict[str, float]  # method -> seconds
    codes: dict[tuple[str, str], int]  # (method, code) -> calls


class RpcStats:
    """Per-method durations (histogram) and per-(method, code) counts; plain Python."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.buckets: dict[str, list[int]] = {}  # method -> counts per bucket, then +Inf
        self.sums: dict[str, float] = {}
        self.codes: dict[tuple[str, str], int] = {}

    def observe(self, method: str, code: str, seconds: float) -> None:
        with self._lock:
            b = self.buckets.get(method)
            if b is None:
                b = self.buckets[method] = [0] * (len(RPC_BUCKETS_S) + 1)
            b[bisect.bisect_left(RPC_BUCKETS_S, seconds)] += 1
            self.sums[method] = self.sums.get(method, 0.0) + seconds
            self.codes[(method, code)] = self.codes.get((method, code), 0) + 1

    def snapshot(self) -> RpcCounts:
        with self._lock:
            return RpcCounts(
                {m: list(b) for m, b in self.buckets.items()},
                dict(self.sums),
                dict(self.codes),
            )


def _code(context: Any, failed: bool) -> str:
    code = getattr(context, "code", lambda: None)()
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return str(code.name)


class TimingInterceptor(grpc.ServerInterceptor):
    """Wraps unary and bidirectional handlers so each call lands in RpcStats."""

    def __init__(self, stats: RpcStats) -> None:
        self.stats = stats
        self._wrapped: dict[str, tuple[Any, Any]] = {}  # method -> (handler, its wrapper)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        # Called for every RPC: wrap each method's handler once, not once per call.
        cached = self._wrapped.get(details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, str(details.method).rsplit("/", 1)[-1])
        self._wrapped[details.method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: Any, method: str) -> Any:
        stats = self.stats
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(request: Any, context: Any) -> Any:
                with _timed(stats, method, context):
                    return inner(request, context)

            return _like(handler, grpc.unary_unary_rpc_method_handler, unary)
        if handler.stream_stream is not None:
            inner_stream = handler.stream_stream

            def stream(requests: Iterator[Any], context: Any) -> Iterator[Any]:
                with _timed(stats, method, context):
                    yield from inner_stream(requests, context)

            return _like(handler, grpc.stream_stream_rpc_method_handler, stream)
        return handler


@contextmanager
def _timed(stats: RpcStats, method: str, context: Any) -> Iterator[None]:
    """One call of METHOD, observed into STATS as it ends, however it ends."""
    t0 = time.perf_counter()
    failed = True
    try:
        yield
        failed = False
    finally:
        stats.observe(method, _code(context, failed), time.perf_counter() - t0)


def _like(handler: Any, make: Callable[..., Any], behaviour: Callable[..., Any]) -> Any:
    """A method handler (MAKE: the grpc function of its kind) running BEHAVIOUR with
    HANDLER's (de)serializers."""
    return make(
        behaviour,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
