"""What happens to a rollout pod from outside, judged as docs/operator.md says (attempts.py),
in real pods: evicted by the kubelet, evicted through the Eviction API, preempted by the
scheduler, and an image that cannot be pulled.

Each job allows two attempts and fails the rollout at once on the reason under test
(``failurePolicy``: that reason -> FailRollout). Judged as that reason, the rollout fails
with no second pod; judged as anything else, the default Retry would start attempt 1.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import kube_cluster
import pytest
import realpods
import yaml

pytestmark = [pytest.mark.kind, pytest.mark.slow]

FILLER = (
    realpods.ONE_CALL
    + """
import os, time
if os.environ.get("FILL_MB"):
    # past the volume's sizeLimit: the kubelet evicts the pod
    with open("/scratch/fill", "wb") as out:
        out.write(b"x" * int(os.environ["FILL_MB"]) * 1024 * 1024)
time.sleep(600)
"""
)


def harness_env(
    name: str,
    *,
    image: str = realpods.HARNESS_IMAGE,
    fill_mb: int = 0,
    timeout: int = 600,
    cpu: str = "20m",
    priority_class: str = "",
) -> dict[str, Any]:
    """A harness that makes one call, then (``fill_mb``) overfills its 2 MiB scratch volume, then
    waits."""
    env: dict[str, Any] = {
        "apiVersion": "openforge.dev/v1alpha1", "kind": "HarnessEnv", "metadata": {"name": name},
        "spec": {
            "api": "openai-chat",
            "baseUrl": {"env": ["OPENAI_BASE_URL"], "suffix": "/v1"},
            "template": {"spec": {
                "containers": [{
                    "name": "harness", "image": image, "command": ["python3", "-c", FILLER],
                    "env": [{"name": "FILL_MB", "value": str(fill_mb or "")}],
                    "resources": {"requests": {"cpu": cpu, "memory": "64Mi"},
                                  "limits": {"memory": "256Mi"}},
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }],
                "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "2Mi"}}],
            }},
            "timeoutSeconds": timeout,
        },
    }  # fmt: skip
    if priority_class:
        env["spec"]["template"]["spec"]["priorityClassName"] = priority_class
    return env


def start(
    kind: kube_cluster.Kube, prefix: str, reason: str, env: dict[str, Any], **spec: Any
) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    realpods.ensure_namespace(kind, name)
    env["metadata"]["name"] = name
    job = realpods.rollout_job(
        name, env=name, tasks=[{"id": "t0"}], maxAttemptsPerRollout=2,
        failurePolicy={"rules": [{"action": "FailRollout", "onReasons": [reason]}]}, **spec,
    )  # fmt: skip
    realpods.apply(kind, name, env, job)
    return name


def status_of(kind: kube_cluster.Kube, namespace: str, pod: str) -> dict[str, Any]:
    """The pod's status; empty while the pod does not exist yet."""
    found = kind.kubectl("-n", namespace, "get", "pod", pod, "-o", "json", check=False)
    return dict(json.loads(found.stdout)["status"]) if found.returncode == 0 else {}


def failed_as(kind: kube_cluster.Kube, name: str, reason: str, *, timeout: float) -> dict[str, Any]:
    """The job once Failed: its one rollout failed on the first attempt, for ``reason``."""
    job = realpods.wait_job(kind, name, name, timeout=timeout)
    assert realpods.condition(job, "Failed"), job["status"]
    assert job["status"]["failedIndexes"] == "0" and job["status"]["counts"]["retried"] == 0, job[
        "status"
    ]
    assert [p["metadata"]["name"] for p in realpods.pods_of(kind, name, name)] in (
        [f"{name}-0-0"],
        [],
    ), "a second attempt ran"
    events = realpods.events(kind, name)
    assert f"rollouts 0 failed: 0 after attempt 0 ({reason}" in events, events[
        -3000:
    ]  # the operator's RolloutsFailed
    return job


