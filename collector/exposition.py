"""/metrics: the Prometheus text format (0.0.4) of a registry, rendered fast, and the
HTTP server that serves it — in text, or in protobuf with native histograms to a server
whose Accept header asks for that (fabricprobe.core.promproto).

A collector of N agents exports about 34 series per probed path (the RTT histogram's
buckets most of all): 544,000 samples for 1,000 agents with 16 peers each.
prometheus_client's generate_latest() validates and escapes every label name of every
sample; `render()` writes the same bytes (a test holds it to generate_latest's output)
with one template per label-name tuple and each distinct label value escaped once.
Measured by bench/collector_ingest.py at 1,000 agents: a whole scrape took 7.4 s of
CPU with generate_latest and 4.7 s with render(), the rest being the families built.

The server is fabricprobe.core.web's (no thread per connection, deadlines, connection
caps per source), so one misbehaving client cannot starve Prometheus of its scrape.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import gzip
import hashlib
import os
import re
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.utils import floatToGoString

from fabricprobe.core.promproto import CONTENT_TYPE_PROTOBUF, encode, wants_protobuf
from fabricprobe.core.web import (
    OPEN,
    Call,
    Caller,
    Guard,
    Limits,
    Refused,
    Reply,
    Route,
    WebServer,
    WebStats,
)

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


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a scrape is built, in either form: a scrape
    allocates a few hundred thousand short-lived objects, none in a cycle, and each
    collection they set off walks every object the store holds (over 100,000 paths on a
    large shard): that was two thirds of a scrape's CPU. Whatever is collectable is
    collected after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def render(registry: CollectorRegistry) -> bytes:
    """generate_latest(REGISTRY), byte for byte, faster (with the collector paused)."""
    with gc_paused():
        labels = _Labels()
        out: list[str] = []
        for metric in registry.collect():
            try:
                out.extend(_family(metric, labels))
            except _Fallback:  # names that need escaping: the library writes this family
                out.append(generate_latest(_One(metric)).decode())
        return "".join(out).encode()


# -- serving /metrics ------------------------------------------------------------------


class ScrapeCounts(NamedTuple):
    """A copy of ScrapeStats' figures."""

    renders: int
    served: int
    refused: dict[str, int]  # reason -> requests


class ScrapeStats:
    """What the /metrics server did: renders, and requests it turned away (by reason)."""

    REASONS = ("busy", "unauthorized", "not_found")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.renders = 0
        self.served = 0
        self.refused: dict[str, int] = dict.fromkeys(self.REASONS, 0)

    def count(self, what: str) -> None:
        with self.lock:
            if what in self.refused:
                self.refused[what] += 1
            elif what == "render":
                self.renders += 1
            else:
                self.served += 1

    def snapshot(self) -> ScrapeCounts:
        with self.lock:
            return ScrapeCounts(self.renders, self.served, dict(self.refused))


@dataclass
class _Form:
    """One rendered form of /metrics: when, its bytes, and their gzip once asked for."""

    at: float
    plain: bytes
    gzip: bytes | None = None


class RenderCache:
    """One render serves every GET within MAX_AGE_S: concurrent scrapes wait for the
    render in progress instead of starting their own, so what strangers' GETs cost does
    not grow with how many of them there are. The text and the protobuf forms are
    rendered and kept apart (a server asks for one of them)."""

    def __init__(
        self, registry: CollectorRegistry, max_age_s: float = 1.0, stats: ScrapeStats | None = None
    ) -> None:
        self.registry, self.max_age_s = registry, max_age_s
        self.stats = stats or ScrapeStats()
        self._lock = threading.Lock()
        self._forms: dict[bool, _Form] = {}  # False: text, True: protobuf

    def get(self, want_gzip: bool, protobuf: bool = False) -> bytes:
        with self._lock:  # one render at a time; the others wait here and take its output
            now = time.monotonic()
            form = self._forms.get(protobuf)
            if form is None or now - form.at >= self.max_age_s:
                if protobuf:
                    with gc_paused():
                        body = encode(self.registry.collect())
                else:
                    body = render(self.registry)
                form = self._forms[protobuf] = _Form(time.monotonic(), body)
                self.stats.count("render")
            if not want_gzip:
                return form.plain
            if form.gzip is None:
                form.gzip = gzip.compress(form.plain, compresslevel=1)
            return form.gzip


