"""The probes' own session handlers, as one table for whoever builds a responder.

TCP sessions are always there; the RDMA ones (RC and UD) need pyverbs, and a host
without it serves TCP only (each missing table is logged once, with why). A builder
that serves more kinds (the workload's KV sink) merges its own table in with
fabricprobe.probes.control.session_table.
"""

from __future__ import annotations

import logging

from fabricprobe.probes import tcp
from fabricprobe.probes.control import SessionHandler, session_table

log = logging.getLogger("fabricprobe.responder")


def rdma_sessions() -> dict[str, SessionHandler]:
    """RC and UD handlers, or none when pyverbs (or the RDMA probes) cannot load here."""
    try:
        from fabricprobe.probes.rdma import rc, ud
    except ImportError as e:
        log.warning("RDMA session handlers not available: %s", e)
        return {}
    return session_table(rc.SESSIONS, ud.SESSIONS)


def probe_sessions() -> dict[str, SessionHandler]:
    """Every probe session this host can serve: TCP, and RDMA where pyverbs loads."""
    return session_table(tcp.SESSIONS, rdma_sessions())
