"""One reconcile of one RolloutJob: gather what is observed, plan, act (the I/O around the planner).

What it reads: the job (kopf's live body), its HarnessEnv (kopf's index), its
task records (inline, or the ConfigMap it names, read once per job), and its
pods' summaries (the pod watch's cache). What it does: create the per-job
objects (CA Secret, collector token Secret, task-file ConfigMap, NetworkPolicy)
before the first pod, create and delete pods, write the status, record Events,
delete the job when its TTL runs out.

State kept in memory is only an optimisation, never the truth: pods created
but not yet seen by the watch ("expected", so a fast second reconcile does
not create past ``parallelism``), the status last written (the job's body
lags behind our own writes until the watch catches up; the operator is the
status's only writer), and which per-job objects exist. An operator that
restarts rebuilds all of it from the API: creates answer 409, the status is
read back from the job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from openforge.api import manifests, retries, rollouts, v1alpha1
from openforge.api import tasks as task_records

from openforge_operator import (
    attempts,
    certs,
    k8s,
    network,
    objects,
    planner,
    pods,
    podwatch,
    readiness,
    release,
    settings,
    tasks,
    tokens,
)

log = logging.getLogger(__name__)

COMPONENT = "openforge-operator"
EXPECTATION_SECONDS = 30.0
"""How long a created pod counts as live before the watch shows it."""
CREATE_BACKOFF_SECONDS = 5.0


class Made(enum.Enum):
    """A per-job object the operator created (it exists; a 409 said so, or a 201)."""

    CA = "ca"
    TOKEN = "token"
    TASK_FILES = "taskfiles"


@dataclasses.dataclass(frozen=True, slots=True)
class Expected:
    """A pod created but not yet seen by the watch."""

    index: int
    attempt: int
    created: float  # time.monotonic()
    earlier: tuple[retries.Tried, ...] = ()


@dataclasses.dataclass
class JobMemory:
    """What this process remembers of one job between reconciles."""

    env_key: tuple[str, str]
    expected: dict[str, Expected] = dataclasses.field(default_factory=dict)
    tasks: list[dict[str, Any]] | None = None
    made: set[Made] = dataclasses.field(default_factory=set)
    policy_digest: str = ""
    """The spec of the NetworkPolicy last applied, hashed ("" before the first)."""
    status: dict[str, Any] | None = None
    warned: str | None = None
    backoff_until: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Blocked:
    reason: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Inputs:
    """What a reconcile works from: the HarnessEnv and the task records, and what blocks it."""

    blocked: Blocked | None
    env: v1alpha1.HarnessEnv | None
    records: list[dict[str, Any]] | None


class Reconciler:
    """Reconciles RolloutJobs; one per operator process, shared by every job's loop."""

    def __init__(
        self, api: k8s.Api, cache: podwatch.PodCache, *, config: settings.Settings
    ) -> None:
        self._api = api
        self._cache = cache
        self._config = config
        self._memory: dict[str, JobMemory] = {}
        self._slots = asyncio.Semaphore(config.create_concurrency)

    def forget(self, uid: str) -> None:
        self._memory.pop(uid, None)

    def jobs_using(self, namespace: str, env_name: str) -> list[str]:
        """Uids of the jobs this process reconciles that run the HarnessEnv."""
        return [
            uid for uid, memory in self._memory.items() if memory.env_key == (namespace, env_name)
        ]

    async def reconcile(
        self, body: Mapping[str, Any], env_body: Mapping[str, Any] | None
    ) -> float | None:
        """Reconcile once; the seconds until the next look (None: nothing left to do)."""
        meta = body["metadata"]
        uid = meta["uid"]
        namespace = meta.get("namespace") or "default"
        env_name = str((body.get("spec") or {}).get("harnessEnvRef", {}).get("name", ""))
        memory = self._memory.setdefault(uid, JobMemory((namespace, env_name)))
        current = {
            **body,
            "status": memory.status if memory.status is not None else body.get("status"),
        }
        if current["status"] is None:
            current.pop("status")
        try:
            job = manifests.parse(current)
        except manifests.ManifestError as error:
            await self._warn(body, memory, blocked=Blocked("InvalidSpec", str(error)))
            return self._config.resync_seconds
        assert isinstance(job, v1alpha1.RolloutJob)
        inputs = await self._inputs(job, env_body, memory=memory)
        blocked, env, records = inputs.blocked, inputs.env, inputs.records
        total = tasks.count(records, job.spec.samples_per_task) if records is not None else None
        observed = self._observe(job, memory)
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        plan_blocked = blocked.message if blocked else None
        plan = planner.plan(job=job, total=total, attempts=observed, now=now, blocked=plan_blocked)
        if blocked is not None:
            await self._warn(body, memory, blocked=blocked)
        else:
            memory.warned = None
        failed_create = False
        status = plan.status
        if (
            plan.create
            and env is not None
            and records is not None
            and time.monotonic() >= memory.backoff_until
        ):
            failed_create = not await self._create(
                body, job, env=env, records=records, todo=plan.create, memory=memory
            )
            # count what was just created in the status written now, not one reconcile later
            after = planner.plan(
                job=job,
                total=total,
                attempts=self._observe(job, memory),
                now=now,
                blocked=plan_blocked,
            )
            status = after.status
        await asyncio.gather(
            *(
                self._api.delete(k8s.namespaced(namespace, "pods", name=name))
                for name in plan.delete
            )
        )
        # Events before the status: a status that finishes the job stops this loop (the
        # daemon's filter), and the Events of the transition must not be lost to that
        for event in plan.events:
            await self._event(body, event.type, reason=event.reason, message=event.message)
        written = await self._write_status(body, status, memory=memory)
        holding = plan.holding
        if written and plan.release:
            # after the status: what lets a pod go must be recorded first
            holding = not await self._release(namespace, plan.release) or holding
        elif plan.release:
            holding = True
        if plan.delete_job:
            await self._api.delete(
                k8s.namespaced(
                    namespace, "rolloutjobs", name=meta["name"], api_version=v1alpha1.API_VERSION
                ),
                uid=uid,
            )
            return None
        if plan.finished and plan.requeue_after is None and not plan.delete and not holding:
            return None
        delay = self._config.resync_seconds
        if plan.requeue_after is not None:
            delay = min(delay, max(plan.requeue_after, 0.0) + 0.5)
        if failed_create:
            delay = min(delay, CREATE_BACKOFF_SECONDS)
        return delay

    # -- inputs ---------------------------------------------------------------------------

    async def _inputs(
        self, job: v1alpha1.RolloutJob, env_body: Mapping[str, Any] | None, *, memory: JobMemory
    ) -> Inputs:
        found = await self._tasks(job, memory)
        records = None if isinstance(found, Blocked) else found
        problems = v1alpha1.cluster_problems(job)
        if problems:
            return Inputs(Blocked("NotRunnableInCluster", "; ".join(problems)), None, records)
        env_name = job.spec.harness_env_ref.name
        if env_body is None:
            message = f"HarnessEnv {env_name!r} not found in namespace {job.metadata.namespace}"
            return Inputs(Blocked("HarnessEnvNotFound", message), None, records)
        try:
            env = manifests.parse(dict(env_body))
        except manifests.ManifestError as error:
            return Inputs(
                Blocked("HarnessEnvInvalid", f"HarnessEnv {env_name!r}: {error}"), None, records
            )
        assert isinstance(env, v1alpha1.HarnessEnv)
        ready = readiness.check(env)
        if not ready.ready:
            return Inputs(
                Blocked("HarnessEnvNotReady", f"HarnessEnv {env_name!r}: {ready.message}"),
                env,
                records,
            )
        return Inputs(found if isinstance(found, Blocked) else None, env, records)

    async def _tasks(
        self, job: v1alpha1.RolloutJob, memory: JobMemory
    ) -> list[dict[str, Any]] | Blocked | None:
        """The job's task records (None: the job names none yet), or why they cannot be read."""
        if memory.tasks is not None:
            return memory.tasks
        try:
            records = task_records.inline(job.spec.tasks)
        except task_records.TaskError as error:
            return Blocked("TasksUnavailable", str(error))
        ref = job.spec.tasks.config_map_ref
        if records is None and ref is not None:
            namespace = job.metadata.namespace or "default"
            where = f"ConfigMap {ref.name!r} key {ref.key!r}"
            config_map = await self._api.get(k8s.namespaced(namespace, "configmaps", name=ref.name))
            if config_map is None:
                return Blocked("TasksUnavailable", f"spec.tasks.configMapRef: {where} not found")
            text = (config_map.get("data") or {}).get(ref.key)
            if text is None:
                return Blocked(
                    "TasksUnavailable", f"spec.tasks.configMapRef: {where} does not exist"
                )
            try:
                records = task_records.parse_jsonl(text, where=where)
            except task_records.TaskError as error:
                return Blocked("TasksUnavailable", f"spec.tasks.configMapRef: {error}")
        if records is not None:
            try:
                task_records.check_rollouts(records, job.spec.samples_per_task)
            except task_records.TaskError as error:
                return Blocked("TasksUnavailable", str(error))
        memory.tasks = records
        return records

    def _observe(self, job: v1alpha1.RolloutJob, memory: JobMemory) -> list[attempts.Attempt]:
        uid = objects.job_uid(job)
        failing = frozenset(rollouts.parse_indexes(pods.failing_exit_codes(job)))
        summaries = self._cache.pods(uid)
        observed = [attempts.judge(s, failing_exit_codes=failing) for s in summaries]
        seen = {s.name for s in summaries}
        now = time.monotonic()
        for name, expected in list(memory.expected.items()):
            if name in seen or now - expected.created > EXPECTATION_SECONDS:
                del memory.expected[name]
            else:
                observed.append(
                    attempts.Attempt(
                        name,
                        expected.index,
                        expected.attempt,
                        "pending",
                        held=True,
                        earlier=expected.earlier,
                    )
                )
        return observed

    # -- actions --------------------------------------------------------------------------

    async def _create(
        self,
        body: Mapping[str, Any],
        job: v1alpha1.RolloutJob,
        *,
        env: v1alpha1.HarnessEnv,
        records: list[dict[str, Any]],
        todo: list[planner.NewPod],
        memory: JobMemory,
    ) -> bool:
        """Create the per-job objects, then the pods; False (and a Warning) when any failed."""
        try:
            await self._companions(job, env, records=records, memory=memory)
            bodies = [
                pods.build_pod(
                    job=job,
                    env=env,
                    rollout=tasks.rollout(records, job.spec.samples_per_task, index=new.index),
                    attempt=new.attempt,
                    config=self._config,
                    earlier=new.earlier,
                )
                for new in todo
            ]
        except (pods.PodError, task_records.TaskError, k8s.ApiError) as error:
            await self._warn(body, memory, blocked=Blocked("FailedCreate", str(error)))
            memory.backoff_until = time.monotonic() + CREATE_BACKOFF_SECONDS
            return False
        namespace = job.metadata.namespace or "default"
        results = await asyncio.gather(
            *(self._create_pod(namespace, pod) for pod in bodies), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        now = time.monotonic()
        for new, pod, result in zip(todo, bodies, results, strict=True):
            if not isinstance(result, BaseException):
                memory.expected[pod["metadata"]["name"]] = Expected(
                    new.index, new.attempt, now, new.earlier
                )
        if errors:
            log.warning(
                "creating %d of %d pods of %s failed: %s",
                len(errors),
                len(bodies),
                objects.job_name(job),
                errors[0],
            )
            await self._warn(
                body,
                memory,
                blocked=Blocked("FailedCreate", f"{len(errors)} pods not created: {errors[0]}"),
            )
            memory.backoff_until = now + CREATE_BACKOFF_SECONDS
            return False
        return True

    async def _create_pod(self, namespace: str, pod: dict[str, Any]) -> bool:
        async with self._slots:
            return await self._api.create(k8s.pods_path(namespace), pod)

    async def _companions(
        self,
        job: v1alpha1.RolloutJob,
        env: v1alpha1.HarnessEnv,
        *,
        records: list[dict[str, Any]],
        memory: JobMemory,
    ) -> None:
        """The per-job objects pods refer to, created once (a 409 means they exist)."""
        namespace = job.metadata.namespace or "default"
        if certs.needs_ca(env) and Made.CA not in memory.made:
            key_pem, cert_pem = await asyncio.to_thread(
                certs.generate_ca, f"openforge {objects.job_name(job)}"
            )
            secret = certs.build_ca_secret(job, key_pem=key_pem, cert_pem=cert_pem)
            await self._api.create(k8s.namespaced(namespace, "secrets"), secret)
            memory.made.add(Made.CA)
        master_key = self._config.collector_master_key
        if (
            master_key is not None
            and tokens.issues_token(job, self._config)
            and Made.TOKEN not in memory.made
        ):
            await self._api.create(
                k8s.namespaced(namespace, "secrets"), tokens.build_secret(job, master_key)
            )
            memory.made.add(Made.TOKEN)
        files = tasks.task_files(env, records)
        if files is not None and Made.TASK_FILES not in memory.made:
            await self._api.create(
                k8s.namespaced(namespace, "configmaps"), objects.build_task_files(job, files)
            )
            memory.made.add(Made.TASK_FILES)
        policy = network.build_network_policy(job, env, config=self._config)
        digest = hashlib.sha256(json.dumps(policy["spec"], sort_keys=True).encode()).hexdigest()
        if digest != memory.policy_digest:
            path = k8s.namespaced(namespace, "networkpolicies", api_version="networking.k8s.io/v1")
            if not await self._api.create(path, policy):
                await self._api.merge_patch(
                    f"{path}/{policy['metadata']['name']}", {"spec": policy["spec"]}
                )
            memory.policy_digest = digest

    async def _release(self, namespace: str, names: list[str]) -> bool:
        """Take the operator's finalizer off the pods ``names``; False when any failed."""
        return await release.pods(self._api, namespace, names=names)

    async def _write_status(
        self, body: Mapping[str, Any], status: dict[str, Any], *, memory: JobMemory
    ) -> bool:
        """Write the job's status when it changed; whether the API holds ``status`` now."""
        old = memory.status if memory.status is not None else dict(body.get("status") or {})
        if status == old:
            memory.status = status
            return True
        patch = {key: status.get(key) for key in {*old, *status}}
        meta = body["metadata"]
        path = (
            k8s.namespaced(
                meta.get("namespace") or "default",
                "rolloutjobs",
                name=meta["name"],
                api_version=v1alpha1.API_VERSION,
            )
            + "/status"
        )
        if await self._api.merge_patch(path, {"status": patch}) is not None:
            memory.status = status
            return True
        return False

    async def _warn(self, body: Mapping[str, Any], memory: JobMemory, *, blocked: Blocked) -> None:
        """A Warning Event for a problem, once until the problem changes."""
        if memory.warned == blocked.message:
            return
        memory.warned = blocked.message
        log.warning(
            "RolloutJob %s/%s: %s",
            body["metadata"].get("namespace"),
            body["metadata"]["name"],
            blocked.message,
        )
        await self._event(body, "Warning", reason=blocked.reason, message=blocked.message)

    async def _event(
        self, body: Mapping[str, Any], type_: str, *, reason: str, message: str
    ) -> None:
        try:
            await self._api.post_event(
                body, type_=type_, reason=reason, message=message, component=COMPONENT
            )
        except k8s.ApiError as error:
            log.warning("cannot record event %s: %s", reason, error)
