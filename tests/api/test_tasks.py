"""Task records as both runners read them: inline, or JSON Lines from a ConfigMap key (the
operator) or a file (``openforge run``), each bad line named."""

from __future__ import annotations

import json

import pytest
from openforge.api import manifests, v1alpha1
from openforge.api import tasks as task_records


def source(**tasks: object) -> v1alpha1.TaskSource:
    body = {
        "apiVersion": v1alpha1.API_VERSION, "kind": "RolloutJob", "metadata": {"name": "j"},
        "spec": {"harnessEnvRef": {"name": "e"}, "tasks": tasks, "policy": {"model": "m"}},
    }  # fmt: skip
    job = manifests.parse(body)
    assert isinstance(job, v1alpha1.RolloutJob)
    return job.spec.tasks


def test_inline_records_keep_their_fields_and_drop_nulls() -> None:
    assert task_records.inline(
        source(inline=[{"id": "a", "prompt": "p", "n": 1}, {"id": "b"}])
    ) == [{"id": "a", "prompt": "p", "n": 1}, {"id": "b"}]
    assert task_records.inline(source(file="tasks.jsonl")) is None


def test_json_lines_records_skip_blank_lines() -> None:
    text = '{"id": "x", "n": 1}\n\n   \n{"id": "y"}\n'
    assert task_records.parse_jsonl(text, where="cm") == [{"id": "x", "n": 1}, {"id": "y"}]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{bad", "src, line 1: not JSON"),
        ('{"id": ""}', "src, line 1: id: every task needs a non-empty string id"),
        ('{"id": 7}', "src, line 1: id"),
        (json.dumps({"id": "x" * 254}), "src, line 1: id: .* at most 253 characters"),
        ('{"id": "a"}\n\n{"id": "a"}', "src, line 3: id: 'a' is already the id of line 1"),
        ("\n", "src: holds no task"),
        ("[1]", "src, line 1: a task is a JSON object with an id, not list"),
    ],
)
def test_bad_records_name_the_line(text: str, words: str) -> None:
    with pytest.raises(task_records.TaskError, match=words):
        task_records.parse_jsonl(text, where="src")


def test_the_longest_id_is_the_crds() -> None:
    longest = "x" * task_records.MAX_ID
    assert task_records.parse_jsonl(json.dumps({"id": longest}), where="src") == [{"id": longest}]
    field = v1alpha1.TaskRecord.model_fields["id"]
    assert any(getattr(m, "max_length", None) == task_records.MAX_ID for m in field.metadata)


def test_task_files_render_from_the_record() -> None:
    task = {"id": "a", "prompt": 'say "hi"'}
    assert task_records.render_file(v1alpha1.TaskFile(path="/t.json"), task) == json.dumps(task)
    assert (
        task_records.render_file(
            v1alpha1.TaskFile(path="/t.json", template='{"p": {{ task.prompt }}}'), task
        )
        == '{"p": "say \\"hi\\""}'
    )
