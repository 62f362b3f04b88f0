"""Who is calling, and what they may do: one gate in front of every service on the port.

`Gate` is a grpc ServerInterceptor. Every call passes through it before any servicer
sees it:

1. the method names a service, and the service a role (`host` for the agent API,
   `ingest` for OTLP, `reader` for the Query service; health and reflection as
   configured);
2. the caller's identity comes from its bearer token (read from the call's metadata on
   gRPC's own thread, before a worker is taken: an unknown or missing token is answered
   UNAUTHENTICATED by a handler that does nothing else), from its client certificate
   (mutual TLS; gRPC shows the certificate only to the call, so that check is the first
   thing the call's worker does), or, on an insecure port, from its source address;
3. the identity must hold the role (PERMISSION_DENIED), stay within its rate (a token
   bucket per identity, RESOURCE_EXHAUSTED) and, for a stream, within its share of
   concurrent streams (per identity and in all; RESOURCE_EXHAUSTED);
4. on the agent API a host speaks only for itself: the host named in each request (each
   message of a stream) must be one the identity holds (PERMISSION_DENIED).

HTTP surfaces (OTLP/HTTP, fabricprobe.core.web) ask the same authenticators through
`http_guard`: the same token table, roles and certificate names; 401 for a missing or bad
credential, 403 for a known identity without the route's role.

Limits live in `Limits`: a bounded table of identities (least recently seen evicted,
counted) with a token bucket and a stream count each.
"""

from __future__ import annotations

import hmac
import ipaddress
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

from fabricprobe.core.errors import CallRefused
from fabricprobe.core.web import Caller, Refused, cert_names

TOKEN_HEADER = "authorization"
HOST, INGEST, READER = "host", "ingest", "reader"
ROLES = frozenset({HOST, INGEST, READER})
ANY = "any"  # a service any authenticated identity may call
OPEN = "open"  # a service anyone may call (still rate- and stream-limited by address)
MIN_TOKEN = 16


class AuthError(CallRefused):
    """A call the authentication layer refuses."""


@dataclass(frozen=True)
class Identity:
    """A caller as the gate knows it."""

    name: str  # the key its limits are kept under
    roles: frozenset[str]
    hosts: frozenset[str] = frozenset()  # host names it may speak for
    any_host: bool = False  # insecure: it may speak for any host
    addresses: frozenset[str] = frozenset()  # IP addresses its certificate names
    source: str = ""  # the connection's source address, when known

    def may_speak_for(self, host: str) -> bool:
        return self.any_host or host in self.hosts


class Authenticator(Protocol):
    def add_port(self, server: grpc.Server, address: str) -> int: ...

    def from_metadata(self, metadata: Any) -> Identity | None:
        """The identity metadata alone proves (raises AuthError for a bad credential),
        or None when only the call's context can tell."""
        ...

    def from_context(self, context: grpc.ServicerContext) -> Identity: ...

    def from_http(self, caller: Caller) -> Identity:
        """The identity an HTTP request proves (raises AuthError)."""
        ...

    def http_ssl(self) -> ssl.SSLContext | None:
        """TLS for the HTTP surfaces, as the gRPC port has it (None: plain text)."""
        ...


def identity_of(context: Any) -> Identity | None:
    """The identity the gate admitted CONTEXT's call as (unary calls)."""
    found = getattr(context, "fabricprobe_identity", None)
    return found if isinstance(found, Identity) else None


def peer_address(context: grpc.ServicerContext) -> str:
    """`ipv4:10.0.0.1:5000` / `ipv6:[::1]:5000` -> the address alone ("" if unknown)."""
    peer = str(context.peer() or "")
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return ""


class Insecure:
    """Plain text, anyone may speak for any host: for loopback tests and lab use only.
    Callers are told apart (for limits) by their source address."""

    def add_port(self, server: grpc.Server, address: str) -> int:
        return int(server.add_insecure_port(address))

    def from_metadata(self, metadata: Any) -> Identity | None:
        return None

    def from_context(self, context: grpc.ServicerContext) -> Identity:
        src = peer_address(context)
        return Identity(f"addr:{src}", ROLES, any_host=True, source=src)

    def from_http(self, caller: Caller) -> Identity:
        return Identity(f"addr:{caller.source}", ROLES, any_host=True, source=caller.source)

    def http_ssl(self) -> ssl.SSLContext | None:
        return None


