"""CPU pressure (PSI) and the agent's self-throttle."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricprobe.agent.agent import MAX_SLOWDOWN, Agent
from fabricprobe.probes.errors import ParseError
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


def test_the_agent_throttles_itself_and_eases_back(tmp_path: Path) -> None:
    psi = tmp_path / "proc" / "pressure" / "cpu"
    psi.parent.mkdir(parents=True)
    psi.write_text(PSI.format(some=0))
    agent = Agent(
        loopback_agent_config(
            tmp_path,
            "127.0.0.2",
            1,
            proc_root=str(tmp_path / "proc"),
            validate_interval_s=0,
            cpu_budget=0.01,  # the defaults, which the loopback fleet's agents lift
            pressure_limit=0.5,
        )
    )
    try:
        cpu, now, waited = 0.0, 100.0, 0
        agent._last_cpu = (now, cpu)
        agent.pressure.sample(now)

        def window(agent_cpu_s: float, waited_s: float) -> float:
            nonlocal cpu, now, waited
            cpu, now, waited = cpu + agent_cpu_s, now + 10.0, waited + int(waited_s * 1e6)
            psi.write_text(PSI.format(some=waited))
            agent._throttle(cpu, now)
            return agent.scheduler.slowdown

        assert window(0.01, 0.0) == 1.0  # 0.1 % of a core on a quiet host
        steps = [window(0.5, 0.0) for _ in range(6)]  # 5 % of a core: over the 1 % budget
        assert steps[0] == 1.5 and steps[-1] == MAX_SLOWDOWN  # stretched, never stopped
        assert window(0.01, 8.0) == MAX_SLOWDOWN  # the host is busy (80 % pressure)
        eased = [window(0.01, 0.0) for _ in range(6)]
        assert eased[0] < MAX_SLOWDOWN and eased[-1] == 1.0
        report = agent.last_report
        assert report is None  # nothing cut: the figures go out with the next window
        key = agent.cut_window()
        assert key.seq == 1
        a = agent.last_report.agent  # type: ignore[union-attr]
        assert a.self_throttle == 1.0 and a.cpu_pressure >= 0
    finally:
        agent.close(flush_timeout=0)
