"""The sidecar's CA: built only when a certificate is needed, loaded at start where every call needs
it.

Real sidecar processes (``openforge sidecar``) and real TLS handshakes.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from openforge_runner.processes import free_port
from openforge_sidecar import tlsstore

CA_FILES = {
    "mitmproxy-ca.pem",
    "mitmproxy-ca-cert.pem",
    "mitmproxy-ca-cert.cer",
    "mitmproxy-ca-cert.p12",
    "mitmproxy-ca.p12",
    "mitmproxy-dhparam.pem",
}


@pytest.mark.parametrize(
    ("modes", "intercepts"),
    [
        (["reverse:http://127.0.0.1:8000"], False),
        (["reverse:https://engine.example:443"], True),
        (["regular"], True),
        (["transparent"], True),
        (["reverse:http://a:1", "regular"], True),
    ],
)
def test_only_a_plain_http_reverse_proxy_does_without_its_ca(
    modes: list[str], intercepts: bool
) -> None:
    assert tlsstore.intercepts_client_tls(modes) is intercepts


def files(confdir: Path) -> set[str]:
    return {p.name for p in confdir.iterdir()} if confdir.exists() else set()


def test_a_reverse_mode_sidecar_serves_without_creating_a_ca(procs: Any, tmp_path: Path) -> None:
    confdir = tmp_path / "confdir"
    sidecar = procs.sidecar("--confdir", str(confdir), engine=procs.engine())
    stats = httpx.get(f"{sidecar.url}/openforge/v1/stats", timeout=10)
    assert stats.status_code == 200
    assert files(confdir) == set()


def test_a_tls_client_of_a_reverse_mode_sidecar_still_gets_a_certificate(
    procs: Any, tmp_path: Path
) -> None:
    confdir = tmp_path / "confdir"
    sidecar = procs.sidecar("--confdir", str(confdir), engine=procs.engine())
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", sidecar.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="sidecar.test") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    issuer = x509.load_der_x509_certificate(der).issuer
    assert issuer.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "mitmproxy"
    assert files(confdir) == CA_FILES  # built for that handshake
    # and the proxy still serves plain HTTP
    assert httpx.get(f"{sidecar.url}/openforge/v1/stats", timeout=10).status_code == 200


def test_a_proxy_mode_sidecar_has_its_ca_before_it_serves(procs: Any, tmp_path: Path) -> None:
    confdir = tmp_path / "confdir"
    procs.sidecar("--mode", "regular", "--confdir", str(confdir), engine=procs.engine())
    assert files(confdir) == CA_FILES


def test_a_bad_ca_stops_a_proxy_mode_sidecar_at_start(tmp_path: Path) -> None:
    confdir = tmp_path / "confdir"
    confdir.mkdir()
    (confdir / "mitmproxy-ca.pem").write_text("not a key\n")
    argv = [
        sys.executable, "-m", "openforge.cli", "sidecar", "--mode", "regular",
        "--listen", f"127.0.0.1:{free_port()}", "--spool", str(tmp_path / "spool"),
        "--engine", "http://127.0.0.1:9", "--confdir", str(confdir),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Could not deserialize key data" in done.stdout + done.stderr
