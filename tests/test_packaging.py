"""One distribution, one package per component: the built wheel must hold
every package and asset and import cleanly without this checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("openforge-*.whl")
    return built


def test_wheel_holds_every_package_and_the_tokenizer_assets(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "openforge/cli.py",
        "openforge/trajectory/v1/trajectory_pb2.py",
        "openforge/trajectory/v1/trajectory_pb2_grpc.py",
        "openforge/trajectory/v1/trajectory.proto",
        "openforge_sidecar/capture.py",
        "openforge_sidecar/addon.py",
        "openforge/wire/codecs/openai_responses.py",
        "openforge/wire/conversation.py",
        "openforge_trainer/collection/collector.py",
        "openforge_trainer/assets/tiny-tokenizer/tokenizer.json",
        "openforge_trainer/assets/tiny-tokenizer/tokenizer_config.json",
    ):
        assert required in names, required
    assert not any(name.startswith("operator/") for name in names), "no package may be called operator"


def test_wheel_imports_cleanly_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = (
        "import openforge.trajectory.v1.trajectory_pb2_grpc, openforge_sidecar.capture, openforge_trainer.collection.collector;"
        "import openforge.wire.codecs.gemini, openforge.wire.codecs.openai_responses;"
        "import openforge_sidecar, openforge_trainer, openforge, sys;"
        f"assert all(m.__file__.startswith({str(site)!r}) for m in (openforge, openforge_sidecar, openforge_trainer)), "
        "[m.__file__ for m in (openforge, openforge_sidecar, openforge_trainer)];"
        "from openforge_trainer import tokenizer_build; assert tokenizer_build.committed_assets().is_dir()"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_the_cli_lists_every_command() -> None:
    result = subprocess.run([sys.executable, "-m", "openforge.cli", "--help"], capture_output=True, text=True, check=True)
    for command in ("sidecar", "collector", "trajectories", "test-engine", "tokenizer"):
        assert command in result.stdout
    bad = subprocess.run([sys.executable, "-m", "openforge.cli", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown command 'nope'" in bad.stderr
