"""Every command in README.md's ``bash`` blocks is exercised by a test.

:data:`REGISTRY` maps each README command (by its leading words) to the tests
that run it, each with strings its test file must hold — the command's own
words, as that test spells them — so a mapping cannot silently outlive what
the test runs. This module fails when a README command matches no entry, an
entry matches no README command, a mapped test is gone (its file, or the
``def`` of that name), or its evidence is gone. The cheap commands are run
here, as written.

Some commands cannot run inside the test suite, and are mapped to the tests
that run the same thing: the demo with fewer iterations
(``tests/runner/test_learning.py``), the Codex demo on a slice of its tasks, the
CRD install against the test control plane (``-m cluster``); and
``scripts/test.sh`` is the suite itself, run by CI (``.ci/run``), which
also runs ``scripts/setup.sh`` and ``scripts/install_harnesses.sh``.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Exercise:
    """A test that runs a README command; ``evidence`` must appear in its file."""

    node: str  # tests/<path>.py::<test function>
    evidence: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return ROOT / self.node.split("::")[0]

    @property
    def function(self) -> str:
        return self.node.split("::")[-1].split("[")[0]


CI = Exercise(
    "tests/test_readme.py::test_ci_runs_the_test_command_which_sets_up_and_installs",
    ("scripts/test.sh", "scripts/setup.sh", "scripts/install_harnesses.sh"),
)
HERE = "tests/test_readme.py::test_cheap_commands_run_as_written"

REGISTRY: dict[str, tuple[Exercise, ...]] = {
    (
        "bash scripts/setup.sh >/dev/null && ~/.cache/openforge/venv/bin/openforge run "
        "examples/react-toy.yaml"
    ): (
        Exercise(
            "tests/runner/test_learning.py::test_reward_rises_inside_the_react_harness",
            ('"openforge.cli", "run"', '"react-toy.yaml"'),
        ),
        CI,
    ),
    "bash scripts/test.sh": (CI,),
    (
        "bash scripts/install_harnesses.sh >/dev/null && ~/.cache/openforge/venv/bin/openforge run "
        "examples/codex-toy.yaml --iterations 1 --no-train"
    ): (
        Exercise(
            "tests/examples/test_codex_toy.py::test_openforge_run_captures_graded_codex_rollouts",
            ('"openforge.cli", "run"', '"codex-toy.yaml"', '"--iterations", "1", "--no-train"'),
        ),
        CI,
    ),
    "openforge trajectories ls": (
        Exercise("tests/trainer/test_cli.py::test_ls", ('["ls", "--store"',)),
    ),
    "openforge trajectories show": (
        Exercise(
            "tests/trainer/test_cli.py::test_show_a_rollout_openforge_run_captured",
            ('"trajectories", "show", "react-toy-i0-0-0"', '"--tokenizer"'),
        ),
    ),
    "openforge trajectories export": (
        Exercise("tests/trainer/test_cli.py::test_export", ('"export"', '"--format"', '"--job"')),
    ),
    "bash scripts/kind-up.sh up": (
        Exercise(
            "tests/kind/test_demo_loop.py::test_the_demo_trains_in_real_pods",
            ('realpods.kind_up(kind, "demo")',),
        ),
        Exercise("tests/kind/test_cluster.py::test_smoke", ('"smoke.sh"',)),
    ),
    "kubectl apply --server-side -f crds/": (
        Exercise(
            "tests/cluster/test_api_crds.py::test_valid_manifests_are_accepted_and_read_back_through_the_models",
            ('kube.kubectl("apply", "--server-side"', 'ROOT / "crds"'),
        ),
    ),
    "openforge crds --check": (
        Exercise(HERE),
        Exercise(
            "tests/api/test_reference.py::test_crds_command_writes_and_checks_the_reference",
            ('"--check"',),
        ),
    ),
    "openforge --help": (
        Exercise(HERE),
        Exercise("tests/common/test_cli.py::test_help_lists_every_command", ('["--help"]',)),
    ),
}
CHEAP = ("openforge crds --check", "openforge --help")


def commands(markdown: str) -> list[str]:
    """The command lines of the ``bash`` blocks: continuations joined, comments and
    blank lines dropped, words normalized by shell quoting rules."""
    found = []
    for block in _BASH_BLOCK.findall(markdown):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                found.append(shlex.join(words))
    return found


def entry_for(command: str) -> str | None:
    """The registry entry whose words begin ``command`` (the longest, if several)."""
    words = shlex.split(command)
    matches = [key for key in REGISTRY if words[: len(shlex.split(key))] == shlex.split(key)]
    return max(matches, key=len) if matches else None


def missing(exercise: Exercise) -> str | None:
    """Why ``exercise`` does not (any longer) run its command, or None."""
    if not exercise.path.is_file():
        return f"{exercise.node}: no file {exercise.path.relative_to(ROOT)}"
    source = exercise.path.read_text()
    tree = ast.parse(source)
    defined = {
        node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    if exercise.function not in defined:
        return f"{exercise.node}: no test function {exercise.function}"
    gone = [text for text in exercise.evidence if text not in source]
    return f"{exercise.node}: no longer holds {gone}" if gone else None


def test_every_readme_command_is_mapped_to_a_test() -> None:
    found = commands(README.read_text())
    assert len(found) >= len(REGISTRY) - 1, found  # the parse found the blocks
    unmapped = [command for command in found if entry_for(command) is None]
    assert not unmapped, f"README commands no test exercises (add them to REGISTRY): {unmapped}"


def test_every_registry_entry_is_a_readme_command() -> None:
    used = {entry_for(command) for command in commands(README.read_text())}
    stale = sorted(set(REGISTRY) - used)
    assert not stale, f"REGISTRY entries no README command uses any more: {stale}"


@pytest.mark.parametrize("key", sorted(REGISTRY))
def test_every_mapped_test_exists_and_runs_the_command(key: str) -> None:
    problems = [problem for exercise in REGISTRY[key] if (problem := missing(exercise))]
    assert not problems, problems


def openforge() -> list[str]:
    """The environment's ``openforge`` script, as the README runs it."""
    script = Path(sys.executable).with_name("openforge")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "openforge.cli"]


