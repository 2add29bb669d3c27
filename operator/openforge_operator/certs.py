"""The per-job CA of Proxy and Transparent modes.

The sidecar intercepts the harness's TLS with certificates it signs on the
fly, so the harness must trust a CA whose key the sidecar holds. Each job gets
its own CA (a leaked key opens one job's traffic, not every job's), kept in a
Secret owned by the job. Pods mount the Secret twice with different items:
the sidecar gets ``mitmproxy-ca.pem`` (key and certificate, mitmproxy's
confdir file), the harness only ``ca.crt``. The operator never reads the
Secret back: it creates it once (a conflict means it exists) and pods only
reference it.
"""

from __future__ import annotations

import datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from openforge.api import v1alpha1

from openforge_operator import objects, pods

VALID_DAYS = 365
_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


def generate_ca(common_name: str, *, now: datetime.datetime | None = None) -> tuple[str, str]:
    """A new self-signed CA: (private key PEM, certificate PEM)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "OpenForge"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64]),
        ]
    )
    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(days=1)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return key_pem, certificate.public_bytes(serialization.Encoding.PEM).decode()


def needs_ca(env: v1alpha1.HarnessEnv) -> bool:
    """Whether the HarnessEnv's capture mode intercepts TLS (Proxy, Transparent)."""
    return env.spec.capture.mode != "BaseURL"


def build_ca_secret(job: v1alpha1.RolloutJob, *, key_pem: str, cert_pem: str) -> dict[str, Any]:
    """The job's CA Secret: the key+certificate for the sidecar, the certificate for the harness."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": objects.metadata(job, objects.ca_secret_name(objects.job_name(job))),
        "type": "Opaque",
        "immutable": True,
        "stringData": {pods.CA_KEY: key_pem + cert_pem, pods.CA_CERT: cert_pem},
    }
