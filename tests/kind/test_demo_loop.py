"""The README's cluster demo on a real kind cluster: ``scripts/kind-up.sh demo`` installs
the chart (operator, collector + trainer), the policy server and the ReAct RolloutJob of
``examples/cluster/`` (8 tasks x 4 samples), and real pods run it end to end.

What only real pods can show, checked here: the native sidecar starts first and its
startup probe passes (before the fix it never did: the kubelet dialled 127.0.0.1 in the
node's network namespace), the sidecar reads its 0440 Secret files as user 1337 (before
the fix: PermissionError), the harness is captured token-exactly through it, the grader's
reward and every call reach the collector's store over gRPC with the job's own token,
the trainer steps on the groups and publishes weights to the policy server, and later
rollouts carry the new policy version.
"""

from __future__ import annotations

import kube_cluster
import pytest
import realpods

pytestmark = [pytest.mark.kind, pytest.mark.slow]

JOB = "react-toy"
ROLLOUTS = 8 * 4


@pytest.mark.timeout(2400)
def test_the_demo_trains_in_real_pods(kind: kube_cluster.Kube) -> None:
    # a clean start on a cluster an earlier session left up
    realpods.kind_up(kind, "demo-down", timeout=600)
    realpods.kind_up(kind, "demo")

    job = realpods.wait_job(kind, "rl", JOB, timeout=1800)
    events = realpods.events(kind, "rl")
    assert realpods.condition(job, "Complete"), (
        f"job did not complete: {job.get('status')}\nevents:\n{events[-5000:]}"
    )
    assert job["status"]["counts"]["succeeded"] == ROLLOUTS, job["status"]["counts"]

    pods = realpods.pods_of(kind, "rl", JOB)
    assert len(pods) >= ROLLOUTS, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        if pod["status"].get("phase") == "Succeeded":
            realpods.check_sidecar_first(pod)
    assert "PermissionError" not in events and "Startup probe failed: dial tcp" not in events

    summary = realpods.store_summary(kind, JOB)
    assert summary["lost"] == [], summary["lost"]
    finished = [
        r
        for r in summary["rollouts"]
        if r["finished"] and r["has_reward"] and r["status"] == "succeeded"
    ]
    assert len(finished) == ROLLOUTS, sorted((r["id"], r["status"]) for r in summary["rollouts"])
    for rollout in finished:
        assert rollout["complete"] and rollout["calls"], rollout
        for call in rollout["calls"]:
            assert (
                call["exact"]
                and call["mode"] == "CAPTURE_MODE_TOKENS"
                and call["api"] == "WIRE_API_OPENAI_CHAT"
            ), (rollout["id"], call)
            assert call["completion_tokens"] == call["logprobs"] > 0, (rollout["id"], call)
    # the trainer stepped on the groups and published: later calls came from newer weights
    trained = [r for r in finished if r["trained"]]
    versions = sorted({call["version"] for r in finished for call in r["calls"]})
    assert len(trained) >= 3 * 4, f"{len(trained)} rollouts trained"
    assert versions[0] == 0 and versions[-1] >= 2, f"policy versions seen: {versions}"
    rewards = [r["reward"] for r in finished]
    assert 0 < sum(rewards) < len(rewards), f"rewards all alike: {rewards}"
