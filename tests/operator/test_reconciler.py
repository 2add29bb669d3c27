"""One reconcile, with the API replaced at our own boundary (``k8s.Api``) by an in-memory
fake: what it creates, patches, deletes and records, and what it remembers between calls."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from openforge.trajectory import auth
from openforge_operator import k8s, podwatch, reconciler, settings
from operator_fixtures import UID, env_body, job_body, pod, terminated

CONFIG = settings.Settings(resync_seconds=30)


class FakeApi:
    """The calls the reconciler makes, answered from a dict of objects by path."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.deleted: list[tuple[str, str | None]] = []
        self.events: list[tuple[str, str, str]] = []
        self.gets: list[str] = []
        self.refuse: k8s.ApiError | None = None
        self.released: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.job_gone = False
        self.refuse_release = False

    async def create(self, path: str, body: dict[str, Any]) -> bool:
        if self.refuse is not None and path.endswith("/pods"):
            raise self.refuse
        key = f"{path}/{body['metadata']['name']}"
        if key in self.objects:
            return False
        self.objects[key] = body
        self.created.append(key)
        return True

    async def get(self, path: str) -> dict[str, Any] | None:
        self.gets.append(path)
        return self.objects.get(path)

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        self.patches.append((path, patch))
        self.calls.append(("status" if path.endswith("/status") else "patch", path))
        return None if self.job_gone else {}

    async def remove_finalizer(self, path: str, finalizer: str) -> bool:
        assert finalizer == "openforge.dev/attempt-record"
        if self.refuse_release:
            raise k8s.ApiError("PATCH", path, status=500, body="etcd is away")
        self.released.append(path.rsplit("/", 1)[1])
        self.calls.append(("release", path))
        return True

    async def delete(
        self, path: str, *, uid: str | None = None, propagation: str = "Background"
    ) -> bool:
        self.deleted.append((path, uid))
        return True

    async def post_event(
        self, involved: Any, *, type_: str, reason: str, message: str, component: str
    ) -> None:
        self.events.append((type_, reason, message))

    def pods(self) -> list[str]:
        return [key.rsplit("/", 1)[1] for key in self.created if "/pods/" in key]


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coroutine)


class Harness:
    def __init__(self, config: settings.Settings = CONFIG, **job_spec: Any) -> None:
        self.api = FakeApi()
        self.cache = podwatch.PodCache()
        self.reconciler = reconciler.Reconciler(self.api, self.cache, config=config)  # type: ignore[arg-type]
        self.body = job_body(spec=job_spec)
        self.env: dict[str, Any] | None = env_body()

    def reconcile(self) -> float | None:
        return run(self.reconciler.reconcile(self.body, self.env))

    def statuses(self) -> list[dict[str, Any]]:
        return [
            patch["status"]
            for path, patch in self.api.patches
            if path.endswith("/rolloutjobs/job/status")
        ]

    def see(self, index: int, attempt: int, **kwargs: Any) -> None:
        self.cache.apply("MODIFIED", pod(index, attempt, **kwargs))


def test_the_first_reconcile_creates_the_policy_then_parallelism_pods_and_writes_status() -> None:
    h = Harness()
    delay = h.reconcile()
    assert (
        h.api.created[0] == "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/job-rollouts"
    )
    assert h.api.pods() == ["job-0-0", "job-1-0", "job-2-0", "job-3-0", "job-4-0"]
    [status] = h.statuses()
    assert status["counts"]["pending"] == 7 and status["counts"]["active"] == 5, (
        "the pods just created count"
    )
    assert status["startTime"] is not None
    assert [e[1] for e in h.api.events] == ["Started"]
    assert delay == 30


def test_created_pods_count_as_live_until_the_watch_shows_them() -> None:
    h = Harness()
    h.reconcile()
    h.reconcile()
    assert len(h.api.pods()) == 5, "no pod beyond parallelism before the watch catches up"
    assert len(h.statuses()) == 1, "nothing changed, nothing written"
    assert [e[1] for e in h.api.events] == ["Started"], (
        "the status written is remembered, so no second Started"
    )


def test_finished_pods_make_room_for_the_next_rollouts() -> None:
    h = Harness()
    h.reconcile()
    for i in range(5):
        h.see(i, 0, phase="Succeeded", status={"containerStatuses": [terminated(0)]})
    h.reconcile()
    assert h.api.pods()[5:] == ["job-5-0", "job-6-0", "job-7-0", "job-8-0", "job-9-0"]
    assert h.statuses()[-1]["counts"]["succeeded"] == 5


