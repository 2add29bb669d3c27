"""The openforge.dev API: HarnessEnv and RolloutJob, shared by the operator and ``openforge run``.

- :mod:`openforge.api.v1alpha1`: the pydantic models (the source of truth).
- :mod:`openforge.api.manifests`: YAML in, models out, errors with file and line.
- :mod:`openforge.api.rollouts`: rollout names, indexes, compact index sets.
- :mod:`openforge.api.templates`: ``{{ task.<field> }}`` templates.
- :mod:`openforge.api.crds`: the CRDs generated from the models (``openforge crds``).

Importing the package imports none of them: the names below are loaded on
first use. The in-pod agent needs only ``grading`` and ``rollouts``, and the
pydantic models cost it a third of a second of CPU at every pod's start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openforge.api.manifests import ManifestError, Problem, load_manifests, parse
    from openforge.api.v1alpha1 import API_VERSION, HarnessEnv, Resource, RolloutJob

_LAZY = {
    "ManifestError": "manifests",
    "Problem": "manifests",
    "load_manifests": "manifests",
    "parse": "manifests",
    "API_VERSION": "v1alpha1",
    "HarnessEnv": "v1alpha1",
    "Resource": "v1alpha1",
    "RolloutJob": "v1alpha1",
}

__all__ = [
    "API_VERSION",
    "HarnessEnv",
    "ManifestError",
    "Problem",
    "Resource",
    "RolloutJob",
    "load_manifests",
    "parse",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
