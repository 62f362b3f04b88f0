"""`probe report`: one HTML page (and its PNGs) of the fleet's paths, slow requests and hosts."""

from __future__ import annotations

from pathlib import Path

import click

from fabricprobe.cli.options import OneLineCommand, client_auth_options, fail
from fabricprobe.core.errors import ConfigError
from fabricprobe.probes.control import parse_hostport


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe report --insecure --out /tmp/fabric      # collector on 127.0.0.1
  probe report --collector 10.0.0.9:4794 --ca-file ca.pem --cert-file me.pem \\
      --key-file me.key --metrics-url http://10.0.0.9:9794/metrics
  probe report --insecure --prometheus http://127.0.0.1:9090 --window 3600""",
)
@click.option("--collector", default="127.0.0.1:4794", show_default=True, metavar="HOST:PORT",
              help="Collector's API, for the Why query.")  # fmt: skip
@click.option(
    "--metrics-url", metavar="URL", help="Collector's /metrics [http://HOST:9794/metrics]."
)
@click.option(
    "--prometheus", metavar="URL", default="", help="Prometheus HTTP API, for RTT over time."
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="fabricprobe-report",
              show_default=True, help="Folder for report.html and its PNGs.")  # fmt: skip
@click.option("--window", "window_s", type=click.FloatRange(1, 7 * 86400), default=600.0,
              show_default=True, help="Seconds back: requests, RTT over time.")  # fmt: skip
@click.option("--timeout", type=click.FloatRange(0.1, 3600), default=30.0, show_default=True,
              help="Seconds each source may take.")  # fmt: skip
@client_auth_options
def report(
    collector: str,
    metrics_url: str | None,
    prometheus: str,
    out_dir: str,
    window_s: float,
    timeout: float,
    insecure: bool,
    token_file: str | None,
    ca_file: str | None,
    cert_file: str | None,
    key_file: str | None,
    server_name: str | None,
) -> None:
    """Write OUT/report.html, one self-contained page (pictures inline, nothing fetched
    when it opens): RTT CDFs per path, src x dst and ToR heatmaps of RTT and loss, the
    slowest requests' stages beside their path's fabric at the time, counters and
    validate verdicts per host; and RTT over time when --prometheus is given. The PNGs
    are written beside it. Credentials mean what they mean to `probe agent`."""
    from fabricprobe.report.build import ReportOptions, gather, write
    from fabricprobe.report.sources import ClientAuth, SourceError

    auth = ClientAuth(
        insecure=insecure,
        token_file=token_file or "",
        ca_file=ca_file or "",
        cert_file=cert_file or "",
        key_file=key_file or "",
        server_name=server_name or "",
    )
    try:
        auth.validate()
        host, port = parse_hostport(collector, 4794)
    except (ConfigError, ValueError) as e:
        fail(str(e))
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    url = metrics_url or (f"http://{target.rsplit(':', 1)[0]}:9794/metrics")
    opts = ReportOptions(
        collector=target,
        metrics_url=url,
        out_dir=Path(out_dir),
        auth=auth,
        window_s=window_s,
        prometheus=prometheus,
        timeout=timeout,
    )
    try:
        gathered = gather(opts)
        page = write(gathered, opts)
    except ConfigError as e:
        fail(str(e))
    except SourceError as e:
        fail(str(e), 1)
    except OSError as e:
        fail(f"{out_dir}: {e.strerror}", 1)
    click.echo(str(page))
    if gathered.why_error:
        click.echo(f"probe: warning: {gathered.why_error}", err=True)
    if gathered.prom_error:
        click.echo(f"probe: warning: {gathered.prom_error}", err=True)