@pytest.mark.timeout(900)
def test_a_pod_the_kubelet_evicts_is_judged_evicted(platform: kube_cluster.Kube) -> None:
    """The kubelet's eviction manager evicts the pod whose emptyDir outgrew its sizeLimit
    (phase Failed, reason Evicted); the call made before is stored."""
    kind = platform
    name = start(kind, "fate-kubelet", "Evicted", harness_env("", fill_mb=20))
    first = f"{name}-0-0"
    realpods.wait_answered(kind, name, first, 0)
    evicted = lambda: status_of(kind, name, first).get("reason") == "Evicted"  # noqa: E731
    kube_cluster.wait_for(evicted, what=f"{first} evicted by the kubelet", timeout=300, interval=2)
    failed_as(kind, name, "Evicted", timeout=300)
    [rollout] = realpods.store_summary(kind, name)["rollouts"]
    assert [c["index"] for c in rollout["calls"]] == [0], rollout
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(900)
def test_a_pod_evicted_through_the_api_is_judged_evicted(platform: kube_cluster.Kube) -> None:
    """An Eviction (what ``kubectl drain`` sends) deletes the pod with a DisruptionTarget
    condition; the stopped sidecar records the rollout as stopped and flushes its spool."""
    kind = platform
    name = start(kind, "fate-evict", "Evicted", harness_env(""))
    first = f"{name}-0-0"
    realpods.wait_answered(kind, name, first, 0)
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": first, "namespace": name},
    }
    kind.kubectl(
        "create",
        "--raw",
        f"/api/v1/namespaces/{name}/pods/{first}/eviction",
        "-f",
        "-",
        stdin=json.dumps(eviction),
    )
    failed_as(kind, name, "Evicted", timeout=300)

    def recorded() -> bool:
        rollouts = realpods.store_summary(kind, name)["rollouts"]
        return bool(rollouts) and bool(rollouts[0]["finished"])

    kube_cluster.wait_for(recorded, what=f"{first} recorded as finished", timeout=120, interval=2)
    [rollout] = realpods.store_summary(kind, name)["rollouts"]
    assert rollout["status"] == "stopped" and not rollout["has_reward"], rollout
    assert [c["index"] for c in rollout["calls"]] == [0], rollout
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(900)
def test_a_harness_image_that_cannot_be_pulled_fails_the_attempt_at_its_deadline(
    platform: kube_cluster.Kube,
) -> None:
    """The harness image is on no registry the node can reach (a refused address inside
    the node, so nothing leaves it): the harness waits in ErrImagePull/ImagePullBackOff
    until the pod's activeDeadlineSeconds, and the attempt is ImagePullFailed."""
    kind = platform
    env = harness_env("", image="127.0.0.1:1/openforge/no-such-harness:0", timeout=5)
    name = start(kind, "fate-pull", "ImagePullFailed", env)
    first = f"{name}-0-0"

    def pulling() -> bool:
        statuses = status_of(kind, name, first).get("containerStatuses", [])
        waiting = [
            (s.get("state") or {}).get("waiting", {}).get("reason")
            for s in statuses
            if s["name"] == "harness"
        ]
        return bool(waiting) and waiting[0] in ("ErrImagePull", "ImagePullBackOff")

    kube_cluster.wait_for(
        pulling, what=f"{first}'s harness image pull failing", timeout=180, interval=2
    )
    failed_as(kind, name, "ImagePullFailed", timeout=600)
    kind.kubectl("delete", "namespace", name, "--wait=false")


def millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def free_cpu(kind: kube_cluster.Kube, node: str) -> int:
    """Millicores of the node's allocatable CPU that no live pod requests (as the scheduler
    counts)."""
    allocatable = millicores(kind.get_json("node", node)["status"]["allocatable"]["cpu"])
    described = kind.kubectl("describe", "node", node).stdout
    allocated = described.split("Allocated resources:", 1)[1]
    line = next(row for row in allocated.splitlines() if row.strip().startswith("cpu "))
    return allocatable - millicores(line.split()[1])


