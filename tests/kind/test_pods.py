"""The rollout pod's anatomy where the template brings containers of its own (pods.py):
nothing of the template's runs under the entrypoint, so the sidecar gets its ``exec``
startup probe and the kubelet holds the template's init container, and every container
after it, back until the sidecar listens and the pod is fenced (the init container's
first acts are a connection to the sidecar's port and one to the API server: a container
started early would find the first refused or the second open); the pod still
finishes, graded and captured.
Also what reaches a pod from its job (the task file, the expanded command), and a job name
long enough that its pods' names are cut.
"""

from __future__ import annotations

import json
import uuid

import kube_cluster
import pytest
import realpods
import yaml
from openforge.api import rollouts

pytestmark = [pytest.mark.kind, pytest.mark.slow]

CLIENT = (
    """
assert open("/work/prepared").read() == "prepared\\n", (
    "the template's init container did not run first"
)
"""
    + realpods.ONE_CALL
)


PREPARE = """
import os, socket
# The kubelet starts this container only once the sidecar's startup probe passed: by then
# the sidecar listens on the pod's loopback and the pod is fenced (the in-pod agent
# creates sidecar-ready, which the probe also waits for, only once the API server is out
# of reach). A container started early would find either not yet so, and fail the pod.
socket.create_connection(("127.0.0.1", 15090), timeout=2).close()
api = (os.environ["KUBERNETES_SERVICE_HOST"], int(os.environ["KUBERNETES_SERVICE_PORT"]))
try:
    socket.create_connection(api, timeout=2).close()
except OSError:
    pass
else:
    raise SystemExit("started unfenced: the API server answered")
open("/work/prepared", "w").write("prepared\\n")
"""


def env_with_its_own_containers(name: str) -> dict:
    small = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}
    work = [{"name": "work", "mountPath": "/work"}]
    return {
        "apiVersion": "openforge.dev/v1alpha1", "kind": "HarnessEnv", "metadata": {"name": name},
        "spec": {
            "api": "openai-chat",
            "baseUrl": {"env": ["OPENAI_BASE_URL"], "suffix": "/v1"},
            "template": {"spec": {
                "initContainers": [{"name": "prepare", "image": realpods.HARNESS_IMAGE,
                                    "command": ["python3", "-c", PREPARE],
                                    "resources": small, "volumeMounts": work}],
                "containers": [
                    {"name": "harness", "image": realpods.HARNESS_IMAGE,
                     "command": ["python3", "-c", CLIENT], "resources": small,
                     "volumeMounts": work},
                    {"name": "helper", "image": realpods.HARNESS_IMAGE,
                     "command": ["sh", "-c", "sleep 2"], "resources": small},
                ],
                "volumes": [{"name": "work", "emptyDir": {}}],
            }},
            "grader": {"command": ["sh", "-c", 'echo \'{"reward": 1.0}\''],
                       "rewardFrom": "stdout-json", "timeoutSeconds": 30},
            "timeoutSeconds": 300,
        },
    }  # fmt: skip


@pytest.mark.timeout(600)
def test_a_template_with_containers_of_its_own_waits_on_the_sidecars_startup_probe(
    platform: kube_cluster.Kube,
) -> None:
    kind = platform
    name = f"pods-own-{uuid.uuid4().hex[:6]}"
    realpods.ensure_namespace(kind, name)
    job = realpods.rollout_job(name, env=name, tasks=[{"id": "t0"}, {"id": "t1"}], parallelism=2)
    kind.kubectl(
        "-n",
        name,
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump_all([env_with_its_own_containers(name), job]),
    )
    done = realpods.wait_job(kind, name, name, timeout=400)
    assert realpods.condition(done, "Complete") and done["status"]["counts"]["succeeded"] == 2, (
        done["status"]
    )
    for pod in realpods.pods_of(kind, name, name):
        init = pod["spec"]["initContainers"]
        assert [c["name"] for c in init] == [realpods.SIDECAR, "prepare"], init
        probe = init[0]["startupProbe"]
        assert "exec" in probe, (
            probe
        )  # the kubelet dials tcp/http probes from the node, not the pod
        sidecar = realpods.container_status(pod, realpods.SIDECAR)
        prepare = realpods.container_status(pod, "prepare")
        assert sidecar["restartCount"] == 0
        # held back until the sidecar's probe passed (start times are whole seconds)
        assert realpods.started_at(sidecar) <= realpods.started_at(prepare), (sidecar, prepare)
        assert realpods.container_status(pod, "harness")["state"]["terminated"]["exitCode"] == 0
    summary = realpods.store_summary(kind, name)
    assert sorted(r["task"] for r in summary["rollouts"]) == ["t0", "t1"], summary
    for rollout in summary["rollouts"]:
        assert rollout["reward"] == 1.0 and [c["exact"] for c in rollout["calls"]] == [True], (
            rollout
        )
    kind.kubectl("delete", "namespace", name, "--wait=false")


