"""`probe report`: one HTML page (and its PNGs) of the fleet's paths, slow requests and hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fabricprobe.cli.commands.why import query, query_links
from fabricprobe.cli.options import (
    CollectorCredentials,
    OneLineCommand,
    collector_address,
    collector_credential_options,
    collector_option,
    fail,
    shown_option,
)
from fabricprobe.core.errors import ConfigError


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe report --insecure --out /tmp/fabric      # collector on 127.0.0.1
  probe report --collector 10.0.0.9:4794 --ca-file ca.pem --cert-file me.pem \\
      --key-file me.key --metrics-url http://10.0.0.9:9794/metrics
  probe report --insecure --prometheus http://127.0.0.1:9090 --window 3600""",
)
@collector_option("Collector's API, for the Rtt, Why and Links queries.")
@click.option(
    "--metrics-url", metavar="URL", help="Collector's /metrics [http://HOST:9794/metrics]."
)
@click.option(
    "--prometheus", metavar="URL", default="", help="Prometheus HTTP API, for RTT over time."
)
@shown_option("--out", click.Path(file_okay=False), "fabricprobe-report",
              "Folder for report.html and its PNGs.", dest="out_dir")  # fmt: skip
@shown_option("--window", click.FloatRange(1, 7 * 86400), 600.0,
              "Seconds back: requests, RTT over time.", dest="window_s")  # fmt: skip
@shown_option("--timeout", click.FloatRange(0.1, 3600), 30.0,
              "Seconds the sources may take in all (/metrics, Why, Prometheus).")  # fmt: skip
@click.option("--metrics-auth-file", type=click.Path(dir_okay=False),
              help="USER:PASSWORD for /metrics behind a web config (https only).")  # fmt: skip
@collector_credential_options("File holding a token the collector knows (Rtt, Why).")
def report(
    collector: str,
    metrics_url: str | None,
    prometheus: str,
    out_dir: str,
    window_s: float,
    timeout: float,
    metrics_auth_file: str | None,
    **creds: str | bool | None,
) -> None:
    """Write OUT/report.html, one self-contained page (pictures inline, nothing fetched
    when it opens): RTT CDFs and percentiles per path from the collector's sketches (1 %
    resolution, min and max exact), each host's own delay apart from the paths, src x dst
    and ToR heatmaps of RTT and loss, the slowest requests' stages beside their path's
    fabric at the time, the leaf-spine with its suspect links drawn (a collector with a
    fabric file), counters and validate verdicts per host; and RTT over time when
    --prometheus is given. The PNGs and rtt_cdf.csv (the CDFs' buckets) are written
    beside it. The credentials are those of `probe why`; https URLs are checked against
    --ca-file, with the client certificate."""
    from fabricprobe.report.build import (
        RTT_BUCKETS,
        RTT_CDF_PATHS,
        RTT_PATHS,
        ReportOptions,
        gather,
        write,
    )
    from fabricprobe.report.sources import HttpAuth, SourceError, rtt_dict

    cc = CollectorCredentials.given(creds)
    try:
        target = collector_address(collector)
    except ValueError as e:
        fail(str(e))
    url = metrics_url or f"http://{target.rsplit(':', 1)[0]}:9794/metrics"
    http = HttpAuth(
        ca_file=cc.ca_file or "",
        cert_file=cc.cert_file or "",
        key_file=cc.key_file or "",
        basic_file=metrics_auth_file or "",
    )
    opts = ReportOptions(
        collector=target,
        metrics_url=url,
        out_dir=Path(out_dir),
        auth=http,
        window_s=window_s,
        prometheus=prometheus,
        timeout=timeout,
    )

    def why_query(slowest: int, window: float, deadline: float) -> dict[str, Any]:
        """`probe why`'s own query, its errors turned into the report's."""
        import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

        try:
            return query(target, slowest, window, "e2e_s", deadline, cc)
        except grpc.RpcError as e:
            raise SourceError(f"collector {target}: {e.code().name}: {e.details()}") from None

    def rtt_query(deadline: float) -> dict[str, Any]:
        """Every path's RTT distribution (the Rtt query), its errors the report's."""
        import grpc

        from fabricprobe.core.api import fabricprobe_pb2 as pb

        ask = pb.RttRequest(max_paths=RTT_PATHS, cdf_paths=RTT_CDF_PATHS, max_buckets=RTT_BUCKETS)
        try:
            return rtt_dict(cc.call(target, "Rtt", ask, deadline))
        except grpc.RpcError as e:
            raise SourceError(f"collector {target}: {e.code().name}: {e.details()}") from None

    def links_query(requests: list[dict[str, Any]], deadline: float) -> dict[str, Any]:
        """The links ranked and the slowest requests' links (`probe why --links`)."""
        import grpc

        try:
            return query_links(target, requests, deadline, cc)
        except grpc.RpcError as e:
            raise SourceError(f"collector {target}: {e.code().name}: {e.details()}") from None

    try:
        gathered = gather(opts, why_query, rtt_query, links_query)
        page = write(gathered, opts)
    except ConfigError as e:
        fail(str(e))
    except SourceError as e:
        fail(str(e), 1)
    except OSError as e:
        fail(f"{out_dir}: {e.strerror}", 1)
    click.echo(str(page))
    if gathered.rtt_error:
        click.echo(f"probe: warning: {gathered.rtt_error}", err=True)
    if gathered.why_error:
        click.echo(f"probe: warning: {gathered.why_error}", err=True)
    if gathered.prom_error:
        click.echo(f"probe: warning: {gathered.prom_error}", err=True)
