"""The test control plane does what the operator's tests rely on.

Runs against the local simulated cluster (scripts/cluster.sh) or, with
$KUBECONFIG set, any cluster: pods run ``busybox`` with a command that exits
as the kwok annotations simulate, so each check means the same on both.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from kube_cluster import Kube, KubectlError

pytestmark = pytest.mark.cluster

IMAGE = "busybox:1.36"
ROLLOUT_LABEL = "openforge.dev/rollout"
EXIT_CODE_ANNOTATION = "openforge.dev/simulate-exit-code"


def rollout_pod(name: str, *, exit_code: int) -> str:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {ROLLOUT_LABEL: name},
            "annotations": {
                EXIT_CODE_ANNOTATION: str(exit_code),
                "openforge.dev/simulate-duration": "200ms",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "harness", "image": IMAGE, "command": ["sh", "-c", f"exit {exit_code}"]}
            ],
            # A native sidecar, as the operator writes the capture sidecar.
            "initContainers": [
                {
                    "name": "sidecar",
                    "image": IMAGE,
                    "restartPolicy": "Always",
                    "command": ["sleep", "3600"],
                },
            ],
        },
    }
    return json.dumps(pod)


def wait_phase(kube: Kube, namespace: str, pod: str, phase: str) -> dict[str, Any]:
    kube.kubectl(
        "-n",
        namespace,
        "wait",
        f"pod/{pod}",
        f"--for=jsonpath={{.status.phase}}={phase}",
        "--timeout=120s",
        timeout=130,
    )
    return kube.get_json("-n", namespace, "pod", pod)


def test_api_server_is_ready_and_recent(kube: Kube) -> None:
    assert kube.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    server = json.loads(kube.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert (int(server["major"]), int(server["minor"].rstrip("+"))) >= (1, 34), server


def test_namespace_is_created_and_finalized(kube: Kube) -> None:
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", name)
    kube.kubectl("-n", name, "create", "configmap", "leftover", "--from-literal=k=v")
    assert kube.get_json("namespace", name)["status"]["phase"] == "Active"
    # --wait returns once the namespace controller has emptied and removed it.
    kube.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", timeout=130)
    missing = kube.kubectl("get", "namespace", name, check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


def test_rollout_pod_is_scheduled_and_succeeds(kube: Kube, namespace: str) -> None:
    kube.apply(rollout_pod("ok-0", exit_code=0), namespace)
    pod = wait_phase(kube, namespace, "ok-0", "Succeeded")
    node = kube.get_json("node", pod["spec"]["nodeName"])
    if kube.simulated():
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    [harness] = pod["status"]["containerStatuses"]
    assert harness["state"]["terminated"]["exitCode"] == 0
    [sidecar] = pod["status"]["initContainerStatuses"]
    assert "terminated" in sidecar["state"]


def test_rollout_pod_fails_with_its_exit_code(kube: Kube, namespace: str) -> None:
    kube.apply(rollout_pod("fail-0", exit_code=3), namespace)
    pod = wait_phase(kube, namespace, "fail-0", "Failed")
    [harness] = pod["status"]["containerStatuses"]
    assert harness["state"]["terminated"]["exitCode"] == 3


def test_owned_pod_is_garbage_collected_with_its_owner(kube: Kube, namespace: str) -> None:
    kube.kubectl("-n", namespace, "create", "configmap", "owner", "--from-literal=k=v")
    owner = kube.get_json("-n", namespace, "configmap", "owner")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "owned",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "owner",
                    "uid": owner["metadata"]["uid"],
                }
            ],
        },
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": IMAGE, "command": ["sleep", "3600"]}],
        },
    }
    kube.apply(json.dumps(pod), namespace)
    wait_phase(kube, namespace, "owned", "Running")
    kube.kubectl("-n", namespace, "delete", "configmap", "owner")
    kube.kubectl(
        "-n", namespace, "wait", "pod/owned", "--for=delete", "--timeout=120s", timeout=130
    )


def test_indexed_job_completes(kube: Kube, namespace: str) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "indexed"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 5,
            "parallelism": 5,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "c",
                            "image": IMAGE,
                            "command": ["sh", "-c", 'test -n "$JOB_COMPLETION_INDEX"'],
                        }
                    ],
                }
            },
        },
    }
    kube.apply(json.dumps(job), namespace)
    kube.kubectl(
        "-n",
        namespace,
        "wait",
        "job/indexed",
        "--for=condition=Complete",
        "--timeout=180s",
        timeout=190,
    )
    status = kube.get_json("-n", namespace, "job", "indexed")["status"]
    assert status["succeeded"] == 5
    assert status["completedIndexes"] == "0-4"


def test_rbac_is_enforced_for_service_accounts(kube: Kube, namespace: str) -> None:
    kube.kubectl("-n", namespace, "create", "serviceaccount", "reader")
    who = f"system:serviceaccount:{namespace}:reader"
    with pytest.raises(KubectlError, match=r"\(Forbidden\).*cannot list resource \"pods\""):
        kube.kubectl("-n", namespace, "get", "pods", f"--as={who}")
    kube.kubectl(
        "-n", namespace, "create", "role", "pod-reader", "--verb=get,list", "--resource=pods"
    )
    kube.kubectl(
        "-n",
        namespace,
        "create",
        "rolebinding",
        "reader",
        "--role=pod-reader",
        f"--serviceaccount={namespace}:reader",
    )
    kube.kubectl("-n", namespace, "get", "pods", f"--as={who}")
    denied = kube.kubectl(
        "-n", namespace, "auth", "can-i", "delete", "pods", f"--as={who}", check=False
    )
    assert denied.stdout.strip() == "no"
