"""`probe why`: the slowest requests of the last window and what their paths looked like."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from fabricprobe.cli.options import (
    CollectorCredentials,
    OneLineCommand,
    ask_collector,
    collector_credential_options,
    collector_option,
    print_json,
    shown_option,
)

EXIT_EMPTY = 3  # the collector answered, but has no request on a path to show
# what --by may name: the collector's SORT_KEYS (collector/query.py), not imported here so
# that `probe why --help` loads no collector code
SLOWEST_BY = ("e2e_s", "ttft_s", "kv_transfer_s", "itl_s", "kv_wait_s", "fabric_s")


def reply_dict(reply: Any) -> dict[str, Any]:
    """A WhyReply as plain JSON-ready data: one flat dict per request (figures that were
    not measured are absent; counter rates sit beside the other figures)."""

    def fields(msg: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for fd, value in msg.ListFields():
            if fd.name == "counter_rates":
                out.update(dict(value))
            else:
                out[fd.name] = value
        return out

    return {
        "now_ns": reply.now_ns,
        "slowest": [fields(r) for r in reply.slowest],
        "paths": [fields(p) for p in reply.paths],
        "rtt": [fields(r) for r in reply.rtt],
        "rails": [rail_dict(r) for r in reply.rails],
        "communication_bound": reply.communication_bound,
        "goodput": [fields(reply.goodput)] if reply.HasField("goodput") else [],
        "stages": reply.stages,
        "empty_reason": reply.empty_reason,
    }


def rail_dict(r: Any) -> dict[str, Any]:
    """A RailPath with every field named (rail 0 and a loss of 0 included)."""
    return {
        "src": r.src,
        "dst": r.dst,
        "rail": r.rail,
        "transport": r.transport,
        "op": r.op,
        "size": r.size,
        "rtt_p50_s": r.rtt_p50_s if r.HasField("rtt_p50_s") else None,
        "rtt_p99_s": r.rtt_p99_s if r.HasField("rtt_p99_s") else None,
        "loss": r.loss,
        "stands_out": r.stands_out,
        "newest_unix_ns": r.newest_unix_ns,
    }


def query(
    collector: str,
    slowest: int,
    window_s: float | None,
    by: str,
    timeout: float = 30.0,
    creds: CollectorCredentials | None = None,
) -> dict[str, Any]:
    """Ask the collector's Query service for the Why report (plain text without CREDS)."""
    from fabricprobe.core.api import fabricprobe_pb2 as pb

    creds = creds or CollectorCredentials(insecure=True)
    request = pb.WhyRequest(slowest=slowest, window_s=window_s or 0.0, by=by)
    return reply_dict(creds.call(collector, "Why", request, timeout))


def query_links(
    collector: str,
    requests: list[dict[str, Any]],
    timeout: float = 30.0,
    creds: CollectorCredentials | None = None,
) -> dict[str, Any]:
    """The collector's links ranked, and for each of REQUESTS (the Why report's slowest)
    the links it crossed, the suspect ones among them: its own flow's (the QP pair live
    between its hosts while it ran, traced on its 5-tuple) where the collector knows it,
    else those its pair's probed ECMP classes cross, and why."""
    from fabricprobe.core.api import fabricprobe_pb2 as pb

    got = creds or CollectorCredentials(insecure=True)
    asked = []
    for r in requests:
        src, dst = r.get("src") or "", r.get("dst") or ""
        if not src or not dst or src == dst:
            continue
        lo, hi = int(r.get("start_unix_ns") or 0), int(r.get("end_unix_ns") or 0)
        if not 0 < lo <= hi:
            lo = hi = 0  # no span known: the flows of the last minute
        asked.append((r, pb.LinksSpan(src=src, dst=dst, from_unix_ns=lo, to_unix_ns=hi)))
    # one ask for all: the links ranked once, and each request's pair and span answered
    whole = got.call(collector, "Links", pb.LinksRequest(spans=[s for _, s in asked]), timeout)
    answers: list[Any] = list(whole.spans)
    if len(answers) != len(asked):
        # a collector from before the spans were asked together: each pair on its own
        # (its reply has the same classes, flows and flows_reason)
        answers = [
            got.call(
                collector,
                "Links",
                pb.LinksRequest(
                    src=s.src, dst=s.dst, from_unix_ns=s.from_unix_ns, to_unix_ns=s.to_unix_ns
                ),
                timeout,
            )
            for _, s in asked
        ]
    links = [
        {
            "link": v.link,
            "rank": v.rank,
            "suspect": v.suspect,
            "classes": v.classes,
            "bad_classes": v.bad_classes,
            "rtt_rise_s": v.rtt_rise_s,
            "loss": v.loss,
            "rail": None if v.rail < 0 else v.rail,
        }
        for v in whole.links
    ]
    suspects = {v["link"] for v in links if v["suspect"]}
    out = []
    for (r, span), reply in zip(asked, answers, strict=True):
        src, dst = span.src, span.dst
        classes = [
            {
                "sport": c.sport,
                "links": list(c.links),
                "rail": c.rail if c.HasField("rail") else None,
            }
            for c in reply.classes
        ]
        flows = [flow_dict(f) for f in reply.flows]
        traced = [f for f in flows if f["traced"]]
        if traced:
            crossed = sorted({link for f in traced for link in f["links"]})
            links_of = (
                f"its flow: QP {traced[0]['src_qpn']} -> {traced[0]['dst_qpn']}, "
                f"source port {traced[0]['sport']}"
                if len(traced) == 1
                else f"its {len(traced)} flows live between its hosts while it ran"
            )
        else:
            crossed = sorted({link for c in classes for link in c["links"]})
            links_of = f"its pair's probed classes ({reply.flows_reason or 'no flow known'})"
        out.append(
            {
                "request_id": r.get("request_id", ""),
                "src": src,
                "dst": dst,
                "links": crossed,
                "suspect": [link for link in crossed if link in suspects],
                "classes": classes,
                "flows": flows,
                "links_of": links_of,
            }
        )
    return {
        "configured": whole.configured,
        "class_paths": whole.class_paths,
        "links_left_out": whole.links_left_out,  # the lowest ranked, past the reply's bound
        "links": links,
        "requests": out,
    }


