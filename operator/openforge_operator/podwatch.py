"""The operator's one pod watch: a cache of rollout pods by job, and per-job wake-ups.

Kopf never sees a pod: handlers on pods would make it patch progress
annotations onto every pod and run a handler per pod event. Instead one
asyncio task per served namespace (one in all for a cluster-wide operator)
lists and then watches the pods carrying the operator's labels
(``objects.POD_SELECTOR``), keeps a :class:`attempts.PodSummary` of each, and
sets the owning job's wake-up event, on which that job's reconcile loop waits.

A pod seen deleted while its harness still ran stays marked so
(``deleted_unfinished``) whatever its later states say. A pod deleted while
unfinished stays in the cache as ``gone``, so the
planner counts its attempt as failed rather than running it again under the
same name. After an expired watch (410 Gone) the namespace is listed again,
and pods missing from the new list are marked gone too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from openforge_operator import attempts, k8s, objects

log = logging.getLogger(__name__)

RETRY_SECONDS = 2.0


class PodCache:
    """Pod summaries by job uid, and an asyncio.Event per job that a pod change sets."""

    def __init__(self) -> None:
        self.listener: Callable[[attempts.PodSummary], None] | None = None
        """Called with every pod summary the cache takes in (``release.Orphans.seen``)."""
        self._jobs: dict[str, dict[str, attempts.PodSummary]] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._synced: dict[str | None, asyncio.Event] = {}

    def pods(self, job_uid: str) -> list[attempts.PodSummary]:
        return list(self._jobs.get(job_uid, {}).values())

    def apply(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """Take one watch event (ADDED, MODIFIED, DELETED) into the cache."""
        summary = attempts.summarize(pod)
        if summary is None:
            return
        if event_type == "DELETED":
            summary = dataclasses.replace(summary, gone=True, held=False)
        by_name = self._jobs.setdefault(summary.job_uid, {})
        previous = by_name.get(summary.name)
        if previous is not None and previous.deleted_unfinished and not summary.deleted_unfinished:
            # the kubelet's last delete (grace 0) moves deletionTimestamp past the
            # harness's end: what was seen while it ran stands
            summary = dataclasses.replace(summary, deleted_unfinished=True)
        by_name[summary.name] = summary
        self.wake(summary.job_uid)
        if self.listener is not None:
            self.listener(summary)

    def relisted(self, namespace: str | None, pods: list[dict[str, Any]]) -> None:
        """Replace what the cache holds of ``namespace`` (None: all) with a fresh list."""
        listed = {(p["metadata"].get("namespace", ""), p["metadata"]["name"]) for p in pods}
        for uid, by_name in self._jobs.items():
            for name, summary in list(by_name.items()):
                in_scope = namespace is None or summary.namespace == namespace
                if in_scope and not summary.gone and (summary.namespace, name) not in listed:
                    by_name[name] = dataclasses.replace(summary, gone=True, held=False)
                    self.wake(uid)
        for pod in pods:
            self.apply("ADDED", pod)

    def forget(self, job_uid: str) -> None:
        """Drop a job's pods and wake-up (its reconcile loop ended)."""
        self._jobs.pop(job_uid, None)
        self._wakeups.pop(job_uid, None)

    def wakeup(self, job_uid: str) -> asyncio.Event:
        """The event a job's reconcile loop waits on."""
        return self._wakeups.setdefault(job_uid, asyncio.Event())

    def wake(self, job_uid: str) -> None:
        event = self._wakeups.get(job_uid)
        if event is not None:
            event.set()

    def synced(self, namespace: str | None) -> asyncio.Event:
        """Set once the first list of ``namespace`` is in the cache."""
        return self._synced.setdefault(namespace, asyncio.Event())

    async def wait_synced(self, namespaces: list[str] | None) -> None:
        for namespace in namespaces if namespaces is not None else [None]:
            await self.synced(namespace).wait()


async def watch(api: k8s.Api, cache: PodCache, *, namespace: str | None) -> None:
    """List and watch the rollout pods of ``namespace`` (None: all) forever."""
    path = k8s.pods_path(namespace)
    while True:
        try:
            pods, version = await api.list(path, label_selector=objects.POD_SELECTOR)
            cache.relisted(namespace, pods)
            cache.synced(namespace).set()
            while True:
                async for event in api.watch(
                    path, label_selector=objects.POD_SELECTOR, resource_version=version
                ):
                    body = event.get("object") or {}
                    version = str((body.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        cache.apply(str(event["type"]), body)
        except asyncio.CancelledError:
            raise
        except k8s.ApiError as error:
            if error.status != 410:
                log.warning(
                    "pod watch of %s failed: %s; listing again",
                    namespace or "all namespaces",
                    error,
                )
                await asyncio.sleep(RETRY_SECONDS)
        except Exception:
            log.exception("pod watch of %s failed; listing again", namespace or "all namespaces")
            await asyncio.sleep(RETRY_SECONDS)
