"""examples/cluster against the chart: its values file is valid, and the demo
RolloutJob streams to the collector Service the chart makes (release
"openforge" in namespace "openforge", as docs/cluster.md installs it)."""

from __future__ import annotations

import yaml
from helm_chart import ROOT, Helm, one

EXAMPLES = ROOT / "examples" / "cluster"


def test_demo_values_train_the_demo_job(helm: Helm) -> None:
    values = yaml.safe_load((EXAMPLES / "helm" / "values.yaml").read_text())
    objects = helm.template(values, release="openforge", namespace="openforge")
    deployment = one(objects, "Deployment", "openforge-trainer")
    trainer = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "trainer"
    )
    job = yaml.safe_load((EXAMPLES / "rolloutjob.yaml").read_text())
    assert f"--job={job['metadata']['name']}" in trainer["args"]
    assert f"--serve={job['spec']['policy']['endpoint']}" in trainer["args"]


def test_demo_job_streams_to_the_charts_collector(helm: Helm) -> None:
    service = one(helm.template(release="openforge", namespace="openforge"), "Service")
    job = yaml.safe_load((EXAMPLES / "rolloutjob.yaml").read_text())
    (port,) = service["spec"]["ports"]
    assert (
        job["spec"]["trainer"]["endpoint"]
        == f"{service['metadata']['name']}.openforge.svc:{port['port']}"
    )


def test_the_verl_values_train_the_demo_job_on_verls_trainer(helm: Helm) -> None:
    """values-verl.yaml on top of values.yaml: the trainer container runs `openforge
    train-verl` on the demo job's own rollouts, its tasks the ConfigMap's in order, and
    its arguments are a plan the launcher accepts (every setting checked as it would)."""
    from openforge_trainer.training import verl_launch

    values = yaml.safe_load((EXAMPLES / "helm" / "values.yaml").read_text())
    verl = yaml.safe_load((EXAMPLES / "helm" / "values-verl.yaml").read_text())
    values["trainer"]["train"].update(verl["trainer"]["train"])
    objects = helm.template(values, release="openforge", namespace="openforge")
    deployment = one(objects, "Deployment", "openforge-trainer")
    trainer = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "trainer"
    )
    assert trainer["command"] == ["openforge", "train-verl"]
    assert "--batch=" in trainer["args"] and "--keep-running" in trainer["args"]
    tasks = yaml.safe_load((EXAMPLES / "tasks.yaml").read_text())["data"]["tasks.jsonl"]
    ids = [yaml.safe_load(line)["id"] for line in tasks.splitlines() if line.strip()]
    assert [a.removeprefix("--task=") for a in trainer["args"] if a.startswith("--task=")] == ids
    plan = verl_launch.plan_from(verl_launch._parser().parse_args(trainer["args"]))
    assert verl_launch.problems(plan) == []
    job = yaml.safe_load((EXAMPLES / "rolloutjob.yaml").read_text())
    assert plan.job == job["metadata"]["name"] and plan.batch == ""
    # one epoch of the job: every task's samples in groups of the plan's size
    assert plan.steps * plan.tasks_per_step() == len(ids)
    assert plan.group_size == job["spec"]["samplesPerTask"]
