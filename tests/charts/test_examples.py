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
