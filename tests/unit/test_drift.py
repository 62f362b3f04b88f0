"""Fleet drift: which hosts differ from their group, waivers, the book's bounds, metrics."""

from __future__ import annotations

import tomllib
from datetime import date
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fabricprobe.collector.drift import (
    MAX_CHECKS,
    DriftBook,
    DriftCollector,
    HostVerdicts,
    Member,
    Verdict,
    find_drift,
    parse_waivers,
)
from fabricprobe.collector.store import ReportError, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TODAY = date(2026, 12, 1)


def verdicts(
    host: str, checks: dict[str, list[tuple[str, str]]], policy: str = "p1"
) -> HostVerdicts:
    """CHECKS: check -> [(status, value) per port]; ports are mlx5_0/1, mlx5_1/1, ..."""
    out = []
    for check, ports in checks.items():
        for i, (status, value) in enumerate(ports):
            out.append(Verdict(check, f"mlx5_{i}", 1, f"ens{i}", status, value, ""))
    return HostVerdicts(host, 1, policy, tuple(out))


GOOD = {
    "pfc": [("PASS", "3"), ("PASS", "3")],
    "mtu": [("PASS", "9000/4096"), ("PASS", "9000/4096")],
    "firmware": [("PASS", "28.39.1002 mlx5_core"), ("PASS", "28.39.1002 mlx5_core")],
    "acs": [("PASS", ""), ("PASS", "")],
    "pause": [("PASS", ""), ("PASS", "")],
}


def fleet(
    n: int, odd: dict[str, dict[str, list[tuple[str, str]]]] | None = None, **kw: str
) -> dict[str, Member]:
    odd = odd or {}
    return {
        f"h{i}": Member(
            verdicts(f"h{i}", {**GOOD, **odd.get(f"h{i}", {})}),
            kw.get("topology", "tor-1"),
            kw.get("role", ""),
        )
        for i in range(n)
    }


@pytest.mark.parametrize(
    ("name", "members", "expect"),
    [
        ("alike", fleet(4), []),
        (
            "one NIC of a host on another PFC priority",
            fleet(4, {"h2": {"pfc": [("PASS", "3"), ("FAIL", "4")]}}),
            [("h2", "pfc", "3, 4", "3", "mlx5_1/1")],
        ),
        (
            "MTU 1500 among 9000",
            fleet(5, {"h0": {"mtu": [("FAIL", "1500/1024"), ("FAIL", "1500/1024")]}}),
            [("h0", "mtu", "1500/1024", "9000/4096", "mlx5_0/1, mlx5_1/1")],
        ),
        (
            "a different firmware",
            fleet(3, {"h1": {"firmware": [("PASS", "28.40.1000 mlx5_core")] * 2}}),
            [
                (
                    "h1",
                    "firmware",
                    "28.40.1000 mlx5_core",
                    "28.39.1002 mlx5_core",
                    "mlx5_0/1, mlx5_1/1",
                )
            ],
        ),
        (
            "no value: compared by status",
            fleet(4, {"h3": {"acs": [("WARN", ""), ("PASS", "")]}}),
            [("h3", "acs", "PASS, WARN", "PASS", "mlx5_0/1")],
        ),
        (
            "counter verdicts are state, not configuration",
            fleet(4, {"h3": {"pause": [("FAIL", "")] * 2}}),
            [],
        ),
        (
            "two hosts: no majority to compare with",
            fleet(2, {"h1": {"pfc": [("FAIL", "4")] * 2}}),
            [],
        ),
        (
            "a tie is no majority",
            fleet(4, {"h0": {"pfc": [("FAIL", "4")] * 2}, "h1": {"pfc": [("FAIL", "4")] * 2}}),
            [],
        ),
    ],
)
def test_drift_by_topology(
    name: str, members: dict[str, Member], expect: list[tuple[str, ...]]
) -> None:
    rows = find_drift(members, today=TODAY)
    got = [(d.host, d.check, d.value, d.peers_value, d.ports) for d in rows]
    assert got == expect, name
    for d in rows:
        assert d.group_by == "topology" and d.group == "tor-1"
        assert d.peers_agree * 2 > d.group_size


def test_groups_by_role_as_well_and_never_across_groups() -> None:
    members = {
        **fleet(3, topology="tor-1", role="decode"),
        **{k.replace("h", "p"): v for k, v in fleet(3, topology="tor-2", role="prefill").items()},
    }
    # one decode host moved to the prefill ToR keeps its decode role
    odd = verdicts("h9", {**GOOD, "mtu": [("FAIL", "1500/1024")] * 2})
    members["h9"] = Member(odd, "tor-2", "decode")
    rows = find_drift(members, today=TODAY)
    assert {(d.host, d.group_by, d.group, d.check) for d in rows} == {
        ("h9", "topology", "tor-2", "mtu"),
        ("h9", "role", "decode", "mtu"),
    }
    # a different policy digest is a difference of its own
    members["p0"] = Member(verdicts("p0", GOOD, policy="p2"), "tor-2", "prefill")
    rows = find_drift(members, today=TODAY)
    assert ("p0", "policy") in {(d.host, d.check) for d in rows}


def test_min_group() -> None:
    members = fleet(3, {"h1": {"pfc": [("FAIL", "4")] * 2}})
    assert find_drift(members, min_group=4, today=TODAY) == []
    assert [d.host for d in find_drift(members, min_group=3, today=TODAY)] == ["h1"]


