"""Names, labels and ownership shared by every object the operator makes for a job (pure).

Each rollout pod is ``<job>-<index>-<attempt>``, labelled with its job's name
and uid, its rollout index and its attempt, and owned by the job through a
controller ownerReference, so deleting the job garbage-collects its pods and
the per-job objects (CA Secret, collector token Secret, NetworkPolicy, task-file
ConfigMap).
"""

from __future__ import annotations

from typing import Any

from openforge.api import rollouts, v1alpha1

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "openforge-operator"
LABEL_JOB = "openforge.dev/job"
LABEL_JOB_UID = "openforge.dev/job-uid"
LABEL_ROLLOUT = "openforge.dev/rollout"
"""The rollout index; its presence also lets the kwok stages finish the pod."""
LABEL_ATTEMPT = "openforge.dev/attempt"
ANNOTATION_TASK_ID = "openforge.dev/task-id"
ANNOTATION_SAMPLE = "openforge.dev/sample"
ANNOTATION_POLICY_VERSION = "openforge.dev/policy-version"
ANNOTATION_EARLIER = "openforge.dev/earlier-attempts"
"""The rollout's failed attempts before this pod's (JSON), so a retried rollout's
history outlives the pods of its earlier attempts."""
POD_FINALIZER = "openforge.dev/attempt-record"
"""Holds a rollout pod until the operator has recorded its outcome elsewhere (the job's
status, or the pod of the next attempt): a pod deleted while the operator is down
waits for it instead of vanishing untraced."""

POD_SELECTOR = f"{LABEL_JOB_UID},{MANAGED_BY}={MANAGER}"
"""The operator's one pod watch: every rollout pod it made, in the namespaces it serves."""

MAX_NAME = rollouts.MAX_POD_NAME
"""Pod names become host names, which hold 63 characters."""


def job_name(job: v1alpha1.RolloutJob) -> str:
    if job.metadata.name is None:
        raise ValueError("the RolloutJob has no metadata.name")
    return job.metadata.name


def job_uid(job: v1alpha1.RolloutJob) -> str:
    if job.metadata.uid is None:
        raise ValueError(
            f"RolloutJob {job.metadata.name} has no metadata.uid (not read from the API?)"
        )
    return job.metadata.uid


def pod_name(job: str, index: int, *, attempt: int) -> str:
    """``<job>-<index>-<attempt>``, cut to 63 characters (``rollouts.pod_name``: the
    collector checks a per-job token's records against the same rule)."""
    return rollouts.pod_name(job, index, attempt=attempt)


def ca_secret_name(job: str) -> str:
    return f"{job}-ca"


def collector_token_secret_name(job: str) -> str:
    return f"{job}-collector-token"


def task_files_name(job: str) -> str:
    return f"{job}-taskfiles"


def network_policy_name(job: str) -> str:
    return f"{job}-rollouts"


def owner_reference(job: v1alpha1.RolloutJob) -> dict[str, Any]:
    """The job as the controller owner of an object it made."""
    return {
        "apiVersion": v1alpha1.API_VERSION,
        "kind": v1alpha1.RolloutJob.KIND,
        "name": job_name(job),
        "uid": job_uid(job),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def job_labels(job: v1alpha1.RolloutJob) -> dict[str, str]:
    """Labels of everything made for the job."""
    return {MANAGED_BY: MANAGER, LABEL_JOB: job_name(job), LABEL_JOB_UID: job_uid(job)}


def metadata(job: v1alpha1.RolloutJob, name: str) -> dict[str, Any]:
    """Metadata of a per-job object: in the job's namespace, labelled, owned by the job."""
    meta: dict[str, Any] = {
        "name": name,
        "labels": job_labels(job),
        "ownerReferences": [owner_reference(job)],
    }
    if job.metadata.namespace:
        meta["namespace"] = job.metadata.namespace
    return meta


def build_task_files(job: v1alpha1.RolloutJob, files: dict[str, str]) -> dict[str, Any]:
    """The immutable ConfigMap of the job's rendered task files (see ``tasks.task_files``)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job, task_files_name(job_name(job))),
        "immutable": True,
        "data": files,
    }
