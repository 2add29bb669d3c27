"""examples/cluster: the demo's objects for a cluster are valid API objects that
the operator can turn into rollout pods, and they agree with the local demo
(examples/react-toy.yaml) on tasks, harness and grader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from openforge.api import manifests, v1alpha1
from openforge.api import tasks as task_records
from openforge_operator import pods, settings, tasks

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "cluster"
TOY_TOOLS = ROOT / "examples" / "tasks" / "toy-tools"


def load(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((CLUSTER / name).read_text()) if doc]


def env_and_job() -> tuple[v1alpha1.HarnessEnv, v1alpha1.RolloutJob]:
    (env,) = manifests.load_manifests(CLUSTER / "harnessenv.yaml")
    (job,) = manifests.load_manifests(CLUSTER / "rolloutjob.yaml")
    assert isinstance(env, v1alpha1.HarnessEnv) and isinstance(job, v1alpha1.RolloutJob)
    return env, job


def test_the_objects_validate_and_can_run_in_a_cluster() -> None:
    env, job = env_and_job()
    assert job.spec.harness_env_ref.name == env.metadata.name
    assert v1alpha1.cluster_problems(job) == []
    (config_map,) = load("tasks.yaml")
    assert job.spec.tasks.config_map_ref is not None
    assert config_map["metadata"]["name"] == job.spec.tasks.config_map_ref.name
    assert job.spec.tasks.config_map_ref.key in config_map["data"]


def test_the_task_config_map_is_the_demo_task_file() -> None:
    (config_map,) = load("tasks.yaml")
    text = config_map["data"]["tasks.jsonl"]
    assert text == (TOY_TOOLS / "demo.jsonl").read_text()
    image_ids = {
        json.loads(line)["id"]
        for line in (TOY_TOOLS / "tasks.jsonl").read_text().splitlines()
        if line.strip()
    }
    ids = [
        record["id"]
        for record in task_records.parse_jsonl(text, where="examples/cluster/tasks.yaml")
    ]
    assert set(ids) <= image_ids, (
        "prepare.py and grade.py in the harness image look the ids up in tasks.jsonl"
    )


def test_the_policy_service_is_the_jobs_policy_endpoint() -> None:
    _, job = env_and_job()
    service = next(doc for doc in load("policy.yaml") if doc["kind"] == "Service")
    (port,) = service["spec"]["ports"]
    assert job.spec.policy.endpoint == f"http://{service['metadata']['name']}.rl.svc:{port['port']}"
    deployment = next(doc for doc in load("policy.yaml") if doc["kind"] == "Deployment")
    (serve,) = deployment["spec"]["template"]["spec"]["containers"]
    assert f"--model-name={job.spec.policy.model}" in serve["args"]


def test_the_operator_builds_a_rollout_pod_from_them() -> None:
    env, job = env_and_job()
    # As read back from the API server: namespaced, with a uid.
    meta = {"namespace": "rl", "uid": "0b6e5c1a-2f43-4c55-9d8e-3a1f6f0e7c11"}
    env = env.model_copy(update={"metadata": env.metadata.model_copy(update=meta)})
    job = job.model_copy(update={"metadata": job.metadata.model_copy(update=meta)})
    (config_map,) = load("tasks.yaml")
    records = task_records.parse_jsonl(config_map["data"]["tasks.jsonl"], where="tasks")
    rollout = tasks.rollout(records, job.spec.samples_per_task, index=5)
    pod = pods.build_pod(
        job=job,
        env=env,
        rollout=rollout,
        attempt=0,
        config=settings.Settings(sidecar_image="ghcr.io/openforge/sidecar:0.1.0"),
    )
    harness = next(c for c in pod["spec"]["containers"] if c["name"] == v1alpha1.HARNESS_CONTAINER)
    argv = harness["args"]
    assert "/opt/openforge/harnesses/react/agent.py" in " ".join(argv)
    task_id = records[1]["id"]  # rollout 5 with 4 samples per task: task 1, sample 1
    assert task_id in argv, "the grader's ${OPENFORGE_TASK_ID} is expanded"
    assert {"name": "OPENFORGE_TASK_ID", "value": task_id} in harness["env"]
    assert {"name": "work", "emptyDir": {}} in pod["spec"]["volumes"]
