"""Click options and helpers shared by every `probe` command."""

from __future__ import annotations

import functools
import json
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import click

from fabricprobe.core.hostport import COLLECTOR_PORT, DEFAULT_PORT, format_hostport, parse_hostport
from fabricprobe.core.settings import Spec, config_var, env_var, specs
from fabricprobe.probes.fleet import FleetToken

if typing.TYPE_CHECKING:
    from fabricprobe.probes.measure import LinkParams

sysfs_option = click.option(
    "--sysfs",
    "sysfs_root",
    default="/sys",
    show_default=True,
    envvar="FABRICPROBE_SYSFS",
    type=click.Path(file_okay=False),
    help="Root of the sysfs tree to read (tests point it at a fixture).",
)
log_format_option = click.option(
    "--log-format",
    type=click.Choice(["json", "text"]),
    default="json",
    show_default=True,
    envvar="FABRICPROBE_LOG_FORMAT",
    help="Log lines on stderr: JSON objects, or text for people.",
)
log_level_option = click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    envvar="FABRICPROBE_LOG_LEVEL",
    help="Least severe level logged (also FABRICPROBE_LOG_LEVEL).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
EXISTING_DIR = click.Path(file_okay=False, exists=True)  # a directory that must be there

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def shown_option(
    flag: str, kind: click.ParamType, default: Any, help_text: str | None = None, dest: str = ""
) -> Callable[[F], F]:
    """FLAG (its value named DEST, else after the flag) of type KIND with a DEFAULT that
    --help shows: the shape of most of the probe commands' options."""
    names = (flag, dest) if dest else (flag,)
    return click.option(*names, type=kind, default=default, show_default=True, help=help_text)


def unset_option(
    flag: str, kind: click.ParamType, help_text: str, dest: str = ""
) -> Callable[[F], F]:
    """FLAG (its value named DEST, else after the flag) of type KIND, None when not given:
    the command picks its default from the other options (HELP_TEXT names it)."""
    names = (flag, dest) if dest else (flag,)
    return click.option(*names, type=kind, default=None, help=help_text)


# --- the daemons' settings as flags (probe agent, probe collector) ---------------------


def _metavar(spec: Spec) -> str | None:
    decl = spec.setting
    if decl.choices:
        return "[" + "|".join(decl.choices) + "]"
    if decl.metavar or (decl.check and decl.check.metavar):
        return decl.metavar or (decl.check.metavar if decl.check else "")
    item = typing.get_args(spec.kind)[0] if spec.is_many else spec.kind
    if item is float:
        return "SECONDS" if spec.name.endswith("_s") else "FLOAT"
    return {int: "INTEGER", str: "TEXT"}.get(item)


def _shown(spec: Spec) -> str:
    if spec.setting.shown:
        return spec.setting.shown
    d = spec.default
    if isinstance(d, bool):
        return "on" if d else "off"
    if isinstance(d, list):
        return ", ".join(str(x) for x in d) if d else "none"
    if isinstance(d, dict):
        return ", ".join(f"{k}={v}" for k, v in d.items()) if d else "none"
    if isinstance(d, float) and d.is_integer():
        return str(int(d))
    return "none" if d == "" else str(d)


def settings_options(cls: type, section: str) -> Callable[[F], F]:
    """A click option for each declared setting of CLS (fabricprobe.core.settings), named
    after the setting, None (or ()) when not given; and `--config FILE`. Help, metavar
    and default come from the declaration; the loader checks the values, so a bad one is
    reported the same way whether it came from a flag, the environment or the file."""

    def add(f: F) -> F:
        for spec in reversed(specs(cls)):
            flag = spec.flag
            if flag is None:
                continue
            extra = f"[default: {_shown(spec)}; env: {env_var(section, spec.name)}]"
            text = f"{spec.setting.help} {'(repeat) ' if spec.is_many else ''}{extra}"
            if spec.kind is bool:
                base = flag.removeprefix("--").removeprefix("no-")
                opt = click.option(f"--{base}/--no-{base}", spec.name, default=None, help=text)
            else:
                opt = click.option(
                    flag,
                    spec.name,
                    metavar=_metavar(spec),
                    multiple=spec.is_many,
                    help=text,
                )
            f = opt(f)
        return click.option(
            "--config",
            "config_file",
            envvar=config_var(section),
            metavar="FILE",
            help=f"TOML file; its [{section}] table. [env: {config_var(section)}]",
        )(f)

    return add


def settings_epilog(section: str, key: str) -> str:
    """What --help says about where settings come from; KEY is an example setting."""
    return (
        f"\n\nSettings come from the defaults, then the [{section}] table of --config, then "
        f"the environment, then flags, each winning over the one before. The variable beside "
        f"each flag, in lower case without its prefix, is its key in the file: "
        f"{env_var(section, key)} is {key}. Unknown sections, keys and variables are errors, "
        f"as are values out of bounds."
    )


