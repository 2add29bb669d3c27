"""What a rollout pod says about its attempt (pure): live, succeeded, or failed and why.

The operator keeps no pod bodies: the pod watch boils each pod down to a
:class:`PodSummary` (:func:`summarize`), and the reconciler judges summaries
into :class:`Attempt` values with the job's failure policy (:func:`judge`).

A finished attempt is judged as ``openforge run`` judges a local one. What
happened to the pod from outside comes first: evicted, preempted, out of
memory, past its deadline. Then the verdict the pod computed itself: the
harness container's termination message, written by the in-pod agent,
carries ``status`` and ``reason`` (GraderFailed, SidecarFailed). Without one
(the kwok simulation, or an entrypoint that never ran) the harness's exit
code decides: a code in the job's failing set (non-zero codes its failure
policy does not ignore) fails the attempt, any other is graded data.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from openforge import podrun
from openforge.api import retries, v1alpha1

from openforge_operator import objects

State = Literal["pending", "running", "succeeded", "failed"]
IMAGE_PULL_WAITING = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
DISRUPTIONS = {
    "PreemptionByScheduler": "Preempted",
    "EvictionByEvictionAPI": "Evicted",
    "TerminationByKubelet": "Evicted",
    "DeletionByTaintManager": "Evicted",
}


@dataclasses.dataclass(frozen=True, slots=True)
class PodSummary:
    """The few facts of a rollout pod the operator keeps."""

    name: str
    job_uid: str
    index: int
    attempt: int
    phase: str
    exit_code: int | None = None
    """The harness container's exit code, once it terminated."""
    outside_reason: str | None = None
    """A FailureReason from the pod's fate (Evicted, OOMKilled, DeadlineExceeded, ...)."""
    verdict: podrun.Termination | None = None
    """The in-pod agent's verdict (the harness container's termination message)."""
    message: str = ""
    deleting: bool = False
    deleted_unfinished: bool = False
    """The pod was deleted while its harness still ran (the kubelet then stopped it)."""
    gone: bool = False
    """The pod no longer exists; this is what it last showed."""
    namespace: str = ""
    job: str = ""
    """The job's name (its label)."""
    scheduled: bool = True
    """The pod was bound to a node (a kubelet will stop it when it is deleted)."""
    held: bool = False
    """The pod carries the operator's finalizer (``objects.POD_FINALIZER``)."""
    earlier: tuple[retries.Tried, ...] = ()
    """The rollout's failed attempts before this one, as the pod was created with them."""

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of one rollout, judged."""

    name: str
    index: int
    attempt: int
    state: State
    exit_code: int | None = None
    reason: str | None = None
    """A FailureReason name (see ``v1alpha1.FailureReason``) or None."""
    message: str = ""
    deleting: bool = False
    acknowledged: bool = False
    """The in-pod agent reported the collector acknowledged the rollout's records."""
    held: bool = False
    """The pod carries the operator's finalizer: it stays until the operator lets it go."""
    earlier: tuple[retries.Tried, ...] = ()
    """The rollout's failed attempts before this one, as recorded on its pod."""

    @property
    def live(self) -> bool:
        return self.state in ("pending", "running")

    @property
    def tried(self) -> retries.Tried:
        """This attempt as the failure policy sees it (once it ended)."""
        return retries.Tried(self.attempt, self.state == "succeeded", self.exit_code, self.reason)