@pytest.mark.parametrize("command", CHEAP)
def test_cheap_commands_run_as_written(command: str) -> None:
    [line] = [c for c in commands(README.read_text()) if c == command]
    argv = [*openforge(), *shlex.split(line)[1:]]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ci_runs_the_test_command_which_sets_up_and_installs() -> None:
    """``bash scripts/test.sh`` is what CI runs; it runs setup and the harness install
    before the suite, so every CI run executes the README's setup commands."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec bash scripts/test.sh" in ci
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    for step in (
        "bash scripts/setup.sh",
        "bash scripts/install_harnesses.sh",
        "ruff format --check",
        "bash scripts/pytest_split.sh",
    ):
        assert step in test_sh, step
    assert "python -m pytest" in (ROOT / "scripts" / "pytest_split.sh").read_text()


# -- the checker itself ---------------------------------------------------------------------


def test_commands_are_read_from_bash_blocks_only() -> None:
    markdown = (
        "text `openforge nope`\n```bash\n# a comment\nopenforge run a.yaml \\\n  --quiet  # why\n\n"
        "bash x.sh >/dev/null && y 'two words'\n```\n```\nnot bash\n```\n"
    )
    assert commands(markdown) == [
        "openforge run a.yaml --quiet",
        "bash x.sh '>/dev/null' '&&' y 'two words'",
    ]


def test_an_unmapped_command_or_a_vanished_test_is_caught(tmp_path: Path) -> None:
    assert entry_for("openforge trajectories show r --store s.db") == "openforge trajectories show"
    assert entry_for("openforge serve --model m") is None
    assert (
        missing(Exercise("tests/nope.py::test_x")) == "tests/nope.py::test_x: no file tests/nope.py"
    )
    gone = Exercise("tests/test_readme.py::test_that_was_renamed")
    assert missing(gone) == f"{gone.node}: no test function test_that_was_renamed"
    absent = "".join(reversed("dloh ton seod elif siht gnirts a"))
    changed = Exercise(HERE, (absent,))
    assert missing(changed) == f"{HERE}: no longer holds [{absent!r}]"
