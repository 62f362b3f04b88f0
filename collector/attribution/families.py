"""The attribution's metric families, as data: one row each (collector/families.py's
`Family`), in the order /metrics shows them; collector/attribution/exporter.py fills
them, its docstring says how their labels are bounded."""

from __future__ import annotations

from fabricprobe.collector.families import Family

PATH = ("src", "dst", "transport")
NIXL_LABELS = ("host", "engine")

ATTRIBUTION_FAMILIES = (
    Family(
        "stage",
        "histogram",
        "stage_duration_seconds",
        "Inference stage duration from OTLP stage spans.",
        ("stage",),
    ),
    Family(
        "kv", "histogram", "kv_transfer_seconds", "KV-cache transfer time per fabric path.", PATH
    ),
    Family("ttft", "histogram", "request_ttft_seconds", "Time to first token per request."),
    Family("itl", "histogram", "request_itl_seconds", "Mean inter-token latency per request."),
    Family(
        "explained",
        "gauge",
        "path_explained_seconds",
        "KV-transfer seconds beyond the fleet's speed for the same bytes, last window.",
        PATH,
    ),
    Family(
        "bound",
        "gauge",
        "path_fabric_bound",
        "1 when the path's KV transfers are slow and its fabric figures account for it.",
        PATH,
    ),
    Family(
        "fault",
        "gauge",
        "path_fabric_fault",
        "1 when the path's probe RTT floor stands out from the other paths' (evidence "
        "host noise cannot make), whether or not its transfers were slow.",
        PATH,
    ),
    Family(
        "host_bound",
        "gauge",
        "path_host_bound",
        "1 when the path's KV transfers ran mostly in windows where its hosts' own "
        "delay made most of its RTT rise, and the fabric does not account for them.",
        PATH,
    ),
    Family(
        "host_delay",
        "gauge",
        "path_host_delay_seconds",
        "What the path's hosts add to its probe RTT (their reference probes), median.",
        PATH,
    ),
    Family(
        "rho",
        "gauge",
        "path_kv_rtt_rank_correlation",
        "Spearman rho of KV-transfer time per byte with probe p99 RTT, newest window.",
        PATH,
    ),
    Family(
        "kv_share",
        "gauge",
        "kv_share_ttft_ratio",
        "Median share of TTFT the decode side waited for remote KV, last window.",
    ),
    Family(
        "share",
        "gauge",
        "fabric_share_ttft_ratio",
        "Median share of TTFT the path's fabric explains (fabric_s / TTFT), last window.",
    ),
    Family(
        "comm",
        "gauge",
        "communication_bound",
        "1 when KV transfer and queueing rise together while compute stays flat.",
    ),
    Family(
        "goodput",
        "gauge",
        "goodput_tokens_per_second",
        "Tokens per second from requests that met their TTFT and ITL targets.",
    ),
    Family(
        "throughput",
        "gauge",
        "throughput_tokens_per_second",
        "Tokens per second from all requests, last window.",
    ),
    Family("received", "counter", "otlp_spans_received", "Spans received by the OTLP receiver."),
    Family(
        "rejected", "counter", "otlp_spans_rejected", "Spans refused as malformed or oversized."
    ),
    Family(
        "ignored",
        "counter",
        "otlp_spans_ignored",
        "Spans taken but not used: other instrumentation, engine spans not mapped.",
    ),
    Family(
        "engine_spans",
        "counter",
        "otlp_engine_spans",
        "Spans received from inference engines, by engine.",
        ("engine",),
    ),
    Family(
        "unmapped",
        "counter",
        "otlp_engine_spans_unmapped",
        "Engine spans whose name the receiver does not map (counted, not errors).",
        ("engine",),
    ),
    Family(
        "late",
        "counter",
        "otlp_engine_spans_late",
        "Engine request spans that came after their request was counted without them.",
    ),
    Family(
        "path_known",
        "counter",
        "requests_path_known",
        "Engine requests whose KV path (prefill host -> decode host) was found.",
    ),
    Family(
        "path_unknown",
        "counter",
        "requests_path_unknown",
        "Engine requests whose path is unknown, by reason.",
        ("reason",),
    ),
    Family(
        "kv_wait",
        "gauge",
        "path_kv_wait_seconds",
        "Median wait of the decode side for remote KV on the path, last window.",
        PATH,
    ),
    Family(
        "kv_fabric",
        "gauge",
        "path_kv_fabric_seconds",
        "Median of that wait the path's fabric explains (RTTs, bandwidth, loss, pauses;"
        " estimated), last window.",
        PATH,
    ),
    Family(
        "kv_stack",
        "gauge",
        "path_kv_transfer_stack_seconds",
        "Median of that wait the transfer library took beyond the fabric (NIXL's"
        " telemetry), last window.",
        PATH,
    ),
    Family(
        "kv_engine",
        "gauge",
        "path_kv_engine_wait_seconds",
        "Median of that wait left to the engines (scheduling, polling), last window.",
        PATH,
    ),
    Family(
        "tor_price",
        "gauge",
        "tor_pair_kv_cost_seconds",
        "Predicted fabric time of a 1 MiB KV transfer between the ToR pair's engine hosts"
        " now (worst host pair; quantile 0.5 or 0.99 of its RTT).",
        (
            "src_tor",
            "dst_tor",
            "quantile",
        ),
    ),
    Family(
        "price_answers",
        "counter",
        "kv_cost_answers",
        "Requests for the fabric's price, by answer: known, unknown (no fresh figures),"
        " refused (a bad argument).",
        ("answer",),
    ),
    Family(
        "price_pairs",
        "gauge",
        "kv_cost_host_pairs",
        "Engine host pairs priced (known) or without fresh figures (unknown), last scrape.",
        ("state",),
    ),
    Family(
        "kv_speed_flag",
        "gauge",
        "path_kv_speed_above_bandwidth",
        "1 when NIXL's KV speed on the path exceeds its measured bandwidth, last window.",
        PATH,
    ),
    Family(
        "nixl_transfers",
        "counter",
        "nixl_transfers",
        "NIXL KV transfers the engines on a host counted.",
        NIXL_LABELS,
    ),
    Family(
        "nixl_bytes",
        "counter",
        "nixl_bytes",
        "Bytes of NIXL KV transfers the engines on a host counted.",
        NIXL_LABELS,
    ),
    Family(
        "nixl_xfer",
        "counter",
        "nixl_transfer_seconds",
        "Seconds NIXL KV transfers took, summed, per host and engine.",
        NIXL_LABELS,
    ),
    Family(
        "nixl_post",
        "counter",
        "nixl_post_seconds",
        "Seconds from NIXL transfer start to its post to the backend, summed.",
        NIXL_LABELS,
    ),
    Family(
        "nixl_errors",
        "counter",
        "nixl_errors",
        "Failed NIXL KV transfers per host and engine.",
        NIXL_LABELS,
    ),
    Family(
        "analysis_failures",
        "counter",
        "attribution_failures",
        "Analyses that failed; the last good one was served instead.",
    ),
    Family(
        "dropped_values",
        "counter",
        "attribution_dropped",
        "Stage and request records dropped for figures out of range.",
    ),
    Family(
        "pairs_dropped",
        "counter",
        "attribution_pairs_dropped",
        "KV host pairs beyond the bound whose fabric history is not kept.",
    ),
    Family(
        "fold_dropped",
        "counter",
        "attribution_fold_dropped",
        "What the analysis's bounds left out, by what: transfers of paths beyond the"
        " bound (path), correlation pairs past a path's sample (rho), requests settled"
        " early or let go of (request), engine fragments let go of before their request"
        " was linked (fragment).",
        ("what",),
    ),
    Family(
        "history_dropped",
        "counter",
        "fabric_history_dropped",
        "Reports whose fabric windows the join's history had no room for.",
    ),
)
