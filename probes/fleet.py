"""The fleet token: how a responder knows that a prober belongs to the fleet.

Every host of a fleet holds the same secret (a token file, 16 or more characters). It
never crosses the wire: after the prober's hello the responder sends a fresh random
nonce (`challenge`), and the prober answers with HMAC-SHA256(token, context) where the
context binds the nonce to this one control connection and this one request: the
prober's and the responder's IP addresses as each end sees them, the session kind and
a digest of the hello. A recorded answer is worth nothing on another connection (new
nonce), from another address, or for another request. Through NAT the two ends see
different addresses and the answer does not verify: probe the fleet's own addresses.

Why a shared token rather than tickets from the collector or TLS: a responder must
decide within a hello deadline and with no call to anyone (the collector may be down,
and probing must go on), a token costs one HMAC per session instead of a handshake, and
it matches how agents already hold a collector token file. Its limit: anyone holding
the token is the fleet; rotate it as a fleet secret.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from pathlib import Path
from typing import Any

MIN_TOKEN_CHARS = 16
NONCE_BYTES = 32
_DOMAIN = b"fabricprobe probe session v1\x00"


def canonical_ip(ip: str) -> str:
    """One spelling per address: IPv4-mapped IPv6 (a dual-stack socket's view) -> IPv4."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def hello_digest(kind: str, params: dict[str, Any]) -> bytes:
    """SHA-256 of the hello's request, spelled the same way on both ends."""
    text = json.dumps({"session": kind, "params": params}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).digest()


class FleetToken:
    """The fleet's shared secret; `answer()` on the prober, `verify()` on the responder."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_TOKEN_CHARS:
            raise ValueError(f"a fleet token has at least {MIN_TOKEN_CHARS} characters")
        self._secret = secret

    def __repr__(self) -> str:
        return "FleetToken(...)"

    @classmethod
    def from_file(cls, path: str | Path) -> FleetToken:
        """The token in PATH (its first line, surrounding space stripped)."""
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: cannot read the fleet token: {e}") from None
        line = text.strip().splitlines()[0].strip() if text.strip() else ""
        try:
            return cls(line.encode())
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def answer(
        self, nonce: bytes, prober_ip: str, responder_ip: str, kind: str, params: dict[str, Any]
    ) -> str:
        """The hex MAC a prober sends for NONCE on the connection PROBER_IP -> RESPONDER_IP
        asking for session KIND with PARAMS."""
        context = b"|".join(
            (
                _DOMAIN + nonce,
                canonical_ip(prober_ip).encode(),
                canonical_ip(responder_ip).encode(),
                hello_digest(kind, params),
            )
        )
        return hmac.new(self._secret, context, hashlib.sha256).hexdigest()

    def verify(
        self,
        mac: str,
        nonce: bytes,
        prober_ip: str,
        responder_ip: str,
        kind: str,
        params: dict[str, Any],
    ) -> bool:
        """Whether MAC is the answer to NONCE for this connection and request (in time
        independent of where a wrong MAC differs)."""
        want = self.answer(nonce, prober_ip, responder_ip, kind, params)
        return hmac.compare_digest(want, mac)
