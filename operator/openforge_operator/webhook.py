"""The optional mutating admission webhook: the capture sidecar for pods others create.

A pod labelled ``openforge.dev/capture: "true"`` (made by a Deployment, a Job,
an evaluation harness's own controller) gets the same native sidecar as a
rollout pod, in BaseURL mode: the sidecar listens on the pod's loopback, and
the target container's base-URL env vars point at it. Its settings come from
the pod's annotations:

======================================  =========================================
``openforge.dev/policy-endpoint``       inference base URL (required)
``openforge.dev/policy-model``          model name (required)
``openforge.dev/policy-version``        policy version stamped on records (0)
``openforge.dev/collector``             collector ``host:port`` (none: spool only)
``openforge.dev/collector-token-secret`` ``secret-name/key`` of the bearer token
``openforge.dev/base-url-env``          comma-separated env vars (``OPENAI_BASE_URL``)
``openforge.dev/base-url-suffix``       appended to the sidecar URL, e.g. ``/v1``
``openforge.dev/container``             the container to point at the sidecar
                                        (default: the first)
``openforge.dev/job``                   the job name stamped on records (``webhook``)
======================================  =========================================

Such pods are capture-only: the operator does not own them, runs no grader
and reports no finish record; each call the harness makes is recorded with
the pod's name as the rollout id. The operator issues no per-job collector token
for them (they belong to no RolloutJob, and their names are not rollout pod
names a per-job token may write): the Secret they name holds a shared token,
which the collector accepts with ``--token-file`` beside ``--master-key-file``. A pod that asks for
capture with missing or malformed annotations is refused with a message naming the annotation,
rather than let through unrecorded. The webhook itself is registered with
``failurePolicy: Ignore``, so an operator that is down blocks no pod creation
(such pods then run without capture).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import ipaddress
import re
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from openforge_operator import pods, settings

HANDLER_ID = "capture.openforge.dev"
"""Also the webhook's name prefix, which the API server wants dotted (a domain)."""
CAPTURE_LABEL = "openforge.dev/capture"
PREFIX = "openforge.dev/"
_URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")
_HOST_PORT = re.compile(
    r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?):[0-9]{1,5}$"
)
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


class InjectionError(ValueError):
    """A pod asking for capture that cannot get it; the message names the annotation."""


@dataclasses.dataclass(frozen=True, slots=True)
class WebhookOptions:
    """Where the webhook listens and how the API server reaches it."""

    addr: str = "0.0.0.0"
    port: int = 9443
    host: str | None = None
    """The name the API server calls (a Service DNS name); also the certificate's."""
    certfile: str | None = None
    pkeyfile: str | None = None
    configuration_name: str = "openforge-capture"
    """The MutatingWebhookConfiguration kopf creates and keeps up to date."""
    service: tuple[str, str] | None = None
    """(namespace, name) of the Service in front of the webhook server: the API server
    is told to call it through that Service (``clientConfig.service``), not a URL."""

    def server(self) -> Any:
        """A kopf WebhookServer; with no certificate given, a self-signed one for ``host``."""
        import kopf

        certfile, pkeyfile = self.certfile, self.pkeyfile
        if certfile is None or pkeyfile is None:
            certfile, pkeyfile = self_signed(self.host or "localhost")
        server = kopf.WebhookServer(
            addr=self.addr,
            port=self.port,
            host=self.host,
            certfile=certfile,
            pkeyfile=pkeyfile,
            cafile=certfile,
        )
        if self.service is None:
            return server
        namespace, name = self.service
        return _ThroughService(server, namespace=namespace, name=name, port=self.port)


class _ThroughService:
    """A kopf webhook server whose configuration names a Service instead of a URL.

    kopf's ``WebhookServer`` tells the API server a URL (``https://HOST:PORT/...``),
    which the API server resolves with its own resolver: on kind, kubeadm and managed
    clusters alike that is the node's, which knows no ``*.svc`` name, so every call
    failed (and ``failurePolicy: Ignore`` let every labelled pod through uncaptured).
    With ``clientConfig.service`` the API server finds the Service's endpoints itself.
    The certificate is still the one for ``HOST``, ``NAME.NAMESPACE.svc``, which is the
    name the API server checks it against.
    """

    def __init__(self, server: Any, *, namespace: str, name: str, port: int) -> None:
        self.server, self.namespace, self.name, self.port = server, namespace, name, port

    async def __call__(self, fn: Any) -> Any:
        async for config in self.server(fn):
            yield service_config(config, namespace=self.namespace, name=self.name, port=self.port)


def service_config(
    config: dict[str, Any], *, namespace: str, name: str, port: int
) -> dict[str, Any]:
    """kopf's client config with its URL replaced by the Service (same path); pure."""
    path = urllib.parse.urlsplit(str(config.get("url", ""))).path
    out = {key: value for key, value in config.items() if key != "url"}
    out["service"] = {"namespace": namespace, "name": name, "port": port, "path": path}
    return out


