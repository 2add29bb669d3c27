"""The token of a sidecar's control endpoint, shared by the sidecar that checks it and the
runner and in-pod agent that send it.

A harness reaches its sidecar on the port it makes its model calls to, so without a
secret it could report its own rollout finished, with a reward of its choosing. With
``openforge sidecar --control-token-file PATH`` the sidecar requires
``Authorization: Bearer TOKEN`` on ``POST /openforge/v1/rollout/finish``, TOKEN being
the contents of PATH, which the sidecar creates (random, mode 0600) when it is absent.
Whoever finishes the rollout reads PATH; the harness must not be able to: in a rollout
pod it lies in the sidecar's own volume, which the harness container does not mount;
``openforge run`` keeps it beside the rollout's spool (the harness runs as the same
user there, so this stops a harness that only speaks HTTP, not one that reads the
runner's files).
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

HEADER = "authorization"
FILENAME = "control-token"
"""The token file's name, wherever its owner keeps it."""


def ensure(path: str | os.PathLike[str]) -> str:
    """The token in ``path``, created first (random, 0600, written whole) if absent."""
    target = Path(path)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + f".{os.getpid()}.partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
        os.replace(partial, target)
    return read(target)


def read(path: str | os.PathLike[str]) -> str:
    """The token in ``path``; ValueError when the file holds none."""
    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"{path}: empty control token file")
    return token


def headers(token: str) -> dict[str, str]:
    """The request headers that carry ``token``."""
    return {HEADER: f"Bearer {token}"}


def allows(token: str, value: str | None) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` (in constant time)."""
    return value is not None and hmac.compare_digest(value.encode(), f"Bearer {token}".encode())
