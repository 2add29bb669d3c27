"""The operator's own settings: what the CLI flags set, with the defaults the docs state."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

DEFAULT_SIDECAR_IMAGE = "ghcr.io/openforge/sidecar:0.1.0"
"""The sidecar image (sidecar/Dockerfile): ``openforge sidecar``, the in-pod agent
(``openforge_sidecar.podagent``) and iptables for Transparent mode, user 1337."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Operator-wide knobs; every rollout pod is built from a job, its HarnessEnv and these."""

    sidecar_image: str = DEFAULT_SIDECAR_IMAGE
    image_pull_policy: str | None = None
    sidecar_port: int = 15090
    """Where the sidecar listens on the pod's loopback (all capture modes)."""
    sidecar_uid: int = 1337
    """The sidecar's user id; Transparent mode's redirect skips this user's traffic."""
    harness_uid: int = 1000
    """Run-as user of the harness when neither the pod nor the container template sets one."""
    # An idle sidecar uses next to no CPU and a busy one ~5 ms a call: 50m keeps a
    # 2-core kind node able to run the demo's 4 rollouts beside its control plane.
    sidecar_resources: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {
            "requests": {"cpu": "50m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        }
    )
    default_rollout_timeout_seconds: int = 600
    """An attempt's harness time when neither the job nor the HarnessEnv sets one (as locally)."""
    finish_wait_seconds: int = 60
    """How long the pod waits for the collector to acknowledge a rollout's records."""
    fence_wait_seconds: int = 60
    """How long a rollout pod's sidecar waits for the job's NetworkPolicy to fence the pod
    (the API server unreachable) before it lets the harness start; a pod still unfenced
    then fails its attempt (SidecarFailed). 0: start the harness without waiting (a
    cluster whose network plugin does not enforce NetworkPolicy)."""
    pod_deadline_slack_seconds: int = 60
    """Added to an attempt's harness, grader and finish time: sidecar start and image pulls."""
    resync_seconds: float = 30.0
    """Reconcile every job at least this often, even without a pod or job event."""
    batch_seconds: float = 0.05
    """After a wake-up, wait this long so a burst of pod events makes one reconcile."""
    create_concurrency: int = 64
    """Pod creations in flight at once, across all jobs."""
    collector_master_key: bytes | None = dataclasses.field(default=None, repr=False)
    """With it, each RolloutJob without ``spec.trainer.tokenSecretRef`` gets its own
    collector token derived from this key (``tokens.py``); kept out of ``repr``."""
    dns_namespace: str = "kube-system"
    dns_pod_labels: dict[str, str] = dataclasses.field(
        default_factory=lambda: {"k8s-app": "kube-dns"}
    )
    """Where rollout pods may send DNS queries (the cluster DNS pods)."""


_QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki)?$")


def parse_resources(text: str) -> dict[str, Any]:
    """A container's ``resources`` from JSON (``requests``/``limits``, each a map of
    resource name to quantity); ValueError naming the part at fault."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"want an object with requests and/or limits, got {type(value).__name__}")
    for key, quantities in value.items():
        if key not in ("requests", "limits"):
            raise ValueError(f"{key!r}: only requests and limits may be set")
        if not isinstance(quantities, dict):
            raise ValueError(
                f"{key}: want an object of resource: quantity, got {type(quantities).__name__}"
            )
        for name, quantity in quantities.items():
            if (
                not isinstance(quantity, str | int | float)
                or isinstance(quantity, bool)
                or not _QUANTITY.match(str(quantity))
            ):
                raise ValueError(
                    f"{key}.{name}: {quantity!r} is not a Kubernetes quantity (e.g. 50m, 256Mi)"
                )
    return {
        key: {name: str(q) for name, q in quantities.items()} for key, quantities in value.items()
    }
