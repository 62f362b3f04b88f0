"""The reliability suite's figures, printed in pytest's terminal summary.

Fuzz tests count the inputs they tried (`fuzz_inputs`), fault tests record what they
measured (`figures`); both are session-scoped so hypothesis tests may use them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

_FUZZ: Counter[str] = Counter()
_CRASHES: Counter[str] = Counter()
_FIGURES: list[tuple[str, dict[str, Any]]] = []


class FuzzCounter:
    """Counts inputs per fuzz target, and inputs that raised outside the module's errors."""

    def tried(self, target: str) -> None:
        _FUZZ[target] += 1

    def crashed(self, target: str) -> None:
        _CRASHES[target] += 1

    def counts(self) -> dict[str, int]:
        """Inputs tried so far this session, per target."""
        return dict(_FUZZ)


class Figures:
    def record(self, test: str, **values: Any) -> None:
        _FIGURES.append((test, values))


@pytest.fixture(scope="session")
def fuzz_inputs() -> FuzzCounter:
    return FuzzCounter()


@pytest.fixture(scope="session")
def figures() -> Figures:
    return Figures()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FUZZ and not _FIGURES:
        return
    tr = terminalreporter
    tr.section("reliability figures")
    if _FUZZ:
        total = sum(_FUZZ.values())
        tr.write_line(
            f"fuzz: {total} inputs tried over {len(_FUZZ)} targets, "
            f"{sum(_CRASHES.values())} crashes outside the modules' own errors"
        )
        for target, n in sorted(_FUZZ.items()):
            tr.write_line(f"  {target}: {n} inputs, {_CRASHES[target]} crashes")
    for test, values in _FIGURES:
        shown = ", ".join(f"{k} {v}" for k, v in values.items())
        tr.write_line(f"{test}: {shown}")
