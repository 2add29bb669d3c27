"""The operator against a real API server: ``openforge operator`` runs as a subprocess,
under a service account bound to exactly ``permissions.RULES`` (+ ``WEBHOOK_RULES``),
and drives RolloutJobs whose pods kwok completes (docs/cluster-testing.md).

Each test gets its own namespace, served by the one operator of this module; pods take
0.3-1 s to run (kwok's ``simulate-duration``), and per-task exit codes come from the
task records through the HarnessEnv's task env (``OPENFORGE_SIMULATE_EXIT_CODE``),
which the kwok rollout stage reads.

What kwok cannot show (containers running, the harness waiting for its sidecar to
listen, the entrypoint and in-pod agent, termination messages written by them) is
covered by ``tests/operator`` running those pieces as real processes, and by
``tests/kind`` in real pods.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kube_cluster
import pytest
import yaml
from openforge.trajectory import auth
from openforge_operator import permissions

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CRDS = [
    ROOT / "crds" / "openforge.dev_harnessenvs.yaml",
    ROOT / "crds" / "openforge.dev_rolloutjobs.yaml",
]
NAMESPACES = [
    "modes", "retry", "gc", "restart", "held", "suspend", "deadline", "ttl", "hook", "tokens"
]  # fmt: skip
MASTER_KEY = b"e2e-master-key-" + b"k" * 32
SIDECAR_IMAGE = os.environ.get("OPENFORGE_TEST_SIDECAR_IMAGE", "ghcr.io/openforge/sidecar:0.1.0")


# -- the operator under test -----------------------------------------------------------------


class Operator:
    """``openforge operator`` as a subprocess, with a service account's kubeconfig."""

    def __init__(
        self, kubeconfig: Path, namespaces: dict[str, str], log: Path, webhook_port: int
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespaces = namespaces
        self.log = log
        self.webhook_port = webhook_port
        self.master_key = log.parent / "collector-master-key"
        self.master_key.write_bytes(MASTER_KEY)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [sys.executable, "-m", "openforge.cli", "operator", "--standalone",
                "--kubeconfig", str(self.kubeconfig), "--sidecar-image", SIDECAR_IMAGE,
                "--resync-seconds", "5", "--collector-master-key-file", str(self.master_key), "-v",
                "--webhook", "--webhook-addr", "127.0.0.1", "--webhook-host", "127.0.0.1",
                "--webhook-port", str(self.webhook_port), "--webhook-configuration",
                f"openforge-capture-{self.namespaces['hook']}"]  # fmt: skip
        for namespace in self.namespaces.values():
            args += ["--namespace", namespace]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG", None)
        self.process = subprocess.Popen(
            args, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, env=env
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies under it."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def service_account_kubeconfig(kube: kube_cluster.Kube, directory: Path, suffix: str) -> Path:
    """A service account bound to exactly the operator's rules, and a kubeconfig with its token."""
    namespace, name = f"openforge-system-{suffix}", "openforge-operator"
    rules = permissions.rules(webhook=True)
    manifests = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": f"{name}-{suffix}"}, "rules": rules},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{name}-{suffix}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": f"{name}-{suffix}"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]  # fmt: skip
    kube.apply(yaml.safe_dump_all(manifests))
    token = kube.kubectl(
        "-n", namespace, "create", "token", name, "--duration", "2h"
    ).stdout.strip()
    admin = json.loads(
        kube.kubectl("config", "view", "--raw", "--minify", "--flatten", "-o", "json").stdout
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [
            {
                "name": "operator",
                "context": {"cluster": admin["clusters"][0]["name"], "user": "operator"},
            }
        ],
        "current-context": "operator",
    }
    path = directory / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def operator(
    kube: kube_cluster.Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    for path in CRDS:
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    kube.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/harnessenvs.openforge.dev",
        "crd/rolloutjobs.openforge.dev",
    )
    suffix = uuid.uuid4().hex[:6]
    namespaces = {key: f"op-{key}-{suffix}" for key in NAMESPACES}
    for namespace in namespaces.values():
        kube.kubectl("create", "namespace", namespace)
    for namespace in namespaces.values():
        kube_cluster.wait_for(
            lambda ns=namespace: (
                kube.kubectl("-n", ns, "get", "serviceaccount", "default", check=False).returncode
                == 0
            ),
            what=f"serviceaccount default in {namespace}",
        )
    directory = tmp_path_factory.mktemp("operator")
    from openforge_runner.processes import free_port

    running = Operator(
        service_account_kubeconfig(kube, directory, suffix),
        namespaces,
        directory / "operator.log",
        free_port(),
    )
    running.start()
    try:
        yield running
    finally:
        running.stop()
        kube.kubectl(
            "delete",
            "mutatingwebhookconfiguration",
            f"openforge-capture-{namespaces['hook']}",
            "--ignore-not-found",
            check=False,
        )
        for namespace in namespaces.values():
            kube.kubectl(
                "delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False
            )


# -- helpers -----------------------------------------------------------------------------------


def harness_env(
    name: str, *, mode: str = "BaseURL", duration: str = "300ms", allowed: list[str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "api": "openai-chat",
        "capture": {"mode": mode, "allowedHosts": allowed or []},
        "template": {
            "metadata": {"annotations": {"openforge.dev/simulate-duration": duration}},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "harness",
                        "image": "busybox:1.36",
                        "command": ["sh", "-c", 'exit "$OPENFORGE_SIMULATE_EXIT_CODE"'],
                    }
                ],
            },
        },
        "task": {"env": {"OPENFORGE_SIMULATE_EXIT_CODE": "{{ task.exit }}"}},
        "grader": {"command": ["sh", "-c", 'echo "{\\"reward\\": 1}"'], "timeoutSeconds": 30},
    }
    if mode == "BaseURL":
        spec["baseUrl"] = {"env": ["OPENAI_BASE_URL"], "suffix": "/v1"}
    return {
        "apiVersion": "openforge.dev/v1alpha1",
        "kind": "HarnessEnv",
        "metadata": {"name": name},
        "spec": spec,
    }


