"""`probe workload`: a disaggregated inference pipeline moving real KV-cache-sized buffers."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from fabricprobe.cli.options import (
    CollectorCredentials,
    OneLineCommand,
    collector_credential_options,
    fail,
    print_json,
    shown_option,
)
from fabricprobe.core.errors import ProbeError
from fabricprobe.core.hostport import DEFAULT_PORT, parse_hostport
from fabricprobe.core.models import DTYPE_BYTES, PRESETS, ModelShape, model_shape
from fabricprobe.workload.pipeline import Host, RequestResult, WorkloadConfig, run_pipeline
from fabricprobe.workload.route import ROUTES, FabricRouter, RoundRobin
from fabricprobe.workload.summary import summarise


def parse_hosts(specs: tuple[str, ...]) -> dict[str, Host]:
    """`NAME=ADDR` pairs -> hosts by name."""
    hosts: dict[str, Host] = {}
    for spec in specs:
        name, sep, addr = spec.partition("=")
        if not sep or not name or not addr:
            raise ValueError(f"--host {spec!r}: expected NAME=ADDRESS")
        hosts[name] = Host(name, addr)
    return hosts


def parse_paths(specs: tuple[str, ...], hosts: dict[str, Host]) -> list[tuple[Host, Host]]:
    """`SRC:DST` host names -> (src, dst) pairs."""
    out = []
    for spec in specs:
        src, sep, dst = spec.partition(":")
        if not sep or src not in hosts or dst not in hosts:
            raise ValueError(f"--path {spec!r}: expected SRC:DST, both given with --host")
        out.append((hosts[src], hosts[dst]))
    return out


@contextlib.contextmanager
def _local_responder(address: str, port: int) -> Iterator[int]:
    from fabricprobe.cli.sessions import served_sessions
    from fabricprobe.probes.responder import Responder

    # the pipeline's own responder, in this process, for its own paths
    with Responder(address, port, sessions=served_sessions(), auth=None) as r:
        yield r.port


def _table(model: ModelShape, prompt: int, results: list[RequestResult]) -> Table:
    t = Table(
        title=f"{model.name}: {model.bytes_per_token:,} B of KV cache per token, "
        f"{model.kv_bytes(prompt) / 2**20:,.1f} MiB for a {prompt}-token prompt"
    )
    for col in ("path", "transport", "requests", "KV MiB", "KV p50 ms", "KV p99 ms", "GB/s",
                "TTFT p50 ms", "TTFT p99 ms"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("path", "transport") else "right")

    def ms(v: object) -> str:
        return "-" if v is None or v != v else f"{float(v) * 1e3:,.2f}"  # type: ignore[arg-type]

    for row in summarise(results).itertuples(index=False):
        failed = f" ({row.failed} failed)" if row.failed else ""
        gbs = "-" if row.kv_bytes_per_s is None else f"{row.kv_bytes_per_s / 1e9:,.3f}"
        t.add_row(
            f"{row.src} -> {row.dst}",
            str(row.transport),
            f"{row.requests}{failed}",
            f"{row.kv_bytes_mean / 2**20:,.2f}",
            ms(row.kv_p50_s),
            ms(row.kv_p99_s),
            gbs,
            ms(row.ttft_p50_s),
            ms(row.ttft_p99_s),
        )
    return t


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe workload --transport tcp --serve            # loopback, no RDMA needed
  probe workload --model Llama-3.1-70B --prompt-tokens 4096 --transport both \\
      --host h0=192.0.2.1 --host h1=192.0.2.2 --path h0:h1 --otlp 127.0.0.1:4794
  probe workload --layers 40 --kv-heads 8 --head-dim 128 --dtype fp8 --serve --transport tcp
\b
Presets: """
    + ", ".join(PRESETS),
)
@click.option("--model", "preset", default="Llama-3.1-8B", show_default=True, help="Preset.")
@click.option("--layers", type=click.IntRange(1, 1024), help="Override the preset's layers.")
@click.option("--kv-heads", type=click.IntRange(1, 1024), help="KV heads (GQA groups).")
@click.option("--head-dim", type=click.IntRange(1, 4096), help="Head dimension.")
@click.option("--dtype", type=click.Choice(sorted(DTYPE_BYTES)), help="KV cache dtype.")
@shown_option("--prompt-tokens", click.IntRange(1, 1 << 20), 1024)
@shown_option("--output-tokens", click.IntRange(1, 1 << 16), 32)
@shown_option("--requests", click.IntRange(1, 1_000_000), 30)
@shown_option("--rate", click.FloatRange(0, 1e6), 0.0,
              "Arrivals per second (Poisson); 0 sends them back to back.")  # fmt: skip
@shown_option("--concurrency", click.IntRange(1, 256), 1)
@shown_option("--prefill-us-per-token", click.FloatRange(0, 1e6), 20.0,
              "Simulated prefill compute per prompt token.")  # fmt: skip
@shown_option("--decode-ms-per-token", click.FloatRange(0, 1e4), 5.0,
              "Simulated decode step per output token.")  # fmt: skip
@shown_option("--kv-poll-ms", click.FloatRange(0, 1e4), 0.0,
              "The decode side learns its KV has landed at its next scheduler step, every"
              " this many ms, as an engine that polls its transfers does; 0: at once.")  # fmt: skip
