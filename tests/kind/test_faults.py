"""Faults in real pods: a sidecar killed mid-rollout, a running pod deleted, the
operator killed mid-job, the collector down and back, the whole collector/trainer pod
replaced. Each time every call the sidecar saw reaches the collector's store exactly
once and nothing is reported lost.

Kills are SIGKILLs of a container's processes, sent inside the kind node (``crictl
inspect`` gives the pid), so nothing shuts down cleanly; the kubelet restarts the
container as it would after a crash. The harness is a stepped client of the policy
server: it makes a call, then waits for a gate file the test writes into the pod
(``/work/go-N``) before the next one, so each fault lands between two known calls.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kube_cluster
import pytest
import realpods
import yaml

pytestmark = [pytest.mark.kind, pytest.mark.slow]

SIDECAR = realpods.SIDECAR


def calls_by_rollout(summary: dict[str, Any]) -> dict[tuple[str, int], list[int]]:
    return {
        (r["task"], r["attempt"]): sorted(c["index"] for c in r["calls"])
        for r in summary["rollouts"]
    }


def check_exactly_once(summary: dict[str, Any], expected: dict[tuple[str, int], list[int]]) -> None:
    """The store holds these rollouts (task, attempt) with these call indexes, each once, and lost
    nothing."""
    assert summary["lost"] == [], summary["lost"]
    assert calls_by_rollout(summary) == expected, summary["rollouts"]
    for rollout in summary["rollouts"]:
        assert rollout["finished"] and rollout["complete"], rollout
        for call in rollout["calls"]:
            assert (
                call["status"] == 200
                and call["exact"]
                and call["completion_tokens"] == call["logprobs"] > 0
            ), (rollout["id"], call)


def finish(kind: kube_cluster.Kube, name: str) -> dict[str, Any]:
    job = realpods.wait_job(kind, name, name, timeout=600)
    assert realpods.condition(job, "Complete"), (
        f"{name}: {job.get('status')}\nevents:\n{realpods.events(kind, name)[-4000:]}"
    )
    return job


@pytest.mark.timeout(900)
def test_a_killed_sidecar_restarts_and_the_rollout_goes_on(platform: kube_cluster.Kube) -> None:
    kind = platform
    name = realpods.start(kind, "fault-sidecar", calls=3, rollouts=1)
    first = f"{name}-0-0"
    realpods.wait_answered(kind, name, first, 0)
    realpods.release(kind, name, first, 1)
    realpods.wait_answered(kind, name, first, 1)
    realpods.kill_container(realpods.pod(kind, name, first), SIDECAR)
    status = realpods.wait_restarted(kind, name, first, SIDECAR, 1)
    assert status["lastState"]["terminated"]["exitCode"] == 137, status[
        "lastState"
    ]  # SIGKILL, not a clean stop
    realpods.release(kind, name, first, 2)  # through the restarted sidecar
    job = finish(kind, name)
    assert job["status"]["counts"]["succeeded"] == 1, job["status"]["counts"]
    assert [p["metadata"]["name"] for p in realpods.pods_of(kind, name, name)] == [first]
    check_exactly_once(realpods.store_summary(kind, name), {("t0", 0): [0, 1, 2]})
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(900)
def test_a_deleted_pod_is_run_again_as_a_new_attempt(platform: kube_cluster.Kube) -> None:
    kind = platform
    name = realpods.start(kind, "fault-delete", calls=2, rollouts=1, maxAttemptsPerRollout=2)
    first, second = f"{name}-0-0", f"{name}-0-1"
    realpods.wait_answered(kind, name, first, 0)
    asked = time.monotonic()
    kind.kubectl("-n", name, "delete", "pod", first, "--wait=true", timeout=180)
    # the harness's entrypoint passes the TERM on (as PID 1 it would ignore it, and the
    # deletion would wait out the 30 s grace period before the kubelet's SIGKILL)
    assert time.monotonic() - asked < 20, (
        f"deleting a running pod took {time.monotonic() - asked:.0f} s"
    )
    realpods.wait_ready(kind, name, second, timeout=180)
    realpods.wait_answered(kind, name, second, 0)
    realpods.release(kind, name, second, 1)
    job = finish(kind, name)
    assert job["status"]["counts"]["succeeded"] == 1 and job["status"]["counts"]["retried"] == 1, (
        job["status"]["counts"]
    )
    assert [p["metadata"]["name"] for p in realpods.pods_of(kind, name, name)] == [second]
    summary = realpods.store_summary(kind, name)
    # the deleted attempt is kept as what it was (stopped: cut off, its one call), never merged into
    # the new one
    check_exactly_once(summary, {("t0", 0): [0], ("t0", 1): [0, 1]})
    statuses = {r["attempt"]: r["status"] for r in summary["rollouts"]}
    assert statuses == {0: "stopped", 1: "succeeded"}, statuses
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(1200)
def test_pods_deleted_while_the_operator_is_down_wait_for_it_and_nothing_is_dropped(
    platform: kube_cluster.Kube,
) -> None:
    """The operator's finalizer holds a rollout pod until its outcome is recorded. A running
    pod deleted while no operator runs stays, stopped, until the operator judges it: a
    failed attempt, run again under the next attempt number (under the same name, the
    new attempt's records would be dropped as duplicates of the old one's). A finished pod
    deleted meanwhile is not run again."""
    kind = platform
    name = realpods.start(kind, "fault-down", calls=2, rollouts=2, maxAttemptsPerRollout=2)
    running, done, again = f"{name}-0-0", f"{name}-1-0", f"{name}-0-1"
    for each in (running, done):
        realpods.wait_answered(kind, name, each, 0)
    with realpods.operator_down(kind):
        realpods.release(kind, name, done, 1)
        kube_cluster.wait_for(
            lambda: realpods.pod(kind, name, done)["status"].get("phase") == "Succeeded",
            what=f"{done} finished",
            timeout=180,
            interval=1,
        )
        time.sleep(2)  # deleted in the second it finished, a pod counts as stopped by it
        kind.kubectl("-n", name, "delete", "pod", running, done, "--wait=false")

        def stopped() -> bool:
            return realpods.pod(kind, name, running)["status"].get("phase") == "Failed"

        kube_cluster.wait_for(stopped, what=f"{running} stopped", timeout=120, interval=1)
        for each in (running, done):
            held = realpods.pod(kind, name, each)["metadata"]
            assert held.get("deletionTimestamp") and held["finalizers"] == [
                "openforge.dev/attempt-record"
            ], held
        stopped_by = realpods.container_status(realpods.pod(kind, name, running), "harness")
        verdict = json.loads(stopped_by["state"]["terminated"]["message"])
        assert (verdict["status"], verdict["stopped"]) == ("failed", True), verdict
    realpods.wait_ready(kind, name, again)
    annotations = realpods.pod(kind, name, again)["metadata"]["annotations"]
    assert json.loads(annotations["openforge.dev/earlier-attempts"]) == [
        {"attempt": 0, "exitCode": 143, "reason": None}  # the TERM passed on to the harness
    ], annotations
    realpods.wait_answered(kind, name, again, 0)
    realpods.release(kind, name, again, 1)
    job = finish(kind, name)
    status = job["status"]
    assert status["counts"]["succeeded"] == 2 and status["counts"]["retried"] == 1, status
    assert status["completedIndexes"] == "0-1", status
    # the deleted ones are gone, and a finished job lets the last one go too
    kube_cluster.wait_for(
        lambda: (
            [
                (p["metadata"]["name"], p["metadata"].get("finalizers"))
                for p in realpods.pods_of(kind, name, name)
            ]
            == [(again, None)]
        ),
        what="every pod let go once the job finished",
        timeout=60,
        interval=1,
    )
    summary = realpods.store_summary(kind, name)
    check_exactly_once(summary, {("t0", 0): [0], ("t0", 1): [0, 1], ("t1", 0): [0, 1]})
    statuses = {(r["task"], r["attempt"]): r["status"] for r in summary["rollouts"]}
    assert statuses == {
        ("t0", 0): "stopped",
        ("t0", 1): "succeeded",
        ("t1", 0): "succeeded",
    }, statuses
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(1200)
def test_a_killed_operator_makes_no_duplicate_pods(platform: kube_cluster.Kube) -> None:
    kind = platform
    name = realpods.start(kind, "fault-operator", calls=2, rollouts=4, parallelism=2)
    running = [f"{name}-0-0", f"{name}-1-0"]
    for each in running:
        realpods.wait_answered(kind, name, each, 0)
    operator = realpods.operator_pod(kind)
    realpods.kill_container(operator, "operator")
    for each in running:  # these finish while the operator is down
        realpods.release(kind, name, each, 1)
    realpods.wait_restarted(
        kind,
        "openforge",
        operator["metadata"]["name"],
        "operator",
        realpods.container_status(operator, "operator")["restartCount"] + 1,
    )
    later = [f"{name}-2-0", f"{name}-3-0"]
    for each in later:
        realpods.wait_answered(kind, name, each, 0)
        realpods.release(kind, name, each, 1)
    job = finish(kind, name)
    assert job["status"]["counts"]["succeeded"] == 4 and job["status"]["counts"]["retried"] == 0, (
        job["status"]["counts"]
    )
    assert sorted(p["metadata"]["name"] for p in realpods.pods_of(kind, name, name)) == sorted(
        running + later
    )
    check_exactly_once(realpods.store_summary(kind, name), {(f"t{i}", 0): [0, 1] for i in range(4)})
    kind.kubectl("delete", "namespace", name, "--wait=false")


@contextlib.contextmanager
def collector_unreachable(kind: kube_cluster.Kube) -> Iterator[None]:
    """The collector's Service selects no pod while inside (new connections fail)."""
    service = ["-n", "openforge", "patch", "service", "openforge-collector", "--type=merge", "-p"]
    kind.kubectl(*service, '{"spec": {"selector": {"openforge.dev/unreachable": "true"}}}')
    try:
        yield
    finally:
        kind.kubectl(*service, '{"spec": {"selector": {"openforge.dev/unreachable": null}}}')


