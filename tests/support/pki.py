"""A throwaway PKI for tests, made with the openssl command line: a CA, then
certificates it signs (NAME.pem and NAME.key in the directory, with the extensions
given as openssl's extfile text)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d: Path, name: str = "ca", subject: str = "/CN=fabricprobe test CA") -> None:
    """A self-signed CA: D/NAME.pem, D/NAME.key."""
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
        "-out", f"{name}.pem", "-days", "2", "-subj", subject,
        cwd=d,
    )  # fmt: skip


def issue(d: Path, name: str, subject: str, ext: str, ca: str = "ca") -> None:
    """D/NAME.pem (signed by D/CA) and D/NAME.key for SUBJECT, with extensions EXT."""
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-subj", subject,
        "-out", f"{name}.csr",
        cwd=d,
    )  # fmt: skip
    (d / f"{name}.ext").write_text(ext)
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip
