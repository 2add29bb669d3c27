"""``{{ task.<field> }}`` templates: parse, render, and refuse anything else."""

from __future__ import annotations

import json

import pytest
from openforge.api import templates

TASK = {
    "id": "t1",
    "prompt": 'say "hi"',
    "n": 3,
    "repo": {"url": "https://x/y"},
    "tags": ["a", "b"],
}


def test_references_lists_field_paths() -> None:
    text = "{{task}} {{ task.prompt }} {{  task.repo.url  }}"
    assert templates.references(text) == [(), ("prompt",), ("repo", "url")]


def test_render_inserts_strings_raw_and_the_rest_as_json() -> None:
    text = "{{ task.prompt }}|{{ task.n }}|{{ task.tags }}|{{ task.repo.url }}"
    assert templates.render(text, TASK) == 'say "hi"|3|["a","b"]|https://x/y'


def test_render_with_json_values_keeps_a_json_file_valid() -> None:
    text = '{"prompt": {{ task.prompt }}, "n": {{ task.n }}, "all": {{ task }}}'
    rendered = json.loads(templates.render(text, TASK, json_values=True))
    assert rendered == {"prompt": 'say "hi"', "n": 3, "all": TASK}


def test_text_without_placeholders_and_json_braces_pass_through() -> None:
    assert templates.render('{"a": {"b": 1}}', TASK) == '{"a": {"b": 1}}'


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{{ task.prompt | upper }}", "is not"),
        ("{{ prompt }}", "is not"),
        ("{{ task. }}", "is not"),
        ("{{ task.1x }}", "is not"),
        ("{{ task.prompt", "unclosed placeholder"),
    ],
)
def test_malformed_templates_are_refused(text: str, match: str) -> None:
    with pytest.raises(templates.TemplateError, match=match):
        templates.references(text)


def test_a_missing_field_names_the_task_and_the_field() -> None:
    with pytest.raises(templates.TemplateError, match=r"task 't1' has no field task\.repo\.branch"):
        templates.render("{{ task.repo.branch }}", TASK)
    with pytest.raises(templates.TemplateError, match=r"no field task\.prompt\.x"):
        templates.render("{{ task.prompt.x }}", TASK)
