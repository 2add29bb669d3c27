"""sidecar/Dockerfile and trainer/Dockerfile, checked without Docker (none here).

What can be checked on this machine is checked: every file the builds copy
exists, the images run as the users the operator and chart expect, their
entrypoints are `openforge` commands, and, the real risk, that what each image
runs imports and starts with only the dependencies that image installs (the
sidecar image has no torch and no kopf; the trainer image no kopf). That last
check runs the commands in a fresh interpreter whose import system refuses the
missing distributions. The builds themselves have not been run here.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from openforge_operator import settings

ROOT = Path(__file__).resolve().parents[2]

# Top-level modules of the dependencies each image does not install.
NOT_IN_SIDECAR = [
    "torch",
    "transformers",
    "verl",
    "safetensors",
    "tensorboard",
    "matplotlib",
    "kopf",
    "kubernetes_asyncio",
]
NOT_IN_TRAINER = ["kopf", "kubernetes_asyncio"]

BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is not installed in this image", name=name)
        return None
sys.meta_path.insert(0, Refuse())
sys.argv = sys.argv[2:]
"""


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = dockerfile.read_text().replace("\\\n", " ")
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    steps = instructions(dockerfile)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def run_without(blocked: list[str], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code, ",".join(blocked)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("component", ["sidecar", "trainer"])
def test_every_copied_path_exists(component: str) -> None:
    for word, args in instructions(ROOT / component / "Dockerfile"):
        if word == "COPY" and not args.startswith("--from"):
            *sources, _ = shlex.split(args)
            for source in sources:
                assert (ROOT / source).exists(), (
                    f"{component}/Dockerfile copies {source}, which does not exist"
                )


def test_sidecar_image_runs_as_the_operators_sidecar_user() -> None:
    steps = final_stage(ROOT / "sidecar" / "Dockerfile")
    uid = settings.Settings().sidecar_uid
    assert ("USER", f"{uid}:{uid}") in steps
    assert ("ENTRYPOINT", json.dumps(["openforge", "sidecar"])) in steps


def test_trainer_image_runs_as_the_charts_user() -> None:
    steps = final_stage(ROOT / "trainer" / "Dockerfile")
    assert ("USER", "65532:65532") in steps
    assert ("ENTRYPOINT", json.dumps(["openforge"])) in steps


@pytest.mark.parametrize(
    ("component", "extras"), [("sidecar", ""), ("trainer", " train"), ("operator", " operator")]
)
def test_dependencies_come_before_the_sources_with_only_the_components_extras(
    component: str, extras: str
) -> None:
    """The requirements are read from pyproject.toml in a stage of their own; the
    dependencies are installed from them and the constraints alone, in a layer that neither
    a source change nor an edit of pyproject.toml that keeps the requirements invalidates;
    the project is installed after them without its dependencies."""
    steps = instructions(ROOT / component / "Dockerfile")
    froms = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    assert [steps[i][1] for i in froms] == [
        "${PYTHON_IMAGE} AS requirements",
        "${PYTHON_IMAGE} AS deps",
        "deps",
    ]
    reading = steps[froms[0] : froms[1]]
    assert [shlex.split(args)[:-1] for word, args in reading if word == "COPY"] == [
        ["pyproject.toml", "docker/requirements.py"]
    ]
    assert [args for word, args in reading if word == "RUN"] == [
        f"python requirements.py{extras} < pyproject.toml > requirements.txt"
    ]
    installing = steps[froms[1] : froms[2]]
    assert [shlex.split(args)[:-1] for word, args in installing if word == "COPY"] == [
        ["constraints.txt"],
        ["--from=requirements", "/src/requirements.txt"],
    ], "only what the dependencies are read from"
    (install,) = [args for word, args in installing if word == "RUN"]
    assert install.endswith("-c constraints.txt -r requirements.txt")
    (project,) = [
        i for i, (word, args) in enumerate(steps) if word == "RUN" and "--no-deps" in args
    ]
    assert project > froms[2]
    assert "--no-compile" not in steps[project][1], (
        "the project is byte-compiled in the image, not at every start"
    )


def test_requirements_are_the_dependencies_and_the_named_extras() -> None:
    script = ROOT / "docker" / "requirements.py"
    pyproject = (ROOT / "pyproject.toml").read_text()

    def run(*extras: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), *extras],
            input=pyproject,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    base, train = run().stdout.split(), run("train").stdout.split()
    assert any(r.startswith("mitmproxy") for r in base) and not any(
        r.startswith("torch") for r in base
    )
    assert set(base) < set(train) and any(r.startswith("torch") for r in train)
    bad = run("nosuch")
    assert bad.returncode != 0 and "no extra ['nosuch']" in bad.stderr


def test_what_the_sidecar_image_runs_needs_neither_torch_nor_kopf() -> None:
    code = (
        "import openforge_sidecar.podagent, openforge_sidecar.capture, openforge_sidecar.addon\n"
        "from openforge import cli\n"
        "cli.main(['sidecar', '--help'])\n"
    )
    result = run_without(NOT_IN_SIDECAR, code)
    assert result.returncode == 0, result.stderr
    assert "--spool" in result.stdout


def test_what_the_trainer_image_runs_needs_no_kopf() -> None:
    code = (
        "import contextlib\n"
        "from openforge import cli\n"
        "for command in ('collector', 'train', 'serve'):\n"
        "    with contextlib.suppress(SystemExit):\n"
        "        cli.main([command, '--help'])\n"
        "    print('ok', command)\n"
    )
    result = run_without(NOT_IN_TRAINER, code)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if line.startswith("ok ")] == [
        "ok collector",
        "ok train",
        "ok serve",
    ]


def test_the_blocker_does_block() -> None:
    result = run_without(NOT_IN_SIDECAR, "import torch\n")
    assert result.returncode != 0
    assert "torch is not installed in this image" in result.stderr


@pytest.mark.parametrize("component", ["operator", "sidecar", "trainer"])
def test_the_image_builds_on_its_dependency_stage_so_the_two_share_their_layers(
    component: str,
) -> None:
    """``FROM deps``, not ``COPY --from=deps /opt/openforge`` into a fresh base: the copy is a
    layer of its own, and with the ``openforge/deps-*`` tag images.sh keeps, the trainer's 7 GB
    of torch and CUDA were stored twice (the CI machine's disk ran out building it)."""
    steps = instructions(ROOT / component / "Dockerfile")
    froms = [args for word, args in steps if word == "FROM"]
    assert froms[-2:] == ["${PYTHON_IMAGE} AS deps", "deps"]
    copied = [args for word, args in steps if word == "COPY" and args.startswith("--from")]
    assert copied == ["--from=requirements /src/requirements.txt ./"], "no stage's venv copied"


@pytest.mark.parametrize(
    "dockerfile",
    sorted(ROOT.glob("*/Dockerfile")) + sorted(ROOT.glob("examples/harnesses/*/Dockerfile")),
    ids=str,
)
def test_the_tests_a_dockerfile_names_exist(dockerfile: Path) -> None:
    named = re.findall(r"\btests/[\w/.-]+\.py", dockerfile.read_text())
    assert [path for path in named if not (ROOT / path).is_file()] == []
