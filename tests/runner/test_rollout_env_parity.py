"""One HarnessEnv, one task, one attempt: a pod and ``openforge run`` tell the harness and
its grader the same things (``openforge.api.rollout_env``).

The operator's side is the pod it builds (``pods.build_pod``); the local side is the
commands ``openforge run`` starts (``plan.harness_command``, ``plan.grader_command``).
Before the rule was shared they differed: ``${OPENFORGE_JOB}`` and
``${OPENFORGE_ROLLOUT_ID}`` stayed literal locally, ``OPENFORGE_ATTEMPT`` was unset there,
the task's JSON was ASCII-escaped on one side only, and the local grader ran without the
template's, the task's and the base URL's variables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from openforge.api import manifests, v1alpha1
from openforge.api import tasks as task_records
from openforge_operator import entrypoint, pods, settings, tasks
from openforge_runner import plan

TASK = {"id": "t-1", "prompt": "café ☕", "n": 2}
SHARED = (
    "OPENFORGE_JOB",
    "OPENFORGE_TASK_ID",
    "OPENFORGE_TASK_JSON",
    "OPENFORGE_SAMPLE_INDEX",
    "OPENFORGE_ATTEMPT",
)
ARGS = [
    "${OPENFORGE_JOB}",
    "${OPENFORGE_ROLLOUT_ID}",
    "${OPENFORGE_TASK_ID}",
    "${OPENFORGE_SAMPLE_INDEX}",
    "${OPENFORGE_ATTEMPT}",
    "$KEPT",
    "${OPENFORGE_JOB:-x}",
]


def env_body(grader: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": v1alpha1.API_VERSION,
        "kind": "HarnessEnv",
        "metadata": {"name": "env", "namespace": "ns"},
        "spec": {
            "api": "openai-chat",
            "baseUrl": {"env": ["OPENAI_BASE_URL"], "suffix": "/v1"},
            "template": {"spec": {"containers": [{
                "name": "harness", "image": "example/h:1", "command": ["agent", *ARGS],
                "env": [{"name": "FROM_TEMPLATE", "value": "t"}],
            }]}},
            "task": {"env": {"PROMPT": "{{ task.prompt }}"}, "args": ["--n={{ task.n }}"]},
            "grader": {"command": grader},
        },
    }  # fmt: skip


JOB = {
    "apiVersion": v1alpha1.API_VERSION,
    "kind": "RolloutJob",
    "metadata": {"name": "same", "namespace": "ns", "uid": "u-1", "generation": 1},
    "spec": {
        "harnessEnvRef": {"name": "env"},
        "tasks": {"inline": [TASK]},
        "samplesPerTask": 3,
        "policy": {"endpoint": "http://policy.test:8000", "model": "tiny"},
        "trainer": {"endpoint": "collector.test:50051"},
    },
}
GRADER = ["grade", "${OPENFORGE_TASK_ID}", "${OPENFORGE_ATTEMPT}"]
SAMPLE, ATTEMPT = 2, 1


def in_a_pod(env: dict[str, Any]) -> tuple[list[str], list[str], dict[str, Any]]:
    """(harness argv, grader argv, the container's env) of the pod."""
    job, harness_env = manifests.parse(JOB), manifests.parse(env)
    assert isinstance(job, v1alpha1.RolloutJob) and isinstance(harness_env, v1alpha1.HarnessEnv)
    records = task_records.inline(job.spec.tasks)
    assert records is not None
    pod = pods.build_pod(
        job=job,
        env=harness_env,
        rollout=tasks.rollout(records, 3, index=SAMPLE),
        attempt=ATTEMPT,
        config=settings.Settings(),
    )
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == "harness"]
    assert container["command"] == entrypoint.COMMAND
    args = container["args"]
    graders = int(args[0])
    values = {e["name"]: e.get("value") for e in container["env"]}
    return args[1 + graders :], args[1 : 1 + graders], values


def on_one_machine(tmp_path: Path, env: dict[str, Any]) -> tuple[plan.Command, plan.Command]:
    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump_all([env, JOB], allow_unicode=True, sort_keys=False), encoding="utf-8"
    )
    bundle = plan.load([path])
    rollout = plan.rollouts_for(bundle, 0)[SAMPLE].retry()
    assert rollout.attempt == ATTEMPT
    harness = plan.harness_command(
        bundle, rollout, sidecar_url="http://127.0.0.1:9", workdir=tmp_path / "w"
    )
    grader = plan.grader_command(
        bundle, rollout, sidecar_url="http://127.0.0.1:9", workdir=tmp_path / "w", harness_exit=3
    )
    assert grader is not None
    return harness, grader


def test_the_harness_and_grader_are_told_the_same_in_a_pod_and_on_one_machine(
    tmp_path: Path,
) -> None:
    pod_argv, pod_grader, pod_env = in_a_pod(env_body(GRADER))
    local, local_grader = on_one_machine(tmp_path, env_body(GRADER))
    for name in SHARED:
        assert pod_env[name] == local.env[name], name
    assert json.loads(local.env["OPENFORGE_TASK_JSON"]) == TASK
    assert "café ☕" in local.env["OPENFORGE_TASK_JSON"], "UTF-8, not escaped, in both"

    def expected(env: dict[str, Any]) -> list[str]:
        return [
            "agent",
            "same",
            env["OPENFORGE_ROLLOUT_ID"],
            "t-1",
            "2",
            "1",
            "$KEPT",
            "${OPENFORGE_JOB:-x}",
            "--n=2",
        ]

    assert pod_argv == expected(pod_env)
    assert local.argv == expected(local.env)
    assert pod_grader == local_grader.argv == ["grade", "t-1", "1"]
    # the grader runs in the harness's environment: the pod's grader inherits its container's
    for name in ("FROM_TEMPLATE", "PROMPT", "OPENAI_BASE_URL"):
        assert pod_env[name] is not None and local_grader.env[name] == local.env[name], name
    assert local_grader.env["PROMPT"] == pod_env["PROMPT"] == "café ☕"
    assert local_grader.env["OPENFORGE_HARNESS_EXIT_CODE"] == "3"


def test_a_folder_only_openforge_run_has_is_refused_in_a_pod_naming_the_field(
    tmp_path: Path,
) -> None:
    env = env_body(["python", "${OPENFORGE_MANIFEST_DIR}/grade.py"])
    with pytest.raises(
        pods.PodError,
        match=(
            r"HarnessEnv env: spec.grader.command: .*names \$\{OPENFORGE_MANIFEST_DIR\}, a folder "
            r"of the machine that runs openforge run"
        ),
    ):
        in_a_pod(env)
    _, grader = on_one_machine(tmp_path, env)
    assert grader.argv == ["python", f"{tmp_path}/grade.py"]
