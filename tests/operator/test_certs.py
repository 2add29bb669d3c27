"""The per-job CA: a real CA that mitmproxy loads and signs leaf certificates with,
and a Secret that keeps key and certificate under separate keys."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from mitmproxy import certs as mitm_certs
from openforge_operator import certs, pods
from operator_fixtures import UID, env, job


def test_the_ca_is_a_ca() -> None:
    key_pem, cert_pem = certs.generate_ca("openforge job")
    certificate = x509.load_pem_x509_certificate(cert_pem.encode())
    assert certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert certificate.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert "BEGIN PRIVATE KEY" in key_pem and "PRIVATE" not in cert_pem
    assert certs.generate_ca("x")[1] != cert_pem, "every job gets its own CA"


def test_mitmproxy_loads_it_and_signs_leaf_certificates(tmp_path: Path) -> None:
    key_pem, cert_pem = certs.generate_ca("openforge job")
    (tmp_path / "mitmproxy-ca.pem").write_text(key_pem + cert_pem)
    store = mitm_certs.CertStore.from_store(tmp_path, "mitmproxy", 2048)
    entry = store.get_cert("api.openai.com", [])
    leaf = x509.load_pem_x509_certificate(entry.cert.to_pem())
    ca = x509.load_pem_x509_certificate(cert_pem.encode())
    assert leaf.issuer == ca.subject
    leaf.verify_directly_issued_by(ca)


def test_the_secret_separates_the_key_from_the_certificate() -> None:
    secret = certs.build_ca_secret(job(), key_pem="KEY\n", cert_pem="CERT\n")
    assert (
        secret["metadata"]["name"] == "job-ca"
        and secret["metadata"]["ownerReferences"][0]["uid"] == UID
    )
    assert secret["immutable"] is True
    assert secret["stringData"] == {pods.CA_KEY: "KEY\nCERT\n", pods.CA_CERT: "CERT\n"}


def test_only_interception_modes_need_a_ca() -> None:
    assert not certs.needs_ca(env())
    assert certs.needs_ca(env(spec={"capture": {"mode": "Proxy"}}))
    assert certs.needs_ca(env(spec={"capture": {"mode": "Transparent"}}))