@pytest.mark.timeout(900)
def test_records_wait_in_the_spool_while_the_collector_is_down(platform: kube_cluster.Kube) -> None:
    kind = platform
    name = realpods.start(kind, "fault-collector", calls=2, rollouts=1)
    first = f"{name}-0-0"
    realpods.wait_answered(kind, name, first, 0)
    kube_cluster.wait_for(
        lambda: bool(realpods.store_summary(kind, name)["rollouts"]),
        what="call 0 stored",
        timeout=120,
        interval=2,
    )
    collector = realpods.pod(kind, "openforge", realpods.collector_pod(kind))
    restarts = realpods.container_status(collector, "collector")["restartCount"]
    with collector_unreachable(kind):
        realpods.kill_container(collector, "collector")  # its open streams die with it
        realpods.wait_restarted(
            kind, "openforge", collector["metadata"]["name"], "collector", restarts + 1
        )
        realpods.release(kind, name, first, 1)
        realpods.wait_answered(kind, name, first, 1)
        time.sleep(10)  # time enough for a delivery, were the collector reachable
        held = realpods.store_summary(kind, name)
        assert calls_by_rollout(held) == {("t0", 0): [0]}, (
            f"call 1 reached the store with the collector down: {held['rollouts']}"
        )
        assert not held["rollouts"][0]["finished"], held["rollouts"]
        # and the sidecar, holding unacknowledged records, crashes too: its spool is what it resumes
        # from
        realpods.kill_container(realpods.pod(kind, name, first), SIDECAR)
        realpods.wait_restarted(kind, name, first, SIDECAR, 1)
    job = finish(kind, name)
    assert job["status"]["counts"]["succeeded"] == 1, job["status"]["counts"]
    check_exactly_once(realpods.store_summary(kind, name), {("t0", 0): [0, 1]})
    kind.kubectl("delete", "namespace", name, "--wait=false")