def rollout_job(
    name: str, env: str, *, exits: list[int] | None = None, samples: int = 4, **spec: Any
) -> dict[str, Any]:
    exits = exits if exits is not None else [0, 0, 0]
    return {
        "apiVersion": "openforge.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": name},
        "spec": {
            "harnessEnvRef": {"name": env},
            "tasks": {"inline": [{"id": f"t{i}", "exit": code} for i, code in enumerate(exits)]},
            "samplesPerTask": samples,
            "parallelism": 12,
            "policy": {"endpoint": "http://vllm.models.svc:8000", "model": "tiny", "version": 2},
            "trainer": {
                "endpoint": "collector.openforge.svc:50051",
                "tokenSecretRef": {"name": "collector-token", "key": "token"},
            },
            **spec,
        },
    }


def apply(kube: kube_cluster.Kube, namespace: str, *objects: dict[str, Any]) -> None:
    kube.apply(yaml.safe_dump_all(objects), namespace)


def pods_of(kube: kube_cluster.Kube, namespace: str, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.get_json(
        "-n", namespace, "pods", "-l", f"openforge.dev/job={job}"
    )["items"]
    return items


def get_job(kube: kube_cluster.Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get_json("-n", namespace, "rolloutjob", name)


def condition(body: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next(
        (c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == type_), None
    )


def wait(operator: Operator, check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert operator.alive(), f"the operator exited:\n{operator.tail()}"
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timed out after {timeout} s waiting for {what}; operator log:\n{operator.tail()}"
            )
        time.sleep(0.5)


def wait_finished(
    kube: kube_cluster.Kube,
    operator: Operator,
    namespace: str,
    name: str,
    type_: str = "Complete",
    timeout: float = 90,
) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def done() -> bool:
        found.update(get_job(kube, namespace, name))
        cond = condition(found, type_)
        return cond is not None and cond["status"] == "True"

    wait(operator, done, f"{namespace}/{name} {type_}", timeout)
    return found


def names(pods: list[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods)


# -- tests -------------------------------------------------------------------------------------


def test_three_tasks_times_four_samples_make_twelve_pods_with_the_sidecar_in_every_capture_mode(
    kube: kube_cluster.Kube, operator: Operator
) -> None:
    namespace = operator.namespaces["modes"]
    modes = {"base": "BaseURL", "proxy": "Proxy", "transparent": "Transparent"}
    for name, mode in modes.items():
        apply(
            kube,
            namespace,
            harness_env(name, mode=mode, allowed=["pypi.org"]),
            rollout_job(name, name),
        )
    for name, mode in modes.items():
        body = wait_finished(kube, operator, namespace, name)
        pods = pods_of(kube, namespace, name)
        assert names(pods) == sorted(f"{name}-{i}-0" for i in range(12)), (
            "exactly one pod per rollout"
        )
        assert body["status"]["counts"] == {
            "pending": 0,
            "active": 0,
            "succeeded": 12,
            "failed": 0,
            "retried": 0,
        }
        assert body["status"]["observedGeneration"] == body["metadata"]["generation"]
        for pod in pods:
            assert pod["status"]["phase"] == "Succeeded"
            init = pod["spec"]["initContainers"]
            sidecar = next(c for c in init if c["name"] == "openforge-sidecar")
            assert sidecar["restartPolicy"] == "Always" and "startupProbe" not in sidecar
            assert sidecar["image"] == SIDECAR_IMAGE
            assert (
                pod["metadata"]["ownerReferences"][0]["kind"] == "RolloutJob"
                and pod["metadata"]["ownerReferences"][0]["controller"]
            )
            harness = next(c for c in pod["spec"]["containers"] if c["name"] == "harness")
            env = {e["name"]: e.get("value") for e in harness["env"]}
            if mode == "BaseURL":
                assert [c["name"] for c in init] == ["openforge-sidecar"] and env[
                    "OPENAI_BASE_URL"
                ] == "http://127.0.0.1:15090/v1"
            if mode == "Proxy":
                assert (
                    env["HTTPS_PROXY"] == "http://127.0.0.1:15090"
                    and env["SSL_CERT_FILE"] == "/openforge/ca-cert/ca.crt"
                )
            if mode == "Transparent":
                assert [c["name"] for c in init] == ["openforge-redirect", "openforge-sidecar"]
                assert init[0]["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "NET_RAW"]
                assert "HTTPS_PROXY" not in env
        policy = kube.get_json("-n", namespace, "networkpolicy", f"{name}-rollouts")
        assert (
            policy["spec"]["podSelector"]["matchLabels"]["openforge.dev/job-uid"]
            == body["metadata"]["uid"]
        )
        secret = kube.kubectl("-n", namespace, "get", "secret", f"{name}-ca", check=False)
        assert (secret.returncode == 0) == (mode != "BaseURL"), "a CA only where TLS is intercepted"
    ready = condition(kube.get_json("-n", namespace, "harnessenv", "base"), "Ready")
    assert ready is not None and ready["status"] == "True"
    secret = kube.get_json("-n", namespace, "secret", "proxy-ca")
    assert set(secret["data"]) == {"mitmproxy-ca.pem", "ca.crt"}
    columns = kube.kubectl("-n", namespace, "get", "rolloutjob", "base").stdout
    assert "12" in columns.splitlines()[1]


def test_failed_rollouts_are_retried_up_to_the_limit_then_recorded_failed(
    kube: kube_cluster.Kube, operator: Operator
) -> None:
    namespace = operator.namespaces["retry"]
    retry = {"rules": [{"action": "Retry", "onExitCodes": {"operator": "NotIn", "values": [0]}}]}
    apply(
        kube,
        namespace,
        harness_env("env"),
        rollout_job("job", "env", exits=[0, 3, 0], maxAttemptsPerRollout=2, failurePolicy=retry),
    )
    body = wait_finished(kube, operator, namespace, "job")
    assert body["status"]["counts"] == {
        "pending": 0,
        "active": 0,
        "succeeded": 8,
        "failed": 4,
        "retried": 4,
    }
    assert body["status"]["failedIndexes"] == "4-7"
    failing = [f"job-{i}-{a}" for i in range(4, 8) for a in (0, 1)]
    assert names(pods_of(kube, namespace, "job")) == sorted(
        [f"job-{i}-0" for i in (0, 1, 2, 3, 8, 9, 10, 11)] + failing
    )
    events = kube.get_json(
        "-n", namespace, "events", "--field-selector", "involvedObject.kind=RolloutJob"
    )["items"]
    assert {"Started", "RolloutsFailed", "Completed"} <= {e["reason"] for e in events}
    failed_messages = " ".join(e["message"] for e in events if e["reason"] == "RolloutsFailed")
    assert "exit code 3" in failed_messages


def test_deleting_the_job_garbage_collects_its_pods(
    kube: kube_cluster.Kube, operator: Operator
) -> None:
    namespace = operator.namespaces["gc"]
    apply(kube, namespace, harness_env("env", duration="10m"), rollout_job("job", "env"))
    wait(operator, lambda: len(pods_of(kube, namespace, "job")) == 12, "12 pods")
    kube.kubectl("-n", namespace, "delete", "rolloutjob", "job", "--wait=false")
    wait(
        operator,
        lambda: not pods_of(kube, namespace, "job"),
        "the pods to be garbage-collected",
        timeout=60,
    )
    wait(
        operator,
        lambda: (
            kube.kubectl("-n", namespace, "get", "rolloutjob", "job", check=False).returncode != 0
        ),
        "the job to go (finalizer removed)",
    )
    wait(
        operator,
        lambda: (
            kube.kubectl(
                "-n", namespace, "get", "networkpolicy", "job-rollouts", check=False
            ).returncode
            != 0
        ),
        "its NetworkPolicy to go",
    )


def test_an_operator_killed_mid_job_finishes_it_after_a_restart_without_duplicates(
    kube: kube_cluster.Kube, operator: Operator
) -> None:
    namespace = operator.namespaces["restart"]
    apply(
        kube,
        namespace,
        harness_env("env", duration="1s"),
        rollout_job("job", "env", exits=[0] * 6, samples=4, parallelism=6),
    )
    wait(operator, lambda: len(pods_of(kube, namespace, "job")) >= 8, "a few rounds of pods")
    operator.kill()
    time.sleep(2)  # pods keep finishing meanwhile
    operator.start()
    body = wait_finished(kube, operator, namespace, "job", timeout=120)
    assert body["status"]["counts"]["succeeded"] == 24
    assert names(pods_of(kube, namespace, "job")) == sorted(f"job-{i}-0" for i in range(24)), (
        "each rollout ran exactly once"
    )


def test_pods_deleted_while_the_operator_is_down_wait_for_it_and_no_attempt_is_lost(
    kube: kube_cluster.Kube, operator: Operator
) -> None:
    """A running pod deleted meanwhile is a failed attempt, run again under the next
    attempt number (reusing its name would have the new pod's records dropped as
    duplicates); finished pods deleted meanwhile are not run again."""
    namespace = operator.namespaces["held"]
    apply(
        kube,
        namespace,
        harness_env("slow", duration="10m"),
        harness_env("fast", duration="1s"),
        rollout_job("running", "slow", exits=[0], samples=1),
        rollout_job("finished", "fast", exits=[0], samples=2),
    )

    def phases(job: str) -> dict[str, str]:
        return {
            p["metadata"]["name"]: p["status"].get("phase", "")
            for p in pods_of(kube, namespace, job)
        }

    wait(operator, lambda: phases("running") == {"running-0-0": "Running"}, "a running pod")
    wait(operator, lambda: len(phases("finished")) == 2, "two pods")
    operator.kill()
    deadline = time.monotonic() + 60  # the operator is down: no wait(), which checks it lives
    while set(phases("finished").values()) != {"Succeeded"}:
        assert time.monotonic() < deadline, phases("finished")
        time.sleep(0.5)
    # deleted in the second it finished, a pod counts as stopped by the deletion
    time.sleep(1.5)
    kube.kubectl("-n", namespace, "delete", "pods", "--all", "--wait=false")
    time.sleep(3)
    held = {
        p["metadata"]["name"]: p
        for p in [*pods_of(kube, namespace, "running"), *pods_of(kube, namespace, "finished")]
    }
    assert sorted(held) == ["finished-0-0", "finished-1-0", "running-0-0"], (
        "the finalizer holds them"
    )
    assert all(p["metadata"].get("deletionTimestamp") for p in held.values())
    assert held["running-0-0"]["status"]["phase"] == "Failed", "stopped, as a kubelet does"
    operator.start()
    body = wait_finished(kube, operator, namespace, "finished", timeout=60)
    assert (
        body["status"]["counts"]["succeeded"] == 2 and body["status"]["completedIndexes"] == "0-1"
    )
    wait(operator, lambda: phases("running") == {"running-0-1": "Running"}, "attempt 1 alone")
    wait(operator, lambda: not pods_of(kube, namespace, "finished"), "the finished pods let go")
    [again] = pods_of(kube, namespace, "running")
    assert json.loads(again["metadata"]["annotations"]["openforge.dev/earlier-attempts"]) == [
        {"attempt": 0, "exitCode": 137, "reason": None}
    ]
    assert again["metadata"]["finalizers"] == ["openforge.dev/attempt-record"]
    assert get_job(kube, namespace, "running")["status"]["counts"]["retried"] == 1
    kube.kubectl("-n", namespace, "delete", "rolloutjob", "running", "--wait=false")
    wait(
        operator,
        lambda: not pods_of(kube, namespace, "running"),
        "the job's pods let go and collected",
    )


def test_suspend_stops_new_pods_and_resume_continues(
    kube: kube_cluster.Kube, operator: Operator
) -> None:
    namespace = operator.namespaces["suspend"]
    apply(
        kube,
        namespace,
        harness_env("env", duration="1s"),
        rollout_job("job", "env", exits=[0, 0], parallelism=2),
    )
    wait(operator, lambda: len(pods_of(kube, namespace, "job")) >= 2, "the first pods")
    kube.kubectl(
        "-n",
        namespace,
        "patch",
        "rolloutjob",
        "job",
        "--type=merge",
        "-p",
        '{"spec": {"suspend": true}}',
    )
    wait(
        operator,
        lambda: (
            (condition(get_job(kube, namespace, "job"), "Suspended") or {}).get("status") == "True"
        ),
        "Suspended",
    )
    before = len(pods_of(kube, namespace, "job"))
    time.sleep(3)  # the running pods finish; no new one starts
    assert len(pods_of(kube, namespace, "job")) == before
    kube.kubectl(
        "-n",
        namespace,
        "patch",
        "rolloutjob",
        "job",
        "--type=merge",
        "-p",
        '{"spec": {"suspend": false}}',
    )
    body = wait_finished(kube, operator, namespace, "job")
    assert (condition(body, "Suspended") or {}).get("reason") == "JobResumed"
    assert names(pods_of(kube, namespace, "job")) == sorted(f"job-{i}-0" for i in range(8))


def test_active_deadline_fails_the_job_and_deletes_its_running_pods(
    kube: kube_cluster.Kube, operator: Operator
) -> None:
    namespace = operator.namespaces["deadline"]
    apply(
        kube,
        namespace,
        harness_env("env", duration="10m"),
        rollout_job("job", "env", activeDeadlineSeconds=3),
    )
    body = wait_finished(kube, operator, namespace, "job", type_="Failed", timeout=60)
    assert (condition(body, "Failed") or {})["reason"] == "DeadlineExceeded"
    wait(
        operator,
        lambda: all(
            p["metadata"].get("deletionTimestamp") for p in pods_of(kube, namespace, "job")
        ),
        "live pods deleted",
        timeout=30,
    )


def test_ttl_deletes_a_finished_job(kube: kube_cluster.Kube, operator: Operator) -> None:
    namespace = operator.namespaces["ttl"]
    apply(
        kube,
        namespace,
        harness_env("env"),
        rollout_job("job", "env", exits=[0], samples=2, ttlSecondsAfterFinished=1),
    )
    wait(
        operator,
        lambda: (
            kube.kubectl("-n", namespace, "get", "rolloutjob", "job", check=False).returncode != 0
        ),
        "the job deleted by its TTL",
        timeout=60,
    )


def test_the_webhook_injects_the_sidecar_into_labelled_pods(
    kube: kube_cluster.Kube, operator: Operator
) -> None:
    namespace = operator.namespaces["hook"]
    configuration = f"openforge-capture-{namespace}"
    wait(
        operator,
        lambda: (
            kube.kubectl(
                "get", "mutatingwebhookconfiguration", configuration, check=False
            ).returncode
            == 0
        ),
        "the webhook configuration",
    )
    webhook = kube.get_json("mutatingwebhookconfiguration", configuration)["webhooks"][0]
    assert webhook["failurePolicy"] == "Ignore"
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "eval", "labels": {"openforge.dev/capture": "true"},
                     "annotations": {"openforge.dev/policy-endpoint": "http://vllm:8000",
                                     "openforge.dev/policy-model": "tiny"}},
        "spec": {"containers": [{"name": "agent", "image": "busybox:1.36",
                                 "command": ["sleep", "1"]}]},
    }  # fmt: skip
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
    }

    def injected() -> bool:
        kube.kubectl(
            "-n",
            namespace,
            "delete",
            "pod",
            "eval",
            "--ignore-not-found",
            "--wait=false",
            check=False,
        )
        kube.kubectl("-n", namespace, "create", "-f", "-", stdin=json.dumps(pod), check=False)
        created = kube.kubectl("-n", namespace, "get", "pod", "eval", "-o", "json", check=False)
        return created.returncode == 0 and any(
            c["name"] == "openforge-sidecar"
            for c in json.loads(created.stdout)["spec"].get("initContainers", [])
        )

    wait(operator, injected, "a labelled pod with the sidecar", timeout=60)
    agent = kube.get_json("-n", namespace, "pod", "eval")["spec"]["containers"][0]
    assert {"name": "OPENAI_BASE_URL", "value": "http://127.0.0.1:15090"} in agent["env"]
    kube.apply(json.dumps(plain), namespace)
    assert "initContainers" not in kube.get_json("-n", namespace, "pod", "plain")["spec"]
    bad = {**pod, "metadata": {**pod["metadata"], "name": "bad", "annotations": {}}}
    refused = kube.kubectl("-n", namespace, "create", "-f", "-", stdin=json.dumps(bad), check=False)
    assert refused.returncode != 0 and "openforge.dev/policy-endpoint is required" in refused.stderr


def test_a_job_without_a_token_secret_gets_its_own_collector_token_in_the_sidecar_only(
    kube: kube_cluster.Kube, operator: Operator
) -> None:
    namespace = operator.namespaces["tokens"]
    job = rollout_job("job", "env", exits=[0], samples=2)
    job["spec"]["trainer"].pop("tokenSecretRef")
    apply(kube, namespace, harness_env("env"), job, rollout_job("own", "env", exits=[0], samples=1))
    body = wait_finished(kube, operator, namespace, "job")
    secret = kube.get_json("-n", namespace, "secret", "job-collector-token")
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "RolloutJob",
        body["metadata"]["uid"],
        True,
    )
    assert secret["immutable"] is True
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert auth.verify(MASTER_KEY, token) == auth.JobIdentity(
        namespace, "job", body["metadata"]["uid"]
    )
    for pod in pods_of(kube, namespace, "job"):
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "openforge-token")
        assert volume["secret"]["secretName"] == "job-collector-token"
        containers = [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
        holders = [
            c["name"]
            for c in containers
            if any(m["name"] == "openforge-token" for m in c.get("volumeMounts", []))
        ]
        assert holders == ["openforge-sidecar"]
    # a job naming its own token Secret (tokenSecretRef) keeps it: none is made for it
    own = wait_finished(kube, operator, namespace, "own")
    assert own["spec"]["trainer"]["tokenSecretRef"]["name"] == "collector-token"
    assert (
        kube.kubectl(
            "-n", namespace, "get", "secret", "own-collector-token", check=False
        ).returncode
        != 0
    )
    pod = pods_of(kube, namespace, "own")[0]
    assert (
        next(v for v in pod["spec"]["volumes"] if v["name"] == "openforge-token")["secret"][
            "secretName"
        ]
        == "collector-token"
    )


def test_the_operators_service_account_has_no_more_than_its_rules(
    kube: kube_cluster.Kube, operator: Operator
) -> None:
    sa = (
        f"system:serviceaccount:openforge-system-{operator.namespaces['modes'].rsplit('-', 1)[1]}:"
        "openforge-operator"
    )
    namespace = operator.namespaces["modes"]
    assert (
        kube.kubectl(
            "auth", "can-i", "create", "pods", "-n", namespace, "--as", sa, check=False
        ).stdout.strip()
        == "yes"
    )
    for verb, resource in [
        ("get", "secrets"),
        ("list", "secrets"),
        ("update", "pods"),
        ("create", "deployments"),
        ("list", "customresourcedefinitions"),
    ]:
        answer = kube.kubectl(
            "auth", "can-i", verb, resource, "-n", namespace, "--as", sa, check=False
        ).stdout.strip()
        assert answer == "no", f"{verb} {resource}"
