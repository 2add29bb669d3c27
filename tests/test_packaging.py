"""One distribution, one package per component: the built wheel must hold
every package and asset and import cleanly without this checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


#: Left out of the copy the wheel is built from: a stale ``build/`` would
#: put modules that no longer exist into the wheel.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", "build", "dist", "runs", "*.egg-info", "__pycache__", ".*_cache", "node_modules"
)


def packages() -> list[str]:
    """Every package pyproject.toml lists for the wheel."""
    return list(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source") / "openforge"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("openforge-*.whl")
    return built


def test_every_package_with_modules_is_listed() -> None:
    """A subpackage left out of ``packages`` would be missing from the wheel, silently."""
    roots = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    found = {
        ".".join((name, *init.parent.relative_to(ROOT / folder).parts))
        for name, folder in roots.items()
        for init in (ROOT / folder).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found - {"openforge_trainer.assets"} <= set(packages()), sorted(found - set(packages()))


def test_wheel_holds_every_package_and_the_tokenizer_assets(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "openforge/cli.py",
        "openforge/trajectory/v1/trajectory_pb2.py",
        "openforge/trajectory/v1/trajectory_pb2_grpc.py",
        "openforge_sidecar/capture.py",
        "openforge_sidecar/addon.py",
        "openforge/wire/codecs/openai_responses.py",
        "openforge/wire/conversation.py",
        "openforge_runner/runner.py",
        "openforge_trainer/collection/collector.py",
        "openforge_trainer/assets/tiny-tokenizer/tokenizer.json",
        "openforge_trainer/assets/tiny-tokenizer/tokenizer_config.json",
    ):
        assert required in names, required
    assert not any(name.startswith("operator/") for name in names), (
        "no package may be called operator"
    )


def test_wheel_imports_cleanly_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    modules = [*packages(), "openforge_sidecar.capture", "openforge_trainer.collection.collector"]
    script = (
        f"import importlib; [importlib.import_module(m) for m in {modules!r}];"
        "import openforge_sidecar, openforge_trainer, openforge_runner, openforge, sys;"
        "top = (openforge, openforge_sidecar, openforge_trainer, openforge_runner);"
        f"assert all(m.__file__.startswith({str(site)!r}) for m in top), [m.__file__ for m in top];"
        "from openforge_trainer.tiny import tokenizer_build; assert "
        "tokenizer_build.committed_assets().is_dir()"
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
    result = subprocess.run(
        [sys.executable, "-m", "openforge.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    for command in ("sidecar", "collector", "trajectories", "test-engine", "tokenizer"):
        assert command in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "openforge.cli", "nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown command 'nope'" in bad.stderr
