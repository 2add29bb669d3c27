"""Kopf wiring: which kopf handlers the operator registers, and what each does.

- A daemon per RolloutJob runs the job's reconcile loop: reconcile, then
  sleep until the pod watch wakes the job (a pod of it changed), a spec change
  wakes it, or ``resync_seconds`` pass, whichever is first; a short batching
  pause makes a burst of pod events one reconcile. This is a timer that can be
  woken early. Jobs that finished without a TTL get no daemon (its ``when``
  filter), so a restarted operator does no work for them.
- The pod watch (:mod:`openforge_operator.podwatch`) is an asyncio task per
  served namespace, started at startup; kopf itself never watches pods.
- An index of HarnessEnvs by (namespace, name), which kopf fills before any
  daemon starts, so the reconciler never GETs one; a HarnessEnv event
  refreshes its ``Ready`` condition and wakes the jobs that use it.
- A RolloutJob event whose generation the status has not yet observed (a
  spec change: parallelism, suspend) wakes that job.
- With ``--webhook``, a mutating admission handler injecting the capture
  sidecar into pods labelled ``openforge.dev/capture: "true"``
  (:mod:`openforge_operator.webhook`), registered with ``failurePolicy: Ignore``.

Kopf's own Kubernetes event posting is off (handlers' log lines would become
Events); the reconciler records its own. Resource scanning is off too, so
kopf needs no access to CRDs or namespaces (see ``permissions``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
from openforge.api import v1alpha1

from openforge_operator import (
    k8s,
    podwatch,
    readiness,
    reconciler,
    release,
    settings,
    webhook,
)

log = logging.getLogger(__name__)

FINALIZER = "openforge.dev/operator"
ERROR_BACKOFF_SECONDS = 5.0
ENV_INDEX = "harness_envs"


@dataclasses.dataclass
class Runtime:
    """The operator's shared state, made at startup."""

    config: settings.Settings
    namespaces: list[str] | None
    """The namespaces served; None: all."""
    webhook: webhook.WebhookOptions | None = None
    kubeconfig: str | None = None
    cache: podwatch.PodCache = dataclasses.field(default_factory=podwatch.PodCache)
    api: k8s.Api | None = None
    reconciler: reconciler.Reconciler | None = None
    watches: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)
    orphans: release.Orphans | None = None


def finished_without_ttl(body: Mapping[str, Any]) -> bool:
    """A job whose reconcile loop has nothing left to do."""
    conditions = (body.get("status") or {}).get("conditions") or []
    done = any(
        c.get("type") in (v1alpha1.COMPLETE, v1alpha1.FAILED) and c.get("status") == "True"
        for c in conditions
    )
    return done and (body.get("spec") or {}).get("ttlSecondsAfterFinished") is None


