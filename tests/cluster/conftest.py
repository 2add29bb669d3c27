"""The ``kube`` fixture: a real Kubernetes API server for tests marked ``cluster``.

With ``$KUBECONFIG`` set, the tests run against that cluster (kind, for one).
Otherwise a local control plane is started for the session by
``scripts/cluster.sh`` (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok fake nodes) and stopped at its end. Its binaries are built
from the Go module proxy when missing, once, while tests are collected (so the
build does not count against any test's timeout), unless
``OPENFORGE_SKIP_CLUSTER_BUILD=1``, which skips the cluster tests instead.

Tests run with ``--import-mode=importlib``, which puts no test folder on
``sys.path``; this folder's helper module (``kube_cluster``) is made importable
here.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import kube_cluster  # noqa: E402


def _wants_local_cluster() -> bool:
    return not os.environ.get("KUBECONFIG") and os.environ.get(kube_cluster.SKIP_BUILD_ENV) != "1"


_BUILD_ERROR = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)  # after -m/-k deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.option.collectonly or not _wants_local_cluster():
        return
    if (
        any(item.get_closest_marker("cluster") for item in items)
        and kube_cluster.built_binaries() is None
    ):
        try:
            kube_cluster.build_binaries()
        except RuntimeError as exc:  # reported by the fixture, as an error of each cluster test
            config.stash[_BUILD_ERROR] = str(exc)


@pytest.fixture(scope="session")
def kube(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[kube_cluster.Kube]:
    kubeconfig = os.environ.get("KUBECONFIG")
    if kubeconfig:
        cluster = kube_cluster.from_kubeconfig(kubeconfig)
        cluster.kubectl("get", "--raw", "/readyz")
        yield cluster
        return
    bin_dir = kube_cluster.built_binaries()
    if bin_dir is None:
        if os.environ.get(kube_cluster.SKIP_BUILD_ENV) == "1":
            pytest.skip(
                f"cluster binaries are not built and {kube_cluster.SKIP_BUILD_ENV}=1; run "
                "scripts/build_cluster_binaries.sh or set KUBECONFIG"
            )
        build_error = request.config.stash.get(_BUILD_ERROR, None)
        if build_error is not None:
            pytest.fail(f"building the cluster binaries failed: {build_error}", pytrace=False)
        bin_dir = kube_cluster.build_binaries()
    directory = tmp_path_factory.mktemp("cluster")
    try:
        yield kube_cluster.start_local(directory, bin_dir)
    finally:
        kube_cluster.stop_local(directory)


@pytest.fixture
def namespace(kube: kube_cluster.Kube) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) at its end.

    Pods are admitted only once the namespace's ``default`` service account
    exists (the service-account controller makes it), so that is awaited.
    """
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.kubectl("create", "namespace", name)
    kube_cluster.wait_for(
        lambda: (
            kube.kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode
            == 0
        ),
        what=f"serviceaccount default in {name}",
    )
    try:
        yield name
    finally:
        kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
