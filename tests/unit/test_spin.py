"""verbs.Spin, the Python loops' wait clock: what `last` bounds for the prober's delay."""

from __future__ import annotations

import pytest

from fabricprobe.probes.rdma import verbs


def test_last_is_the_read_before_the_newest_empty_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """Poll, read, poll, read...: after the k-th empty poll `last` is the read that came
    before it (the (k-1)-th), never the one just after it, which a preemption between
    the poll and the read could put after the answer's arrival."""
    reads = iter([10.0, 11.0, 12.0])
    monkeypatch.setattr(verbs.time, "monotonic", lambda: next(reads))
    spin = verbs.Spin(deadline=100.0)
    assert spin.last == 0.0  # no empty poll yet
    assert not spin.expired()  # the first empty poll had no read before it
    assert spin.last == 0.0
    assert not spin.expired()
    assert spin.last == 10.0
    assert not spin.expired()
    assert spin.last == 11.0


def test_a_wait_past_its_deadline_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verbs.time, "monotonic", lambda: 5.0)
    assert verbs.Spin(deadline=4.0).expired()