@pytest.mark.timeout(900)
def test_a_pod_the_scheduler_preempts_is_judged_preempted(platform: kube_cluster.Kube) -> None:
    """A pod of higher priority that fits the node only in the rollout pod's place: the
    scheduler marks the rollout pod (priority -100, the lowest on the node) with
    DisruptionTarget PreemptionByScheduler and deletes it; the attempt is Preempted."""
    kind = platform
    suffix = uuid.uuid4().hex[:6]
    low, high = f"fate-low-{suffix}", f"fate-high-{suffix}"
    classes = [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": low},
            "value": -100,
        },
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": high},
            "value": 1000,
        },
    ]
    kind.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(classes))
    try:
        name = start(
            kind, "fate-preempt", "Preempted", harness_env("", cpu="300m", priority_class=low)
        )
        first = f"{name}-0-0"
        realpods.wait_answered(kind, name, first, 0)
        node = realpods.pod(kind, name, first)["spec"]["nodeName"]
        wanted = free_cpu(kind, node) + 150  # fits only once the rollout pod's 300m are free
        preemptor = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "preemptor"},
            "spec": {
                "priorityClassName": high, "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "containers": [{"name": "c", "image": realpods.HARNESS_IMAGE,
                                "imagePullPolicy": "Never", "command": ["sleep", "60"],
                                "resources": {"requests": {"cpu": f"{wanted}m"}}}],
            },
        }  # fmt: skip
        kind.kubectl("-n", name, "apply", "-f", "-", stdin=yaml.safe_dump(preemptor))
        failed_as(kind, name, "Preempted", timeout=300)
        kube_cluster.wait_for(
            lambda: bool(status_of(kind, name, "preemptor").get("podIP")),
            what="the preemptor running",
            timeout=180,
            interval=2,
        )
        kind.kubectl("delete", "namespace", name, "--wait=false")
    finally:
        kind.kubectl("delete", "priorityclass", low, high, "--ignore-not-found", check=False)


