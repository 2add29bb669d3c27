"""Builders of RolloutJobs, HarnessEnvs and pod dicts for the operator's unit tests."""

from __future__ import annotations

import copy
import datetime
from typing import Any

from openforge.api import manifests, retries, v1alpha1
from openforge_operator import attempts

NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
UID = "00000000-0000-0000-0000-000000000001"


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def job_body(
    *,
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    name: str = "job",
    generation: int = 1,
) -> dict[str, Any]:
    base = {
        "apiVersion": v1alpha1.API_VERSION,
        "kind": "RolloutJob",
        "metadata": {"name": name, "namespace": "ns", "uid": UID, "generation": generation},
        "spec": {
            "harnessEnvRef": {"name": "env"},
            "tasks": {
                "inline": [
                    {"id": "a", "prompt": "p-a"},
                    {"id": "b", "prompt": "p-b"},
                    {"id": "c", "prompt": "p-c"},
                ]
            },
            "samplesPerTask": 4,
            "parallelism": 5,
            "policy": {"endpoint": "http://vllm.models.svc:8000", "model": "tiny", "version": 3},
            "trainer": {"endpoint": "collector.openforge.svc:50051"},
        },
    }
    body = deep_merge(base, {"spec": spec or {}})
    if status is not None:
        body["status"] = status
    return body


def job(
    *,
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    name: str = "job",
    generation: int = 1,
) -> v1alpha1.RolloutJob:
    parsed = manifests.parse(job_body(spec=spec, status=status, name=name, generation=generation))
    assert isinstance(parsed, v1alpha1.RolloutJob)
    return parsed


def env_body(*, spec: dict[str, Any] | None = None, name: str = "env") -> dict[str, Any]:
    base = {
        "apiVersion": v1alpha1.API_VERSION,
        "kind": "HarnessEnv",
        "metadata": {"name": name, "namespace": "ns", "generation": 1},
        "spec": {
            "api": "openai-chat",
            "baseUrl": {"env": ["OPENAI_BASE_URL"], "suffix": "/v1"},
            "template": {
                "metadata": {"labels": {"app": "toy"}, "annotations": {"team": "rl"}},
                "spec": {
                    "containers": [
                        {
                            "name": "harness",
                            "image": "ghcr.io/example/harness:1",
                            "command": ["python", "-m", "agent"],
                            "args": ["--task", "${OPENFORGE_TASK_ID}"],
                            "env": [{"name": "LOG_LEVEL", "value": "info"}],
                        }
                    ]
                },
            },
            "grader": {
                "command": ["python", "grade.py", "--task", "${OPENFORGE_TASK_ID}"],
                "timeoutSeconds": 40,
            },
            "timeoutSeconds": 120,
        },
    }
    return deep_merge(base, {"spec": spec or {}})


def env(*, spec: dict[str, Any] | None = None, name: str = "env") -> v1alpha1.HarnessEnv:
    parsed = manifests.parse(env_body(spec=spec, name=name))
    assert isinstance(parsed, v1alpha1.HarnessEnv)
    return parsed


def attempt(
    index: int,
    number: int,
    state: attempts.State,
    *,
    exit_code: int | None = None,
    reason: str | None = None,
    name: str | None = None,
    acknowledged: bool = False,
    held: bool = False,
    earlier: tuple[retries.Tried, ...] = (),
) -> attempts.Attempt:
    return attempts.Attempt(
        name or f"job-{index}-{number}",
        index,
        number,
        state,
        exit_code,
        reason,
        acknowledged=acknowledged,
        held=held,
        earlier=earlier,
    )


def pod(
    index: int,
    number: int,
    *,
    phase: str = "Pending",
    status: dict[str, Any] | None = None,
    uid: str = UID,
    node: str | None = "node-1",
    **metadata: Any,
) -> dict[str, Any]:
    """A rollout pod as the API returns it (only the fields the operator reads); ``node``:
    the node it is bound to (None: not scheduled)."""
    return {
        "spec": {"nodeName": node} if node is not None else {},
        "metadata": {
            "name": f"job-{index}-{number}",
            "namespace": "ns",
            "labels": {
                "app.kubernetes.io/managed-by": "openforge-operator",
                "openforge.dev/job": "job",
                "openforge.dev/job-uid": uid,
                "openforge.dev/rollout": str(index),
                "openforge.dev/attempt": str(number),
            },
            **metadata,
        },
        "status": {"phase": phase, **(status or {})},
    }


def terminated(
    exit_code: int, *, reason: str = "", message: str | None = None, name: str = "harness"
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason or ("Completed" if exit_code == 0 else "Error"),
    }
    if message is not None:
        state["message"] = message
    return {"name": name, "state": {"terminated": state}}
