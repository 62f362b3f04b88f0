"""The agent's scheduled checks: jittered times, the report it sends, a failing run."""

from __future__ import annotations

import random
import shutil
import threading
from pathlib import Path

from fabricprobe.agent.validation import MAX_TEXT, ValidationSchedule, check_report, policy_digest
from fabricprobe.probes.roce import Policy, ReplayRunner, Report
from fabricprobe.probes.roce.result import CheckResult, Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def schedule(tmp_path: Path, **kw: object) -> ValidationSchedule:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sys" / "mlx5", root, symlinks=True)
    args: dict[str, object] = {
        "sysfs_root": str(root),
        "runner": ReplayRunner(FIXTURES / "tools" / "mlx5"),
        "interval_s": 3600.0,
        "window_s": 0.0,
        "rng": random.Random(7),
    }
    args.update(kw)
    return ValidationSchedule("gpu-1", **args)  # type: ignore[arg-type]


def test_runs_are_jittered_within_bounds(tmp_path: Path) -> None:
    s = schedule(tmp_path, jitter=0.2, first_within_s=60.0)
    firsts = [s.first_delay() for _ in range(1000)]
    nexts = [s.next_delay() for _ in range(1000)]
    assert min(firsts) >= 0 and max(firsts) <= 60
    assert min(nexts) >= 2880 and max(nexts) <= 4320
    assert max(nexts) - min(nexts) > 1000  # spread out, not in step


def test_a_run_reports_every_verdict_with_its_value(tmp_path: Path) -> None:
    s = schedule(tmp_path)
    msg = s.run_once()
    assert msg.host == "gpu-1" and msg.policy == policy_digest(Policy())
    by = {(c.check, c.device): c for c in msg.checks}
    assert by[("pfc", "mlx5_0")].status == "PASS" and by[("pfc", "mlx5_0")].value == "3"
    assert by[("mtu", "mlx5_0")].value.startswith("9000/")
    assert by[("firmware", "mlx5_0")].value.split()[0] == "28.39.1002"
    assert s.take_pending() is msg
    s.sent_ok(msg)
    assert s.take_pending() is None
    s.resend()  # another collector shard took the host: it gets the verdicts again
    assert s.take_pending() is msg


def test_texts_are_clipped_and_cleaned() -> None:
    long = CheckResult("pfc", "t", Status.WARN, "x" * 1000 + "\n\x1b", value="v\x00" * 300)
    msg = check_report("h", Report.of([long]), Policy(), 1, 0.1)
    (c,) = msg.checks
    assert len(c.message) == MAX_TEXT and "\n" not in c.message and "\x1b" not in c.message
    assert len(c.value) <= MAX_TEXT and "\x00" not in c.value


def test_a_failing_run_is_counted_and_the_schedule_goes_on(tmp_path: Path) -> None:
    calls = []

    def broken(argv: object, timeout: float) -> object:
        calls.append(argv)
        raise RuntimeError("tool exploded")

    s = schedule(tmp_path, runner=broken, interval_s=60.0, first_within_s=0.0, jitter=0.0)
    s.next_delay = lambda: 0.01  # type: ignore[method-assign]
    stop = threading.Event()
    t = threading.Thread(target=s.loop, args=(stop,))
    t.start()
    while s.failures < 3:
        stop.wait(0.01)
    stop.set()
    t.join(5)
    assert not t.is_alive() and s.failures >= 3 and s.pending is None