@contextlib.contextmanager
def store_on_a_volume(kind: kube_cluster.Kube) -> Iterator[None]:
    """The trainer's store on a PersistentVolumeClaim while inside (the chart's default;
    the demo's values keep it in an emptyDir, which goes with the pod). kind's node has
    no provisioner here: the claim is bound to a hostPath volume made for the test,
    owned by the trainer's user (a hostPath volume gets no ``fsGroup``)."""
    node = realpods.pod(kind, "openforge", realpods.collector_pod(kind))["spec"]["nodeName"]
    name = f"store-{uuid.uuid4().hex[:6]}"
    path = f"/var/lib/openforge-test/{name}"
    realpods.node_exec(node, "sh", "-c", f"mkdir -p {path} && chown 65532:65532 {path}")
    volume = {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"openforge-{name}"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                 "hostPath": {"path": path, "type": "Directory"},
                 "claimRef": {"namespace": "openforge", "name": name}},
    }  # fmt: skip
    claim = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "openforge"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "volumeName": f"openforge-{name}", "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip
    kind.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([volume, claim]))
    try:
        realpods.ensure_platform(
            kind, "trainer.persistence.enabled=true", f"trainer.persistence.existingClaim={name}"
        )
        yield
    finally:
        realpods.ensure_platform(kind)
        kind.kubectl(
            "-n", "openforge", "delete", "pvc", name, "--wait=true", check=False, timeout=300
        )
        kind.kubectl("delete", "pv", f"openforge-{name}", "--wait=true", check=False, timeout=300)
        realpods.node_exec(node, "rm", "-rf", path)