def flow_dict(f: Any) -> dict[str, Any]:
    """A FlowLinks with every field named."""
    return {
        "sport": f.sport,
        "links": list(f.links),
        "rail": f.rail if f.HasField("rail") else None,
        "src_qpn": f.src_qpn,
        "dst_qpn": f.dst_qpn,
        "src_comm": f.src_comm,
        "dst_comm": f.dst_comm,
        "traced": f.traced,
        "psn_gap": f.psn_gap,
    }


def links_table(doc: dict[str, Any]) -> Table:
    t = Table(title=f"links ({doc['class_paths']} class paths known)")
    for col in ("rank", "link", "rail", "suspect", "classes", "bad", "rtt rise", "loss"):
        t.add_column(col, justify="left" if col in ("link", "suspect") else "right")
    for v in doc["links"][:30]:
        t.add_row(
            str(v["rank"]),
            v["link"],
            "" if v["rail"] is None else str(v["rail"]),
            "SUSPECT" if v["suspect"] else "",
            str(v["classes"]),
            str(v["bad_classes"]),
            _ms(v["rtt_rise_s"]),
            f"{v['loss']:.2%}",
        )
    return t


def request_links_table(rows: list[dict[str, Any]]) -> Table:
    """The slowest requests' links, suspect ones first, and where they were known from."""
    t = Table(title="the slowest requests' links")
    for col in ("request", "path", "suspect", "links", "known from"):
        t.add_column(col)
    for r in rows[:30]:
        rest = [link for link in r["links"] if link not in r["suspect"]]
        t.add_row(
            r["request_id"][:24],
            f"{r['src']}->{r['dst']}",
            ", ".join(r["suspect"]) or "-",
            ", ".join(rest[:8]) + (" ..." if len(rest) > 8 else ""),
            r["links_of"],
        )
    return t


def _ms(v: Any) -> str:
    return "-" if v is None else f"{float(v) * 1e3:,.1f}"


def _us(v: Any) -> str:
    return "-" if v is None else f"{float(v) * 1e6:,.0f}"


def _bound(r: dict[str, Any]) -> str:
    """FABRIC: slow, and the fabric says why; FAULT: its probes' floor stands out though
    its transfers did not (HOST beside it: they ran on busy hosts); HOST; no."""
    if r.get("fabric_bound"):
        return "FABRIC"
    if r.get("fabric_fault"):
        return "FAULT HOST" if r.get("host_bound") else "FAULT"
    return "HOST" if r.get("host_bound") else "no"


def _bytes(v: Any, source: Any) -> str:
    """KV bytes, with a mark for how they were found: s (span), m (model shape), n
    (NIXL's mean per transfer on the host)."""
    if v is None:
        return "-"
    mark = {"span": "s", "model-shape": "m", "nixl-host-mean": "n"}.get(str(source or ""), "")
    return f"{int(v):,}{mark}"