@dataclass(frozen=True)
class TokenEntry:
    name: str
    roles: frozenset[str]


def read_token_file(path: Path | str) -> dict[str, TokenEntry]:
    """`NAME TOKEN [ROLE[,ROLE]]` per line (# comments) -> {token: entry}.

    ROLE is `host` (the default: NAME is a host the token speaks for), `ingest` (may send
    OTLP spans) or `reader` (may call the Query service). ValueError names the bad line."""
    out: dict[str, TokenEntry] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        if len(parts) not in (2, 3) or len(parts[1]) < MIN_TOKEN:
            raise ValueError(
                f"{path}:{n}: expected `NAME TOKEN [ROLE]` with a token of {MIN_TOKEN}+ characters"
            )
        roles = frozenset(parts[2].split(",")) if len(parts) == 3 else frozenset({HOST})
        if not roles <= ROLES:
            raise ValueError(f"{path}:{n}: roles are {', '.join(sorted(ROLES))}")
        if parts[1] in out:
            raise ValueError(f"{path}:{n}: a token is given twice")
        out[parts[1]] = TokenEntry(parts[0], roles)
    if not out:
        raise ValueError(f"{path}: no tokens")
    return out


def metadata_token(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == TOKEN_HEADER and isinstance(value, str):
            return value.removeprefix("Bearer ").strip()
    return None


class TokenAuth:
    """Bearer tokens (per host, and for ingest and reader callers), over TLS when
    CREDENTIALS are given (else plain text)."""

    def __init__(
        self,
        tokens: dict[str, TokenEntry] | dict[str, str],
        credentials: grpc.ServerCredentials | None = None,
        http_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.tokens: dict[bytes, TokenEntry] = {
            t.encode(): e if isinstance(e, TokenEntry) else TokenEntry(e, frozenset({HOST}))
            for t, e in tokens.items()
        }
        self.credentials = credentials
        self.http_tls = http_tls

    def add_port(self, server: grpc.Server, address: str) -> int:
        if self.credentials is None:
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, self.credentials))

    def from_metadata(self, metadata: Any) -> Identity | None:
        token = metadata_token(metadata)
        if token is None:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "no bearer token in metadata")
        raw = token.encode()
        # compare with every token, in constant time each, so timing tells nothing
        entry = None
        for t, e in self.tokens.items():
            if hmac.compare_digest(t, raw):
                entry = e
        if entry is None:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
        hosts = frozenset({entry.name}) if HOST in entry.roles else frozenset()
        return Identity(f"token:{entry.name}", entry.roles, hosts)

    def from_context(self, context: grpc.ServicerContext) -> Identity:
        found = self.from_metadata(context.invocation_metadata())
        assert found is not None
        return found

    def from_http(self, caller: Caller) -> Identity:
        header = caller.authorization.strip()
        if header and not header.lower().startswith("bearer "):
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "expected a bearer token")
        token = "Bearer " + header[7:].strip() if header else ""
        found = self.from_metadata([(TOKEN_HEADER, token)] if token else [])
        assert found is not None
        return replace(found, source=caller.source)

    def http_ssl(self) -> ssl.SSLContext | None:
        return self.http_tls


def _san_names(context: grpc.ServicerContext) -> tuple[set[str], set[str]]:
    """(names, IP addresses) of the client certificate of CONTEXT's connection."""
    ctx = context.auth_context()
    names: set[str] = set()
    ips: set[str] = set()
    for k in ("x509_common_name", "x509_subject_alternative_name"):
        for v in ctx.get(k, []):
            text = v.decode(errors="replace")
            try:
                ips.add(str(ipaddress.ip_address(text)))
            except ValueError:
                names.add(text)
    return names, ips