def build_registry(runtime: Runtime) -> kopf.OperatorRegistry:
    """A kopf registry with the operator's handlers, bound to ``runtime``."""
    registry = kopf.OperatorRegistry()
    group, version = v1alpha1.GROUP, v1alpha1.VERSION

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """Kopf's own connection, from the same kubeconfig or service account as ours."""
        return await kopf.login_via_async_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.scanning.disabled = True
        settings.posting.enabled = False
        settings.persistence.finalizer = FINALIZER
        if runtime.webhook is not None:
            settings.admission.server = runtime.webhook.server()
            settings.admission.managed = runtime.webhook.configuration_name
        runtime.api = await k8s.Api.connect(
            runtime.kubeconfig, pool_size=runtime.config.create_concurrency + 16
        )
        runtime.reconciler = reconciler.Reconciler(
            runtime.api, runtime.cache, config=runtime.config
        )
        runtime.orphans = release.Orphans(runtime.api)
        runtime.cache.listener = runtime.orphans.seen
        runtime.watches = [
            asyncio.create_task(podwatch.watch(runtime.api, runtime.cache, namespace=namespace))
            for namespace in (runtime.namespaces if runtime.namespaces is not None else [None])
        ]

    @kopf.on.cleanup(registry=registry)
    async def stop(**_: Any) -> None:
        for task in runtime.watches:
            task.cancel()
        await asyncio.gather(*runtime.watches, return_exceptions=True)
        if runtime.orphans is not None:
            await runtime.orphans.close()
        if runtime.api is not None:
            await runtime.api.close()

    @kopf.index(group, version, v1alpha1.HarnessEnv.PLURAL, registry=registry, id=ENV_INDEX)
    def harness_envs(
        *, namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> dict[tuple[str | None, str], dict[str, Any]]:
        return {(namespace, name): dict(body)}

    @kopf.on.event(
        group, version, v1alpha1.HarnessEnv.PLURAL, registry=registry, id="harness-env-ready"
    )
    async def harness_env_changed(
        *, type: str, namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> None:
        assert runtime.api is not None and runtime.reconciler is not None
        namespace = namespace or "default"
        if type != "DELETED":
            now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
            status = readiness.status(body, now)
            if status is not None:
                path = k8s.namespaced(
                    namespace,
                    v1alpha1.HarnessEnv.PLURAL,
                    name=name,
                    api_version=v1alpha1.API_VERSION,
                )
                await runtime.api.merge_patch(path + "/status", {"status": status})
        for uid in runtime.reconciler.jobs_using(namespace, name):
            runtime.cache.wake(uid)

    @kopf.on.event(
        group, version, v1alpha1.RolloutJob.PLURAL, registry=registry, id="rollout-job-wakeup"
    )
    def rollout_job_changed(*, body: kopf.Body, uid: str, **_: Any) -> None:
        if body.get("metadata", {}).get("generation") != (body.get("status") or {}).get(
            "observedGeneration"
        ):
            runtime.cache.wake(uid)

    @kopf.daemon(
        group, version, v1alpha1.RolloutJob.PLURAL,
        registry=registry, id="rollout-job", cancellation_backoff=5.0, cancellation_timeout=5.0,
        when=lambda body, **_: not finished_without_ttl(body),
    )  # fmt: skip
    async def rollout_job(
        *,
        body: kopf.Body,
        uid: str,
        namespace: str | None,
        stopped: kopf.DaemonStopped,
        **kwargs: Any,
    ) -> None:
        await run_job(
            runtime,
            body,
            uid=uid,
            namespace=namespace or "default",
            stopped=stopped,
            envs=kwargs[ENV_INDEX],
        )

    if runtime.webhook is not None:

        @kopf.on.mutate(
            "v1", "pods", registry=registry, id=webhook.HANDLER_ID,
            labels={webhook.CAPTURE_LABEL: "true"}, operations=["CREATE"],
            ignore_failures=True, side_effects=False,
        )  # fmt: skip
        def inject(*, body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
            try:
                mutated = webhook.inject(dict(body), runtime.config)
            except webhook.InjectionError as error:
                raise kopf.AdmissionError(str(error), code=400) from None
            for key in ("metadata", "spec"):
                patch[key] = mutated[key]

    return registry


async def run_job(
    runtime: Runtime,
    body: kopf.Body,
    *,
    uid: str,
    namespace: str,
    stopped: kopf.DaemonStopped,
    envs: kopf.Index[Any, Any],
) -> None:
    """One job's reconcile loop, until the job is gone or has nothing left to do."""
    assert runtime.reconciler is not None
    await runtime.cache.wait_synced(runtime.namespaces)
    wakeup = runtime.cache.wakeup(uid)
    try:
        while not stopped:
            wakeup.clear()
            env_name = str((body.get("spec") or {}).get("harnessEnvRef", {}).get("name", ""))
            env_body = next(iter(envs.get((namespace, env_name), [])), None)
            try:
                delay = await runtime.reconciler.reconcile(body, env_body)
            except (
                k8s.ApiError,
                aiohttp.ClientError,
                OSError,
            ) as error:  # OSError: TimeoutError too
                log.warning(
                    "reconciling RolloutJob %s/%s: %s", namespace, body["metadata"]["name"], error
                )
                delay = ERROR_BACKOFF_SECONDS
            except Exception:
                # a bug: say so loudly, and keep the loop (kopf would wait a minute to restart it)
                log.exception(
                    "reconciling RolloutJob %s/%s failed", namespace, body["metadata"]["name"]
                )
                delay = ERROR_BACKOFF_SECONDS
            if delay is None:
                return
            woken = asyncio.ensure_future(wakeup.wait())
            stopping = asyncio.ensure_future(stopped.wait())
            try:
                await asyncio.wait(
                    {woken, stopping}, timeout=delay, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                woken.cancel()
                stopping.cancel()
            await asyncio.sleep(runtime.config.batch_seconds)
    finally:
        runtime.cache.forget(uid)
        runtime.reconciler.forget(uid)
