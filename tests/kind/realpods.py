"""Helpers of the kind tier: the chart and demo installed by ``scripts/kind-up.sh``, jobs
waited for, pods' container statuses, and the collector's store read inside its pod."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import kube_cluster

ROOT = Path(__file__).resolve().parents[2]
KIND_UP = ROOT / "scripts" / "kind-up.sh"
EXAMPLES = ROOT / "examples" / "cluster"
STORE_SUMMARY = Path(__file__).with_name("store_summary.py")


def kind_up(kind: kube_cluster.Kube, *args: str, timeout: float = 900) -> str:
    env = {**os.environ, "KUBECTL": kind.kubectl_path}
    result = subprocess.run(["bash", str(KIND_UP), *args], capture_output=True, text=True, timeout=timeout, check=False, env=env)
    assert result.returncode == 0, f"kind-up.sh {' '.join(args)} exited {result.returncode}:\n{result.stderr[-6000:]}"
    return result.stdout


def collector_pod(kind: kube_cluster.Kube) -> str:
    pods = kind.get_json("-n", "openforge", "pods", "-l", "app.kubernetes.io/component=trainer")["items"]
    running = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    assert running, f"no running trainer pod: {[p['status'].get('phase') for p in pods]}"
    return running[0]


def store_summary(kind: kube_cluster.Kube, job: str) -> dict[str, Any]:
    """The job's rollouts, calls and lost records, read from the collector's store in its pod."""
    result = kind.kubectl(
        "-n", "openforge", "exec", "-i", collector_pod(kind), "-c", "collector", "--",
        "python", "-", "/data/store.db", job, stdin=STORE_SUMMARY.read_text(), timeout=120,
    )  # fmt: skip
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary


def condition(obj: dict[str, Any], kind_: str) -> bool:
    return any(c["type"] == kind_ and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


def wait_job(kind: kube_cluster.Kube, namespace: str, name: str, *, timeout: float) -> dict[str, Any]:
    """The RolloutJob once Complete or Failed (or as it stands at the timeout)."""
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = kind.get_json("-n", namespace, "rolloutjob", name)
        if condition(job, "Complete") or condition(job, "Failed"):
            break
        time.sleep(5)
    return job


def events(kind: kube_cluster.Kube, namespace: str) -> str:
    return kind.kubectl("-n", namespace, "get", "events", "--sort-by=.lastTimestamp").stdout


def started_at(status: dict[str, Any]) -> str:
    state = status.get("state", {})
    for phase in ("running", "terminated"):
        if phase in state:
            return str(state[phase]["startedAt"])
    raise AssertionError(f"container {status['name']} never started: {state}")


def check_sidecar_first(pod: dict[str, Any]) -> None:
    """The native sidecar started (its probe passed) before the harness, and never restarted."""
    name = pod["metadata"]["name"]
    init = {s["name"]: s for s in pod["status"].get("initContainerStatuses", [])}
    main = {s["name"]: s for s in pod["status"].get("containerStatuses", [])}
    sidecar, harness = init["openforge-sidecar"], main["harness"]
    assert sidecar["restartCount"] == 0, f"{name}: the sidecar restarted"
    assert started_at(sidecar) <= started_at(harness), f"{name}: the harness started before the sidecar"
    assert harness["state"]["terminated"]["exitCode"] == 0, f"{name}: {harness['state']}"


def pods_of(kind: kube_cluster.Kube, namespace: str, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kind.get_json("-n", namespace, "pods", "-l", f"openforge.dev/job={job}")["items"]
    return items


def ensure_namespace(kind: kube_cluster.Kube, namespace: str) -> None:
    kind.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", timeout=300)
    kind.kubectl("create", "namespace", namespace)


POLICY_ENDPOINT = "http://policy.rl.svc:8000"
"""The demo's policy server (``examples/cluster/policy.yaml`` in namespace rl)."""
COLLECTOR_ENDPOINT = "openforge-collector.openforge.svc:50051"
"""The chart's collector, release openforge in namespace openforge."""


def rollout_job(name: str, *, env: str, tasks: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A RolloutJob of one sample per task, one attempt each, against the demo's policy
    server and the chart's collector; ``spec`` adds or overrides fields."""
    return {
        "apiVersion": "openforge.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": name},
        "spec": {
            "harnessEnvRef": {"name": env},
            "tasks": {"inline": tasks},
            "samplesPerTask": 1,
            "maxAttemptsPerRollout": 1,
            "policy": {"endpoint": POLICY_ENDPOINT, "model": "tiny-react"},
            "trainer": {"endpoint": COLLECTOR_ENDPOINT},
            **spec,
        },
    }


def helm_path() -> str:
    bin_dir = kube_cluster.built_binaries()
    assert bin_dir is not None, "no helm: run scripts/build_cluster_binaries.sh"
    return str(bin_dir / "helm")


def ensure_platform(kind: kube_cluster.Kube) -> None:
    """The chart (operator, collector + trainer) and the demo's policy server, as
    ``kind-up.sh demo`` installs them, without the demo's RolloutJob."""
    result = subprocess.run(
        [helm_path(), "--kubeconfig", str(kind.kubeconfig), "upgrade", "--install", "openforge", str(ROOT / "charts" / "openforge"),
         "--namespace", "openforge", "--create-namespace", "-f", str(EXAMPLES / "helm" / "values.yaml"), "--wait", "--timeout", "10m"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"helm upgrade --install: {result.stderr[-4000:]}"
    kind.kubectl("create", "namespace", "rl", check=False)
    kind.kubectl("-n", "rl", "apply", "-f", str(EXAMPLES / "policy.yaml"))
    kind.kubectl("-n", "rl", "rollout", "status", "deployment/policy", "--timeout=600s", timeout=660)
