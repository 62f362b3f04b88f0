"""The collector's settings by section (collector/configsections.py): each section on its
own turns its fields into its part of the server's configuration, and CollectorSettings
holds them all in one flat table, in the sections' order."""

from __future__ import annotations

import dataclasses

import pytest

from fabricprobe.collector.auth import Insecure
from fabricprobe.collector.config import CollectorSettings
from fabricprobe.collector.configsections import (
    AccessSettings,
    ApiPortSettings,
    DetailSettings,
    DriftSettings,
    EngineSettings,
    FabricSettings,
    HttpSettings,
    ListenSettings,
    PlanSettings,
    ShardSettings,
    WindowsSettings,
)
from fabricprobe.core import settings
from fabricprobe.core.errors import ConfigError

SECTIONS = (
    ListenSettings,
    EngineSettings,
    PlanSettings,
    AccessSettings,
    HttpSettings,
    ApiPortSettings,
    WindowsSettings,
    DetailSettings,
    DriftSettings,
    FabricSettings,
    ShardSettings,
)


def names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def test_the_flat_table_is_the_sections_in_order() -> None:
    flat = [name for section in SECTIONS for name in names(section)]
    assert names(CollectorSettings) == flat
    assert len(flat) == len(set(flat))  # no setting in two sections
    assert CollectorSettings.__mro__[1:-1] == tuple(reversed(SECTIONS))


def test_a_section_loads_on_its_own() -> None:
    file = settings.parse_toml("[collector]\nbudget = 3\nsizes = [64, 4096]\n", "c.toml")
    plan = settings.load(PlanSettings, "collector", file=file, env={})
    assert plan.budget == 3 and plan.sizes == [64, 4096]
    other = settings.parse_toml('[collector]\nlisten = "0.0.0.0:1"\n', "c.toml")
    with pytest.raises(ConfigError, match=r"c\.toml:2: unknown setting 'listen'"):
        settings.load(PlanSettings, "collector", file=other, env={})


def test_plan_section() -> None:
    cfg = PlanSettings(budget=4, probe_interval_s=2.5, sizes=[64, 128]).plan_config()
    assert cfg.budget == 4 and cfg.interval_ms == 2500 and cfg.sizes == (64, 128)
    with pytest.raises(ConfigError, match="budget must be >= 1"):
        PlanSettings(budget=0).plan_config()  # built directly, not loaded: unchecked


def test_engine_section() -> None:
    s = EngineSettings(host_aliases={"vllm-0": "gpu-1"}, host_rewrite=[["^(.*)-x$", r"\1"]])
    match = s.match_config()
    assert match.aliases == {"vllm-0": "gpu-1"} and match.rewrite == (("^(.*)-x$", r"\1"),)
    assert match.attributes[0] == "host.name"
    with pytest.raises(ConfigError, match="host_rewrite"):
        EngineSettings(host_rewrite=[["(", "x"]]).match_config()
    assert EngineSettings().kv_shapes() == {}
    with pytest.raises(ConfigError, match="kv_models"):
        EngineSettings(kv_models={"m": "nonsense"}).kv_shapes()


def test_access_section() -> None:
    s = AccessSettings(workers=16, streams_per_identity=8, fleet_networks=["10.1.2.3/16"])
    gate = s.gate_config()
    assert gate.max_streams == 8 and gate.streams_per_identity == 8
    s.check_streams()
    with pytest.raises(ConfigError, match="workers / 2"):
        AccessSettings(workers=8, streams_per_identity=5).check_streams()
    assert s.networks() == ["10.1.0.0/16"]


def test_http_section() -> None:
    limits = HttpSettings(http_per_source=3, http_body_timeout_s=4.0).http_limits()
    assert limits.per_source == 3 and limits.body_s == 4.0
    HttpSettings().check_web_config()  # none given: nothing to read
    with pytest.raises(ConfigError, match="web_config"):
        HttpSettings(web_config="/nonexistent/web.yml").check_web_config()


def test_api_port_section() -> None:
    with pytest.raises(ConfigError, match="no authentication"):
        ApiPortSettings().credentials()
    assert isinstance(ApiPortSettings(insecure=True).credentials(), Insecure)
    with pytest.raises(ConfigError, match="go together"):
        ApiPortSettings(tls_cert="c.pem").credentials()


def test_windows_and_detail_sections() -> None:
    assert WindowsSettings().raw_config(5.0) is None
    raw = WindowsSettings(windows_dir="/var/w", windows_max_bytes=1 << 20).raw_config(5.0)
    assert raw is not None and raw.directory == "/var/w" and raw.flush_s == 5.0
    detail = DetailSettings(detail_max_paths=7).detail_config(fresh_s=12.0)
    assert detail.max_paths == 7 and detail.fresh_s == 12.0 and detail.worst_k == 10


def test_shard_section() -> None:
    assert ShardSettings().shard_at("0.0.0.0:4794") is None
    s = ShardSettings(etcd="127.0.0.1:2379", shard_name="s")
    with pytest.raises(ConfigError, match="give advertise"):
        s.shard_at("0.0.0.0:4794")
    cfg = s.shard_at("10.0.0.1:4794")
    assert cfg is not None and cfg.name == "s" and cfg.etcd == (("127.0.0.1", 2379),)


def test_the_whole_builds_what_its_sections_build() -> None:
    s = CollectorSettings(insecure=True, budget=5, detail_max_hosts=3, stale_after_s=20.0)
    cfg = s.server_config()
    assert cfg.api.plan == s.plan_config() and cfg.gate == s.gate_config()
    assert cfg.detail == s.detail_config(fresh_s=20.0) and cfg.http == s.http_limits()
    assert cfg.shard is None and cfg.raw is None
    assert isinstance(s.authenticator(), Insecure)
