"""Hypothesis fuzzers for every parser of outside input in fabricprobe.probes and the
agent's spool decoder: whatever the text, a parser returns or raises its module's own
error (ParseError, PolicyError, ProtocolError, ValueError where that is the contract,
SpoolCorrupt), never anything else.

Strategies are cheap on purpose (short text, a tool's own vocabulary shuffled), and each
example feeds a batch of BATCH inputs (hypothesis' own per-example cost dominates
otherwise), so the suite tries over 100,000 inputs in well under a minute on an idle
machine; the count is printed in the terminal summary (tests/conftest.py).

The hostile classes start from each tool's real output (tests/fixtures) and break it the
ways an attacker's mutation fuzz does: a number replaced by thousands of digits or by one
past 2**64, CRLF or CR line ends, NUL bytes, other scripts' digits, a GID's hex digit
replaced; `ip -j` JSON gets values of the wrong type at every level."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricprobe.agent.nixl import parse_totals
from fabricprobe.agent.spool import (
    SpoolCorrupt,
    SpoolKey,
    decode_record,
    decode_window,
    encode_record,
)
from fabricprobe.collector.attribution import otlp_http
from fabricprobe.core.errors import ParseError
from fabricprobe.core.hostport import parse_hostport
from fabricprobe.core.shards import parse_member
from fabricprobe.probes import ethtool, pcie
from fabricprobe.probes.control import ProtocolError, decode_payload
from fabricprobe.probes.counters import parse_counter
from fabricprobe.probes.hostload import parse_pressure
from fabricprobe.probes.rails import parse_rails
from fabricprobe.probes.roce import hwtools, tools
from fabricprobe.probes.roce import policy as roce_policy
from fabricprobe.probes.sysfs import Gid, parse_gid
from tests.conftest import FuzzCounter

N = 100  # examples per target
BATCH = 32  # inputs per example: 3,200 inputs per target, over 100,000 over the 37 targets

# Words the tools print, so that shuffled lines reach deep into each parser.
VOCAB = [
    "prio-pfc",
    "pg-pfc",
    "pfc-cap",
    "dscp-prio",
    "order",
    "pcp",
    "dscp",
    "enabled",
    "Priority",
    "trust",
    "state:",
    "mode:",
    "prio:",
    "dscp:",
    "PFC",
    "enabled:",
    "none",
    "port:",
    "max_mtu:",
    "active_mtu:",
    "link_layer:",
    "NIC",
    "statistics:",
    "on",
    "off",
    "0",
    "1",
    "3",
    "7",
    "8",
    "26",
    "63",
    "64",
    "-1",
    "0x1a",
    "AF31",
    "CS6",
    "EF",
    ":",
    ",",
    "3:on",
    "0:off",
    "9:on",
    "x:on",
    "AF31:3",
    "CS6:9",
    "²",
    "٣",
    "4096",
    "(5)",
    "Ethernet",
    "tc-bw",
    "tc-tsa",
    "ets",
    "strict",
    "prio-tc",
    "prio-buffer",
    "buffer-size",
    "total-size",
    "FEC",
    "Configured",
    "Active",
    "RS",
    "BaseR",
    "Auto",
    "driver:",
    "version:",
    "firmware-version:",
    "bus-info:",
    "App#",
    "Priority:",
    "Sel:",
    "Protocol:",
    "4791",
    "willing",
    "yes",
    "no",
    "tsa:",
    "bw",
    "\t",
    "  ",
    "[",
    "]",
    "{",
    "}",
    '"',
    "=",
    "Raw",
    "BER",
    "Pre-FEC",
    "E-12",
    "1.5E-12",
    "nan",
    "inf",
    "Speed:",
    "Width:",
    "x16",
    "16.0 GT/s PCIe",
    "8.0 GT/s",
    "Unknown",
]

_SEPARATORS = [" ", "\n", ":", "\t", ",", "=", "  ", "\n\t", "%", "/"]


def _vocab_text(data: bytes) -> str:
    """Bytes to tool-like text: most bytes pick a word of VOCAB, the rest a separator. One
    binary draw per input keeps generation cheap while hypothesis still mutates it."""
    out = []
    for x in data:
        if x < 200:
            out.append(VOCAB[x % len(VOCAB)] + (" " if x & 1 else ""))
        else:
            out.append(_SEPARATORS[x % len(_SEPARATORS)])
    return "".join(out)


texts = st.one_of(st.text(max_size=60), st.binary(max_size=40).map(_vocab_text))
FUZZ = settings(
    max_examples=N,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def batch(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(strategy, min_size=BATCH, max_size=BATCH)


def _probe(
    counter: FuzzCounter,
    target: str,
    fn: Callable[[Any], object],
    args: list[Any],
    allowed: tuple[type[BaseException], ...],
) -> None:
    for arg in args:
        counter.tried(target)
        try:
            fn(arg)
        except allowed:
            pass
        except Exception:
            counter.crashed(target)
            raise


def _ethtool_stats(text: str) -> object:
    stats = ethtool.parse_ethtool_stats(text)
    return ethtool.parse_pfc_stats(stats)


TEXT_PARSERS: list[tuple[str, Callable[[str], object], tuple[type[BaseException], ...]]] = [
    ("counters.parse_counter", parse_counter, (ParseError,)),
    ("ethtool.parse_ethtool_stats+parse_pfc_stats", _ethtool_stats, (ParseError,)),
    ("roce.tools.parse_dcb_pfc", tools.parse_dcb_pfc, (ParseError,)),
    ("roce.tools.parse_dcb_app", tools.parse_dcb_app, (ParseError,)),
    ("roce.tools.parse_dcb_apptrust", tools.parse_dcb_apptrust, (ParseError,)),
    ("roce.tools.parse_mlnx_qos", tools.parse_mlnx_qos, (ParseError,)),
    ("roce.tools.parse_lldptool_pfc", tools.parse_lldptool_pfc, (ParseError,)),
    ("roce.tools.parse_ibv_devinfo", tools.parse_ibv_devinfo, (ParseError,)),
    ("roce.tools.parse_ip_addr", tools.parse_ip_addr, (ParseError,)),
    ("roce.policy.parse_policy", roce_policy.parse_policy, (roce_policy.PolicyError,)),
    ("control.parse_hostport", parse_hostport, (ValueError,)),
    ("hostload.parse_pressure", parse_pressure, (ParseError,)),
    ("sysfs.Gid.ipv4", lambda s: Gid(0, s, "RoCE v2", None).ipv4, ()),
    ("sysfs.parse_gid", parse_gid, (ParseError,)),
    ("agent.nixl.parse_totals", parse_totals, ()),
    ("pcie.parse_pci_address", pcie.parse_pci_address, (ParseError,)),
    ("pcie.parse_pci_id", lambda s: pcie.parse_pci_id(s, "class", 6), (ParseError,)),
    ("pcie.parse_numa_node", pcie.parse_numa_node, (ParseError,)),
    ("pcie.parse_device_path", pcie.parse_device_path, (ParseError,)),
    ("rails.parse_rails", lambda s: parse_rails([s]), (ParseError,)),
    *(
        (f"roce.hwtools.{f.__name__}", f, (ParseError,))
        for f in (
            hwtools.parse_dcb_ets,
            hwtools.parse_mlnx_qos_ets,
            hwtools.parse_dcb_buffer,
            hwtools.parse_mlnx_qos_buffers,
            hwtools.parse_dcb_dcbx,
            hwtools.parse_mlnx_qos_dcbx,
            hwtools.parse_dcb_app_ports,
            hwtools.parse_lldptool_app,
            hwtools.parse_ethtool_pause,
            hwtools.parse_ethtool_link,
            hwtools.parse_ethtool_driver,
            hwtools.parse_ethtool_fec,
            hwtools.parse_mlxlink,
            hwtools.parse_link_speed,
            hwtools.parse_link_width,
            hwtools.parse_lspci_caps,
        )
    ),
]


@pytest.mark.parametrize(
    ("target", "fn", "allowed"), TEXT_PARSERS, ids=[t[0] for t in TEXT_PARSERS]
)
def test_text_parsers_raise_only_their_own_errors(
    target: str,
    fn: Callable[[str], object],
    allowed: tuple[type[BaseException], ...],
    fuzz_inputs: FuzzCounter,
) -> None:
    @FUZZ
    @given(batch(texts))
    def run(text: list[str]) -> None:
        _probe(fuzz_inputs, target, fn, text, allowed)

    run()


def test_policy_toml_with_policy_keys(fuzz_inputs: FuzzCounter) -> None:
    keys = ["priority", "dscp", "cnp_priority", "cnp_dscp", "mtu", "roce_mode", "bogus"]
    values = st.one_of(
        st.integers(-5, 5000), st.floats(allow_nan=True), st.text(max_size=8), st.booleans()
    )
    tables = st.dictionaries(st.sampled_from(keys), values, max_size=4)

    def toml_of(d: dict[str, Any]) -> str:
        def lit(v: Any) -> str:
            if isinstance(v, bool):
                return "true" if v else "false"
            if isinstance(v, str):
                return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
            if isinstance(v, float) and v != v:
                return "nan"
            return repr(v).replace("inf", "inf")

        return "[roce]\n" + "".join(f"{k} = {lit(v)}\n" for k, v in d.items())

    @FUZZ
    @given(batch(tables.map(toml_of)))
    def run(text: list[str]) -> None:
        _probe(
            fuzz_inputs,
            "roce.policy.parse_policy (typed tables)",
            roce_policy.parse_policy,
            text,
            (roce_policy.PolicyError,),
        )

    run()


def test_control_messages(fuzz_inputs: FuzzCounter) -> None:
    blobs = st.one_of(
        st.binary(max_size=64),
        st.text(max_size=64).map(str.encode),
        st.dictionaries(
            st.sampled_from(["kind", "op", "size", "n"]),
            st.integers() | st.text(max_size=5),
            max_size=3,
        ).map(lambda d: __import__("json").dumps(d).encode()),
    )

    @FUZZ
    @given(batch(blobs))
    def run(data: list[bytes]) -> None:
        _probe(fuzz_inputs, "control.decode_payload", decode_payload, data, (ProtocolError,))

    run()


def test_spool_file_decoder(fuzz_inputs: FuzzCounter) -> None:
    key = SpoolKey(5, 1)
    valid = encode_record(b"\x10\x05\x18\x01")  # epoch 5, seq 1

    def mutate(data: bytes, at: int, byte: int, cut: int) -> bytes:
        b = bytearray(data)
        if b:
            b[at % len(b)] = byte
        return bytes(b[: max(0, len(b) - cut)])

    files = st.one_of(
        st.binary(max_size=48),
        st.binary(max_size=32).map(encode_record),  # right header, payload garbage
        st.builds(
            mutate, st.just(valid), st.integers(0, 64), st.integers(0, 255), st.integers(0, 3)
        ),
    )

    def load(data: bytes) -> object:
        return decode_window(decode_record(data), key)

    @FUZZ
    @given(batch(files))
    def run(data: list[bytes]) -> None:
        _probe(fuzz_inputs, "agent.spool decode_record+decode_window", load, data, (SpoolCorrupt,))

    run()


def test_check_reports(fuzz_inputs: FuzzCounter) -> None:
    """Verdict reports as a stranger could send them, as messages and as raw bytes: the
    collector's book keeps a well-formed one or refuses it with ReportError, and keeps
    what it held before whatever comes."""
    from fabricprobe.collector.drift import DriftBook
    from fabricprobe.collector.store import ReportError, WindowStore
    from fabricprobe.core.api import fabricprobe_pb2 as pb

    store = WindowStore()
    store.register(pb.HostInfo(host="h", topology="t"))
    book = DriftBook(store)
    good = pb.CheckReport(host="h", taken_unix_ns=2**62)
    good.checks.add(check="pfc", status="PASS", value="3")
    book.take(good)
    short = st.text(max_size=12) | st.sampled_from(["PASS", "FAIL", "pfc", "h", "\x00", "é"])
    verdicts = st.builds(
        pb.CheckVerdict,
        check=short,
        device=short,
        port=st.integers(0, 2**32 - 1),
        status=short,
        value=st.text(max_size=300),
        message=short,
    )
    messages = st.builds(
        pb.CheckReport,
        host=st.sampled_from(["h", "", "other"]) | short,
        taken_unix_ns=st.integers(-(2**63), 2**63 - 1),
        checks=st.lists(verdicts, max_size=4),
        policy=short,
    )
    raw = st.binary(max_size=80).map(
        lambda b: pb.CheckReport.FromString(b) if _parses(pb.CheckReport, b) else pb.CheckReport()
    )

    @FUZZ
    @given(batch(messages | raw))
    def run(data: list[Any]) -> None:
        _probe(fuzz_inputs, "collector.drift DriftBook.take", book.take, data, (ReportError,))
        book.drift()

    run()
    # the newest run stays (taken at 2**62, later than anything but the largest stamps)
    assert "h" in book.hosts


def test_pci_device_paths(fuzz_inputs: FuzzCounter) -> None:
    """Device paths made of sysfs's own pieces, near misses among them: a path is a PCI
    function's, or a ParseError."""
    pieces = st.sampled_from(
        [
            "devices",
            "pci0000:17",
            "pci10000:e0",
            "PCI0000:17",
            "0000:17:01.0",
            "0000:18:00.0",
            "0000:1g:00.0",
            "0000:17:20.0",
            "10000:e0:1f.7",
            "virtual",
            "..",
            ".",
            "",
            "\x00",
            "9" * 80,
        ]
    )
    paths = st.lists(pieces, max_size=12).map("/".join)

    @FUZZ
    @given(batch(paths))
    def run(data: list[str]) -> None:
        _probe(
            fuzz_inputs,
            "pcie.parse_device_path (sysfs pieces)",
            pcie.parse_device_path,
            data,
            (ParseError,),
        )

    run()