@shown_option("--transport", click.Choice(["rdma", "tcp", "both"]), "rdma")
@click.option("--host", "host_specs", multiple=True, metavar="NAME=ADDR",
              help="A host: its agent name and responder address (repeat).")  # fmt: skip
@click.option("--path", "path_specs", multiple=True, metavar="SRC:DST",
              help="Prefill host -> decode host (repeat); default: loopback.")  # fmt: skip
@shown_option("--outstanding", click.IntRange(1, 64), 4,
              "RDMA WRITEs in flight per transfer (one layer's KV cache each).")  # fmt: skip
@shown_option("--port", click.IntRange(0, 65535), DEFAULT_PORT, "Responders' control port.")
@click.option("--serve", is_flag=True, help="Run a responder in this process (loopback use).")
@click.option("--otlp", metavar="HOST:PORT", help="Send spans here (the collector's address).")
@shown_option("--seed", click.INT, 1)
@shown_option("--route", click.Choice(ROUTES), "round-robin",
              "Each request's decode host: in turn, or the one the fabric prices lowest"
              " for its KV bytes (asks --collector; in turn when no price is known).")  # fmt: skip
@click.option("--collector", metavar="HOST:PORT", default="127.0.0.1:4794", show_default=True,
              help="The collector whose prices --route fabric asks.")  # fmt: skip
@collector_credential_options("File holding a reader token (--route fabric).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def workload(
    preset: str,
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    dtype: str | None,
    prompt_tokens: int,
    output_tokens: int,
    requests: int,
    rate: float,
    concurrency: int,
    prefill_us_per_token: float,
    decode_ms_per_token: float,
    kv_poll_ms: float,
    transport: str,
    host_specs: tuple[str, ...],
    path_specs: tuple[str, ...],
    outstanding: int,
    port: int,
    serve: bool,
    otlp: str | None,
    seed: int,
    route: str,
    collector: str,
    as_json: bool,
    **cred: Any,
) -> None:
    """Prefill -> KV transfer -> decode -> detokenize -> deliver across hosts, with KV
    caches the size the model really has, moved over RDMA WRITE or TCP.

    Prefill and decode compute are simulated in time; the KV transfer is real, so the
    table answers "how long does a KV transfer of this model take on my fabric?".
    With --otlp every request goes out as OpenTelemetry spans for the collector to join
    with the fabric. With --route fabric each request's decode host is the one of its
    prefill host's --path targets whose KV transfer the collector prices lowest now.
    """
    try:
        model = model_shape(preset, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                            dtype=dtype)  # fmt: skip
        hosts = parse_hosts(host_specs) or {
            "local": Host("local", "127.0.0.1"),
        }
        paths = parse_paths(path_specs, hosts) if path_specs else [(hosts[min(hosts)],) * 2]
        if otlp:
            parse_hostport(otlp, 0)
    except ValueError as e:
        fail(str(e))
    logging.basicConfig(level=logging.WARNING)
    router: FabricRouter | RoundRobin | None = None
    client = None
    if route == "fabric":
        creds = CollectorCredentials(**cred)
        creds.check()
        from fabricprobe.workload.price import PriceClient

        try:
            client = PriceClient(
                collector,
                insecure=bool(creds.insecure),
                ca_file=creds.ca_file,
                cert_file=creds.cert_file,
                key_file=creds.key_file,
                token_file=creds.token_file,
                server_name=creds.server_name,
            )
        except (ValueError, OSError) as e:
            fail(f"--collector: {e}")
        router = FabricRouter(client.cost)
    transports = ["rdma", "tcp"] if transport == "both" else [transport]
    sender = None
    if otlp:
        from fabricprobe.workload.spans import SpanSender

        sender = SpanSender(otlp)
    cfg = WorkloadConfig(  # the same for each transport, on the responders' port
        model=model,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        prefill_s_per_token=prefill_us_per_token * 1e-6,
        decode_step_s=decode_ms_per_token * 1e-3,
        kv_poll_s=kv_poll_ms * 1e-3,
        requests=requests,
        rate=rate,
        concurrency=concurrency,
        outstanding=outstanding,
        seed=seed,
    )
    results: list[RequestResult] = []
    try:
        with contextlib.ExitStack() as stack:
            if serve:
                port = stack.enter_context(_local_responder(paths[0][1].address, port))
            emit = (lambda r: sender.emit(r, model.name)) if sender else None
            for tr in transports:
                run = replace(cfg, transport=tr, port=port)
                results += run_pipeline(paths, run, on_request=emit, router=router)
    except (ProbeError, OSError, ImportError) as e:
        fail(f"workload: {e}", 1)
    finally:
        if sender is not None:
            sender.close()
        if client is not None:
            client.close()
    if as_json:
        print_json(
            {
                "model": model.__dict__ | {"bytes_per_token": model.bytes_per_token},
                "paths": summarise(results).to_dict("records"),
                "routes": {r.request_id: r.route for r in results if r.route},
            }
        )
    else:
        console = Console(width=max(120, Console().width))
        console.print(_table(model, prompt_tokens, results))
        if isinstance(router, FabricRouter):
            console.print(
                f"route fabric: {router.priced} request(s) routed on the fabric's price,"
                f" {router.unpriced} in turn (no price known)"
            )
    errors = [r.error for r in results if r.error]
    if errors:
        fail(f"{len(errors)} of {len(results)} requests failed; first: {errors[0]}", 1)
