"""The chart's trainer as veRL's, in a real pod: ``trainer.train.engine: verl``
(``examples/cluster/helm/values-verl.yaml`` on top of the demo's values) makes the
trainer container run ``openforge train-verl``: a Ray cluster of its own (head,
TaskRunner, 2 FSDP2 workers over gloo), whose agent loop reads the collector's store
beside it. The demo's RolloutJob (8 tasks x 4 samples) runs in real pods; veRL takes
each task's group as its rollouts complete, in the job's task order, a step each, and
publishes every step's weights to the policy server; after its 8th step the
container stays up (a Deployment would restart an exit).
"""

from __future__ import annotations

import json
from typing import Any

import kube_cluster
import pytest
import realpods
import yaml

pytestmark = [pytest.mark.kind, pytest.mark.slow]

JOB = "react-toy"
NAMESPACE = "verl-demo"
VALUES = realpods.EXAMPLES / "helm" / "values-verl.yaml"
STEPS = 8
RUN_DIR = f"/data/runs/{JOB}"


def trainer_pod(kind: kube_cluster.Kube) -> str:
    return realpods.collector_pod(kind)  # the collector and the trainer share the pod


def trainer_file(kind: kube_cluster.Kube, path: str) -> list[dict[str, Any]]:
    out = kind.kubectl(
        "-n", "openforge", "exec", trainer_pod(kind), "-c", "trainer", "--", "cat", path
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.timeout(2700)
def test_the_charts_verl_trainer_trains_a_jobs_rollouts_as_they_complete(
    kind: kube_cluster.Kube,
) -> None:
    realpods.ensure_platform(kind)
    # the policy server back on the initial model (veRL publishes it as version 0), before
    # the trainer starts publishing to it
    kind.kubectl("-n", "rl", "rollout", "restart", "deployment/policy")
    kind.kubectl(
        "-n", "rl", "rollout", "status", "deployment/policy", "--timeout=600s", timeout=660
    )
    try:
        realpods.ensure_platform(kind, files=[VALUES])  # a new trainer pod, an empty store
        pod = trainer_pod(kind)
        spec = kind.get_json("-n", "openforge", "pod", pod)["spec"]
        trainer = next(c for c in spec["containers"] if c["name"] == "trainer")
        assert trainer["command"] == ["openforge", "train-verl"], trainer["command"]
        realpods.ensure_namespace(kind, NAMESPACE)
        objects = [
            doc
            for name in ("harnessenv.yaml", "tasks.yaml", "rolloutjob.yaml")
            for doc in yaml.safe_load_all((realpods.EXAMPLES / name).read_text())
            if doc
        ]
        realpods.apply(kind, NAMESPACE, *objects)
        done = realpods.wait_job(kind, NAMESPACE, JOB, timeout=1500)
        assert realpods.condition(done, "Complete"), (
            done.get("status"),
            realpods.events(kind, NAMESPACE)[-4000:],
        )
        assert done["status"]["counts"]["succeeded"] == 32, done["status"]

        def trained() -> bool:
            log = kind.kubectl(
                "-n", "openforge", "logs", pod, "-c", "trainer", "--tail=50", check=False
            ).stdout
            return f"trained {STEPS} steps; staying up until stopped" in log

        kube_cluster.wait_for(trained, what=f"veRL's {STEPS} steps", timeout=1200, interval=5)
        metrics = trainer_file(kind, f"{RUN_DIR}/metrics.jsonl")
        assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)), metrics
        # a step is one task's group: one whose rewards differ is a real update (a group
        # of equal rewards has no advantage, so no gradient)
        for m in metrics:
            data = m["data"]
            if data["critic/score/max"] > data["critic/score/min"]:
                assert data["actor/grad_norm"] > 0, m
        assert any(m["data"]["actor/grad_norm"] > 0 for m in metrics), metrics
        published = trainer_file(kind, f"{RUN_DIR}/weights/publishes.jsonl")
        assert [(p["policy_version"], p["ok"]) for p in published] == [
            (version, True) for version in range(STEPS + 1)
        ], published
        # step s trained task s-1's group: its 4 samples, each its own rollout
        for step in range(1, STEPS + 1):
            dumped = trainer_file(kind, f"{RUN_DIR}/rollouts/{step}.jsonl")
            assert len(dumped) == 4, (step, dumped)
            assert len({sample["uid"].rsplit("_", 2)[0] for sample in dumped}) == 1, step
        summary = realpods.store_summary(kind, JOB)
        assert summary["lost"] == [], summary["lost"]
        assert len(summary["rollouts"]) == 32
        assert kind.kubectl("-n", "openforge", "get", "pod", pod).returncode == 0  # still up
    finally:
        realpods.ensure_platform(kind)  # back to the demo's own trainer
        kind.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
