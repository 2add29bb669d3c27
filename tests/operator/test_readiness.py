"""A HarnessEnv's Ready condition: valid objects that cannot run in a cluster are not ready, with
why."""

from __future__ import annotations

from typing import Any

import pytest
from openforge_operator import readiness
from operator_fixtures import NOW, env, env_body


def harness(**fields: Any) -> dict[str, Any]:
    return {"template": {"spec": {"containers": [{"name": "harness", **fields}]}}}


def test_a_complete_harness_env_is_ready() -> None:
    verdict = readiness.check(env())
    assert verdict == readiness.Readiness(
        True, "Valid", "ready to run rollouts (capture mode BaseURL)"
    )


@pytest.mark.parametrize(
    ("spec", "reason", "words"),
    [
        (harness(command=["c"]), "NoImage", "image is required"),
        (harness(image="i"), "NoCommand", "command is required"),
        (
            {**harness(image="i", command=["c"]), "task": {"file": {"path": "task.json"}}},
            "RelativeTaskFile",
            "'task.json' is relative",
        ),
        (
            harness(image="i", command=["c"], securityContext={"runAsUser": 0}),
            "RunsAsRoot",
            "user 0",
        ),
        (
            {
                "template": {
                    "spec": {
                        "securityContext": {"runAsUser": 0},
                        "containers": [{"name": "harness", "image": "i", "command": ["c"]}],
                    }
                }
            },
            "RunsAsRoot",
            "user 0",
        ),
    ],
)
def test_what_keeps_a_harness_env_from_a_cluster(
    spec: dict[str, Any], reason: str, words: str
) -> None:
    verdict = readiness.check(env(spec=spec))
    assert not verdict.ready and verdict.reason == reason and words in verdict.message


def test_an_invalid_object_is_not_ready_and_the_message_names_the_field() -> None:
    body = env_body()
    body["spec"]["timeoutSeconds"] = 0
    verdict = readiness.evaluate(body)
    assert (verdict.ready, verdict.reason) == (
        False,
        "InvalidSpec",
    ) and "spec.timeoutSeconds" in verdict.message


def test_status_is_written_once_per_generation_and_verdict() -> None:
    body = env_body()
    status = readiness.status(body, NOW)
    assert status == {
        "observedGeneration": 1,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Valid",
                        "message": "ready to run rollouts (capture mode BaseURL)",
                        "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 1}],
    }  # fmt: skip
    body["status"] = status
    assert readiness.status(body, NOW) is None
    body["metadata"]["generation"] = 2
    body["spec"]["template"]["spec"]["containers"][0].pop("command")
    changed = readiness.status(body, NOW)
    assert (
        changed is not None
        and changed["conditions"][0]["reason"] == "NoCommand"
        and changed["observedGeneration"] == 2
    )
