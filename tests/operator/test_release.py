"""Letting held pods go from the pod watch: a pod being deleted whose job no reconcile will
look at again (gone, replaced by a namesake, finished) is let go; one of a running job
is left to that job's reconcile."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openforge_operator import podwatch, release
from operator_fixtures import UID, job_body, pod

JOB = "/apis/openforge.dev/v1alpha1/namespaces/ns/rolloutjobs/job"
DELETING = {
    "finalizers": ["openforge.dev/attempt-record"],
    "deletionTimestamp": "2026-01-01T00:00:00Z",
}
FINISHED = {"conditions": [{"type": "Complete", "status": "True"}]}


class Api:
    def __init__(self, job: dict[str, Any] | None, *, fail: int = 0) -> None:
        self.job = job
        self.fail = fail
        self.released: list[str] = []
        self.gets = 0

    async def get(self, path: str) -> dict[str, Any] | None:
        assert path == JOB
        self.gets += 1
        if self.fail:
            self.fail -= 1
            raise OSError("connection reset")
        return self.job

    async def remove_finalizer(self, path: str, finalizer: str) -> bool:
        self.released.append(path.rsplit("/", 1)[1])
        return True


def watch(api: Api, *bodies: dict[str, Any]) -> list[str]:
    async def main() -> None:
        orphans = release.Orphans(api)  # type: ignore[arg-type]
        cache = podwatch.PodCache()
        cache.listener = orphans.seen
        for body in bodies:
            cache.apply("MODIFIED", body)
        await asyncio.sleep(0.05)
        await orphans.close()

    asyncio.run(main())
    return api.released


@pytest.mark.parametrize(
    "job",
    [
        None,
        job_body() | {"metadata": {"name": "job", "namespace": "ns", "uid": "another"}},
        job_body(status=FINISHED),
    ],
    ids=["deleted", "namesake", "finished"],
)
def test_a_deleting_held_pod_of_a_job_past_planning_is_let_go(job: dict[str, Any] | None) -> None:
    assert watch(Api(job), pod(0, 0, phase="Failed", **DELETING)) == ["job-0-0"]


def test_a_pod_of_a_running_job_is_left_to_its_reconcile() -> None:
    api = Api(job_body())
    assert watch(api, pod(0, 0, phase="Failed", **DELETING)) == []
    assert api.gets == 1


def test_pods_not_held_or_not_deleting_are_not_looked_at() -> None:
    api = Api(None)
    held = {"finalizers": ["openforge.dev/attempt-record"]}
    assert (
        watch(api, pod(0, 0, phase="Running", **held), pod(1, 0, **DELETING | {"finalizers": []}))
        == []
    )
    assert api.gets == 0


def test_a_failed_look_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "RETRY_SECONDS", 0.01)
    api = Api(None, fail=2)
    assert watch(api, pod(0, 0, phase="Failed", **DELETING)) == ["job-0-0"]
    assert api.gets == 3


def test_the_job_finished_rule() -> None:
    assert release.job_finished(None, UID)
    assert release.job_finished(job_body(status=FINISHED), UID)
    assert release.job_finished(job_body(), "other-uid")
    assert not release.job_finished(job_body(), UID)
    deleting = job_body()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert release.job_finished(deleting, UID), "foreground deletion waits for the pods"
    failed = {"conditions": [{"type": "Failed", "status": "True"}]}
    assert release.job_finished(job_body(status=failed), UID)
    assert not release.job_finished(
        job_body(status={"conditions": [{"type": "Complete", "status": "False"}]}), UID
    )