@pytest.mark.timeout(900)
def test_a_rollout_the_collector_never_acknowledged_is_sidecar_failed(
    platform: kube_cluster.Kube,
) -> None:
    """A job whose token the collector refuses (a job token whose MAC is not the master
    key's): its records are never acknowledged, so the in-pod agent's verdict is
    SidecarFailed, and the rollout is never counted as captured (nothing stored)."""
    kind = platform
    name = f"fate-token-{uuid.uuid4().hex[:6]}"
    realpods.ensure_namespace(kind, name)
    identity = base64.urlsafe_b64encode(f"{name}/{name}/0".encode()).rstrip(b"=").decode()
    forged = base64.urlsafe_b64encode(b"\0" * 32).rstrip(b"=").decode()
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "forged-token"},
              "stringData": {"token": f"ofj1.{identity}.{forged}"}}  # fmt: skip
    env = realpods.stepped_env(name, 1)
    job = realpods.rollout_job(
        name, env=name, tasks=[{"id": "t0"}], maxAttemptsPerRollout=2,
        failurePolicy={"rules": [{"action": "FailRollout", "onReasons": ["SidecarFailed"]}]},
    )  # fmt: skip
    job["spec"]["trainer"]["tokenSecretRef"] = {"name": "forged-token", "key": "token"}
    realpods.apply(kind, name, secret, env, job)
    failed_as(kind, name, "SidecarFailed", timeout=600)
    assert not realpods.store_summary(kind, name)["rollouts"]  # nothing was stored
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(900)
def test_exit_codes_are_judged_by_the_failure_policy(platform: kube_cluster.Kube) -> None:
    """With ``onExitCodes: In [3] -> Ignore``: task t0's harness exits 3, which the policy
    ignores, so the attempt is graded and succeeds (one pod); t1's exits 4 on its first
    attempt, which no rule matches, so with rules present it fails the attempt and the
    default Retry runs a second, which succeeds."""
    kind = platform
    name = f"fate-codes-{uuid.uuid4().hex[:6]}"
    realpods.ensure_namespace(kind, name)
    env = realpods.stepped_env(name, 1)
    harness = env["spec"]["template"]["spec"]["containers"][0]
    harness["command"] = ["sh", "-c", (
        'python3 -c "$CALL" || exit 9\n'
        'if [ "$OPENFORGE_TASK_ID" = t0 ]; then exit 3; fi\n'
        'if [ "$OPENFORGE_ATTEMPT" = 0 ]; then exit 4; fi'
    )]  # fmt: skip
    harness["env"].append({"name": "CALL", "value": realpods.ONE_CALL})
    job = realpods.rollout_job(
        name, env=name, tasks=[{"id": "t0"}, {"id": "t1"}], maxAttemptsPerRollout=2,
        parallelism=2,
        failurePolicy={"rules": [{"action": "Ignore",
                                  "onExitCodes": {"operator": "In", "values": [3]}}]},
    )  # fmt: skip
    realpods.apply(kind, name, env, job)
    done = realpods.wait_job(kind, name, name, timeout=400)
    assert realpods.condition(done, "Complete"), done["status"]
    assert done["status"]["counts"]["succeeded"] == 2, done["status"]
    pods = sorted(p["metadata"]["name"] for p in realpods.pods_of(kind, name, name))
    assert pods == [f"{name}-0-0", f"{name}-1-0", f"{name}-1-1"], pods
    for pod, code in ((f"{name}-0-0", 3), (f"{name}-1-0", 4), (f"{name}-1-1", 0)):
        status = realpods.container_status(realpods.pod(kind, name, pod), "harness")
        assert status["state"]["terminated"]["exitCode"] == code, (pod, status)
    rewards = {r["id"]: r["reward"] for r in realpods.store_summary(kind, name)["rollouts"]}
    assert rewards.get(f"{name}-0-0") == 1.0, rewards  # exit 3 graded as data
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(300)
def test_a_pod_deleted_before_it_was_scheduled_is_a_failed_attempt(
    platform: kube_cluster.Kube,
) -> None:
    """No kubelet ever ends a pod that was never bound to a node: held by the operator's
    finalizer, it would wait Pending forever as a live attempt. It is a failed attempt
    at once: let go, and the next attempt made (recording it as ``earlier``)."""
    kind = platform
    name = f"fate-unbound-{uuid.uuid4().hex[:6]}"
    realpods.ensure_namespace(kind, name)
    env = harness_env(name)
    env["spec"]["template"]["spec"]["nodeSelector"] = {"openforge.test/no-such-node": "true"}
    job = realpods.rollout_job(name, env=name, tasks=[{"id": "t0"}], maxAttemptsPerRollout=2)
    realpods.apply(kind, name, env, job)
    first, second = f"{name}-0-0", f"{name}-0-1"

    def unschedulable() -> bool:  # the operator may not have made the pod yet
        conditions = status_of(kind, name, first).get("conditions", [])
        return any(c.get("reason") == "Unschedulable" for c in conditions)

    kube_cluster.wait_for(unschedulable, what=f"{first} unschedulable", timeout=120, interval=1)
    kind.kubectl("-n", name, "delete", "pod", first, "--wait=false")
    kube_cluster.wait_for(
        lambda: [p["metadata"]["name"] for p in realpods.pods_of(kind, name, name)] == [second],
        what=f"{first} let go and {second} made",
        timeout=120,
        interval=1,
    )
    annotations = realpods.pod(kind, name, second)["metadata"]["annotations"]
    assert json.loads(annotations["openforge.dev/earlier-attempts"]) == [
        {"attempt": 0, "exitCode": None, "reason": None}
    ], annotations
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(900)
def test_a_same_named_job_in_another_namespace_has_its_records_refused(
    platform: kube_cluster.Kube,
) -> None:
    """The collector binds a job name to the first RolloutJob that writes under it: a
    job of the same name in another namespace (its own token, valid for its own
    namespace/name/uid) is refused, so its rollout is SidecarFailed, nothing of it is
    stored, and its sidecar's log names the job that holds the name."""
    kind = platform
    suffix = uuid.uuid4().hex[:6]
    job, first, second = f"fate-twin-{suffix}", f"fate-twin-a-{suffix}", f"fate-twin-b-{suffix}"
    for namespace in (first, second):
        realpods.ensure_namespace(kind, namespace)
        realpods.apply(
            kind, namespace, realpods.stepped_env(job, 1),
            realpods.rollout_job(
                job, env=job, tasks=[{"id": "t0"}], maxAttemptsPerRollout=2,
                failurePolicy={"rules": [{"action": "FailRollout",
                                          "onReasons": ["SidecarFailed"]}]},
            ),
        )  # fmt: skip
        done = realpods.wait_job(kind, namespace, job, timeout=600)
        if namespace == first:
            assert realpods.condition(done, "Complete"), done["status"]
            [stored] = realpods.store_summary(kind, job)["rollouts"]
            assert stored["id"] == f"{job}-0-0" and stored["finished"], stored
    assert realpods.condition(done, "Failed") and done["status"]["failedIndexes"] == "0", done
    assert "0 after attempt 0 (SidecarFailed" in realpods.events(kind, second)
    [pod] = realpods.pods_of(kind, second, job)
    log = kind.kubectl("-n", second, "logs", pod["metadata"]["name"], "-c", realpods.SIDECAR).stdout
    assert "belongs to" in log and first in log, log[-3000:]
    [stored] = realpods.store_summary(kind, job)["rollouts"]  # the first job's, unchanged
    assert stored["id"] == f"{job}-0-0" and len(stored["calls"]) == 1, stored
    for namespace in (first, second):
        kind.kubectl("delete", "namespace", namespace, "--wait=false")
