"""Whether a HarnessEnv can run rollout pods: its ``Ready`` condition (pure).

The CRD's schema and CEL rules already hold every object to the API models;
this adds what only a cluster needs: the harness container must name its
image and its command (the operator runs the command under its entrypoint,
and cannot know an image's own entrypoint), a relative task-file path needs
a working directory, and the harness may not ask to run as root (rollout
pods run non-root).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from openforge.api import manifests, v1alpha1


@dataclasses.dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reason: str
    message: str


def check(env: v1alpha1.HarnessEnv) -> Readiness:
    """The Ready verdict of a HarnessEnv that passed validation."""
    spec = env.spec
    container = spec.template.to_dict()["spec"]["containers"]
    harness = next(c for c in container if c["name"] == v1alpha1.HARNESS_CONTAINER)
    where = f"spec.template.spec.containers[{v1alpha1.HARNESS_CONTAINER}]"
    if not harness.get("image"):
        return Readiness(False, "NoImage", f"{where}.image is required in a cluster")
    if not harness.get("command"):
        return Readiness(
            False, "NoCommand",
            f"{where}.command is required in a cluster: the operator runs it under its entrypoint "
            "(which then runs the grader), and cannot know an image's own entrypoint",
        )  # fmt: skip
    file = spec.task.file
    if file is not None and not file.path.startswith("/") and not harness.get("workingDir"):
        return Readiness(
            False, "RelativeTaskFile",
            f"spec.task.file.path {file.path!r} is relative and {where}.workingDir is not set",
        )  # fmt: skip
    pod_user = (spec.template.to_dict()["spec"].get("securityContext") or {}).get("runAsUser")
    user = (harness.get("securityContext") or {}).get("runAsUser", pod_user)
    if user == 0:
        return Readiness(False, "RunsAsRoot", f"{where} runs as user 0; rollout pods run non-root")
    return Readiness(True, "Valid", f"ready to run rollouts (capture mode {spec.capture.mode})")


def evaluate(body: Mapping[str, Any]) -> Readiness:
    """The Ready verdict of a HarnessEnv as the API holds it (validation problems included)."""
    try:
        env = manifests.parse(dict(body))
    except manifests.ManifestError as error:
        return Readiness(
            False, "InvalidSpec", "; ".join(f"{p.path}: {p.message}" for p in error.problems)
        )
    assert isinstance(env, v1alpha1.HarnessEnv)
    return check(env)


def status(body: Mapping[str, Any], now: datetime.datetime) -> dict[str, Any] | None:
    """The HarnessEnv status to write, or None when the current one already says it."""
    verdict = evaluate(body)
    generation = (body.get("metadata") or {}).get("generation")
    current = body.get("status") or {}
    conditions = [v1alpha1.Condition.model_validate(c) for c in current.get("conditions") or []]
    updated = v1alpha1.set_condition(
        conditions,
        v1alpha1.Condition(
            type=v1alpha1.READY, status="True" if verdict.ready else "False", reason=verdict.reason,
            message=verdict.message, last_transition_time=now, observed_generation=generation,
        ),
    )  # fmt: skip
    new = v1alpha1.HarnessEnvStatus(observed_generation=generation, conditions=updated).to_dict()
    old = v1alpha1.HarnessEnvStatus(
        observed_generation=current.get("observedGeneration"), conditions=conditions
    ).to_dict()
    return None if new == old else new