def _parses(cls: Any, data: bytes) -> bool:
    try:
        cls.FromString(data)
    except Exception:  # a DecodeError: not a message at all, nothing to feed
        return False
    return True


# --------------------------------------------------------------------------- hostile

FIX = Path(__file__).resolve().parents[1] / "fixtures"
N_HOSTILE = 40  # examples per target: 1,280 inputs each on top of the random text above
_NUMBER = re.compile(r"[0-9]+")
_HEX_GROUP = re.compile(r"\b[0-9a-f]{4}:[0-9a-f]{4}\b")
_GID = "fe80:0000:0000:0000:ba3f:d2ff:fea1:b2c4\n0000:0000:0000:0000:0000:ffff:c0a8:0a0b\n"


def _fixture(name: str) -> str:
    return (FIX / name).read_text()


def _swap_number(text: str, k: int, new: str) -> str:
    spans = [m.span() for m in _NUMBER.finditer(text)]
    if not spans:
        return text + new
    a, b = spans[k % len(spans)]
    return text[:a] + new + text[b:]


def _swap_hex(text: str, k: int, bad: str) -> str:
    spans = [m.start() for m in _HEX_GROUP.finditer(text)]
    if not spans:
        return text + bad
    at = spans[k % len(spans)] + (k % 4)
    return text[:at] + bad + text[at + 1 :]