@dataclass(frozen=True)
class WebConfig:
    """What a web-config file (prometheus/exporter-toolkit's format) asks for.

    ::

        tls_server_config:
          cert_file: /etc/fabricprobe/metrics.pem
          key_file: /etc/fabricprobe/metrics.key
          client_ca_file: /etc/fabricprobe/ca.pem     # optional
          client_auth_type: RequireAndVerifyClientCert  # with client_ca_file
        basic_auth_users:
          prometheus: $2y$10$...                       # bcrypt hash (htpasswd -nBC 10)
    """

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""
    client_auth_type: str = "NoClientCert"
    users: tuple[tuple[str, bytes], ...] = ()  # (user, bcrypt hash)

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.cert_file:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            ctx.load_verify_locations(self.client_ca_file)
            ctx.verify_mode = (
                ssl.CERT_REQUIRED
                if self.client_auth_type == "RequireAndVerifyClientCert"
                else ssl.CERT_OPTIONAL
            )
        return ctx


_CLIENT_AUTH = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
_BCRYPT = re.compile(rb"^\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}$")


def load_web_config(path: str) -> WebConfig:
    """Read PATH; ValueError says what is wrong with it (unknown keys are refused)."""
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not YAML: {e}") from None
    except RecursionError:  # flow collections nested past the loader's stack
        raise ValueError(f"{path}: not YAML: nested too deep") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping")
    unknown = set(data) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
    tls = data.get("tls_server_config") or {}
    users = data.get("basic_auth_users") or {}
    if not isinstance(tls, dict) or not isinstance(users, dict):
        raise ValueError(f"{path}: tls_server_config and basic_auth_users are mappings")
    known_tls = {"cert_file", "key_file", "client_ca_file", "client_auth_type"}
    if set(tls) - known_tls:
        raise ValueError(f"{path}: tls_server_config: unknown keys {sorted(set(tls) - known_tls)}")
    cert, key = str(tls.get("cert_file", "")), str(tls.get("key_file", ""))
    if bool(cert) != bool(key):
        raise ValueError(f"{path}: cert_file and key_file go together")
    auth_type = str(tls.get("client_auth_type", "NoClientCert"))
    if auth_type not in _CLIENT_AUTH:
        raise ValueError(f"{path}: client_auth_type is one of {', '.join(_CLIENT_AUTH)}")
    ca = str(tls.get("client_ca_file", ""))
    if auth_type != "NoClientCert" and not ca:
        raise ValueError(f"{path}: client_auth_type {auth_type} needs client_ca_file")
    if (ca or tls) and not cert:
        raise ValueError(f"{path}: tls_server_config needs cert_file and key_file")
    hashed: list[tuple[str, bytes]] = []
    for user, h in users.items():
        raw = str(h).encode()
        if not _BCRYPT.match(raw):
            raise ValueError(f"{path}: basic_auth_users.{user}: expected a bcrypt hash")
        hashed.append((str(user), raw))
    if hashed:
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise ValueError(f"{path}: basic_auth_users needs the bcrypt package") from None
    if hashed and not cert:
        raise ValueError(
            f"{path}: basic_auth_users without tls_server_config would send passwords in clear"
        )
    cfg = WebConfig(cert, key, ca, auth_type, tuple(hashed))
    cfg.ssl_context()  # unreadable files fail now, not at the first scrape
    return cfg


