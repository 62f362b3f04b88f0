"""Kept links: several probe rounds to one peer over one session, for TCP, RC and UD.

A link holds one session on the peer's responder open between rounds, so a round costs
its exchanges and little else (no control handshake, no data connection, no verbs
resources built and torn down per round). Every link takes a LinkParams (where the peer
is and how patiently to reach it) and a keepalive; `round()` returns a LatencyRound.

- `Link` is what all links share: the parameters, the keepalive, the rounds count, and
  a session lifetime on an ExitStack (`close()` releases everything; idempotent).
- `RdmaLink` (fabricprobe.probes.rdma.links) adds the `again`/`go` round protocol and
  the engine choice; RC and UD links (fabricprobe.probes.rdma.rc / .ud, which need
  pyverbs) subclass it with their session setup and their round.
- `TcpPingLink` is a kept `tcp_lat` session: the responder echoes whatever arrives on
  the data connection, so its rounds need no `again`; a warm-up that fails on a kept
  link tells the responder let it go.

A round that ends short closes the link (the next round opens a new session); a
responder gone before a round starts raises LinkStale, and the caller may open a new
link for the same round at once.
"""

from __future__ import annotations

import random
import socket
import time
from array import array
from contextlib import ExitStack
from typing import Generic, Self, TypeVar

from fabricprobe.core.deadline import Deadline
from fabricprobe.core.errors import PeerError
from fabricprobe.probes.control import MAX_KEEPALIVE_S, ControlClient, LinkStale
from fabricprobe.probes.measure import LatencyRound, LinkParams
from fabricprobe.probes.tcp import (
    Stopped,
    open_data_connection,
    pick_loop,
    run_exchanges,
    set_kernel_timeouts,
)

# Building a QP on both sides and connecting it can take seconds on a loaded host (or
# under emulation); an RDMA session's hello -> ready exchange gets this long by default.
SETUP_TIMEOUT_S = 30.0
S = TypeVar("S")


# --------------------------------------------------------------------------- links


class Link(Generic[S]):
    """What every kept link shares (see the module docstring). Subclasses say how long
    a step and a setup may take by default (STEP_S, SETUP_S), and what an open session
    holds (S: what the rounds use of it, None while there is none)."""

    STEP_S = 2.0
    SETUP_S = SETUP_TIMEOUT_S

    def __init__(self, params: LinkParams, *, keepalive_s: float = 0.0) -> None:
        if not 0 <= keepalive_s <= MAX_KEEPALIVE_S:
            raise ValueError(f"keepalive {keepalive_s} outside 0..{MAX_KEEPALIVE_S:g} s")
        self.params = params
        self.keepalive_s = keepalive_s
        self.step_s = params.step(self.STEP_S)
        self.timeout = params.setup_timeout(self.SETUP_S)
        self.rounds = 0
        self._stack = ExitStack()
        self._open: S | None = None

    @property
    def peer(self) -> str:
        return self.params.peer

    @property
    def is_open(self) -> bool:
        """The session is set up: the next round needs no setup."""
        return self._open is not None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the session and everything it holds; safe to call again."""
        self._open = None
        self._stack.close()


class TcpPingLink(Link[socket.socket]):
    """A kept `tcp_lat` session: the control and the data connection stay open between
    rounds (the responder echoes whatever arrives, for up to the keepalive between
    rounds). Lighter than fabricprobe.probes.tcp.run_pingpong: no timer calibration, one
    warm-up exchange per round. The exchanges run in the same loop as run_pingpong's
    (`loop`: the compiled one when it is built; `loop_reason` says why). A warm-up that
    fails on a kept link means the responder let it go (LinkStale): nothing of the round
    was measured yet."""

    SETUP_S = 5.0

    def __init__(
        self, params: LinkParams, *, size: int, keepalive_s: float = 0.0, loop: str = "auto"
    ) -> None:
        super().__init__(params, keepalive_s=keepalive_s)
        self.size = size
        chosen = pick_loop(loop)
        self.loop, self.loop_reason = chosen.name, chosen.reason
        self._sbuf = bytearray(random.randbytes(size))
        self._rbuf = bytearray(size)

    def _connect(self) -> socket.socket:
        ctrl = self._stack.enter_context(ControlClient.to(self.params, self.timeout))
        setup = Deadline(self.timeout)  # connect, hello -> ready and the data connection
        try:
            info = ctrl.open(
                "tcp_lat",
                {"size": self.size, "timeout": self.step_s, "keepalive_s": self.keepalive_s},
                deadline=setup,
            )
            data = self._stack.enter_context(open_data_connection(ctrl, info, setup))
            set_kernel_timeouts(data, self.step_s)
        except BaseException:
            self.close()
            raise
        self._open = data
        return data

    def round(self, count: int) -> LatencyRound:
        """COUNT ping-pongs after one warm-up exchange (one loop call for all of them:
        the warm-up is the first exchange, its sample dropped)."""
        if count < 0:
            raise ValueError(f"count {count} < 0")
        kept = self._open is not None
        data = self._open or self._connect()
        step = self.step_s
        samples = array("q", bytes(8 * (count + 1)))
        error, done = None, count + 1
        t0 = time.perf_counter()
        try:
            run_exchanges(
                self.loop, data, self._sbuf, self._rbuf, samples, 0, count + 1, True, step
            )
        except Stopped as e:
            self.close()
            if e.done == 0:  # the warm-up failed: nothing of the round was measured yet
                if kept:
                    raise LinkStale(f"kept session to {self.peer} is gone: {e.reason(step)}") from e
                raise PeerError(e.reason(step)) from e
            done = e.done
            error = f"after {done - 1} exchanges: {e.reason(step)}"
        duration = time.perf_counter() - t0
        self.rounds += 1
        del samples[done:]
        del samples[0]  # the warm-up: first-packet costs are not the fabric
        return LatencyRound(samples, count - len(samples), error, None, duration)
