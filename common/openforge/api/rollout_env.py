"""What a harness and its grader are told about their rollout, in a pod and on one machine.

Both runners give every harness and grader process :func:`base_env` (plus what only
their mode has: a pod's run folder and waits; on one machine ``PATH`` and the
manifests' folders, :data:`LOCAL_ONLY`), and both expand ``${NAME}`` references to
the names in :data:`EXPANDED` in the harness's command and args, in the task's
args and in the grader's command, from those values (never from a variable the
template sets itself). A reference in any other form (``$NAME``, ``${NAME:-x}``) is
left to the shell that runs the command, which has the same variables.

The grader runs in the harness's environment in both modes: the base variables, the
template's own, the task's and the base URL's, plus ``OPENFORGE_HARNESS_EXIT_CODE``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

EXPANDED = (
    "OPENFORGE_JOB",
    "OPENFORGE_ROLLOUT_ID",
    "OPENFORGE_TASK_ID",
    "OPENFORGE_SAMPLE_INDEX",
    "OPENFORGE_ATTEMPT",
    "OPENFORGE_WORKDIR",
    "OPENFORGE_MANIFEST_DIR",
    "OPENFORGE_HARNESS_DIR",
)
"""The names ``${NAME}`` expands in commands and args."""

LOCAL_ONLY = ("OPENFORGE_MANIFEST_DIR", "OPENFORGE_HARNESS_DIR")
"""Folders of the machine that runs ``openforge run``: a pod has none."""


def task_json(task: Mapping[str, Any]) -> str:
    """The task record as ``OPENFORGE_TASK_JSON`` holds it (UTF-8, not escaped to ASCII)."""
    return json.dumps(dict(task), ensure_ascii=False)


def base_env(
    *, job: str, rollout_id: str, task: Mapping[str, Any], sample: int, attempt: int, workdir: str
) -> dict[str, str]:
    """The variables every harness and grader sees about its rollout, in both modes."""
    return {
        "OPENFORGE_JOB": job,
        "OPENFORGE_ROLLOUT_ID": rollout_id,
        "OPENFORGE_TASK_ID": str(task["id"]),
        "OPENFORGE_TASK_JSON": task_json(task),
        "OPENFORGE_SAMPLE_INDEX": str(sample),
        "OPENFORGE_ATTEMPT": str(attempt),
        "OPENFORGE_WORKDIR": workdir,
    }


def expand(arg: str, env: Mapping[str, str]) -> str:
    """``arg`` with each ``${NAME}`` of :data:`EXPANDED` that ``env`` holds replaced by its
    value."""
    for name in EXPANDED:
        if name in env:
            arg = arg.replace("${" + name + "}", env[name])
    return arg


def unexpanded(arg: str, env: Mapping[str, str]) -> list[str]:
    """The names of :data:`EXPANDED` that ``arg`` references as ``${NAME}`` and ``env`` lacks."""
    return [name for name in EXPANDED if "${" + name + "}" in arg and name not in env]
