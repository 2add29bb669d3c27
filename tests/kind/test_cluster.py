"""The offline kind cluster itself, checked with real pods by ``scripts/kind/smoke.sh``:
node Ready, CoreDNS, a pod that resolves cluster names and reaches another pod's
Service, no way out of the node (a listener on this machine's side of kind's network,
which the node reaches, is refused to pods), and NetworkPolicy enforced (a deny-all
policy blocks a pod-to-pod connection that works without it and again after it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import kube_cluster
import pytest

pytestmark = pytest.mark.kind

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_smoke(kind: kube_cluster.Kube) -> None:
    env = {**os.environ, "KUBECONFIG": str(kind.kubeconfig), "KUBECTL": kind.kubectl_path}
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "kind" / "smoke.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert result.returncode == 0, (
        f"smoke.sh exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )
    for check in (
        "cluster DNS, Service of another pod, no way out",
        "deny-all NetworkPolicy blocks it",
        "connection works again",
    ):
        assert check in result.stdout, result.stdout
