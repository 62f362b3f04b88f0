"""/metrics: the Prometheus text format (0.0.4) of a registry, rendered fast, and the
HTTP server that serves it.

A collector of N agents exports about 34 series per probed path (the RTT histogram's
buckets most of all): 544,000 samples for 1,000 agents with 16 peers each.
prometheus_client's generate_latest() validates and escapes every label name of every
sample; `render()` writes the same bytes (a test holds it to generate_latest's output)
with one template per label-name tuple and each distinct label value escaped once.
Measured by bench/collector_ingest.py at 1,000 agents: a whole scrape took 7.4 s of
CPU with generate_latest and 4.7 s with render(), the rest being the families built.
"""

from __future__ import annotations

import gzip
import re
import socket
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.utils import floatToGoString

_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LEGACY_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _Escaped(dict[str, str]):
    """Label value -> its escaped text, filled as values are met (hosts, `le` bounds,
    ops repeat across thousands of samples)."""

    def __missing__(self, value: str) -> str:
        out = self[value] = _value(value)
        return out


class _Labels:
    """Renders a sample's labels: one template per label-name tuple (names checked and
    sorted once), filled with escaped values."""

    def __init__(self) -> None:
        self.templates: dict[tuple[str, ...], tuple[str, list[int]]] = {}
        self.escaped = _Escaped()

    def __call__(self, labels: dict[str, str]) -> str:
        if not labels:
            return ""
        names = tuple(labels)
        t = self.templates.get(names)
        if t is None:
            if not all(_LEGACY_LABEL.match(k) for k in names):
                raise _Fallback
            order = sorted(range(len(names)), key=names.__getitem__)
            body = ",".join(f'{names[i]}="{{}}"' for i in order)
            t = self.templates[names] = ("{{" + body + "}}", order)
        template, order = t
        values = list(map(self.escaped.__getitem__, labels.values()))
        return template.format(*[values[i] for i in order])


class _Fallback(Exception):
    """A name this renderer does not write itself (the library escapes it)."""


def _family(metric: Any, labels: _Labels) -> list[str]:
    name, mtype = metric.name, metric.type
    if not _LEGACY_NAME.match(name):
        raise _Fallback
    if mtype == "counter":
        mname = name + "_total"
    elif mtype == "info":
        mname = name + "_info"
    else:
        mname = name
    mtype = _TYPES.get(mtype, mtype)
    doc = _help(metric.documentation)
    out = [f"# HELP {mname} {doc}\n# TYPE {mname} {mtype}\n"]
    extra: dict[str, list[str]] = {}
    om = tuple(name + s for s in _OM_SUFFIXES)
    for s in metric.samples:
        if s.timestamp is not None or not _LEGACY_NAME.match(s.name):
            raise _Fallback
        line = f"{s.name}{labels(s.labels)} {floatToGoString(s.value)}\n"
        if s.name in om:
            extra.setdefault(s.name[len(name) :], []).append(line)
        else:
            out.append(line)
    for suffix, lines in sorted(extra.items()):
        out.append(f"# HELP {name}{suffix} {doc}\n# TYPE {name}{suffix} gauge\n")
        out.extend(lines)
    return out


class _One:
    """A registry of one already-collected family, for the library's own writer."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Any]:
        return [self.metric]


def render(registry: CollectorRegistry) -> bytes:
    """generate_latest(REGISTRY), byte for byte, faster."""
    labels = _Labels()
    out: list[str] = []
    for metric in registry.collect():
        try:
            out.extend(_family(metric, labels))
        except _Fallback:  # names that need escaping: the library writes this family
            out.append(generate_latest(_One(metric)).decode())
    return "".join(out).encode()


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is served here")
            return
        body = render(self.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes are counted in the scrape-duration gauge, not logged


def serve_metrics(host: str, port: int, registry: CollectorRegistry) -> ThreadingHTTPServer:
    """Serve REGISTRY on http://HOST:PORT/metrics from a daemon thread; the caller shuts
    it down (shutdown() and server_close())."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("MetricsServer", (ThreadingHTTPServer,), {"address_family": family})
    handler = type("MetricsHandler", (_Handler,), {"registry": registry})
    server = server_class((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
