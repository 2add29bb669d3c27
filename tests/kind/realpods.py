"""Helpers of the kind tier: the chart and demo installed by ``scripts/kind-up.sh``, jobs
waited for, pods' container statuses, the collector's store read inside its pod,
containers SIGKILLed inside the node, the stepped harness (a call, then a gate file the
test writes, then the next call) and the test engine for harnesses with long prompts."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import kube_cluster
import yaml

ROOT = Path(__file__).resolve().parents[2]
KIND_UP = ROOT / "scripts" / "kind-up.sh"
EXAMPLES = ROOT / "examples" / "cluster"
STORE_SUMMARY = Path(__file__).with_name("store_summary.py")


def kind_up(kind: kube_cluster.Kube, *args: str, timeout: float = 900) -> str:
    env = {**os.environ, "KUBECTL": kind.kubectl_path}
    result = subprocess.run(
        ["bash", str(KIND_UP), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
    assert result.returncode == 0, (
        f"kind-up.sh {' '.join(args)} exited {result.returncode}:\n{result.stderr[-6000:]}"
    )
    return result.stdout


def collector_pod(kind: kube_cluster.Kube) -> str:
    pods = kind.get_json("-n", "openforge", "pods", "-l", "app.kubernetes.io/component=trainer")[
        "items"
    ]
    running = [
        p["metadata"]["name"]
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
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
    return any(
        c["type"] == kind_ and c["status"] == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )


def wait_job(
    kind: kube_cluster.Kube, namespace: str, name: str, *, timeout: float
) -> dict[str, Any]:
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
    """The native sidecar started before the harness (which waited for it to listen), and never
    restarted."""
    name = pod["metadata"]["name"]
    init = {s["name"]: s for s in pod["status"].get("initContainerStatuses", [])}
    main = {s["name"]: s for s in pod["status"].get("containerStatuses", [])}
    sidecar, harness = init["openforge-sidecar"], main["harness"]
    assert sidecar["restartCount"] == 0, f"{name}: the sidecar restarted"
    assert started_at(sidecar) <= started_at(harness), (
        f"{name}: the harness started before the sidecar"
    )
    assert harness["state"]["terminated"]["exitCode"] == 0, f"{name}: {harness['state']}"


def pods_of(kind: kube_cluster.Kube, namespace: str, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kind.get_json(
        "-n", namespace, "pods", "-l", f"openforge.dev/job={job}"
    )["items"]
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


def ensure_platform(kind: kube_cluster.Kube, *values: str, files: Iterable[Path] = ()) -> None:
    """The chart (operator, collector + trainer) and the demo's policy server, as
    ``kind-up.sh demo`` installs them, without the demo's RolloutJob; ``values`` are
    more ``--set`` settings of the chart and ``files`` more values files (none: back to
    the demo's own)."""
    sets = [arg for value in values for arg in ("--set", value)]
    sets += [arg for file in files for arg in ("-f", str(file))]
    result = subprocess.run(
        [helm_path(), "--kubeconfig", str(kind.kubeconfig),
         "upgrade", "--install", "openforge", str(ROOT / "charts" / "openforge"),
         "--namespace", "openforge", "--create-namespace",
         "-f", str(EXAMPLES / "helm" / "values.yaml"), *sets, "--wait", "--timeout", "10m"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"helm upgrade --install: {result.stderr[-4000:]}"
    kind.kubectl("create", "namespace", "rl", check=False)
    kind.kubectl("-n", "rl", "apply", "-f", str(EXAMPLES / "policy.yaml"))
    kind.kubectl(
        "-n", "rl", "rollout", "status", "deployment/policy", "--timeout=600s", timeout=660
    )


def operator_pod(kind: kube_cluster.Kube) -> dict[str, Any]:
    pods = kind.get_json("-n", "openforge", "pods", "-l", "app.kubernetes.io/component=operator")[
        "items"
    ]
    running = [
        p
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    assert len(running) == 1, (
        f"operator pods: {[(p['metadata']['name'], p['status'].get('phase')) for p in pods]}"
    )
    return running[0]


@contextlib.contextmanager
def operator_down(kind: kube_cluster.Kube) -> Iterator[None]:
    """The operator's Deployment scaled to zero (its pod gone) for the block, then back."""
    scale = ("-n", "openforge", "scale", "deployment/openforge-operator")
    kind.kubectl(*scale, "--replicas=0")
    try:
        kube_cluster.wait_for(
            lambda: (
                not kind.get_json(
                    "-n", "openforge", "pods", "-l", "app.kubernetes.io/component=operator"
                )["items"]
            ),
            what="the operator gone",
            timeout=120,
            interval=1,
        )
        yield
    finally:
        kind.kubectl(*scale, "--replicas=1")


def container_status(pod: dict[str, Any], container: str) -> dict[str, Any]:
    """The status of one container (native sidecars are init containers) of a pod."""
    for status in (
        *pod["status"].get("initContainerStatuses", []),
        *pod["status"].get("containerStatuses", []),
    ):
        if status["name"] == container:
            return dict(status)
    raise AssertionError(f"{pod['metadata']['name']}: no status of container {container}")


def node_exec(node: str, *args: str, timeout: float = 60) -> str:
    """Run a command inside a kind node (its container has the node's name)."""
    docker = shutil.which("docker")
    assert docker is not None, "no docker"
    result = subprocess.run(
        [docker, "exec", node, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, (
        f"{node}: {' '.join(args)} exited {result.returncode}: {result.stderr}"
    )
    return result.stdout


def kill_container(pod: dict[str, Any], container: str) -> None:
    """SIGKILL the processes of one running container of a pod, as a crash would: its
    first process is killed inside the node, which takes its whole PID namespace down."""
    node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
    ids = node_exec(
        node,
        "crictl",
        "ps",
        "-q",
        "--state",
        "running",
        "--label",
        f"io.kubernetes.pod.uid={uid}",
        "--name",
        f"^{container}$",
    ).split()
    assert len(ids) == 1, f"{pod['metadata']['name']}/{container}: running containers {ids}"
    pid = json.loads(node_exec(node, "crictl", "inspect", ids[0]))["info"]["pid"]
    node_exec(node, "kill", "-9", str(pid))


SIDECAR = "openforge-sidecar"
HARNESS_IMAGE = "ghcr.io/openforge/react-harness:0.1.0"
STEPPED = """
import json, os, sys, time, urllib.request
base, calls = os.environ["OPENAI_BASE_URL"], int(os.environ["STEP_CALLS"])
# touched: counted by the cgroup
hog = bytearray(int(os.environ.get("STEP_ALLOCATE_MB", "0")) * 1024 * 1024)
for offset in range(0, len(hog), 4096):
    hog[offset] = 1
for step in range(calls):
    gate, deadline = f"/work/go-{step}", time.monotonic() + 600
    while step and not os.path.exists(gate):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.2)
    body = json.dumps({
        "model": "tiny-react", "max_tokens": 8,
        "messages": [{"role": "user", "content": f"Step {step}: say hello."}],
    }).encode()
    for attempt in range(60):  # the sidecar may be restarting: connection refused until it is back
        try:
            request = urllib.request.Request(
                base + "/chat/completions", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                json.load(response)
            break
        except OSError as error:
            print(f"call {step} try {attempt}: {error}", flush=True)
            time.sleep(1)
    else:
        sys.exit(4)
    print(f"answered {step}", flush=True)
"""


ONE_CALL = """
import json, os, urllib.request
body = json.dumps({
    "model": "tiny-react", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]
}).encode()
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", body, {"Content-Type": "application/json"}
)
with urllib.request.urlopen(request, timeout=120) as response:
    json.load(response)
print("answered 0", flush=True)
"""
"""A harness's one Chat Completions call to ``$OPENAI_BASE_URL``, then ``answered 0``."""


def stepped_env(
    name: str, calls: int, *, allocate_mb: int = 0, memory_limit: str = "256Mi"
) -> dict[str, Any]:
    """A HarnessEnv whose harness makes ``calls`` calls, waiting before call N > 0 for
    ``/work/go-N`` (:func:`release`), after allocating ``allocate_mb`` MiB."""
    return {
        "apiVersion": "openforge.dev/v1alpha1",
        "kind": "HarnessEnv",
        "metadata": {"name": name},
        "spec": {
            "api": "openai-chat",
            "baseUrl": {"env": ["OPENAI_BASE_URL"], "suffix": "/v1"},
            "template": {"spec": {
                "containers": [{
                    "name": "harness", "image": HARNESS_IMAGE,
                    "command": ["python3", "-c", STEPPED],
                    "env": [{"name": "STEP_CALLS", "value": str(calls)},
                            {"name": "STEP_ALLOCATE_MB", "value": str(allocate_mb)}],
                    "resources": {"requests": {"cpu": "20m", "memory": "64Mi"},
                                  "limits": {"memory": memory_limit}},
                    "volumeMounts": [{"name": "work", "mountPath": "/work"}],
                }],
                "volumes": [{"name": "work", "emptyDir": {}}],
            }},
            "grader": {"command": ["sh", "-c", 'echo \'{"reward": 1.0}\''],
                       "rewardFrom": "stdout-json", "timeoutSeconds": 30},
            "timeoutSeconds": 600,
        },
    }  # fmt: skip


def start(
    kind: kube_cluster.Kube,
    prefix: str,
    *,
    calls: int,
    rollouts: int,
    allocate_mb: int = 0,
    memory_limit: str = "256Mi",
    **spec: Any,
) -> str:
    """A new namespace and job (named alike) of ``rollouts`` stepped rollouts; ``spec``
    adds to or overrides the job's spec."""
    # the collector binds a job's name to its first RolloutJob
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    ensure_namespace(kind, name)
    tasks = [{"id": f"t{i}"} for i in range(rollouts)]
    job = rollout_job(
        name,
        env=name,
        tasks=tasks,
        **{"parallelism": rollouts, "rolloutTimeoutSeconds": 900, **spec},
    )
    kind.kubectl(
        "-n",
        name,
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(
            [stepped_env(name, calls, allocate_mb=allocate_mb, memory_limit=memory_limit), job]
        ),
    )
    return name


def apply(kind: kube_cluster.Kube, namespace: str, *objects: dict[str, Any]) -> None:
    """``kubectl apply`` of ``objects`` in ``namespace``."""
    kind.kubectl("-n", namespace, "apply", "-f", "-", stdin=yaml.safe_dump_all(objects))


def owned_by(kind: kube_cluster.Kube, namespace: str, uid: str) -> set[str]:
    """The Secrets, ConfigMaps and NetworkPolicies of ``namespace`` that ``uid`` owns."""
    found = set()
    for resource in ("secrets", "configmaps", "networkpolicies"):
        for item in kind.get_json("-n", namespace, resource)["items"]:
            if any(ref.get("uid") == uid for ref in item["metadata"].get("ownerReferences", [])):
                found.add(f"{resource}/{item['metadata']['name']}")
    return found


def gone(kind: kube_cluster.Kube, namespace: str, items: Iterable[str]) -> bool:
    """Whether none of ``items`` (``resource/name``) exists in ``namespace`` any more."""
    return not any(
        kind.kubectl("-n", namespace, "get", item, "--ignore-not-found", check=False).stdout
        for item in items
    )


def delete_job_and_wait_collected(kind: kube_cluster.Kube, namespace: str, job: str) -> set[str]:
    """Delete RolloutJob ``job`` and wait until it, its pods and every Secret, ConfigMap and
    NetworkPolicy it owned are gone; what it owned."""
    uid = kind.get_json("-n", namespace, "rolloutjob", job)["metadata"]["uid"]
    made = owned_by(kind, namespace, uid)
    kind.kubectl("-n", namespace, "delete", "rolloutjob", job, "--wait=false")
    kube_cluster.wait_for(
        lambda: (
            not pods_of(kind, namespace, job)
            and gone(kind, namespace, {f"rolloutjob/{job}", *made})
        ),
        what=f"{job} and its {sorted(made)} collected",
        timeout=300,
        interval=2,
    )
    return made


def pod(kind: kube_cluster.Kube, namespace: str, name: str) -> dict[str, Any]:
    return kind.get_json("-n", namespace, "pod", name)


def wait_ready(kind: kube_cluster.Kube, namespace: str, name: str, timeout: float = 300) -> None:
    """Until pod ``name`` exists and is Ready (``kubectl wait`` alone fails on a pod not yet
    made)."""
    kube_cluster.wait_for(
        lambda: bool(kind.kubectl("-n", namespace, "get", "pod", name, check=False).stdout),
        what=f"{name} created",
        timeout=timeout,
        interval=1,
    )
    kind.kubectl(
        "-n", namespace, "wait", f"pod/{name}", "--for=condition=Ready",
        f"--timeout={int(timeout)}s", timeout=timeout + 20,
    )  # fmt: skip


def harness_log(kind: kube_cluster.Kube, namespace: str, name: str) -> str:
    return kind.kubectl("-n", namespace, "logs", name, "-c", "harness", check=False).stdout


def wait_answered(
    kind: kube_cluster.Kube, namespace: str, name: str, step: int, timeout: float = 300
) -> None:
    """Until the harness of pod ``name`` printed that call ``step`` was answered."""
    kube_cluster.wait_for(
        lambda: f"answered {step}" in harness_log(kind, namespace, name),
        what=f"{name}: call {step} answered",
        timeout=timeout,
        interval=1,
    )


def release(kind: kube_cluster.Kube, namespace: str, name: str, step: int) -> None:
    """Let pod ``name``'s harness make call ``step``."""
    kind.kubectl("-n", namespace, "exec", name, "-c", "harness", "--", "touch", f"/work/go-{step}")


def wait_restarted(
    kind: kube_cluster.Kube, namespace: str, name: str, container: str, restarts: int
) -> dict[str, Any]:
    """Until ``container`` of pod ``name`` restarted ``restarts`` times and is running (started)
    again."""

    def back() -> bool:
        status = container_status(pod(kind, namespace, name), container)
        return (
            status["restartCount"] >= restarts
            and bool(status.get("started"))
            and "running" in status["state"]
        )

    kube_cluster.wait_for(back, what=f"{name}/{container} restarted", timeout=300, interval=1)
    return container_status(pod(kind, namespace, name), container)


ENGINE_ENDPOINT = "http://engine.rl.svc:8000"
"""``openforge test-engine`` (deterministic, token-in/token-out, 32k context) in namespace rl:
for harnesses whose own prompt does not fit the tiny policy's 4,096 tokens."""


def ensure_engine(kind: kube_cluster.Kube) -> None:
    """The test engine as Deployment and Service ``engine`` in namespace rl, from the trainer
    image."""
    labels = {"app.kubernetes.io/name": "engine"}
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "engine", "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]},
    }  # fmt: skip
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "engine", "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
            "containers": [{
                "name": "engine", "image": "ghcr.io/openforge/trainer:0.1.0",
                "command": ["openforge", "test-engine", "--host=0.0.0.0", "--port=8000",
                            "--model=tiny-react", "--tokenizer=/opt/openforge/models/tiny-react",
                            "--max-model-len=32768"],
                "env": [{"name": "HOME", "value": "/tmp"}],
                "readinessProbe": {"httpGet": {"path": "/health", "port": 8000},
                                   "periodSeconds": 2},
                "resources": {"requests": {"cpu": "50m", "memory": "256Mi"},
                              "limits": {"memory": "1Gi"}},
            }],
        }}},
    }  # fmt: skip
    kind.kubectl("create", "namespace", "rl", check=False)
    kind.kubectl("-n", "rl", "apply", "-f", "-", stdin=yaml.safe_dump_all([service, deployment]))
    kind.kubectl(
        "-n", "rl", "rollout", "status", "deployment/engine", "--timeout=300s", timeout=330
    )
