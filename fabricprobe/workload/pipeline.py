"""A disaggregated inference pipeline without a GPU: prefill -> KV transfer -> decode ->
detokenize -> deliver, with the KV transfer real and everything else simulated in time.

Each request picks a path (prefill host -> decode host) round-robin, or, given a
router (fabricprobe/workload/route.py), its prefill host in turn and its decode host by
the router's choice among that prefill host's paths. Prefill and decode
are compute the workload stands in for: they take `prefill_s_per_token` per prompt
token and `decode_step_s` per output token (sleeps, measured as they happen). The KV
transfer moves the bytes the model's KV cache really has for that prompt
(fabricprobe.core.models) across the fabric over a kv_sink session (RDMA WRITE or
TCP), and detokenize and deliver do their small real work. Every stage is timed on the
wall clock (time_ns) so that its spans line up with the agents' probe windows.

Requests arrive at `rate` per second (Poisson, seeded), or back to back when rate is 0;
`concurrency` workers take them from one queue, so queueing is real when the pipeline
cannot keep up.
"""

from __future__ import annotations

import math
import os
import queue
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from fabricprobe.core.models import ModelShape
from fabricprobe.workload.route import Choice
from fabricprobe.workload.transfer import MAX_CHUNK, KvChannel, open_channel

STAGE_ORDER = ("queue", "prefill", "kv_transfer", "decode", "detokenize", "deliver")


@dataclass(frozen=True)
class Host:
    name: str  # the agent's host name: what spans and probe windows call it
    address: str  # where its responder listens; also the source address when it sends


@dataclass(frozen=True)
class WorkloadConfig:
    model: ModelShape
    prompt_tokens: int = 1024
    prompt_spread: float = 0.5  # prompts vary uniformly within +/- this fraction
    output_tokens: int = 32
    prefill_s_per_token: float = 20e-6
    decode_step_s: float = 0.005
    # the decode side learns its KV has landed at its scheduler's next step, every
    # kv_poll_s on the worker's clock, as an engine that polls its transfers does
    # (vLLM's scheduler asks its connector each step); 0: at once
    kv_poll_s: float = 0.0
    requests: int = 30
    rate: float = 0.0  # requests per second over all paths; 0 = back to back
    concurrency: int = 1
    transport: str = "rdma"
    port: int = 4793
    outstanding: int = 4  # RDMA WRITEs (one layer's KV cache each) in flight
    seed: int = 1

    def prompt_for(self, rng: random.Random) -> int:
        lo = max(1, int(self.prompt_tokens * (1 - self.prompt_spread)))
        hi = max(lo, int(self.prompt_tokens * (1 + self.prompt_spread)))
        return rng.randint(lo, hi)


@dataclass
class RequestResult:
    request_id: str
    src: Host
    dst: Host
    transport: str
    device: str
    prompt_tokens: int
    output_tokens: int
    kv_bytes: int
    arrival_ns: int
    kv_round_trips: int = 0  # what the transfer's protocol waited for (KvChannel.round_trips)
    kv_library_s: float = 0.0  # the transfer's own time, its call to its last completion
    # the transferring thread's wait for a CPU during the transfer, and during the decode
    # side's poll after it (None: not kept)
    kv_cpu_wait_s: float | None = None
    kv_poll_cpu_wait_s: float | None = None
    stages: dict[str, tuple[int, int]] = field(default_factory=dict)
    first_token_ns: int = 0
    error: str | None = None
    route: str = ""  # why the router chose this decode host ("" without one)

    @property
    def end_ns(self) -> int:
        return max((e for _, e in self.stages.values()), default=self.arrival_ns)

    @property
    def ttft_s(self) -> float:
        return (self.first_token_ns - self.arrival_ns) / 1e9

    @property
    def e2e_s(self) -> float:
        return (self.end_ns - self.arrival_ns) / 1e9

    def seconds(self, stage: str) -> float:
        start, end = self.stages[stage]
        return (end - start) / 1e9


