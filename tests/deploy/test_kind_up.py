"""scripts/kind-up.sh's own checks, without a cluster: what it refuses and how it says so.

Everything it does to a cluster (up, load, images, demo, demo-down) runs for real in the
kind tier (tests/kind), against the cluster it makes.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kind-up.sh"


def kind_up(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENFORGE_CACHE": str(tmp_path / "cache"), "KIND": "/bin/false"}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_unknown_subcommand_is_a_usage_error_naming_them_all(tmp_path: Path) -> None:
    result = kind_up(tmp_path, "sideways")
    assert result.returncode == 1
    for word in ("up", "load", "images", "demo", "demo-down", "kubeconfig", "down"):
        assert word in result.stderr


@pytest.mark.parametrize("subcommand", ["demo", "demo-down", "kubeconfig"])
def test_commands_that_need_a_cluster_refuse_without_its_kubeconfig(
    tmp_path: Path, subcommand: str
) -> None:
    result = kind_up(tmp_path, subcommand)
    assert result.returncode == 1 and "run:" in result.stderr and "up" in result.stderr, (
        result.stderr
    )


def test_load_needs_an_image(tmp_path: Path) -> None:
    result = kind_up(tmp_path, "load")
    assert result.returncode == 1 and "usage: kind-up.sh load IMAGE" in result.stderr
