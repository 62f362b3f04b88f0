"""NIXL telemetry of the engines on this host, as counter readings of kind "nixl".

Two Prometheus sources say what NIXL moved:
- an engine's /metrics with vLLM's NIXL connector series (vLLM 0.32:
  `vllm:nixl_xfer_time_seconds`, `vllm:nixl_post_time_seconds` and
  `vllm:nixl_bytes_transferred` histograms, `vllm:nixl_num_failed_transfers`);
- NIXL's own Prometheus exporter (ai-dynamo/nixl docs/telemetry.md:
  `agent_xfer_time_total` and `agent_xfer_post_time_total` in microseconds,
  `agent_tx_bytes_total`/`agent_rx_bytes_total`, `agent_tx_requests_num_total`,
  `agent_errors_total`).
Both become the same five raw totals per source (`transfers`, `bytes`,
`xfer_time_us`, `post_time_us`, `errors`; the reading's `device` names the source); the
collector turns them into rates and joins them with the KV transfers of that host.
A source that does not answer, or answers garbage, costs only its own readings this
window (counted in `errors`, logged once). Within a page, each of these series' lines is
parsed on its own, so a bad line costs only itself (counted in `skipped_lines`), as a
Prometheus scrape of it would; a total past 2**64 - 1, the readings' width, is left out.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.logs import warn_once
from fabricprobe.probes.numbers import U64_MAX

log = logging.getLogger("fabricprobe.agent")

MAX_BODY = 8 << 20  # an engine's /metrics is tens of KiB; more is not a metrics page
MAX_SOURCES = 32

# sample name -> (reading name, scale to the reading's unit)
VLLM_SAMPLES = {
    "vllm:nixl_xfer_time_seconds_count": ("transfers", 1.0),
    "vllm:nixl_xfer_time_seconds_sum": ("xfer_time_us", 1e6),
    "vllm:nixl_post_time_seconds_sum": ("post_time_us", 1e6),
    "vllm:nixl_bytes_transferred_sum": ("bytes", 1.0),
    "vllm:nixl_num_failed_transfers_total": ("errors", 1.0),
}
NIXL_SAMPLES = {
    "agent_tx_requests_num_total": ("transfers", 1.0),
    "agent_xfer_time_total": ("xfer_time_us", 1.0),
    "agent_xfer_post_time_total": ("post_time_us", 1.0),
    "agent_tx_bytes_total": ("bytes", 1.0),
    "agent_rx_bytes_total": ("bytes", 1.0),
    "agent_errors_total": ("errors", 1.0),
}
READINGS = ("transfers", "bytes", "xfer_time_us", "post_time_us", "errors")

Fetch = Callable[[str, float], bytes]


def fetch_url(url: str, timeout: float) -> bytes:
    import urllib.request  # here: an agent that reads no NIXL page is 1.3 MiB smaller without

    req = urllib.request.Request(url, headers={"Accept": "text/plain"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        raise ValueError(f"more than {MAX_BODY} bytes")
    return bytes(body)


def check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r}: expected http://HOST:PORT/metrics")


_SAMPLE_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass(frozen=True)
class NixlTotals:
    """What one /metrics page said: the totals, and how many of its lines were unusable."""

    values: dict[str, float]  # reading name -> total; absent when the page has no series
    skipped: int = 0  # lines of these series that did not parse, or had no usable value


def _sample(line: str) -> float | None:
    """The value of one sample line, parsed alone; None when it is not a sample, or its
    value is negative, NaN or infinite."""
    # imported here: an agent that reads no NIXL page never loads the parser (memory)
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(line + "\n"))
    except ValueError:  # the text format parser's error for a malformed line
        return None
    samples = [s for f in families for s in f.samples]
    if len(samples) != 1 or not math.isfinite(samples[0].value) or samples[0].value < 0:
        return None
    return float(samples[0].value)


def parse_totals(text: str) -> NixlTotals:
    """The five totals from one /metrics page (summed over its label sets); a reading
    neither vLLM nor NIXL's exporter offers is absent, never 0.

    Only the lines of the series above are parsed, each on its own, and one bad line of
    theirs is skipped and counted; other series' lines are only checked to start with a
    metric name (a line that does not is counted too: a page of those is not /metrics).
    """
    out: dict[str, float] = {}
    skipped = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_NAME.match(line)
        if m is None:
            skipped += 1
            continue
        known = VLLM_SAMPLES.get(m.group(0)) or NIXL_SAMPLES.get(m.group(0))
        if known is None:
            continue
        value = _sample(line)
        if value is None:
            skipped += 1
            continue
        name, scale = known
        out[name] = out.get(name, 0.0) + value * scale
    for name in [n for n, v in out.items() if v > U64_MAX]:
        del out[name]  # past the readings' 64 bits: no counter of a real engine gets there
        skipped += 1
    return NixlTotals(out, skipped)


@dataclass
class NixlReader:
    """Reads the NIXL totals of each source URL once per sample()."""

    urls: list[str]
    timeout: float = 1.0
    fetch: Fetch = fetch_url
    errors: int = 0
    skipped_lines: int = 0
    _warned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if len(self.urls) > MAX_SOURCES:
            raise ValueError(f"at most {MAX_SOURCES} NIXL sources")
        for u in self.urls:
            check_url(u)

    @staticmethod
    def source_name(url: str) -> str:
        p = urlsplit(url)
        return f"{p.hostname}:{p.port or (443 if p.scheme == 'https' else 80)}"

    def sample(self) -> list[pb.CounterReading]:
        out: list[pb.CounterReading] = []
        for url in self.urls:
            try:
                page = parse_totals(self.fetch(url, self.timeout).decode("utf-8", "replace"))
            except (OSError, ValueError) as e:
                self._failed(url, str(e))
                continue
            self.skipped_lines += page.skipped
            totals = page.values
            if page.skipped and not totals:
                self._failed(url, f"{page.skipped} bad lines and no NIXL series")
                continue
            src = self.source_name(url)
            for name in READINGS:
                if name in totals:
                    out.append(
                        pb.CounterReading(
                            kind="nixl",
                            device=src,
                            priority=-1,
                            name=name,
                            value=int(totals[name]),
                            width=64,
                        )
                    )
        return out

    def _failed(self, url: str, why: str) -> None:
        self.errors += 1
        warn_once(log, self._warned, url, "NIXL telemetry of %s not read: %s", url, why)