def _share(v: Any) -> str:
    """A share in percent; below 1 % with two decimals (the fabric's is often 0.01 %)."""
    if v is None:
        return "-"
    return f"{float(v):.0%}" if abs(float(v)) >= 0.01 else f"{float(v):.2%}"


def path_text(r: dict[str, Any]) -> str:
    """SRC->DST and the transport where it is known (nothing in its place when not)."""
    return " ".join(x for x in (f"{r.get('src')}->{r.get('dst')}", r.get("transport") or "") if x)


def _estimated(v: Any, source: Any) -> str:
    """A part in ms, marked ~ when it was estimated rather than measured."""
    return _ms(v) + ("~" if v is not None and source and "@" in str(source) else "")


def requests_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(
        title="Slowest requests (ms; KV wait = fabric~ (estimated from the path's figures)"
        " + stack (the transfer library's own) + engine; RTT in µs)"
    )
    cols = ["request", "path", "queue", "prefill", "KV wait", "fabric", "stack", "engine",
            "decode", "detok", "deliver", "TTFT", "ITL", "KV/TTFT", "fabric/TTFT", "KV bytes",
            "RTT p99", "host", "loss", "pauses/s", "retrans/s"]  # fmt: skip
    for c in cols:
        t.add_column(c, justify="left" if c in ("request", "path") else "right")
    for r in rows:
        path = path_text(r) if r.get("src") else "-"
        if not r.get("src") and r.get("path_reason"):
            path = f"unknown: {r['path_reason']}"
        pauses = [r.get(f"{e}_pfc_pause_per_s") for e in ("src", "dst")]
        retrans = [r.get(f"{e}_retransmit_per_s") for e in ("src", "dst")]
        loss = r.get("loss_ratio")
        t.add_row(
            str(r.get("request_id"))[-24:],
            path,
            *(_ms(r.get(f"{s}_s")) for s in ("queue", "prefill")),
            _ms(r.get("kv_wait_s", r.get("kv_transfer_s"))),
            _estimated(r.get("fabric_s"), r.get("fabric_source")),
            _ms(r.get("transfer_stack_s")),
            _ms(r.get("engine_wait_s")) + ("!" if r.get("over_explained_s") else ""),
            *(_ms(r.get(f"{s}_s")) for s in ("decode", "detokenize", "deliver")),
            _ms(r.get("ttft_s")),
            _ms(r.get("itl_s")),
            _share(r.get("kv_share_ttft")),
            _share(r.get("fabric_share_ttft")),
            _bytes(r.get("kv_bytes"), r.get("kv_bytes_source")),
            _us(r.get("rtt_p99_s")),
            _us(r.get("host_delay_s")) + (" HOST" if r.get("host_bound") else ""),
            "-" if loss is None else f"{float(loss):.2%}",
            "/".join("-" if v is None else f"{float(v):.0f}" for v in pauses),
            "/".join("-" if v is None else f"{float(v):.0f}" for v in retrans),
        )
    return t


def rails_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Rails: each host pair's probes on each rail, newest window (RTT in µs)")
    for c in ("rail", "path", "kind", "RTT p50", "RTT p99", "loss", ""):
        t.add_column(c, justify="left" if c in ("path", "kind", "") else "right")
    for r in rows[:40]:
        t.add_row(
            f"rail {r['rail']}",
            f"{r['src']}->{r['dst']}",
            f"{r['transport']} {r['op']} {r['size']}",
            _us(r.get("rtt_p50_s")),
            _us(r.get("rtt_p99_s")),
            f"{float(r['loss']):.2%}",
            "STANDS OUT" if r["stands_out"] else "",
        )
    return t


def paths_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Paths ranked by the KV-transfer time they explain")
    for c in ("rank", "path", "transfers", "KV p50 ms", "x fleet", "RTT p99 µs", "x fleet",
              "explained s", "host µs", "bound"):  # fmt: skip
        t.add_column(c, justify="left" if c == "path" else "right")
    for r in rows:
        ratio = [r.get("kv_ratio"), r.get("rtt_ratio")]
        t.add_row(
            str(r.get("rank")),
            path_text(r),
            str(r.get("transfers")),
            _ms(r.get("kv_median_s")),
            "-" if ratio[0] is None else f"{float(ratio[0]):.2f}",
            _us(r.get("rtt_p99_s")),
            "-" if ratio[1] is None else f"{float(ratio[1]):.2f}",
            "-" if r.get("explained_s") is None else f"{float(r['explained_s']):.3f}",
            _us(r.get("host_delay_s")),
            _bound(r),
        )
    return t


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe why --insecure                       # collector on 127.0.0.1:4794, last 60 s
  probe why --collector 10.0.0.9:4794 --ca-file ca.pem --token-file reader.token \\
      --slowest 20 --by ttft_s
  probe why --ca-file ca.pem --cert-file me.pem --key-file me.key --window 300 --json
  probe why --insecure --links --json        # links ranked, the slowest requests' links