# One operation per byte pair: (op, argument). Each is a class the attacker's fuzz found.
def _mutate(text: str, data: bytes) -> str:
    for i in range(0, len(data) - 1, 2):
        op, k = data[i] % 12, data[i + 1]
        if op == 0:
            text = _swap_number(text, k, "9" * (4301 + 7 * k))  # past int()'s limit
        elif op == 1:
            text = _swap_number(text, k, str(2**64 + k))  # one past the widest counter
        elif op == 2:
            text = _swap_number(text, k, "0" * k + "1")  # leading zeros
        elif op == 3:
            text = text.replace("\n", "\r\n")
        elif op == 4:
            text = text.replace("\n", "\r")
        elif op == 5:
            at = k * len(text) // 256
            text = text[:at] + "\x00" + text[at:]
        elif op == 6:
            text = _swap_number(text, k, "\u0663\u00b2"[k % 2])
        elif op == 7:
            text = _swap_hex(text, k, "zg:-+ \x00"[k % 7])
        elif op == 8:
            text = _swap_number(text, k, "-" + str(k))
        elif op == 9:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[: k % (len(lines) + 1)] + lines[k % (len(lines) + 1) + 1 :])
        elif op == 10:
            at = text.find("[", k * len(text) // 256)  # nest past Python's stack
            text = text + "[" * 2000 if at < 0 else text[:at] + "[" * (1000 + 8 * k) + text[at:]
        else:
            at = k * len(text) // 256
            text = text[:at] + VOCAB[k % len(VOCAB)] + text[at:]
    return text


HOSTILE_TARGETS: list[tuple[str, Callable[[str], object], str]] = [
    (
        "counters.parse_counter",
        parse_counter,
        "sys/mlx5/class/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer",
    ),
    ("ethtool.parse_ethtool_stats+parse_pfc_stats", _ethtool_stats, "ethtool/mlx5_core.txt"),
    ("ethtool.parse_ethtool_stats (bnxt_en)", _ethtool_stats, "ethtool/bnxt_en.txt"),
    ("roce.tools.parse_dcb_pfc", tools.parse_dcb_pfc, "tools/mlx5/dcb_pfc_show.txt"),
    ("roce.tools.parse_dcb_app", tools.parse_dcb_app, "tools/mlx5/dcb_app_show.txt"),
    ("roce.tools.parse_mlnx_qos", tools.parse_mlnx_qos, "tools/mlx5/mlnx_qos.txt"),
    ("roce.tools.parse_lldptool_pfc", tools.parse_lldptool_pfc, "tools/mlx5/lldptool_pfc.txt"),
    ("roce.tools.parse_ibv_devinfo", tools.parse_ibv_devinfo, "tools/mlx5/ibv_devinfo.txt"),
    ("roce.tools.parse_ip_addr", tools.parse_ip_addr, "tools/mlx5/ip_addr.json"),
    ("roce.hwtools.parse_dcb_ets", hwtools.parse_dcb_ets, "tools/mlx5/dcb_ets_show.txt"),
    ("roce.hwtools.parse_mlnx_qos_ets", hwtools.parse_mlnx_qos_ets, "tools/mlx5/mlnx_qos.txt"),
    ("roce.hwtools.parse_dcb_buffer", hwtools.parse_dcb_buffer, "tools/mlx5/dcb_buffer_show.txt"),
    (
        "roce.hwtools.parse_mlnx_qos_buffers",
        hwtools.parse_mlnx_qos_buffers,
        "tools/mlx5/mlnx_qos.txt",
    ),
    (
        "roce.hwtools.parse_dcb_app_ports",
        hwtools.parse_dcb_app_ports,
        "tools/mlx5/dcb_app_show.txt",
    ),
    ("roce.hwtools.parse_lldptool_app", hwtools.parse_lldptool_app, "tools/mlx5/lldptool_app.txt"),
    ("roce.hwtools.parse_ethtool_link", hwtools.parse_ethtool_link, "tools/mlx5/ethtool.txt"),
    ("roce.hwtools.parse_ethtool_fec", hwtools.parse_ethtool_fec, "tools/mlx5/ethtool_fec.txt"),
    ("roce.hwtools.parse_mlxlink", hwtools.parse_mlxlink, "tools/mlx5/mlxlink.txt"),
    ("hostload.parse_pressure", parse_pressure, ""),
    ("sysfs.parse_gid", parse_gid, ""),
    ("sysfs.Gid.ipv4", lambda s: Gid(0, s.split("\n")[0], "RoCE v2", None).ipv4, ""),
    ("agent.nixl.parse_totals", parse_totals, "nixl/nixl_exporter_metrics.txt"),
    ("agent.nixl.parse_totals (vLLM)", parse_totals, "nixl/vllm_decode_metrics.txt"),
    ("roce.policy.parse_policy", roce_policy.parse_policy, ""),
    (
        "collector.attribution.otlp_http.decode (JSON)",
        lambda s: otlp_http.decode(s.encode(), otlp_http.JSON),
        "",
    ),
    ("core.shards.parse_member", lambda s: parse_member(s.encode()), ""),
]
_INLINE = {
    "hostload.parse_pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=123456\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    "sysfs.parse_gid": _GID,
    "sysfs.Gid.ipv4": _GID[40:] + _GID[:40],
    "roce.policy.parse_policy": "[roce]\npriority = 3\ndscp = 26\ncnp_priority = 6\n"
    "cnp_dscp = 48\nmtu = 4096\n[thresholds]\npause_duration_warn_pct = 1.0\n"
    "pause_frames_warn_per_s = [[[1000.0]]]\n",
    "collector.attribution.otlp_http.decode (JSON)": '{"resourceSpans": [{"resource": '
    '{"attributes": [{"key": "host.name", "value": {"stringValue": "h1"}}]}, '
    '"scopeSpans": [{"spans": '
    '[{"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", '
    '"name": "llm_request", "startTimeUnixNano": "1700000000000000000", '
    '"endTimeUnixNano": 1700000000500000000, "attributes": [{"key": '
    '"gen_ai.latency.e2e", "value": {"doubleValue": 0.5}}, {"key": "n", "value": '
    '{"intValue": "12"}}, {"key": "l", "value": {"arrayValue": {"values": [[[1]]]}}}]}]}]}]}',
    "core.shards.parse_member": '{"name": "s1", "api": "10.0.0.1:7070", "otlp": '
    '"10.0.0.1:4317", "metrics": "10.0.0.1:9464", "x": [[[[1]]]]}',
}
_ALLOWED: dict[str, tuple[type[BaseException], ...]] = {
    "sysfs.Gid.ipv4": (),
    "agent.nixl.parse_totals": (),
    "agent.nixl.parse_totals (vLLM)": (),
    "roce.policy.parse_policy": (roce_policy.PolicyError,),
    "collector.attribution.otlp_http.decode (JSON)": (otlp_http.BadRequest,),
    "core.shards.parse_member": (ValueError,),
}


@pytest.mark.parametrize(
    ("target", "fn", "fixture"), HOSTILE_TARGETS, ids=[t[0] for t in HOSTILE_TARGETS]
)
def test_text_parsers_on_hostile_fixtures(
    target: str, fn: Callable[[str], object], fixture: str, fuzz_inputs: FuzzCounter
) -> None:
    """Real output, broken in the attacker's ways: only the parser's own error escapes."""
    base = _INLINE.get(target) or _fixture(fixture)
    hostile = st.binary(min_size=2, max_size=8).map(lambda d: _mutate(base, d))
    allowed = _ALLOWED.get(target, (ParseError,))

    @settings(FUZZ, max_examples=N_HOSTILE)
    @given(batch(hostile))
    def run(text: list[str]) -> None:
        _probe(fuzz_inputs, f"{target} [hostile]", fn, text, allowed)

    run()


_GIANT_TOKEN = "__giant__"
_WRONG = [None, True, 0, -1, 2**70, 1.5, "", "x", [], {}, [1], [None], {"a": 1}, _GIANT_TOKEN]


def _ip_doc(data: bytes) -> str:
    """The `ip -j addr` fixture with values of the wrong type put in at DATA's paths."""
    doc: Any = json.loads(_fixture("tools/mlx5/ip_addr.json"))
    for i in range(0, len(data) - 2, 3):
        node, path = doc, [data[i], data[i + 1]]
        wrong = copy.deepcopy(_WRONG[data[i + 2] % len(_WRONG)])  # never a shared list
        for step in path:  # walk down at most two levels, then replace what is there
            if isinstance(node, dict) and node:
                key = sorted(node)[step % len(node)]
                if not isinstance(node[key], dict | list) or step & 1:
                    node[key] = wrong
                    break
                node = node[key]
            elif isinstance(node, list) and node:
                j = step % len(node)
                if not isinstance(node[j], dict | list) or step & 1:
                    node[j] = wrong
                    break
                node = node[j]
        if data[i] == 0:
            doc = wrong
    return json.dumps(doc).replace(f'"{_GIANT_TOKEN}"', "9" * 4400)


def test_ip_addr_on_json_of_wrong_shapes(fuzz_inputs: FuzzCounter) -> None:
    @settings(FUZZ, max_examples=N_HOSTILE)
    @given(batch(st.binary(min_size=3, max_size=9).map(_ip_doc)))
    def run(text: list[str]) -> None:
        _probe(
            fuzz_inputs,
            "roce.tools.parse_ip_addr [json shapes]",
            tools.parse_ip_addr,
            text,
            (ParseError,),
        )

    run()


MIN_INPUTS = 100_000  # what a CI run of this module must try, over all its targets


def test_the_run_tried_at_least_min_inputs(fuzz_inputs: FuzzCounter) -> None:
    """Last in the module: a whole run of it tried MIN_INPUTS or more (hypothesis may stop
    a target early; lowering N or BATCH too far fails here). Skipped when only some of
    the module's targets ran (pytest -k)."""
    targets = {t[0] for t in TEXT_PARSERS} | {f"{t[0]} [hostile]" for t in HOSTILE_TARGETS}
    targets |= {
        "roce.policy.parse_policy (typed tables)",
        "control.decode_payload",
        "agent.spool decode_record+decode_window",
        "collector.drift DriftBook.take",
        "roce.tools.parse_ip_addr [json shapes]",
    }
    counts = fuzz_inputs.counts()
    if not targets <= counts.keys():
        pytest.skip(f"{len(targets - counts.keys())} of the module's targets did not run")
    tried = sum(counts[t] for t in targets)
    assert tried >= MIN_INPUTS, f"{tried} inputs over {len(targets)} targets"
