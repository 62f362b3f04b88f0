"""Kernel-visible thread names, so that `top -H`, /proc/PID/task/*/comm and
bench/agent_footprint.py can tell the agent's threads apart (CPython leaves every
thread it starts named after the process)."""

from __future__ import annotations

import ctypes
import functools
import sys
import threading

PR_SET_NAME = 15  # <linux/prctl.h>
NAME_BYTES = 15  # the kernel keeps 16 bytes with the terminating NUL


@functools.cache
def _prctl() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]  # ctypes' private type
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def name_os_thread(name: str | None = None) -> None:
    """Give the calling thread NAME (its Python name by default) in the kernel, cut to
    15 bytes. Best effort: where prctl is missing nothing happens."""
    prctl = _prctl()
    if prctl is None:
        return
    raw = (name or threading.current_thread().name).encode("utf-8", "replace")[:NAME_BYTES]
    prctl(PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)
