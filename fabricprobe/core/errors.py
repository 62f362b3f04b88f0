"""Exception classes shared by every part: the errors the probes raise on purpose (a
device, a tool's output or a peer that is not as expected), configuration errors, and
the reasons a responder turns a prober away."""

from __future__ import annotations

from typing import Any


class ProbeError(Exception):
    """Base class for every error the probes package raises on purpose."""


class SysfsError(ProbeError):
    """A required sysfs file is missing or unreadable; the message names the path."""


class ParseError(ProbeError):
    """Text from outside (sysfs, a tool's output, a peer) did not have the expected shape."""


class NotSupported(ProbeError):
    """The device or kernel does not offer this feature (EOPNOTSUPP and friends)."""


class ToolMissing(NotSupported):
    """A command the reader runs (ethtool, dcb, …) is not installed on this host."""

    def __init__(self, tool: str, package: str) -> None:
        super().__init__(f"{tool} is not installed (Debian/Ubuntu: apt install {package})")
        self.tool = tool


class PeerError(ProbeError):
    """A peer did not answer in time, closed the connection, or sent something invalid."""


class CallRefused(Exception):
    """A gRPC call (or what it carries) refused; `code` is the grpc.StatusCode to end the
    call with, the message its details."""

    def __init__(self, code: Any, message: str) -> None:  # grpcio ships no type hints
        super().__init__(message)
        self.code = code


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it (and its file and line, when it
    came from one)."""


# Why a responder turns a prober away (probes.control.Refused carries one): it is full,
# the source holds its share, the memory budget is spent, no hello came in time, the
# prober did not prove it belongs to the fleet, or an RDMA endpoint is not the control
# connection's peer. A fixed set: the refusal counters of the agent and the collector
# export one series per reason, and a peer adds no label values.
REFUSAL_REASONS = ("busy", "source", "memory", "hello", "unauthenticated", "address")
