"""Errors shared by the agent, the collector and the command line."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it (and its file and line, when it
    came from one)."""
