"""Host:port text as the command line, the configuration files and the agent's
registration give it, and the ports `probe serve` and the collector listen on when none
is given."""

from __future__ import annotations

import ipaddress

DEFAULT_PORT = 4793  # the responder's; 18515 belongs to perftest, so this one does not clash
COLLECTOR_PORT = 4794  # the collector's agent API and Query service


def parse_hostport(
    text: str, default_port: int = DEFAULT_PORT, *, allow_port_zero: bool = False
) -> tuple[str, int]:
    """`host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address → (host, port).

    Raises ValueError with a one-line reason for anything else. Port 0 (any free
    port) is only accepted for addresses to listen on.
    """
    t = text.strip()
    if not t:
        raise ValueError("empty address")
    host, port_text = t, ""
    if t.startswith("["):
        end = t.find("]")
        if end < 0 or (len(t) > end + 1 and t[end + 1] != ":"):
            raise ValueError(f"bad address {text!r}: expected [IPv6]:PORT")
        host, port_text = t[1:end], t[end + 2 :]
        if len(t) > end + 1 and not port_text:
            raise ValueError(f"bad address {text!r}: empty port")
    elif t.count(":") == 1:
        host, port_text = t.split(":")
        if not port_text:
            raise ValueError(f"bad address {text!r}: empty port")
    if not host or any(c.isspace() for c in host) or "/" in host:
        raise ValueError(f"bad address {text!r}: expected HOST or HOST:PORT")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"bad address {text!r}: not an IPv6 address") from None
    port = default_port
    if port_text:
        lo = 0 if allow_port_zero else 1
        if not port_text.isdecimal() or not lo <= int(port_text) < 65536:
            raise ValueError(f"bad port in {text!r}: expected {lo}..65535")
        port = int(port_text)
    return host, port


def format_hostport(host: str, port: int) -> str:
    """The inverse of parse_hostport: `host:port`, with IPv6 hosts in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