class MutualTls:
    """TLS with required client certificates; the certificate names the caller.

    A certificate naming one of READERS (INGEST) may call the Query service (send OTLP
    spans); any other speaks for the hosts it names."""

    def __init__(
        self,
        credentials: grpc.ServerCredentials,
        http_tls: ssl.SSLContext,
        readers: frozenset[str],
        ingest: frozenset[str],
    ) -> None:
        self.credentials, self.http_tls = credentials, http_tls
        self.readers, self.ingest = readers, ingest

    @classmethod
    def from_files(
        cls,
        cert: str,
        key: str,
        client_ca: str,
        *,
        readers: frozenset[str] = frozenset(),
        ingest: frozenset[str] = frozenset(),
    ) -> MutualTls:
        """TLS of the PEM files CERT, KEY and CLIENT_CA, for gRPC and for HTTP alike."""
        cert_pem, key_pem, ca_pem = (Path(f).read_bytes() for f in (cert, key, client_ca))
        credentials = grpc.ssl_server_credentials(
            [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True
        )
        return cls(credentials, server_ssl(cert, key, client_ca), readers, ingest)

    def add_port(self, server: grpc.Server, address: str) -> int:
        return int(server.add_secure_port(address, self.credentials))

    def from_metadata(self, metadata: Any) -> Identity | None:
        return None  # the certificate is known to the call only

    def from_context(self, context: grpc.ServicerContext) -> Identity:
        names, ips = _san_names(context)
        return self._identity(names, ips, peer_address(context))

    def from_http(self, caller: Caller) -> Identity:
        names, ips = cert_names(caller.peercert)
        return self._identity(names, ips, caller.source)

    def http_ssl(self) -> ssl.SSLContext | None:
        return self.http_tls

    def _identity(self, names: set[str], ips: set[str], source: str) -> Identity:
        if not names and not ips:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
        roles = set()
        if names & self.readers:
            roles.add(READER)
        if names & self.ingest:
            roles.add(INGEST)
        if not roles:
            roles.add(HOST)
        hosts = frozenset(names) if HOST in roles else frozenset()
        return Identity(
            "cert:" + min(names or ips),
            frozenset(roles),
            hosts,
            addresses=frozenset(ips),
            source=source,
        )


def server_ssl(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """The HTTP surfaces' TLS, as the gRPC port's: CERT and KEY, and with CLIENT_CA a
    client certificate it signed is required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


_HTTP_STATUS = {grpc.StatusCode.UNAUTHENTICATED: (401, "unauthenticated")}


def http_guard(auth: Authenticator) -> Callable[[Caller, str], Identity]:
    """The guard of the HTTP surfaces (fabricprobe.core.web): AUTH's identity of the
    caller, which must hold the route's role. 401 for no or a bad credential (with a
    WWW-Authenticate challenge), 403 for a known identity without the role."""

    def guard(caller: Caller, role: str) -> Identity:
        try:
            ident = auth.from_http(caller)
        except AuthError as e:
            status, reason = _HTTP_STATUS.get(e.code, (403, "permission"))
            raise Refused(status, reason, str(e), {"WWW-Authenticate": "Bearer"}) from None
        if role not in (ANY, OPEN) and role not in ident.roles:
            raise Refused(403, "permission", f"{ident.name} lacks the {role} role")
        return ident

    return guard


# -- limits -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GateConfig:
    rate: float = 50.0  # calls (and stream messages) per second per identity
    burst: float = 500.0  # replays after an outage come in bursts
    streams_per_identity: int = 4  # concurrent streaming calls per identity
    max_streams: int = 32  # concurrent streaming calls in all (keep workers for unary calls)
    max_identities: int = 10_000  # identities whose limits are remembered
    stream_idle_s: float = 60.0  # a stream that sends nothing this long is cancelled
    health: str = OPEN  # OPEN, ANY (authenticated) or "off"
    reflection: str = ANY


@dataclass
class _Entry:
    tokens: float
    last: float
    streams: int = 0


REFUSALS = ("unauthenticated", "permission", "rate", "streams", "busy")


class LimitCounts(NamedTuple):
    """A copy of the limits table's figures."""

    refused: dict[str, int]  # reason (REFUSALS) -> calls
    evicted: int  # identities forgotten to make room
    identities: int  # identities held now
    streams: int  # streams open now


class Limits:
    """Per-identity token buckets and stream counts in a table of bounded size.

    Eviction: when the table is full, the least recently seen identity that holds no
    stream is forgotten (counted in `evicted`); a forgotten identity starts again with a
    full bucket, so eviction can only be generous, never lock a caller out."""

    def __init__(self, cfg: GateConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg, self.clock = cfg, clock
        self.lock = threading.Lock()
        self.table: OrderedDict[str, _Entry] = OrderedDict()
        self.streams = 0
        self.evicted = 0
        self.refused: dict[str, int] = dict.fromkeys(REFUSALS, 0)

    def _entry(self, name: str, now: float) -> _Entry:
        e = self.table.get(name)
        if e is None:
            if len(self.table) >= self.cfg.max_identities:
                for old, oe in self.table.items():
                    if oe.streams == 0:
                        del self.table[old]
                        self.evicted += 1
                        break
            e = self.table[name] = _Entry(self.cfg.burst, now)
        else:
            self.table.move_to_end(name)
        return e

    def take(self, name: str) -> bool:
        """One token of NAME's bucket; False (counted) when it is empty."""
        with self.lock:
            now = self.clock()
            e = self._entry(name, now)
            e.tokens = min(self.cfg.burst, e.tokens + (now - e.last) * self.cfg.rate)
            e.last = now
            if e.tokens >= 1.0:
                e.tokens -= 1.0
                return True
            self.refused["rate"] += 1
            return False

    def open_stream(self, name: str) -> str | None:
        """Count a stream for NAME; the refusal's reason when it may not have one."""
        with self.lock:
            e = self._entry(name, self.clock())
            if e.streams >= self.cfg.streams_per_identity:
                self.refused["streams"] += 1
                return f"{self.cfg.streams_per_identity} streams already open for this identity"
            if self.streams >= self.cfg.max_streams:
                self.refused["busy"] += 1
                return f"{self.cfg.max_streams} streams already open on this collector"
            e.streams += 1
            self.streams += 1
            return None

    def close_stream(self, name: str) -> None:
        with self.lock:
            e = self.table.get(name)
            if e is not None and e.streams > 0:
                e.streams -= 1
            self.streams = max(0, self.streams - 1)

    def refuse(self, reason: str) -> None:
        with self.lock:
            self.refused[reason] += 1

    def snapshot(self) -> LimitCounts:
        with self.lock:
            return LimitCounts(dict(self.refused), self.evicted, len(self.table), self.streams)


# -- the interceptor --------------------------------------------------------------------


Claim = Callable[[Any], str]  # request -> the host it speaks for


@dataclass(frozen=True)
class Policy:
    """Which role each service needs, and which host each agent-API request names."""

    roles: dict[str, str]  # service full name -> role, ANY or OPEN
    claims: dict[str, Claim] = field(default_factory=dict)  # "/svc/Method" -> claim


@dataclass
class _Stream:
    context: Any
    last: float


def _refusal(handler: Any, code: grpc.StatusCode, message: str) -> Any:
    """A handler of HANDLER's kind that ends the call with CODE and does nothing else."""

    def deny(request: Any, context: Any) -> Any:
        context.abort(code, message)

    def deny_stream(request: Any, context: Any) -> Iterator[Any]:
        context.abort(code, message)
        yield  # pragma: no cover  # makes it a generator, as gRPC expects here

    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(deny, **kw)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **kw)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny, **kw)
    return grpc.stream_stream_rpc_method_handler(deny_stream, **kw)


