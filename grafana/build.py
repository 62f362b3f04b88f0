"""Write the Grafana dashboards and the Prometheus rules from one compact description.

    python -m fabricprobe.grafana.build            # rewrite grafana/*.json and grafana/rules.yml
    python -m fabricprobe.grafana.build --check    # exit 1 when the committed files are stale

Every query here is held to collector/metrics.toml by tests/unit/test_grafana.py, and the
rules file is checked with `promtool check rules`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PATH = "src, dst, transport, op, size"
SEL = 'src=~"$src", dst=~"$dst", transport=~"$transport"'
HOST_SEL = 'src=~"$src"'


@dataclass(frozen=True)
class Panel:
    title: str
    exprs: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str
    kind: str = "timeseries"
    description: str = ""
    instant: bool = False  # one value per series (top-k bars, stats), not a time series
    fmt: str = "time_series"  # or "heatmap": buckets by `le`, drawn as a heatmap


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    """One dashboard: its rows of panels and its template variables."""

    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    variables: tuple[tuple[str, str], ...] = field(default=())  # (name, label_values query)


def _quantile(q: float) -> str:
    return f"fabricprobe:rtt_seconds:p{int(q * 100) if q < 0.999 else 999}"


# fabricprobe_rtt_seconds reaches Prometheus in one of two forms, by what the server asked
# for: a native histogram (one series per path, ~1 % resolution; a server started with
# --enable-feature=native-histograms scrapes protobuf) or classic `le` buckets (text, any
# server). A server holds one form or the other, so every RTT query is `native or classic`:
# the half the server lacks is empty, and where both exist (a mixed fleet) the native
# series win for the label sets they cover.
def rtt_quantile(q: float, by: str, sel: str = "", window: str = "5m") -> str:
    s = f"{{{sel}}}" if sel else ""
    native = f"histogram_quantile({q}, sum by ({by}) (rate(fabricprobe_rtt_seconds{s}[{window}])))"
    classic = (
        f"histogram_quantile({q}, sum by ({by}, le) "
        f"(rate(fabricprobe_rtt_seconds_bucket{s}[{window}])))"
    )
    return f"{native} or {classic}"


def rtt_distribution(sel: str, window: str = "5m") -> str:
    """Probes per RTT bucket: classic buckets by `le`, or the native histogram itself
    (Grafana draws a native histogram result as heatmap cells)."""
    return (
        f"sum by (le) (rate(fabricprobe_rtt_seconds_bucket{{{sel}}}[{window}])) "
        f"or sum(rate(fabricprobe_rtt_seconds{{{sel}}}[{window}]))"
    )


def path_variables(metric: str) -> tuple[tuple[str, str], ...]:
    """A dashboard's src, dst and transport variables: the label values of METRIC, a series
    every path it shows has."""
    return tuple(
        (label, f"label_values({metric}, {label})") for label in ("src", "dst", "transport")
    )


FABRIC = Dashboard(
    uid="fabricprobe-fabric",
    title="fabricprobe / fabric",
    description="Per-path RTT, loss, bandwidth and the RoCE counters that explain them.",
    # a counter of every probed path: there in either form of the RTT histogram
    variables=path_variables("fabricprobe_probe_exchanges_total"),
    rows=(
        Row(
            "Paths",
            (
                Panel(
                    "RTT p50 per path",
                    (
                        (
                            f"{_quantile(0.5)}{{{SEL}}}",
                            "{{src}} → {{dst}} {{transport}} {{op}} {{size}}",
                        ),
                    ),
                    "s",
                    description="Median probe round trip, from the merged HDR sketches.",
                ),
                Panel(
                    "RTT p99 per path",
                    (
                        (
                            f"{_quantile(0.99)}{{{SEL}}}",
                            "{{src}} → {{dst}} {{transport}} {{op}} {{size}}",
                        ),
                    ),
                    "s",
                    description="Tail round trip; the figure KV transfers feel.",
                ),
                Panel(
                    "Worst 10 paths by p99 RTT",
                    (
                        (
                            f"topk(10, {_quantile(0.99)}{{{SEL}}})",
                            "{{src}} → {{dst}} {{transport}} {{op}} {{size}}",
                        ),
                    ),
                    "s",
                    "bargauge",
                    description="The paths whose tail a KV transfer would feel most, now.",
                    instant=True,
                ),
                Panel(
                    "RTT distribution",
                    (
                        (
                            rtt_distribution(SEL),
                            "{{le}}",
                        ),
                    ),
                    "s",
                    "heatmap",
                    description="Probes per RTT bucket over time, for the selected paths.",
                    fmt="heatmap",
                ),
                Panel(
                    "Loss ratio",
                    ((f"fabricprobe_loss_ratio{{{SEL}}}", "{{src}} → {{dst}} {{transport}}"),),
                    "percentunit",
                ),
                Panel(
                    "RDMA ÷ TCP median RTT",
                    (
                        (
                            'fabricprobe_rdma_tcp_rtt_ratio{src=~"$src", dst=~"$dst"}',
                            "{{src}} → {{dst}} {{op}} {{size}}",
                        ),
                    ),
                    "suffix:×",
                    description="Below 1: kernel bypass is paying off on this pair.",
                ),
                Panel(
                    "Bandwidth",
                    (
                        (
                            f"fabricprobe_bandwidth_bytes_per_second{{{SEL}}}",
                            "{{src}} → {{dst}} {{transport}} {{op}}",
                        ),
                    ),
                    "Bps",
                ),
            ),
        ),
        Row(
            "Fleet and ToR pairs (every path, whatever the collectors show one by one)",
            (
                Panel(
                    "Fleet RTT p50 / p99 per probe kind",
                    (
                        (
                            "histogram_quantile(0.5, sum by (transport, op, size, le) "
                            "(rate(fabricprobe_fleet_rtt_seconds_bucket[5m])))",
                            "p50 {{transport}} {{op}} {{size}}",
                        ),
                        (
                            "histogram_quantile(0.99, sum by (transport, op, size, le) "
                            "(rate(fabricprobe_fleet_rtt_seconds_bucket[5m])))",
                            "p99 {{transport}} {{op}} {{size}}",
                        ),
                    ),
                    "s",
                    description="Every probe of every host, summed over the collector shards.",
                ),
                Panel(
                    "Fleet loss per probe kind",
                    (
                        (
                            "sum by (transport, op) (rate(fabricprobe_fleet_probe_lost_total[5m]))"
                            " / sum by (transport, op) "
                            "(rate(fabricprobe_fleet_probe_exchanges_total[5m]))",
                            "{{transport}} {{op}}",
                        ),
                    ),
                    "percentunit",
                ),
                Panel(
                    "Worst 20 ToR pairs by p99 RTT",
                    (
                        (
                            "topk(20, max by (src_tor, dst_tor, transport) "
                            "(fabricprobe_tor_pair_worst_rtt_p99_seconds))",
                            "{{src_tor}} → {{dst_tor}} {{transport}}",
                        ),
                    ),
                    "s",
                    "bargauge",
                    instant=True,
                    description="The highest newest-window p99 among each ToR pair's paths; "
                    "pairs under one ToR always, other pairs while among the worst.",
                ),
                Panel(
                    "Worst 20 ToR pairs by loss",
                    (
                        (
                            "topk(20, max by (src_tor, dst_tor, transport) "
                            "(fabricprobe_tor_pair_loss_ratio))",
                            "{{src_tor}} → {{dst_tor}} {{transport}}",
                        ),
                    ),
                    "percentunit",
                    "bargauge",
                    instant=True,
                ),
                Panel(
                    "Paths shown one by one, and why",
                    (
                        ("sum by (reason) (fabricprobe_collector_detail_paths)", "{{reason}}"),
                        (
                            'sum(fabricprobe_collector_detail_omitted{what="path"})',
                            "in the aggregates only",
                        ),
                    ),
                    "none",
                    description="Per-path series are kept to a bound (worst k per kind, "
                    "alerts, paths of recent requests, held for a while); every agent's "
                    "own /metrics has all of its paths.",
                ),
            ),
        ),
        Row(
            "Lossless Ethernet (PFC, ECN, retransmits)",
            (
                Panel(
                    "Time paused by PFC, per priority",
                    (
                        (
                            f"rate(fabricprobe_pfc_rx_pause_seconds_total{{{HOST_SEL}}}[5m])",
                            "{{src}} {{netdev}} rx prio {{priority}}",
                        ),
                        (
                            f"rate(fabricprobe_pfc_tx_pause_seconds_total{{{HOST_SEL}}}[5m])",
                            "{{src}} {{netdev}} tx prio {{priority}}",
                        ),
                    ),
                    "percentunit",
                    description="Fraction of each second a priority was paused.",
                ),
                Panel(
                    "PFC pause frames per second",
                    (
                        (
                            f"rate(fabricprobe_pfc_rx_pause_frames_total{{{HOST_SEL}}}[5m])",
                            "{{src}} {{netdev}} rx prio {{priority}}",
                        ),
                        (
                            f"rate(fabricprobe_pfc_tx_pause_frames_total{{{HOST_SEL}}}[5m])",
                            "{{src}} {{netdev}} tx prio {{priority}}",
                        ),
                    ),
                    "pps",
                ),
                Panel(
                    "Retransmits and timeouts",
                    (
                        (
                            f'fabricprobe_rdma_port_stat_per_second{{{HOST_SEL}, counter=~"'
                            "roce_adp_retrans|local_ack_timeout_err|packet_seq_err|out_of_sequence|"
                            'completer_retry_err|rcvd_seq_err|duplicate_request|to_retransmits"}',
                            "{{src}} {{device}} {{counter}}",
                        ),
                    ),
                    "pps",
                ),
                Panel(
                    "Congestion notification (ECN marks, CNPs)",
                    (
                        (
                            f'fabricprobe_rdma_port_stat_per_second{{{HOST_SEL}, counter=~"'
                            "np_ecn_marked_roce_packets|np_cnp_sent|rp_cnp_handled|rx_cnp_pkts|"
                            'tx_cnp_pkts|rx_ecn_marked_pkts"}',
                            "{{src}} {{device}} {{counter}}",
                        ),
                    ),
                    "pps",
                ),
                Panel(
                    "Drops (out of buffer, discards)",
                    (
                        (
                            f'fabricprobe_rdma_port_stat_per_second{{{HOST_SEL}, counter=~"'
                            'out_of_buffer|rx_out_of_buffer|port_xmit_discards|rx_roce_discards"}',
                            "{{src}} {{device}} {{counter}}",
                        ),
                        (
                            f"rate(fabricprobe_pfc_rx_discards_total{{{HOST_SEL}}}[5m])",
                            "{{src}} {{netdev}} prio {{priority}} discards",
                        ),
                    ),
                    "pps",
                ),
            ),
        ),
        Row(
            "Agents and collector",
            (
                Panel(
                    "Hosts up",
                    (("sum(fabricprobe_host_up)", "up"), ("fabricprobe_collector_hosts", "known")),
                    "none",
                    "stat",
                    instant=True,
                ),
                Panel(
                    "Agent CPU (share of one core)",
                    ((f"rate(fabricprobe_agent_cpu_seconds_total{{{HOST_SEL}}}[5m])", "{{src}}"),),
                    "percentunit",
                    description="Target: at most 1 % of a core at the default schedule.",
                ),
                Panel(
                    "Agent resident memory",
                    ((f"fabricprobe_agent_resident_memory_bytes{{{HOST_SEL}}}", "{{src}}"),),
                    "bytes",
                ),
                Panel(
                    "Probe links and sessions",
                    (
                        (f"fabricprobe_agent_probe_links{{{HOST_SEL}}}", "{{src}} links held"),
                        (f"fabricprobe_agent_probe_sessions{{{HOST_SEL}}}", "{{src}} sessions"),
                        (
                            f"rate(fabricprobe_agent_probe_sessions_refused_total{{{HOST_SEL}}}"
                            "[5m]) * 60",
                            "{{src}} refused per minute",
                        ),
                    ),
                    "none",
                    description="Kept links an agent holds to its targets, the sessions its "
                    "responder answers (224 at most), and probers it turned away as busy.",
                ),
                Panel(
                    "Host CPU pressure and agent self-throttle",
                    (
                        (f"fabricprobe_host_cpu_pressure_ratio{{{HOST_SEL}}}", "{{src}} pressure"),
                        (f"fabricprobe_agent_self_throttle{{{HOST_SEL}}} - 1", "{{src}} throttle"),
                    ),
                    "percentunit",
                    description="Share of the window some task on the host waited for a CPU "
                    "(PSI), and how far the agent stretched its probe intervals to spare the "
                    "host (0 % = the plan's pace, 300 % = 4x slower; it never stops).",
                ),
                Panel(
                    "Agent spool depth",
                    ((f"fabricprobe_agent_spool_windows{{{HOST_SEL}}}", "{{src}}"),),
                    "none",
                    description="Windows waiting for the collector; non-zero means an outage.",
                ),
                Panel(
                    "Collector reports per second",
                    (
                        ("rate(fabricprobe_collector_reports_total[5m])", "merged"),
                        ("rate(fabricprobe_collector_duplicate_reports_total[5m])", "duplicate"),
                        ("rate(fabricprobe_collector_rejected_reports_total[5m])", "rejected"),
                    ),
                    "reqps",
                ),
                Panel(
                    "Collector RPC p99",
                    (
                        (
                            "histogram_quantile(0.99, sum by (method, le) "
                            "(rate(fabricprobe_collector_rpc_duration_seconds_bucket[5m])))",
                            "{{method}}",
                        ),
                    ),
                    "s",
                ),
            ),
        ),
        Row(
            "Links and rails",
            (
                Panel(
                    "Suspect links",
                    (("fabricprobe_link_suspect == 1", "{{link}} (rail {{rail}})"),),
                    "none",
                    "bargauge",
                    instant=True,
                    description="Leaf-spine links the tomography over the probed ECMP "
                    "classes names: the classes through the link rose or lost, the classes "
                    "around it did not. `probe why --links` gives the evidence.",
                ),
                Panel(
                    "Likeliest links at fault",
                    (
                        (
                            "bottomk(10, fabricprobe_link_rank)",
                            "{{link}} (rail {{rail}})",
                        ),
                    ),
                    "none",
                    "bargauge",
                    instant=True,
                    description="The ten links ranked first (1: the likeliest), suspect or not.",
                ),
                Panel(
                    "RTT rise through each link",
                    (
                        (
                            "topk(10, fabricprobe_link_rtt_rise_seconds)",
                            "{{link}} (rail {{rail}})",
                        ),
                    ),
                    "s",
                    description="Median rise of the RTT over its baseline, of the classes "
                    "crossing the link (the ten highest).",
                ),
                Panel(
                    "Loss through each link",
                    (
                        (
                            "topk(10, fabricprobe_link_loss_ratio)",
                            "{{link}} (rail {{rail}})",
                        ),
                    ),
                    "percentunit",
                    description="Lost over sent probes of the classes crossing the link, "
                    "their newest two windows.",
                ),
                Panel(
                    "Link coverage",
                    (
                        ("fabricprobe_link_class_paths", "class paths known"),
                        ("fabricprobe_links_uncovered", "links under k classes"),
                    ),
                    "none",
                    description="ECMP class paths learned from the agents' traces, and the "
                    "fabric's links that fewer than k probed classes cross (0 when the "
                    "plan covers the fabric).",
                ),
                Panel(
                    "Paths standing out per rail",
                    (
                        ("fabricprobe_rail_paths_standing_out", "rail {{rail}} standing out"),
                        ("fabricprobe_rail_paths", "rail {{rail}} probed"),
                    ),
                    "none",
                    description="Host pairs whose RTT on a rail is over twice their other "
                    "rails', or lost where those did not: a fault on one rail's network.",
                ),
                Panel(
                    "Loss per rail",
                    (("fabricprobe_rail_loss_ratio", "rail {{rail}}"),),
                    "percentunit",
                    description="Lost over sent probes of each rail's paths, newest windows.",
                ),
            ),
        ),
        Row(
            "Configuration drift",
            (
                Panel(
                    "Hosts unlike their group",
                    (("fabricprobe_drift_hosts", "hosts"),),
                    "none",
                    "stat",
                    instant=True,
                    description="Hosts whose RoCE configuration differs from the one most "
                    "hosts of their ToR or role hold (waived differences not counted).",
                ),
                Panel(
                    "Differences from the group",
                    (
                        (
                            "max by (host, check, group_by, group) "
                            '(fabricprobe_host_check_drift{waived="false"})',
                            "{{host}} {{check}} ({{group_by}} {{group}})",
                        ),
                    ),
                    "none",
                    "bargauge",
                    instant=True,
                    description="Each host and check that differs; `probe validate --fleet` "
                    "shows the values side by side.",
                ),
                Panel(
                    "Failing checks by host",
                    (
                        (
                            "topk(20, count by (host) (fabricprobe_host_check_status == 3))",
                            "{{host}}",
                        ),
                    ),
                    "none",
                    "bargauge",
                    instant=True,
                    description="Checks with a FAIL on any port, from the agents' scheduled "
                    "`probe validate`.",
                ),
                Panel(
                    "Age of the newest checks",
                    (("max(fabricprobe_host_checks_age_seconds)", "oldest host"),),
                    "s",
                    description="Agents check hourly (jittered); far above that, a host has "
                    "stopped checking.",
                ),
            ),
        ),
    ),
)

KV_SEL = 'src=~"$src", dst=~"$dst", transport=~"$transport"'

REQUESTS = Dashboard(
    uid="fabricprobe-requests",
    title="fabricprobe / requests",
    description="Inference stages joined with the fabric: how much of each request was the "
    "fabric, on which path.",
    variables=path_variables("fabricprobe_kv_transfer_seconds_bucket"),
    rows=(
        Row(
            "Requests",
            (
                Panel(
                    "Stage duration p50 / p99",
                    (
                        (
                            "histogram_quantile(0.5, sum by (stage, le) "
                            "(rate(fabricprobe_stage_duration_seconds_bucket[5m])))",
                            "p50 {{stage}}",
                        ),
                        (
                            "histogram_quantile(0.99, sum by (stage, le) "
                            "(rate(fabricprobe_stage_duration_seconds_bucket[5m])))",
                            "p99 {{stage}}",
                        ),
                    ),
                    "s",
                    description="queue, prefill, kv_transfer, decode, detokenize, deliver.",
                ),
                Panel(
                    "TTFT and inter-token latency p99",
                    (
                        (
                            "histogram_quantile(0.99, sum by (le) "
                            "(rate(fabricprobe_request_ttft_seconds_bucket[5m])))",
                            "TTFT p99",
                        ),
                        (
                            "histogram_quantile(0.99, sum by (le) "
                            "(rate(fabricprobe_request_itl_seconds_bucket[5m])))",
                            "inter-token p99",
                        ),
                    ),
                    "s",
                    description="Kept apart: TTFT carries the KV transfer, ITL the decode.",
                ),
                Panel(
                    "KV wait and the fabric's part of TTFT",
                    (
                        ("fabricprobe_kv_share_ttft_ratio", "KV wait / TTFT"),
                        ("fabricprobe_fabric_share_ttft_ratio", "fabric / TTFT (estimated)"),
                    ),
                    "percentunit",
                    description="The decode side's whole wait for remote KV over TTFT, and "
                    "the part of it the path's fabric explains (its RTTs, bandwidth, loss "
                    "and pauses for the bytes moved): the gap is the transfer library's "
                    "and the engines' own time.",
                ),
                Panel(
                    "KV wait in three parts per path (median)",
                    (
                        (
                            f"fabricprobe_path_kv_fabric_seconds{{{KV_SEL}}}",
                            "fabric {{src}}->{{dst}}",
                        ),
                        (
                            f"fabricprobe_path_kv_transfer_stack_seconds{{{KV_SEL}}}",
                            "transfer stack {{src}}->{{dst}}",
                        ),
                        (
                            f"fabricprobe_path_kv_engine_wait_seconds{{{KV_SEL}}}",
                            "engine wait {{src}}->{{dst}}",
                        ),
                    ),
                    "s",
                    description="fabric: estimated from the path's figures at the time; "
                    "transfer stack: the transfer library's own time beyond it (the span's "
                    "own figure, else NIXL's telemetry on the decode host); engine wait: the "
                    "rest of the wait (scheduling, polling).",
                ),
                Panel(
                    "Goodput under SLO beside throughput",
                    (
                        (
                            "fabricprobe_goodput_tokens_per_second",
                            "goodput (met TTFT and ITL targets)",
                        ),
                        ("fabricprobe_throughput_tokens_per_second", "throughput"),
                    ),
                    "suffix: tok/s",
                ),
            ),
        ),
        Row(
            "Which path",
            (
                Panel(
                    "KV transfer p99 per path",
                    (
                        (
                            f"histogram_quantile(0.99, sum by (src, dst, transport, le) "
                            f"(rate(fabricprobe_kv_transfer_seconds_bucket{{{KV_SEL}}}[5m])))",
                            "{{src}} → {{dst}} {{transport}}",
                        ),
                    ),
                    "s",
                ),
                Panel(
                    "Slowest 10 paths by KV transfer p99",
                    (
                        (
                            "topk(10, histogram_quantile(0.99, sum by (src, dst, transport, le) "
                            f"(rate(fabricprobe_kv_transfer_seconds_bucket{{{KV_SEL}}}[5m]))))",
                            "{{src}} → {{dst}} {{transport}}",
                        ),
                    ),
                    "s",
                    "bargauge",
                    instant=True,
                ),
                Panel(
                    "KV transfer time distribution",
                    (
                        (
                            "sum by (le) "
                            f"(rate(fabricprobe_kv_transfer_seconds_bucket{{{KV_SEL}}}[5m]))",
                            "{{le}}",
                        ),
                    ),
                    "s",
                    "heatmap",
                    fmt="heatmap",
                ),
                Panel(
                    "Stage time each path explains",
                    (
                        (
                            f"fabricprobe_path_explained_seconds{{{KV_SEL}}}",
                            "{{src}} → {{dst}} {{transport}}",
                        ),
                    ),
                    "s",
                    description="Paths ranked by the KV-transfer time they add over the others.",
                ),
                Panel(
                    "Fabric-bound and faulty paths",
                    (
                        (
                            f"fabricprobe_path_fabric_bound{{{KV_SEL}}}",
                            "{{src}} → {{dst}} {{transport}} bound",
                        ),
                        (
                            f"fabricprobe_path_fabric_fault{{{KV_SEL}}}",
                            "{{src}} → {{dst}} {{transport}} fault",
                        ),
                    ),
                    "bool",
                    description="Bound: its KV transfers are slow and its probes or congestion "
                    "counters say why. Fault: its probes' RTT floor stands out (host noise "
                    "cannot raise a floor), even where busy senders hide it in their "
                    "transfers' time.",
                ),
                Panel(
                    "Host-bound paths, and the hosts' delay in their RTT",
                    (
                        (
                            f"fabricprobe_path_host_bound{{{KV_SEL}}}",
                            "{{src}} → {{dst}} host-bound",
                        ),
                        (
                            f"fabricprobe_path_host_delay_seconds{{{KV_SEL}}}",
                            "{{src}} → {{dst}} host delay (s)",
                        ),
                    ),
                    "none",
                    description="Host-bound: its transfers ran mostly in windows where its hosts' "
                    "own delay (the prober's, measured in its probes, or the hosts' reference "
                    "probes) made most of its RTT's rise, at the median or in the tail: the "
                    "hosts are busy, the network is not to blame.",
                ),
                Panel(
                    "KV time vs probe tail RTT (rank correlation)",
                    (
                        (
                            f"fabricprobe_path_kv_rtt_rank_correlation{{{KV_SEL}}}",
                            "{{src}} → {{dst}} {{transport}}",
                        ),
                    ),
                    "none",
                ),
                Panel(
                    "Communication-bound",
                    (("fabricprobe_communication_bound", "flag"),),
                    "bool",
                    "stat",
                    instant=True,
                    description="KV transfer and decode queueing rising together while "
                    "compute stays flat.",
                ),
                Panel(
                    "OTLP spans",
                    (
                        ("rate(fabricprobe_otlp_spans_received_total[5m])", "received"),
                        ("rate(fabricprobe_otlp_spans_rejected_total[5m])", "rejected"),
                    ),
                    "cps",
                ),
            ),
        ),
    ),
)

RECORDING: list[dict[str, str]] = [
    {
        "record": _quantile(q),
        "expr": rtt_quantile(q, PATH),
    }
    for q in (0.5, 0.99, 0.999)
]

ALERTS: list[dict[str, Any]] = [
    {
        # A host the collector has given up on leaves /metrics; `unless` keeps the alert
        # firing for a day after its last report instead of letting it resolve.
        "alert": "FabricprobeHostDown",
        "expr": "fabricprobe_host_up == 0 or "
        "(max_over_time(fabricprobe_host_up[1d]) unless fabricprobe_host_up)",
        "for": "2m",
        "labels": {"severity": "page"},
        "annotations": {"summary": "agent on {{ $labels.src }} stopped reporting"},
    },
    {
        "alert": "FabricprobeCollectorDown",
        "expr": "absent_over_time(fabricprobe_collector_hosts[2m])",
        "for": "1m",
        "labels": {"severity": "page"},
        "annotations": {
            "summary": "no collector has been scraped for 2 minutes: the fleet's figures "
            "and alerts are blind"
        },
    },
    {
        "alert": "FabricprobePathLoss",
        "expr": "fabricprobe_loss_ratio > 0.01",
        "for": "5m",
        "labels": {"severity": "page"},
        "annotations": {
            "summary": "{{ $labels.src }} -> {{ $labels.dst }} ({{ $labels.transport }}) "
            "loses {{ $value | humanizePercentage }} of probes"
        },
    },
    {
        "alert": "FabricprobePathTailRegressed",
        "expr": f"{_quantile(0.99)} > 3 * quantile_over_time(0.5, {_quantile(0.99)}[1d])",
        "for": "10m",
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "{{ $labels.src }} -> {{ $labels.dst }} p99 RTT is over 3x its "
            "own daily median"
        },
    },
    {
        "alert": "FabricprobePfcPauseStorm",
        "expr": "rate(fabricprobe_pfc_rx_pause_seconds_total[5m]) > 0.1",
        "for": "5m",
        "labels": {"severity": "page"},
        "annotations": {
            "summary": "{{ $labels.src }} {{ $labels.netdev }} priority "
            "{{ $labels.priority }} paused over 10 % of the time"
        },
    },
    {
        "alert": "FabricprobeRoceRetransmits",
        "expr": 'fabricprobe_rdma_port_stat_per_second{counter=~"roce_adp_retrans|'
        'local_ack_timeout_err|packet_seq_err|to_retransmits"} > 1',
        "for": "10m",
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "{{ $labels.src }} {{ $labels.device }} {{ $labels.counter }} "
            "at {{ $value }}/s: packets are being lost on a lossless fabric"
        },
    },
    {
        "alert": "FabricprobeAgentSpooling",
        "expr": "fabricprobe_agent_spool_windows > 0",
        "for": "10m",
        "labels": {"severity": "ticket"},
        "annotations": {"summary": "agent on {{ $labels.src }} cannot deliver its windows"},
    },
    {
        "alert": "FabricprobeAgentFaults",
        "expr": "increase(fabricprobe_agent_thread_failures_total[1h]) > 0 or "
        "increase(fabricprobe_agent_spool_write_failures_total[15m]) > 0 or "
        "increase(fabricprobe_agent_spool_quarantined_total[1h]) > 0",
        "for": "0m",
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "agent on {{ $labels.src }} healed a fault (a thread that died, a "
            "spool write the disk refused, or a corrupt spool file)"
        },
    },
    {
        # from the agents' own /metrics (no src label: the scrape target names the host)
        "alert": "FabricprobeAgentToolMissing",
        "expr": "fabricprobe_agent_tool_missing == 1",
        "for": "10m",
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "{{ $labels.instance }} has no {{ $labels.tool }}: its PFC, ECN and "
            "discard counters are absent and the pause-storm alert cannot fire there"
        },
    },
    {
        "alert": "FabricprobeAgentRefusingProbes",
        "expr": "increase(fabricprobe_agent_probe_sessions_refused_total[15m]) > 0",
        "for": "15m",
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "agent on {{ $labels.src }} turns probers away as busy: "
            "its peers' probes to it fail"
        },
    },
    {
        "alert": "FabricprobeConfigDrift",
        "expr": "max by (host, check, group_by, group) "
        '(fabricprobe_host_check_drift{waived="false"}) == 1',
        "for": "30m",
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "{{ $labels.host }}'s {{ $labels.check }} differs from most hosts of its "
            "{{ $labels.group_by }} {{ $labels.group }}: probe validate --fleet shows the values"
        },
    },
    {
        "alert": "FabricprobeHostCheckFailing",
        "expr": "fabricprobe_host_check_status == 3",
        "for": "2h",
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "{{ $labels.host }} fails the {{ $labels.check }} check: "
            "probe validate on it gives the fix"
        },
    },
    {
        "alert": "FabricprobeAgentThrottled",
        "expr": "fabricprobe_agent_self_throttle > 2",
        "for": "30m",
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "agent on {{ $labels.src }} probes {{ $value }}x slower than planned "
            "to spare its busy host: its paths' figures are thinner"
        },
    },
    {
        "alert": "FabricprobeAgentFootprint",
        "expr": "rate(fabricprobe_agent_cpu_seconds_total[15m]) > 0.01 or "
        "fabricprobe_agent_resident_memory_bytes > 64 * 1024 * 1024",
        "for": "15m",
        "labels": {"severity": "ticket"},
        "annotations": {
            "summary": "agent on {{ $labels.src }} uses more than its budget "
            "(1 % of a core, 64 MiB)"
        },
    },
]


RUNBOOK_BASE = "grafana/runbooks.md"


def runbook_anchor(alert: str) -> str:
    """The heading id of ALERT's section in runbooks.md (GitHub's rule: lower case)."""
    return alert.lower()


def render_dashboard(d: Dashboard) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    pid = 1
    for row in d.rows:
        panels.append(
            {
                "type": "row",
                "title": row.title,
                "id": pid,
                "collapsed": False,
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        pid += 1
        y += 1
        for i, p in enumerate(row.panels):
            w = 8 if p.kind == "stat" else 12
            options: dict[str, Any] = {}
            if p.kind == "heatmap":  # buckets as Prometheus gives them, upper bounds on y
                options = {
                    "calculate": False,
                    "yAxis": {"unit": p.unit},
                    "cellValues": {"unit": "ops"},
                    "color": {"scheme": "Oranges", "mode": "scheme"},
                }
            elif p.kind == "bargauge":
                options = {"orientation": "horizontal", "displayMode": "gradient"}
            panels.append(
                {
                    "type": p.kind,
                    "title": p.title,
                    "id": pid,
                    "description": p.description,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "gridPos": {"x": (i % 2) * 12, "y": y + (i // 2) * 8, "w": w, "h": 8},
                    "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                    "options": options,
                    "targets": [
                        {
                            "refId": chr(ord("A") + j),
                            "expr": expr,
                            "legendFormat": legend,
                            "instant": p.instant,
                            "range": not p.instant,
                            "format": p.fmt,
                            "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        }
                        for j, (expr, legend) in enumerate(p.exprs)
                    ],
                }
            )
            pid += 1
        y += ((len(row.panels) + 1) // 2) * 8
    variables: list[dict[str, Any]] = [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}
    ]
    for name, query in d.variables:
        variables.append(
            {
                "name": name,
                "type": "query",
                "query": query,
                "refresh": 2,
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
            }
        )
    return {
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": ["fabricprobe"],
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": variables},
        "panels": panels,
    }


def render_rules() -> str:
    """The rules file as YAML (written by hand: the structure is fixed and small)."""
    lines = [
        "# Prometheus rules for fabricprobe; written by grafana/build.py.",
        "groups:",
        "  - name: fabricprobe-recording",
        "    rules:",
    ]
    for r in RECORDING:
        lines += [f"      - record: {r['record']}", f"        expr: {json.dumps(r['expr'])}"]
    lines += ["  - name: fabricprobe-alerts", "    rules:"]
    for a in ALERTS:
        lines += [
            f"      - alert: {a['alert']}",
            f"        expr: {json.dumps(a['expr'])}",
            f"        for: {a['for']}",
            "        labels:",
        ]
        lines += [f"          {k}: {v}" for k, v in a["labels"].items()]
        lines += ["        annotations:"]
        lines += [f"          {k}: {json.dumps(v)}" for k, v in a["annotations"].items()]
        runbook = f"{RUNBOOK_BASE}#{runbook_anchor(a['alert'])}"
        lines += [f"          runbook_url: {json.dumps(runbook)}"]
    return "\n".join(lines) + "\n"


DASHBOARDS = (FABRIC, REQUESTS)


def outputs() -> dict[Path, str]:
    files = {
        HERE / f"{d.uid}.json": json.dumps(render_dashboard(d), indent=2) + "\n" for d in DASHBOARDS
    }
    files[HERE / "rules.yml"] = render_rules()
    return files


def main(argv: list[str]) -> int:
    stale = [p for p, text in outputs().items() if not p.exists() or p.read_text() != text]
    if "--check" in argv:
        for p in stale:
            print(f"stale: {p} (run python -m fabricprobe.grafana.build)")
        return 1 if stale else 0
    for p, text in outputs().items():
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
