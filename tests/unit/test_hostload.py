"""CPU pressure (PSI) and the agent's self-throttle."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.selfload import MAX_SLOWDOWN, Readers
from fabricprobe.core.errors import ParseError
from fabricprobe.probes.hostload import CpuPressure, parse_pressure
from tests.support.fleet import loopback_agent_config

# /proc/pressure/cpu of a 6.1 kernel (Documentation/accounting/psi.rst's format)
PSI = """some avg10=12.50 avg60=8.10 avg300=2.00 total={some}
full avg10=0.00 avg60=0.00 avg300=0.00 total=0
"""


def test_parse_and_share(tmp_path: Path) -> None:
    f = tmp_path / "cpu"
    f.write_text(PSI.format(some=1_000_000))
    p = CpuPressure(f)
    assert p.sample(10.0) is None  # the first read has nothing to compare with
    f.write_text(PSI.format(some=1_500_000))
    assert p.sample(12.0) == pytest.approx(0.25)  # 0.5 s of waiting in 2 s
    f.write_text(PSI.format(some=1_400_000))  # a counter that went back: not a figure
    assert p.sample(13.0) is None


def test_without_psi_it_says_so_once(tmp_path: Path) -> None:
    p = CpuPressure(tmp_path / "absent")
    assert p.sample(1.0) is None and p.sample(2.0) is None
    assert p.unavailable is not None and "absent" in p.unavailable


@pytest.mark.parametrize(
    "text", ["", "full avg10=0 total=5", "some avg10=1 total=-3", "some total=x"]
)
def test_bad_pressure_text(text: str) -> None:
    with pytest.raises(ParseError):
        parse_pressure(text)


@given(st.text(max_size=200))
def test_pressure_parser_raises_only_its_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        assert parse_pressure(text) >= 0


class FakeSelf:
    """The agent's own CPU seconds and monotonic clock, as the test says they are."""

    def __init__(self) -> None:
        self.cpu, self.now = 0.0, 100.0

    def readers(self) -> Readers:
        return Readers(
            cpu_s=lambda: self.cpu, rss_bytes=lambda: 50 << 20, monotonic=lambda: self.now
        )


def test_the_agent_throttles_itself_and_eases_back(tmp_path: Path) -> None:
    """Every figure the agent has of itself comes from the readers given: the test
    process's own CPU time and the machine's uptime play no part (CI on a machine booted
    minutes ago once saw the pytest process's 113 CPU-s over a short monotonic clock)."""
    psi = tmp_path / "proc" / "pressure" / "cpu"
    psi.parent.mkdir(parents=True)
    psi.write_text(PSI.format(some=0))
    me = FakeSelf()
    agent = Agent(
        loopback_agent_config(
            tmp_path,
            "127.0.0.2",
            1,
            proc_root=str(tmp_path / "proc"),
            validate_interval_s=0,
            cpu_budget=0.01,  # the defaults, which the loopback fleet's agents lift
            pressure_limit=0.5,
        ),
        readers=me.readers(),
    )
    waited = 0
    agent.load.pressure.sample(me.now)

    def window(agent_cpu_s: float, waited_s: float) -> tuple[float, float]:
        nonlocal waited
        me.cpu, me.now, waited = me.cpu + agent_cpu_s, me.now + 10.0, waited + int(waited_s * 1e6)
        psi.write_text(PSI.format(some=waited))
        agent.cut_window()
        a = agent.last_report.agent  # type: ignore[union-attr]
        assert a.cpu_share == pytest.approx(agent_cpu_s / 10.0)
        assert a.cpu_seconds == me.cpu and a.rss_bytes == 50 << 20
        return agent.scheduler.slowdown, a.self_throttle

    try:
        assert window(0.01, 0.0) == (1.0, 1.0)  # 0.1 % of a core on a quiet host
        steps = [window(0.5, 0.0)[0] for _ in range(6)]  # 5 % of a core: over the 1 % budget
        assert steps[0] == 1.5 and steps[-1] == MAX_SLOWDOWN  # stretched, never stopped
        assert window(0.01, 8.0)[0] == MAX_SLOWDOWN  # the host is busy (80 % pressure)
        assert agent.last_report.agent.cpu_pressure == pytest.approx(0.8)  # type: ignore[union-attr]
        eased = [window(0.01, 0.0)[0] for _ in range(6)]
        assert eased[0] < MAX_SLOWDOWN and eased[-1] == 1.0
        assert agent.seq == 14
    finally:
        agent.close(flush_timeout=0)


def test_the_agents_own_readers_hold_real_figures() -> None:
    """The default readers read this process: CPU seconds that only grow, a real RSS."""
    r = Readers()
    c0 = r.cpu_s()
    sum(i * i for i in range(200_000))
    assert r.cpu_s() >= c0 > 0 and r.rss_bytes() > 1 << 20 and r.monotonic() > 0
