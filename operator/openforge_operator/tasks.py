"""The rollouts a job's task records expand into, and their task files' ConfigMap (pure).

Records come from ``spec.tasks.inline`` or from a ConfigMap key holding JSON
Lines (``spec.tasks.configMapRef``), which the reconciler fetches and reads
with ``openforge.api.tasks``, as ``openforge run`` reads a task file. Rollout ``i`` is sample
``i % samplesPerTask`` of task ``i // samplesPerTask`` (:mod:`openforge.api.rollouts`).

A task file (``HarnessEnv.spec.task.file``) depends only on the task record,
so every sample and attempt of a task reads the same file: the operator
renders each task's file once into a per-job ConfigMap (:func:`task_files`),
and each pod mounts its task's key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from openforge.api import rollouts, templates, v1alpha1
from openforge.api import tasks as task_records

CONFIGMAP_DATA_LIMIT = 1_000_000
"""A ConfigMap holds at most 1 MiB; leave room for its metadata."""


@dataclasses.dataclass(frozen=True, slots=True)
class Rollout:
    """One rollout of a job: its index, its task and which sample of that task it is."""

    index: int
    task_index: int
    sample: int
    task: Mapping[str, Any]

    @property
    def task_id(self) -> str:
        return str(self.task["id"])


def count(tasks: Sequence[Mapping[str, Any]], samples_per_task: int) -> int:
    """How many rollouts the job runs."""
    return rollouts.rollout_count(len(tasks), samples_per_task)


def rollout(tasks: Sequence[Mapping[str, Any]], samples_per_task: int, *, index: int) -> Rollout:
    """Rollout ``index`` of a job with these tasks."""
    task_index, sample = rollouts.task_and_sample(index, samples_per_task)
    if task_index >= len(tasks):
        raise IndexError(f"rollout {index} is past the last of {count(tasks, samples_per_task)}")
    return Rollout(index, task_index, sample, tasks[task_index])


def file_key(task_index: int) -> str:
    """The key of a task's file in the job's task-file ConfigMap."""
    return f"task-{task_index}"


def task_files(
    env: v1alpha1.HarnessEnv, tasks: Sequence[Mapping[str, Any]]
) -> dict[str, str] | None:
    """Each task's rendered file by :func:`file_key`, or None when the HarnessEnv uses no file."""
    spec = env.spec.task.file
    if spec is None:
        return None
    files: dict[str, str] = {}
    for task_index, task in enumerate(tasks):
        try:
            files[file_key(task_index)] = task_records.render_file(spec, task)
        except templates.TemplateError as error:
            raise task_records.TaskError(
                f"spec.task.file.template of HarnessEnv {env.metadata.name}: {error}"
            ) from None
    size = sum(len(key) + len(value.encode()) for key, value in files.items())
    if size > CONFIGMAP_DATA_LIMIT:
        raise task_records.TaskError(
            f"the rendered task files take {size} bytes; a ConfigMap holds at most "
            f"{CONFIGMAP_DATA_LIMIT} (split the job, or deliver the task by env or args)"
        )
    return files
