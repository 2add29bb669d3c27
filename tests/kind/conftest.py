"""The ``kind`` fixture: a real kind cluster (kubelet, containerd, real containers) for
tests marked ``kind``.

``scripts/kind-up.sh up`` creates (or reuses) the cluster, building its node image
offline when no stock ``kindest/node`` is at hand, and ``scripts/kind-up.sh images``
builds the project's images (``scripts/images.sh tier``) and loads them into the node.
Both run once while tests are collected, so a cold build counts against no test's
timeout. Docker is required: ``scripts/docker.sh`` installs and starts it where it
can (root with apt). Only a machine where Docker can neither be found nor installed
skips the tier, with that reason; on any other machine a failure to bring the cluster
up is an error of every ``kind`` test, never a skip.

With ``OPENFORGE_KIND_REUSE=1`` the tier runs on the cluster and the images loaded as
they are (a developer's loop after ``scripts/kind-up.sh load``). The cluster stays up after the
session (the next session reuses it in seconds); ``scripts/kind-up.sh down`` removes it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIND_UP = ROOT / "scripts" / "kind-up.sh"
DOCKER_SH = ROOT / "scripts" / "docker.sh"
for _helpers in (str(ROOT / "tests" / "cluster"), str(Path(__file__).parent)):
    if _helpers not in sys.path:
        sys.path.insert(0, _helpers)

import kube_cluster  # noqa: E402
import realpods  # noqa: E402

_STATE = pytest.StashKey[dict[str, str]]()
REUSE_ENV = "OPENFORGE_KIND_REUSE"
"""Set to 1 to run the tier on the cluster and images as they are (no up, no image build)."""


def _docker_possible() -> bool:
    """Whether this machine has Docker or can install it (root with apt)."""
    if shutil.which("docker") or shutil.which("dockerd"):
        return True
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def _step(args: list[str], what: str, timeout: float) -> str:
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: no answer within {timeout:.0f} s") from None
    if result.returncode != 0:
        raise RuntimeError(f"{what} exited {result.returncode}:\n{result.stderr[-6000:]}")
    return result.stdout


@pytest.hookimpl(trylast=True)  # after -m/-k deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.option.collectonly or not any(item.get_closest_marker("kind") for item in items):
        return
    state: dict[str, str] = {}
    config.stash[_STATE] = state
    if not _docker_possible():
        state["skip"] = (
            "no Docker on this machine and it cannot be installed here (not root, or no apt)"
        )
        return
    try:
        if (
            os.environ.get(REUSE_ENV) == "1"
        ):  # a developer's loop: the cluster and images as they are
            state["kubeconfig"] = _step(
                ["bash", str(KIND_UP), "kubeconfig"], "scripts/kind-up.sh kubeconfig", 60
            ).strip()
            return
        _step(["bash", str(DOCKER_SH)], "scripts/docker.sh", 900)
        out = _step(["bash", str(KIND_UP), "up"], "scripts/kind-up.sh up", 3600)
        state["kubeconfig"] = out.strip().splitlines()[-1]
        _step(["bash", str(KIND_UP), "images"], "scripts/kind-up.sh images", 3600)
    except RuntimeError as error:
        state["error"] = str(error)


@pytest.fixture(scope="session")
def kind(request: pytest.FixtureRequest) -> kube_cluster.Kube:
    state = request.config.stash.get(_STATE, {})
    if "skip" in state:
        pytest.skip(state["skip"])
    if "error" in state:
        pytest.fail(f"the kind cluster could not be brought up: {state['error']}")
    if "kubeconfig" not in state:
        pytest.fail("the kind cluster was not prepared (collection hook did not run)")
    bin_dir = kube_cluster.built_binaries()
    kubectl = shutil.which("kubectl") if bin_dir is None else str(bin_dir / "kubectl")
    if kubectl is None:
        pytest.fail("no kubectl: run scripts/build_cluster_binaries.sh")
    cluster = kube_cluster.Kube(kubeconfig=Path(state["kubeconfig"]), kubectl_path=kubectl)
    cluster.kubectl("get", "--raw", "/readyz")
    assert not cluster.simulated(), "the kind tier runs on real nodes, not kwok fakes"
    return cluster


@pytest.fixture(scope="module")
def platform(kind: kube_cluster.Kube) -> kube_cluster.Kube:
    """The cluster with the chart and the demo's policy server installed (once per module:
    an earlier module may have changed them)."""
    realpods.ensure_platform(kind)
    return kind
