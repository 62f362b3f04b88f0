"""Who is calling: mutual TLS, per-host tokens, or plain text when asked for explicitly.

Every mode answers one question for each call: may this caller speak for host H? With
client certificates the certificate's common name or a DNS subject-alternative name
must be H; with tokens, the token presented must be the one issued to H. A host can
therefore only register and report as itself.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Protocol

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

TOKEN_HEADER = "authorization"


class AuthError(Exception):
    """A call that may not go on; `code` is the gRPC status to end it with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Authenticator(Protocol):
    def add_port(self, server: grpc.Server, address: str) -> int: ...

    def check(self, context: grpc.ServicerContext, host: str) -> None: ...


class Insecure:
    """Plain text, anyone may speak for any host: for loopback tests and lab use only."""

    def add_port(self, server: grpc.Server, address: str) -> int:
        return int(server.add_insecure_port(address))

    def check(self, context: grpc.ServicerContext, host: str) -> None:
        return None


def read_token_file(path: Path | str) -> dict[str, str]:
    """`HOST TOKEN` per line (# comments) -> {token: host}. ValueError names the bad line."""
    out: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        if len(parts) != 2 or len(parts[1]) < 16:
            raise ValueError(f"{path}:{n}: expected `HOST TOKEN` with a token of 16+ characters")
        out[parts[1]] = parts[0]
    if not out:
        raise ValueError(f"{path}: no tokens")
    return out


def _metadata_token(context: grpc.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == TOKEN_HEADER and isinstance(value, str):
            return value.removeprefix("Bearer ").strip()
    return None


class TokenAuth:
    """Per-host bearer tokens, over TLS when CREDENTIALS are given (else plain text)."""

    def __init__(
        self, tokens: dict[str, str], credentials: grpc.ServerCredentials | None = None
    ) -> None:
        self.tokens = tokens
        self.credentials = credentials

    def add_port(self, server: grpc.Server, address: str) -> int:
        if self.credentials is None:
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, self.credentials))

    def check(self, context: grpc.ServicerContext, host: str) -> None:
        token = _metadata_token(context)
        if token is None:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "no bearer token in metadata")
        owner = next((h for t, h in self.tokens.items() if hmac.compare_digest(t, token)), None)
        if owner is None:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
        if owner != host:
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"token belongs to {owner}, not to {host!r}: a host reports only as itself",
            )


class MutualTls:
    """TLS with required client certificates; the certificate names the host."""

    def __init__(self, cert: bytes, key: bytes, client_ca: bytes) -> None:
        self.credentials = grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca, require_client_auth=True
        )

    @classmethod
    def from_files(cls, cert: str, key: str, client_ca: str) -> MutualTls:
        return cls(Path(cert).read_bytes(), Path(key).read_bytes(), Path(client_ca).read_bytes())

    def add_port(self, server: grpc.Server, address: str) -> int:
        return int(server.add_secure_port(address, self.credentials))

    def check(self, context: grpc.ServicerContext, host: str) -> None:
        ctx = context.auth_context()
        names = {
            v.decode()
            for k in ("x509_common_name", "x509_subject_alternative_name")
            for v in ctx.get(k, [])
        }
        if not names:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
        if host not in names:
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"certificate is for {sorted(names)}, not {host!r}: a host reports only as itself",
            )