def identify(pod: Mapping[str, Any]) -> tuple[str, int, int] | None:
    """(job uid, rollout index, attempt) from a rollout pod's labels; None if it has none."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    uid = labels.get(objects.LABEL_JOB_UID)
    try:
        index, attempt = int(labels[objects.LABEL_ROLLOUT]), int(labels[objects.LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None
    if not uid or index < 0 or attempt < 0:
        return None
    return uid, index, attempt


def summarize(pod: Mapping[str, Any]) -> PodSummary | None:
    """The facts of a rollout pod; None for a pod without rollout labels."""
    identity = identify(pod)
    if identity is None:
        return None
    uid, index, attempt = identity
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    harness = _container_status(status, v1alpha1.HARNESS_CONTAINER)
    terminated = ((harness or {}).get("state") or {}).get("terminated") or {}
    exit_code = terminated.get("exitCode")
    outside = _disruption(status)
    if phase in ("Succeeded", "Failed"):
        outside = _outside_reason(status) or outside
    message = status.get("message") or terminated.get("message") or ""
    return PodSummary(
        name=str(metadata.get("name", "")),
        job_uid=uid,
        index=index,
        attempt=attempt,
        phase=phase,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        outside_reason=outside,
        verdict=podrun.Termination.parse(terminated.get("message")),
        message=str(message)[:500],
        deleting=metadata.get("deletionTimestamp") is not None,
        deleted_unfinished=_deleted_unfinished(metadata, terminated),
        namespace=str(metadata.get("namespace", "")),
        job=str((metadata.get("labels") or {}).get(objects.LABEL_JOB, "")),
        scheduled=bool((pod.get("spec") or {}).get("nodeName")),
        held=objects.POD_FINALIZER in (metadata.get("finalizers") or []),
        earlier=earlier_attempts(
            (metadata.get("annotations") or {}).get(objects.ANNOTATION_EARLIER), before=attempt
        ),
    )


def judge(pod: PodSummary, *, failing_exit_codes: frozenset[int]) -> Attempt:
    """The attempt a pod stands for, under the job's failing exit codes."""
    base = Attempt(
        pod.name,
        pod.index,
        pod.attempt,
        "pending",
        pod.exit_code,
        deleting=pod.deleting,
        held=pod.held,
        earlier=pod.earlier,
    )
    if not pod.terminal:
        if pod.gone or (pod.deleting and not pod.scheduled):
            # no kubelet ever ends a pod deleted before it was bound to a node
            message = "the pod was deleted before it finished"
            return dataclasses.replace(
                base, state="failed", reason=pod.outside_reason, message=message
            )
        return dataclasses.replace(base, state="running" if pod.phase == "Running" else "pending")
    if pod.outside_reason is not None:
        return dataclasses.replace(
            base,
            state="failed",
            reason=pod.outside_reason,
            message=pod.message or pod.outside_reason,
        )
    if pod.deleted_unfinished and (pod.verdict is None or pod.verdict.status != "succeeded"):
        # the harness's exit code is the kill's, and its grade that of a half-done rollout
        return dataclasses.replace(
            base, state="failed", message="the pod was deleted before it finished"
        )
    if pod.verdict is not None:
        code = pod.verdict.exit_code
        return dataclasses.replace(
            base,
            state=pod.verdict.status,
            exit_code=code if code is not None else pod.exit_code,
            reason=pod.verdict.reason or None,
            message=pod.verdict.message[:500],
            acknowledged=pod.verdict.acknowledged,
        )
    if pod.exit_code is None:
        message = pod.message or "the pod ended without a harness exit code"
        return dataclasses.replace(
            base, state="succeeded" if pod.phase == "Succeeded" else "failed", message=message
        )
    if pod.exit_code != 0 and pod.exit_code in failing_exit_codes:
        return dataclasses.replace(
            base, state="failed", message=f"harness exited with {pod.exit_code}"
        )
    return dataclasses.replace(base, state="succeeded")


def observe(pod: Mapping[str, Any], *, failing_exit_codes: frozenset[int]) -> Attempt | None:
    """:func:`judge` of :func:`summarize`."""
    summary = summarize(pod)
    return None if summary is None else judge(summary, failing_exit_codes=failing_exit_codes)


def earlier_annotation(history: Sequence[retries.Tried]) -> str:
    """The value of ``objects.ANNOTATION_EARLIER`` for a pod after the attempts ``history``."""
    return json.dumps(
        [
            {"attempt": t.attempt, "exitCode": t.exit_code, "reason": t.reason}
            for t in sorted(history, key=lambda t: t.attempt)
        ],
        separators=(",", ":"),
    )


def earlier_attempts(text: Any, *, before: int) -> tuple[retries.Tried, ...]:
    """The failed attempts an ``objects.ANNOTATION_EARLIER`` value records; what is not
    such a record (a hand edit) is left out, and so is any attempt not before ``before``."""
    if not isinstance(text, str):
        return ()
    try:
        items = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(items, list):
        return ()
    found: dict[int, retries.Tried] = {}
    for item in items:
        if not isinstance(item, dict):
            continue
        number, code, reason = item.get("attempt"), item.get("exitCode"), item.get("reason")
        if type(number) is not int or not 0 <= number < before:
            continue
        found[number] = retries.Tried(
            number,
            False,
            code if type(code) is int else None,
            reason if isinstance(reason, str) and reason else None,
        )
    return tuple(found[n] for n in sorted(found))


def _deleted_unfinished(metadata: Mapping[str, Any], terminated: Mapping[str, Any]) -> bool:
    """Whether deletion of the pod was asked for before its harness finished.

    The deletion was asked ``deletionGracePeriodSeconds`` before ``deletionTimestamp``;
    a harness that finished in that second or later counts as stopped by it.
    """
    deletion = _timestamp(metadata.get("deletionTimestamp"))
    if deletion is None:
        return False
    finished = _timestamp(terminated.get("finishedAt"))
    if finished is None:
        return True
    grace = metadata.get("deletionGracePeriodSeconds")
    asked = deletion - datetime.timedelta(seconds=grace if isinstance(grace, int) else 0)
    return finished >= asked


def _timestamp(value: Any) -> datetime.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.datetime.fromisoformat(value)
    except ValueError:
        return None


def _outside_reason(status: Mapping[str, Any]) -> str | None:
    """A FailureReason the pod's fate gives, whatever the harness did."""
    pod_reason = status.get("reason")
    if pod_reason == "Evicted":
        return "Evicted"
    if pod_reason == "DeadlineExceeded":
        return "ImagePullFailed" if _waiting_on_image(status) else "DeadlineExceeded"
    for container in _containers(status):
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return "OOMKilled"
    return None


def _disruption(status: Mapping[str, Any]) -> str | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return DISRUPTIONS.get(str(condition.get("reason", "")))
    return None


def _waiting_on_image(status: Mapping[str, Any]) -> bool:
    for container in _containers(status):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_WAITING:
            return True
    return False


def _containers(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]


def _container_status(status: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    for container in status.get("containerStatuses") or []:
        if container.get("name") == name:
            return dict(container)
    return None