def test_a_restarted_operator_recreates_nothing_that_exists() -> None:
    h = Harness()
    h.reconcile()
    existing = dict(h.api.objects)
    restarted = Harness()
    restarted.api.objects = existing
    restarted.reconcile()
    assert restarted.api.pods() == [], "every create answered AlreadyExists"
    restarted.reconcile()
    assert restarted.api.pods() == [], "and those pods count as live meanwhile"


def test_a_missing_harness_env_is_reported_once_and_blocks_creation() -> None:
    h = Harness()
    h.env = None
    h.reconcile()
    h.reconcile()
    assert h.api.pods() == []
    warnings = [e for e in h.api.events if e[0] == "Warning"]
    assert [(w[1], w[2]) for w in warnings] == [
        ("HarnessEnvNotFound", "HarnessEnv 'env' not found in namespace ns")
    ]
    h.env = env_body()
    h.reconcile()
    assert len(h.api.pods()) == 5


def test_a_harness_env_that_is_not_ready_blocks_creation() -> None:
    h = Harness()
    assert h.env is not None
    del h.env["spec"]["template"]["spec"]["containers"][0]["command"]
    h.reconcile()
    assert h.api.pods() == [] and "HarnessEnvNotReady" in [e[1] for e in h.api.events]


def test_a_job_the_cluster_cannot_run_is_reported() -> None:
    h = Harness(trainer=None)
    h.reconcile()
    assert h.api.pods() == [] and ("Warning", "NotRunnableInCluster") in [
        e[:2] for e in h.api.events
    ]


def test_proxy_mode_makes_the_ca_secret_once() -> None:
    h = Harness()
    h.env = env_body(spec={"capture": {"mode": "Proxy"}})
    h.reconcile()
    for i in range(5):
        h.see(i, 0, phase="Succeeded", status={"containerStatuses": [terminated(0)]})
    h.reconcile()
    secrets = [k for k in h.api.created if "/secrets/" in k]
    assert secrets == ["/api/v1/namespaces/ns/secrets/job-ca"]
    assert "-----BEGIN CERTIFICATE-----" in h.api.objects[secrets[0]]["stringData"]["ca.crt"]


def test_with_a_master_key_each_job_gets_its_collector_token_before_its_pods() -> None:
    h = Harness(settings.Settings(collector_master_key=b"k" * 32))
    h.reconcile()
    path = "/api/v1/namespaces/ns/secrets/job-collector-token"
    assert h.api.created.index(path) < h.api.created.index("/api/v1/namespaces/ns/pods/job-0-0")
    secret = h.api.objects[path]
    assert secret["immutable"] is True and secret["metadata"]["ownerReferences"][0]["uid"] == UID
    assert auth.verify(b"k" * 32, secret["stringData"]["token"]) == auth.JobIdentity(
        "ns", "job", UID
    )
    for i in range(5):
        h.see(i, 0, phase="Succeeded", status={"containerStatuses": [terminated(0)]})
    h.reconcile()
    assert [k for k in h.api.created if "/secrets/" in k] == [path], "made once"
    assert h.api.gets == [], "never read back"


def test_a_job_with_its_own_token_secret_gets_none_made() -> None:
    trainer = {"endpoint": "c:1", "tokenSecretRef": {"name": "mine", "key": "token"}}
    h = Harness(settings.Settings(collector_master_key=b"k" * 32), trainer=trainer)
    h.reconcile()
    assert h.api.pods() and not [k for k in h.api.created if "/secrets/" in k]
    without_key = Harness()
    without_key.reconcile()
    assert without_key.api.pods() and not [k for k in without_key.api.created if "/secrets/" in k]


def test_task_files_go_into_one_config_map() -> None:
    h = Harness()
    h.env = env_body(spec={"task": {"file": {"path": "/t.json"}}})
    h.reconcile()
    assert "/api/v1/namespaces/ns/configmaps/job-taskfiles" in h.api.created


def test_tasks_from_a_config_map_are_read_once() -> None:
    h = Harness(tasks={"inline": None, "configMapRef": {"name": "tasks", "key": "t.jsonl"}})
    h.reconcile()
    assert h.api.pods() == [] and "TasksUnavailable" in [e[1] for e in h.api.events]
    h.api.objects["/api/v1/namespaces/ns/configmaps/tasks"] = {
        "data": {"t.jsonl": '{"id": "x"}\n{"id": "y"}\n'}
    }
    h.reconcile()
    h.reconcile()
    assert len(h.api.pods()) == 5 and h.statuses()[-1]["counts"]["pending"] == 3, (
        "2 tasks x 4 samples, 5 started"
    )
    assert h.api.gets.count("/api/v1/namespaces/ns/configmaps/tasks") == 2


