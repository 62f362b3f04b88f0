"""What the RC and UD links share: which RDMA hot loop runs (`pyverbs` or the compiled
`native` one) and why, and RdmaLink, the kept link with the `again`/`go` round protocol
(fabricprobe.probes.links has the links every transport shares)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fabricprobe.core.errors import NotSupported
from fabricprobe.core.stats import LatencySketch
from fabricprobe.probes.control import ControlClient
from fabricprobe.probes.links import Link
from fabricprobe.probes.measure import ENGINES, LatencyResult, LatencyRound, LinkParams
from fabricprobe.probes.rdma import native


@dataclass(frozen=True)
class EngineChoice:
    """Which RDMA hot loop runs (`pyverbs` or `native`) and why, in one line."""

    name: str
    reason: str


def native_status() -> tuple[bool, str]:
    """(whether the compiled loops of probes/rdma/native load here, why not)."""
    try:
        native.load()
    except native.NativeError as e:
        return False, str(e)
    return True, ""


def pick_engine(requested: str) -> EngineChoice:
    """`auto` takes the native loops when they are built and load, else pyverbs; an
    explicit `native` that cannot load raises NotSupported."""
    if requested not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {requested!r}")
    if requested == "pyverbs":
        return EngineChoice("pyverbs", "pyverbs: asked for")
    built, why = native_status()
    if requested == "native":
        if not built:
            raise NotSupported(f"the native engine is not built here: {why}")
        return EngineChoice("native", "native: asked for; the compiled loop is built and loads")
    if built:
        return EngineChoice("native", "native: the compiled loop is built and loads")
    return EngineChoice("pyverbs", f"pyverbs: the native loop does not load ({why})")


def responder_engine(wanted: object) -> str:
    """The loop a responder answers a prober that asked for WANTED with: the native one
    when it asked for that and this host has it built, else pyverbs. A native prober
    against a Python responder would time the responder's interpreter, not the fabric."""
    return "native" if wanted == "native" and pick_engine("auto").name == "native" else "pyverbs"


class RdmaLink(Link[tuple[ControlClient, Any, Any]]):
    """RC and UD links: the first round opens the session (`_setup`, with the round's
    params in the hello); with a keepalive the responder then holds its end between
    rounds and each later round is one `again`/`go` exchange away. The responder ends its
    session when the control connection closes."""

    def __init__(self, params: LinkParams, *, keepalive_s: float = 0.0) -> None:
        super().__init__(params, keepalive_s=keepalive_s)
        choice = pick_engine(params.engine)
        self.engine, self.engine_reason = choice.name, choice.reason

    def _setup(self, params: dict[str, Any]) -> tuple[ControlClient, Any, Any]:
        """Open the session for a first round of PARAMS on self._stack: (control, local
        endpoint, what the rounds need of the peer)."""
        raise NotImplementedError

    def _begin(self, params: dict[str, Any]) -> tuple[ControlClient, Any, Any]:
        """The session ready for a round of PARAMS: opened with them, or asked again."""
        try:
            if self._open is not None:
                self._open[0].again(params)
            else:
                self._open = self._setup({**params, "keepalive_s": self.keepalive_s})
        except BaseException:
            self.close()
            raise
        self.rounds += 1
        return self._open

    def _end(self, error: str | None, result: dict[str, Any]) -> None:
        """After a round: one that ended short closes the link; an unkept one is done."""
        if error is not None:
            self.close()
        elif not self.keepalive_s and self._open is not None:
            self._open[0].done(result, timeout=self.done_timeout())
            self.close()

    def done_timeout(self) -> float:
        """How long the closing handshake may take: a step, unless the responder needs
        longer to see that the round is over."""
        return self.step_s

    def _result(self, r: LatencyRound, sketch: LatencySketch, **figures: Any) -> LatencyResult:
        """Round R summarised in SKETCH, with what the link knows and FIGURES beside."""
        return LatencyResult(
            transport="rdma",
            peer=self.peer,
            port=self.params.port,
            device=r.device,
            summary=sketch.summary(),
            duration_s=r.duration_s,
            error=r.error,
            sketch=sketch,
            engine=self.engine,
            engine_reason=self.engine_reason,
            **figures,
        )
