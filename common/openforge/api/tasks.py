"""A job's task records, read the one way both runners read them (pure).

Records come from ``spec.tasks.inline``, or as JSON Lines: a ConfigMap key
(``spec.tasks.configMapRef``, which the operator fetches) or a file beside the
manifest (``spec.tasks.file``, which ``openforge run`` reads). Either way a record
is a JSON object whose ``id`` matches ``TaskRecord``'s (at most 253 letters, digits,
``.``, ``_`` and ``-``), unique within the job; blank lines are skipped. Every source is
held to the same caps: :data:`MAX_TASKS` records, :data:`MAX_TASK_BYTES` each, and
:data:`MAX_ROLLOUTS` rollouts per job (:func:`check_rollouts`). A task file
(``HarnessEnv.spec.task.file``) is rendered from its record by :func:`render_file`,
in a pod and on one machine alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from openforge.api import templates, v1alpha1

MAX_ID = v1alpha1.MAX_TASK_ID
"""The longest task id (``TaskRecord.id``)."""
MAX_TASKS = v1alpha1.MAX_TASKS
MAX_TASK_BYTES = 100_000
"""The largest task record, as JSON: it reaches every harness in ``OPENFORGE_TASK_JSON``,
and Linux holds one environment variable to 128 KiB (larger, every rollout failed to
start with E2BIG). Larger inputs belong in files the harness reads."""
MAX_ROLLOUTS = 1_000_000
"""Rollouts per job (tasks times samplesPerTask)."""
_ID = re.compile(v1alpha1.TASK_ID_PATTERN)


class TaskError(ValueError):
    """Task records that cannot be read or rendered; the message says where, and ``loc``
    is the manifest field at fault when it is one (a file names its own line)."""

    def __init__(self, message: str, *, loc: tuple[str | int, ...] | None = None) -> None:
        super().__init__(message)
        self.loc = loc


def inline(source: v1alpha1.TaskSource) -> list[dict[str, Any]] | None:
    """The inline records (their ids checked by the model), or None when the records come
    from JSON Lines; TaskError naming the record too large to deliver."""
    if source.inline is None:
        return None
    records = [record.model_dump(by_alias=True, exclude_none=True) for record in source.inline]
    for index, record in enumerate(records):
        _check_size(record, f"spec.tasks.inline[{index}]", loc=("spec", "tasks", "inline", index))
    return records


def check_rollouts(tasks: Sequence[Mapping[str, Any]], samples_per_task: int) -> None:
    """TaskError when the job would run more than :data:`MAX_ROLLOUTS` rollouts."""
    total = len(tasks) * samples_per_task
    if total > MAX_ROLLOUTS:
        raise TaskError(
            f"spec.samplesPerTask: {len(tasks)} tasks x {samples_per_task} samples is {total} "
            f"rollouts; a job runs at most {MAX_ROLLOUTS} (split it into jobs)",
            loc=("spec", "samplesPerTask"),
        )


def _check_size(
    record: Mapping[str, Any], at: str, *, loc: tuple[str | int, ...] | None = None
) -> None:
    size = len(json.dumps(dict(record), ensure_ascii=False).encode())
    if size > MAX_TASK_BYTES:
        raise TaskError(
            f"{at}: the task is {size} bytes as JSON; a task holds at most {MAX_TASK_BYTES} "
            "(it reaches the harness in OPENFORGE_TASK_JSON): "
            "put large inputs in files the harness reads",
            loc=loc,
        )


def parse_jsonl(text: str, *, where: str) -> list[dict[str, Any]]:
    """Records from JSON Lines text; ``where`` names the source in errors (a file's path,
    ``ConfigMap 'x' key 'y'``), each of which names the line at fault."""
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        at = f"{where}, line {number}"
        try:
            record = json.loads(line)
        except ValueError as error:
            raise TaskError(f"{at}: not JSON: {error}") from None
        if not isinstance(record, dict):
            raise TaskError(
                f"{at}: a task is a JSON object with an id, not {type(record).__name__}"
            )
        task_id = record.get("id")
        if not isinstance(task_id, str) or not 1 <= len(task_id) <= MAX_ID:
            raise TaskError(
                f"{at}: id: every task needs a non-empty string id of at most {MAX_ID} characters"
            )
        if not _ID.match(task_id):
            raise TaskError(
                f"{at}: id: {task_id[:80]!r} has a character ids may not: letters, digits, '.', "
                "'_' and '-', a letter or digit first"
            )
        if task_id in seen:
            raise TaskError(f"{at}: id: {task_id!r} is already the id of line {seen[task_id]}")
        _check_size(record, at)
        seen[task_id] = number
        records.append(record)
        if len(records) > MAX_TASKS:
            raise TaskError(
                f"{at}: more than {MAX_TASKS} tasks; a job holds at most {MAX_TASKS}, as "
                "spec.tasks.inline does (split it into jobs)"
            )
    if not records:
        raise TaskError(f"{where}: holds no task")
    return records


def render_file(spec: v1alpha1.TaskFile, task: Mapping[str, Any]) -> str:
    """A task's file: its template rendered, else the whole record as JSON (``format: json``)
    or its prompt as text."""
    if spec.template is not None:
        return templates.render(spec.template, task, json_values=spec.format == "json")
    return json.dumps(dict(task)) if spec.format == "json" else str(task.get("prompt", ""))
