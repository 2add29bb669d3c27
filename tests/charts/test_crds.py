"""The chart's CRDs are the repository's crds/, byte for byte, rendered only
when crds.install is on and kept on uninstall unless crds.keep is off."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from helm_chart import CHART, ROOT, Helm, find

CRDS = sorted((ROOT / "crds").glob("*.yaml"))
COPIES = CHART / "files" / "crds"


def test_the_chart_holds_an_exact_copy_of_each_crd() -> None:
    assert [path.name for path in CRDS] == sorted(path.name for path in COPIES.glob("*.yaml"))
    for path in CRDS:
        assert (COPIES / path.name).read_bytes() == path.read_bytes(), (
            f"charts/openforge/files/crds/{path.name} differs from crds/{path.name}; run "
            "scripts/sync_deploy_files.py"
        )


@pytest.mark.parametrize("path", CRDS, ids=lambda path: Path(path).name)
def test_rendered_crd_is_the_generated_one_plus_labels_and_keep(helm: Helm, path: Path) -> None:
    generated = yaml.safe_load(path.read_text())
    (rendered,) = find(helm.template(), "CustomResourceDefinition", generated["metadata"]["name"])
    expected = copy.deepcopy(generated)
    expected["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep"}
    expected["metadata"]["labels"] = rendered["metadata"]["labels"]
    assert rendered["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert rendered == expected


def test_crds_off_renders_none_and_keep_off_drops_the_annotation(helm: Helm) -> None:
    assert not find(helm.template({"crds": {"install": False}}), "CustomResourceDefinition")
    rendered = find(helm.template({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert len(rendered) == len(CRDS)
    assert all("annotations" not in crd["metadata"] for crd in rendered)