CHECK_TASK = """
import json, os, sys
record = json.load(open("/task/record.json"))
given = os.environ["OPENFORGE_TASK_JSON"]
assert record == json.loads(given), (record, given)
if "x" in record:  # UTF-8 kept, not escaped
    assert chr(252) in given and chr(92) + "u00fc" not in given, given
assert sys.argv[1:] == [f"task={record['id']}", f"--level={record['level']}"], sys.argv
print("task file and args as the task says", flush=True)
"""


@pytest.mark.timeout(600)
def test_the_task_file_and_the_expanded_command_reach_the_harness(
    platform: kube_cluster.Kube,
) -> None:
    """``spec.task.file`` is mounted into each pod from the job's ``<job>-taskfiles``
    ConfigMap (subPath) and holds the task record (as ``OPENFORGE_TASK_JSON`` does, UTF-8
    kept); ``${OPENFORGE_TASK_ID}`` in the container's args is expanded, and the
    ``spec.task.args`` templates follow, rendered from the task."""
    kind = platform
    name = f"pods-task-{uuid.uuid4().hex[:6]}"
    realpods.ensure_namespace(kind, name)
    env = realpods.stepped_env(name, 1)
    harness = env["spec"]["template"]["spec"]["containers"][0]
    harness["command"] = ["python3", "-c", CHECK_TASK]
    harness["args"] = ["task=${OPENFORGE_TASK_ID}"]
    env["spec"]["task"] = {
        "file": {"path": "/task/record.json"},
        "args": ["--level={{task.level}}"],
    }
    tasks = [{"id": "t0", "level": 1, "x": [1, "ü"]}, {"id": "t1", "level": "hard"}]
    realpods.apply(
        kind, name, env, realpods.rollout_job(name, env=name, tasks=tasks, parallelism=2)
    )
    done = realpods.wait_job(kind, name, name, timeout=400)
    assert realpods.condition(done, "Complete"), (
        done["status"],
        realpods.events(kind, name)[-3000:],
    )
    for pod in realpods.pods_of(kind, name, name):
        log = kind.kubectl("-n", name, "logs", pod["metadata"]["name"], "-c", "harness").stdout
        assert "task file and args as the task says" in log, log
    configmap = kind.get_json("-n", name, "configmap", f"{name}-taskfiles")
    assert configmap.get("immutable") is True, configmap["metadata"]
    made = realpods.delete_job_and_wait_collected(kind, name, name)
    assert f"configmaps/{name}-taskfiles" in made, made  # collected with its job
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(600)
def test_a_long_job_name_is_cut_in_its_pods_names_and_the_verdict_is_the_termination_message(
    platform: kube_cluster.Kube,
) -> None:
    """A 63-character job name would make pod names too long for a host name: the pod is
    ``<job cut>-<hash>-<index>-<attempt>``, 63 characters, and the collector takes its
    records under it (a per-job token holds the job to the same
    naming rule). The harness container's termination message is the in-pod agent's
    verdict: exit code, status, reward, acknowledgement and the calls stored."""
    kind = platform
    suffix = uuid.uuid4().hex[:6]
    namespace = f"pods-long-{suffix}"
    job = f"a-rollout-job-whose-name-runs-all-the-way-to-the-limit-{suffix}xy"
    assert len(job) == 63
    realpods.ensure_namespace(kind, namespace)
    env = realpods.stepped_env(namespace, 1)
    realpods.apply(
        kind, namespace, env, realpods.rollout_job(job, env=namespace, tasks=[{"id": "t0"}])
    )
    done = realpods.wait_job(kind, namespace, job, timeout=400)
    assert realpods.condition(done, "Complete"), (
        done["status"],
        realpods.events(kind, namespace)[-3000:],
    )
    [pod] = realpods.pods_of(kind, namespace, job)
    name = pod["metadata"]["name"]
    assert name == rollouts.pod_name(job, 0, attempt=0) and len(name) == 63, name
    assert name.endswith("-0-0") and not name.startswith(job), name
    harness = realpods.container_status(pod, "harness")["state"]["terminated"]
    verdict = json.loads(harness["message"])
    assert verdict["exitCode"] == 0 and verdict["status"] == "succeeded", verdict
    assert verdict["acknowledged"] is True and verdict["calls"] == 1, verdict
    assert verdict["reward"] is not None, verdict
    summary = realpods.store_summary(kind, job)
    assert summary["lost"] == [], summary["lost"]
    [rollout] = summary["rollouts"]
    assert rollout["id"] == name and rollout["finished"] and len(rollout["calls"]) == 1, rollout
    kind.kubectl("delete", "namespace", namespace, "--wait=false")
