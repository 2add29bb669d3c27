"""A RolloutJob's life in real pods: suspend and resume, the job's deadline, an
out-of-memory harness, and the TTL, each as docs/operator.md states it.

The harness is the stepped client of ``realpods`` (a call, then a gate file the test
writes, then the next call), so the test decides when each pod may finish.
"""

from __future__ import annotations

import time

import kube_cluster
import pytest
import realpods

pytestmark = [pytest.mark.kind, pytest.mark.slow]


def job_of(kind: kube_cluster.Kube, name: str) -> dict:
    return kind.get_json("-n", name, "rolloutjob", name)


def pod_names(kind: kube_cluster.Kube, name: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in realpods.pods_of(kind, name, name))


def suspend(kind: kube_cluster.Kube, name: str, value: bool) -> None:
    kind.kubectl(
        "-n",
        name,
        "patch",
        "rolloutjob",
        name,
        "--type=merge",
        "-p",
        f'{{"spec": {{"suspend": {str(value).lower()}}}}}',
    )


@pytest.mark.timeout(900)
def test_suspend_lets_running_attempts_finish_and_starts_none_until_resumed(
    platform: kube_cluster.Kube,
) -> None:
    kind = platform
    name = realpods.start(kind, "life-suspend", calls=2, rollouts=2, parallelism=1)
    first, second = f"{name}-0-0", f"{name}-1-0"
    realpods.wait_answered(kind, name, first, 0)
    started = job_of(kind, name)["status"]["startTime"]
    suspend(kind, name, True)
    kube_cluster.wait_for(
        lambda: realpods.condition(job_of(kind, name), "Suspended"),
        what=f"{name} Suspended",
        timeout=60,
        interval=1,
    )
    realpods.release(
        kind, name, first, 1
    )  # a running attempt goes on (a Job's suspend would delete it)
    kube_cluster.wait_for(
        lambda: realpods.pod(kind, name, first)["status"].get("phase") == "Succeeded",
        what=f"{first} Succeeded",
        timeout=180,
        interval=1,
    )
    time.sleep(10)  # time enough for the next pod, were the job running
    assert pod_names(kind, name) == [first], "a suspended job started a pod"
    assert job_of(kind, name)["status"].get("startTime") is None, (
        "the deadline clock runs while suspended"
    )
    suspend(kind, name, False)
    realpods.wait_answered(kind, name, second, 0)
    realpods.release(kind, name, second, 1)
    job = realpods.wait_job(kind, name, name, timeout=300)
    assert realpods.condition(job, "Complete") and job["status"]["counts"]["succeeded"] == 2, job[
        "status"
    ]
    assert "Suspended" in (events := realpods.events(kind, name)) and "Resumed" in events, events[
        -3000:
    ]
    # the clock set again on resume (RFC 3339 UTC strings compare as times)
    assert job["status"]["startTime"] > started, (started, job["status"])
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(600)
def test_the_deadline_fails_the_job_and_deletes_its_live_pods(platform: kube_cluster.Kube) -> None:
    kind = platform
    name = realpods.start(kind, "life-deadline", calls=2, rollouts=1, activeDeadlineSeconds=30)
    first = f"{name}-0-0"
    realpods.wait_answered(kind, name, first, 0)  # and never released
    job = realpods.wait_job(kind, name, name, timeout=240)
    failed = [
        c
        for c in job["status"].get("conditions", [])
        if c["type"] == "Failed" and c["status"] == "True"
    ]
    assert failed and failed[0]["reason"] == "DeadlineExceeded", job["status"]

    def gone() -> bool:
        return not [
            p
            for p in realpods.pods_of(kind, name, name)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    kube_cluster.wait_for(gone, what=f"{first} deleted", timeout=120, interval=1)
    assert "DeadlineExceeded" in realpods.events(kind, name)
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(600)
def test_an_out_of_memory_harness_is_oomkilled_and_retried(platform: kube_cluster.Kube) -> None:
    kind = platform
    # 200 MiB touched under a 96 MiB limit: the kernel kills the harness in its cgroup
    name = realpods.start(
        kind,
        "life-oom",
        calls=1,
        rollouts=1,
        allocate_mb=200,
        memory_limit="96Mi",
        maxAttemptsPerRollout=2,
    )
    job = realpods.wait_job(kind, name, name, timeout=400)
    assert realpods.condition(job, "Failed"), job["status"]
    assert job["status"]["failedIndexes"] == "0" and job["status"]["counts"]["retried"] == 1, job[
        "status"
    ]
    assert pod_names(kind, name) == [f"{name}-0-0", f"{name}-0-1"]
    events = realpods.events(kind, name)
    assert "OOMKilled" in events and "RolloutsFailed" in events, events[-3000:]
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(600)
def test_the_ttl_deletes_a_finished_job_and_its_pods(platform: kube_cluster.Kube) -> None:
    """And with the job, what the operator made for it: its NetworkPolicy and its collector
    token Secret (owner references, collected by the garbage collector)."""
    kind = platform
    name = realpods.start(kind, "life-ttl", calls=1, rollouts=2, ttlSecondsAfterFinished=5)
    uid = kind.get_json("-n", name, "rolloutjob", name)["metadata"]["uid"]
    made: set[str] = set()

    def both_made() -> bool:
        made.update(realpods.owned_by(kind, name, uid))
        return {item.split("/")[0] for item in made} >= {"secrets", "networkpolicies"}

    kube_cluster.wait_for(both_made, what=f"{name}'s policy and token", timeout=120, interval=0.5)
    kube_cluster.wait_for(
        lambda: realpods.gone(kind, name, [f"rolloutjob/{name}"]),
        what=f"{name} deleted by its TTL",
        timeout=300,
        interval=2,
    )
    kube_cluster.wait_for(
        lambda: not realpods.pods_of(kind, name, name),
        what=f"{name}'s pods collected",
        timeout=180,
        interval=2,
    )
    kube_cluster.wait_for(
        lambda: realpods.gone(kind, name, made),
        what=f"{name}'s {sorted(made)} collected",
        timeout=180,
        interval=2,
    )
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(600)
def test_a_job_deleted_while_the_operator_is_down_waits_for_it(
    platform: kube_cluster.Kube,
) -> None:
    """The operator's finalizer holds a RolloutJob deleted while no operator runs; once the
    operator is back it lets the job go, and the job's pods, policy and token follow."""
    kind = platform
    name = realpods.start(kind, "life-down", calls=2, rollouts=1)
    realpods.wait_answered(kind, name, f"{name}-0-0", 0)
    uid = kind.get_json("-n", name, "rolloutjob", name)["metadata"]["uid"]
    made = realpods.owned_by(kind, name, uid)
    with realpods.operator_down(kind):
        kind.kubectl("-n", name, "delete", "rolloutjob", name, "--wait=false")
        time.sleep(10)
        held = kind.get_json("-n", name, "rolloutjob", name)
        assert held["metadata"].get("deletionTimestamp"), held["metadata"]
        assert "openforge.dev/operator" in held["metadata"].get("finalizers", []), held["metadata"]
    kube_cluster.wait_for(
        lambda: realpods.gone(kind, name, [f"rolloutjob/{name}"]),
        what=f"{name} let go by the operator",
        timeout=300,
        interval=2,
    )
    kube_cluster.wait_for(
        lambda: not realpods.pods_of(kind, name, name) and realpods.gone(kind, name, made),
        what=f"{name}'s pods and {sorted(made)} collected",
        timeout=300,
        interval=2,
    )
    kind.kubectl("delete", "namespace", name, "--wait=false")
