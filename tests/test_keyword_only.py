"""The house rule: a function takes at most two positional parameters (``self`` and
``cls`` aside); the rest are keyword-only. A call then names what it passes, and a
parameter added or reordered cannot shift the meaning of a caller's arguments.

The only exceptions are signatures another library calls positionally."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Every package's folder, as the wheel is built from them.
PACKAGES = list(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].values()
)

#: (file, function): why its signature is another library's.
EXTERNAL = {
    ("common/openforge/chat_template.py", "_tojson"): (
        "the chat templates' tojson filter, with transformers' signature"
    ),
    ("trainer/openforge_trainer/training/verl_rollout.py", "__init__"): (
        "veRL constructs its rollout classes positionally"
    ),
    ("trainer/openforge_trainer/training/verl_rollout.py", "update_weights"): (
        "veRL's BaseRollout.update_weights"
    ),
}


def positional_heavy(source: str) -> list[tuple[str, int, list[str]]]:
    """(name, line, positional parameters) of each function with more than two."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
            if names and names[0] in ("self", "cls"):
                names = names[1:]
            if len(names) > 2:
                found.append((node.name, node.lineno, names))
    return found


def test_the_check_finds_positional_parameters() -> None:
    source = (
        "def f(a, b, c): ...\n"
        "def g(a, b, *, c): ...\n"
        "class K:\n"
        "    def m(self, a, b): ...\n"
        "    def n(self, a, b, c=1): ...\n"
    )
    assert positional_heavy(source) == [("f", 1, ["a", "b", "c"]), ("n", 5, ["a", "b", "c"])]


def test_functions_take_at_most_two_positional_parameters() -> None:
    offenders, excused = [], set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            relative = path.relative_to(ROOT).as_posix()
            for name, line, names in positional_heavy(path.read_text()):
                if (relative, name) in EXTERNAL:
                    excused.add((relative, name))
                    continue
                offenders.append(f"{relative}:{line} {name}({', '.join(names)})")
    assert not offenders, "make the parameters after the second keyword-only:\n" + "\n".join(
        offenders
    )
    assert excused == set(EXTERNAL), f"stale exceptions: {sorted(set(EXTERNAL) - excused)}"
