"""The one chat-template environment: transformers' filters and globals, and the dict shortcut
giving what the sandbox gives."""

from __future__ import annotations

import tracemalloc

import jinja2
import jinja2.sandbox
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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


_VALUES = {"s": "text", "e": "", "n": 3, "f": 0.5, "l": [1], "t": True, "d": {"k": "v"}}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from([*_VALUES, "'lit'", "7", "missing", "(s + n)", "(l + l)", "d.k"]),
        min_size=2,
        max_size=6,
    )
)
def test_a_chain_of_plus_gives_what_jinja_gives(operands: list[str]) -> None:
    """Added in one go (strings joined), a chain gives Jinja's value, or its error."""
    source = "{{ " + " + ".join(operands) + " }}"
    plain = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def outcome(env: jinja2.Environment) -> str:
        try:
            return env.from_string(source).render(**_VALUES)
        except Exception as exc:  # the same kind of error, with the same message
            return f"{type(exc).__name__}: {exc}"

    assert outcome(chat_template.environment()) == outcome(plain)


def test_a_turn_of_a_long_message_is_made_in_one_copy() -> None:
    """``'<|im_start|>' + role + '\\n' + content + '<|im_end|>'``, added in turn, held
    two copies of a 10 MB content at once beside it; joined, one."""
    content = "word " * (2 * 1024 * 1024)
    template = chat_template.environment().from_string(
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>'"
        " + '\\n' }}{% endfor %}"
    )
    messages = [{"role": "user", "content": content}]
    tracemalloc.start()
    try:
        (chunk,) = template.generate(messages=messages)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert chunk == f"<|im_start|>user\n{content}<|im_end|>\n"
    assert peak < 1.5 * len(content), (peak, len(content))  # added in turn: ~2x
