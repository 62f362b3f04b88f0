"""A stand-in for a running agent as agent/exporter.py reads it (its AgentView): every
field the exporter reads, at an idle, registered agent's values, FIELDS overriding any."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def agent_view(**fields: Any) -> SimpleNamespace:
    view = SimpleNamespace(
        last_report=None,
        latest_counters=[],
        acked=0,
        handoffs=0,
        replayed=0,
        last_ack_unix_s=0.0,
        registered=True,
        tools_missing=set(),
        inputs_skipped={},
    )
    for name, value in fields.items():
        if not hasattr(view, name):
            raise TypeError(f"AgentView has no field {name!r}")
        setattr(view, name, value)
    return view
