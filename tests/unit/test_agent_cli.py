"""`probe agent` and `probe collector`: settings from flags and TOML, one-line errors."""

from __future__ import annotations

import re
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


# --- flags derived from the settings' declarations ------------------------------------


def _option_names(command: str) -> set[str]:
    from fabricprobe.cli import COMMANDS

    module, attr = COMMANDS[command].split(":")
    cmd = getattr(__import__(module, fromlist=[attr]), attr)
    return {"--help", *(o for p in cmd.params for o in (*p.opts, *p.secondary_opts))}


@pytest.mark.parametrize(
    ("command", "cls"), [("agent", AgentConfig), ("collector", CollectorSettings)]
)
def test_help_lists_every_setting_with_its_variable(command: str, cls: type) -> None:
    code, out = run(command, "--help")
    flat = " ".join(out.split())
    assert code == 0
    names = _option_names(command)
    for spec in settings.specs(cls):
        if spec.flag is not None:
            assert spec.flag in names or f"--no-{spec.flag[2:]}" in names, spec.name
            assert spec.env(command) in flat, spec.name
    assert f"FABRICPROBE_{command.upper()}_CONFIG" in flat and "each winning over" in flat


ROOT = Path(__file__).resolve().parents[2]


def _documented_invocations() -> list[tuple[str, str, str]]:
    """(file, command, flag) for every flag the README, docs/, deploy files and the chart
    hand to `probe agent` / `probe collector`."""
    found = []
    texts = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "deploy").rglob("*.service")),
    ]
    for path in texts:
        logical = path.read_text().replace("\\\n", " ")
        for line in logical.splitlines():
            for m in re.finditer(r"probe (agent|collector)((?: +[^ |;&`#]+)*)", line):
                for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", m.group(2)):
                    found.append((path.name, m.group(1), flag))
    for command in ("agent", "collector"):
        chart = ROOT / "deploy" / "helm" / "fabricprobe" / "templates" / f"{command}.yaml"
        for flag in re.findall(r"^\s*- (--[a-z][a-z-]*)", chart.read_text(), re.M):
            found.append((chart.name, command, flag))
    return found


def test_documented_flags_still_exist() -> None:
    found = _documented_invocations()
    assert len(found) > 30  # the README's and docs' examples, the units and the chart
    names = {c: _option_names(c) for c in ("agent", "collector")}
    missing = [f for f in found if f[2] not in names[f[1]]]
    assert not missing


@pytest.mark.parametrize(
    ("args", "env", "error"),
    [
        (["collector", "--budget", "0"], {}, "--budget must be within 1..1024, not 0"),
        (["collector", "--kind", "rdma_rc_latt"], {}, "did you mean 'rdma_rc_lat'?"),
        (["agent", "--no-such-flag"], {}, "No such option '--no-such-flag'"),
        (["agent", "--window"], {}, "Option '--window' requires an argument"),
        (["collector"], {"FABRICPROBE_COLLECTOR_BUDGET": "x"}, "FABRICPROBE_COLLECTOR_BUDGET must"),
        (["agent", "--insecure"], {"FABRICPROBE_AGENT_COLECTOR": "h:1"}, "did you mean"),
    ],
)
def test_bad_flags_and_variables_are_one_line_exit_2(
    args: list[str], env: dict[str, str], error: str
) -> None:
    res = CliRunner().invoke(main, args, env=env)
    assert res.exit_code == 2 and error in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


def test_config_file_from_the_environment_and_its_line(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text('[agent]\nhost = "h1"\n\n[colector]\nbudget = 3\n')
    res = CliRunner().invoke(main, ["agent"], env={"FABRICPROBE_AGENT_CONFIG": str(f)})
    assert res.exit_code == 2
    assert f"{f}:4: unknown section [colector] (did you mean [collector]?" in res.output


def test_cli_precedence_file_then_environment_then_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fabricprobe.cli.commands.collector as command

    seen = []

    class Captured:
        def __init__(self, cfg: object, auth: object) -> None:
            seen.append(cfg)

        def start(self) -> None:
            raise OSError("not started in this test")

    monkeypatch.setattr(command, "CollectorServer", Captured)
    f = tmp_path / "c.toml"
    f.write_text("[collector]\ninsecure = true\nbudget = 2\nprobe_count = 2\nworkers = 8\n")
    env = {"FABRICPROBE_COLLECTOR_BUDGET": "3", "FABRICPROBE_COLLECTOR_PROBE_COUNT": "3"}
    res = CliRunner().invoke(main, ["collector", "--config", str(f), "--budget", "4"], env=env)
    assert res.exit_code == 1 and "not started in this test" in res.output
    plan = seen[0].api.plan
    assert (plan.budget, plan.count, seen[0].workers) == (4, 3, 8)
