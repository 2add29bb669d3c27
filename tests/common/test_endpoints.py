"""OpenForge's paths and headers are spelled once (``openforge.endpoints``): no other string
in the packages names a ``/openforge/v1/`` path or the policy-version header, and the
servers' route tables are made of those constants."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from openforge import endpoints

ROOT = Path(__file__).resolve().parents[2]
#: Every package's folder, as the wheel is built from them.
PACKAGES = list(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].values()
)
HOME = ROOT / "common" / "openforge" / "endpoints.py"


def docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def spelled_out() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == HOME or "_pb2" in path.name:
                continue
            tree = ast.parse(path.read_text(), str(path))
            skip = docstrings(tree)
            for node in ast.walk(tree):
                if (
                    not isinstance(node, ast.Constant)
                    or not isinstance(node.value, str)
                    or id(node) in skip
                ):
                    continue
                if (
                    "/openforge/v1" in node.value
                    or endpoints.POLICY_VERSION_HEADER in node.value.lower()
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    return found


def test_no_module_but_endpoints_spells_an_openforge_path_or_header() -> None:
    assert spelled_out() == []


def test_the_servers_route_tables_are_the_constants() -> None:
    from openforge_trainer.serving import server as serve

    ours = {path for path in serve.POST_ROUTES if path.startswith(endpoints.PREFIX)}
    assert ours == {endpoints.WEIGHTS, endpoints.PAUSE, endpoints.RESUME}
    assert set(serve.POST_ROUTES) - ours == {"/v1/completions"}  # the model API's own
    assert all(
        path.startswith(endpoints.PREFIX)
        for path in (
            endpoints.ROLLOUT_FINISH,
            endpoints.STATS,
            endpoints.POLICY,
            endpoints.STATUS,
            endpoints.WEIGHTS,
        )
    )