@pytest.mark.timeout(1500)
def test_a_replaced_collector_pod_loses_nothing(platform: kube_cluster.Kube) -> None:
    """The trainer pod (collector and trainer) deleted mid-rollout: its Deployment makes a
    new one on the same store. What was stored stays; the call made while no collector
    ran waits in the spool and reaches the new pod (a new address behind the Service)."""
    kind = platform
    with store_on_a_volume(kind):
        name = realpods.start(kind, "fault-store", calls=3, rollouts=1)
        first = f"{name}-0-0"
        realpods.wait_answered(kind, name, first, 0)
        kube_cluster.wait_for(
            lambda: bool(realpods.store_summary(kind, name)["rollouts"]),
            what="call 0 stored",
            timeout=120,
            interval=2,
        )
        old = realpods.collector_pod(kind)
        kind.kubectl("-n", "openforge", "delete", "pod", old, "--wait=false")
        realpods.release(kind, name, first, 1)  # answered by the policy server, held by the sidecar
        realpods.wait_answered(kind, name, first, 1)
        kind.kubectl(
            "-n", "openforge", "wait", "--for=delete", f"pod/{old}", "--timeout=300s", timeout=330
        )
        kube_cluster.wait_for(
            lambda: replacement_ready(kind, old),
            what="a new trainer pod ready",
            timeout=600,
            interval=2,
        )
        realpods.release(kind, name, first, 2)
        job = finish(kind, name)
        assert job["status"]["counts"]["succeeded"] == 1, job["status"]["counts"]
        check_exactly_once(realpods.store_summary(kind, name), {("t0", 0): [0, 1, 2]})
        kind.kubectl("delete", "namespace", name, "--wait=false")


def replacement_ready(kind: kube_cluster.Kube, old: str) -> bool:
    pods = kind.get_json("-n", "openforge", "pods", "-l", "app.kubernetes.io/component=trainer")[
        "items"
    ]
    return any(
        p["metadata"]["name"] != old
        and p["status"].get("phase") == "Running"
        and all(c.get("ready") for c in p["status"].get("containerStatuses", []))
        for p in pods
    )
