"""Letting rollout pods go: taking the operator's finalizer (``objects.POD_FINALIZER``) off.

Every rollout pod is created holding the finalizer, so that no pod vanishes
before the operator has recorded what it showed (the planner's rule:
``planner.Plan.release``). Two paths let pods go:

- a running job's reconcile, for the pods its plan releases, after the status
  that records them is written (:func:`pods`);
- the pod watch, for a held pod being deleted whose job no reconcile will look
  at again: the job is gone (deleted, perhaps while the operator was down, and
  the garbage collector now deletes its pods), is being deleted, is another job
  of the same name, or has finished (:class:`Orphans`). Nothing is planned from such a pod any
  more, so it can go as soon as it is seen.
"""

from __future__ import annotations

import asyncio
import logging

from openforge.api import v1alpha1

from openforge_operator import attempts, k8s, objects

log = logging.getLogger(__name__)

TRIES = 10
RETRY_SECONDS = 3.0


async def pods(api: k8s.Api, namespace: str, *, names: list[str]) -> bool:
    """Take the finalizer off the pods ``names`` of ``namespace`` (gone ones need nothing);
    False when any patch failed (the caller tries again later)."""
    results = await asyncio.gather(
        *(
            api.remove_finalizer(
                k8s.namespaced(namespace, "pods", name=name), objects.POD_FINALIZER
            )
            for name in names
        ),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    log.debug("let go of %d pods in %s: %s", len(names) - len(errors), namespace, names)
    if errors:
        log.warning("letting %d of %d pods go failed: %s", len(errors), len(names), errors[0])
    return not errors


def job_finished(job: dict[str, object] | None, uid: str) -> bool:
    """Whether a pod of the job with ``uid`` is past planning: ``job`` (as read) is absent,
    is another job of that name, is being deleted (with foreground deletion it waits for
    its pods), or has finished (Complete or Failed)."""
    if job is None:
        return True
    metadata = job.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("uid") != uid:
        return True
    if metadata.get("deletionTimestamp"):
        return True
    status = job.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for condition in conditions if isinstance(conditions, list) else []:
        if (
            isinstance(condition, dict)
            and condition.get("type") in (v1alpha1.COMPLETE, v1alpha1.FAILED)
            and condition.get("status") == "True"
        ):
            return True
    return False


class Orphans:
    """Lets go of held pods being deleted whose job is past planning (one look per pod at a
    time; a pod seen again after a failed look is looked at again)."""

    def __init__(self, api: k8s.Api) -> None:
        self._api = api
        self._looking: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def seen(self, pod: attempts.PodSummary) -> None:
        """A pod watch event: look at ``pod`` if it is held and being deleted."""
        key = (pod.namespace, pod.name)
        if not (pod.held and pod.deleting) or pod.gone or key in self._looking:
            return
        self._looking.add(key)
        task = asyncio.get_running_loop().create_task(self._look(pod))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _look(self, pod: attempts.PodSummary) -> None:
        namespace = pod.namespace or "default"
        path = k8s.namespaced(
            namespace, v1alpha1.RolloutJob.PLURAL, name=pod.job, api_version=v1alpha1.API_VERSION
        )
        try:
            for _ in range(TRIES):
                try:
                    job = await self._api.get(path) if pod.job else None
                    if not job_finished(job, pod.job_uid) or await pods(
                        self._api, namespace, names=[pod.name]
                    ):
                        return
                except Exception as error:  # looked at again below
                    log.warning("looking at held pod %s/%s: %s", namespace, pod.name, error)
                await asyncio.sleep(RETRY_SECONDS)
        finally:
            self._looking.discard((pod.namespace, pod.name))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