# --- how a client reaches the collector (probe why, cost, report, validate --fleet) ----
_PEM = click.Path(dir_okay=False)


def collector_option(help_text: str | None = None) -> Callable[[F], F]:
    """--collector HOST:PORT, the collector's Query service (127.0.0.1:4794)."""
    return click.option(
        "--collector",
        default=f"127.0.0.1:{COLLECTOR_PORT}",
        show_default=True,
        metavar="HOST:PORT",
        help=help_text,
    )


def collector_address(collector: str) -> str:
    """COLLECTOR as HOST:PORT (port 4794 when it names none); ValueError for a bad one."""
    return format_hostport(*parse_hostport(collector, COLLECTOR_PORT))


def collector_credential_options(token_help: str) -> Callable[[F], F]:
    """--insecure, --token-file, --ca-file, --cert-file, --key-file, --server-name, each
    None when not given (so a config file's value stands)."""

    def add(f: F) -> F:
        for opt in reversed(
            [
                click.option(
                    "--insecure", is_flag=True, default=None, help="Plain text to the collector."
                ),
                click.option("--token-file", type=_PEM, help=token_help),
                click.option("--ca-file", type=_PEM, help="CA of the collector (TLS)."),
                click.option("--cert-file", type=_PEM, help="Client certificate (PEM)."),
                click.option("--key-file", type=_PEM, help="Client key (PEM)."),
                click.option(
                    "--server-name",
                    metavar="NAME",
                    help="TLS name the collector's certificate carries, if not its address.",
                ),
            ]
        ):
            f = opt(f)
        return f

    return add


@dataclass(frozen=True)
class CollectorCredentials:
    insecure: bool | None = None
    token_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    @classmethod
    def given(cls, options: dict[str, Any]) -> CollectorCredentials:
        """The credential OPTIONS of a command, checked (see check())."""
        creds = cls(**options)
        creds.check()
        return creds

    def check(self) -> None:
        """Fail (exit 2) unless the options make sense together."""
        if bool(self.cert_file) != bool(self.key_file):
            fail("--cert-file and --key-file go together")
        if self.cert_file and not self.ca_file:
            fail("--cert-file needs --ca-file")
        if not self.ca_file and not self.insecure:
            fail("no TLS: give --ca-file, or --insecure for plain text")
        if self.ca_file and self.insecure:
            fail("--insecure and --ca-file contradict each other")

    def channel(self, target: str, options: list[tuple[str, Any]] | None = None) -> Any:
        """A gRPC channel to TARGET as these options ask (check() first)."""
        import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

        opts = list(options or [])
        if self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        if not self.ca_file:
            return grpc.insecure_channel(target, options=opts)
        try:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(self.ca_file),
                private_key=_read(self.key_file) if self.key_file else None,
                certificate_chain=_read(self.cert_file) if self.cert_file else None,
            )
        except OSError as e:
            fail(f"{e.filename}: {e.strerror}")
        return grpc.secure_channel(target, creds, options=opts)

    def call(self, collector: str, method: str, request: Any, timeout: float) -> Any:
        """The reply of METHOD of the Query service at COLLECTOR (HOST[:PORT]) to REQUEST,
        asked with these credentials; raises grpc.RpcError, and ValueError for a bad
        address."""
        from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc

        with self.channel(collector_address(collector)) as channel:
            stub = pb_grpc.QueryStub(channel)
            return getattr(stub, method)(request, timeout=timeout, metadata=self.metadata())

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The bearer token of --token-file as call metadata (none without it)."""
        if not self.token_file:
            return ()
        try:
            with open(self.token_file) as f:
                token = f.read().strip()
        except OSError as e:
            fail(f"{e.filename}: {e.strerror}")
        if not token or any(c.isspace() for c in token):
            fail(f"{self.token_file}: expected one token")
        return (("authorization", f"Bearer {token}"),)


def ask_collector(collector: str, ask: Callable[[], T], *, usage: tuple[str, ...] = ()) -> T:
    """What ASK gets from the collector at COLLECTOR. A bad address exits 2; a call that
    fails exits 1, or 2 when its status code is one of USAGE (the collector says the
    request itself is wrong)."""
    import grpc

    try:
        return ask()
    except ValueError as e:
        fail(str(e))
    except grpc.RpcError as e:
        code = 2 if e.code().name in usage else 1
        fail(f"collector {collector}: {e.code().name}: {e.details()}", code)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def fail(message: str, code: int = 2) -> NoReturn:
    """End the command with a one-line error on stderr (exit 2 = bad usage or environment)."""
    click.echo(f"probe: error: {message}", err=True)
    sys.exit(code)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


# --- shared by the probe commands (tcp, lat, bw, serve) ------------------------------


class OneLineCommand(click.Command):
    """A command whose bad arguments end in one line on stderr and exit 2 (no usage dump)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            fail(e.format_message())