def inject(pod: dict[str, Any], config: settings.Settings) -> dict[str, Any]:
    """The pod with the capture sidecar added (unchanged if it has one); pure."""
    mutated = copy.deepcopy(pod)
    spec = mutated.setdefault("spec", {})
    if any(c.get("name") == pods.SIDECAR for c in spec.get("initContainers") or []):
        return mutated
    annotations = (mutated.get("metadata") or {}).get("annotations") or {}
    endpoint = _required(annotations, "policy-endpoint")
    if not _URL.match(endpoint):
        raise InjectionError(
            f"annotation {PREFIX}policy-endpoint: {endpoint!r} is not an http(s) URL"
        )
    model = _required(annotations, "policy-model")
    version = annotations.get(PREFIX + "policy-version", "0")
    if not version.isdigit():
        raise InjectionError(
            f"annotation {PREFIX}policy-version: {version!r} is not a non-negative integer"
        )
    env_names = [
        n.strip()
        for n in annotations.get(PREFIX + "base-url-env", "OPENAI_BASE_URL").split(",")
        if n.strip()
    ]
    for name in env_names:
        if not _ENV_NAME.match(name):
            raise InjectionError(
                f"annotation {PREFIX}base-url-env: {name!r} is not an env var name"
            )
    suffix = annotations.get(PREFIX + "base-url-suffix", "")
    if suffix and not suffix.startswith("/"):
        raise InjectionError(f"annotation {PREFIX}base-url-suffix: {suffix!r} must start with '/'")
    containers = spec.get("containers") or []
    target = _target(containers, annotations.get(PREFIX + "container"))
    listen = f"127.0.0.1:{config.sidecar_port}"
    args = [
        "--listen", listen, "--mode", "reverse", "--engine", endpoint, "--engine-model", model,
        "--spool", f"{pods.SIDECAR_DIR}/spool", "--confdir", f"{pods.SIDECAR_DIR}/confdir",
        "--job", annotations.get(PREFIX + "job", "webhook"),
        "--rollout-id", "$(OPENFORGE_POD_NAME)", "--policy-version", version,
        # capture only: nobody reports these rollouts, and the pod's containers cannot
        "--control-token-file", pods.CONTROL_TOKEN,
    ]  # fmt: skip
    mounts: list[dict[str, Any]] = [{"name": pods.SIDECAR_VOLUME, "mountPath": pods.SIDECAR_DIR}]
    volumes: list[dict[str, Any]] = [{"name": pods.SIDECAR_VOLUME, "emptyDir": {}}]
    collector = annotations.get(PREFIX + "collector")
    if collector:
        if not _HOST_PORT.match(collector):
            raise InjectionError(f"annotation {PREFIX}collector: {collector!r} is not host:port")
        args += ["--collector", collector]
        token = annotations.get(PREFIX + "collector-token-secret")
        if token:
            secret, _, key = token.partition("/")
            if not secret or not key:
                raise InjectionError(
                    f"annotation {PREFIX}collector-token-secret: {token!r} is not secret-name/key"
                )
            args += ["--collector-token-file", f"{pods.TOKEN_DIR}/{pods.TOKEN_FILE}"]
            mounts.append(
                {"name": pods.TOKEN_VOLUME, "mountPath": pods.TOKEN_DIR, "readOnly": True}
            )
            volumes.append(
                {
                    "name": pods.TOKEN_VOLUME,
                    "secret": {
                        "secretName": secret,
                        "items": [{"key": key, "path": pods.TOKEN_FILE}],
                        "defaultMode": 0o440,
                    },
                }
            )
    sidecar = pods.sidecar_container(
        config.sidecar_image, pods.SIDECAR_COMMAND, args=args, mounts=mounts, config=config
    )
    sidecar["env"].append(
        {"name": "OPENFORGE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    )
    spec["initContainers"] = [sidecar, *(spec.get("initContainers") or [])]
    spec["volumes"] = [*(spec.get("volumes") or []), *volumes]
    spec["securityContext"] = dict(spec.get("securityContext") or {})
    pods.sidecar_can_read_secrets(spec["securityContext"], config)
    address = f"http://{listen}{suffix}"
    kept = [e for e in target.get("env") or [] if e.get("name") not in env_names]
    target["env"] = [*kept, *({"name": name, "value": address} for name in env_names)]
    return mutated


def self_signed(host: str) -> tuple[str, str]:
    """A self-signed server certificate for ``host`` (and 127.0.0.1), written to a temporary
    directory: (certificate file, key file). The webhook configuration trusts it as its CA."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])])
    sans: list[x509.GeneralName] = [x509.DNSName(host)]
    sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory = Path(tempfile.mkdtemp(prefix="openforge-webhook-"))
    certfile, keyfile = directory / "tls.crt", directory / "tls.key"
    certfile.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    keyfile.chmod(0o600)
    return str(certfile), str(keyfile)


def _required(annotations: dict[str, str], name: str) -> str:
    value = annotations.get(PREFIX + name, "").strip()
    if not value:
        raise InjectionError(
            f"annotation {PREFIX}{name} is required on a pod labelled {CAPTURE_LABEL}=true"
        )
    return value


def _target(containers: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    if not containers:
        raise InjectionError("the pod has no containers")
    if name is None:
        return containers[0]
    for container in containers:
        if container.get("name") == name:
            return container
    names = [c.get("name") for c in containers]
    raise InjectionError(
        f"annotation {PREFIX}container: no container named {name!r} (the pod has {names})"
    )