def layer_chunk(model: ModelShape, tokens: int) -> int:
    """One layer's KV cache for TOKENS tokens, at most MAX_CHUNK: the unit a layer-wise
    transfer moves (a layer's K and V are ready together)."""
    return max(1, min(MAX_CHUNK, model.kv_bytes(tokens) // model.layers))


class RunQueueWait:
    """The time the thread that made it has been runnable but not running, in ns: the
    second field of its /proc/thread-self/schedstat, kept open so that a reading costs
    one pread. None where the kernel does not keep it."""

    def __init__(self) -> None:
        try:
            self.fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = None

    def read(self) -> int | None:
        if self.fd is None:
            return None
        try:
            return int(os.pread(self.fd, 256, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def next_step(now: float, epoch: float, step_s: float) -> float:
    """The first step boundary (EPOCH + k * STEP_S) at or after NOW."""
    return epoch + math.ceil((now - epoch) / step_s) * step_s


@contextmanager
def _stage(res: RequestResult, name: str) -> Iterator[None]:
    t0 = time.time_ns()
    try:
        yield
    finally:
        res.stages[name] = (t0, time.time_ns())


class Router(Protocol):
    def choose(self, src: Host, candidates: Sequence[Host], nbytes: int) -> Choice: ...


class _Worker:
    """One worker: its own kv_sink sessions (one per path, opened on first use)."""

    def __init__(
        self,
        cfg: WorkloadConfig,
        channel_kw: dict[str, Any],
        channels: dict[tuple[str, str], KvChannel] | None = None,
    ) -> None:
        self.cfg, self.channel_kw = cfg, channel_kw
        self.owned = channels is None
        self.channels: dict[tuple[str, str], KvChannel] = {} if channels is None else channels
        self.deliver_a, self.deliver_b = socket.socketpair()
        self.epoch = time.monotonic()  # the decode scheduler's step clock
        self.run_queue = RunQueueWait()  # made in the worker's own thread

    def channel(self, src: Host, dst: Host) -> KvChannel:
        key = (src.name, dst.name)
        ch = self.channels.get(key)
        if ch is None:
            ch = self.channels[key] = open_channel(
                self.cfg.transport, dst.address, self.cfg.port, bind=src.address, **self.channel_kw
            )
        return ch

    def run(self, res: RequestResult) -> None:
        cfg = self.cfg
        res.stages["queue"] = (res.arrival_ns, time.time_ns())
        with _stage(res, "prefill"):
            time.sleep(res.prompt_tokens * cfg.prefill_s_per_token)
        ch = self.channel(res.src, res.dst)
        res.device = ch.device
        try:
            chunk = layer_chunk(cfg.model, res.prompt_tokens)
            res.kv_round_trips = ch.round_trips(res.kv_bytes, chunk)
            with _stage(res, "kv_transfer"):
                before = self.run_queue.read()
                res.kv_library_s = ch.send(res.kv_bytes, chunk)
                sent = self.run_queue.read()
                if cfg.kv_poll_s > 0:
                    t = time.monotonic()
                    # never below 0: sleep() refuses a negative length, and the step's
                    # float arithmetic can land an ulp under T
                    time.sleep(max(0.0, next_step(t, self.epoch, cfg.kv_poll_s) - t))
                noticed = self.run_queue.read()
            if before is not None and sent is not None and noticed is not None:
                res.kv_cpu_wait_s = (sent - before) / 1e9
                res.kv_poll_cpu_wait_s = (noticed - sent) / 1e9
        except Exception:
            # an RC QP that saw an error completion is in the error state: the next
            # request on this path gets a fresh session
            self.channels.pop((res.src.name, res.dst.name), None)
            ch.close()
            raise
        tokens: list[int] = []
        with _stage(res, "decode"):
            for i in range(res.output_tokens):
                time.sleep(cfg.decode_step_s)
                tokens.append(i)
                if i == 0:
                    res.first_token_ns = time.time_ns()
        with _stage(res, "detokenize"):
            text = " ".join(f"t{t}" for t in tokens).encode()
        with _stage(res, "deliver"):
            self.deliver_a.sendall(text[:4096])
            self.deliver_b.recv(65536)

    def close(self) -> None:
        if self.owned:
            close_channels(self.channels)
        self.deliver_a.close()
        self.deliver_b.close()
        self.run_queue.close()


def close_channels(channels: dict[tuple[str, str], KvChannel]) -> None:
    for ch in channels.values():
        ch.close()
    channels.clear()


def run_pipeline(
    paths: list[tuple[Host, Host]],
    cfg: WorkloadConfig,
    *,
    on_request: Callable[[RequestResult], None] | None = None,
    channel_kw: dict[str, Any] | None = None,
    channels: dict[tuple[str, str], KvChannel] | None = None,
    router: Router | None = None,
) -> list[RequestResult]:
    """Run CFG.requests requests over PATHS; each finished request goes to ON_REQUEST
    (the span emitter) as soon as it is done. Failed requests carry their error.
    CHANNELS (one worker only) keeps kv_sink sessions open across runs: the caller
    closes them with close_channels(). ROUTER chooses each request's decode host among
    its prefill host's paths (the prefill hosts taken in turn)."""
    if not paths:
        raise ValueError("no paths to run over")
    if channels is not None and cfg.concurrency != 1:
        raise ValueError("shared channels need concurrency 1")
    kw = {"outstanding": cfg.outstanding} if cfg.transport == "rdma" else {}
    kw |= channel_kw or {}
    rng = random.Random(cfg.seed)
    todo: queue.Queue[RequestResult | None] = queue.Queue()
    out: list[RequestResult] = []
    lock = threading.Lock()
    run_id = secrets.token_hex(4)  # ids unique across runs, even with the same seed

    srcs = list(dict.fromkeys(src for src, _ in paths))
    decode = {s: list(dict.fromkeys(d for p, d in paths if p == s)) for s in srcs}

    def request(i: int) -> RequestResult:
        prompt = cfg.prompt_for(rng)
        why = ""
        if router is None:
            src, dst = paths[i % len(paths)]
        else:
            src = srcs[i % len(srcs)]
            choice = router.choose(src, decode[src], cfg.model.kv_bytes(prompt))
            dst, why = decode[src][choice.index], choice.reason
        return RequestResult(
            request_id=f"wl-{run_id}-{i}",
            src=src,
            dst=dst,
            transport=cfg.transport,
            device="",
            prompt_tokens=prompt,
            output_tokens=cfg.output_tokens,
            kv_bytes=cfg.model.kv_bytes(prompt),
            arrival_ns=0,
            route=why,
        )

    def work() -> None:
        worker = _Worker(cfg, kw, channels)
        try:
            while (res := todo.get()) is not None:
                if cfg.rate <= 0:
                    res.arrival_ns = time.time_ns()
                try:
                    worker.run(res)
                except Exception as e:  # a failed transfer ends this request, not the run
                    res.error = f"{type(e).__name__}: {e}"
                with lock:
                    out.append(res)
                if on_request is not None:
                    on_request(res)
        finally:
            worker.close()

    threads = [threading.Thread(target=work, name=f"wl-{n}") for n in range(cfg.concurrency)]
    for t in threads:
        t.start()
    next_at = time.monotonic()
    for i in range(cfg.requests):
        res = request(i)
        if cfg.rate > 0:
            next_at += -math.log(1.0 - rng.random()) / cfg.rate
            time.sleep(max(0.0, next_at - time.monotonic()))
            res.arrival_ns = time.time_ns()
        todo.put(res)
    for _ in threads:
        todo.put(None)
    for t in threads:
        t.join()
    return sorted(out, key=lambda r: r.arrival_ns)
