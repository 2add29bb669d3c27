"""A Kubernetes API server for tests, driven through kubectl.

Either the cluster that ``$KUBECONFIG`` names (kind, or any other), or a local
control plane started by ``scripts/cluster.sh`` from binaries that
``scripts/build_cluster_binaries.sh`` compiles (see docs/cluster-testing.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build_cluster_binaries.sh"
CLUSTER_SCRIPT = ROOT / "scripts" / "cluster.sh"
SKIP_BUILD_ENV = "OPENFORGE_SKIP_CLUSTER_BUILD"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries its command and stderr."""

    def __init__(self, args: list[str], returncode: int, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(args)} exited {returncode}: {stderr.strip()}")
        self.returncode = returncode
        self.stderr = stderr


@dataclass(frozen=True)
class Kube:
    """One reachable cluster: its kubeconfig and a kubectl to talk to it."""

    kubeconfig: Path
    kubectl_path: str

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl ARGS`` against this cluster; raise KubectlError on failure when
        ``check``."""
        cmd = [self.kubectl_path, "--kubeconfig", str(self.kubeconfig), *args]
        result = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(list(args), result.returncode, result.stderr)
        return result

    def get_json(self, *args: str) -> dict[str, Any]:
        """``kubectl get ARGS -o json``, parsed."""
        parsed: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return parsed

    def apply(self, manifest: str, namespace: str | None = None) -> None:
        """``kubectl apply`` a YAML or JSON manifest given as text."""
        ns = ["--namespace", namespace] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", stdin=manifest)

    def simulated(self) -> bool:
        """Whether this cluster's nodes are kwok fakes (no containers run)."""
        nodes = self.get_json("nodes")["items"]
        return bool(nodes) and all(
            FAKE_NODE_ANNOTATION in (n["metadata"].get("annotations") or {}) for n in nodes
        )


def wait_for(
    condition: Callable[[], bool], *, what: str, timeout: float = 30.0, interval: float = 0.2
) -> None:
    """Poll ``condition`` until it holds; TimeoutError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def built_binaries() -> Path | None:
    """The folder of built cluster binaries, or None while any is missing."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    return Path(lines[-1]) if result.returncode == 0 and lines else None


def build_binaries() -> Path:
    """Build the cluster binaries (tens of minutes cold; seconds when cached)."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} exited {result.returncode}; see its output above")
    return Path(result.stdout.strip().splitlines()[-1])


def start_local(directory: Path, bin_dir: Path) -> Kube:
    """``scripts/cluster.sh up`` into ``directory``; its output lands in ``directory``/up.log."""
    env = {**os.environ, "OPENFORGE_CLUSTER_BIN": str(bin_dir)}
    log = directory / "up.log"
    with log.open("w") as handle:
        result = subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), "up", "--dir", str(directory)],
            stdout=subprocess.PIPE,
            stderr=handle,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(
            f"cluster.sh up failed ({result.returncode}):\n{log.read_text(errors='replace')}"
        )
    return Kube(
        kubeconfig=Path(result.stdout.strip().splitlines()[-1]),
        kubectl_path=str(bin_dir / "kubectl"),
    )


def stop_local(directory: Path) -> None:
    subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "down", "--dir", str(directory)],
        capture_output=True,
        timeout=120,
        check=False,
    )


def from_kubeconfig(kubeconfig: str) -> Kube:
    """The cluster an existing kubeconfig names, reached with kubectl from PATH or our build."""
    if os.pathsep in kubeconfig:
        raise ValueError(f"KUBECONFIG={kubeconfig!r}: name one file, not a list")
    path = Path(kubeconfig)
    if not path.is_file():
        raise FileNotFoundError(f"KUBECONFIG={kubeconfig!r}: no such file")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        bin_dir = built_binaries()
        if bin_dir is None:
            raise FileNotFoundError(
                f"KUBECONFIG is set but no kubectl is on PATH; put one there or run {BUILD_SCRIPT}"
            )
        kubectl = str(bin_dir / "kubectl")
    return Kube(kubeconfig=path, kubectl_path=kubectl)
