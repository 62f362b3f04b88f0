"""What the CLI's responders serve (`probe serve`, `probe agent`, `probe workload`): the
probes' own sessions and the workload's KV sink, so a real pipeline can move KV blocks
to any host that answers probes."""

from __future__ import annotations

from fabricprobe.probes.control import SessionHandler, session_table
from fabricprobe.probes.rdma.sessions import probe_sessions
from fabricprobe.workload import transfer


def served_sessions() -> dict[str, SessionHandler]:
    return session_table(probe_sessions(), transfer.SESSIONS)