def test_a_refused_create_is_reported_and_retried_after_a_backoff() -> None:
    h = Harness()
    h.api.refuse = k8s.ApiError(
        "POST", "/pods", status=403, body='{"reason": "Forbidden", "message": "exceeded quota"}'
    )
    delay = h.reconcile()
    assert delay == reconciler.CREATE_BACKOFF_SECONDS
    [failed] = [e for e in h.api.events if e[1] == "FailedCreate"]
    assert failed[0] == "Warning" and "exceeded quota" in failed[2]


def test_removed_status_fields_are_patched_to_null() -> None:
    h = Harness()
    h.reconcile()
    h.body["spec"]["suspend"] = True
    h.reconcile()
    assert h.statuses()[-1]["startTime"] is None, (
        "merge patch removes what the status no longer has"
    )


def test_a_job_past_its_ttl_is_deleted_by_uid() -> None:
    h = Harness(ttlSecondsAfterFinished=0)
    for i in range(12):
        h.see(i, 0, phase="Succeeded", status={"containerStatuses": [terminated(0)]})
    assert h.reconcile() is not None, "finishing: look again after the TTL"
    assert h.reconcile() is None
    assert h.api.deleted[-1] == ("/apis/openforge.dev/v1alpha1/namespaces/ns/rolloutjobs/job", UID)


def test_a_finished_job_without_ttl_ends_its_loop() -> None:
    h = Harness()
    for i in range(12):
        h.see(i, 0, phase="Succeeded", status={"containerStatuses": [terminated(0)]})
    assert h.reconcile() is None
    assert ("Normal", "Completed") in [e[:2] for e in h.api.events]


def test_an_invalid_job_is_reported() -> None:
    h = Harness()
    h.body["spec"]["samplesPerTask"] = "four"
    assert h.reconcile() == CONFIG.resync_seconds
    [invalid] = [e for e in h.api.events if e[1] == "InvalidSpec"]
    assert "spec.samplesPerTask" in invalid[2]


def test_jobs_using_a_harness_env() -> None:
    h = Harness()
    h.reconcile()
    assert h.reconciler.jobs_using("ns", "env") == [UID]
    h.reconciler.forget(UID)
    assert h.reconciler.jobs_using("ns", "env") == []


@pytest.mark.parametrize("mode", ["BaseURL", "Proxy", "Transparent"])
def test_every_mode_makes_valid_pods(mode: str) -> None:
    h = Harness()
    h.env = env_body(spec={"capture": {"mode": mode}})
    h.reconcile()
    assert len(h.api.pods()) == 5


HELD = {"finalizers": ["openforge.dev/attempt-record"]}
SUCCEEDED = {"phase": "Succeeded", "status": {"containerStatuses": [terminated(0)]}}


def test_pods_are_made_holding_the_finalizer_and_let_go_after_the_status_records_them() -> None:
    h = Harness()
    h.reconcile()
    created = [h.api.objects[key] for key in h.api.created if "/pods/" in key]
    assert all(p["metadata"]["finalizers"] == ["openforge.dev/attempt-record"] for p in created)
    h.see(0, 0, **SUCCEEDED, **HELD)
    h.see(1, 0, phase="Running", **HELD)
    h.api.calls.clear()
    h.reconcile()
    assert h.api.released == ["job-0-0"]
    assert [kind for kind, _ in h.api.calls] == ["status", "release"], "recorded, then let go"
    assert h.statuses()[-1]["completedIndexes"] == "0"


def test_no_pod_is_let_go_when_the_status_was_not_written() -> None:
    h = Harness()
    h.reconcile()
    h.see(0, 0, **SUCCEEDED, **HELD)
    h.api.job_gone = True
    h.reconcile()
    assert h.api.released == []


def test_a_finished_job_keeps_its_loop_until_every_pod_is_let_go() -> None:
    h = Harness()
    for i in range(12):
        h.see(i, 0, **SUCCEEDED, **HELD)
    h.api.refuse_release = True
    assert h.reconcile() is not None, "a pod still held: look again"
    h.api.refuse_release = False
    assert h.reconcile() is None
    assert sorted(h.api.released) == sorted(f"job-{i}-0" for i in range(12))
