"""operator/Dockerfile, checked without Docker (none here): the files it copies exist,
it installs the operator extra, runs as the chart's user, and what it runs starts with
only what it installs (no torch, transformers or veRL). The build itself has not run here."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from openforge_operator import settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "operator" / "Dockerfile"
NOT_IN_OPERATOR = ["torch", "transformers", "verl", "safetensors", "tensorboard", "matplotlib"]
BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is not installed in this image", name=name)
        return None
sys.meta_path.insert(0, Refuse())
"""


def steps() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def test_every_copied_path_exists() -> None:
    for word, args in steps():
        if word == "COPY" and not args.startswith("--from"):
            *sources, _ = shlex.split(args)
            for source in sources:
                assert (ROOT / source).exists(), source


def test_installs_the_operator_extra_and_runs_openforge_operator_as_the_charts_user() -> None:
    all_steps = steps()
    final = all_steps[max(i for i, (word, _) in enumerate(all_steps) if word == "FROM") :]
    assert ("USER", "65532:65532") in final
    assert ("ENTRYPOINT", json.dumps(["openforge", "operator"])) in final
    # the operator extra (the stages' layout: tests/deploy/test_dockerfiles.py)
    assert ("RUN", "python requirements.py operator < pyproject.toml > requirements.txt") in (
        all_steps
    )
    (project,) = [args for word, args in final if word == "RUN" and "--no-deps" in args]
    assert "pip install --no-cache-dir --no-deps /tmp/src" in project
    # byte-compiled in the image (PYTHONDONTWRITEBYTECODE and a read-only root keep
    # every start from writing its own): uncompiled, each process of every pod
    # compiled the project's modules anew (bench/kind_startup.py)
    assert "--no-compile" not in project


def test_what_the_operator_image_runs_needs_no_training_stack() -> None:
    code = BLOCKER + (
        "import openforge_operator.handlers, openforge_operator.cli, openforge_operator.certs\n"
        "from openforge import cli\n"
        "cli.main(['operator', '--help'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, ",".join(NOT_IN_OPERATOR)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--all-namespaces" in result.stdout


def test_the_default_sidecar_image_is_the_sidecar_images() -> None:
    assert settings.DEFAULT_SIDECAR_IMAGE.startswith("ghcr.io/openforge/sidecar:")
