"""The ``helm`` fixture: the pinned helm that scripts/build_cluster_binaries.sh builds.

Found the way the cluster tests find their binaries (``kube_cluster.built_binaries``,
i.e. ``build_cluster_binaries.sh --check``), else ``helm`` on PATH. Tests that
need it are skipped, with the reason, when neither exists; nothing is built
here (the cluster tests' collection hook builds the binaries when a cluster
test is selected).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

_CLUSTER_TESTS = str(Path(__file__).resolve().parents[1] / "cluster")
if _CLUSTER_TESTS not in sys.path:
    sys.path.insert(0, _CLUSTER_TESTS)

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import helm_chart  # noqa: E402
import kube_cluster  # noqa: E402


@pytest.fixture(scope="session")
def helm() -> helm_chart.Helm:
    bin_dir = kube_cluster.built_binaries()
    if bin_dir is not None and (bin_dir / "helm").is_file():
        return helm_chart.Helm(str(bin_dir / "helm"))
    on_path = shutil.which("helm")
    if on_path is not None:
        return helm_chart.Helm(on_path)
    pytest.skip(
        f"no helm: run {kube_cluster.BUILD_SCRIPT} (builds the pinned helm) or put helm on PATH"
    )
