"""deploy/argocd/argocd-cm.yaml merges into an existing argocd-cm with the
command docs/cluster.md gives, keeping Argo CD's own keys."""

from __future__ import annotations

from pathlib import Path

import kube_cluster
import pytest
import yaml

pytestmark = pytest.mark.cluster

PATCH = Path(__file__).resolve().parents[2] / "deploy" / "argocd" / "argocd-cm.yaml"


def test_the_patch_merges_into_argocd_cm(kube: kube_cluster.Kube, namespace: str) -> None:
    existing = {"url": "https://argocd.example.com", "timeout.reconciliation": "180s"}
    kube.apply(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "argocd-cm"},
                "data": existing,
            }
        ),
        namespace,
    )
    # The docs' command, with the test's namespace for "argocd".
    kube.kubectl(
        "-n",
        namespace,
        "patch",
        "configmap",
        "argocd-cm",
        "--type",
        "merge",
        "--patch-file",
        str(PATCH),
    )
    data = kube.get_json("-n", namespace, "configmap", "argocd-cm")["data"]
    assert data == {**existing, **yaml.safe_load(PATCH.read_text())["data"]}
