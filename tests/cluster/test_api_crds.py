"""The generated CRDs in a real API server: installed, defaulted, and enforcing
their CEL rules (immutable fields, one task source) as the models do.

Needs only an API server (no controllers or nodes), so the namespaces here are
made without waiting for service accounts.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kube_cluster
import pytest
import yaml
from openforge.api import manifests, v1alpha1

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CRDS = [
    ROOT / "crds" / "openforge.dev_harnessenvs.yaml",
    ROOT / "crds" / "openforge.dev_rolloutjobs.yaml",
]
VALID = (ROOT / "tests" / "api" / "fixtures" / "valid.yaml").read_text()


@pytest.fixture(scope="module")
def api(kube: kube_cluster.Kube) -> kube_cluster.Kube:
    for path in CRDS:
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    kube.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/harnessenvs.openforge.dev", "crd/rolloutjobs.openforge.dev",
    )  # fmt: skip
    return kube


@pytest.fixture
def ns(api: kube_cluster.Kube) -> Iterator[str]:
    name = f"api-{uuid.uuid4().hex[:10]}"
    api.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        api.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def documents() -> tuple[dict[str, Any], dict[str, Any]]:
    """The valid HarnessEnv and RolloutJob, without namespace or status (the server owns both)."""
    env, job = yaml.safe_load_all(VALID)
    for document in (env, job):
        document["metadata"].pop("namespace", None)
        document.pop("status", None)
    return env, job


def create(api: kube_cluster.Kube, ns: str, document: dict[str, Any], *, check: bool = True) -> str:
    result = api.kubectl("-n", ns, "create", "-f", "-", stdin=json.dumps(document), check=check)
    return result.stderr


def test_valid_manifests_are_accepted_and_read_back_through_the_models(
    api: kube_cluster.Kube, ns: str
) -> None:
    env, job = documents()
    for document in (env, job):
        create(api, ns, document)
    for document in (env, job):
        stored = api.get_json("-n", ns, document["kind"].lower(), document["metadata"]["name"])
        resource = manifests.parse(stored)  # uid, managedFields, generation... all parse
        assert resource.to_dict()["spec"] == stored["spec"], (
            "server defaults differ from model defaults"
        )


def test_server_defaults_match_the_model_defaults(api: kube_cluster.Kube, ns: str) -> None:
    job = {
        "apiVersion": v1alpha1.API_VERSION, "kind": "RolloutJob", "metadata": {"name": "mini"},
        "spec": {"harnessEnvRef": {"name": "react"}, "tasks": {"inline": [{"id": "a", "x": 1}]},
                 "policy": {"model": "m"}},
    }  # fmt: skip
    create(api, ns, job)
    stored = api.get_json("-n", ns, "rolloutjob", "mini")
    assert stored["spec"] == manifests.parse(job).to_dict()["spec"]


def test_immutable_fields_refuse_changes_and_parallelism_scales(
    api: kube_cluster.Kube, ns: str
) -> None:
    _, job = documents()
    create(api, ns, job)
    name = job["metadata"]["name"]
    edited = copy.deepcopy(job["spec"]["tasks"])
    edited["inline"][0]["prompt"] = "a field the schema does not name"
    for field, value in (
        ("tasks", {"inline": [{"id": "other"}]}),
        ("tasks", edited),  # CEL equality sees the preserved fields too
        ("harnessEnvRef", {"name": "other"}),
        ("samplesPerTask", 8),
    ):
        patch = json.dumps({"spec": {field: value}})
        result = api.kubectl(
            "-n", ns, "patch", "rolloutjob", name, "--type=merge", "-p", patch, check=False
        )
        assert result.returncode != 0 and f"{field} is immutable" in result.stderr, (
            field,
            result.stderr,
        )
    api.kubectl(
        "-n", ns, "patch", "rolloutjob", name, "--type=merge", "-p", '{"spec": {"parallelism": 6}}'
    )
    api.kubectl("-n", ns, "scale", "rolloutjob", name, "--replicas=3")
    assert api.get_json("-n", ns, "rolloutjob", name)["spec"]["parallelism"] == 3


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda spec: spec["tasks"].update(file="t.jsonl"),
            "set exactly one of tasks.inline, tasks.configMapRef, tasks.file",
        ),
        (
            lambda spec: spec.update(tasks={}),
            "set exactly one of tasks.inline, tasks.configMapRef, tasks.file",
        ),
        (
            lambda spec: spec["failurePolicy"]["rules"][1].update(
                onExitCodes={"operator": "In", "values": [1]}
            ),
            "set exactly one of onExitCodes, onReasons",
        ),
        (lambda spec: spec.update(samplesPerTask=0), "spec.samplesPerTask"),
        (lambda spec: spec.update(parallelism="2"), "spec.parallelism"),
    ],
    ids=[
        "two task sources",
        "no task source",
        "two failure matchers",
        "samplesPerTask 0",
        "parallelism string",
    ],
)
def test_the_server_refuses_what_the_models_refuse(
    api: kube_cluster.Kube, ns: str, edit: Any, message: str
) -> None:
    _, job = documents()
    bad = copy.deepcopy(job)
    edit(bad["spec"])
    with pytest.raises(manifests.ManifestError):
        manifests.parse(bad)
    stderr = create(api, ns, bad, check=False)
    assert message in stderr, stderr


def test_a_null_task_source_counts_as_unset_on_both_sides(api: kube_cluster.Kube, ns: str) -> None:
    _, job = documents()
    job["spec"]["tasks"]["file"] = None
    manifests.parse(job)
    create(api, ns, job)


def test_long_names_are_refused(api: kube_cluster.Kube, ns: str) -> None:
    _, job = documents()
    job["metadata"]["name"] = "j" * 64
    assert "at most 63 characters" in create(api, ns, job, check=False)


def test_status_written_from_the_model_is_accepted_and_printed(
    api: kube_cluster.Kube, ns: str
) -> None:
    _, job = documents()
    create(api, ns, job)
    (document,) = [d for d in yaml.safe_load_all(VALID) if d["kind"] == "RolloutJob"]
    status = v1alpha1.RolloutJobStatus.model_validate(document["status"], by_name=False).to_dict()
    name = job["metadata"]["name"]
    api.kubectl(
        "-n",
        ns,
        "patch",
        "rolloutjob",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )
    stored = api.get_json("-n", ns, "rolloutjob", name)
    assert stored["status"] == status
    table = api.kubectl("-n", ns, "get", "rj").stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "HARNESS",
        "SUCCEEDED",
        "FAILED",
        "ACTIVE",
        "COMPLETE",
        "AGE",
    ]
    assert table[1].split()[:6] == [name, "react", "3", "1", "2", "False"]


def test_unknown_fields_are_refused_by_strict_field_validation(
    api: kube_cluster.Kube, ns: str
) -> None:
    _, job = documents()
    job["spec"]["samplesPerTsk"] = 2
    assert 'unknown field "spec.samplesPerTsk"' in create(api, ns, job, check=False)