_SIZE_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20}
_SIZE_UNITS |= {"g": 1 << 30, "gib": 1 << 30, "b": 1}


def parse_size(text: str) -> int:
    """`64`, `4K`, `4KiB`, `1M`, `1MiB`, `2G` → bytes (binary units); ValueError otherwise."""
    t = text.strip().lower()
    digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(digits) :]
    if not digits.isdigit() or unit not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size (examples: 64, 4K, 1M)")
    return int(digits) * _SIZE_UNITS[unit]


class SizeParam(click.ParamType):
    """A byte count with optional K/M/G (binary) suffix, bounded to LO..HI."""

    name = "size"

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            n = value
        else:
            try:
                n = parse_size(str(value))
            except ValueError as e:
                self.fail(str(e), param, ctx)
        if not self.lo <= n <= self.hi:
            self.fail(f"{n} bytes is outside {self.lo}..{self.hi}", param, ctx)
        return n


def resolve_peer(peer: str, port: int | None) -> tuple[str, int]:
    """PEER (`host`, `host:port`, `[v6]:port`) and --port → (host, port), or exit 2."""
    try:
        host, peer_port = parse_hostport(peer, 0)
    except ValueError as e:
        fail(str(e))
    if peer_port and port and peer_port != port:
        fail(f"port given twice: {peer} and --port {port}")
    return host, peer_port or port or DEFAULT_PORT


port_option = click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Responder's control port (default 4793; or give PEER as HOST:PORT).",
)
bind_option = click.option(
    "--bind",
    metavar="ADDR",
    default=None,
    help="Source address to probe from; it picks the path when hosts share a machine.",
)
token_file_option = click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The fleet's probe token, for a responder that asks for it (probe serve --token-file).",
)


@dataclass(frozen=True)
class Peer:
    """A probe command's peer (PEER and --port, resolved) and how to reach it: --bind,
    --timeout and the fleet token of --token-file."""

    host: str
    port: int
    bind: str | None = None
    timeout: float | None = None
    token: FleetToken | None = None

    def tcp_link(self) -> LinkParams:
        """The TCP probes' link to the peer: the timeout bounds the setup and each step."""
        from fabricprobe.probes.measure import LinkParams

        return LinkParams(
            self.host,
            self.port,
            bind=self.bind,
            timeout=self.timeout,
            step_s=self.timeout,
            token=self.token,
        )


def load_token(path: str | None) -> FleetToken | None:
    """The fleet token in PATH (None without one); a bad file exits 2."""
    if path is None:
        return None
    try:
        return FleetToken.from_file(path)
    except ValueError as e:
        fail(f"--token-file: {e}")


def timeout_option(default: float | None, default_text: str | None = None) -> Callable[[F], F]:
    """--timeout of the probe commands: what a silent peer may cost at each stage (a
    None DEFAULT leaves each probe its own, which DEFAULT_TEXT describes)."""
    return click.option(
        "--timeout",
        type=click.FloatRange(0.001, 600, min_open=False),
        default=default,
        show_default=default_text or True,
        help="Seconds to wait on the peer at each stage: the session's setup as a whole "
        "(connect, fleet-token handshake, data connections), each exchange, the closing "
        "handshake. A peer that falls silent ends the run within it (as loss mid-run).",
    )


def probe_command(epilog: str) -> Callable[[Callable[..., None]], click.Command]:
    """A command that probes a peer running `probe serve` (tcp, lat, bw): PEER and --port
    come first, then its own options and its peer_options; EPILOG holds its examples."""

    def make(f: Callable[..., None]) -> click.Command:
        command = click.command(cls=OneLineCommand, epilog=epilog)
        return command(click.argument("peer")(port_option(f)))

    return make


def peer_options(
    timeout_flag: Callable[[F], F], *own: Callable[[F], F]
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The options a probe command takes after its own: --bind, OWN, TIMEOUT_FLAG (a
    timeout_option), --token-file and --json. The command gets PEER and --port (declared
    above its own options) with --bind, --timeout and the token as one Peer, its first
    argument, and the rest by name (--json as `as_json`)."""

    def add(f: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(f)
        def command(
            *,
            peer: str,
            port: int | None,
            bind: str | None,
            timeout: float | None,
            token_file: str | None,
            **rest: Any,
        ) -> None:
            host, port = resolve_peer(peer, port)
            f(Peer(host, port, bind, timeout, load_token(token_file)), **rest)

        stack: tuple[Callable[[Any], Any], ...] = (bind_option, *own, timeout_flag)
        wrapped: Callable[..., None] = command
        for option in reversed((*stack, token_file_option, json_option)):
            wrapped = option(wrapped)  # as decorators listed top to bottom would apply
        return wrapped

    return add
