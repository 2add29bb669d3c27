"""Print the project's requirements (its dependencies and those of the extras named on
the command line), one per line, read from pyproject.toml: what a Dockerfile installs in a
layer of its own before it copies the sources, so that a source change reinstalls only the
project (``pip install --no-deps``), never torch.

    python docker/requirements.py [EXTRA...] < pyproject.toml
"""

from __future__ import annotations

import sys
import tomllib


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(
            f"requirements.py: no extra {unknown} in pyproject.toml (it has {sorted(optional)})"
        )
    lines = list(project["dependencies"])
    for extra in extras:
        lines += optional[extra]
    return lines


if __name__ == "__main__":
    print("\n".join(requirements(tomllib.loads(sys.stdin.read()), sys.argv[1:])))
