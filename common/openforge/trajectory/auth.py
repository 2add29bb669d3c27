"""Per-job collector tokens: which records a sidecar's bearer token lets it write.

The operator gives every RolloutJob its own token and the collector checks it,
both from one master key and this module, so the collector keeps no list of
tokens and learns of no job in advance::

    token    = "ofj1." + b64url(identity) + "."
               + b64url(HMAC-SHA256(key, "ofj1." + b64url(identity)))
    identity = "<namespace>/<name>/<uid>"       (the RolloutJob's)

(b64url: URL-safe base64 without padding.) A stream that presents such a token
may write the records of that job only: ``job`` equal to the job's name, a
``rollout_id`` that is one of the job's pod names (``<name>-<index>-<attempt>``,
see ``rollouts.is_pod_of``) and an ``idempotency_key`` under that rollout. The
namespace and uid are not in the records (a store names jobs by name); the
collector's store remembers which identity first wrote each job name and
refuses the others (``Store.claim_job``), so a same-named job in another
namespace, or a deleted job's successor, cannot write into it.

The MAC is compared in constant time; every refusal names the part of the
token at fault, never the expected value.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import re
from pathlib import Path

from openforge.api import rollouts

VERSION = "ofj1"
MIN_KEY_BYTES = 32
"""A master key shorter than this is refused (the chart generates 64 characters)."""

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_UID = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9]{0,127}$")
_BASE64URL = re.compile(r"^[A-Za-z0-9_-]+$")


class TokenError(ValueError):
    """A token or identity that cannot be used; the message names the part at fault."""


@dataclasses.dataclass(frozen=True, slots=True)
class JobIdentity:
    """One RolloutJob, as a token names it: namespace, name, and the uid that tells
    a job from a later one of the same name."""

    namespace: str
    name: str
    uid: str

    def __post_init__(self) -> None:
        for part, value, pattern in (
            ("namespace", self.namespace, _LABEL),
            ("name", self.name, _SUBDOMAIN),
            ("uid", self.uid, _UID),
        ):
            if not pattern.match(value):
                raise TokenError(f"job identity: {part} {value!r} is not a Kubernetes {part}")

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}/{self.uid}"

    def describe(self) -> str:
        return f"RolloutJob {self.namespace}/{self.name} (uid {self.uid})"

    @classmethod
    def parse(cls, text: str) -> JobIdentity:
        """``<namespace>/<name>/<uid>`` back into an identity."""
        parts = text.split("/")
        if len(parts) != 3:
            raise TokenError(f"job identity {text!r} is not <namespace>/<name>/<uid>")
        return cls(*parts)


def read_master_key(path: Path | str) -> bytes:
    """The master key in ``path`` (surrounding whitespace dropped); raises ValueError
    naming the file when it cannot be read or is too short."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as error:
        raise ValueError(f"{path}: {error.strerror or error}") from None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"{path}: the master key has {len(key)} bytes; at least {MIN_KEY_BYTES} are needed"
        )
    return key


def issue(key: bytes, identity: JobIdentity) -> str:
    """The token of ``identity`` under the master key ``key``."""
    payload = f"{VERSION}.{_encode(str(identity).encode())}"
    return f"{payload}.{_encode(_mac(key, payload))}"


def is_job_token(token: str) -> bool:
    """Whether ``token`` has the per-job form (else it may be a shared token)."""
    return token.startswith(VERSION + ".")


def verify(key: bytes, token: str) -> JobIdentity:
    """The identity ``token`` was issued for under ``key``; TokenError otherwise."""
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenError(
            f"the token has {len(parts)} dot-separated parts, not 3 ({VERSION}.<job>.<mac>)"
        )
    version, job_part, mac_part = parts
    if version != VERSION:
        raise TokenError(f"the token's version {version[:16]!r} is not {VERSION!r}")
    job = _decode(job_part, "job")
    mac = _decode(mac_part, "mac")
    if not hmac.compare_digest(mac, _mac(key, f"{version}.{job_part}")):
        raise TokenError(
            "the token's mac does not match its job (not issued with this collector's master key)"
        )
    try:
        return JobIdentity.parse(job.decode())
    except UnicodeDecodeError:
        raise TokenError("the token's job part is not UTF-8") from None


def record_problem(
    identity: JobIdentity, *, job: str, rollout_id: str, idempotency_key: str
) -> str | None:
    """Why a stream holding ``identity``'s token may not write this record (None: it may)."""
    if job != identity.name:
        return f"job {job!r} is not this stream's job: its token is for {identity.describe()}"
    if not rollouts.is_pod_of(identity.name, rollout_id):
        return (
            f"rollout_id {rollout_id!r} is not a rollout of job {identity.name!r}"
            " (<job>-<index>-<attempt>, the job's pod names)"
        )
    if not idempotency_key.startswith(rollout_id + "/"):
        return (
            f"idempotency_key {idempotency_key!r} does not start with its rollout_id "
            f"{rollout_id!r} + '/'"
        )
    return None


def _mac(key: bytes, payload: str) -> bytes:
    return hmac.new(key, payload.encode(), hashlib.sha256).digest()


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _decode(text: str, part: str) -> bytes:
    if not text:
        raise TokenError(f"the token's {part} part is empty")
    if not _BASE64URL.match(text) or len(text) % 4 == 1:
        raise TokenError(f"the token's {part} part is not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error:
        raise TokenError(f"the token's {part} part is not base64url") from None
