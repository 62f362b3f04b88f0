"""Policy defaults, TOML overrides and validation errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricprobe.probes.roce.policy import Policy, PolicyError, load_policy, parse_policy


def test_defaults_follow_common_practice() -> None:
    p = Policy().validate()
    assert (p.priority, p.dscp, p.cnp_priority, p.cnp_dscp, p.mtu) == (3, 26, 6, 48, 4096)
    assert p.tos == 106  # DSCP 26 with ECT(0)
    assert p.min_netdev_mtu == 4200


def test_toml_overrides() -> None:
    p = parse_policy(
        """
        [roce]
        priority = 5
        dscp = 34
        mtu = 2048

        [thresholds]
        pause_duration_warn_pct = 2
        rdma_rtt_p99_us_max = 250.0
        """
    )
    assert (p.priority, p.dscp, p.mtu, p.cnp_priority) == (5, 34, 2048, 6)
    assert p.thresholds.pause_duration_warn_pct == 2.0
    assert p.thresholds.rdma_rtt_p99_us_max == 250.0
    assert p.thresholds.pause_duration_fail_pct == 10.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[roce\n", "not valid TOML"),
        ("[qos]\npriority = 3\n", "unknown policy section"),
        ("[roce]\nprio = 3\n", r"unknown key\(s\) in \[roce\]: prio"),
        ("[thresholds]\npause = 1\n", r"unknown key\(s\) in \[thresholds\]"),
        ("[roce]\npriority = '3'\n", r"\[roce\] priority must be int, not str"),
        ("[roce]\npriority = true\n", "must be int, not bool"),
        ("[roce]\npriority = 8\n", "priority must be an 802.1p priority"),
        ("[roce]\ndscp = 64\n", "dscp must be a DSCP"),
        ("[roce]\ncnp_dscp = -1\n", "cnp_dscp must be a DSCP"),
        ("[roce]\nmtu = 9000\n", "mtu must be one of"),
        ("[roce]\nroce_mode = 'v2'\n", "roce_mode must be"),
        ("[roce]\ncnp_priority = 3\n", "cnp_priority must differ"),
        ("[thresholds]\ndiscards_warn_per_s = -1.0\n", "not negative"),
        ("[thresholds]\npause_duration_fail_pct = 0.5\n", "below the warn level"),
        ("roce = 3\n", "must be tables"),
    ],
)
def test_bad_policy(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy(text)


def test_flag_overrides_win_and_are_validated() -> None:
    p = Policy().with_overrides(priority=4, dscp=None)
    assert p.priority == 4 and p.dscp == 26
    with pytest.raises(PolicyError, match="cnp_priority must differ"):
        Policy().with_overrides(priority=6)


def test_load_policy_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "roce.toml"
    f.write_text("[roce]\ndscp = 99\n")
    with pytest.raises(PolicyError, match=f"{f}: dscp must be a DSCP"):
        load_policy(f)
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "missing.toml")
    f.write_text("[roce]\ndscp = 24\n")
    assert load_policy(f).dscp == 24
