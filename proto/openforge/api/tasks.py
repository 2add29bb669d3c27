"""A job's task records, read the one way both runners read them (pure).

Records come from ``spec.tasks.inline``, or as JSON Lines: a ConfigMap key
(``spec.tasks.configMapRef``, which the operator fetches) or a file beside the
manifest (``spec.tasks.file``, which ``openforge run`` reads). Either way a record
is a JSON object whose ``id`` is a non-empty string of at most 253 characters
(``TaskRecord``), unique within the job; blank lines are skipped. A task file
(``HarnessEnv.spec.task.file``) is rendered from its record by :func:`render_file`,
in a pod and on one machine alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from openforge.api import templates, v1alpha1

MAX_ID = 253
"""The longest task id (``TaskRecord.id``)."""


class TaskError(ValueError):
    """Task records that cannot be read or rendered; the message says where."""


def inline(source: v1alpha1.TaskSource) -> list[dict[str, Any]] | None:
    """The inline records, or None when the records come from JSON Lines."""
    if source.inline is None:
        return None
    return [record.model_dump(by_alias=True, exclude_none=True) for record in source.inline]


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
            raise TaskError(f"{at}: a task is a JSON object with an id, not {type(record).__name__}")
        task_id = record.get("id")
        if not isinstance(task_id, str) or not 1 <= len(task_id) <= MAX_ID:
            raise TaskError(f"{at}: id: every task needs a non-empty string id of at most {MAX_ID} characters")
        if task_id in seen:
            raise TaskError(f"{at}: id: {task_id!r} is already the id of line {seen[task_id]}")
        seen[task_id] = number
        records.append(record)
    if not records:
        raise TaskError(f"{where}: holds no task")
    return records


def render_file(spec: v1alpha1.TaskFile, task: Mapping[str, Any]) -> str:
    """A task's file: its template rendered, else the whole record as JSON (``format: json``)
    or its prompt as text."""
    if spec.template is not None:
        return templates.render(spec.template, task, json_values=spec.format == "json")
    return json.dumps(dict(task)) if spec.format == "json" else str(task.get("prompt", ""))
