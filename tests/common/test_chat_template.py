"""The one chat-template environment: transformers' filters and globals, and the dict shortcut
giving what the sandbox gives."""

from __future__ import annotations

import jinja2
import pytest
from openforge import chat_template


def render(source: str, **values: object) -> str:
    return chat_template.environment().from_string(source).render(**values)


def test_tojson_is_transformers_filter() -> None:
    assert render("{{ x|tojson }}", x={"b": "é", "a": [1]}) == '{"b": "é", "a": [1]}'
    assert render("{{ x|tojson(indent=2) }}", x=[1]) == "[\n  1\n]"
    assert render("{{ x|tojson(sort_keys=true) }}", x={"b": 1, "a": 2}) == '{"a": 2, "b": 1}'


def test_raise_exception_fails_the_render_with_the_template_s_message() -> None:
    with pytest.raises(jinja2.TemplateError, match="roles must alternate"):
        render("{{ raise_exception('roles must alternate') }}")


def test_blocks_are_trimmed_and_loops_can_break() -> None:
    source = (
        "{% for m in ms %}\n  {% if loop.index > 2 %}{% break %}{% endif %}{{ m }}\n{% endfor %}"
    )
    assert render(source, ms=["a", "b", "c"]) == "a\nb\n"


def test_a_dict_s_keys_read_as_attributes_and_dict_methods_stay_methods() -> None:
    assert render("{{ m.role }}:{{ m.items()|list|length }}", m={"role": "user"}) == "user:1"
    assert render("{{ m.missing is defined }}", m={"role": "user"}) == "False"
    assert render("{{ m.keys is defined }}", m={"keys": "shadowed"}) == "True"