def test_waivers_cover_by_glob_and_expire() -> None:
    members = fleet(4, {"h2": {"firmware": [("PASS", "canary")] * 2}})
    waivers = parse_waivers(
        [{"host": "h[2-3]", "check": "firm*", "reason": "canary firmware", "until": "2026-12-31"}]
    )
    (row,) = find_drift(members, waivers=waivers, today=TODAY)
    assert row.waived and row.waiver == "canary firmware"
    (row,) = find_drift(members, waivers=waivers, today=date(2027, 1, 1))
    assert not row.waived
    (row,) = find_drift(
        members, waivers=parse_waivers([{"host": "h2", "check": "*", "reason": "x"}]), today=TODAY
    )
    assert row.waived


@pytest.mark.parametrize(
    ("items", "error"),
    [
        ({"host": "x"}, "must be a list"),
        (["x"], "must be a table"),
        ([{"host": "a", "check": "pfc"}], "reason must be a non-empty string"),
        (
            [{"host": "a", "check": "pfc", "reason": "r", "untill": "2027-01-01"}],
            "unknown key(s) untill",
        ),
        ([{"host": "a", "check": "pfc", "reason": "r", "until": "soon"}], "until must be a date"),
        ([{"host": "", "check": "pfc", "reason": "r"}], "host must be a non-empty string"),
    ],
)
def test_bad_waivers_are_config_errors(items: object, error: str) -> None:
    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(")", r"\)")):
        parse_waivers(items)


def test_toml_dates_are_taken() -> None:
    doc = tomllib.loads('w = [{ host = "a", check = "pfc", reason = "r", until = 2027-01-31 }]')
    assert parse_waivers(doc["w"])[0].until == date(2027, 1, 31)


def _store(*hosts: str, topology: str = "tor-1") -> WindowStore:
    store = WindowStore()
    for h in hosts:
        store.register(pb.HostInfo(host=h, topology=topology, role="decode"))
    return store


def _report(host: str, taken: int = 1, **over: object) -> pb.CheckReport:
    msg = pb.CheckReport(host=host, taken_unix_ns=taken, policy="p")
    msg.checks.append(
        pb.CheckVerdict(check="pfc", device="mlx5_0", port=1, status="PASS", value="3")
    )
    for k, v in over.items():
        setattr(msg.checks[0], k, v)
    return msg


def test_book_takes_registered_hosts_only_and_counts_what_it_refuses() -> None:
    book = DriftBook(_store("a"))
    assert len(book.take(_report("a")).checks) == 1
    with pytest.raises(ReportError, match="not registered"):
        book.take(_report("stranger"))
    with pytest.raises(ReportError, match="status"):
        book.take(_report("a", status="GREAT"))
    with pytest.raises(ReportError, match="longer than"):
        book.take(_report("a", value="x" * 300))
    with pytest.raises(ReportError, match="control characters"):
        book.take(_report("a", message="a\x1b[31mred"))
    big = pb.CheckReport(host="a")
    big.checks.extend(pb.CheckVerdict(check="pfc", status="PASS") for _ in range(MAX_CHECKS + 1))
    with pytest.raises(ReportError, match="more than"):
        book.take(big)
    assert book.rejected == {"unregistered": 1, "malformed": 2, "too_large": 2}
    # what was held survives every refusal
    assert book.hosts["a"].checks[0].value == "3"


def test_book_keeps_the_newest_run_and_forgets_forgotten_hosts() -> None:
    store = _store("a", "b")
    book = DriftBook(store)
    book.take(_report("a", taken=10, value="3"))
    book.take(_report("a", taken=5, value="4"))  # an older run arriving late
    assert book.hosts["a"].checks[0].value == "3"
    book.take(_report("b"))
    with store.lock:
        del store.hosts["b"]
    assert set(book.members()) == {"a"} and set(book.hosts) == {"a"}


def test_metrics_match_the_catalogue_and_show_the_drifting_host() -> None:
    store = _store("a", "b", "c", "d")
    book = DriftBook(store, clock=lambda: 61 * 10**9)
    for h in "abcd":
        book.take(
            _report(
                h,
                taken=10**9,
                value="4" if h == "c" else "3",
                status="FAIL" if h == "c" else "PASS",
            )
        )
    reg = CollectorRegistry()
    reg.register(DriftCollector(book))
    text = generate_latest(reg).decode()
    cat = tomllib.loads((ROOT / "collector" / "metrics.toml").read_text())["drift_metric"]
    families = {m.name: m for m in reg.collect()}
    for row in cat:
        base = row["name"].removesuffix("_total")
        assert base in families, row["name"]
        fam = families[base]
        assert fam.type == row["type"], row["name"]
        assert sorted({k for s in fam.samples for k in s.labels}) == sorted(row["labels"]), row[
            "name"
        ]
    assert len(families) == len(cat)
    assert (
        'fabricprobe_host_check_drift{check="pfc",group="tor-1",group_by="topology",'
        'host="c",waived="false"} 1.0' in text
    )
    assert 'fabricprobe_host_check_status{check="pfc",host="c"} 3.0' in text
    assert 'fabricprobe_host_check_status{check="pfc",host="a"} 0.0' in text
    assert 'fabricprobe_host_checks_age_seconds{host="a"} 60.0' in text
    assert "fabricprobe_drift_hosts 1.0" in text
    assert "fabricprobe_check_reports_total 4.0" in text
    # the drift of role groups too
    assert 'group_by="role",host="c"' in text
    reply = book.reply()
    assert [(r.host, r.check) for r in reply.drift] == [("c", "pfc"), ("c", "pfc")]
    assert [h.host for h in reply.hosts] == ["a", "b", "c", "d"]
    assert list(reply.hosts[2].failing) == ["pfc"]
