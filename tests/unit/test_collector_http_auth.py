"""OTLP/HTTP behind the gRPC port's authentication layer (collector/auth.py http_guard):
the same token table and roles, the same client-certificate names; 401 without or with
a bad credential, 403 for a known identity without the ingest role. Real HTTPS with
client certificates on 127.0.0.1; registration from this machine checked unless the
collector is told to trust it."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricprobe.collector.auth import (
    INGEST,
    READER,
    Insecure,
    MutualTls,
    TokenAuth,
    http_guard,
    read_token_file,
)
from fabricprobe.collector.service import (
    AddressRefused,
    CollectorServer,
    ServerConfig,
    check_addresses,
)
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.web import Caller, Refused
from tests.support.pki import issue, make_ca

TOKENS = "otel otel-token-0123456789ab ingest\nh1 host-token-0123456789ab\n"


def caller(auth: str = "", cert: dict[str, object] | None = None) -> Caller:
    return Caller("127.0.0.1", auth, cert)  # type: ignore[arg-type]


def test_tokens_and_roles(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text(TOKENS)
    guard = http_guard(TokenAuth(read_token_file(f)))
    for header in (
        "",
        "Bearer wrong-token-0123456789",
        "Basic b3RlbDpwdw==",
        "otel-token-0123456789ab",
    ):
        with pytest.raises(Refused) as e:
            guard(caller(header), INGEST)
        assert (e.value.status, e.value.reason) == (401, "unauthenticated"), header
    with pytest.raises(Refused) as e:
        guard(caller("Bearer host-token-0123456789ab"), INGEST)
    assert (e.value.status, e.value.reason) == (403, "permission")
    ident = guard(caller("bearer otel-token-0123456789ab"), INGEST)
    assert ident.name == "token:otel" and ident.source == "127.0.0.1"


def test_insecure_lets_anyone_in() -> None:
    assert INGEST in http_guard(Insecure())(caller(), INGEST).roles


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("httppki")
    make_ca(d)
    issue(d, "collector", "/CN=collector", "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("otel-gw", "h1", "reader"):
        issue(d, name, f"/CN={name}", f"subjectAltName=DNS:{name}\n")
    return d


@pytest.fixture
def server(pki: Path) -> Iterator[CollectorServer]:
    auth = MutualTls.from_files(
        str(pki / "collector.pem"),
        str(pki / "collector.key"),
        str(pki / "ca.pem"),
        readers=frozenset({"reader"}),
        ingest=frozenset({"otel-gw"}),
    )
    s = CollectorServer(
        ServerConfig(listen="127.0.0.1:0", metrics_listen="", otlp_http_listen="127.0.0.1:0"),
        auth,
    )
    s.start()
    yield s
    s.stop(0)


def post(pki: Path, server: CollectorServer, cert: str | None) -> int:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"))
    url = f"https://127.0.0.1:{server.otlp_http_port}/v1/traces"
    req = urllib.request.Request(
        url, data=b"", headers={"Content-Type": "application/x-protobuf"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_client_certificates_on_otlp_http(pki: Path, server: CollectorServer) -> None:
    assert post(pki, server, "otel-gw") == 200  # named in ingest_names
    assert post(pki, server, "h1") == 403  # a host's certificate
    assert post(pki, server, "reader") == 403
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        post(pki, server, None)  # no certificate: the handshake fails
    got = server.http_stats["otlp"].snapshot()[0]
    assert got["permission"] == 2


def test_a_certificate_guard_needs_a_certificate(pki: Path) -> None:
    auth = MutualTls.from_files(
        str(pki / "collector.pem"),
        str(pki / "collector.key"),
        str(pki / "ca.pem"),
        readers=frozenset({"reader"}),
        ingest=frozenset({"otel-gw"}),
    )
    guard = http_guard(auth)
    with pytest.raises(Refused) as e:
        guard(caller(), INGEST)
    assert e.value.status == 401
    cert = {"subject": ((("commonName", "reader"),),)}
    assert READER in guard(caller(cert=cert), READER).roles


def test_registration_from_this_machine_is_checked_unless_trusted() -> None:
    info = pb.HostInfo(host="h1", addresses=["127.0.0.9"])
    with pytest.raises(AddressRefused):
        check_addresses(info, frozenset(), "127.0.0.1", ())
    check_addresses(info, frozenset(), "127.0.0.1", (), trust_local=True)
    with pytest.raises(AddressRefused):  # trusted only from a loopback source
        check_addresses(info, frozenset(), "10.0.0.1", (), trust_local=True)
    check_addresses(info, frozenset(), "127.0.0.9", ())  # its own source always passes
