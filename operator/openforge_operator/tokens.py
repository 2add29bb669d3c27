"""The per-job collector token (pure).

The collector lets a stream write a job's records only with that job's token
(``openforge.trajectory.auth``). With ``--collector-master-key-file`` the
operator issues each RolloutJob's token itself, derived from the master key
and the job's namespace, name and uid, into a Secret ``<job>-collector-token``
owned by the job, which only the sidecar container mounts (as it mounts an
explicit ``spec.trainer.tokenSecretRef``, which still wins). A derived token
needs no bookkeeping: the collector checks it with the same key, and an
operator that restarts and creates the Secret again makes the same token (the
create answers 409). The operator never reads the Secret back.
"""

from __future__ import annotations

from typing import Any

from openforge.api import v1alpha1
from openforge.trajectory import auth

from openforge_operator import objects, settings

SECRET_KEY = "token"


def identity(job: v1alpha1.RolloutJob) -> auth.JobIdentity:
    """The job as its token names it."""
    return auth.JobIdentity(
        job.metadata.namespace or "default", objects.job_name(job), objects.job_uid(job)
    )


def issues_token(job: v1alpha1.RolloutJob, config: settings.Settings) -> bool:
    """Whether the operator makes the job's token: it has the master key, and the job
    streams to a collector without naming a token Secret of its own."""
    trainer = job.spec.trainer
    return (
        config.collector_master_key is not None
        and trainer is not None
        and trainer.token_secret_ref is None
    )


def token_source(job: v1alpha1.RolloutJob, config: settings.Settings) -> tuple[str, str] | None:
    """The (Secret, key) the sidecar reads its collector token from; None: it sends none."""
    trainer = job.spec.trainer
    if trainer is not None and trainer.token_secret_ref is not None:
        return trainer.token_secret_ref.name, trainer.token_secret_ref.key
    if issues_token(job, config):
        return objects.collector_token_secret_name(objects.job_name(job)), SECRET_KEY
    return None


def build_secret(job: v1alpha1.RolloutJob, master_key: bytes) -> dict[str, Any]:
    """The job's token Secret (immutable, owned by the job)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": objects.metadata(
            job, objects.collector_token_secret_name(objects.job_name(job))
        ),
        "type": "Opaque",
        "immutable": True,
        "stringData": {SECRET_KEY: auth.issue(master_key, identity(job))},
    }
