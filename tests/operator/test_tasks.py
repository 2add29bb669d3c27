"""Rollout indexes from task records, and the task files' ConfigMap."""

from __future__ import annotations

import json

import pytest
from openforge.api import tasks as task_records
from openforge_operator import objects, tasks
from operator_fixtures import env, job


def test_inline_records_and_the_rollouts_they_expand_into() -> None:
    records = task_records.inline(job().spec.tasks)
    assert records == [
        {"id": "a", "prompt": "p-a"},
        {"id": "b", "prompt": "p-b"},
        {"id": "c", "prompt": "p-c"},
    ]
    assert tasks.count(records, 4) == 12
    rollout = tasks.rollout(records, 4, index=7)
    assert (rollout.index, rollout.task_index, rollout.sample, rollout.task_id) == (7, 1, 3, "b")
    with pytest.raises(IndexError):
        tasks.rollout(records, 4, index=12)


def test_task_files_render_once_per_task() -> None:
    records = [{"id": "a", "prompt": 'say "hi"'}, {"id": "b", "prompt": "x"}]
    spec = {"task": {"file": {"path": "/t.json", "template": '{"p": {{ task.prompt }}}'}}}
    files = tasks.task_files(env(spec=spec), records)
    assert files == {"task-0": '{"p": "say \\"hi\\""}', "task-1": '{"p": "x"}'}
    assert (
        json.loads(
            tasks.task_files(env(spec={"task": {"file": {"path": "/t"}}}), records)["task-1"]
        )
        == records[1]
    )
    assert tasks.task_files(env(), records) is None
    config_map = objects.build_task_files(job(), files)
    assert (
        config_map["metadata"]["name"] == "job-taskfiles"
        and config_map["immutable"] is True
        and config_map["data"] == files
    )


def test_task_files_that_need_a_missing_field_or_too_much_room_are_errors() -> None:
    with pytest.raises(task_records.TaskError, match=r"no field task\.missing"):
        tasks.task_files(
            env(
                spec={
                    "task": {
                        "file": {"path": "/t", "format": "text", "template": "{{ task.missing }}"}
                    }
                }
            ),
            [{"id": "a"}],
        )
    big = [{"id": str(i), "prompt": "x" * 100_000} for i in range(11)]
    with pytest.raises(task_records.TaskError, match="a ConfigMap holds at most"):
        tasks.task_files(env(spec={"task": {"file": {"path": "/t"}}}), big)
