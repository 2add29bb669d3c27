"""The Helm chart against a real API server: installed, its operator's RBAC
checked by the API server's own authorizer, uninstalled leaving the CRDs, and
its non-default renders and the cluster examples accepted by server-side dry
runs. Nothing here runs a container (on the local control plane pods are kwok
fakes); what is checked is what the API server admits and authorizes.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kube_cluster
import pytest
import yaml
from openforge_operator import permissions, webhook

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "openforge"
EXAMPLES = ROOT / "examples" / "cluster"
# Granted by no rule: the authorizer must say no to each.
NOT_GRANTED = [
    ("", "secrets", "get"),
    ("", "secrets", "list"),
    ("", "configmaps", "delete"),
    ("", "pods", "update"),
    ("", "pods/exec", "create"),
    ("apps", "deployments", "create"),
    ("rbac.authorization.k8s.io", "roles", "create"),
    ("openforge.dev", "harnessenvs", "delete"),
]


class Helm:
    def __init__(self, path: str, kube: kube_cluster.Kube, home: Path) -> None:
        self.path, self.kube = path, kube
        self.env = {
            **os.environ,
            **{
                f"HELM_{kind}_HOME": str(home / kind.lower())
                for kind in ("CACHE", "CONFIG", "DATA")
            },
        }

    def __call__(self, *args: str, values: dict[str, Any] | None = None) -> str:
        argv = [
            self.path,
            "--kubeconfig",
            str(self.kube.kubeconfig),
            *args,
            *(["-f", "-"] if values is not None else []),
        ]
        result = subprocess.run(argv, input=yaml.safe_dump(values) if values is not None else None,
                                env=self.env, capture_output=True, text=True, timeout=180,
                                check=False)  # fmt: skip
        assert result.returncode == 0, (
            f"helm {' '.join(args)} exited {result.returncode}: {result.stderr}"
        )
        return result.stdout


@pytest.fixture(scope="module")
def helm(kube: kube_cluster.Kube, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    beside_kubectl = Path(kube.kubectl_path).parent / "helm"
    bin_dir = kube_cluster.built_binaries()
    for candidate in (
        str(beside_kubectl),
        str(bin_dir / "helm") if bin_dir else None,
        shutil.which("helm"),
    ):
        if candidate and Path(candidate).is_file():
            return Helm(candidate, kube, tmp_path_factory.mktemp("helm"))
    pytest.skip(f"no helm: run {kube_cluster.BUILD_SCRIPT} or put helm on PATH")


@pytest.fixture
def other_namespace(kube: kube_cluster.Kube) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def allowed(
    kube: kube_cluster.Kube, user: str, checks: list[tuple[str, str, str]], namespace: str
) -> dict[tuple[str, str, str], bool]:
    """The API server's authorizer's answer for each (group, resource[/subresource], verb), as
    ``user``."""
    reviews = []
    for group, resource, verb in checks:
        name, _, subresource = resource.partition("/")
        attributes = {
            "namespace": namespace,
            "verb": verb,
            "group": group,
            "resource": name,
            "subresource": subresource,
        }
        reviews.append({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": ["system:serviceaccounts", "system:authenticated"],
                     "resourceAttributes": attributes},
        })  # fmt: skip
    out = kube.kubectl(
        "create",
        "-o",
        "json",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": reviews}),
    ).stdout
    decoder, answers, position = json.JSONDecoder(), [], 0
    while position < len(out.rstrip()):
        review, position = decoder.raw_decode(out, position)
        answers.append(review["status"]["allowed"])
        while position < len(out) and out[position].isspace():
            position += 1
    return dict(zip(checks, answers, strict=True))


def granted(rules: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted(
        {
            (g, r, v)
            for rule in rules
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }
    )


def test_install_grants_exactly_the_rules_and_uninstall_keeps_the_crds(
    kube: kube_cluster.Kube, helm: Helm, namespace: str
) -> None:
    release = f"r{uuid.uuid4().hex[:6]}"
    # --take-ownership: earlier tests may have applied the CRDs with kubectl, as a user may have.
    helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--take-ownership",
        "--force-conflicts",
    )
    operator = f"system:serviceaccount:{namespace}:{release}-openforge-operator"
    kube.get_json("-n", namespace, "deployment", f"{release}-openforge-operator")
    kube.get_json("-n", namespace, "service", f"{release}-openforge-collector")
    for where in (namespace, "default"):  # cluster-wide: every namespace
        answers = allowed(kube, operator, granted(permissions.RULES) + NOT_GRANTED, where)
        assert [check for check in granted(permissions.RULES) if not answers[check]] == [], where
        assert [check for check in NOT_GRANTED if answers[check]] == [], where
    trainer = f"system:serviceaccount:{namespace}:{release}-openforge-trainer"
    assert not any(allowed(kube, trainer, granted(permissions.RULES), namespace).values()), (
        "the trainer may call nothing"
    )

    helm("uninstall", release, "--namespace", namespace)
    kube_cluster.wait_for(
        lambda: (
            kube.kubectl(
                "get", "clusterrole", f"{release}-openforge-operator", check=False
            ).returncode
            != 0
        ),
        what="the ClusterRole to be deleted",
    )
    crd = kube.get_json("crd", "rolloutjobs.openforge.dev")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "deletionTimestamp" not in crd["metadata"]
    kube.get_json("-n", namespace, "pvc", f"{release}-openforge-trainer-store")  # kept too


def test_namespaced_install_grants_only_the_watched_namespace(
    kube: kube_cluster.Kube, helm: Helm, namespace: str, other_namespace: str
) -> None:
    release = f"r{uuid.uuid4().hex[:6]}"
    values = {
        "crds": {"install": False},
        "operator": {"watchNamespaces": [other_namespace]},
        "trainer": {"enabled": False},
    }
    helm("install", release, str(CHART), "--namespace", namespace, values=values)
    operator = f"system:serviceaccount:{namespace}:{release}-openforge-operator"
    try:
        assert all(allowed(kube, operator, granted(permissions.RULES), other_namespace).values())
        assert not any(allowed(kube, operator, granted(permissions.RULES), "default").values())
        assert not any(allowed(kube, operator, granted(permissions.WEBHOOK_RULES), "").values()), (
            "no webhook, no webhook rights"
        )
    finally:
        helm("uninstall", release, "--namespace", namespace)


def test_upgrades_keep_the_generated_collector_master_key(
    kube: kube_cluster.Kube, helm: Helm, namespace: str
) -> None:
    """A new key would void the token of every running job: the chart reads it back."""
    release = f"r{uuid.uuid4().hex[:6]}"
    values = {
        "crds": {"install": False},
        "operator": {"watchNamespaces": [namespace]},
        "trainer": {"enabled": False},
    }
    helm("install", release, str(CHART), "--namespace", namespace, values=values)
    try:
        secret = kube.get_json(
            "-n", namespace, "secret", f"{release}-openforge-collector-master-key"
        )
        assert (
            secret["immutable"] is True
            and len(base64.b64decode(secret["data"]["master-key"])) == 64
        )
        helm(
            "upgrade",
            release,
            str(CHART),
            "--namespace",
            namespace,
            values={**values, "commonLabels": {"upgraded": "yes"}},
        )
        after = kube.get_json(
            "-n", namespace, "secret", f"{release}-openforge-collector-master-key"
        )
        assert after["metadata"]["labels"]["upgraded"] == "yes", "the upgrade did reach the Secret"
        assert after["data"] == secret["data"]
    finally:
        helm("uninstall", release, "--namespace", namespace)


def test_webhook_and_trainer_render_is_admitted(
    kube: kube_cluster.Kube, helm: Helm, namespace: str
) -> None:
    values = {
        "crds": {"install": False},
        "operator": {"watchNamespaces": [namespace], "webhook": {"enabled": True}},
        "trainer": {
            "train": {
                "enabled": True,
                "job": "react-toy",
                "model": "/opt/openforge/models/tiny-react",
            },
            "persistence": {"enabled": False},
        },
    }
    out = helm(
        "install", "dry", str(CHART), "--namespace", namespace, "--dry-run=server", values=values
    )
    assert (
        "kind: MutatingWebhookConfiguration" in out
        and "kind: ValidatingWebhookConfiguration" in out
    )
    assert "name: dry-openforge-capture" in out


def test_the_webhook_the_operator_registers_is_admitted(
    kube: kube_cluster.Kube, helm: Helm, namespace: str
) -> None:
    """What kopf writes into the chart's configuration (named as the chart names it) passes
    validation."""
    rendered = helm(
        "template",
        "of",
        str(CHART),
        "--namespace",
        namespace,
        values={"operator": {"webhook": {"enabled": True}}},
    )
    (configuration,) = [
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] == "MutatingWebhookConfiguration"
    ]
    name = configuration["metadata"]["name"]
    configuration["metadata"]["name"] = (
        f"t-{uuid.uuid4().hex[:8]}"  # a dry run, but keep clear of real ones
    )
    configuration["webhooks"] = [{
        "name": f"{webhook.HANDLER_ID}.{name}",
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                   "operations": ["CREATE"], "scope": "*"}],
        "objectSelector": {"matchExpressions": [{"key": webhook.CAPTURE_LABEL, "operator": "In",
                                                 "values": ["true"]}]},
        "clientConfig": {"url": f"https://of-openforge-operator-webhook.{namespace}.svc:9443/{webhook.HANDLER_ID}"},
        "timeoutSeconds": 30,
        "admissionReviewVersions": ["v1", "v1beta1"],
    }]  # fmt: skip
    kube.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(configuration))


def test_the_cluster_examples_are_admitted(kube: kube_cluster.Kube, namespace: str) -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    kube.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/harnessenvs.openforge.dev",
        "crd/rolloutjobs.openforge.dev",
    )
    for name in ("tasks.yaml", "policy.yaml", "harnessenv.yaml", "rolloutjob.yaml"):
        kube.kubectl(
            "-n",
            namespace,
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            str(EXAMPLES / name),
        )


def test_rbac_scopes_the_chart_assumes_are_the_api_servers(kube: kube_cluster.Kube) -> None:
    """scripts/sync_deploy_files.py splits rules by scope from its own table; the API server
    agrees."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "sync_deploy_files", ROOT / "scripts" / "sync_deploy_files.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    served: dict[tuple[str, str], bool] = {}
    for namespaced in (True, False):
        for name in kube.kubectl(
            "api-resources", f"--namespaced={str(namespaced).lower()}", "-o", "name"
        ).stdout.split():
            resource, _, group = name.partition(".")
            served[(group, resource)] = namespaced
    checked = 0
    for table, namespaced in ((script.CLUSTER_SCOPED, False), (script.NAMESPACED, True)):
        for group, resource in table:
            if "/" in resource or (group, resource) not in served:
                # subresources share their resource's scope; kopf.dev and our CRDs may be absent
                continue
            assert served[(group, resource)] == namespaced, (group, resource)
            checked += 1
    assert checked >= 15