class _Passwords:
    """bcrypt checks, with the pairs that passed remembered (bounded): a bcrypt check
    costs tens of ms of CPU, and Prometheus sends the same pair every scrape."""

    MAX = 256

    CHECKS_PER_S = 4.0  # bcrypt checks of pairs not yet seen: what strangers may cost

    def __init__(self, users: tuple[tuple[str, bytes], ...]) -> None:
        self.users = dict(users)
        self.salt = os.urandom(16)
        self.ok: set[bytes] = set()
        self.lock = threading.Lock()
        self._budget, self._at = self.CHECKS_PER_S, time.monotonic()

    def _may_check(self) -> bool:
        with self.lock:
            now = time.monotonic()
            self._budget = min(
                self.CHECKS_PER_S, self._budget + (now - self._at) * self.CHECKS_PER_S
            )
            self._at = now
            if self._budget < 1.0:
                return False
            self._budget -= 1.0
            return True

    def check(self, header: str) -> bool:
        import bcrypt

        scheme, _, blob = header.partition(" ")
        if scheme.lower() != "basic" or len(blob) > 1024:
            return False
        try:
            user, _, password = base64.b64decode(blob, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        h = self.users.get(user)
        if h is None:
            return False
        key = hashlib.sha256(self.salt + user.encode() + b"\0" + password.encode()).digest()
        with self.lock:
            if key in self.ok:
                return True
        if not self._may_check() or not bcrypt.checkpw(password.encode(), h):
            return False
        with self.lock:
            if len(self.ok) >= self.MAX:
                self.ok.clear()
            self.ok.add(key)
        return True


# web refusal reasons (fabricprobe.core.web) as the scrape counters have always named them
_SCRAPE_REASONS = {
    "busy": "busy",
    "source": "busy",
    "memory": "busy",
    "unauthenticated": "unauthorized",
    "permission": "unauthorized",
    "not_found": "not_found",
}


def basic_auth_guard(passwords: _Passwords) -> Guard:
    """The /metrics guard of a web config's basic_auth_users: 401 with a challenge."""

    def guard(caller: Caller, role: str) -> str:
        if not passwords.check(caller.authorization):
            raise Refused(
                401,
                "unauthenticated",
                "unauthorized",
                {"WWW-Authenticate": 'Basic realm="fabricprobe"'},
            )
        return "basic"

    return guard


def metrics_route(cache: RenderCache, role: str = OPEN) -> Route:
    """GET /metrics (and /) from CACHE, in text or protobuf, gzipped when asked."""

    def handle(call: Call) -> Reply:
        want_gzip = "gzip" in call.headers.get("Accept-Encoding", "")
        protobuf = wants_protobuf(call.headers.get("Accept", ""))
        body = cache.get(want_gzip, protobuf)
        headers = {"Vary": "Accept, Accept-Encoding"}  # the body depends on both
        if want_gzip:
            headers["Content-Encoding"] = "gzip"
        cache.stats.count("served")
        ctype = CONTENT_TYPE_PROTOBUF if protobuf else CONTENT_TYPE_PLAIN_0_0_4
        return Reply(200, body, ctype, headers)

    return Route(("/metrics", "/"), ("GET",), role, handle)


def serve_metrics(
    host: str,
    port: int,
    registry: CollectorRegistry,
    *,
    web: WebConfig | None = None,
    stats: ScrapeStats | None = None,
    max_threads: int = 4,
    cache_s: float = 1.0,
    limits: Limits | None = None,
    web_stats: WebStats | None = None,
) -> WebServer:
    """Serve REGISTRY on http(s)://HOST:PORT/metrics (fabricprobe.core.web, with TLS and
    basic auth as WEB asks); MAX_THREADS renders or password checks run at once. The
    caller stops it (shutdown())."""
    web = web or WebConfig()
    stats = stats or ScrapeStats()
    lim = limits or Limits()
    lim = replace(lim, workers=max(1, max_threads))
    wstats = web_stats or WebStats()
    prior = wstats.on_refused

    def counted(reason: str) -> None:
        if reason in _SCRAPE_REASONS:
            stats.count(_SCRAPE_REASONS[reason])
        if prior is not None:
            prior(reason)

    wstats.on_refused = counted
    guard = basic_auth_guard(_Passwords(web.users)) if web.users else None
    route = metrics_route(RenderCache(registry, cache_s, stats), "basic" if guard else OPEN)
    server = WebServer(
        host,
        port,
        [route],
        guard=guard,
        ssl_context=web.ssl_context(),
        limits=lim,
        stats=wstats,
        name="metrics-http",
    )
    return server.start()
