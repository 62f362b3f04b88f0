"""A stand-in for a running agent as agent/exporter.py reads it (its AgentView, with the
sender's SenderView): every field the exporter reads, at an idle, registered agent's
values, FIELDS (of either) overriding any."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def agent_view(**fields: Any) -> SimpleNamespace:
    sender = SimpleNamespace(acked=0, handoffs=0, replayed=0, last_ack_unix_s=0.0, registered=True)
    view = SimpleNamespace(
        last_report=None,
        latest_counters=[],
        sender=sender,
        tools_missing=set(),
        inputs_skipped={},
        nics=[],
    )
    for name, value in fields.items():
        if hasattr(view, name):
            setattr(view, name, value)
        elif hasattr(sender, name):
            setattr(sender, name, value)
        else:
            raise TypeError(f"AgentView has no field {name!r}")
    return view
