"""`probe agent` and `probe collector`: settings from flags and TOML, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from fabricprobe.agent.config import AgentConfig
from fabricprobe.cli import main
from fabricprobe.collector.config import CollectorSettings
from fabricprobe.core import settings
from fabricprobe.core.errors import ConfigError


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.output


def test_agent_needs_credentials_or_explicit_insecure() -> None:
    code, out = run("agent", "--collector", "127.0.0.1:1")
    assert code == 2 and "--insecure" in out and len(out.strip().splitlines()) == 1


def test_collector_needs_auth_or_explicit_insecure() -> None:
    code, out = run("collector", "--listen", "127.0.0.1:0")
    assert code == 2 and "--insecure" in out


def test_bad_toml_is_a_one_line_error(tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text('[agent]\nwindow_s = "fast"\n')
    code, out = run("agent", "--config", str(f))
    assert code == 2 and "window_s must be a float" in out
    f.write_text("[agent]\nno_such = 1\n")
    code, out = run("agent", "--config", str(f), "--insecure")
    assert code == 2 and "unknown setting 'no_such'" in out
    f.write_text("[collector\n")
    code, out = run("collector", "--config", str(f))
    assert code == 2 and "a.toml" in out


def test_toml_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text('[agent]\nhost = "h7"\nwindow_s = 5\ninsecure = true\nspool_max_windows = 9\n')
    cfg = settings.load(AgentConfig, "agent", file=f, flags={"host": "h8"})
    cfg.validate()
    assert (cfg.host, cfg.window_s, cfg.spool_max_windows) == ("h8", 5.0, 9)


def test_collector_settings_build_server_config() -> None:
    s = CollectorSettings(insecure=True, budget=4, sizes=[64, 4096], report_interval_s=2)
    cfg = s.server_config()
    assert cfg.api.plan.budget == 4 and cfg.api.plan.sizes == (64, 4096)
    assert cfg.api.report_interval_ms == 2000
    with pytest.raises(ConfigError):
        CollectorSettings(budget=0).server_config()
    with pytest.raises(ConfigError, match="plain text"):
        CollectorSettings(token_file="/dev/null").authenticator()


def test_help_shows_examples() -> None:
    for cmd in ("agent", "collector"):
        code, out = run(cmd, "--help")
        assert code == 0 and "Examples:" in out
