"""Exception classes raised by the probes package."""

from __future__ import annotations


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
