"""Running helm on the chart and reading what it renders."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "openforge"


class HelmError(RuntimeError):
    """helm exited non-zero; the message carries its arguments and stderr."""

    def __init__(self, args: list[str], returncode: int, stderr: str) -> None:
        super().__init__(f"helm {' '.join(args)} exited {returncode}: {stderr.strip()}")
        self.stderr = stderr


@dataclass(frozen=True)
class Helm:
    path: str

    def run(
        self,
        *args: str,
        values: dict[str, Any] | None = None,
        kubeconfig: Path | None = None,
        timeout: float = 120.0,
    ) -> str:
        """``helm ARGS`` (values, if any, fed as ``-f -``); its stdout, or HelmError."""
        argv = [*args, *(["-f", "-"] if values is not None else [])]
        config = ["--kubeconfig", str(kubeconfig)] if kubeconfig else []
        result = subprocess.run(
            [self.path, *config, *argv],
            input=yaml.safe_dump(values) if values is not None else None,
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise HelmError(argv, result.returncode, result.stderr)
        return result.stdout

    def template(
        self,
        values: dict[str, Any] | None = None,
        *,
        release: str = "of",
        namespace: str = "openforge",
        args: tuple[str, ...] = (),
    ) -> list[dict[str, Any]]:
        """The chart rendered with ``values``: every object, in helm's order."""
        out = self.run(
            "template", release, str(CHART), "--namespace", namespace, *args, values=values
        )
        return [doc for doc in yaml.safe_load_all(out) if doc]


def find(
    objects: list[dict[str, Any]], kind: str, name: str | None = None, namespace: str | None = None
) -> list[dict[str, Any]]:
    """The objects of ``kind`` (and ``name``, ``namespace`` when given)."""
    return [
        obj for obj in objects
        if obj["kind"] == kind
        and (name is None or obj["metadata"]["name"] == name)
        and (namespace is None or obj["metadata"].get("namespace") == namespace)
    ]  # fmt: skip


def one(
    objects: list[dict[str, Any]], kind: str, name: str | None = None, namespace: str | None = None
) -> dict[str, Any]:
    found = find(objects, kind, name, namespace)
    assert len(found) == 1, (
        f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    )
    return found[0]


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """The (API group, resource, verb) triples a list of PolicyRules grants."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