_CODES = {
    grpc.StatusCode.UNAUTHENTICATED: "unauthenticated",
    grpc.StatusCode.PERMISSION_DENIED: "permission",
}


class Gate(grpc.ServerInterceptor):
    """The one authentication and admission layer of the server (see the module doc)."""

    def __init__(self, auth: Authenticator, policy: Policy, cfg: GateConfig | None = None) -> None:
        self.auth, self.policy = auth, policy
        self.cfg = cfg or GateConfig()
        self.limits = Limits(self.cfg)
        self._streams: dict[int, _Stream] = {}
        self._streams_lock = threading.Lock()
        self.idle_cancelled = 0

    # gRPC's own thread: no worker is held yet
    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = str(details.method)
        service = method[1:].rsplit("/", 1)[0]
        need = self.policy.roles.get(service)
        if need is None or need == "off":
            return self._deny(handler, grpc.StatusCode.PERMISSION_DENIED, "service not served")
        ident: Identity | None = None
        if need != OPEN:
            try:
                ident = self.auth.from_metadata(details.invocation_metadata)
            except AuthError as e:
                return self._deny(handler, e.code, str(e))
            if ident is not None:
                refused = self._admit(ident, need)
                if refused is not None:
                    return self._deny(handler, *refused)
        return self._wrap(handler, method, need, ident)

    def _deny(self, handler: Any, code: grpc.StatusCode, message: str) -> Any:
        self.limits.refuse(_CODES.get(code, "permission"))
        return _refusal(handler, code, message)

    def _admit(self, ident: Identity, need: str) -> tuple[grpc.StatusCode, str] | None:
        if need not in (ANY, OPEN) and need not in ident.roles:
            self.limits.refuse("permission")
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                f"{ident.name} may not call this service (needs the {need} role)",
            )
        if not self.limits.take(ident.name):
            return (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{ident.name} exceeds {self.cfg.rate:g} calls/s",
            )
        return None

    def _identify(self, context: Any, need: str, known: Identity | None) -> Identity:
        """The caller of CONTEXT, admitted; aborts the call otherwise."""
        if known is not None:
            return known
        if need == OPEN:
            src = peer_address(context)
            ident = Identity(f"addr:{src}", frozenset(), source=src)
        else:
            try:
                ident = self.auth.from_context(context)
            except AuthError as e:
                self.limits.refuse(_CODES.get(e.code, "permission"))
                context.abort(e.code, str(e))
        refused = self._admit(ident, need)
        if refused is not None:
            context.abort(*refused)
        return ident

    def _check_claim(self, ident: Identity, claim: Claim | None, request: Any, ctx: Any) -> None:
        if claim is None:
            return
        host = claim(request)
        if not ident.may_speak_for(host):
            self.limits.refuse("permission")
            held = sorted(ident.hosts) or [ident.name]
            ctx.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{ident.name} speaks for {held}, not for {host[:80]!r}:"
                " a host reports only as itself",
            )

    def _wrap(self, handler: Any, method: str, need: str, known: Identity | None) -> Any:
        claim = self.policy.claims.get(method)
        kw = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(request: Any, context: Any) -> Any:
                ident = self._identify(context, need, known)
                context.fabricprobe_identity = ident  # for servicers that need it (Register)
                self._check_claim(ident, claim, request, context)
                return inner(request, context)

            return grpc.unary_unary_rpc_method_handler(unary, **kw)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            def unary_stream(request: Any, context: Any) -> Iterator[Any]:
                ident = self._identify(context, need, known)
                self._check_claim(ident, claim, request, context)
                with self._stream(ident, context):
                    yield from inner_us(request, context)

            return grpc.unary_stream_rpc_method_handler(unary_stream, **kw)
        if handler.stream_stream is not None:
            inner_ss = handler.stream_stream

            def stream_stream(requests: Iterator[Any], context: Any) -> Iterator[Any]:
                ident = self._identify(context, need, known)
                with self._stream(ident, context) as slot:
                    yield from inner_ss(
                        self._messages(requests, ident, claim, context, slot), context
                    )

            return grpc.stream_stream_rpc_method_handler(stream_stream, **kw)
        return handler  # stream-unary: no service here has one

    def _messages(
        self, requests: Iterator[Any], ident: Identity, claim: Claim | None, ctx: Any, slot: _Stream
    ) -> Iterator[Any]:
        """Each message of a stream: counted against the rate, checked against the claim."""
        first = True
        for msg in requests:
            slot.last = time.monotonic()
            # the call itself took the first token
            if not first and not self.limits.take(ident.name):
                ctx.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{ident.name} exceeds {self.cfg.rate:g} messages/s",
                )
            first = False
            self._check_claim(ident, claim, msg, ctx)
            yield msg

    def _stream(self, ident: Identity, context: Any) -> _StreamSlot:
        return _StreamSlot(self, ident, context)

    def cancel_idle(self, now: float | None = None) -> int:
        """Cancel streams silent for stream_idle_s; how many were."""
        t = time.monotonic() if now is None else now
        with self._streams_lock:
            idle = [s for s in self._streams.values() if t - s.last > self.cfg.stream_idle_s]
        for s in idle:
            s.context.cancel()
        self.idle_cancelled += len(idle)
        return len(idle)


class _StreamSlot:
    """A stream's place in the limits for as long as it runs."""

    def __init__(self, gate: Gate, ident: Identity, context: Any) -> None:
        self.gate, self.ident, self.context = gate, ident, context
        self.slot = _Stream(context, time.monotonic())

    def __enter__(self) -> _Stream:
        refused = self.gate.limits.open_stream(self.ident.name)
        if refused is not None:
            self.context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        with self.gate._streams_lock:
            self.gate._streams[id(self.slot)] = self.slot
        return self.slot

    def __exit__(self, *exc: object) -> None:
        with self.gate._streams_lock:
            self.gate._streams.pop(id(self.slot), None)
        self.gate.limits.close_stream(self.ident.name)
