"""How a rollout is graded and judged in real pods, as docs/operator.md says: the grader
runs in the harness container after the harness, and the in-pod agent turns what it
printed and how it ended into the reward and the verdict (``openforge.api.verdict``).

One job runs every way a grader can fail (no JSON, a command that cannot be run, past
its timeout after printing a reward) with ``failurePolicy`` ``onReasons: [GraderFailed]
-> Ignore`` and one attempt per rollout: judged GraderFailed, each runs again without
counting; judged anything else, it could not. A harness that runs past its pod's
deadline beside them is ``DeadlineExceeded``. A second HarnessEnv, with an ``fsGroup``
of its own, is graded by exit code.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import kube_cluster
import pytest
import realpods
from openforge_operator import settings

pytestmark = [pytest.mark.kind, pytest.mark.slow]

GRADER = """\
case "$OPENFORGE_TASK_ID:$OPENFORGE_ATTEMPT" in
  nojson:0) echo "no reward in here";;
  missing:0) exec /openforge-test/no-such-grader;;
  slow:0) echo '{"reward": 1.0}'; sleep 120;;
  *) echo "some noise"; echo '{"reward": 0.25}'; echo "trailing text";;
esac
"""
"""Fails on attempt 0 of ``nojson`` (prints no JSON), ``missing`` (exit 127, nothing
printed) and ``slow`` (prints a reward, then runs past its 5 s timeout); else the last
JSON line's reward, 0.25."""

HARNESS = """\
python3 -c "$CALL" || exit 9
if [ "$OPENFORGE_TASK_ID" = late ]; then exec sleep 100000; fi
"""
"""One call, then ``late`` runs on past its pod's deadline."""

TASKS = ["nojson", "missing", "slow", "good", "late"]
ROLLOUT_TIMEOUT, GRADER_TIMEOUT = 15, 5


def graded_env(name: str) -> dict[str, Any]:
    env = realpods.stepped_env(name, 1)
    harness = env["spec"]["template"]["spec"]["containers"][0]
    harness["command"] = ["sh", "-c", HARNESS]
    harness["env"].append({"name": "CALL", "value": realpods.ONE_CALL})
    env["spec"]["grader"] = {
        "command": ["sh", "-c", GRADER],
        "rewardFrom": "stdout-json",
        "timeoutSeconds": GRADER_TIMEOUT,
    }
    return env


def exit_code_env(name: str) -> dict[str, Any]:
    """Graded by the grader's exit code (0 for ``pass``), in a pod with its own ``fsGroup``."""
    env = realpods.stepped_env(name, 1)
    env["spec"]["template"]["spec"]["securityContext"] = {"fsGroup": 2000}
    env["spec"]["grader"] = {
        "command": ["sh", "-c", 'echo "reward: not JSON"; [ "$OPENFORGE_TASK_ID" = pass ]'],
        "rewardFrom": "exit-code",
        "timeoutSeconds": 30,
    }
    return env


def verdict(pod: dict[str, Any]) -> dict[str, Any]:
    """The harness container's termination message: the in-pod agent's verdict."""
    terminated = realpods.container_status(pod, "harness")["state"]["terminated"]
    message: dict[str, Any] = json.loads(terminated["message"])
    return message


@pytest.mark.timeout(900)
def test_graders_that_fail_are_grader_failed_and_a_late_harness_is_deadline_exceeded(
    platform: kube_cluster.Kube,
) -> None:
    kind = platform
    name = f"grading-{uuid.uuid4().hex[:6]}"
    coded = f"{name}-codes"
    realpods.ensure_namespace(kind, name)
    job = realpods.rollout_job(
        name, env=name, tasks=[{"id": t} for t in TASKS], parallelism=len(TASKS),
        rolloutTimeoutSeconds=ROLLOUT_TIMEOUT,
        failurePolicy={"rules": [{"action": "Ignore", "onReasons": ["GraderFailed"]}]},
    )  # fmt: skip
    codes = realpods.rollout_job(
        coded, env=coded, tasks=[{"id": "pass"}, {"id": "fail"}], parallelism=2
    )
    realpods.apply(kind, name, graded_env(name), exit_code_env(coded), job, codes)

    done = realpods.wait_job(kind, name, name, timeout=600)
    events = realpods.events(kind, name)
    assert realpods.condition(done, "Complete"), (done["status"], events[-4000:])
    status = done["status"]
    assert status["failedIndexes"] == "4" and status["counts"]["succeeded"] == 4, status
    assert "rollouts 4 failed: 4 after attempt 0 (DeadlineExceeded" in events, events[-4000:]
    pods = {p["metadata"]["name"]: p for p in realpods.pods_of(kind, name, name)}
    assert sorted(pods) == sorted(
        [f"{name}-{i}-0" for i in range(5)] + [f"{name}-{i}-1" for i in range(3)]
    ), sorted(pods)

    # each failing grader: a GraderFailed attempt 0 (no reward), retried uncounted
    for index in range(3):
        first, second = pods[f"{name}-{index}-0"], pods[f"{name}-{index}-1"]
        judged = verdict(first)
        assert judged["status"] == "failed" and judged["reason"] == "GraderFailed", judged
        assert judged["reward"] is None and judged["exitCode"] == 0, judged
        earlier = json.loads(second["metadata"]["annotations"]["openforge.dev/earlier-attempts"])
        assert earlier == [{"attempt": 0, "exitCode": 0, "reason": "GraderFailed"}], earlier
        assert verdict(second)["reward"] == 0.25, verdict(second)
    why = [verdict(pods[f"{name}-{index}-0"])["message"] for index in range(3)]
    assert "printed no JSON line" in why[0], why
    assert "could not run: exit 127" in why[1], why
    assert "ran past its timeout" in why[2], why
    assert verdict(pods[f"{name}-3-0"])["reward"] == 0.25  # the last JSON line's

    # the late harness: stopped by the kubelet at its pod's deadline, judged from outside
    late = pods[f"{name}-4-0"]
    defaults = settings.Settings()
    assert late["spec"]["activeDeadlineSeconds"] == (
        ROLLOUT_TIMEOUT
        + GRADER_TIMEOUT
        + defaults.finish_wait_seconds
        + defaults.pod_deadline_slack_seconds
    ), late["spec"]
    assert late["status"]["reason"] == "DeadlineExceeded", late["status"]

    summary = realpods.store_summary(kind, name)
    rewards = {(r["task"], r["attempt"]): r["reward"] for r in summary["rollouts"]}
    graded = {(r["task"], r["attempt"]): r["has_reward"] for r in summary["rollouts"]}
    for task in TASKS[:3]:
        assert not graded[(task, 0)] and rewards[(task, 1)] == 0.25, summary["rollouts"]
    assert rewards[("good", 0)] == 0.25 and not graded[("late", 0)], summary["rollouts"]

    # graded by exit code, in a pod whose own fsGroup the sidecar reads its Secrets through
    done = realpods.wait_job(kind, name, coded, timeout=120)
    assert realpods.condition(done, "Complete"), done["status"]
    assert done["status"]["counts"]["succeeded"] == 2, done["status"]
    for pod in realpods.pods_of(kind, name, coded):
        assert pod["spec"]["securityContext"]["fsGroup"] == 2000, pod["spec"]["securityContext"]
    rewards = {r["task"]: r["reward"] for r in realpods.store_summary(kind, coded)["rollouts"]}
    assert rewards == {"pass": 1.0, "fail": 0.0}, rewards
    kind.kubectl("delete", "namespace", name, "--wait=false")
