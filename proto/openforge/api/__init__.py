"""The openforge.dev API: HarnessEnv and RolloutJob, shared by the operator and ``openforge run``.

- :mod:`openforge.api.v1alpha1`: the pydantic models (the source of truth).
- :mod:`openforge.api.manifests`: YAML in, models out, errors with file and line.
- :mod:`openforge.api.rollouts`: rollout names, indexes, compact index sets.
- :mod:`openforge.api.templates`: ``{{ task.<field> }}`` templates.
- :mod:`openforge.api.crds`: the CRDs generated from the models (``openforge crds``).
"""

from openforge.api.manifests import ManifestError, Problem, load_manifests, parse
from openforge.api.v1alpha1 import API_VERSION, HarnessEnv, Resource, RolloutJob

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
