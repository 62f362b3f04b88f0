"""A real one-member etcd (Debian's etcd-server) on loopback for tests: plain, or over
TLS that asks every client for a certificate its CA signed."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.fleet import free_port, wait_for


@contextmanager
def running_etcd(d: Path, pki: Path | None = None) -> Iterator[int]:
    """etcd with its data and log in D; yields its client port. With PKI (a directory of
    ca.pem and etcd.pem/.key, tests/support/pki.py), clients speak https and must show a
    certificate the CA signed (pki/probe.pem is the one the health check shows)."""
    assert shutil.which("etcd"), "etcd is not installed (Debian's etcd-server; scripts/setup.sh)"
    client, peer = free_port(), free_port()
    scheme = "https" if pki else "http"
    tls = []
    ctx = None
    if pki is not None:
        tls = [
            f"--cert-file={pki / 'etcd.pem'}",
            f"--key-file={pki / 'etcd.key'}",
            "--client-cert-auth",
            f"--trusted-ca-file={pki / 'ca.pem'}",
        ]
        ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        ctx.load_cert_chain(str(pki / "probe.pem"), str(pki / "probe.key"))
    log = (d / "etcd.log").open("wb")
    proc = subprocess.Popen(
        [
            "etcd",
            "--name=t",
            f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls={scheme}://127.0.0.1:{client}",
            f"--advertise-client-urls={scheme}://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=t=http://127.0.0.1:{peer}",
            *tls,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def healthy() -> bool:
        url = f"{scheme}://127.0.0.1:{client}/health"
        with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
            return b"true" in r.read()

    try:
        wait_for(healthy, 30, "etcd to start")
        yield client
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
