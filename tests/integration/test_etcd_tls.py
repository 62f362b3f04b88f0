"""Collector shards on an etcd that speaks only TLS and asks every client for a
certificate (Debian's etcd-server with --client-cert-auth): a shard joins, follows the
fleet through its watch and leaves over it, whatever CA bundle and proxy the
environment names; an agent finds its shard there; `probe shards` reads it; and a client
that
shows no certificate, one from another CA, one that does not trust etcd's certificate
and one speaking plain http are each refused, counted, and said why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fabricprobe.agent.agent import Agent
from fabricprobe.cli import main
from fabricprobe.collector.config import CollectorSettings
from fabricprobe.collector.service import CollectorServer
from fabricprobe.collector.shard import ShardConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ConfigError
from fabricprobe.core.shards import Etcd, EtcdError, b64
from tests.support.etcd import running_etcd
from tests.support.fleet import fast_server_config, loopback_agent_config, wait_for
from tests.support.pki import issue, make_ca

CLIENT_EXT = "extendedKeyUsage=clientAuth\nsubjectAltName=DNS:client\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("etcdpki")
    make_ca(d, subject="/CN=etcd test CA")
    # etcd's gateway dials etcd's own gRPC with this certificate too: it is a client's
    issue(
        d,
        "etcd",
        "/CN=etcd",
        "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1\n",
    )
    issue(d, "shard", "/CN=shard-tls", CLIENT_EXT)
    issue(d, "probe", "/CN=probe", CLIENT_EXT)
    make_ca(d, "other", "/CN=not etcd's CA")
    issue(d, "stranger", "/CN=stranger", CLIENT_EXT, ca="other")
    return d


@pytest.fixture
def etcd(tmp_path: Path, pki: Path) -> Iterator[int]:
    with running_etcd(tmp_path, pki) as port:
        yield port


def tls_client(port: int, pki: Path, cert: str = "shard", ca: str = "ca") -> Etcd:
    return Etcd(
        (("127.0.0.1", port),),
        ca_file=str(pki / f"{ca}.pem"),
        cert_file=str(pki / f"{cert}.pem") if cert else "",
        key_file=str(pki / f"{cert}.key") if cert else "",
    )


def test_a_shard_joins_follows_and_leaves_over_mutual_tls(
    etcd: int, pki: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # what many hosts' environments say: neither stands in for the settings given
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(pki / "other.pem"))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # nothing listens there
    server = CollectorServer(
        fast_server_config(
            shard=ShardConfig(
                etcd=(("127.0.0.1", etcd),),
                name="shard-tls",
                ttl_s=2,
                refresh_s=0.25,
                resync_s=3600.0,  # no periodic full read: changes come by the watch
                etcd_ca_file=str(pki / "ca.pem"),
                etcd_cert_file=str(pki / "shard.pem"),
                etcd_key_file=str(pki / "shard.key"),
            )
        )
    )
    server.start()
    client = tls_client(etcd, pki)
    try:
        shard = server.shard
        assert shard is not None
        members, bad = client.members()
        assert [m.name for m in members] == ["shard-tls"] and bad == 0
        wait_for(lambda: shard.watch.watching, 10, "the watch open over TLS")
        read_at = shard.fleet.read_at
        info = pb.HostInfo(host="t-1", addresses=["127.0.0.5"]).SerializeToString()
        body = {"key": b64("/fabricprobe/hosts/t-1"), "value": b64(info)}
        client.call("put", lambda c: c.post(c.get_url("/kv/put"), json=body))
        wait_for(lambda: "t-1" in shard.fleet.hosts, 5, "t-1 through the watch")
        assert shard.fleet.read_at == read_at  # the watch brought it, not a full read
        out = CliRunner().invoke(
            main,
            ["shards", "--etcd", f"127.0.0.1:{etcd}", "--ca-file", str(pki / "ca.pem"),
             "--cert-file", str(pki / "probe.pem"), "--key-file", str(pki / "probe.key"),
             "--host", "t-1"],
        )  # fmt: skip
        assert out.exit_code == 0, out.output
        assert "shard-tls\tapi " in out.output and "t-1: shard-tls" in out.output
        # an agent finds its shard over the same TLS and reports its windows there
        agent = Agent(
            loopback_agent_config(
                tmp_path, "127.0.0.2", 0, etcd=f"127.0.0.1:{etcd}", etcd_refresh_s=0.25,
                collector="127.0.0.1:1",  # never used: etcd names the shard
                etcd_ca_file=str(pki / "ca.pem"), etcd_cert_file=str(pki / "probe.pem"),
                etcd_key_file=str(pki / "probe.key"),
            )
        )  # fmt: skip
        agent.start()
        try:
            wait_for(lambda: server.store.seqs_taken("host-2"), 20, "host-2's windows")
        finally:
            agent.stop()
    finally:
        server.stop(0)
    assert client.members()[0] == []  # it revoked its lease on the way out
    assert client.errors == 0


@pytest.mark.parametrize(
    ("cert", "ca", "why"),
    [
        ("", "ca", "SSLError"),  # no client certificate: etcd ends the handshake
        ("stranger", "ca", "SSLError"),  # a certificate etcd's CA did not sign
        ("shard", "other", "CERTIFICATE_VERIFY_FAILED"),  # etcd's certificate untrusted
    ],
)
def test_etcd_refuses_a_client_it_cannot_trust_and_the_client_says_why(
    etcd: int, pki: Path, cert: str, ca: str, why: str
) -> None:
    client = tls_client(etcd, pki, cert, ca)
    with pytest.raises(EtcdError, match=why):
        client.members()
    assert client.errors == 1


def test_plain_http_to_a_tls_etcd_is_refused(etcd: int, pki: Path) -> None:
    client = Etcd((("127.0.0.1", etcd),))
    with pytest.raises(EtcdError, match=f"127.0.0.1:{etcd}"):
        client.members()
    assert client.errors == 1
    # nor does the command line take half a client identity, or one without https
    for args, msg in (
        (["--cert-file", str(pki / "probe.pem")], "go together"),
        (["--cert-file", str(pki / "probe.pem"), "--key-file", str(pki / "probe.key")],
         "needs --ca-file"),
    ):  # fmt: skip
        out = CliRunner().invoke(main, ["shards", "--etcd", f"127.0.0.1:{etcd}", *args])
        assert out.exit_code == 2 and msg in out.output, out.output
    out = CliRunner().invoke(main, ["shards", "--etcd", f"127.0.0.1:{etcd}"])
    assert out.exit_code == 1 and "etcd read /fabricprobe/shards/" in out.output, out.output


def test_a_config_with_an_etcd_client_certificate_but_no_etcd_ca_is_refused(
    pki: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="needs etcd_ca_file"):
        loopback_agent_config(
            tmp_path,
            "127.0.0.2",
            4794,
            etcd="127.0.0.1:2379",
            etcd_cert_file=str(pki / "probe.pem"),
            etcd_key_file=str(pki / "probe.key"),
        ).validate()
    cfg = CollectorSettings(
        etcd="127.0.0.1:2379",
        shard_name="s",
        listen="127.0.0.1:4794",
        etcd_cert_file=str(pki / "shard.pem"),
        etcd_key_file=str(pki / "shard.key"),
    )
    with pytest.raises(ConfigError, match="needs etcd_ca_file"):
        cfg.shard_config()