\b
Exit status: 0 with requests to show, 3 when the collector has none (the reason is
printed: no spans, nothing joined to a path, no fabric windows), 1 when the collector
cannot be asked, 2 on bad usage.""",
)
@collector_option()
@shown_option("--slowest", click.IntRange(1, 200), 10)
@click.option("--window", "window_s", type=click.FloatRange(1, 86400), help="Seconds [60].")
@shown_option("--by", click.Choice(SLOWEST_BY), "e2e_s", "What 'slowest' means.")
@shown_option(
    "--timeout", click.FloatRange(1, 3600), 30.0, "Seconds to wait for the collector's analysis."
)
@click.option(
    "--links",
    "with_links",
    is_flag=True,
    help="Also the fabric's links ranked (a fabric file on the collector), and the "
    "slowest requests' links.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@collector_credential_options("File holding a reader token.")
def why(
    collector: str,
    slowest: int,
    window_s: float | None,
    by: str,
    timeout: float,
    with_links: bool,
    as_json: bool,
    **cred: Any,
) -> None:
    """The slowest requests of the last window, stage by stage, beside the probe RTT,
    loss and congestion counters of the path their KV cache crossed at the time, and
    the paths ranked by the stage time they explain. Each request's KV wait is split in
    three: fabric (what the path's RTTs, bandwidth, loss and pauses explain for its
    bytes: estimated, marked ~), stack (the transfer library's own time beyond it, from
    the span's own figure or NIXL's telemetry) and engine (the rest; "!" when the two
    estimates exceed the wait).
    KV bytes are marked s (span), m (model shape) or n (NIXL's mean per transfer).
    RTTs hold the hosts' own delay (host: what the ends' reference probes say they
    add); a path whose slowness that delay
    explains, not the fabric, is marked HOST rather than ranked as the network's.
    On GPU hosts probed rail by rail, the Rails table lists each rail of the ranked
    pairs and every rail that stands out from its pair's other rails, with or without a
    request on it. With nothing to show it says why (no spans, nothing joined, no fabric
    windows) and exits 3.

    The collector wants a reader identity: a reader token (--token-file) or a client
    certificate it lists in reader_names; plain text only with --insecure."""
    creds = CollectorCredentials.given(cred)

    def ask() -> dict[str, Any]:
        got = query(collector, slowest, window_s, by, timeout, creds)
        if with_links:
            got.update(query_links(collector, got.get("slowest", []), timeout, creds))
        return got

    report = ask_collector(collector, ask)
    empty = report.get("empty_reason") or ""
    if with_links and not as_json:
        wide = Console(width=max(120, Console().width))
        wide.print(links_table(report))
        if report.get("requests"):
            wide.print(request_links_table(report["requests"]))
    if with_links and report.get("links"):
        empty = ""  # the links are something to show
    rails = report.get("rails") or []
    if any(r["stands_out"] for r in rails):
        empty = ""  # so is a rail that stands out
    if as_json:
        print_json(report)
        if empty and not report.get("slowest"):
            raise SystemExit(EXIT_EMPTY)
        return
    console = Console(width=max(230, Console().width))  # 21 columns, ids and paths in full
    if empty and not report.get("slowest"):
        console.print(f"nothing to show: {empty}", style="yellow")
        raise SystemExit(EXIT_EMPTY)
    if empty:
        console.print(f"note: {empty}", style="yellow")
    console.print(requests_table(report.get("slowest", [])))
    console.print(paths_table(report.get("paths", [])))
    if rails:
        console.print(rails_table(rails))
    good = report.get("goodput") or []
    if good:
        g = good[0]
        console.print(
            f"goodput {float(g['goodput_tps']):,.1f} tokens/s of {float(g['throughput_tps']):,.1f}"
            f" ({int(g['met'])} of {int(g['requests'])} requests within SLO)"
        )
    bound = "yes" if report.get("communication_bound") else "no"
    console.print(f"communication-bound (KV transfer and queueing rising, compute flat): {bound}")
